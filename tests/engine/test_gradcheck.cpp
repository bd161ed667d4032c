// gradcheck itself: it must catch wrong, non-deterministic and biased backward functions.
#include "test_helpers.hpp"

#include "engine/autograd.hpp"

using namespace relgrad;
using namespace relgrad::testing;

namespace {

// y = x^2 with a backward function chosen by the test.
Tensor square_with(const Tensor& x, BackwardFn backward) {
    return record(mul(x.detach(), x.detach()), "square", {x}, backward);
}

std::vector<Tensor> one_input() {
    Generator gen(4);
    return {randn({2, 3}, gen, DType::float64).requires_grad_(true)};
}

}  // namespace

TEST_CASE("a correct backward passes") {
    const auto f = [](const std::vector<Tensor>& x) {
        return square_with(x[0], [x = x[0].detach()](const Tensor& g) { return std::vector<Tensor>{g * x * 2.0}; });
    };
    const GradcheckResult result = gradcheck(f, one_input());
    CHECK_MESSAGE(result.passed, result.report);
    CHECK(result.max_abs_error < 1e-8);
    GradcheckOptions fast;
    fast.fast = true;
    CHECK(gradcheck(f, one_input(), fast).passed);
}

TEST_CASE("a wrong derivative fails and is reported element by element") {
    const auto f = [](const std::vector<Tensor>& x) {
        return square_with(x[0], [x = x[0].detach()](const Tensor& g) { return std::vector<Tensor>{g * x * 2.1}; });
    };
    const GradcheckResult result = gradcheck(f, one_input());
    CHECK_FALSE(result.passed);
    CHECK(result.report.find("input 0 element [0, 0]: analytic") != std::string::npos);
    CHECK(result.report.find("numeric") != std::string::npos);
    CHECK(result.max_abs_error > 1e-3);
    GradcheckOptions fast;
    fast.fast = true;
    CHECK_FALSE(gradcheck(f, one_input(), fast).passed);
}

TEST_CASE("the errors are also reported per input, and only the wrong input's are large") {
    // f(x, y, index) = x^2 (wrong: 2.1 x) + y^2 (right); index is passed through unchecked
    const auto f = [](const std::vector<Tensor>& in) {
        const Tensor wrong =
            square_with(in[0], [x = in[0].detach()](const Tensor& g) { return std::vector<Tensor>{g * x * 2.1}; });
        const Tensor right =
            square_with(in[1], [y = in[1].detach()](const Tensor& g) { return std::vector<Tensor>{g * y * 2.0}; });
        return wrong + right;
    };
    Generator gen(5);
    std::vector<Tensor> inputs = one_input();
    inputs.push_back(randn({2, 3}, gen, DType::float64).requires_grad_(true));
    inputs.push_back(zeros({1}, DType::int64));
    const GradcheckResult result = gradcheck(f, inputs);
    CHECK_FALSE(result.passed);
    REQUIRE(result.per_input.size() == 3);
    CHECK(result.per_input[0].max_abs_error == result.max_abs_error);
    CHECK(result.per_input[0].max_abs_error > 1e-3);
    CHECK(result.per_input[1].max_abs_error > 0);
    CHECK(result.per_input[1].max_abs_error < 1e-8);
    CHECK(result.per_input[2].max_abs_error == 0);
    GradcheckOptions fast;
    fast.fast = true;
    CHECK(gradcheck(f, inputs, fast).per_input.empty());
}

TEST_CASE("a backward that changes between runs fails") {
    auto calls = std::make_shared<int>(0);
    const auto f = [calls](const std::vector<Tensor>& x) {
        return square_with(x[0], [x = x[0].detach(), calls](const Tensor& g) {
            return std::vector<Tensor>{g * x * (2.0 + 1e-9 * ++*calls)};
        });
    };
    const GradcheckResult result = gradcheck(f, one_input());
    CHECK_FALSE(result.passed);
    CHECK(result.report.find("two backward passes gave different gradients") != std::string::npos);
}

TEST_CASE("a backward that ignores the incoming gradient fails the zero-cotangent check") {
    const auto f = [](const std::vector<Tensor>& x) {
        return square_with(x[0],
                           [x = x[0].detach()](const Tensor& g) { return std::vector<Tensor>{g * x * 2.0 + 1e-12}; });
    };
    const GradcheckResult result = gradcheck(f, one_input());
    CHECK_FALSE(result.passed);
    CHECK(result.report.find("a zero cotangent gave a non-zero gradient") != std::string::npos);
}

TEST_CASE("gradcheck needs float64 and an output that depends on the inputs") {
    const auto identity = [](const std::vector<Tensor>& x) { return x[0] * 1.0; };
    CHECK_THROWS_WITH_AS(gradcheck(identity, {zeros({2}).requires_grad_(true)}),
                         "gradcheck: input 0 is float32; gradient checks need float64", std::invalid_argument);
    CHECK_THROWS_AS(gradcheck([](const std::vector<Tensor>&) { return zeros({2}, DType::float64); },
                              {zeros({2}, DType::float64).requires_grad_(true)}),
                    std::invalid_argument);
    GradcheckOptions no_step;
    no_step.eps = 0;  // (f(x) - f(x)) / 0 would be NaN numerics
    CHECK_THROWS_WITH_AS(gradcheck(identity, {f64({1, 2}, {2}).requires_grad_(true)}, no_step),
                         "gradcheck: eps 0, expected a finite step > 0", std::invalid_argument);
    // inputs without requires_grad are passed through and not checked
    const Tensor fixed = f64({1, 2}, {2});
    const GradcheckResult result =
        gradcheck([](const std::vector<Tensor>& x) { return x[0] * x[1]; }, {one_input()[0].narrow(1, 0, 2), fixed});
    CHECK(result.passed);
}
