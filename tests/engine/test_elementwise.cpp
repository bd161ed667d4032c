// Elementwise ops: values, broadcasting, errors, gradients.
#include "test_helpers.hpp"

#include <limits>

using namespace relgrad;
using namespace relgrad::testing;

TEST_CASE("unary values match the C library") {
    const std::vector<double> xs = {-2.5, -0.3, 0.7, 1.9};
    const Tensor x = f64(xs, {2, 2});
    std::vector<double> e, l, s, t, sg, r, g, c, p;
    for (double v : xs) {
        e.push_back(std::exp(v));
        l.push_back(std::log(std::fabs(v)));
        s.push_back(std::sqrt(std::fabs(v)));
        t.push_back(std::tanh(v));
        sg.push_back(1 / (1 + std::exp(-v)));
        r.push_back(v > 0 ? v : 0);
        g.push_back(0.5 * v * (1 + std::erf(v / std::sqrt(2.0))));
        c.push_back(std::min(std::max(v, -0.5), 1.0));
        p.push_back(std::pow(std::fabs(v), 1.5));
    }
    const Tensor ax = f64({2.5, 0.3, 0.7, 1.9}, {2, 2});
    check_values(exp(x), e);
    check_values(log(ax), l);
    check_values(sqrt(ax), s);
    check_values(tanh(x), t);
    check_values(sigmoid(x), sg);
    check_values(relu(x), r);
    check_values(gelu(x), g);
    check_values(clamp(x, -0.5, 1.0), c);
    check_values(pow(ax, 1.5), p);
    check_values(neg(x), {2.5, 0.3, -0.7, -1.9});
    check_values(sigmoid(f64({-1000, 1000}, {2})), {0, 1});  // no overflow to NaN
    CHECK_THROWS_AS(clamp(x, 1, -1), std::invalid_argument);
}

TEST_CASE("binary ops broadcast as NumPy does") {
    const Tensor a = f64({1, 2, 3, 4, 5, 6}, {2, 3});
    const Tensor column = f64({10, 20}, {2, 1});
    const Tensor row = f64({1, 2, 4}, {3});
    check_values(add(a, column), {11, 12, 13, 24, 25, 26});
    check_values(sub(a, row), {0, 0, -1, 3, 3, 2});
    check_values(mul(a, row), {1, 4, 12, 4, 10, 24});
    check_values(div(a, row), {1, 1, 0.75, 4, 2.5, 1.5});
    check_values(pow(a, row), {1, 4, 81, 4, 25, 1296});
    check_values(add(column, row), {11, 12, 14, 21, 22, 24});  // [2,1] + [3] -> [2,3]
    check_values(a * 2.0 - 1.0, {1, 3, 5, 7, 9, 11});
    check_values(add(a.transpose(0, 1), column.transpose(0, 1)), {11, 24, 12, 25, 13, 26});
}

// The CPU's packed loops (a bias row, a per-row scalar, a single value, on either side) give what
// its strided broadcasting gives, on a tensor big enough to be cut between threads mid-row.
TEST_CASE("packed broadcasting layouts agree with strided broadcasting") {
    Generator gen(5);
    const Tensor full = randn({64, 3, 200}, gen, DType::float64);
    const Tensor strided_full = full.transpose(0, 2).contiguous().transpose(0, 2);  // same values, not packed
    REQUIRE(!strided_full.is_contiguous());
    for (const Shape& shape : std::vector<Shape>{{64, 1, 1}, {64, 3, 1}, {200}, {3, 200}, {1, 3, 1}, {1}}) {
        CAPTURE(shape_str(shape));
        const Tensor other = randn(shape, gen, DType::float64) + 3.0;
        using Binary = Tensor (*)(const Tensor&, const Tensor&);
        for (Binary op : {static_cast<Binary>(add), static_cast<Binary>(sub), static_cast<Binary>(mul),
                          static_cast<Binary>(div)}) {
            CHECK(op(full, other).to_vector() == op(strided_full, other).to_vector());
            CHECK(op(other, full).to_vector() == op(other, strided_full).to_vector());
        }
    }
}

TEST_CASE("mismatches name the op and both shapes") {
    const Tensor a = zeros({2, 3}, DType::float64);
    CHECK_THROWS_WITH_AS(add(a, zeros({4}, DType::float64)), "add: shapes [2, 3] and [4] cannot be broadcast together",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(mul(a, zeros({2, 3}, DType::float32)), "mul: dtype mismatch, float64 [2, 3] vs float32 [2, 3]",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(add(zeros({2}, DType::int64), zeros({2}, DType::int64)),
                         "add: needs a floating tensor (float32, float64, bfloat16 or float16), got int64", std::invalid_argument);
    CHECK_THROWS_WITH_AS(masked_fill(a, zeros({3, 3}, DType::boolean), 0),
                         doctest::Contains("masked_fill: shapes [2, 3] and [3, 3] cannot be broadcast"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(masked_fill(zeros({3}, DType::float64), zeros({2, 3}, DType::boolean), 0),
                         "masked_fill: mask of shape [2, 3] does not broadcast to the input's shape [3]",
                         std::invalid_argument);
}

TEST_CASE("where and masked_fill select; float32 works like float64") {
    const Tensor x = from_vector({1, 2, 3, 4}, {2, 2}, DType::float32);
    const Tensor mask = from_vector({1, 0}, {2}, DType::boolean);
    check_values(masked_fill(x, mask, -std::numeric_limits<double>::infinity()), {-INFINITY, 2, -INFINITY, 4});
    check_values(where(mask, x, x * 10.0), {1, 20, 3, 40});
    check_values(where(from_vector({0, 3}, {2}, DType::int64), x, x * 10.0), {10, 2, 30, 4});  // any non-zero is true
    CHECK(where(mask, x, x).dtype() == DType::float32);
}

TEST_CASE("elementwise gradients") {
    for (const char* op : {"add", "sub", "mul", "div", "pow", "pow_scalar", "neg", "exp", "log", "sqrt", "tanh",
                           "sigmoid", "relu", "gelu", "clamp", "where", "masked_fill"}) {
        gradcheck_op(op);
    }
}

TEST_CASE("pow has finite gradients at a zero base") {
    Tensor x = f64({0, 2}, {2}).requires_grad_(true);
    sum(pow(x, 0.0)).backward();
    check_values(x.grad(), {0, 0});
    Tensor a = f64({0, 0}, {2}).requires_grad_(true), b = f64({0, 2}, {2}).requires_grad_(true);
    sum(pow(a, b)).backward();
    check_values(a.grad(), {0, 0});  // b = 0: d(a^0)/da = 0; b = 2: 2a = 0
    check_values(b.grad(), {0, 0});  // a = 0: the limit of y log a
}

TEST_CASE("large packed tensors (split across threads) agree with the strided path") {
    Generator gen(11);
    const Tensor base = randn({3, 40000}, gen, DType::float64);  // 120,000 elements: above the threading threshold
    const Tensor strided_view = base.transpose(0, 1);            // [40000, 3], not contiguous: the strided path
    const Tensor packed = strided_view.contiguous();             // the same values, packed: the threaded path
    const Tensor other = randn({40000, 3}, gen, DType::float64);
    const Tensor row = randn({3}, gen, DType::float64);
    const Tensor mask = from_vector(std::vector<double>(120000, 0.0), {40000, 3}, DType::boolean);
    auto same = [](const Tensor& a, const Tensor& b, double tol) {
        const std::vector<double> x = a.to_vector(), y = b.to_vector();
        REQUIRE(x.size() == y.size());
        double worst = 0;
        for (std::size_t i = 0; i < x.size(); ++i)
            worst = std::max(worst, std::fabs(x[i] - y[i]) / (1 + std::fabs(y[i])));
        CHECK(worst <= tol);
    };
    same(exp(packed), exp(strided_view), 1e-15);
    same(tanh(packed), tanh(strided_view), 1e-15);
    same(add(packed, other), add(strided_view, other), 0);
    same(mul(packed, row), mul(strided_view, row), 0);  // a bias row repeating every 3 elements
    same(packed / 3.0, strided_view / 3.0, 0);
    same(where(mask, packed, other), other, 0);  // nothing selected from packed
    gradcheck_op("div");
}
