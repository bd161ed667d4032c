// bfloat16 and float16: the conversions (rounding to nearest even, subnormals, overflow, inf and
// NaN), and every registered op case (engine/op_checks.cpp) computed in each against float64, on
// every device, within the tolerances stated below.
// No gradient check here: this file measures how far 16-bit results (outputs and gradients) are
// from float64 ones; the float64 gradient check of every one of these op cases runs in
// tests/engine/test_gradcheck.cpp.
#include "check.hpp"

#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

#include "engine/half.hpp"

using namespace relgrad;
using namespace relgrad::testing;

namespace {

const double inf = std::numeric_limits<double>::infinity();

// the value t holds, as the double it converts to exactly
template <class Half>
double value_of(double x) {
    return static_cast<double>(static_cast<float>(Half(x)));
}

}  // namespace

TEST_CASE("float16 rounds to the nearest value, ties to even, and overflows to inf past 65504") {
    CHECK(value_of<Float16>(1.0) == 1.0);
    CHECK(value_of<Float16>(1.0 + std::ldexp(1.0, -11)) == 1.0);                            // a tie: 1 is even
    CHECK(value_of<Float16>(1.0 + 3 * std::ldexp(1.0, -11)) == 1.0 + std::ldexp(1.0, -9));  // a tie: up to even
    CHECK(value_of<Float16>(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)) == 1.0 + std::ldexp(1.0, -10));
    CHECK(value_of<Float16>(65504.0) == 65504.0);
    CHECK(value_of<Float16>(65519.99) == 65504.0);
    CHECK(value_of<Float16>(65520.0) == inf);  // the tie between 65504 and 65536 goes to 65536: inf
    CHECK(value_of<Float16>(-1e6) == -inf);
    CHECK(value_of<Float16>(std::ldexp(1.0, -24)) == std::ldexp(1.0, -24));  // the smallest subnormal
    CHECK(value_of<Float16>(std::ldexp(1.0, -25)) == 0.0);                   // a tie: 0 is even
    CHECK(value_of<Float16>(std::ldexp(1.5, -25)) == std::ldexp(1.0, -24));
    CHECK(value_of<Float16>(std::ldexp(1023.0, -24)) == std::ldexp(1023.0, -24));  // the largest subnormal
    CHECK(value_of<Float16>(std::ldexp(1.0, -14)) == std::ldexp(1.0, -14));        // the smallest normal
    CHECK(std::signbit(value_of<Float16>(-0.0)));
    CHECK(std::isnan(value_of<Float16>(std::nan(""))));
    CHECK(value_of<Float16>(inf) == inf);
}

TEST_CASE("bfloat16 rounds to the nearest value, ties to even, with float32's range") {
    CHECK(value_of<BFloat16>(1.0 + std::ldexp(1.0, -8)) == 1.0);
    CHECK(value_of<BFloat16>(1.0 + 3 * std::ldexp(1.0, -8)) == 1.0 + std::ldexp(1.0, -6));
    CHECK(value_of<BFloat16>(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30)) == 1.0 + std::ldexp(1.0, -7));
    CHECK(value_of<BFloat16>(0.1) == 0.10009765625);
    CHECK(value_of<BFloat16>(1e38) == 99692099683868690467785529521025843200.0);
    CHECK(value_of<BFloat16>(3.4e38) == inf);                                   // past 0x7f7f's half step
    CHECK(value_of<BFloat16>(std::ldexp(1.0, -133)) == std::ldexp(1.0, -133));  // a subnormal
    CHECK(std::isnan(value_of<BFloat16>(-std::nan(""))));
    CHECK(value_of<BFloat16>(-inf) == -inf);
}

TEST_CASE("every float16 and bfloat16 value converts to float and back unchanged") {
    for (uint32_t bits = 0; bits < 65536; ++bits) {
        Float16 h;
        h.bits = static_cast<uint16_t>(bits);
        BFloat16 b;
        b.bits = static_cast<uint16_t>(bits);
        const float hf = h, bf = b;
        if (!std::isnan(hf)) REQUIRE(Float16(hf).bits == bits);
        if (!std::isnan(bf)) REQUIRE(BFloat16(bf).bits == bits);
        if (std::isnan(hf)) REQUIRE(std::isnan(static_cast<float>(Float16(hf))));
    }
}

TEST_CASE("tensors convert to and from 16 bits on every device, refusing what int64 cannot hold") {
    const std::vector<double> values = {1.0, -2.5, 0.1, 65504.0, 1e5, std::ldexp(1.0, -24), -0.0};
    for (Device device : {Device::cpu, Device::guarded_cpu}) {
        const Tensor wide = from_vector(values, {7}, DType::float64, device);
        const std::vector<double> half = wide.to(DType::float16).to_vector();
        const std::vector<double> brain = wide.to(DType::bfloat16).to_vector();
        for (std::size_t i = 0; i < values.size(); ++i) {
            CHECK(half[i] == value_of<Float16>(values[i]));
            CHECK(brain[i] == value_of<BFloat16>(values[i]));
        }
        CHECK(wide.to(DType::float16).to(DType::bfloat16).to_vector()[2] == value_of<BFloat16>(value_of<Float16>(0.1)));
        CHECK(wide.to(DType::bfloat16).to(DType::int64).to_vector()[1] == -2.0);  // toward zero, as C++ does
        CHECK_THROWS_WITH_AS(wide.to(DType::float16).to(DType::int64), "conversion to int64: inf has no int64 value",
                             std::invalid_argument);
    }
}

namespace {

// Tolerances in units of the dtype's epsilon (2^-7 for bfloat16, 2^-10 for float16), for the
// output and for the gradients of each op (the part of a case's name before '/'), measured against
// the largest float64 magnitude. A result rounded once from float32 costs half an epsilon; a
// backward made of several 16-bit ops rounds each of their results in turn and costs more. A
// kernel that summed in 16 bits, a conversion that truncated or rounded twice, or an op that
// rounded its statistics (softmax, layer_norm, attention) would exceed these.
struct Tolerance {
    double output, gradient;
};

Tolerance tolerance_of(const std::string& op) {
    constexpr double once = 0.51;  // one rounding: half an epsilon, and float32's own error on top
    static const std::map<std::string, Tolerance> stated = {
        // elementwise: the result rounded once; a gradient through the saved 16-bit output
        // (tanh: 1 - y^2 cancels where y is near 1) or summed over a broadcast dim costs more
        {"add", {once, once}},
        {"sub", {once, once}},
        {"mul", {once, 1}},
        {"div", {once, 1}},
        {"pow", {once, 1.5}},  // d/db = g y log(a): three rounded factors, then summed over a broadcast dim
        {"pow_scalar", {once, 1.5}},
        {"neg", {0, once}},
        {"exp", {once, 1.5}},
        {"log", {once, 1}},
        {"sqrt", {once, 1}},
        {"tanh", {once, 6}},
        {"sigmoid", {once, 1.5}},
        {"relu", {0, 1}},
        {"gelu", {once, 1}},
        {"clamp", {once, once}},  // its bound 0.7 is rounded to 16 bits too; a gradient summed over a broadcast dim
        {"where", {0, once}},
        {"masked_fill", {0, 0}},
        // reductions and products: float32 sums, rounded once
        {"sum", {once, 0}},
        {"mean", {once, once}},  // float32 sum / count, rounded once; its gradient g / count too
        {"max", {0, 0}},
        {"matmul", {once, 1.5}},
        // moving values: exact, but for a gradient summed over repeated or broadcast elements
        {"transpose", {0, 0}},
        {"permute", {0, 0}},
        {"reshape", {0, 0}},
        {"slice", {0, 0}},
        {"narrow", {0, 0}},
        {"expand", {0, once}},
        {"squeeze", {0, 0}},
        {"concat", {0, 0}},
        {"stack", {0, 0}},
        {"gather", {0, once}},
        {"scatter_add", {once, 0}},
        {"index_select", {0, once}},
        {"embedding", {0, once}},
        // float32 statistics inside (cross_entropy's loss is float32: only the gradient is rounded);
        // softmax's backward reads its saved 16-bit output, as exp's does
        {"softmax", {once, 1.5}},
        {"log_softmax", {once, once}},
        {"layer_norm", {once, once}},
        {"dropout", {once, once}},
        {"cross_entropy", {0.001, once}},
        {"attention", {once, once}},
        // the backward reads the saved 16-bit output z (D_i = dz_i . z_i), as FlashAttention's does
        {"fused_attention", {once, 4}},
        // the rotation in float32, rounded once (its backward too)
        {"rope", {once, once}},
    };
    const auto found = stated.find(op);
    REQUIRE_MESSAGE(found != stated.end(), "no 16-bit tolerance is stated for " << op);
    return found->second;
}

double epsilon_of(DType dtype) { return dtype == DType::bfloat16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10); }

}  // namespace

TEST_CASE("every op in bfloat16 and float16 against float64, on every device") {
    std::vector<Device> devices = {Device::cpu};
    for (Device device : other_devices()) devices.push_back(device);
    for (const OpCheck& check : registered_op_checks()) {
        const Tolerance tolerance = tolerance_of(check.name.substr(0, check.name.find('/')));
        for (DType dtype : {DType::bfloat16, DType::float16}) {
            const double eps = epsilon_of(dtype);
            for (Device device : devices) {
                PrecisionResult result;
                REQUIRE_NOTHROW(result = check.run_in(dtype, device));
                if (std::getenv("RELGRAD_PRINT_PRECISION")) {
                    std::printf("%-32s %-8s %-11s output %.3g eps, gradient %.3g eps\n", check.name.c_str(),
                                dtype_name(dtype), device_name(device), result.output_error / eps,
                                result.gradient_error / eps);
                }
                CHECK_MESSAGE(result.output_error <= tolerance.output * eps,
                              check.name << " in " << std::string(dtype_name(dtype)) << " on "
                                         << std::string(device_name(device)) << ": output error "
                                         << result.output_error / eps << " eps, stated " << tolerance.output);
                CHECK_MESSAGE(result.gradient_error <= tolerance.gradient * eps,
                              check.name << " in " << std::string(dtype_name(dtype)) << " on "
                                         << std::string(device_name(device)) << ": gradient error "
                                         << result.gradient_error / eps << " eps, stated " << tolerance.gradient);
            }
        }
    }
}

TEST_CASE("in 16 bits a mask is still a wall: a fully masked row gets zero weights, never NaN") {
    // row 0 of each sequence sees keys 0 and 1; row 1 sees none; scores far apart in size
    const Tensor mask = from_vector({1, 1, 0, 0, 0, 0}, {2, 3}, DType::boolean).view({1, 1, 2, 3});
    Generator gen(11);
    for (DType dtype : {DType::bfloat16, DType::float16}) {
        const Tensor q = randn({1, 1, 2, 4}, gen, dtype), k = randn({1, 1, 3, 4}, gen, dtype) * 100.0;
        const Tensor v = randn({1, 1, 3, 4}, gen, dtype);
        Tensor weights;
        const Tensor z = attention(q, k, v, mask, 0.5, {}, &weights);
        AttentionPattern pattern;
        pattern.mask = mask;
        const Tensor fused = fused_attention(q, k, v, pattern, 0.5);
        const std::vector<double> a = weights.to_vector(), zs = z.to_vector(), fs = fused.to_vector();
        CHECK(a[0] + a[1] == doctest::Approx(1).epsilon(0.01));
        CHECK(a[2] == 0);
        for (int j = 3; j < 6; ++j) CHECK(a[j] == 0);
        for (int d = 4; d < 8; ++d) {
            CHECK(zs[d] == 0);
            CHECK(fs[d] == 0);
        }
        const Tensor scores = masked_fill(q.view({2, 4}), from_vector({0, 0, 0, 0, 1, 1, 1, 1}, {2, 4}, DType::boolean),
                                          -std::numeric_limits<double>::infinity());
        const std::vector<double> s = softmax(scores, -1).to_vector();
        for (int j = 4; j < 8; ++j) CHECK(s[j] == 0);
    }
}
