// bfloat16 and float16: the conversions (rounding to nearest even, subnormals, overflow, inf and
// NaN), and every registered op case (engine/op_gradchecks.cpp) computed in each against float64, on
// every device, within the tolerances stated below.
// No gradient check here: this file measures how far 16-bit results (outputs and gradients) are
// from float64 ones; the float64 gradient check of every one of these op cases runs in
// tests/engine/test_gradcheck.cpp.
#include "test_helpers.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend/backend.hpp"
#include "engine/half.hpp"
#include "engine/random.hpp"

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

// half_bits computes every case of a float16 conversion and picks one (so that loops of them
// vectorize); here each is checked against the format's definition, computed another way: every
// float16 value decoded from its fields, and a sweep of floats (every 977th bit pattern, all
// signs, exponents and NaNs) rounded to the nearest value of the table of all finite ones.
TEST_CASE("float16 conversions agree with the format's definition, for every value and a sweep of floats") {
    std::vector<double> finite;  // the positive finite values, bits 0 to 0x7bff, increasing
    for (uint32_t bits = 0; bits < 65536; ++bits) {
        const uint32_t exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
        double magnitude =
            exponent == 0 ? std::ldexp(double(mantissa), -24) : std::ldexp(double(1024 + mantissa), int(exponent) - 25);
        if (exponent == 0x1f) magnitude = mantissa == 0 ? inf : std::nan("");
        Float16 h;
        h.bits = static_cast<uint16_t>(bits);
        const double decoded = static_cast<float>(h);
        if (std::isnan(magnitude)) {
            REQUIRE(std::isnan(decoded));
        } else {
            REQUIRE(decoded == ((bits & 0x8000) ? -magnitude : magnitude));
            REQUIRE(std::signbit(decoded) == bool(bits & 0x8000));
        }
        if (bits <= 0x7bff) finite.push_back(magnitude);
    }
    for (uint64_t pattern = 0; pattern < (uint64_t(1) << 32); pattern += 977) {
        const uint32_t word = static_cast<uint32_t>(pattern);
        float f;
        std::memcpy(&f, &word, sizeof f);
        const uint16_t bits = Float16(f).bits;
        if (std::isnan(f)) {
            REQUIRE((bits & 0x7c00) == 0x7c00);
            REQUIRE((bits & 0x03ff) != 0);
            continue;
        }
        const double a = std::fabs(double(f));
        uint16_t nearest = 0x7c00;  // 65520 and more: inf
        if (a > finite.back() && a < 65520.0) {
            nearest = 0x7bff;  // up to the half step past 65504
        } else if (a < 65520.0) {
            const auto above = std::lower_bound(finite.begin(), finite.end(), a);
            nearest = static_cast<uint16_t>(above - finite.begin());
            if (*above != a) {  // between two values: the nearer, a tie to the even bits
                const double up = *above - a, down = a - *(above - 1);
                if (down < up || (down == up && (nearest & 1))) --nearest;
            }
        }
        REQUIRE(bits == (nearest | (std::signbit(f) ? 0x8000 : 0)));
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
        // through transposed views (strided rows, as a product's operands are): each element as above
        std::vector<double> rows;
        for (int r = 0; r < 3; ++r) rows.insert(rows.end(), values.begin(), values.end());
        const Tensor transposed = from_vector(rows, {3, 7}, DType::float64, device).transpose(0, 1);  // [7, 3]
        for (const DType dtype : {DType::float16, DType::bfloat16}) {
            const Tensor narrow = transposed.to(dtype);
            const Tensor back = narrow.transpose(0, 1).to(DType::float32);  // [3, 7] from a strided 16-bit view
            for (std::size_t i = 0; i < values.size(); ++i) {
                const double expected =
                    dtype == DType::float16 ? value_of<Float16>(values[i]) : value_of<BFloat16>(values[i]);
                for (int64_t r = 0; r < 3; ++r) {
                    CHECK(narrow.to_vector()[i * 3 + r] == expected);
                    CHECK(back.to_vector()[r * 7 + i] == expected);
                }
            }
        }
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
        {"dropout_add", {once, once}},
        {"cross_entropy", {0.001, once}},
        {"attention", {once, once}},
        // the backward reads the saved 16-bit output z (D_i = dz_i . z_i), as FlashAttention's does,
        // so dS = P (dP - D) carries z's rounding, bounded by the size of dS's terms, not of dS: a
        // gradient that cancels errs by more of itself (dq of a row that sees one key is 0 in
        // float64, and 0.02 in bfloat16 on some draws). 4 holds for these cases' draws; the
        // kernels are held to their terms' size, over seeds and shapes, in test_fused_attention.cpp
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

namespace {

// The kernel's result on 16-bit operands, and the same kernel's result on float32 copies of them
// rounded once into 16 bits (what a device without 16-bit kernels computes), as their doubles
struct TwoWays {
    std::vector<double> in_16_bits, on_float32_copies;
};

// Runs kernel(operands..., out) once on the 16-bit operands and once on their float32 copies.
template <class Kernel>
TwoWays both_ways(const std::vector<Tensor>& operands, const Shape& out_shape, Kernel&& kernel) {
    const DType narrow = operands.front().dtype();
    Tensor out = empty(out_shape, narrow);
    kernel(operands, out);
    std::vector<Tensor> wide;
    for (const Tensor& t : operands) wide.push_back(t.to(DType::float32));
    Tensor wide_out = empty(out_shape, DType::float32);
    kernel(wide, wide_out);
    return {out.to_vector(), wide_out.to(narrow).to_vector()};
}

void check_same_bits(const TwoWays& results, const std::string& what) {
    REQUIRE(results.in_16_bits.size() == results.on_float32_copies.size());
    int64_t differing = 0, first = -1;
    for (std::size_t i = 0; i < results.in_16_bits.size(); ++i) {
        const double a = results.in_16_bits[i], b = results.on_float32_copies[i];
        const bool same = (a == b && std::signbit(a) == std::signbit(b)) || (std::isnan(a) && std::isnan(b));
        if (!same && differing++ == 0) first = static_cast<int64_t>(i);
    }
    CHECK_MESSAGE(differing == 0, what << ": " << differing << " elements differ, the first at " << first << " ("
                                       << results.in_16_bits[first] << " against " << results.on_float32_copies[first]
                                       << ")");
}

}  // namespace

// The CPU reads and writes 16-bit tensors in its elementwise kernels (elementwise_16_bit): every
// result is formed in float32 and rounded once, so it must be the float32 kernel's result rounded,
// bit for bit: over more elements than one thread's chunk, with a tail that fills no SIMD batch,
// in every layout the packed loops take and in those that fall back to float32 copies.
TEST_CASE("the CPU's 16-bit elementwise kernels give the float32 kernels' results rounded once") {
    Backend& cpu = backend_for(Device::cpu);
    REQUIRE(cpu.supports(OptionalKernel::elementwise_16_bit));
    Generator gen(7);
    const int64_t rows = 301, width = 259;  // 77959 elements: two chunks and a ragged tail
    for (DType dtype : {DType::bfloat16, DType::float16}) {
        const std::string in = std::string(" in ") + dtype_name(dtype);
        const Tensor x = mul(randn({rows, width}, gen), scalar(3.0)).to(dtype);
        const Tensor y = add(rand({rows, width}, gen), scalar(0.5)).to(dtype);
        const Tensor bias_row = randn({width}, gen).to(dtype), per_row = randn({rows, 1}, gen).to(dtype);
        const Tensor one_value = randn({}, gen).to(dtype);
        for (UnaryOp op : {UnaryOp::neg, UnaryOp::exp, UnaryOp::tanh, UnaryOp::sigmoid, UnaryOp::gelu,
                           UnaryOp::gelu_grad, UnaryOp::relu, UnaryOp::clamp}) {
            const auto unary = [&](const std::vector<Tensor>& t, Tensor& out) { cpu.unary(op, t[0], out, -0.5, 0.5); };
            check_same_bits(both_ways({x}, x.shape(), unary), "unary " + std::to_string(int(op)) + in);
            // a transposed view: on a float32 copy
            const Shape transposed{width, rows};
            check_same_bits(both_ways({x.transpose(0, 1)}, transposed, unary),
                            "unary " + std::to_string(int(op)) + " of a transposed view" + in);
        }
        const std::vector<std::pair<std::string, Tensor>> others = {
            {"full", y},
            {"a bias row", bias_row},
            {"a per-row scalar", per_row},
            {"one value", one_value},
            {"a strided view", y.transpose(0, 1).contiguous().transpose(0, 1)}};
        for (BinaryOp op : {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div, BinaryOp::pow}) {
            for (const auto& [layout, other] : others) {
                const auto binary = [&](const std::vector<Tensor>& t, Tensor& out) { cpu.binary(op, t[0], t[1], out); };
                check_same_bits(both_ways({x, other}, x.shape(), binary),
                                "binary " + std::to_string(int(op)) + " with " + layout + in);
                check_same_bits(both_ways({other, x}, x.shape(), binary),
                                "binary " + std::to_string(int(op)) + " with " + layout + " first" + in);
            }
        }
        std::vector<double> chosen(x.numel());
        for (std::size_t i = 0; i < chosen.size(); ++i) chosen[i] = (i * 7919) % 3 == 0;
        const Tensor cond = from_vector(chosen, x.shape(), DType::boolean);
        const auto select = [&](const std::vector<Tensor>& t, Tensor& out) { cpu.where(cond, t[0], t[1], out); };
        check_same_bits(both_ways({x, y}, x.shape(), select), "where" + in);
        check_same_bits(both_ways({x, bias_row}, x.shape(), select), "where with a broadcast operand" + in);
        const DropoutMask mask = draw_dropout_mask(gen, 0.3, x.numel());
        check_same_bits(
            both_ways({x}, x.shape(),
                      [&](const std::vector<Tensor>& t, Tensor& out) { cpu.dropout(t[0], Tensor(), mask, out); }),
            "dropout" + in);
        check_same_bits(
            both_ways({x, y}, x.shape(),
                      [&](const std::vector<Tensor>& t, Tensor& out) { cpu.dropout(t[0], t[1], mask, out); }),
            "dropout with a residual" + in);
        for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{0}, {1}}) {
            Shape kept = x.shape();
            kept[dims[0]] = 1;
            for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
                check_same_bits(
                    both_ways({x}, kept,
                              [&](const std::vector<Tensor>& t, Tensor& out) { cpu.reduce(op, t[0], dims, out); }),
                    "reduce " + std::to_string(int(op)) + " over dim " + std::to_string(dims[0]) + in);
            }
        }
    }
}
