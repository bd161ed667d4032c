// A user's program on an installed relgrad (see CMakeLists.txt next to it): a Linear layer from
// relgrad::layers on a tensor from relgrad::engine, a backward pass, and every value checked
// against one worked by hand. Exits 1 on any mismatch.
#include <relgrad/engine/ops.hpp>
#include <relgrad/engine/tensor.hpp>
#include <relgrad/layers/basic.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace {

int failures = 0;

void expect(const std::string& what, const std::vector<double>& got, const std::vector<double>& want) {
    bool same = got.size() == want.size();
    for (std::size_t i = 0; same && i < got.size(); ++i) same = std::fabs(got[i] - want[i]) <= 1e-12;
    std::printf("%-9s %s\n", what.c_str(), same ? "ok" : "MISMATCH");
    if (!same) {
        ++failures;
        for (std::size_t i = 0; i < got.size() || i < want.size(); ++i) {
            std::printf("  [%zu] got %s, want %s\n", i, i < got.size() ? std::to_string(got[i]).c_str() : "-",
                        i < want.size() ? std::to_string(want[i]).c_str() : "-");
        }
    }
}

}  // namespace

int main() {
    using namespace relgrad;
    const DType f64 = DType::float64;

    // y = x W^T + b with W = [[1, 2, 3], [4, 5, 6]], b = [0.5, -0.5], x = [[1, -1, 2]]
    Generator gen(0);
    Linear linear(3, 2, Init{gen, f64});
    Tensor w = from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, f64);
    Tensor b = from_vector({0.5, -0.5}, {2}, f64);
    linear.assign_parameters({w.requires_grad_(), b.requires_grad_()});
    Tensor x = from_vector({1, -1, 2}, {1, 3}, f64).requires_grad_();

    // loss = sum(y^2); y = [5.5, 10.5]
    Tensor y = linear.forward(x);
    Tensor loss = sum(mul(y, y));
    loss.backward();

    // dloss/dy = 2y = [11, 21]; dx = 2y W; dW = (2y)^T x; db = 2y
    expect("y", y.to_vector(), {5.5, 10.5});
    expect("loss", {loss.item()}, {140.5});
    expect("x.grad", x.grad().to_vector(), {95, 127, 159});
    expect("W.grad", linear.weight.grad().to_vector(), {11, -11, 22, 21, -21, 42});
    expect("b.grad", linear.bias.grad().to_vector(), {11, 21});
    return failures == 0 ? 0 : 1;
}
