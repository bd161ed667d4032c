// The worked examples of docs/engine.md ("A backward pass by hand" and its two subsections, a
// tensor used twice inside the graph and the backward of broadcasting), number for number, each
// ending in the gradient check of the same function.
#include "test_helpers.hpp"

#include "engine/autograd.hpp"
#include "engine/gradcheck.hpp"

using namespace relgrad;
using namespace relgrad::testing;

namespace {
// L = (a*b + a)^2
Tensor example(const Tensor& a, const Tensor& b) {
    const Tensor c = a * b;
    const Tensor d = c + a;
    return d * d;
}
}  // namespace

TEST_CASE("the worked example of docs/engine.md") {
    Tensor a = scalar(2, DType::float64).requires_grad_(true);
    Tensor b = scalar(-3, DType::float64).requires_grad_(true);
    Tensor c = a * b;        // -6
    Tensor d = c + a;        // -4
    const Tensor L = d * d;  // 16
    c.retain_grad();
    d.retain_grad();
    CHECK(L.item() == 16);
    L.backward();
    CHECK(d.grad().item() == -8);   // dL/dd = 2d
    CHECK(c.grad().item() == -8);   // dL/dc = dL/dd * 1
    CHECK(b.grad().item() == -16);  // dL/db = dL/dc * a
    CHECK(a.grad().item() == 16);   // dL/da = dL/dc * b + dL/dd * 1 = 24 - 8
    CHECK(L.grad_fn()->op_name == "mul");
    CHECK(d.grad_fn()->op_name == "add");

    const GradcheckResult result = gradcheck([](const std::vector<Tensor>& x) { return example(x[0], x[1]); },
                                             {a.detach().requires_grad_(true), b.detach().requires_grad_(true)});
    CHECK_MESSAGE(result.passed, result.report);
}

TEST_CASE("docs/engine.md: a tensor used twice inside the graph") {
    Tensor a = scalar(1, DType::float64).requires_grad_(true);
    Tensor b = 2.0 * a;      // 2
    Tensor c = b * 3.0;      // 6
    const Tensor L = b * c;  // 12 = 3 b^2 = 12 a^2
    b.retain_grad();
    c.retain_grad();
    CHECK(L.item() == 12);
    L.backward();
    CHECK(c.grad().item() == 2);   // from L: the other factor, b
    CHECK(b.grad().item() == 12);  // 6 from L (c) + 6 through c (2 * 3) = 6 b
    CHECK(a.grad().item() == 24);  // 2 * 12 = 24 a

    const GradcheckResult result = gradcheck(
        [](const std::vector<Tensor>& x) {
            const Tensor twice = 2.0 * x[0];
            return twice * (twice * 3.0);
        },
        {a.detach().requires_grad_(true)});
    CHECK_MESSAGE(result.passed, result.report);
}

TEST_CASE("docs/engine.md: broadcasting, backward") {
    Tensor x = f64({1, 2, 3, 4, 5, 6}, {2, 3}).requires_grad_(true);
    Tensor w = f64({10, 20, 30}, {3}).requires_grad_(true);
    const Tensor y = x + w;
    check_values(y, {11, 22, 33, 14, 25, 36});
    const Tensor g = f64({1, 2, 3, 4, 5, 6}, {2, 3});
    y.backward(g);
    check_values(x.grad(), {1, 2, 3, 4, 5, 6});
    CHECK(w.grad().shape() == Shape{3});
    check_values(w.grad(), {5, 7, 9});
    const Tensor column = sum_to(g, {2, 1});  // a [2, 1] operand
    CHECK(column.shape() == Shape{2, 1});
    check_values(column, {6, 15});

    const GradcheckResult result = gradcheck([](const std::vector<Tensor>& in) { return in[0] + in[1]; },
                                             {x.detach().requires_grad_(true), w.detach().requires_grad_(true)});
    CHECK_MESSAGE(result.passed, result.report);
}
