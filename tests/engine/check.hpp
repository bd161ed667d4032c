// Shared test helpers.
#pragma once

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "engine/op_checks.hpp"
#include "engine/ops.hpp"

namespace relgrad::testing {

// Runs every registered gradient check of `op` (engine/op_checks.cpp) and fails with the
// gradcheck report of each case that does not pass. Each case runs twice: on the CPU, and on the
// guarded CPU device, whose memory the host API refuses to touch; both must pass and measure
// exactly the same errors (the same kernels on the same values), so an op that reads device
// memory from the host, mixes devices or allocates on the wrong one fails here.
inline void gradcheck_op(const std::string& op) {
    const std::vector<OpCheck> checks = op_checks_for(op);
    REQUIRE_MESSAGE(!checks.empty(), "no gradient checks are registered for " << op);
    for (const OpCheck& check : checks) {
        const GradcheckResult on_cpu = check.run(Device::cpu);
        CHECK_MESSAGE(on_cpu.passed, check.name << ": " << on_cpu.report);
        GradcheckResult on_device;
        CHECK_NOTHROW(on_device = check.run(Device::guarded_cpu));
        CHECK_MESSAGE(on_device.passed, check.name << " on guarded_cpu: " << on_device.report);
        CHECK_MESSAGE(on_device.max_abs_error == on_cpu.max_abs_error, check.name << " on guarded_cpu");
        CHECK_MESSAGE(on_device.max_rel_error == on_cpu.max_rel_error, check.name << " on guarded_cpu");
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
