// The worked example of docs/engine.md ("A backward pass by hand"), number for number, ending in
// the gradient check of the same function.
#include "check.hpp"

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
