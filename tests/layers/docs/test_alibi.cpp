// docs/layers/alibi.md's worked examples, number for number: the slopes, a bias by distance alone
// and the three forms (doc_examples.hpp says how these tests are written).
#include "doc_examples.hpp"

using namespace relgrad;
using namespace relgrad::testing;

TEST_CASE("docs/layers/alibi.md: the slopes, a bias by distance alone, and the three forms") {
    const auto slopes = [](int64_t heads) { return from_vector(alibi_slopes(heads), {heads}, DType::float64); };
    check_values(slopes(8), {1.0 / 2, 1.0 / 4, 1.0 / 8, 1.0 / 16, 1.0 / 32, 1.0 / 64, 1.0 / 128, 1.0 / 256}, 0);
    check_values(slopes(6), {1.0 / 4, 1.0 / 16, 1.0 / 64, 1.0 / 256, 1.0 / 2, 1.0 / 8}, 0);
    check_values(slopes(3), {1.0 / 16, 1.0 / 256, 1.0 / 4}, 0);
    check_values(slopes(2), {1.0 / 16, 1.0 / 256}, 0);
    check_values(slopes(1), {1.0 / 256}, 0);
    CHECK(std::fabs(std::exp(-1.0 / 16) - 0.939413062813) <= 1e-12);
    CHECK(std::fabs(std::exp(-1.0 / 8) - 0.882496902585) <= 1e-12);
    // exp(-m n) = 1/2 at n = ln 2 / m: every 1.4 positions for m = 1/2, every 177 for m = 1/256
    CHECK(std::log(2.0) * 2 == doctest::Approx(1.4).epsilon(0.01));
    CHECK(std::log(2.0) * 256 == doctest::Approx(177).epsilon(0.003));

    // D = 2, H = 2 (Dh = 1, c = 1), W_q = 0 so that the scores are the bias alone; x_i = (i + 1, i + 1)
    const double e1 = std::exp(-1.0 / 16), e2 = std::exp(-1.0 / 8);
    const double a0[3] = {1 / (1 + e1 + e2), e1 / (1 + e1 + e2), e2 / (1 + e1 + e2)};  // head 0, row 0
    CHECK(std::fabs(a0[0] - 0.354369916922) <= 1e-12);
    CHECK(std::fabs(a0[1] - 0.332899729025) <= 1e-12);
    CHECK(std::fabs(a0[2] - 0.312730354053) <= 1e-12);
    CHECK(std::fabs(a0[0] + 2 * a0[1] + 3 * a0[2] - 1.958360437131) <= 1e-11);
    const std::vector<double> weights{
        0.354369916922, 0.332899729025, 0.312730354053, 0.326318096967, 0.347363806066, 0.326318096967,  // head 0
        0.312730354053, 0.332899729025, 0.354369916922,                                                  //
        0.334636261063, 0.333331637919, 0.332032101019, 0.332899023354, 0.334201953292, 0.332899023354,  // head 1
        0.332032101019, 0.333331637919, 0.334636261063};
    const std::vector<double> y_printed{1.958360437131, 1.997395839956, 2, 2, 2.041639562869, 2.002604160044};
    for (AttentionImpl impl : all_forms) {
        CAPTURE(attention_impl_name(impl));
        Generator gen(23);
        AlibiAttention attention(2, 2, impl, Init{gen, DType::float64});
        std::vector<std::string> names;
        for (const auto& [name, p] : attention.named_parameters()) names.push_back(name);
        CHECK(names == std::vector<std::string>{"w_q.weight", "w_q.bias", "w_k.weight", "w_k.bias", "w_v.weight",
                                                "w_v.bias", "w_o.weight", "w_o.bias"});
        CHECK(attention.slopes == std::vector<double>{1.0 / 16, 1.0 / 256});
        attention.assign_parameters(two_wide_projections(true));
        const Tensor x = param({1, 1, 2, 2, 3, 3}, {1, 3, 2});
        const Tensor y = attention.forward(x, x);
        if (impl != AttentionImpl::fused) check_values(attention.last_weights, weights, 1e-11);
        check_values(y, y_printed, 1e-11);

        y.backward(f64({1, 0, 0, 0, 0, 0}, {1, 3, 2}));
        // ds_0j = a_0j (v_j - y_00), dq_0 = c sum_j ds_0j k_j (head 0); dk = c ds^T q = 0; dv_j = a_0j
        check_values(attention.w_q.weight.grad(), {0.665366417779, 0.665366417779, 0, 0}, 1e-11);
        check_values(attention.w_q.bias.grad(), {0.665366417779, 0}, 1e-11);
        check_values(attention.w_k.weight.grad(), {0, 0, 0, 0});
        check_values(x.grad(), {a0[0], 0, a0[1], 0, a0[2], 0}, 1e-12);
        std::vector<Tensor> with_queries = two_wide_projections();  // queries with content, for the check
        with_queries[0] = param({0.5, -1, 2, 0.25}, {2, 2});
        attention.assign_parameters(with_queries);
        gradcheck_layer(attention, {random_input({2, 3, 2}, 16)},
                        [&](const auto& in) { return attention.forward(in[0], in[0]); });
    }
    const double ds0[3] = {a0[0] * (1 - 1.958360437131), a0[1] * (2 - 1.958360437131), a0[2] * (3 - 1.958360437131)};
    CHECK(std::fabs(ds0[0] - -0.339614108488) <= 1e-11);
    CHECK(std::fabs(ds0[1] - 0.013861799196) <= 1e-11);
    CHECK(std::fabs(ds0[2] - 0.325752309292) <= 1e-11);
    CHECK(std::fabs(ds0[0] + 2 * ds0[1] + 3 * ds0[2] - 0.665366417779) <= 1e-11);

    // what the bucketed and fused forms are given: a row of Lq + Lk - 1 = 5 biases per head, for
    // d = -2 .. 2, read at entry j - i + 2
    const Tensor row =
        f64({-1.0 / 8, -1.0 / 16, 0, -1.0 / 16, -1.0 / 8, -1.0 / 128, -1.0 / 256, 0, -1.0 / 256, -1.0 / 128}, {2, 5});
    const Tensor entries = from_vector({2, 3, 4, 1, 2, 3, 0, 1, 2}, {3, 3}, DType::int64);
    for (int64_t i = 0; i < 3; ++i)
        for (int64_t j = 0; j < 3; ++j) CHECK(distance_entry(i, j, 3) == entries.to_vector()[i * 3 + j]);
    const Tensor q = zeros({1, 2, 3, 1}, DType::float64);
    const Tensor kv = f64({1, 2, 3, 1, 2, 3}, {1, 2, 3, 1});
    ClippedRelativeTerms by_distance;
    by_distance.distance_bias = row;
    const Tensor fused = fused_attention(q, kv, kv, AttentionPattern{}, 1.0, by_distance);
    check_values(fused, {1.958360437131, 2, 2.041639562869, 1.997395839956, 2, 2.002604160044}, 1e-11);
    RelativeTerms by_bucket;
    by_bucket.index = entries;
    by_bucket.bias = row;
    check_values(attention(q, kv, kv, Tensor(), 1.0, by_bucket), fused.to_vector(), 1e-14);
}
