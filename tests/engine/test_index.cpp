// Indexing: gather, scatter_add, index_select, embedding.
#include "check.hpp"

using namespace relgrad;
using namespace relgrad::testing;

namespace {
Tensor ids(const std::vector<double>& values, const Shape& shape) { return from_vector(values, shape, DType::int64); }
}  // namespace

TEST_CASE("gather reads and scatter_add accumulates at the indexed places") {
    const Tensor x = f64({10, 11, 12, 20, 21, 22}, {2, 3});
    check_values(gather(x, 1, ids({2, 0, 1, 1}, {2, 2})), {12, 10, 21, 21});
    check_values(gather(x, 0, ids({1, 0, 1}, {1, 3})), {20, 11, 22});
    const Tensor added =
        scatter_add(zeros({2, 3}, DType::float64), 1, ids({2, 2, 0, 1}, {2, 2}), f64({1, 2, 3, 4}, {2, 2}));
    check_values(added, {0, 0, 3, 3, 4, 0});  // a repeated index adds both values
}

TEST_CASE("index_select and embedding pick rows") {
    const Tensor table = f64({0, 1, 10, 11, 20, 21}, {3, 2});
    check_values(index_select(table, 0, ids({2, 0, 2}, {3})), {20, 21, 0, 1, 20, 21});
    check_values(index_select(table, 1, ids({1}, {1})), {1, 11, 21});
    const Tensor looked_up = embedding(table, ids({1, 2, 0, 1}, {2, 2}));
    CHECK(looked_up.shape() == Shape{2, 2, 2});
    check_values(looked_up, {10, 11, 20, 21, 0, 1, 10, 11});
}

TEST_CASE("bad indices are reported, not read") {
    const Tensor table = zeros({3, 2}, DType::float64);
    CHECK_THROWS_WITH_AS(embedding(table, ids({3}, {1})), "index_select: index 3 is out of range for dim 0 of size 3",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(gather(table, 1, ids({-1}, {1, 1})), "gather: index -1 is out of range for dim 1 of size 2",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(gather(table, 1, zeros({1, 1})), "gather: the index must be int64, got float32",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(gather(table, 1, ids({0, 0, 0, 0}, {4, 1})),
                         "gather: index of shape [4, 1] does not fit the input of shape [3, 2] outside dim 1",
                         std::invalid_argument);
    CHECK_THROWS_AS(scatter_add(table, 0, ids({0}, {1, 1}), zeros({1, 2}, DType::float64)), std::invalid_argument);
    CHECK_THROWS_WITH_AS(embedding(zeros({3}), ids({0}, {1})), "embedding: the weight must be [V, D], got shape [3]",
                         std::invalid_argument);
}

TEST_CASE("indexing gradients") {
    for (const char* op : {"gather", "scatter_add", "index_select", "embedding"}) gradcheck_op(op);
}
