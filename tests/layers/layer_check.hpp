// Gradient checks of whole layers: with respect to the inputs and every parameter.
#pragma once

#include "../engine/check.hpp"
#include "engine/gradcheck.hpp"
#include "layers/module.hpp"

namespace relgrad::testing {

// forward(inputs) runs the layer; the layer's parameters are replaced by the gradcheck's copies
// before each evaluation, so the check covers d output / d parameter too. Layers run in eval
// mode (dropout off) so that every evaluation is the same function.
template <class Forward>
void gradcheck_layer(Module& layer, std::vector<Tensor> inputs, Forward forward, bool fast = false) {
    layer.eval();
    const std::size_t n_inputs = inputs.size();
    for (const Tensor& p : layer.parameters()) inputs.push_back(p.detach().requires_grad_(true));
    GradcheckOptions options;
    options.fast = fast;
    const GradcheckResult result = gradcheck(
        [&](const std::vector<Tensor>& all) {
            layer.assign_parameters(std::vector<Tensor>(all.begin() + n_inputs, all.end()));
            return forward(std::vector<Tensor>(all.begin(), all.begin() + n_inputs));
        },
        inputs, options);
    CHECK_MESSAGE(result.passed, result.report);
}

inline Tensor random_input(const Shape& shape, uint64_t seed) {
    Generator gen(seed);
    return randn(shape, gen, DType::float64).requires_grad_(true);
}

// max |a - b| over two tensors of one shape
inline double max_difference(const Tensor& a, const Tensor& b) {
    REQUIRE(a.shape() == b.shape());
    const std::vector<double> x = a.to_vector(), y = b.to_vector();
    double worst = 0;
    for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::fabs(x[i] - y[i]));
    return worst;
}

}  // namespace relgrad::testing
