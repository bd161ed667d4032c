// relgrad: the registry of gradient checks, one or more cases per differentiable op, run by the
// tests (tests/engine/) and by `relgrad gradcheck`. A case is named "op" or "op/variant"; the
// variants cover non-contiguous and broadcast inputs and edge shapes (size-1 dims, one element).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/gradcheck.hpp"

namespace relgrad {

struct OpCheck {
    std::string name;
    std::function<GradcheckResult(Device device)> run;  // with the inputs on `device`
};

const std::vector<OpCheck>& registered_op_checks();

// The cases whose op name (the part before '/') equals `op`, or all cases when op is empty.
std::vector<OpCheck> op_checks_for(const std::string& op);

}  // namespace relgrad
