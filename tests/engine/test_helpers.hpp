// Shared test helpers.
#pragma once

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "engine/op_gradchecks.hpp"
#include "engine/ops.hpp"

namespace relgrad::testing {

// The devices a test runs on besides the CPU: guarded_cpu (the CPU's kernels on memory the host
// API refuses to touch), and cuda where the test build has it (the CUDA backend's kernels in the
// emulator, or on a GPU with RELGRAD_CUDA_EMULATOR=0).
inline std::vector<Device> other_devices() {
#ifdef RELGRAD_TEST_CUDA
    return {Device::guarded_cpu, Device::cuda};
#else
    return {Device::guarded_cpu};
#endif
}

// Results on another device against the CPU's: bitwise on guarded_cpu (the same kernels on the
// same values); on cuda, other kernels summing in other orders, within tol (1 + |cpu value|).
inline void check_same_values(const std::vector<double>& on_device, const std::vector<double>& on_cpu, Device device,
                              const std::string& what, double tol = 1e-12) {
    REQUIRE_MESSAGE(on_device.size() == on_cpu.size(), what << " on " << device_name(device));
    for (std::size_t i = 0; i < on_cpu.size(); ++i) {
        const double a = on_device[i], b = on_cpu[i];
        const bool same = device == Device::guarded_cpu || !std::isfinite(b)
                              ? (a == b || (std::isnan(a) && std::isnan(b)))
                              : std::fabs(a - b) <= tol * (1 + std::fabs(b));
        CHECK_MESSAGE(same,
                      what << " on " << device_name(device) << ", element " << i << ": " << a << ", on the cpu " << b);
        if (!same) return;
    }
}

// Runs every registered gradient check of `op` (engine/op_gradchecks.cpp) and fails with the
// gradcheck report of each case that does not pass. Each case runs on the CPU and on every other
// device (other_devices); each must pass, with the same outputs and analytic gradients as on the
// CPU (and on guarded_cpu exactly the same errors), so an op that reads device memory from the host,
// mixes devices, allocates on the wrong one or has a wrong device kernel fails here.
inline void gradcheck_op(const std::string& op) {
    const std::vector<OpCheck> checks = op_checks_for(op);
    REQUIRE_MESSAGE(!checks.empty(), "no gradient checks are registered for " << op);
    for (const OpCheck& check : checks) {
        const GradcheckResult on_cpu = check.run(Device::cpu);
        CHECK_MESSAGE(on_cpu.passed, check.name << ": " << on_cpu.report);
        for (Device device : other_devices()) {
            GradcheckResult on_device;
            CHECK_NOTHROW(on_device = check.run(device));
            CHECK_MESSAGE(on_device.passed, check.name << " on " << device_name(device) << ": " << on_device.report);
            check_same_values(on_device.output, on_cpu.output, device, check.name + " output");
            REQUIRE(on_device.gradients.size() == on_cpu.gradients.size());
            for (std::size_t i = 0; i < on_cpu.gradients.size(); ++i) {
                check_same_values(on_device.gradients[i], on_cpu.gradients[i], device,
                                  check.name + " gradient " + std::to_string(i));
            }
            if (device == Device::guarded_cpu) {
                CHECK_MESSAGE(on_device.max_abs_error == on_cpu.max_abs_error, check.name << " on guarded_cpu");
                CHECK_MESSAGE(on_device.max_rel_error == on_cpu.max_rel_error, check.name << " on guarded_cpu");
            }
        }
    }
}

// Elementwise |actual - expected| <= tol, with the first difference in the message.
inline void check_values(const Tensor& actual, const std::vector<double>& expected, double tol = 1e-12) {
    const std::vector<double> got = actual.to_vector();
    REQUIRE(got.size() == expected.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
        const bool same = (std::isinf(expected[i]) && got[i] == expected[i]) || std::fabs(got[i] - expected[i]) <= tol;
        CHECK_MESSAGE(same, "element " << i << ": got " << got[i] << ", expected " << expected[i]);
        if (!same) return;
    }
}

inline Tensor f64(const std::vector<double>& values, const Shape& shape) {
    return from_vector(values, shape, DType::float64);
}

}  // namespace relgrad::testing
