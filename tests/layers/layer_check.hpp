// Gradient checks of whole layers: with respect to the inputs and every parameter.
#pragma once

#include "../engine/test_helpers.hpp"
#include "engine/gradcheck.hpp"
#include "layers/module.hpp"

namespace relgrad::testing {

// forward(inputs) runs the layer; the layer's parameters are replaced by the gradcheck's copies
// before each evaluation, so the check covers d output / d parameter too. Layers run in eval
// mode (dropout off) so that every evaluation is the same function.
//
// The check runs on the CPU, then with the layer and the inputs moved to each other device
// (other_devices: guarded_cpu, whose memory the host API refuses to touch, and the test build's
// cuda); it must pass there too, with the same outputs and gradients as on the CPU (and on
// guarded_cpu exactly the same errors). On cuda, whose kernels run in the emulator, the numeric
// side is one random projection (fast mode): the analytic gradients equal to the CPU's, which
// the full check has compared with central differences, are the proof there. forward makes any
// constant it needs (ids, masks) on layer.device().
template <class Forward>
void gradcheck_layer(Module& layer, std::vector<Tensor> inputs, Forward forward, bool fast = false) {
    layer.eval();
    const std::size_t n_inputs = inputs.size();
    GradcheckOptions options;
    options.fast = fast;
    std::vector<Device> devices{Device::cpu};
    for (Device device : other_devices()) devices.push_back(device);
    std::vector<GradcheckResult> results;
    for (Device device : devices) {
        options.fast = fast || device == Device::cuda;
        layer.to(device);
        std::vector<Tensor> all_inputs;
        for (const Tensor& x : inputs) all_inputs.push_back(x.detach().to(device).requires_grad_(x.requires_grad()));
        for (const Tensor& p : layer.parameters()) all_inputs.push_back(p.detach().requires_grad_(true));
        GradcheckResult result;
        CHECK_NOTHROW(result = gradcheck(
                          [&](const std::vector<Tensor>& all) {
                              layer.assign_parameters(std::vector<Tensor>(all.begin() + n_inputs, all.end()));
                              return forward(std::vector<Tensor>(all.begin(), all.begin() + n_inputs));
                          },
                          all_inputs, options));
        CHECK_MESSAGE(result.passed, device_name(device) << ": " << result.report);
        results.push_back(result);
    }
    layer.to(Device::cpu);
    for (std::size_t d = 1; d < devices.size(); ++d) {
        check_same_values(results[d].output, results[0].output, devices[d], "layer output");
        REQUIRE(results[d].gradients.size() == results[0].gradients.size());
        for (std::size_t i = 0; i < results[0].gradients.size(); ++i) {
            check_same_values(results[d].gradients[i], results[0].gradients[i], devices[d],
                              "gradient " + std::to_string(i));
        }
        if (devices[d] == Device::guarded_cpu) {
            CHECK_MESSAGE(results[d].max_abs_error == results[0].max_abs_error, "guarded_cpu and cpu differ");
            CHECK_MESSAGE(results[d].max_rel_error == results[0].max_rel_error, "guarded_cpu and cpu differ");
        }
    }
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
