// Reductions: values over dims, keepdim, ties in max, errors, gradients.
#include "test_helpers.hpp"

using namespace relgrad;
using namespace relgrad::testing;

TEST_CASE("sum, mean and max over dims") {
    const Tensor x = f64({1, 2, 3, 4, 5, 6}, {2, 3});
    check_values(sum(x), {21});
    CHECK(sum(x).shape() == Shape{});
    check_values(sum(x, {0}), {5, 7, 9});
    check_values(sum(x, {-1}, true), {6, 15});
    CHECK(sum(x, {-1}, true).shape() == Shape{2, 1});
    check_values(mean(x, {1}), {2, 5});
    check_values(max(x, {0}), {4, 5, 6});
    check_values(max(x.transpose(0, 1), {1}), {4, 5, 6});
    check_values(max(x), {6});
    check_values(sum(x.narrow(1, 1, 1).expand({2, 5}), {1}), {10, 25});  // a stride-0 input
    check_values(sum(zeros({0, 3}, DType::float64), {0}), {0, 0, 0});
}

TEST_CASE("reduction errors") {
    const Tensor x = zeros({2, 3}, DType::float64);
    CHECK_THROWS_WITH_AS(sum(x, {2}), "sum: dim 2 is out of range for a tensor of rank 2", std::invalid_argument);
    CHECK_THROWS_WITH_AS(sum(x, {1, -1}), "sum: a dim is repeated", std::invalid_argument);
    CHECK_THROWS_WITH_AS(max(zeros({0, 3}, DType::float64), {0}),
                         "max: cannot reduce over the empty dim 0 of shape [0, 3]", std::invalid_argument);
}

TEST_CASE("tied maxima share the gradient equally") {
    Tensor x = f64({3, 1, 3, 2}, {4}).requires_grad_(true);
    max(x).backward();
    check_values(x.grad(), {0.5, 0, 0.5, 0});
}

TEST_CASE("reduction gradients") {
    for (const char* op : {"sum", "mean", "max"}) gradcheck_op(op);
}

TEST_CASE("float32 sums accumulate in float64; max propagates NaN") {
    CHECK(sum(ones({int64_t{1} << 25})).item() == double(int64_t{1} << 25));  // float32 alone stops at 2^24
    CHECK(mean(ones({int64_t{1} << 25})).item() == 1.0);
    CHECK(std::isnan(max(f64({1, NAN, 3}, {3})).item()));
    const std::vector<double> rows = max(f64({1, 5, NAN, 3}, {2, 2}), {1}).to_vector();
    CHECK(rows[0] == 5);  // NaN only in its own row
    CHECK(std::isnan(rows[1]));
}
