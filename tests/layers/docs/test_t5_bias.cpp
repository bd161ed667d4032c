// docs/layers/t5_bias.md's worked examples, number for number: the buckets, a learned bias by hand
// and its gradient per bucket (doc_examples.hpp says how these tests are written).
#include "doc_examples.hpp"

using namespace relgrad;
using namespace relgrad::testing;

TEST_CASE("docs/layers/t5_bias.md: the buckets, a learned bias by hand and its gradient per bucket") {
    // 8 buckets, max_distance 8: bidirectional for d = -9 .. 9, causal for d = -9 .. 2
    const int64_t both_ways[] = {3, 3, 3, 3, 3, 3, 2, 2, 1, 0, 5, 6, 6, 7, 7, 7, 7, 7, 7};
    for (int64_t d = -9; d <= 9; ++d) {
        CAPTURE(d);
        CHECK(t5_bucket(d, true, 8, 8) == both_ways[d + 9]);
    }
    const int64_t causal[] = {7, 7, 7, 6, 5, 4, 3, 2, 1, 0, 0, 0};
    for (int64_t d = -9; d <= 2; ++d) {
        CAPTURE(d);
        CHECK(t5_bucket(d, false, 8, 8) == causal[d + 9]);
    }
    // the defaults, 32 buckets and max_distance 128: the exact buckets, then the first distance of
    // each log bucket (the one before it still in the bucket below)
    for (int64_t n = 0; n < 8; ++n) {
        CHECK(t5_bucket(-n, true, 32, 128) == n);
        if (n > 0) CHECK(t5_bucket(n, true, 32, 128) == 16 + n);
    }
    for (int64_t n = 0; n < 16; ++n) CHECK(t5_bucket(-n, false, 32, 128) == n);
    const int64_t starts_both[] = {8, 12, 16, 23, 32, 46, 64, 91};
    for (int64_t b = 0; b < 8; ++b) {
        const int64_t n = starts_both[b];
        CAPTURE(n);
        CHECK(t5_bucket(-n, true, 32, 128) == 8 + b);
        CHECK(t5_bucket(-(n - 1), true, 32, 128) == 7 + b);
        CHECK(t5_bucket(n, true, 32, 128) == 24 + b);
        CHECK(t5_bucket(n - 1, true, 32, 128) == 23 + b);
    }
    const int64_t starts_causal[] = {16, 19, 21, 24, 27, 31, 35, 40, 46, 52, 59, 67, 77, 87, 99, 113};
    for (int64_t b = 0; b < 16; ++b) {
        const int64_t n = starts_causal[b];
        CAPTURE(n);
        CHECK(t5_bucket(-n, false, 32, 128) == 16 + b);
        CHECK(t5_bucket(-(n - 1), false, 32, 128) == 15 + b);
    }
    CHECK(t5_bucket(-128, true, 32, 128) == 15);
    CHECK(t5_bucket(-100000, true, 32, 128) == 15);
    CHECK(t5_bucket(100000, true, 32, 128) == 31);
    CHECK(t5_bucket(-100000, false, 32, 128) == 31);
    CHECK(t5_bucket(5, false, 32, 128) == 0);
    // a quotient that is 4 exactly in real numbers lands just below it in float64
    const double quotient = std::log(64.0 / 4) / std::log(128.0 / 4) * (9 - 4);
    CHECK(quotient == std::nextafter(4.0, 0.0));  // 3.9999999999999996
    CHECK(t5_bucket(-64, true, 18, 128) == 7);
    CHECK(t5_bucket(64, true, 18, 128) == 16);
    CHECK(t5_bucket(-63, true, 18, 128) == 7);

    // the layer: D = 2, H = 1 (Dh = 2, c = 1/sqrt 2), identity projections, 8 buckets, max_distance 8
    const double c = 1 / std::sqrt(2.0);
    const std::vector<double> table{0, 0.5, 1, 1.5, 0, -0.5, -1, -1.5};
    const int64_t buckets[9] = {0, 5, 6, 1, 0, 5, 2, 1, 0};  // [i, j] for L = 3
    const double dots[9] = {1, 0, 1, 0, 1, 1, 1, 1, 2};      // q_i . k_j
    std::vector<double> scores;
    for (int e = 0; e < 9; ++e) {
        CHECK(t5_bucket(e % 3 - e / 3, true, 8, 8) == buckets[e]);
        scores.push_back(c * dots[e] + table[buckets[e]]);
    }
    check_values(f64(scores, {3, 3}),
                 {0.707106781187, -0.5, -0.292893218813, 0.5, 0.707106781187, 0.207106781187, 1.707106781187,
                  1.207106781187, 1.414213562373},
                 1e-11);
    const std::vector<double> weights{0.599901357075, 0.179407266926, 0.220691375999,  //
                                      0.335997149662, 0.413314770138, 0.250688080200,  //
                                      0.425055768183, 0.257809355491, 0.317134876326};
    check_values(softmax(f64(scores, {3, 3}), -1), weights, 1e-11);
    const std::vector<double> y_printed{0.820592733074, 0.400098642925, 0.586685229862,
                                        0.664002850338, 0.742190644509, 0.574944231817};
    const std::vector<double> ds{-0.132393055956, -0.039593636602, 0.171986692559,  //
                                 -0.084230480402, -0.103613086244, 0.187843566646,  //
                                 -0.134800008474, -0.081760338069, 0.216560346544};
    // ds_ij = a_ij (da_ij - sum_l a_il da_il), da_ij = dz_i . v_j = (1, 1, 2) for dy = 1
    for (int e = 0; e < 9; ++e) {
        const int i = e / 3;
        const double mean = weights[3 * i] + weights[3 * i + 1] + 2 * weights[3 * i + 2];
        CHECK(std::fabs(weights[e] * ((e % 3 == 2 ? 2 : 1) - mean) - ds[e]) <= 1e-11);
    }
    for (int i = 0; i < 3; ++i) {  // sum_l a_il da_il = 1 + a_i2
        const double printed[3] = {1.220691375999, 1.250688080200, 1.317134876326};
        CHECK(std::fabs(1 + weights[3 * i + 2] - printed[i]) <= 1e-11);
        CHECK(std::fabs(weights[3 * i] + weights[3 * i + 1] + 2 * weights[3 * i + 2] - printed[i]) <= 1e-11);
    }
    const std::vector<double> d_table{
        -0.019445795657, -0.165990818471, -0.134800008474, 0, 0, 0.148249930044, 0.171986692559, 0};
    CHECK(std::fabs(ds[0] + ds[4] + ds[8] - d_table[0]) <= 1e-11);  // bucket 0: the diagonal
    CHECK(std::fabs(ds[3] + ds[7] - d_table[1]) <= 1e-11);          // bucket 1: d = -1
    CHECK(std::fabs(ds[1] + ds[5] - d_table[5]) <= 1e-11);          // bucket 5: d = +1
    RelativeFamilyOptions options;
    options.t5_buckets = 8;
    options.t5_max_distance = 8;
    for (AttentionImpl impl : all_forms) {
        CAPTURE(attention_impl_name(impl));
        Generator gen(24);
        T5BiasAttention attention(2, 1, options, true, impl, Init{gen, DType::float64});
        std::vector<std::string> names;
        for (const auto& [name, p] : attention.named_parameters()) names.push_back(name);
        CHECK(names.back() == "relative_attention_bias.weight");
        CHECK(attention.parameter_count() == 24 + 8);
        std::vector<Tensor> values = two_wide_projections();
        values.push_back(param(table, {8, 1}));
        attention.assign_parameters(values);
        const Tensor x = param({1, 0, 0, 1, 1, 1}, {1, 3, 2});
        const Tensor y = attention.forward(x, x);
        if (impl != AttentionImpl::fused) check_values(attention.last_weights, weights, 1e-11);
        check_values(y, y_printed, 1e-11);
        y.backward(ones_like(y));
        check_values(attention.table().weight.grad(), d_table, 1e-11);
        CHECK(std::fabs(sum(attention.table().weight.grad()).item()) <= 1e-15);
        gradcheck_layer(attention, {random_input({2, 3, 2}, 17)},
                        [&](const auto& in) { return attention.forward(in[0], in[0]); });
    }

    // what the fused form is given: the row W[bucket(d)] for d = -2 .. 2, and its gradient per distance
    const Tensor q = f64({1, 0, 0, 1, 1, 1}, {1, 1, 3, 2});
    ClippedRelativeTerms by_distance;
    by_distance.distance_bias = param({1, 0.5, 0, -0.5, -1}, {1, 5});
    const Tensor fused = fused_attention(q, q, q, AttentionPattern{}, c, by_distance);
    check_values(fused, y_printed, 1e-11);
    fused.backward(ones_like(fused));
    check_values(by_distance.distance_bias.grad(),
                 {-0.134800008474, -0.165990818471, -0.019445795657, 0.148249930044, 0.171986692559}, 1e-11);
    // the bucketed form: the bucket index [Lq, Lk] and the table as a bias [H, buckets]
    RelativeTerms by_bucket;
    by_bucket.index = from_vector(std::vector<double>(buckets, buckets + 9), {3, 3}, DType::int64);
    by_bucket.bias = param(table, {1, 8});
    const Tensor bucketed = attention(q, q, q, Tensor(), c, by_bucket);
    check_values(bucketed, y_printed, 1e-11);
    bucketed.backward(ones_like(bucketed));
    check_values(by_bucket.bias.grad(), d_table, 1e-11);

    // the causal buckets of the same pairs: [[0, 0, 0], [1, 0, 0], [2, 1, 0]]
    const int64_t causal_buckets[9] = {0, 0, 0, 1, 0, 0, 2, 1, 0};
    for (int e = 0; e < 9; ++e) CHECK(t5_bucket(e % 3 - e / 3, false, 8, 8) == causal_buckets[e]);

    // a causal model's layers take causal buckets; t5_share_layers gives the stack one table
    TransformerOptions o;
    o.dim = 4;
    o.heads = 2;
    o.ff_dim = 8;
    o.layers = 2;
    o.position = PositionMode::t5;
    Generator gen(25);
    o.position = PositionMode::none;
    CHECK(CausalLanguageModel(5, o, Init{gen, DType::float64}).parameter_count() == 397);
    o.position = PositionMode::t5;
    CausalLanguageModel own(5, o, Init{gen, DType::float64});
    CHECK(own.parameter_count() == 525);
    CHECK(!dynamic_cast<T5BiasAttention&>(*own.decoder.layers[0]->self_attention).bidirectional);
    o.t5_share_layers = true;
    CausalLanguageModel shared(5, o, Init{gen, DType::float64});
    CHECK(shared.parameter_count() == 461);
    CHECK(20 + 2 * 172 + 8 + 25 + 2 * 64 == 525);
    std::vector<std::string> tables;
    for (const auto& [name, p] : shared.named_parameters()) {
        if (name.find("relative_attention_bias") != std::string::npos) tables.push_back(name);
    }
    CHECK(tables == std::vector<std::string>{"decoder.layers.0.self_attention.relative_attention_bias.weight"});
    auto& first = dynamic_cast<T5BiasAttention&>(*shared.decoder.layers[0]->self_attention);
    auto& second = dynamic_cast<T5BiasAttention&>(*shared.decoder.layers[1]->self_attention);
    CHECK(&first.table() == &second.table());
}
