// matmul: values against a plain triple loop, layouts BLAS reads in place, batches, gradients.
#include "test_helpers.hpp"

using namespace relgrad;
using namespace relgrad::testing;

namespace {

// C = A B by the definition, for [M, K] and [K, N] contiguous inputs.
std::vector<double> naive_matmul(const Tensor& a, const Tensor& b) {
    const std::vector<double> av = a.to_vector(), bv = b.to_vector();
    const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
    std::vector<double> c(M * N, 0.0);
    for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j)
            for (int64_t k = 0; k < K; ++k) c[i * N + j] += av[i * K + k] * bv[k * N + j];
    return c;
}

}  // namespace

TEST_CASE("matmul matches the definition, float64 and float32") {
    Generator gen(5);
    const Tensor a = randn({7, 5}, gen, DType::float64), b = randn({5, 3}, gen, DType::float64);
    check_values(matmul(a, b), naive_matmul(a, b), 1e-12);
    check_values(matmul(a.to(DType::float32), b.to(DType::float32)), naive_matmul(a, b), 1e-5);
    CHECK(matmul(a.to(DType::float32), b.to(DType::float32)).dtype() == DType::float32);
}

TEST_CASE("transposed, sliced and expanded operands") {
    Generator gen(6);
    const Tensor a = randn({5, 7}, gen, DType::float64), b = randn({3, 5}, gen, DType::float64);
    const Tensor at = a.transpose(0, 1).contiguous(), bt = b.transpose(0, 1).contiguous();
    check_values(matmul(a.transpose(0, 1), b.transpose(0, 1)), naive_matmul(at, bt));
    const Tensor wide = randn({5, 9}, gen, DType::float64);
    const Tensor cols = wide.narrow(1, 2, 4);  // row stride 9, BLAS's leading dimension
    check_values(matmul(at, cols), naive_matmul(at, cols.contiguous()));
    const Tensor row = randn({1, 5}, gen, DType::float64);
    check_values(matmul(row.expand({4, 5}), bt), naive_matmul(row.expand({4, 5}).contiguous(), bt));
}

TEST_CASE("big products cut into blocks of rows or of columns give the whole product") {
    // the CPU backend cuts products into pieces for its threads: by rows when they are tall, by
    // columns when they are short and wide (here 3 row blocks, and 4 column blocks); B read as is
    // and transposed, and a batch of two
    Generator gen(8);
    const Tensor tall = randn({300, 6}, gen, DType::float64), short_wide = randn({5, 6}, gen, DType::float64);
    const Tensor b = randn({6, 700}, gen, DType::float64), bt = randn({700, 6}, gen, DType::float64);
    check_values(matmul(tall, b), naive_matmul(tall, b));
    check_values(matmul(short_wide, b), naive_matmul(short_wide, b));
    check_values(matmul(short_wide, bt.transpose(0, 1)), naive_matmul(short_wide, bt.transpose(0, 1).contiguous()));
    const Tensor pair = randn({2, 5, 6}, gen, DType::float64);
    const Tensor batched = matmul(pair, b);
    for (int64_t n = 0; n < 2; ++n)
        check_values(batched.narrow(0, n, 1).squeeze(0), naive_matmul(pair.narrow(0, n, 1).squeeze(0).contiguous(), b));
}

TEST_CASE("batched matmul broadcasts batch dims; vectors drop their dim") {
    Generator gen(7);
    const Tensor a = randn({2, 1, 3, 4}, gen, DType::float64), b = randn({5, 4, 2}, gen, DType::float64);
    const Tensor c = matmul(a, b);
    CHECK(c.shape() == Shape{2, 5, 3, 2});
    for (int64_t i = 0; i < 2; ++i) {
        for (int64_t j = 0; j < 5; ++j) {
            const Tensor ai = a.narrow(0, i, 1).reshape({3, 4}), bj = b.narrow(0, j, 1).reshape({4, 2});
            check_values(c.narrow(0, i, 1).narrow(1, j, 1), naive_matmul(ai, bj));
        }
    }
    const Tensor v = randn({4}, gen, DType::float64), m = randn({4, 2}, gen, DType::float64);
    CHECK(matmul(v, m).shape() == Shape{2});
    CHECK(matmul(m.transpose(0, 1), v).shape() == Shape{2});
    check_values(matmul(v, m), naive_matmul(v.reshape({1, 4}), m));
    CHECK(matmul(zeros({2, 0}, DType::float64), zeros({0, 3}, DType::float64)).to_vector() ==
          std::vector<double>(6, 0.0));
}

TEST_CASE("matmul errors name both shapes") {
    CHECK_THROWS_WITH_AS(matmul(zeros({2, 3}), zeros({4, 5})),
                         "matmul: shapes [2, 3] and [4, 5] do not align (inner dims 3 and 4)", std::invalid_argument);
    CHECK_THROWS_WITH_AS(matmul(zeros({2, 2, 3}), zeros({3, 3, 5})),
                         "matmul: shapes [2] and [3] cannot be broadcast together", std::invalid_argument);
    CHECK_THROWS_AS(matmul(zeros({2, 3}), zeros({3, 2}, DType::float64)), std::invalid_argument);
    CHECK_THROWS_AS(matmul(scalar(1), zeros({1})), std::invalid_argument);
}

TEST_CASE("matmul gradients") { gradcheck_op("matmul"); }
