// relgrad: gradient checking, after PyTorch's torch.autograd.gradcheck.
//
// For f: inputs -> y and a random cotangent v (the gradient "arriving" at y), backward gives the
// vector-Jacobian product v^T J. Numerically, element k of input i contributes
//     (v . f(x + eps e_k) - v . f(x - eps e_k)) / (2 eps)        (central difference)
// and the two must agree: |analytic - numeric| <= atol + rtol |numeric|. All in float64.
// Also checked: a second backward gives bit-identical gradients, and a zero cotangent gives zero
// gradients. Fast mode replaces the per-element sweep with one random direction u per input:
// v^T J u, two evaluations of f instead of 2 per element, for big inputs.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/tensor.hpp"

namespace relgrad {

struct GradcheckOptions {
    double eps = 1e-6;
    double atol = 1e-5;
    double rtol = 1e-3;
    uint64_t seed = 0;  // for the cotangent and the fast-mode directions
    bool fast = false;
    int max_reported = 5;  // mismatches listed in the report
};

struct GradcheckErrors {
    double max_abs_error = 0;  // max |analytic - numeric|
    double max_rel_error = 0;  // max |analytic - numeric| / |numeric| where |numeric| > atol
};

// max_abs_error and max_rel_error over every checked element
struct GradcheckResult : GradcheckErrors {
    bool passed = true;
    // The same per input, in the inputs' order (zeros for an input that is not checked). Fast
    // mode compares one projection of all inputs together, so it leaves this empty.
    std::vector<GradcheckErrors> per_input;
    std::string report;  // why it failed: mismatches side by side, with indices
    // f(inputs) and the analytic gradient of each input (empty for one not checked), copied to the
    // host: the tests compare them between devices.
    std::vector<double> output;
    std::vector<std::vector<double>> gradients;
};

using Function = std::function<Tensor(const std::vector<Tensor>&)>;

// Checks d f / d inputs[i] for every input with requires_grad (they must be float64); other
// inputs (index tensors, masks) are passed through unchanged. The inputs themselves are not
// modified: f receives contiguous leaf copies.
GradcheckResult gradcheck(const Function& f, const std::vector<Tensor>& inputs, const GradcheckOptions& options = {});

}  // namespace relgrad
