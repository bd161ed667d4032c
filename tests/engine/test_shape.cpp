// concat and stack; the view ops' gradients are checked in test_tensor.
#include "test_helpers.hpp"

using namespace relgrad;
using namespace relgrad::testing;

TEST_CASE("concat joins along a dim, stack adds one") {
    const Tensor a = f64({1, 2, 3, 4}, {2, 2}), b = f64({5, 6}, {2, 1});
    check_values(concat({a, b}, 1), {1, 2, 5, 3, 4, 6});
    check_values(concat({a, a.transpose(0, 1)}, 0), {1, 2, 3, 4, 1, 3, 2, 4});
    const Tensor s = stack({a, a * 10.0}, 0);
    CHECK(s.shape() == Shape{2, 2, 2});
    check_values(s, {1, 2, 3, 4, 10, 20, 30, 40});
    CHECK(stack({a, a}, -1).shape() == Shape{2, 2, 2});
    check_values(stack({a, a * 10.0}, -1), {1, 10, 2, 20, 3, 30, 4, 40});
}

TEST_CASE("concat and stack errors") {
    CHECK_THROWS_WITH_AS(concat({}, 0), "concat: no tensors given", std::invalid_argument);
    CHECK_THROWS_WITH_AS(concat({zeros({2, 2}), zeros({3, 1})}, 1),
                         "concat: tensor [3, 1] (float32) does not match [2, 2] (float32) outside dim 1",
                         std::invalid_argument);
    CHECK_THROWS_AS(concat({zeros({2, 2}), zeros({2, 2}, DType::float64)}, 0), std::invalid_argument);
    CHECK_THROWS_WITH_AS(stack({zeros({2}), zeros({3})}, 0), "stack: shapes [2] and [3] differ", std::invalid_argument);
}

TEST_CASE("concat and stack gradients") {
    gradcheck_op("concat");
    gradcheck_op("stack");
}
