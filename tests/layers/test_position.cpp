// Absolute encodings and the relative index r(i, j) of Shaw et al.
#include <limits>

#include "layer_check.hpp"
#include "layers/position.hpp"

using namespace relgrad;
using namespace relgrad::testing;

TEST_CASE("sinusoidal encoding: the formula, odd widths, any length") {
    SinusoidalPositionalEncoding pe(5);
    const std::vector<double> table = pe.encoding(7, DType::float64).to_vector();
    for (int64_t p = 0; p < 7; ++p) {
        for (int64_t i = 0; 2 * i < 5; ++i) {
            const double angle = p / std::pow(10000.0, 2.0 * i / 5);
            CHECK(table[p * 5 + 2 * i] == doctest::Approx(std::sin(angle)).epsilon(1e-15));
            if (2 * i + 1 < 5) CHECK(table[p * 5 + 2 * i + 1] == doctest::Approx(std::cos(angle)).epsilon(1e-15));
        }
    }
    const Tensor x = random_input({2, 7, 5}, 1);
    check_values(pe.forward(x).narrow(0, 1, 1), add(x.narrow(0, 1, 1), pe.encoding(7, DType::float64)).to_vector());
    CHECK(pe.encoding(3000, DType::float32).shape() == Shape{3000, 5});
    CHECK(pe.encoding(0, DType::float32).shape() == Shape{0, 5});
    CHECK_THROWS_WITH_AS(pe.encoding(-1, DType::float32), "SinusoidalPositionalEncoding: length must be >= 0, got -1",
                         std::invalid_argument);
    CHECK_THROWS_AS(pe.forward(random_input({2, 7, 4}, 1)), std::invalid_argument);
    gradcheck_layer(pe, {random_input({2, 3, 5}, 2)}, [&](const auto& in) { return pe.forward(in[0]); });
}

TEST_CASE("learned positions: a table up to max_positions") {
    Generator gen(1);
    LearnedPositionalEmbedding learned(6, 3, Init{gen, DType::float64});
    const Tensor x = random_input({1, 4, 3}, 3);
    check_values(learned.forward(x), add(x, learned.weight.narrow(0, 0, 4)).to_vector());
    CHECK_THROWS_WITH_AS(
        learned.forward(random_input({1, 7, 3}, 3)),
        "LearnedPositionalEmbedding: length 7 exceeds max_positions 6 (it has no vector for later positions)",
        std::invalid_argument);
    gradcheck_layer(learned, {random_input({2, 5, 3}, 4)}, [&](const auto& in) { return learned.forward(in[0]); });
}

namespace {
std::vector<double> expected_index(int64_t lq, int64_t lk, int64_t kl, int64_t kr, int64_t offset = 0) {
    std::vector<double> r;
    for (int64_t i = 0; i < lq; ++i)
        for (int64_t j = 0; j < lk; ++j) r.push_back(double(std::clamp(j - i - offset, -kl, kr) + kl));
    return r;
}
}  // namespace

TEST_CASE("relative index r(i, j) = clip(j - i, -k, k) + k for any length") {
    Generator gen(2);
    RelativeOptions o;
    o.k_left = o.k_right = 2;
    RelativePositionEmbedding rel(4, 1, o, Init{gen});
    CHECK(rel.buckets() == 5);
    // worked example (docs/layers/relative_position.md): L = 4, k = 2
    check_values(rel.index(4, 4), {2, 3, 4, 4, 1, 2, 3, 4, 0, 1, 2, 3, 0, 0, 1, 2});
    check_values(rel.index(1, 1), {2});                               // L = 1
    check_values(rel.index(9, 9), expected_index(9, 9, 2, 2));        // beyond the precomputed length
    check_values(rel.index(3, 5, 4), expected_index(3, 5, 2, 2, 4));  // queries at positions 4, 5, 6
    o.k_left = 1;
    o.k_right = 3;
    RelativePositionEmbedding asymmetric(4, 1, o, Init{gen});
    check_values(asymmetric.index(5, 5), expected_index(5, 5, 1, 3));
    o.k_left = o.k_right = 10;  // k >= L: no distance is clipped
    RelativePositionEmbedding wide(4, 1, o, Init{gen});
    check_values(wide.index(3, 3), {10, 11, 12, 9, 10, 11, 8, 9, 10});
    o.k_left = -1;
    CHECK_THROWS_AS(RelativePositionEmbedding(4, 1, o, Init{gen}), std::invalid_argument);
    o.k_left = o.k_right = std::numeric_limits<int64_t>::max() / 2;  // K = k_left + k_right + 1 would overflow
    CHECK_THROWS_WITH_AS(RelativePositionEmbedding(4, 1, o, Init{gen}),
                         "RelativePositionEmbedding: clipping distances must be in [0, 2^40], got k_left "
                         "4611686018427387903 and k_right 4611686018427387903",
                         std::invalid_argument);
}

TEST_CASE("relative tables: shared or per head, and their lookup") {
    Generator gen(3);
    RelativeOptions o;
    o.k_left = o.k_right = 1;
    RelativePositionEmbedding shared(2, 3, o, Init{gen, DType::float64});
    CHECK(shared.weight.shape() == Shape{3, 2});
    CHECK(shared.table().shape() == Shape{1, 3, 2});
    CHECK(shared.lookup(4, 4).shape() == Shape{1, 4, 4, 2});
    o.share_across_heads = false;
    RelativePositionEmbedding per_head(2, 3, o, Init{gen, DType::float64});
    CHECK(per_head.weight.shape() == Shape{3, 6});
    const Tensor table = per_head.table();  // [H, K, Dh]: head h, bucket r = weight[r, h*Dh : (h+1)*Dh]
    CHECK(table.shape() == Shape{3, 3, 2});
    check_values(table.narrow(0, 2, 1).narrow(1, 1, 1), per_head.weight.narrow(0, 1, 1).narrow(1, 4, 2).to_vector());
    const Tensor lookup = per_head.lookup(3, 3);  // [H, Lq, Lk, Dh]
    check_values(lookup.narrow(0, 1, 1).narrow(1, 2, 1).narrow(2, 0, 1),
                 table.narrow(0, 1, 1).narrow(1, 0, 1).to_vector());
    gradcheck_layer(per_head, {}, [&](const auto&) { return per_head.lookup(3, 4, 1); });
    gradcheck_layer(shared, {}, [&](const auto&) { return shared.table(); });
}

TEST_CASE("relative tables start with the spread init_std asks for, full and low rank") {
    Generator gen(31);
    RelativeOptions o;
    o.k_left = o.k_right = 200;
    for (const double std : {0.02, 0.5}) {
        for (const int64_t rank : {0, 4}) {
            CAPTURE(std);
            CAPTURE(rank);
            o.init_std = std;
            o.rank = rank;
            const RelativePositionEmbedding table(64, 1, o, Init{gen, DType::float64});
            const std::vector<double> entries = table.full_weight().to_vector();
            double square_sum = 0;
            for (double e : entries) square_sum += e * e;
            // the cut at 2 std leaves a little less spread than asked for
            CHECK(std::sqrt(square_sum / static_cast<double>(entries.size())) == doctest::Approx(std).epsilon(0.15));
        }
    }
    o.init_std = 0;
    CHECK_THROWS_WITH_AS(RelativePositionEmbedding(4, 1, o, Init{gen}),
                         "RelativePositionEmbedding: init_std must be finite and > 0", std::invalid_argument);
}
