// The graph: accumulation, topological order, freeing, NoGradGuard, errors.
#include "test_helpers.hpp"

#include "engine/autograd.hpp"
#include "engine/gradcheck.hpp"
#include "engine/optim.hpp"
#include "engine/profile.hpp"

using namespace relgrad;
using namespace relgrad::testing;

TEST_CASE("a tensor used several times gets every contribution") {
    Tensor x = f64({1, -2, 3}, {3}).requires_grad_(true);
    // L = sum(x * x + x)   dL/dx = 2x + 1 (x is used three times)
    sum(x * x + x).backward();
    check_values(x.grad(), {3, -3, 7});
}

TEST_CASE("diamond: two paths from one input meet again") {
    Tensor a = scalar(0.5, DType::float64).requires_grad_(true);
    // b = exp(a), c = a^3, L = b * c      dL/da = exp(a) a^3 + exp(a) 3 a^2
    const Tensor b = exp(a), c = pow(a, 3.0);
    (b * c).backward();
    const double e = std::exp(0.5);
    CHECK(a.grad().item() == doctest::Approx(e * 0.125 + e * 3 * 0.25).epsilon(1e-14));
}

TEST_CASE("a graph deeper than any call stack") {
    Tensor x = scalar(1.0, DType::float64).requires_grad_(true);
    Tensor y = x;
    for (int i = 0; i < 200000; ++i) y = y + x;  // y = 200001 x
    y.backward();
    CHECK(x.grad().item() == 200001);
}

TEST_CASE("a graph deeper than any call stack is freed without a backward too") {
    // dropping the last tensor frees a million nodes in a loop, not one call inside another
    Tensor x = scalar(1.0, DType::float64).requires_grad_(true);
    Tensor y = x;
    for (int i = 0; i < 500000; ++i) y = neg(y);
    for (int i = 0; i < 500000; ++i) y = mul(y, y);  // a node that holds one tensor twice
    CHECK(y.item() == 1.0);
    const std::weak_ptr<Node> first_node = [&] {  // the node of the first neg, deep down the chain
        Tensor t = y;
        while (t.grad_fn()->inputs[0].grad_fn()) t = t.grad_fn()->inputs[0];
        return std::weak_ptr<Node>(t.grad_fn());
    }();
    CHECK_FALSE(first_node.expired());
    y = Tensor();
    CHECK(first_node.expired());
}

TEST_CASE("the graph is freed after backward unless retained") {
    Tensor x = f64({2}, {1}).requires_grad_(true);
    const Tensor y = sum(x * x);
    y.backward(Tensor(), /*retain_graph=*/true);
    check_values(x.grad(), {4});
    y.backward();  // gradients add up across calls
    check_values(x.grad(), {8});
    CHECK(y.grad_fn()->released);
    CHECK_THROWS_WITH_AS(y.backward(), doctest::Contains("already freed by an earlier backward(); pass retain_graph"),
                         std::runtime_error);
    check_values(x.grad(), {8});  // the failed call left the gradient as it was
    x.zero_grad();
    CHECK_FALSE(x.grad().defined());
    sum(x * x).backward();  // a fresh graph starts from zero
    check_values(x.grad(), {4});
}

TEST_CASE("only leaves keep gradients, unless retain_grad") {
    Tensor x = f64({1, 2}, {2}).requires_grad_(true);
    Tensor hidden = x * 3.0;
    Tensor kept = hidden + 1.0;
    kept.retain_grad();
    sum(kept * kept).backward();
    CHECK_FALSE(hidden.grad().defined());
    check_values(kept.grad(), {8, 14});  // 2 (3x + 1)
    check_values(x.grad(), {24, 42});    // 6 (3x + 1)
    CHECK_THROWS_AS(hidden.requires_grad_(false), std::invalid_argument);
}

TEST_CASE("NoGradGuard records nothing") {
    Tensor x = f64({1}, {1}).requires_grad_(true);
    {
        NoGradGuard no_grad;
        const Tensor y = x * 2.0;
        CHECK_FALSE(y.requires_grad());
        CHECK((y.grad_fn() == nullptr));
    }
    CHECK((x * 2.0).requires_grad());
}

TEST_CASE("backward errors") {
    Tensor x = f64({1, 2, 3}, {3}).requires_grad_(true);
    const Tensor y = x * 2.0;
    CHECK_THROWS_WITH_AS(y.backward(), doctest::Contains("the tensor has shape [3]; only a single-element tensor"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(y.backward(ones({2}, DType::float64)),
                         "backward: the gradient has shape [2] (float64, cpu), expected [3] (float64, cpu)",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(y.backward(ones({3}, DType::float64, Device::guarded_cpu)),
                         "backward: the gradient has shape [3] (float64, guarded_cpu), expected [3] (float64, cpu)",
                         std::invalid_argument);
    CHECK_THROWS_AS(f64({1}, {1}).backward(), std::invalid_argument);  // nothing requires a gradient
    y.backward(f64({1, 0, -1}, {3}));                                  // an explicit gradient works
    check_values(x.grad(), {2, 0, -2});
}

TEST_CASE("a small network passes its gradient check") {
    // tanh(x W + b) summed over a mix of ops: every input gets a gradient through several paths
    Generator gen(3);
    const std::vector<Tensor> inputs = {randn({4, 3}, gen, DType::float64).requires_grad_(true),
                                        randn({3, 2}, gen, DType::float64).requires_grad_(true),
                                        randn({2}, gen, DType::float64).requires_grad_(true)};
    const GradcheckResult result = gradcheck(
        [](const std::vector<Tensor>& x) {
            const Tensor h = tanh(add(matmul(x[0], x[1]), x[2]));
            return mean(mul(h, sigmoid(h)), {0}) + sum(x[1] * x[1]);
        },
        inputs);
    CHECK_MESSAGE(result.passed, result.report);
}

TEST_CASE("stored gradients are packed and share memory with nothing else") {
    Tensor x = f64({1, 2, 3, 4, 5, 6}, {2, 3}).requires_grad_(true);
    sum(x).backward();  // the gradient arrives as a stride-0 broadcast
    CHECK(x.grad().is_contiguous());
    CHECK(x.grad().storage()->nbytes() == 6 * sizeof(double));
    Tensor a = f64({1, 2}, {2}).requires_grad_(true), b = f64({3, 4}, {2}).requires_grad_(true);
    Tensor seed = f64({1, 1}, {2});
    add(a, b).backward(seed);
    CHECK((a.grad().storage() != seed.storage()));
    CHECK((a.grad().storage() != b.grad().storage()));
    seed.data<double>()[0] = 42;
    check_values(a.grad(), {1, 1});
}

TEST_CASE("a backward that throws can be run again") {
    Tensor x = f64({2}, {1}).requires_grad_(true);
    auto fail_once = std::make_shared<bool>(true);
    const Tensor y = record(mul(x.detach(), x.detach()), "flaky", {x}, [x = x.detach(), fail_once](const Tensor& g) {
        if (*fail_once) {
            *fail_once = false;
            throw std::runtime_error("flaky backward");
        }
        return std::vector<Tensor>{g * x * 2.0};
    });
    const Tensor loss = sum(y * 3.0);
    CHECK_THROWS_WITH_AS(loss.backward(), "flaky backward", std::runtime_error);
    loss.backward();  // nothing was released by the failed pass
    check_values(x.grad(), {12});
}

TEST_CASE("checkpoint: the same output and gradients as the plain graph, with nothing of fn kept") {
    // fn(x, y) = sum_j tanh(x W + y)_j * x_j with a "parameter" W used inside fn
    Tensor W = f64({0.5, -1, 2, 0.25}, {2, 2}).requires_grad_(true);
    auto fn = [&W](const std::vector<Tensor>& in) { return mul(tanh(add(matmul(in[0], W), in[1])), in[0]); };
    const Tensor x0 = f64({0.3, -0.7, 1.1, 0.2}, {2, 2}), y0 = f64({0.1, 0.2, -0.3, 0.4}, {2, 2});
    const Tensor dz = f64({1, -2, 0.5, 3}, {2, 2});

    Tensor x = x0.detach().requires_grad_(true), y = y0.detach().requires_grad_(true);
    const Tensor plain = fn({x, y});
    plain.backward(dz);
    const std::vector<double> dx = x.grad().to_vector(), dy = y.grad().to_vector(), dW = W.grad().to_vector();

    W.zero_grad();
    x = x0.detach().requires_grad_(true);
    y = y0.detach().requires_grad_(true);
    int calls = 0;
    const Tensor z = checkpoint(fn, {x, y}, {W}, [&calls] { ++calls; });
    check_values(z, plain.to_vector(), 0.0);
    CHECK(z.grad_fn()->op_name == "checkpoint");
    CHECK(z.grad_fn()->inputs.size() == 3);  // x, y and W: no intermediate of fn
    z.backward(dz, /*retain_graph=*/true);
    CHECK(calls == 1);
    check_values(x.grad(), dx, 1e-15);
    check_values(y.grad(), dy, 1e-15);
    check_values(W.grad(), dW, 1e-15);
    z.backward(dz);  // a second pass recomputes again and adds the same again
    CHECK(calls == 2);
    check_values(W.grad(), {2 * dW[0], 2 * dW[1], 2 * dW[2], 2 * dW[3]}, 1e-15);

    // only the parameter needs a gradient: the node is still recorded
    W.zero_grad();
    const Tensor only_w = checkpoint(fn, {x0, y0}, {W});
    CHECK(only_w.requires_grad());
    only_w.backward(dz);
    check_values(W.grad(), dW, 1e-15);
    // an fn that returns its input gives a new tensor, not the input with a node attached
    const Tensor same = checkpoint([](const std::vector<Tensor>& in) { return in[0]; }, {x}, {});
    CHECK(same.impl() != x.impl());
    CHECK(!x.grad_fn());
}

// The profiler (engine/profile.hpp) attributes time to the outermost op, forward and backward.
TEST_CASE("a profile lists each outermost op per phase, with its products' FLOPs") {
    Generator gen(4);
    const Tensor x = randn({6, 5}, gen, DType::float64).requires_grad_(true);
    const Tensor w = randn({5, 3}, gen, DType::float64).requires_grad_(true);
    const Tensor gamma = ones({3}, DType::float64).requires_grad_(true), beta = zeros({3}, DType::float64);
    { const ProfileScope outside_a_profile("ignored"); }
    start_profile();
    CHECK_THROWS_AS(start_profile(), std::logic_error);
    sum(layer_norm(matmul(x, w), gamma, beta)).backward();
    const Profile profile = stop_profile();
    CHECK_THROWS_AS(stop_profile(), std::logic_error);
    auto row = [&](const std::string& op, Phase phase) -> const ProfileRow* {
        for (const ProfileRow& r : profile.rows) {
            if (r.op == op && r.phase == phase) return &r;
        }
        return nullptr;
    };
    for (const char* op : {"matmul", "layer_norm", "sum"}) {
        CAPTURE(op);
        REQUIRE(row(op, Phase::forward));
        CHECK(row(op, Phase::forward)->calls == 1);
        REQUIRE(row(op, Phase::backward));
        CHECK(row(op, Phase::backward)->calls == 1);
    }
    CHECK(row("mean", Phase::forward) == nullptr);  // inside layer_norm: layer_norm's time
    CHECK(row("ignored", Phase::forward) == nullptr);
    CHECK(row("matmul", Phase::forward)->gemm_flops == 2.0 * 6 * 5 * 3);
    CHECK(row("matmul", Phase::backward)->gemm_flops == 2 * (2.0 * 6 * 5 * 3));  // dx and dw
    CHECK(row("layer_norm", Phase::forward)->gemm_flops == 0);
    double in_ops = 0;
    for (const ProfileRow& r : profile.rows) in_ops += r.seconds;
    CHECK(in_ops <= profile.seconds);
    const std::string table = profile_table(profile, 100.0);
    CHECK(table.find("layer_norm                   backward") != std::string::npos);
    CHECK(table.find("of this machine's 100.0 GFLOP/s") != std::string::npos);
}

TEST_CASE("backward refuses a tensor its ops saved and something wrote in place after the forward") {
    // the tensors each op's backward reads are checked; a tensor only its shape is read of is not
    Tensor w = f64({1, 1, 1}, {3}).requires_grad_(true);
    Tensor x = f64({1, 2, 3}, {3});
    const Tensor product = sum(mul(w, x)), total = sum(add(w, x));
    x.copy_(f64({5, 5, 5}, {3}));  // after the forward: the gradient of the product would be [5, 5, 5]
    CHECK_THROWS_WITH_AS(product.backward(),
                         "backward of mul: b ([3], float64), which mul saved for its gradient, was changed in place "
                         "(copy_, an optimizer step or a load) after the forward; the gradient would be of the new "
                         "values. Run the forward again after the change, or change a clone()",
                         std::runtime_error);
    CHECK_FALSE(w.grad().defined());
    total.backward();  // add's backward reads no values
    check_values(w.grad(), {1, 1, 1});

    SUBCASE("an op's own output, read by its backward") {
        Tensor v = f64({0.5, -1}, {2}).requires_grad_(true);
        Tensor e = exp(v);
        const Tensor loss = sum(e);
        {
            NoGradGuard overwrite;
            e.copy_(f64({0, 0}, {2}));
        }
        CHECK_THROWS_WITH_AS(loss.backward(), doctest::Contains("backward of exp: y ([2], float64)"),
                             std::runtime_error);
    }
    SUBCASE("an optimizer's step between the forward and the backward") {
        Tensor v = f64({0.5, -1}, {2}).requires_grad_(true);
        const Tensor loss = sum(mul(v, v));
        loss.backward(Tensor(), true);
        AdamW(std::vector<Tensor>{v}, AdamWOptions{}).step(0.1);
        CHECK_THROWS_WITH_AS(loss.backward(), doctest::Contains("backward of mul: a ([2], float64)"),
                             std::runtime_error);
    }
}
