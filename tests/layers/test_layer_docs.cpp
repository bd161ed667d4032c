// The worked examples of docs/layers/*.md, number for number. Each TEST_CASE is named after the
// page it checks, rebuilds the page's example with relgrad (float64, hand-picked parameters set
// with assign_parameters in named_parameters() order), checks every number the page prints and
// ends in a gradient check of the same layer.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/npy.hpp"
#include "layer_check.hpp"
#include "layers/transformer.hpp"

using namespace relgrad;
using namespace relgrad::testing;

namespace {

// a hand-picked parameter: float64, a leaf that requires a gradient
Tensor param(const std::vector<double>& values, const Shape& shape) { return f64(values, shape).requires_grad_(true); }

double sigmoid_of(double x) { return 1 / (1 + std::exp(-x)); }

// w = 1, b = 0 for the four projections of a D = 1, H = 1 attention layer (w_q, w_k, w_v, w_o)
std::vector<Tensor> unit_projections() {
    std::vector<Tensor> values;
    for (int i = 0; i < 4; ++i) {
        values.push_back(param({1}, {1, 1}));
        values.push_back(param({0}, {1}));
    }
    return values;
}

}  // namespace

// ---------------------------------------------------------------- linear_embedding_layernorm.md

TEST_CASE("docs/layers/linear_embedding_layernorm.md: Linear") {
    Generator gen(1);
    Linear linear(2, 2, Init{gen, DType::float64});
    linear.assign_parameters({param({1, 0, 2, -1}, {2, 2}), param({0.5, -1}, {2})});
    const Tensor x = param({1, 2}, {2});
    const Tensor y = linear.forward(x);
    check_values(y, {1.5, -1});
    y.backward(f64({1, 2}, {2}));
    check_values(x.grad(), {5, -2});
    check_values(linear.weight.grad(), {1, 2, 2, 4});
    check_values(linear.bias.grad(), {1, 2});
    gradcheck_layer(linear, {random_input({3, 2}, 1)}, [&](const auto& in) { return linear.forward(in[0]); });
}

TEST_CASE("docs/layers/linear_embedding_layernorm.md: Embedding") {
    Generator gen(2);
    Embedding table(3, 2, Init{gen, DType::float64});
    table.assign_parameters({param({1, 2, 3, 4, 5, 6}, {3, 2})});
    const Tensor ids = from_vector({2, 0, 2}, {3}, DType::int64);
    const Tensor y = table.forward(ids);
    check_values(y, {5, 6, 1, 2, 5, 6});
    y.backward(f64({1, 2, 3, 4, 5, 6}, {3, 2}));
    check_values(table.weight.grad(), {3, 4, 0, 0, 6, 8});             // row 2 used twice: (1, 2) + (5, 6)
    CHECK_THROWS(table.forward(from_vector({3}, {1}, DType::int64)));  // no row 3
    gradcheck_layer(table, {}, [&](const auto&) { return table.forward(ids.to(table.device())); });
}

TEST_CASE("docs/layers/linear_embedding_layernorm.md: LayerNorm") {
    Generator gen(3);
    LayerNorm norm(4, Init{gen, DType::float64});
    norm.assign_parameters({param({1, 1, 2, 2}, {4}), param({0, 0, 0, 1}, {4})});
    const Tensor x = param({1, 1, 3, 3}, {4});
    const double rstd = 1 / std::sqrt(1 + 1e-5);  // mean 2, variance 1
    CHECK(rstd == doctest::Approx(0.999995000037).epsilon(1e-12));
    const Tensor y = norm.forward(x);
    check_values(y, {-0.999995000037, -0.999995000037, 1.999990000075, 2.999990000075}, 1e-11);
    y.backward(f64({1, 0, 0, 0}, {4}));
    check_values(x.grad(), {0.499999999981, -0.499995000056, -0.000002499963, -0.000002499963}, 1e-11);
    // dx = rstd (gh - mean(gh) - xhat mean(gh xhat)) with gh = (1, 0, 0, 0), mean(gh xhat) = -rstd/4
    check_values(x.grad(), {rstd * (0.75 - rstd * rstd / 4), rstd * (-0.25 - rstd * rstd / 4),
                            rstd * (-0.25 + rstd * rstd / 4), rstd * (-0.25 + rstd * rstd / 4)});
    check_values(norm.weight.grad(), {-rstd, 0, 0, 0});
    check_values(norm.bias.grad(), {1, 0, 0, 0});
    gradcheck_layer(norm, {random_input({3, 4}, 2)}, [&](const auto& in) { return norm.forward(in[0]); });
}

TEST_CASE("docs/layers/linear_embedding_layernorm.md: Dropout and FeedForward") {
    Dropout drop(0.5, 7);
    const Tensor ones8 = ones({8}, DType::float64).requires_grad_(true);
    const Tensor dropped = drop.forward(ones8);
    int kept = 0;
    for (double v : dropped.to_vector()) {
        CHECK((v == 0 || v == 2));  // zeroed, or kept and scaled by 1 / (1 - p) = 2
        kept += v == 2;
    }
    CHECK(kept > 0);
    CHECK(kept < 8);
    dropped.backward(ones_like(dropped));
    CHECK(ones8.grad().to_vector() == dropped.to_vector());  // the same mask scales the gradient
    drop.eval();
    CHECK(drop.forward(ones8).to_vector() == std::vector<double>(8, 1.0));  // identity in eval mode

    Generator gen(4);
    FeedForward ff(2, 2, 0.0, Init{gen, DType::float64});
    std::vector<std::string> names;
    for (const auto& [name, p] : ff.named_parameters()) names.push_back(name);
    CHECK(names == std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"});
    ff.assign_parameters(
        {param({1, 0, 0, 1}, {2, 2}), param({0, 0}, {2}), param({1, 0, 0, 1}, {2, 2}), param({0, 0}, {2})});
    const Tensor x = param({1, -1}, {2});
    const Tensor y = ff.forward(x);
    check_values(y, {0.841344746069, -0.158655253931}, 1e-11);  // gelu(1), gelu(-1)
    y.backward(f64({1, 1}, {2}));
    check_values(x.grad(), {1.083315470588, -0.083315470588}, 1e-11);  // Phi(x) + x phi(x)
    const double phi1 = std::exp(-0.5) / std::sqrt(2 * M_PI), Phi1 = 0.5 * std::erfc(-1 / std::sqrt(2.0));
    CHECK(Phi1 == doctest::Approx(0.841344746069).epsilon(1e-11));
    CHECK(phi1 == doctest::Approx(0.241970724519).epsilon(1e-11));
    check_values(x.grad(), {Phi1 + phi1, (1 - Phi1) - phi1});
    gradcheck_layer(ff, {random_input({3, 2}, 3)}, [&](const auto& in) { return ff.forward(in[0]); });
}

TEST_CASE("docs/layers/linear_embedding_layernorm.md: the Module base, state directory and initialisation") {
    namespace fs = std::filesystem;
    Generator gen(5);
    Linear linear(2, 2, Init{gen, DType::float64});
    CHECK(linear.parameter_count() == 6);
    const double bound = std::sqrt(6.0 / (2 + 2));  // Xavier uniform
    CHECK(bound == doctest::Approx(1.224744871).epsilon(1e-9));
    for (double w : linear.weight.to_vector()) CHECK(std::fabs(w) <= bound);
    CHECK(linear.bias.to_vector() == std::vector<double>{0, 0});
    Embedding table(50, 4, Init{gen, DType::float64});
    for (double w : table.weight.to_vector()) CHECK(std::fabs(w) <= 0.04);  // truncated at 2 std
    LayerNorm norm(3, Init{gen, DType::float64});
    CHECK(norm.weight.to_vector() == std::vector<double>{1, 1, 1});
    CHECK(norm.bias.to_vector() == std::vector<double>{0, 0, 0});

    linear.assign_parameters({param({1, 0, 2, -1}, {2, 2}), param({0.5, -1}, {2})});
    const fs::path dir = fs::temp_directory_path() / "relgrad_test_layer_docs_state";
    fs::remove_all(dir);
    linear.save(dir.string());
    std::ifstream manifest_file(dir / "manifest.json");
    const nlohmann::json manifest = nlohmann::json::parse(manifest_file);
    const nlohmann::json expected = nlohmann::json::parse(R"({
      "format": "relgrad-state",
      "parameters": [
        {"dtype": "float64", "file": "weight.npy", "name": "weight", "shape": [2, 2]},
        {"dtype": "float64", "file": "bias.npy", "name": "bias", "shape": [2]}
      ],
      "version": 1
    })");
    CHECK(manifest == expected);
    check_values(load_npy((dir / "weight.npy").string()), {1, 0, 2, -1});
    Generator other(6);
    Linear restored(2, 2, Init{other, DType::float64});
    restored.load(dir.string());
    check_values(restored.forward(f64({1, 2}, {2})), {1.5, -1});
    fs::remove_all(dir);

    linear.train();
    CHECK(linear.is_training());
    linear.eval();
    CHECK_FALSE(linear.is_training());
    gradcheck_layer(restored, {random_input({2, 2}, 4)}, [&](const auto& in) { return restored.forward(in[0]); });
}

// ---------------------------------------------------------------- sinusoidal.md

TEST_CASE("docs/layers/sinusoidal.md: the sinusoidal table for D = 4, L = 3") {
    SinusoidalPositionalEncoding pe(4);
    const Tensor table = pe.encoding(3, DType::float64);
    check_values(table,
                 {0, 1, 0, 1,                                                      //
                  0.841470984808, 0.540302305868, 0.009999833334, 0.999950000417,  //
                  0.909297426826, -0.416146836547, 0.019998666693, 0.999800006667},
                 1e-11);
    // the dot product of two rows depends only on their distance: cos(1) + cos(0.01) for both pairs
    const auto row = [&](int64_t p) { return table.narrow(0, p, 1).reshape({4}); };
    const double d01 = sum(mul(row(0), row(1))).item(), d12 = sum(mul(row(1), row(2))).item();
    CHECK(d01 == doctest::Approx(1.540252306285).epsilon(1e-12));
    CHECK(std::fabs(d01 - d12) <= 1e-15);
    CHECK(sum(mul(row(0), row(2))).item() == doctest::Approx(std::cos(2.0) + std::cos(0.02)).epsilon(1e-14));
    // forward adds the table to every sequence of the batch; the gradient passes through unchanged
    const Tensor x = zeros({2, 3, 4}, DType::float64).requires_grad_(true);
    const Tensor y = pe.forward(x);
    check_values(y.narrow(0, 1, 1), table.to_vector());
    y.backward(ones_like(y));
    check_values(x.grad(), std::vector<double>(24, 1.0));
    CHECK(pe.parameter_count() == 0);
    // every row has norm sqrt(D/2); token embeddings (std 0.02) are about 40 times shorter unscaled,
    // about 40 / sqrt(D) = 5 times shorter once TokenEmbedding scales them by sqrt(D) (D = 64)
    CHECK(sum(mul(row(2), row(2))).item() == doctest::Approx(2.0).epsilon(1e-14));
    Generator gen(21);
    TransformerOptions o;
    o.dim = 64;
    o.dropout = 0;
    o.position = PositionMode::none;
    TokenEmbedding tokens(4000, o, Init{gen, DType::float64});
    std::vector<double> all_ids(4000);
    for (int i = 0; i < 4000; ++i) all_ids[i] = i;
    const Tensor scaled = tokens.forward(from_vector(all_ids, {1, 4000}, DType::int64));
    const double unscaled_ratio =
        std::sqrt(64.0 / 2) / std::sqrt(sum(mul(tokens.tokens.weight, tokens.tokens.weight)).item() / 4000);
    const double scaled_ratio = std::sqrt(64.0 / 2) / std::sqrt(sum(mul(scaled, scaled)).item() / 4000);
    CHECK(unscaled_ratio > 38);
    CHECK(unscaled_ratio < 42);
    CHECK(scaled_ratio == doctest::Approx(unscaled_ratio / 8).epsilon(1e-12));
    gradcheck_layer(pe, {random_input({2, 3, 4}, 5)}, [&](const auto& in) { return pe.forward(in[0]); });
}

TEST_CASE("docs/layers/sinusoidal.md: learned positions") {
    Generator gen(7);
    LearnedPositionalEmbedding learned(3, 2, Init{gen, DType::float64});
    learned.assign_parameters({param({1, 2, 3, 4, 5, 6}, {3, 2})});
    const Tensor x = zeros({2, 2, 2}, DType::float64).requires_grad_(true);
    const Tensor y = learned.forward(x);
    check_values(y, {1, 2, 3, 4, 1, 2, 3, 4});
    y.backward(ones_like(y));
    check_values(learned.weight.grad(), {2, 2, 2, 2, 0, 0});  // two sequences; position 2 unused
    check_values(x.grad(), std::vector<double>(8, 1.0));
    CHECK_THROWS_WITH_AS(
        learned.forward(zeros({1, 4, 2}, DType::float64)),
        "LearnedPositionalEmbedding: length 4 exceeds max_positions 3 (it has no vector for later positions)",
        std::invalid_argument);
    gradcheck_layer(learned, {random_input({2, 3, 2}, 6)}, [&](const auto& in) { return learned.forward(in[0]); });
}

// ---------------------------------------------------------------- relative_position.md

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

// ---------------------------------------------------------------- masks.md

TEST_CASE("docs/layers/masks.md: masks and a fully masked row") {
    check_values(key_padding_mask({2, 3}, 3), {1, 1, 0, 1, 1, 1});
    CHECK(key_padding_mask({2, 3}, 3).shape() == Shape{2, 1, 1, 3});
    check_values(causal_mask(3, 3), {1, 0, 0, 1, 1, 0, 1, 1, 1});
    check_values(local_window_mask(3, 3, 1), {1, 1, 0, 1, 1, 1, 0, 1, 1});
    check_values(combine_masks(causal_mask(3, 3), local_window_mask(3, 3, 1)), {1, 0, 0, 1, 1, 0, 0, 1, 1});
    const Tensor all =
        combine_masks(combine_masks(causal_mask(3, 3), local_window_mask(3, 3, 1)), key_padding_mask({2, 3}, 3));
    CHECK(all.shape() == Shape{2, 1, 3, 3});
    check_values(all, {1, 0, 0, 1, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 0, 0, 1, 1});
    check_values(causal_mask(1, 4, 3), {1, 1, 1, 1});
    check_values(local_window_mask(1, 4, 1, 3), {0, 0, 1, 1});

    // the attention example: D = 1, H = 1, all weights 1, biases 0 but b_o = 0.5
    Generator gen(9);
    MultiHeadAttention attention(1, 1, Init{gen, DType::float64});
    std::vector<Tensor> values = unit_projections();
    values[7] = param({0.5}, {1});
    attention.assign_parameters(values);
    const Tensor x = param({0, 1, 2, 0, 1, 2}, {2, 3, 1});
    const Tensor mask = combine_masks(causal_mask(3, 3), key_padding_mask({3, 0}, 3));
    const Tensor y = attention.forward(x, x, mask);
    check_values(attention.last_weights,
                 {1, 0, 0,                                         //
                  0.268941421370, 0.731058578630, 0,               //
                  0.015876239976, 0.117310427826, 0.866813332197,  //
                  0, 0, 0, 0, 0, 0, 0, 0, 0},
                 1e-11);
    check_values(y, {0.5, 1.231058578630, 2.350937092221, 0.5, 0.5, 0.5}, 1e-11);
    CHECK(0.117310427826 + 2 * 0.866813332197 == doctest::Approx(1.850937092221).epsilon(1e-11));  // z_2
    y.backward(ones_like(y));
    check_values(x.grad().narrow(0, 1, 1), {0, 0, 0});  // the fully masked sequence gets no gradient
    for (const Tensor& p : attention.parameters()) {
        for (double g : p.grad().to_vector()) CHECK(std::isfinite(g));
    }
    check_values(attention.w_o.bias.grad(), {6});  // dy = 1 on all six outputs
    gradcheck_layer(attention, {random_input({2, 3, 1}, 7)},
                    [&](const auto& in) { return attention.forward(in[0], in[0], mask.to(attention.device())); });
}

// ---------------------------------------------------------------- attention.md

TEST_CASE("docs/layers/attention.md: two heads of plain attention") {
    Generator gen(10);
    MultiHeadAttention attention(2, 2, Init{gen, DType::float64});
    std::vector<Tensor> values;
    for (int i = 0; i < 4; ++i) {
        values.push_back(param({1, 0, 0, 1}, {2, 2}));
        values.push_back(param({0, 0}, {2}));
    }
    attention.assign_parameters(values);
    const Tensor x = param({1, 0, 0, 1}, {1, 2, 2});
    const Tensor y = attention.forward(x, x);
    const double s1 = sigmoid_of(1);  // softmax([1, 0]) = (sigmoid(1), sigmoid(-1))
    CHECK(s1 == doctest::Approx(0.731058578630).epsilon(1e-12));
    check_values(attention.last_weights, {s1, 1 - s1, 0.5, 0.5, 0.5, 0.5, 1 - s1, s1});
    check_values(y, {0.731058578630, 0.5, 0.5, 0.731058578630}, 1e-11);
    gradcheck_layer(attention, {random_input({2, 3, 2}, 8)},
                    [&](const auto& in) { return attention.forward(in[0], in[0]); });
}

TEST_CASE("docs/layers/attention.md: relative attention by hand, reference = bucketed") {
    RelativeOptions o;
    o.k_left = o.k_right = 1;
    for (AttentionImpl impl : {AttentionImpl::reference, AttentionImpl::bucketed}) {
        CAPTURE(static_cast<int>(impl));
        Generator gen(11);
        RelativeMultiHeadAttention attention(1, 1, o, impl, Init{gen, DType::float64});
        std::vector<Tensor> values = unit_projections();
        values.push_back(param({-1, 0, 1}, {3, 1}));  // E_K
        values.push_back(param({-1, 0, 1}, {3, 1}));  // E_V
        attention.assign_parameters(values);
        const Tensor x = param({1, 0, -1}, {1, 3, 1});
        const Tensor r = attention.rel_pos_emb_k.index(3, 3);
        check_values(r, {1, 2, 2, 0, 1, 2, 0, 0, 1});
        // bucketed: Q E_K^T [L, K], then gathered by r
        const Tensor q = x.detach().reshape({1, 1, 3, 1});
        const Tensor q_table = matmul(q, attention.rel_pos_emb_k.table().transpose(-1, -2));
        check_values(q_table, {-1, 0, 1, 0, 0, 0, 1, 0, -1});
        check_values(gather(q_table, -1, r.expand({1, 1, 3, 3})), {0, 1, 1, 0, 0, 0, 1, 1, 0});

        const Tensor y = attention.forward(x, x);
        const double e = std::exp(1.0), big = e / (2 * e + 1), small = 1 / (2 * e + 1);
        CHECK(big == doctest::Approx(0.422318798252).epsilon(1e-12));
        CHECK(small == doctest::Approx(0.155362403497).epsilon(1e-12));
        check_values(attention.last_weights, {big, big, small, 1.0 / 3, 1.0 / 3, 1.0 / 3, small, big, big});
        // bucket weights: the weights of each row summed per bucket [L, K]
        const Tensor buckets =
            scatter_add(zeros({1, 1, 3, 3}, DType::float64), -1, r.expand({1, 1, 3, 3}), attention.last_weights);
        check_values(buckets, {0, big, big + small, 1.0 / 3, 1.0 / 3, 1.0 / 3, big + small, big, 0});
        check_values(buckets,
                     {0, 0.422318798252, 0.577681201748, 1.0 / 3, 1.0 / 3, 1.0 / 3, 0.577681201748, 0.422318798252, 0},
                     1e-11);
        check_values(y, {0.844637596503, 0, -0.844637596503}, 1e-11);
        check_values(y, {(big - small) + (big + small), 0, -(big - small) - (big + small)});

        y.backward(f64({1, 0, 0}, {1, 3, 1}));
        check_values(attention.rel_pos_emb_v.weight.grad(), {0, 0.422318798252, 0.577681201748}, 1e-11);
        // ds_0j = a_0j (dp_0j - z_0) with dp_0 = v_j + E_V[r(0, j)] = (1, 1, 0)
        const double z0 = 2 * big;
        CHECK(big * (1 - z0) == doctest::Approx(0.065612463538).epsilon(1e-11));     // ds_00 = ds_01
        CHECK(small * (0 - z0) == doctest::Approx(-0.131224927077).epsilon(1e-11));  // ds_02
        check_values(attention.rel_pos_emb_k.weight.grad(), {0, big * (1 - z0), big * (1 - z0) + small * (0 - z0)});
        check_values(attention.rel_pos_emb_k.weight.grad(), {0, 0.065612463538, -0.065612463538}, 1e-11);
        gradcheck_layer(attention, {random_input({2, 3, 1}, 9)},
                        [&](const auto& in) { return attention.forward(in[0], in[0]); });
    }
}

TEST_CASE("docs/layers/attention.md: the memory arithmetic for B = 8, H = 8, L = 512, Dh = 32, k = 8") {
    const int64_t B = 8, H = 8, L = 512, Dh = 32, k = 8, K = 2 * k + 1;
    CHECK(K == 17);
    Generator gen(12);
    RelativeOptions o;
    o.k_left = o.k_right = k;
    RelativeMultiHeadAttention reference(H * Dh, H, o, AttentionImpl::reference, Init{gen, DType::float32});
    // reference: each table E[r(i, j)] is [1, L, L, Dh]
    const int64_t table = reference.rel_pos_emb_k.lookup(L, L).numel();
    CHECK(table == 8388608);
    CHECK(2 * table == 16777216);
    // its backward: one [L, Dh, Lk] gradient per table (Shaw's layout: [L, B*H, Dh] @ [L, Dh, L])
    CHECK(4 * table == 33554432);
    // bucketed: Q E_K^T and the bucket weights, each [B, H, L, K]
    const Tensor q = zeros({B, H, L, Dh});
    const int64_t bucketed = matmul(q, reference.rel_pos_emb_k.table().transpose(-1, -2)).numel();
    CHECK(bucketed == 557056);
    CHECK(2 * bucketed == 1114112);
    CHECK(4 * bucketed == 2228224);
    CHECK(double(2 * table) / double(2 * bucketed) == doctest::Approx(15.06).epsilon(1e-3));
    CHECK(double(L * Dh) / double(B * H * K) == doctest::Approx(15.06).epsilon(1e-3));
    CHECK(16777216 * 4 == 64 << 20);         // 64 MiB in float32
    CHECK(1114112 * 4 == 4.25 * (1 << 20));  // 4.25 MiB
    // the two forms agree (here at a size a gradient check can afford)
    Generator g1(13), g2(13);
    RelativeMultiHeadAttention ref(4, 2, o, AttentionImpl::reference, Init{g1, DType::float64});
    RelativeMultiHeadAttention buck(4, 2, o, AttentionImpl::bucketed, Init{g2, DType::float64});
    const Tensor x = random_input({2, 5, 4}, 10);
    CHECK(max_difference(ref.forward(x, x), buck.forward(x, x)) <= 1e-12);
    gradcheck_layer(buck, {x}, [&](const auto& in) { return buck.forward(in[0], in[0]); });
}

// ---------------------------------------------------------------- gated.md

namespace {

// The gated layer of docs/layers/gated.md (D = H = Dh = 1, all projections 1, biases 0,
// E_K = E_V = (-1, 0, 1), k = 1) written out in plain loops: its output for x, and d lambda
// for the cotangent dy. gate_of(x_i) is g_i.
struct LoopResult {
    std::vector<double> y;
    double d_lambda;
};

template <class GateOf>
LoopResult gated_by_loops(const std::vector<double>& x, const std::vector<double>& dy, GateOf gate_of) {
    const int L = 3;
    const double table[3] = {-1, 0, 1};
    auto r = [](int i, int j) { return std::clamp(j - i, -1, 1) + 1; };
    LoopResult out{std::vector<double>(L), 0};
    for (int i = 0; i < L; ++i) {
        const double g = gate_of(x[i]);
        double e[3], a[3], rel[3], abs_term[3], total = 0;
        for (int j = 0; j < L; ++j) {
            rel[j] = x[i] * table[r(i, j)];
            abs_term[j] = std::sin(double(i)) * std::sin(double(j));  // P_i = sin(i) when D = 1
            e[j] = x[i] * x[j] + g * rel[j] + (1 - g) * abs_term[j];  // / sqrt(Dh) = 1
            total += std::exp(e[j]);
        }
        double R = 0, z = 0;
        for (int j = 0; j < L; ++j) {
            a[j] = std::exp(e[j]) / total;
            R += a[j] * table[r(i, j)];
            z += a[j] * x[j];
        }
        out.y[i] = z + g * R;
        // backward: da_ij = dz_i (v_j + g E_V[r]), ds = a (da - sum a da), dg = sum ds (rel - abs) + dz R
        double da[3], mean_da = 0, dg = dy[i] * R;
        for (int j = 0; j < L; ++j) {
            da[j] = dy[i] * (x[j] + g * table[r(i, j)]);
            mean_da += a[j] * da[j];
        }
        for (int j = 0; j < L; ++j) dg += a[j] * (da[j] - mean_da) * (rel[j] - abs_term[j]);
        out.d_lambda += g * (1 - g) * dg;
    }
    return out;
}

std::vector<Tensor> gated_example_parameters(double lambda) {
    std::vector<Tensor> values{param({lambda}, {1})};
    for (const Tensor& t : unit_projections()) values.push_back(t);
    values.push_back(param({-1, 0, 1}, {3, 1}));  // E_K
    values.push_back(param({-1, 0, 1}, {3, 1}));  // E_V
    for (int i = 0; i < 2; ++i) {                 // w_pq, w_pk
        values.push_back(param({1}, {1, 1}));
        values.push_back(param({0}, {1}));
    }
    return values;
}

}  // namespace

TEST_CASE("docs/layers/gated.md: the gate between relative and absolute, by hand") {
    RelativeOptions o;
    o.k_left = o.k_right = 1;
    Generator gen(14);
    GatedPositionAttention gated(1, 1, o, AttentionImpl::bucketed, false, Init{gen, DType::float64});
    std::vector<std::string> names;
    for (const auto& [name, p] : gated.named_parameters()) names.push_back(name);
    CHECK(names == std::vector<std::string>{"gate", "w_q.weight", "w_q.bias", "w_k.weight", "w_k.bias", "w_v.weight",
                                            "w_v.bias", "w_o.weight", "w_o.bias", "rel_pos_emb_k.weight",
                                            "rel_pos_emb_v.weight", "w_pq.weight", "w_pq.bias", "w_pk.weight",
                                            "w_pk.bias"});
    CHECK(gated.gate_values() == std::vector<double>{0.5});  // lambda starts at 0
    gated.assign_parameters(gated_example_parameters(0));
    check_values(gated.positions.encoding(3, DType::float64), {0, 0.841470984808, 0.909297426826}, 1e-11);

    const std::vector<double> xs{1, 0, -1}, dy{1, 1, 1};
    const Tensor x = param(xs, {1, 3, 1});
    const Tensor y = gated.forward(x, x);
    // the scores e_ij = q_i k_j + g rel_ij + (1 - g) abs_ij (sqrt(Dh) = 1), row by row; the weights
    // are their softmax
    const std::vector<double> scores{1,
                                     0.5,
                                     -0.5,  //
                                     0,
                                     0.354036709137,
                                     0.382573700617,  //
                                     -0.5,
                                     0.882573700617,
                                     1.413410905216};
    CHECK(std::sin(1.0) * std::sin(1.0) == doctest::Approx(0.708073418274).epsilon(1e-11));
    CHECK(std::sin(1.0) * std::sin(2.0) == doctest::Approx(0.765147401234).epsilon(1e-11));
    CHECK(std::sin(2.0) * std::sin(2.0) == doctest::Approx(0.826821810432).epsilon(1e-11));
    check_values(gated.last_weights, softmax(f64(scores, {3, 3}), -1).to_vector(), 1e-11);
    check_values(gated.last_weights,
                 {0.546549387266, 0.331498960424, 0.121951652310,  //
                  0.257012561503, 0.366193422389, 0.376794016108,  //
                  0.085024561976, 0.338835208912, 0.576140229112},
                 1e-11);
    check_values(y, {0.651323041323, -0.059890727303, -0.703045552580}, 1e-11);
    CHECK(0.257012561503 - 0.376794016108 == doctest::Approx(-0.119781454605).epsilon(1e-11));
    CHECK(0.5 * -0.119781454605 == doctest::Approx(-0.059890727303).epsilon(1e-10));
    const LoopResult loops = gated_by_loops(xs, dy, [](double) { return 0.5; });
    check_values(y, loops.y);
    y.backward(f64(dy, {1, 3, 1}));
    CHECK(gated.gate.grad().item() == doctest::Approx(loops.d_lambda).epsilon(1e-12));
    CHECK(gated.gate.grad().item() == doctest::Approx(0.082515896671).epsilon(1e-10));

    // lambda = +40: g = 1 (exactly, in float64), the relative example of attention.md
    gated.assign_parameters(gated_example_parameters(40));
    CHECK(gated.gate_values()[0] == 1.0);
    check_values(gated.forward(x, x), {0.844637596503, 0, -0.844637596503}, 1e-11);
    // lambda = -40: g = 4e-18, the tables no longer matter: untied absolute attention
    gated.assign_parameters(gated_example_parameters(-40));
    CHECK(gated.gate_values()[0] == doctest::Approx(4.25e-18).epsilon(1e-3));
    const Tensor absolute = gated.forward(x, x);
    check_values(absolute, gated_by_loops(xs, dy, [](double) { return 0.0; }).y, 1e-15);
    check_values(absolute, {0.575210382604, -0.221900978228, -0.669571394012}, 1e-11);

    gated.assign_parameters(gated_example_parameters(0.3));
    gradcheck_layer(gated, {random_input({2, 3, 1}, 11)}, [&](const auto& in) { return gated.forward(in[0], in[0]); });
}

TEST_CASE("docs/layers/gated.md: the token gate") {
    RelativeOptions o;
    o.k_left = o.k_right = 1;
    Generator gen(15);
    GatedPositionAttention gated(1, 1, o, AttentionImpl::bucketed, true, Init{gen, DType::float64});
    std::vector<Tensor> values = gated_example_parameters(0);
    CHECK(gated.w_gate->weight.to_vector() == std::vector<double>{0});  // token gates start at 0.5
    values.push_back(param({2}, {1, 1}));                               // w_gate.weight
    gated.assign_parameters(values);
    CHECK(sigmoid_of(2) == doctest::Approx(0.880797077978).epsilon(1e-12));
    CHECK(sigmoid_of(-2) == doctest::Approx(0.119202922022).epsilon(1e-11));
    const std::vector<double> xs{1, 0, -1}, dy{1, 1, 1};
    const Tensor x = param(xs, {1, 3, 1});
    const Tensor y = gated.forward(x, x);
    const LoopResult loops = gated_by_loops(xs, dy, [](double xi) { return sigmoid_of(2 * xi); });
    check_values(y, loops.y);
    check_values(y, {0.787155998722, -0.059890727303, -0.669758726462}, 1e-11);
    y.backward(f64(dy, {1, 3, 1}));
    CHECK(gated.gate.grad().item() == doctest::Approx(loops.d_lambda).epsilon(1e-12));
    CHECK(gated.gate_values() == std::vector<double>{0.5});  // the per-head part only
    gradcheck_layer(gated, {random_input({2, 3, 1}, 12)}, [&](const auto& in) { return gated.forward(in[0], in[0]); });
}

// ---------------------------------------------------------------- transformer.md

namespace {

TransformerOptions two_wide(PositionMode mode) {
    TransformerOptions o;
    o.dim = 2;
    o.heads = 1;
    o.ff_dim = 2;
    o.layers = 1;
    o.dropout = 0;
    o.position = mode;
    return o;
}

// identity weights, LayerNorm weights 1, every bias 0 (zero_outputs: w_o and fc2 weights 0 too)
std::vector<Tensor> identity_parameters(const Module& layer, bool zero_outputs = false) {
    std::vector<Tensor> values;
    for (const auto& [name, p] : layer.named_parameters()) {
        const bool is_weight = name.size() >= 6 && name.compare(name.size() - 6, 6, "weight") == 0;
        const bool is_norm = name.rfind("norm", 0) == 0;
        const bool is_output = name.find("w_o.") != std::string::npos || name.find("fc2.") != std::string::npos;
        if (!is_weight || (zero_outputs && is_output) || name.find("rel_pos_emb") != std::string::npos) {
            values.push_back(zeros(p.shape(), DType::float64).requires_grad_(true));
        } else {
            values.push_back(is_norm ? param({1, 1}, {2}) : param({1, 0, 0, 1}, {2, 2}));
        }
    }
    return values;
}

}  // namespace

TEST_CASE("docs/layers/transformer.md: a pre-LN encoder layer by hand") {
    Generator gen(16);
    EncoderLayer layer(two_wide(PositionMode::none), Init{gen, DType::float64});
    layer.assign_parameters(identity_parameters(layer));
    const Tensor x = param({3, 1, 0, 2}, {1, 2, 2});
    const Tensor y = layer.forward(x, Tensor());
    check_values(y, {4.729721366055, -0.047033509696, -1.047033509696, 3.729721366055}, 1e-11);
    // the same by hand: norm1(x) = +-c (1, -1), z_0 = c tanh(c^2 sqrt 2) (1, -1), then norm2 and GELU
    const double c = 1 / std::sqrt(1 + 1e-5), t = c * std::tanh(c * c * std::sqrt(2.0));
    CHECK(c == doctest::Approx(0.999995000037).epsilon(1e-12));
    CHECK(c * c * std::sqrt(2.0) == doctest::Approx(1.414199420379).epsilon(1e-12));
    check_values(layer.self_attention->last_weights, {0.944191290412, 0.055808709588, 0.055808709588, 0.944191290412},
                 1e-11);
    CHECK(sigmoid_of(2 * c * c * std::sqrt(2.0)) == doctest::Approx(0.944191290412).epsilon(1e-11));
    CHECK(std::tanh(c * c * std::sqrt(2.0)) == doctest::Approx(0.888382580825).epsilon(1e-11));
    CHECK(t == doctest::Approx(0.888378138945).epsilon(1e-11));
    CHECK(3 + t == doctest::Approx(3.888378138945).epsilon(1e-12));
    CHECK(1 - t == doctest::Approx(0.111621861055).epsilon(1e-10));
    const double spread = 1 + t, c2 = spread / std::sqrt(spread * spread + 1e-5);
    auto gelu_of = [](double v) { return v * 0.5 * std::erfc(-v / std::sqrt(2.0)); };
    CHECK(c2 == doctest::Approx(0.999998597861).epsilon(1e-11));
    CHECK(gelu_of(c2) == doctest::Approx(0.841343227110).epsilon(1e-11));
    CHECK(gelu_of(-c2) == doctest::Approx(-0.158655370751).epsilon(1e-11));
    check_values(y.narrow(1, 0, 1), {3 + t + gelu_of(c2), 1 - t + gelu_of(-c2)});
    y.backward(f64({1, 0, 0, 0}, {1, 2, 2}));
    check_values(x.grad(), {1.000007760833, -0.000007760833, -0.000000466150, 0.000000466150}, 1e-11);

    // with w_o = 0 and fc2 = 0 (and their biases) the layer is the identity, and so is its gradient
    Generator gen2(17);
    EncoderLayer silent(two_wide(PositionMode::relative), Init{gen2, DType::float64});
    silent.assign_parameters(identity_parameters(silent, true));
    const Tensor x2 = param({3, 1, 0, 2}, {1, 2, 2});
    const Tensor y2 = silent.forward(x2, Tensor());
    check_values(y2, {3, 1, 0, 2});
    y2.backward(f64({1, 2, 3, 4}, {1, 2, 2}));
    check_values(x2.grad(), {1, 2, 3, 4});

    Generator gen3(18);
    TransformerOptions o = two_wide(PositionMode::gated);
    o.dim = 4;
    o.heads = 2;
    o.relative.k_left = o.relative.k_right = 1;
    EncoderLayer gated(o, Init{gen3, DType::float64});
    gradcheck_layer(gated, {random_input({2, 3, 4}, 13)},
                    [&](const auto& in) { return gated.forward(in[0], causal_mask(3, 3, 0, gated.device())); });
}

TEST_CASE("docs/layers/transformer.md: what each position mode adds, in parameters") {
    const int64_t expected[] = {225, 225, 257, 245, 287, 225, 225, 289};
    int n = 0;
    for (PositionMode mode :
         {PositionMode::none, PositionMode::sinusoidal, PositionMode::learned, PositionMode::relative,
          PositionMode::gated, PositionMode::rope, PositionMode::alibi, PositionMode::t5}) {
        CAPTURE(position_mode_name(mode));
        TransformerOptions o;
        o.dim = 4;
        o.heads = 2;
        o.ff_dim = 8;
        o.layers = 1;
        o.position = mode;
        o.relative.k_left = o.relative.k_right = 2;
        o.max_positions = 8;
        Generator gen(19);
        CausalLanguageModel lm(5, o, Init{gen, DType::float64});
        CHECK(lm.parameter_count() == expected[n++]);
        if (mode == PositionMode::relative) {
            o.relative.share_across_heads = false;
            CausalLanguageModel per_head(5, o, Init{gen, DType::float64});
            CHECK(per_head.parameter_count() == 265);
        }
        if (mode == PositionMode::gated) {
            CHECK(lm.gates() == std::vector<std::vector<double>>{{0.5, 0.5}});
            o.token_gate = true;
            CausalLanguageModel token(5, o, Init{gen, DType::float64});
            CHECK(token.parameter_count() == 295);
            o.token_gate = false;
            o.relative.share_across_heads = false;
            CausalLanguageModel per_head(5, o, Init{gen, DType::float64});
            CHECK(per_head.parameter_count() == 307);
        }
    }
    // counted by hand: tokens 5*4, layer 2*4 + 4*(16+4) + 2*4 + (4*8+8 + 8*4+4), final norm 2*4, head 4*5+5
    CHECK(20 + (8 + 80 + 8 + 76) + 8 + 25 == 225);
    CHECK(225 + 32 * 2 == 289);  // t5: one [t5_buckets, H] table in the one layer
    TransformerOptions o;
    o.dim = 4;
    o.heads = 2;
    o.ff_dim = 8;
    o.layers = 1;
    o.dropout = 0.1;
    o.position = PositionMode::gated;
    o.relative.k_left = o.relative.k_right = 1;
    Generator gen(20);
    SequenceClassifier classifier(5, 2, o, Pooling::mean, Init{gen, DType::float64});
    const Tensor ids = from_vector({1, 2, 3, 4, 0, 0}, {2, 3}, DType::int64);
    gradcheck_layer(
        classifier, {},
        [&](const auto&) {
            return classifier.forward(ids.to(classifier.device()), {3, 1});
        },
        true);
}

// ---------------------------------------------------------------- fused_attention.md

namespace {

// One query row of the online softmax of docs/layers/fused_attention.md: the running max m, the
// running sum l, the output accumulator acc (Dh = 1) and the bucket sums W, for the example's
// x = (1, 0, -1), k = 1, E_K = E_V = (-1, 0, 1). add_keys visits a group of keys as one tile and
// returns its alpha.
struct OnlineRow {
    int i;
    double m = -std::numeric_limits<double>::infinity(), l = 0, acc = 0;
    std::vector<double> w = {0, 0, 0};

    static constexpr double x[3] = {1, 0, -1}, table[3] = {-1, 0, 1};
    static int r(int i, int j) { return std::clamp(j - i, -1, 1) + 1; }
    static double score(int i, int j) { return x[i] * x[j] + x[i] * table[r(i, j)]; }  // c = 1

    double add_keys(const std::vector<int>& keys) {
        double new_max = m;
        for (int j : keys) new_max = std::max(new_max, score(i, j));
        const double alpha = std::isinf(m) ? 0 : std::exp(m - new_max);
        l *= alpha;
        acc *= alpha;
        for (double& bucket : w) bucket *= alpha;
        for (int j : keys) {
            const double p = std::exp(score(i, j) - new_max);
            l += p;
            acc += p * x[j];
            w[r(i, j)] += p;
        }
        m = new_max;
        return alpha;
    }
    double z() const { return (acc + w[0] * table[0] + w[1] * table[1] + w[2] * table[2]) / l; }
    double lse() const { return m + std::log(l); }
};

}  // namespace

TEST_CASE("docs/layers/fused_attention.md: two key groups by hand, the backward and the memory arithmetic") {
    const double inv_e = std::exp(-1.0), e = std::exp(1.0);
    CHECK(inv_e == doctest::Approx(0.367879441171).epsilon(1e-11));
    const double z_printed[3] = {0.844637596503, 0, -0.844637596503};
    const double lse_printed[3] = {1.861994804058, 1.098612288668, 1.861994804058};
    CHECK(std::log(1 + 2 * e) == doctest::Approx(1.861994804058).epsilon(1e-12));
    CHECK(std::log(3.0) == doctest::Approx(1.098612288668).epsilon(1e-12));

    // the table: each row after key 0, m' and alpha of keys {1, 2}, and after them
    struct Expected {
        double m, l, acc;
        std::vector<double> w;
        double m2, alpha, l2, acc2;
        std::vector<double> w2;
    };
    const Expected table[3] = {
        {1, 1, 1, {0, 1, 0}, 1, 1, 2 + inv_e, 1 - inv_e, {0, 1, 1 + inv_e}},
        {0, 1, 1, {1, 0, 0}, 0, 1, 3, 0, {1, 1, 1}},
        {0, 1, 1, {1, 0, 0}, 1, inv_e, 2 + inv_e, inv_e - 1, {1 + inv_e, 1, 0}},
    };
    for (int i = 0; i < 3; ++i) {
        CAPTURE(i);
        const Expected& want = table[i];
        OnlineRow row{i};
        CHECK(row.add_keys({0}) == 0);  // the first visible tile: m was -inf
        CHECK(row.m == want.m);
        CHECK(row.l == doctest::Approx(want.l).epsilon(1e-14));
        CHECK(row.acc == doctest::Approx(want.acc).epsilon(1e-14));
        for (int r = 0; r < 3; ++r) CHECK(row.w[r] == doctest::Approx(want.w[r]).epsilon(1e-14));
        CHECK(row.add_keys({1, 2}) == doctest::Approx(want.alpha).epsilon(1e-14));
        CHECK(row.m == want.m2);
        CHECK(row.l == doctest::Approx(want.l2).epsilon(1e-14));
        CHECK(std::fabs(row.acc - want.acc2) <= 1e-14);
        for (int r = 0; r < 3; ++r) CHECK(row.w[r] == doctest::Approx(want.w2[r]).epsilon(1e-14));
        CHECK(std::fabs(row.z() - z_printed[i]) <= 1e-11);
        CHECK(std::fabs(row.lse() - lse_printed[i]) <= 1e-11);
        // the plain formula: z_i = sum_j a_ij (v_j + E_V[r]), lse_i = log sum_j exp(s_ij)
        double total = 0, weighted = 0;
        for (int j = 0; j < 3; ++j) total += std::exp(OnlineRow::score(i, j));
        for (int j = 0; j < 3; ++j)
            weighted +=
                std::exp(OnlineRow::score(i, j)) / total * (OnlineRow::x[j] + OnlineRow::table[OnlineRow::r(i, j)]);
        CHECK(std::fabs(row.z() - weighted) <= 1e-15);
        CHECK(std::fabs(row.lse() - std::log(total)) <= 1e-15);
    }
    // row 2 in words: 2 + 1/e, 1/e - 1, W . E_V = -(1 + 1/e); a_2 = (1, e, e) / (1 + 2e)
    CHECK(2 + inv_e == doctest::Approx(2.367879441171).epsilon(1e-12));
    CHECK(inv_e - 1 == doctest::Approx(-0.632120558829).epsilon(1e-12));
    CHECK(-(1 + inv_e) == doctest::Approx(-1.367879441171).epsilon(1e-12));
    CHECK(std::fabs(-2 / (2 + inv_e) - z_printed[2]) <= 1e-11);
    const double small = 1 / (1 + 2 * e), big = e / (1 + 2 * e);
    CHECK(std::fabs(small - 0.155362403497) <= 1e-12);
    CHECK(std::fabs(big - 0.422318798252) <= 1e-12);
    CHECK(std::fabs(inv_e / (inv_e + 2) - small) <= 1e-15);
    CHECK(std::fabs(small * (1 - 1) + big * (0 - 1) + big * (-1 + 0) - z_printed[2]) <= 1e-11);

    // the engine's op, forward and backward with dz = (1, 0, 0)
    const Tensor q = param({1, 0, -1}, {1, 1, 3, 1}), k = param({1, 0, -1}, {1, 1, 3, 1}),
                 v = param({1, 0, -1}, {1, 1, 3, 1});
    const Tensor e_k = param({-1, 0, 1}, {1, 3, 1}), e_v = param({-1, 0, 1}, {1, 3, 1});
    const Tensor z = fused_attention(q, k, v, AttentionPattern{}, 1.0, ClippedRelativeTerms{e_k, e_v, 1, 1});
    check_values(z, {z_printed[0], z_printed[1], z_printed[2]}, 1e-11);
    check_values(z, {2 * big, 0, -2 * big});
    z.backward(f64({1, 0, 0}, {1, 1, 3, 1}));
    // row 0 by the page's formulas: D_0 = z_0, dp_0 = (1, 1, 0), ds_0 = p_0 (dp_0 - D_0)
    const double D0 = 2 * big, p0[3] = {big, big, small}, dp0[3] = {1, 1, 0};
    CHECK(std::fabs(D0 - 0.844637596503) <= 1e-11);
    CHECK(std::fabs(p0[0] * dp0[0] + p0[1] * dp0[1] + p0[2] * dp0[2] - D0) <= 1e-15);
    const double ds0[3] = {p0[0] * (dp0[0] - D0), p0[1] * (dp0[1] - D0), p0[2] * (dp0[2] - D0)};
    CHECK(std::fabs(ds0[0] - 0.065612463538) <= 1e-11);
    CHECK(std::fabs(ds0[2] - -0.131224927077) <= 1e-11);
    CHECK(std::fabs(big + small - 0.577681201748) <= 1e-11);                            // P_0[2]
    CHECK(std::fabs(ds0[1] + ds0[2] - -0.065612463538) <= 1e-11);                       // S_0[2]
    CHECK(std::fabs(ds0[0] * 1 + ds0[1] * 0 + ds0[2] * -1 - 0.196837390615) <= 1e-11);  // ds_0 . k
    check_values(e_v.grad(), {0, 0.422318798252, 0.577681201748}, 1e-11);
    check_values(e_v.grad(), {0, big, big + small});
    check_values(e_k.grad(), {0, 0.065612463538, -0.065612463538}, 1e-11);
    check_values(e_k.grad(), {0, ds0[1], ds0[1] + ds0[2]});
    check_values(q.grad(), {0.131224927077, 0, 0}, 1e-11);
    check_values(q.grad(), {ds0[0] - ds0[2] + (ds0[1] + ds0[2]), 0, 0});
    check_values(k.grad(), {0.065612463538, 0.065612463538, -0.131224927077}, 1e-11);
    check_values(v.grad(), {0.422318798252, 0.422318798252, 0.155362403497}, 1e-11);

    // the layer in fused form: attention.md's y and table gradients, and no weights kept
    RelativeOptions o;
    o.k_left = o.k_right = 1;
    Generator gen(21);
    RelativeMultiHeadAttention attention(1, 1, o, AttentionImpl::fused, Init{gen, DType::float64});
    std::vector<Tensor> values = unit_projections();
    values.push_back(param({-1, 0, 1}, {3, 1}));  // E_K
    values.push_back(param({-1, 0, 1}, {3, 1}));  // E_V
    attention.assign_parameters(values);
    const Tensor x = param({1, 0, -1}, {1, 3, 1});
    const Tensor y = attention.forward(x, x);
    CHECK(!attention.last_weights.defined());
    check_values(y, {z_printed[0], z_printed[1], z_printed[2]}, 1e-11);
    y.backward(f64({1, 0, 0}, {1, 3, 1}));
    check_values(attention.rel_pos_emb_v.weight.grad(), {0, 0.422318798252, 0.577681201748}, 1e-11);
    check_values(attention.rel_pos_emb_k.weight.grad(), {0, 0.065612463538, -0.065612463538}, 1e-11);

    // the memory arithmetic, float32 and Dh = 32: B = 8, H = 8, L = 512 and B = 1, H = 8, L = 16384
    const int64_t Dh = 32, MiB = 1 << 20;
    {
        const int64_t B = 8, H = 8, L = 512;
        CHECK(2 * L * L * Dh == 16777216);  // reference: A_K and A_V
        CHECK(B * H * L * L == 16777216);   // bucketed: a
        CHECK(B * H * L == 32768);          // fused: lse
        CHECK(B * H * L * Dh == 1048576);   // z
        CHECK(16777216 * 4 == 64 * MiB);
        CHECK(32768 * 4 == 128 * 1024);
        CHECK(1048576 * 4 == 4 * MiB);
        CHECK(2 * Dh == B * H);
    }
    {
        const int64_t B = 1, H = 8, L = 16384;
        CHECK(2 * L * L * Dh == 17179869184);
        CHECK(B * H * L * L == 2147483648);
        CHECK(B * H * L == 131072);
        CHECK(B * H * L * Dh == 4194304);
        CHECK(17179869184 * 4 == 64 * (int64_t(1) << 30));
        CHECK(2147483648 * 4 == 8 * (int64_t(1) << 30));
        CHECK(131072 * 4 == 512 * 1024);
        CHECK(4194304 * 4 == 16 * MiB);
    }
    gradcheck_layer(attention, {random_input({2, 3, 1}, 14)},
                    [&](const auto& in) { return attention.forward(in[0], in[0]); });
}

// ---------------------------------------------------------------- rope.md

namespace {

// The weights of the four projections: w_q (zero when zero_queries), w_k, w_v, w_o the identity
// [2, 2], every bias 0 (a D = 2 attention layer)
std::vector<Tensor> two_wide_projections(bool zero_queries = false) {
    std::vector<Tensor> values;
    for (int i = 0; i < 4; ++i) {
        values.push_back(i == 0 && zero_queries ? param({0, 0, 0, 0}, {2, 2}) : param({1, 0, 0, 1}, {2, 2}));
        values.push_back(param({0, 0}, {2}));
    }
    return values;
}

const AttentionImpl all_forms[] = {AttentionImpl::reference, AttentionImpl::bucketed, AttentionImpl::fused};

}  // namespace

TEST_CASE("docs/layers/rope.md: a rotation by hand, scores by distance and the inverse rotation in the backward") {
    const double c1 = std::cos(1.0), s1 = std::sin(1.0), c2 = std::cos(2.0), s2 = std::sin(2.0);
    CHECK(std::fabs(c1 - 0.540302305868) <= 1e-12);
    CHECK(std::fabs(s1 - 0.841470984808) <= 1e-12);
    CHECK(std::fabs(c2 - -0.416146836547) <= 1e-12);
    CHECK(std::fabs(s2 - 0.909297426826) <= 1e-12);

    // the angles p theta_t for Dh = 4, base 10000: theta = (1, 1/100), sinusoidal.md's frequencies
    const RopeTables tables = rope_tables(3, 4, 0, 10000, DType::float64);
    check_values(tables.cos, {1, 1, c1, 0.999950000417, c2, 0.999800006667}, 1e-11);
    check_values(tables.sin, {0, 0, s1, 0.009999833334, s2, 0.019998666693}, 1e-11);
    check_values(tables.cos, {1, 1, c1, std::cos(0.01), c2, std::cos(0.02)});

    // the op: x_p rotated by the angle p (Dh = 2); from position 1 on, the same last two rows
    const Tensor x_heads = param({1, 0, 1, 0, 0, 1}, {1, 1, 3, 2});
    const Tensor rotated = rope(x_heads, 0);
    check_values(rotated, {1, 0, c1, s1, -s2, c2});
    check_values(rotated, {1, 0, 0.540302305868, 0.841470984808, -0.909297426826, -0.416146836547}, 1e-11);
    check_values(rope(x_heads.detach().narrow(2, 1, 2), 1), {c1, s1, -s2, c2});
    // its backward rotates by -p: the page's dk' into dk
    rotated.backward(f64({0.046673974553, 0, 0.033721356559, 0, -0.080395331112, 0}, {1, 1, 3, 2}));
    check_values(x_heads.grad(), {0.046673974553, 0, 0.018219726706, -0.028375543113, 0.033456262715, 0.073103267709},
                 1e-11);
    check_values(x_heads.grad().narrow(2, 1, 1), {0.033721356559 * c1, -0.033721356559 * s1}, 1e-12);

    // the layer: D = 2, H = 1 (Dh = 2, c = 1/sqrt 2), identity projections, x = (1, 0), (1, 0), (0, 1)
    const double c = 1 / std::sqrt(2.0);
    const std::vector<double> dots{1, c1, -s2, c1, 1, -s1, -s2, -s1, 1};  // q'_i . k'_j
    std::vector<double> scores;
    for (double d : dots) scores.push_back(c * d);
    check_values(f64(scores, {3, 3}),
                 {0.707106781187, 0.382051424370, -0.642970376624, 0.382051424370, 0.707106781187, -0.595009839529,
                  -0.642970376624, -0.595009839529, 0.707106781187},
                 1e-11);
    const std::vector<double> weights{0.504615308258, 0.364578180837, 0.130806510905,  //
                                      0.362250206638, 0.501393142260, 0.136356651102,  //
                                      0.169294901576, 0.177612233596, 0.653092864828};
    check_values(softmax(f64(scores, {3, 3}), -1), weights, 1e-11);
    for (AttentionImpl impl : all_forms) {
        CAPTURE(attention_impl_name(impl));
        Generator gen(22);
        RotaryMultiHeadAttention attention(2, 1, 10000, impl, Init{gen, DType::float64});
        CHECK(attention.parameter_count() == 24);  // the projections alone
        attention.assign_parameters(two_wide_projections());
        const Tensor x = param({1, 0, 1, 0, 0, 1}, {1, 3, 2});
        const Tensor y = attention.forward(x, x);
        if (impl == AttentionImpl::fused) {
            CHECK(!attention.last_weights.defined());
        } else {
            check_values(attention.last_weights, weights, 1e-11);
        }
        check_values(
            y, {0.869193489095, 0.130806510905, 0.863643348898, 0.136356651102, 0.346907135172, 0.653092864828}, 1e-11);
        check_values(y.narrow(1, 0, 1), {weights[0] + weights[1], weights[2]}, 1e-11);

        y.backward(f64({1, 0, 0, 0, 0, 0}, {1, 3, 2}));
        // dq = dq'_0 at position 0 (no rotation); dk_j = Rot(-j) dk'_j; W_q, W_k = I so dW = dq^T x, dk^T x
        check_values(attention.w_q.weight.grad(), {0.137996968968, 0, 0.061831805828, 0}, 1e-11);
        check_values(attention.w_k.weight.grad(),
                     {0.046673974553 + 0.018219726706, 0.033456262715, -0.028375543113, 0.073103267709}, 1e-11);
        check_values(attention.w_k.bias.grad(),
                     {0.046673974553 + 0.018219726706 + 0.033456262715, -0.028375543113 + 0.073103267709}, 1e-11);
        check_values(x.grad(),
                     {0.689286251779, 0.061831805828, 0.382797907543, -0.028375543113, 0.164262773621, 0.073103267709},
                     1e-11);
        gradcheck_layer(attention, {random_input({2, 3, 2}, 15)},
                        [&](const auto& in) { return attention.forward(in[0], in[0]); });
    }
    // ds_0 = a_0 (da_0 - y_00) with da_0 = (1, 1, 0), and dq'_0 = c sum_j ds_0j k'_j
    const double y00 = weights[0] + weights[1];
    const double ds0[3] = {weights[0] * (1 - y00), weights[1] * (1 - y00), weights[2] * (0 - y00)};
    CHECK(std::fabs(ds0[0] - 0.066006967823) <= 1e-11);
    CHECK(std::fabs(ds0[1] - 0.047689199787) <= 1e-11);
    CHECK(std::fabs(ds0[2] - -0.113696167610) <= 1e-11);
    CHECK(std::fabs(c * (ds0[0] + ds0[1] * c1 - ds0[2] * s2) - 0.137996968968) <= 1e-11);
    CHECK(std::fabs(c * (ds0[1] * s1 + ds0[2] * c2) - 0.061831805828) <= 1e-11);
    CHECK(std::fabs(c * ds0[0] - 0.046673974553) <= 1e-11);  // dk'_j = c ds_0j q'_0, q'_0 = (1, 0)
    CHECK(std::fabs(c * ds0[1] - 0.033721356559) <= 1e-11);
    CHECK(std::fabs(c * ds0[2] - -0.080395331112) <= 1e-11);
    // float32 numbers near 10^5 are 2^-7 apart (the angles of "Where relgrad differs")
    CHECK(std::nextafter(1e5f, 2e5f) - 1e5f == 0.0078125f);
}

// ---------------------------------------------------------------- alibi.md

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

// ---------------------------------------------------------------- t5_bias.md

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
