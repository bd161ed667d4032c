// AdamW, the learning-rate schedule and gradient clipping. (No gradcheck: nothing here is
// differentiated; the updates are checked against the formulas written out by hand.)
#include <filesystem>
#include <fstream>
#include <limits>

#include "test_helpers.hpp"
#include "engine/optim.hpp"

using namespace relgrad;
using namespace relgrad::testing;

TEST_CASE("AdamW follows its formula step by step") {
    Tensor p = f64({1.0, -2.0}, {2}).requires_grad_(true);
    AdamWOptions o;
    o.beta1 = 0.9;
    o.beta2 = 0.99;
    o.eps = 1e-8;
    o.weight_decay = 0.1;
    AdamW adam({p}, o);
    // step 1, g = 2p = (2, -4): m = 0.1 g, v = 0.01 g^2, m_hat = g, v_hat = g^2, update = g/|g| = (1, -1)
    sum(mul(p, p)).backward();
    adam.step(0.5);
    const double p0 = 1.0 * (1 - 0.05) - 0.5 * (2.0 / (2.0 + 1e-8));
    const double p1 = -2.0 * (1 - 0.05) - 0.5 * (-4.0 / (4.0 + 1e-8));
    check_values(p, {p0, p1}, 1e-15);
    // step 2 with g = 2p again
    p.zero_grad();
    sum(mul(p, p)).backward();
    adam.step(0.5);
    std::vector<double> expected;
    for (double x : {p0, p1}) {
        const double g1 = 2 * (x == p0 ? 1.0 : -2.0), g2 = 2 * x;
        const double m = 0.9 * 0.1 * g1 + 0.1 * g2, v = 0.99 * 0.01 * g1 * g1 + 0.01 * g2 * g2;
        const double m_hat = m / (1 - 0.81), v_hat = v / (1 - 0.9801);
        expected.push_back(x * (1 - 0.05) - 0.5 * m_hat / (std::sqrt(v_hat) + 1e-8));
    }
    check_values(p, expected, 1e-14);
    CHECK(adam.steps() == 2);
}

TEST_CASE("AdamW minimises a quadratic and leaves gradient-free parameters alone") {
    Tensor target = f64({3, -1, 0.5}, {3});
    Tensor x = zeros({3}, DType::float64).requires_grad_(true);
    Tensor frozen = f64({7}, {1}).requires_grad_(true);
    AdamWOptions o;
    o.weight_decay = 0;
    AdamW adam({x, frozen}, o);
    for (int i = 0; i < 500; ++i) {
        x.zero_grad();
        const Tensor d = sub(x, target);
        sum(mul(d, d)).backward();
        adam.step(0.05);
    }
    check_values(x, target.to_vector(), 1e-3);
    check_values(frozen, {7});
}

TEST_CASE("saving and loading the optimizer continues the same trajectory") {
    const auto dir = (std::filesystem::temp_directory_path() / "relgrad_test_adamw").string();
    auto run = [&](bool interrupt) {
        Tensor x = f64({1, 2}, {2}).requires_grad_(true);
        auto adam = std::make_unique<AdamW>(std::vector<Tensor>{x}, AdamWOptions{});
        for (int i = 0; i < 6; ++i) {
            if (interrupt && i == 3) {
                adam->save(dir);
                adam = std::make_unique<AdamW>(std::vector<Tensor>{x}, AdamWOptions{});
                adam->load(dir);
            }
            x.zero_grad();
            sum(exp(x)).backward();
            adam->step(0.1);
        }
        return x.to_vector();
    };
    CHECK(run(true) == run(false));
    Tensor wrong = zeros({3}, DType::float64).requires_grad_(true);
    AdamW other({wrong}, AdamWOptions{});
    CHECK_THROWS_AS(other.load(dir), std::runtime_error);
    std::filesystem::remove_all(dir);
}

TEST_CASE("learning-rate schedules") {
    CHECK(learning_rate(Schedule::cosine, 1.0, 0, 10, 110) == doctest::Approx(0.1));  // warmup: (step + 1) / 10
    CHECK(learning_rate(Schedule::cosine, 1.0, 9, 10, 110) == doctest::Approx(1.0));
    CHECK(learning_rate(Schedule::cosine, 1.0, 10, 10, 110) == doctest::Approx(1.0));
    CHECK(learning_rate(Schedule::cosine, 1.0, 60, 10, 110) == doctest::Approx(0.5));  // halfway down the cosine
    CHECK(learning_rate(Schedule::cosine, 1.0, 110, 10, 110) == doctest::Approx(0.0));
    CHECK(learning_rate(Schedule::linear, 2.0, 35, 10, 110) == doctest::Approx(1.5));
    CHECK(learning_rate(Schedule::constant, 2.0, 100, 10, 110) == doctest::Approx(2.0));
    CHECK(parse_schedule("linear") == Schedule::linear);
    CHECK_THROWS_WITH_AS(parse_schedule("step"), "unknown schedule 'step' (expected constant, linear or cosine)",
                         std::invalid_argument);
}

TEST_CASE("clipping scales all gradients together") {
    Tensor a = f64({1}, {1}).requires_grad_(true), b = f64({1}, {1}).requires_grad_(true);
    sum(add(mul(a, 3.0), mul(b, 4.0))).backward();  // gradients 3 and 4: norm 5
    CHECK(clip_grad_norm({a, b}, 10.0) == doctest::Approx(5.0));
    check_values(a.grad(), {3});
    CHECK(clip_grad_norm({a, b}, 1.0) == doctest::Approx(5.0));
    check_values(a.grad(), {0.6}, 1e-15);
    check_values(b.grad(), {0.8}, 1e-15);
}

TEST_CASE("parameter groups: each its own learning rate scale and weight decay") {
    // Two parameters with the same value and gradient, in groups of their own: the first step's
    // update is g/|g| = 1 for both, so each ends where its group's lr and decay put it.
    Tensor a = f64({1.0}, {1}).requires_grad_(true);
    Tensor b = f64({1.0}, {1}).requires_grad_(true);
    AdamW adam(std::vector<ParameterGroup>{{{a}, 1.0, 0.1}, {{b}, 10.0, 0.0}}, AdamWOptions{});
    sum(add(a, b)).backward();  // g = 1 for both
    adam.step(0.01);
    check_values(a, {1.0 * (1 - 0.01 * 0.1) - 0.01 * (1 / (1 + 1e-8))}, 1e-15);
    check_values(b, {1.0 - 0.1 * (1 / (1 + 1e-8))}, 1e-15);
    CHECK_THROWS_AS(AdamW(std::vector<ParameterGroup>{{{a}, 0.0, 0.0}}, AdamWOptions{}), std::invalid_argument);
    CHECK_THROWS_AS(AdamW(std::vector<ParameterGroup>{{{a}, 1.0, -1.0}}, AdamWOptions{}), std::invalid_argument);
    // a parameter in two groups would take two updates a step
    CHECK_THROWS_WITH_AS(AdamW(std::vector<ParameterGroup>{{{a}, 1.0, 0.0}, {{b, a}, 1.0, 0.0}}, AdamWOptions{}),
                         doctest::Contains("a parameter is in groups 0 and 1"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(AdamW(std::vector<Tensor>{a, b, a}, AdamWOptions{}),
                         doctest::Contains("a parameter is listed twice in group 0"), std::invalid_argument);
}

TEST_CASE("a saved optimizer restores its groups; groups that do not fit are refused") {
    const auto dir = (std::filesystem::temp_directory_path() / "relgrad_test_adamw_groups").string();
    Tensor a = f64({1.0}, {1}).requires_grad_(true);
    Tensor b = f64({2.0, 3.0}, {2}).requires_grad_(true);
    AdamW saved(std::vector<ParameterGroup>{{{a}, 0.1 + 0.2, 0.5}, {{b}, 3.0, 0.0}}, AdamWOptions{});
    saved.save(dir);
    AdamW loaded(std::vector<ParameterGroup>{{{a}, 1.0, 0.0}, {{b}, 1.0, 0.01}}, AdamWOptions{});
    loaded.load(dir);
    CHECK(loaded.groups()[0].lr_scale == 0.1 + 0.2);  // exactly: written with 17 digits
    CHECK(loaded.groups()[0].weight_decay == 0.5);
    CHECK(loaded.groups()[1].lr_scale == 3.0);
    CHECK(loaded.groups()[1].weight_decay == 0.0);

    // the same parameters grouped otherwise: an error that names the group, nothing restored
    Tensor c = f64({2.0}, {1}).requires_grad_(true);
    Tensor d = f64({3.0}, {1}).requires_grad_(true);
    AdamW regrouped(std::vector<ParameterGroup>{{{a, c}, 1.0, 0.0}}, AdamWOptions{});
    CHECK_THROWS_WITH_AS(regrouped.load(dir), doctest::Contains("2 parameter groups, the optimizer has 1"),
                         std::runtime_error);
    AdamW resized(std::vector<ParameterGroup>{{{a}, 1.0, 0.0}, {{c, d}, 1.0, 0.0}}, AdamWOptions{});
    CHECK_THROWS_WITH_AS(resized.load(dir), doctest::Contains("group 1 of the checkpoint has 1 parameters"),
                         std::runtime_error);
    CHECK(resized.groups()[0].lr_scale == 1.0);
    // a corrupt groups.txt
    std::ofstream(dir + "/groups.txt") << "0.3 0.5 1\nthree 0 1\n";
    CHECK_THROWS_WITH_AS(loaded.load(dir), doctest::Contains("groups.txt:line 2"), std::runtime_error);
    std::ofstream(dir + "/groups.txt") << "0.3 -1 1\n3 0 1\n";
    CHECK_THROWS_WITH_AS(loaded.load(dir), doctest::Contains("groups.txt:line 1"), std::runtime_error);
    std::filesystem::remove_all(dir);
}

TEST_CASE("the loss scaler skips a step whose gradients overflowed, halves, and doubles after clean steps") {
    LossScalerOptions options;
    options.initial_scale = 1024;
    options.growth_interval = 3;
    LossScaler scaler(options);
    Tensor p = f64({1.0, 2.0}, {2}).requires_grad_(true);
    auto backward_with = [&](double a, double b) {
        p.zero_grad();
        sum(p * f64({a, b}, {2})).backward();  // grad = (a, b)
    };
    backward_with(2048, std::numeric_limits<double>::infinity());  // an overflow: skipped, untouched
    CHECK_FALSE(scaler.unscale({p}));
    CHECK(p.grad().to_vector() == std::vector<double>{2048, std::numeric_limits<double>::infinity()});
    CHECK(scaler.scale() == 512);
    CHECK(scaler.skipped_steps() == 1);
    backward_with(std::nan(""), 1);
    CHECK_FALSE(scaler.unscale({p}));
    CHECK(scaler.scale() == 256);
    for (int clean = 1; clean <= 3; ++clean) {
        backward_with(512, -256);
        CHECK(scaler.unscale({p}));
        CHECK(p.grad().to_vector() == std::vector<double>{2, -1});  // divided by 256
        CHECK(scaler.clean_steps() == clean % 3);
    }
    CHECK(scaler.scale() == 512);  // doubled after the third clean step in a row
    CHECK(scaler.skipped_steps() == 2);
    scaler.restore(8, 2, 5);
    CHECK(scaler.scale() == 8);
    CHECK_THROWS_AS(scaler.restore(0, 0, 0), std::invalid_argument);
    CHECK_THROWS_AS(scaler.restore(8, 3, 0), std::invalid_argument);  // never as many as growth_interval
    // scales halving and doubling never reach: not a power of two, or below the normal doubles
    for (double unreachable : {12.0, 1e300, 5e-324, std::ldexp(1.0, -1030)}) {
        CAPTURE(unreachable);
        CHECK_THROWS_WITH_AS(scaler.restore(unreachable, 0, 0),
                             doctest::Contains("is no scale a run reaches: halving and doubling"),
                             std::invalid_argument);
    }
    scaler.restore(std::ldexp(1.0, -1000), 0, 0);  // tiny, but a power of two and normal
    CHECK(scaler.scale() == std::ldexp(1.0, -1000));
    CHECK_THROWS_AS(LossScaler(LossScalerOptions{1024, 1.0, 0.5, 10}), std::invalid_argument);
}
