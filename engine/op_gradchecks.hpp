// relgrad: the registry of gradient checks, one or more cases per differentiable op, run by the
// tests (tests/engine/) and by `relgrad gradcheck`; each case also measures the op in 16 bits
// against float64 (tests/engine/test_precision.cpp). A case is named "op" or "op/variant"; the
// variants cover non-contiguous and broadcast inputs and edge shapes (size-1 dims, one element).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/gradcheck.hpp"

namespace relgrad {

// How far a case computed in a 16-bit dtype lands from float64. The inputs are rounded to the
// dtype first and the float64 run takes those rounded values, so the difference is what computing
// in 16 bits costs, not what storing the inputs in 16 bits does. Each error is the largest
// difference over the largest float64 magnitude: of the output, and of every input's gradient
// (one backward pass, from a cotangent rounded likewise).
struct PrecisionResult {
    double output_error = 0;
    double gradient_error = 0;
};

struct OpCheck {
    std::string name;
    std::function<GradcheckResult(Device device)> run;                  // with the inputs on `device`
    std::function<PrecisionResult(DType dtype, Device device)> run_in;  // bfloat16 or float16
};

const std::vector<OpCheck>& registered_op_checks();

// The cases whose op name (the part before '/') equals `op`, or all cases when op is empty.
std::vector<OpCheck> op_checks_for(const std::string& op);

}  // namespace relgrad
