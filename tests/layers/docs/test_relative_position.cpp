// docs/layers/relative_position.md's worked examples, number for number: the relative index, the
// tables and their gradient (doc_examples.hpp says how these tests are written).
#include "doc_examples.hpp"

using namespace relgrad;
using namespace relgrad::testing;

TEST_CASE("docs/layers/relative_position.md: the index, the tables and their gradient") {
    Generator gen(8);
    const Init init{gen, DType::float64};
    RelativeOptions o;
    o.k_left = o.k_right = 2;
    RelativePositionEmbedding shared(1, 1, o, init);
    CHECK(shared.buckets() == 5);
    check_values(shared.index(4, 4), {2, 3, 4, 4, 1, 2, 3, 4, 0, 1, 2, 3, 0, 0, 1, 2});
    check_values(shared.index(1, 1), {2});              // L = 1: only the middle row
    check_values(shared.index(1, 4, 3), {0, 0, 1, 2});  // one query at position 3: the last row above
    check_values(shared.index(2, 4, 2), {0, 1, 2, 3, 0, 0, 1, 2});
    check_values(shared.index(10, 10).narrow(0, 9, 1), {0, 0, 0, 0, 0, 0, 0, 0, 1, 2});

    // the gradient of a table row counts the (i, j) pairs of its bucket (dy = 1, Dh = 1)
    shared.assign_parameters({param({10, 20, 30, 40, 50}, {5, 1})});
    const Tensor looked_up = shared.lookup(4, 4);
    CHECK(looked_up.shape() == Shape{1, 4, 4, 1});
    check_values(looked_up.narrow(1, 0, 1), {30, 40, 50, 50});
    looked_up.backward(ones_like(looked_up));
    check_values(shared.weight.grad(), {3, 3, 4, 3, 3});

    // asymmetric clipping, and k >= L
    RelativeOptions asym;
    asym.k_left = 1;
    asym.k_right = 3;
    RelativePositionEmbedding asymmetric(1, 1, asym, init);
    CHECK(asymmetric.buckets() == 5);
    check_values(asymmetric.index(4, 4), {1, 2, 3, 4, 0, 1, 2, 3, 0, 0, 1, 2, 0, 0, 0, 1});
    RelativeOptions wide;
    wide.k_left = wide.k_right = 10;
    RelativePositionEmbedding unclipped(1, 1, wide, init);
    check_values(unclipped.index(3, 3), {10, 11, 12, 9, 10, 11, 8, 9, 10});
    const Tensor wide_lookup = unclipped.lookup(3, 3);
    wide_lookup.backward(ones_like(wide_lookup));
    std::vector<double> used(21, 0.0);
    used[8] = used[12] = 1;
    used[9] = used[11] = 2;
    used[10] = 3;
    check_values(unclipped.weight.grad(), used);  // buckets 0..7 and 13..20 get nothing

    // per-head tables: weight [K, H * Dh], row r = (head 0's vector, head 1's vector)
    RelativeOptions per_head_options;
    per_head_options.k_left = per_head_options.k_right = 1;
    per_head_options.share_across_heads = false;
    RelativePositionEmbedding per_head(1, 2, per_head_options, init);
    CHECK(per_head.weight.shape() == Shape{3, 2});
    per_head.assign_parameters({param({1, 10, 2, 20, 3, 30}, {3, 2})});
    check_values(per_head.table(), {1, 2, 3, 10, 20, 30});              // [H, K, Dh]
    check_values(per_head.lookup(2, 2), {2, 3, 1, 2, 20, 30, 10, 20});  // [H, Lq, Lk, Dh]
    gradcheck_layer(per_head, {}, [&](const auto&) { return per_head.lookup(3, 4, 1); });
    gradcheck_layer(shared, {}, [&](const auto&) { return shared.lookup(4, 4); });
}
