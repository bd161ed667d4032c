// Masks, multi-head attention, relative attention (reference = bucketed = fused), gated mixing.
// One file: the tests of layers/attention.hpp, as tests/layers/ has one program per layer family.
#include <algorithm>
#include <limits>

#include "engine/autograd.hpp"
#include "layer_check.hpp"
#include "layers/attention.hpp"

using namespace relgrad;
using namespace relgrad::testing;

TEST_CASE("masks: padding, causal, local window and their combination") {
    check_values(key_padding_mask({2, 0}, 3), {1, 1, 0, 0, 0, 0});
    CHECK(key_padding_mask({2, 0}, 3).shape() == Shape{2, 1, 1, 3});
    check_values(key_padding_mask(from_vector({1, 0, 3, 0}, {2, 2}, DType::float32)), {1, 0, 1, 0});
    check_values(causal_mask(3, 3), {1, 0, 0, 1, 1, 0, 1, 1, 1});
    check_values(causal_mask(2, 4, 2), {1, 1, 1, 0, 1, 1, 1, 1});  // queries at positions 2, 3
    check_values(local_window_mask(4, 4, 1), {1, 1, 0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 1, 1});
    check_values(combine_masks(causal_mask(3, 3), local_window_mask(3, 3, 1)), {1, 0, 0, 1, 1, 0, 0, 1, 1});
    CHECK(combine_masks(Tensor(), causal_mask(2, 2)).to_vector() == causal_mask(2, 2).to_vector());
    CHECK_THROWS_AS(key_padding_mask({4}, 3), std::invalid_argument);
    CHECK_THROWS_AS(local_window_mask(2, 2, -1), std::invalid_argument);
}

namespace {

const std::vector<std::pair<std::string, Tensor>> masks_for(int64_t B, int64_t L) {
    std::vector<int64_t> lengths;
    for (int64_t b = 0; b < B; ++b) lengths.push_back(b == 1 ? 0 : L - b);  // row 1 is fully masked
    const Tensor padding = key_padding_mask(lengths, L);
    return {{"none", Tensor()},
            {"padding", padding},
            {"causal", causal_mask(L, L)},
            {"window", local_window_mask(L, L, 1)},
            {"all", combine_masks(combine_masks(padding, causal_mask(L, L)), local_window_mask(L, L, 2))}};
}

// mask moved to device, for a layer that may live elsewhere; "none" (an undefined Tensor) stays none
Tensor mask_on(const Tensor& mask, Device device) { return mask.defined() ? mask.to(device) : mask; }

// Three modules built from the same seed, one per implementation.
struct Trio {
    Generator g1, g2, g3;
    RelativeMultiHeadAttention reference, bucketed, fused;
    Trio(int64_t dim, int64_t heads, const RelativeOptions& o)
        : g1(11),
          g2(11),
          g3(11),
          reference(dim, heads, o, AttentionImpl::reference, Init{g1, DType::float64}),
          bucketed(dim, heads, o, AttentionImpl::bucketed, Init{g2, DType::float64}),
          fused(dim, heads, o, AttentionImpl::fused, Init{g3, DType::float64}) {}
};

// The output and the gradients of the input and of every parameter, for the cotangent dy.
std::vector<Tensor> output_and_grads(MultiHeadAttention& layer, const Tensor& x, const Tensor& dy, const Tensor& mask) {
    Tensor input = x.detach().requires_grad_(true);
    layer.zero_grad();
    const Tensor y = layer.forward(input, input, mask);
    y.backward(dy);
    std::vector<Tensor> result = {y, input.grad()};
    for (const Tensor& p : layer.parameters()) result.push_back(p.grad());
    return result;
}

}  // namespace

TEST_CASE("reference, bucketed and fused relative attention agree to 1e-12: outputs and every gradient") {
    struct Case {
        int64_t dim, heads, batch, length, k_left, k_right;
        bool shared;
    };
    for (const Case& c : {Case{6, 2, 3, 5, 2, 2, true}, Case{6, 3, 2, 7, 1, 3, false}, Case{4, 1, 1, 1, 2, 2, true},
                          Case{9, 3, 3, 4, 6, 6, false}, Case{5, 5, 2, 6, 0, 0, true}}) {
        RelativeOptions o;
        o.k_left = c.k_left;
        o.k_right = c.k_right;
        o.share_across_heads = c.shared;
        Trio trio(c.dim, c.heads, o);
        for (const auto& [mask_name, mask] : masks_for(c.batch, c.length)) {
            CAPTURE(mask_name);
            CAPTURE(c.length);
            const Tensor x = random_input({c.batch, c.length, c.dim}, 3);
            const Tensor dy = random_input({c.batch, c.length, c.dim}, 4).detach();
            const std::vector<Tensor> expected = output_and_grads(trio.reference, x, dy, mask);
            for (RelativeMultiHeadAttention* layer : {&trio.bucketed, &trio.fused}) {
                CAPTURE(attention_impl_name(layer->impl));
                const std::vector<Tensor> got = output_and_grads(*layer, x, dy, mask);
                REQUIRE(got.size() == expected.size());
                for (std::size_t n = 0; n < got.size(); ++n) CHECK(max_difference(got[n], expected[n]) <= 1e-12);
                for (double v : got[1].to_vector()) REQUIRE(std::isfinite(v));
            }
        }
    }
}

TEST_CASE("the layer's causal and window rules equal the same masks given to forward, in every form") {
    RelativeOptions o;
    o.k_left = 2;
    o.k_right = 1;
    Trio trio(6, 2, o);
    const Tensor x = random_input({2, 7, 6}, 5);
    const Tensor dy = random_input({2, 7, 6}, 6).detach();
    const Tensor padding = key_padding_mask({7, 4}, 7);
    for (RelativeMultiHeadAttention* layer : {&trio.reference, &trio.bucketed, &trio.fused}) {
        CAPTURE(attention_impl_name(layer->impl));
        const Tensor as_mask = combine_masks(padding, combine_masks(causal_mask(7, 7), local_window_mask(7, 7, 2)));
        const std::vector<Tensor> expected = output_and_grads(*layer, x, dy, as_mask);
        layer->causal = true;
        layer->window = 2;
        const std::vector<Tensor> got = output_and_grads(*layer, x, dy, padding);
        layer->causal = false;
        layer->window = -1;
        for (std::size_t n = 0; n < got.size(); ++n) CHECK(max_difference(got[n], expected[n]) <= 1e-13);
    }
    CHECK(parse_attention_impl("fused") == AttentionImpl::fused);
    CHECK_THROWS_WITH_AS(parse_attention_impl("flash"),
                         "unknown attention implementation 'flash' (expected reference, bucketed or fused)",
                         std::invalid_argument);
}

TEST_CASE("relative attention with zero tables is plain attention; a fully masked query gives b_o") {
    Generator g1(5), g2(5);
    MultiHeadAttention plain(6, 2, Init{g1, DType::float64});
    RelativeMultiHeadAttention relative(6, 2, RelativeOptions{}, AttentionImpl::bucketed, Init{g2, DType::float64});
    std::vector<Tensor> values = plain.parameters();
    values.push_back(zeros(relative.rel_pos_emb_k.weight.shape(), DType::float64));
    values.push_back(zeros(relative.rel_pos_emb_v.weight.shape(), DType::float64));
    relative.assign_parameters(values);
    const Tensor x = random_input({2, 5, 6}, 7);
    const Tensor mask = key_padding_mask({5, 0}, 5);
    CHECK(max_difference(plain.forward(x, x, mask), relative.forward(x, x, mask)) <= 1e-14);
    const Tensor y = plain.forward(x, x, mask);
    check_values(y.narrow(0, 1, 1).narrow(1, 2, 1), plain.w_o.bias.to_vector());  // no key: z = 0, y = b_o
    check_values(sum(plain.last_weights.narrow(0, 0, 1), {-1}), std::vector<double>(10, 1.0), 1e-14);
    CHECK_THROWS_AS(plain.forward(x, x, key_padding_mask({5, 5, 5}, 5)), std::invalid_argument);
    CHECK_THROWS_AS(plain.forward(random_input({2, 5, 4}, 1), x), std::invalid_argument);
    CHECK_THROWS_AS(MultiHeadAttention(6, 4, Init{g1}), std::invalid_argument);
}

TEST_CASE("attention gradient checks: every implementation, every mask, L = 1, k >= L") {
    Generator gen(8);
    const Init init{gen, DType::float64};
    MultiHeadAttention plain(6, 3, init);
    for (const auto& [name, mask] : masks_for(2, 3)) {
        CAPTURE(name);
        gradcheck_layer(plain, {random_input({2, 3, 6}, 1)},
                        [&](const auto& in) { return plain.forward(in[0], in[0], mask_on(mask, plain.device())); });
    }
    RelativeOptions o;
    o.k_left = 1;
    o.k_right = 2;
    o.share_across_heads = false;
    for (AttentionImpl impl : {AttentionImpl::reference, AttentionImpl::bucketed, AttentionImpl::fused}) {
        CAPTURE(attention_impl_name(impl));
        RelativeMultiHeadAttention relative(6, 2, o, impl, init);
        for (const auto& [name, mask] : masks_for(2, 4)) {
            CAPTURE(name);
            gradcheck_layer(relative, {random_input({2, 4, 6}, 2)}, [&](const auto& in) {
                return relative.forward(in[0], in[0], mask_on(mask, relative.device()));
            });
        }
        gradcheck_layer(relative, {random_input({1, 1, 6}, 3)},
                        [&](const auto& in) { return relative.forward(in[0], in[0]); });
    }
    RelativeOptions wide;
    wide.k_left = wide.k_right = 7;  // k >= L
    for (AttentionImpl impl : {AttentionImpl::bucketed, AttentionImpl::fused}) {
        RelativeMultiHeadAttention relative(4, 2, wide, impl, init);
        gradcheck_layer(relative, {random_input({2, 3, 4}, 4), random_input({2, 5, 4}, 5)},
                        [&](const auto& in) { return relative.forward(in[0], in[1]); });  // Lq != Lk
    }
}

TEST_CASE("gated attention: gradient checks, and the gate moves between absolute and relative") {
    Generator gen(9);
    const Init init{gen, DType::float64};
    RelativeOptions o;
    o.k_left = o.k_right = 2;
    for (bool token_gate : {false, true}) {
        GatedPositionAttention gated(6, 2, o, AttentionImpl::bucketed, token_gate, init);
        for (const auto& [name, mask] : masks_for(2, 4)) {
            CAPTURE(name);
            gradcheck_layer(gated, {random_input({2, 4, 6}, 6)},
                            [&](const auto& in) { return gated.forward(in[0], in[0], mask_on(mask, gated.device())); });
        }
    }
    Generator g1(10), g2(10);
    GatedPositionAttention gated(6, 2, o, AttentionImpl::bucketed, false, Init{g1, DType::float64});
    RelativeMultiHeadAttention relative(6, 2, o, AttentionImpl::bucketed, Init{g2, DType::float64});
    CHECK(gated.gate_values() == std::vector<double>{0.5, 0.5});
    const Tensor x = random_input({2, 5, 6}, 11);
    // lambda = +40: g = 1 - 4e-18, Shaw's relative attention with the same weights
    std::vector<Tensor> values = gated.parameters();
    values[0] = full({2}, 40.0, DType::float64);
    gated.assign_parameters(values);
    std::vector<Tensor> shared_weights(values.begin() + 1, values.begin() + 11);  // w_q ... rel_pos_emb_v
    relative.assign_parameters(shared_weights);
    CHECK(max_difference(gated.forward(x, x), relative.forward(x, x)) <= 1e-12);
    // lambda = -40: g = 4e-18, the relative tables no longer matter (absolute attention)
    values[0] = full({2}, -40.0, DType::float64);
    gated.assign_parameters(values);
    const Tensor absolute = gated.forward(x, x);
    values[9] = values[9] * 3.0;
    values[10] = values[10] - 1.0;
    gated.assign_parameters(values);
    CHECK(max_difference(gated.forward(x, x), absolute) <= 1e-12);
    // the gates are plain numbers, readable after a training step
    Generator g3(12);
    GatedPositionAttention fresh(6, 2, o, AttentionImpl::bucketed, false, Init{g3, DType::float64});
    sum(mul(fresh.forward(x, x), x)).backward();
    values = fresh.parameters();
    const std::vector<double> step = sub(fresh.gate, fresh.gate.grad()).to_vector();
    values[0] = from_vector(step, {2}, DType::float64);
    fresh.assign_parameters(values);
    for (int h = 0; h < 2; ++h) {
        CHECK(step[h] != 0);
        CHECK(fresh.gate_values()[h] == doctest::Approx(1 / (1 + std::exp(-step[h]))));
    }
}

TEST_CASE("low-rank relative tables: E = A B in every form, gradient-checked") {
    Generator gen(21);
    const Init init{gen, DType::float64};
    RelativeOptions o;
    o.k_left = 2;
    o.k_right = 1;
    o.rank = 2;
    for (bool shared : {true, false}) {
        CAPTURE(shared);
        o.share_across_heads = shared;
        RelativeMultiHeadAttention reference(6, 2, o, AttentionImpl::reference, init);
        RelativePositionEmbedding& table = reference.rel_pos_emb_k;
        CHECK(!table.weight.defined());
        CHECK(table.weight_a.shape() == Shape{4, 2});
        CHECK(table.weight_b.shape() == Shape{2, shared ? 3 : 6});
        check_values(table.full_weight(), matmul(table.weight_a, table.weight_b).to_vector(), 0.0);
        std::vector<std::string> names;
        for (const auto& [name, p] : reference.named_parameters()) names.push_back(name);
        CHECK(std::count(names.begin(), names.end(), "rel_pos_emb_v.weight_b") == 1);
        // the other two forms, with the same parameters, agree with the reference
        RelativeMultiHeadAttention bucketed(6, 2, o, AttentionImpl::bucketed, init),
            fused(6, 2, o, AttentionImpl::fused, init);
        bucketed.assign_parameters(reference.parameters());
        fused.assign_parameters(reference.parameters());
        const Tensor x = random_input({2, 5, 6}, 8), dy = random_input({2, 5, 6}, 9).detach();
        const Tensor mask = key_padding_mask({5, 3}, 5);
        const std::vector<Tensor> expected = output_and_grads(reference, x, dy, mask);
        for (MultiHeadAttention* layer :
             {static_cast<MultiHeadAttention*>(&bucketed), static_cast<MultiHeadAttention*>(&fused)}) {
            const std::vector<Tensor> got = output_and_grads(*layer, x, dy, mask);
            for (std::size_t n = 0; n < got.size(); ++n) CHECK(max_difference(got[n], expected[n]) <= 1e-12);
        }
        for (RelativeMultiHeadAttention* layer : {&reference, &bucketed, &fused}) {
            CAPTURE(attention_impl_name(layer->impl));
            gradcheck_layer(*layer, {random_input({2, 4, 6}, 10)}, [&](const auto& in) {
                return layer->forward(in[0], in[0], causal_mask(4, 4, 0, layer->device()));
            });
        }
    }
    // the product starts with the full table's spread: entries of std 0.02
    RelativeOptions wide;
    wide.k_left = wide.k_right = 200;
    wide.rank = 4;
    RelativePositionEmbedding big(64, 1, wide, init);
    const std::vector<double> entries = big.full_weight().to_vector();
    double square_sum = 0;
    for (double e : entries) square_sum += e * e;
    CHECK(std::sqrt(square_sum / static_cast<double>(entries.size())) == doctest::Approx(0.02).epsilon(0.15));
    wide.rank = -1;
    CHECK_THROWS_WITH_AS(RelativePositionEmbedding(4, 1, wide, init),
                         "RelativePositionEmbedding: rank must be >= 0 (0: full rank)", std::invalid_argument);
}

TEST_CASE("the key-side term alone (values = false): E_V is no parameter, the same as E_V = 0, in every form") {
    Generator gen(23);
    const Init init{gen, DType::float64};
    RelativeOptions o;
    o.k_left = 2;
    o.k_right = 1;
    for (bool shared : {true, false}) {
        CAPTURE(shared);
        o.share_across_heads = shared;
        o.values = true;
        RelativeMultiHeadAttention both(6, 2, o, AttentionImpl::reference, init);
        o.values = false;
        RelativeMultiHeadAttention reference(6, 2, o, AttentionImpl::reference, init),
            bucketed(6, 2, o, AttentionImpl::bucketed, init), fused(6, 2, o, AttentionImpl::fused, init);
        std::vector<std::string> names;
        for (const auto& [name, p] : reference.named_parameters()) names.push_back(name);
        CHECK(std::count(names.begin(), names.end(), "rel_pos_emb_k.weight") == 1);
        CHECK(std::count(names.begin(), names.end(), "rel_pos_emb_v.weight") == 0);
        // with both terms and a zero E_V, the layer computes what the key side alone computes
        std::vector<Tensor> values = reference.parameters();
        values.push_back(zeros(both.rel_pos_emb_v.weight.shape(), DType::float64));
        both.assign_parameters(values);
        bucketed.assign_parameters(reference.parameters());
        fused.assign_parameters(reference.parameters());
        const Tensor x = random_input({2, 5, 6}, 8), dy = random_input({2, 5, 6}, 9).detach();
        const Tensor mask = key_padding_mask({5, 3}, 5);
        const Tensor expected = both.forward(x, x, mask);
        for (RelativeMultiHeadAttention* layer : {&reference, &bucketed, &fused}) {
            CAPTURE(attention_impl_name(layer->impl));
            CHECK(max_difference(layer->forward(x, x, mask), expected) <= 1e-12);
            if (!shared) continue;  // gradient-checked once: per head differs only in the zero table's shape
            gradcheck_layer(*layer, {random_input({2, 4, 6}, 10)}, [&](const auto& in) {
                return layer->forward(in[0], in[0], causal_mask(4, 4, 0, layer->device()));
            });
        }
    }
}

// ---------------------------------------------------------------- the relative family

namespace {

enum class Family { rope, alibi, t5, t5_causal };
const char* family_name(Family f) {
    return f == Family::rope ? "rope" : f == Family::alibi ? "alibi" : f == Family::t5 ? "t5" : "t5 causal";
}

// A layer of the family in one form, from the seed 11 (so the forms share their parameters).
std::unique_ptr<MultiHeadAttention> family_layer(Family f, int64_t dim, int64_t heads, AttentionImpl impl,
                                                 Generator& gen) {
    const Init init{gen, DType::float64};
    RelativeFamilyOptions o;
    o.rope_base = 100;  // angles that turn visibly over a few positions
    o.t5_buckets = 8;   // exact distances up to 2 (bidirectional) or 4 (causal), log buckets to 6
    o.t5_max_distance = 6;
    switch (f) {
        case Family::rope: return std::make_unique<RotaryMultiHeadAttention>(dim, heads, o.rope_base, impl, init);
        case Family::alibi: return std::make_unique<AlibiAttention>(dim, heads, impl, init);
        case Family::t5: return std::make_unique<T5BiasAttention>(dim, heads, o, true, impl, init);
        case Family::t5_causal: return std::make_unique<T5BiasAttention>(dim, heads, o, false, impl, init);
    }
    return nullptr;
}

// the output and every gradient, with queries x at positions query_offset.. and keys kv from 0
std::vector<Tensor> offset_output_and_grads(MultiHeadAttention& layer, const Tensor& x, const Tensor& kv,
                                            const Tensor& dy, const Tensor& mask, int64_t query_offset) {
    Tensor input = x.detach().requires_grad_(true), keys = kv.detach().requires_grad_(true);
    layer.zero_grad();
    const Tensor y = layer.forward(input, keys, mask, query_offset);
    y.backward(dy);
    std::vector<Tensor> result = {y, input.grad(), keys.grad()};
    for (const Tensor& p : layer.parameters()) result.push_back(p.grad());
    return result;
}

}  // namespace

TEST_CASE("RoPE, ALiBi and T5's bias: reference, bucketed and fused agree to 1e-12, offsets and masked rows too") {
    for (Family f : {Family::rope, Family::alibi, Family::t5, Family::t5_causal}) {
        CAPTURE(family_name(f));
        std::unique_ptr<MultiHeadAttention> forms[3];
        const AttentionImpl impls[3] = {AttentionImpl::reference, AttentionImpl::bucketed, AttentionImpl::fused};
        for (int n = 0; n < 3; ++n) {
            Generator gen(11);
            forms[n] = family_layer(f, 12, 3, impls[n], gen);  // 3 heads: ALiBi's slopes beyond a power of two
        }
        // self-attention under every mask (row 1 sees no key in padding and all)
        for (const auto& [mask_name, mask] : masks_for(3, 9)) {
            CAPTURE(mask_name);
            const Tensor x = random_input({3, 9, 12}, 3);
            const Tensor dy = random_input({3, 9, 12}, 4).detach();
            const std::vector<Tensor> expected = output_and_grads(*forms[0], x, dy, mask);
            for (int n = 1; n < 3; ++n) {
                CAPTURE(attention_impl_name(impls[n]));
                const std::vector<Tensor> got = output_and_grads(*forms[n], x, dy, mask);
                REQUIRE(got.size() == expected.size());
                for (std::size_t e = 0; e < got.size(); ++e) CHECK(max_difference(got[e], expected[e]) <= 1e-12);
            }
        }
        // 4 queries at positions 5..8 of 9 keys, under the causal rule
        const Tensor x = random_input({2, 4, 12}, 5), kv = random_input({2, 9, 12}, 6);
        const Tensor dy = random_input({2, 4, 12}, 7).detach();
        const Tensor causal = causal_mask(4, 9, 5);
        const std::vector<Tensor> expected = offset_output_and_grads(*forms[0], x, kv, dy, causal, 5);
        for (int n = 1; n < 3; ++n) {
            CAPTURE(attention_impl_name(impls[n]));
            const std::vector<Tensor> got = offset_output_and_grads(*forms[n], x, kv, dy, causal, 5);
            for (std::size_t e = 0; e < got.size(); ++e) CHECK(max_difference(got[e], expected[e]) <= 1e-12);
        }
    }
}

TEST_CASE("RoPE, ALiBi and T5's bias: gradient checks in every form and on every device") {
    for (Family f : {Family::rope, Family::alibi, Family::t5, Family::t5_causal}) {
        for (AttentionImpl impl : {AttentionImpl::reference, AttentionImpl::bucketed, AttentionImpl::fused}) {
            CAPTURE(family_name(f));
            CAPTURE(attention_impl_name(impl));
            Generator gen(12);
            std::unique_ptr<MultiHeadAttention> layer = family_layer(f, 6, 3, impl, gen);
            const Tensor mask = masks_for(2, 7).back().second;  // padding, causal and a window
            gradcheck_layer(*layer, {random_input({2, 7, 6}, 1)}, [&](const auto& in) {
                return layer->forward(in[0], in[0], mask_on(mask, layer->device()));
            });
            gradcheck_layer(*layer, {random_input({1, 2, 6}, 2), random_input({1, 5, 6}, 3)},
                            [&](const auto& in) { return layer->forward(in[0], in[1], Tensor(), 3); });  // an offset
        }
    }
}

TEST_CASE("RoPE: rotated q . k depends on j - i alone, and the rotation keeps lengths") {
    const Tensor q = random_input({1, 1, 1, 8}, 1).detach(), k = random_input({1, 1, 1, 8}, 2).detach();
    // q at position i, k at position j: the same product for every (i, j) with j - i = 3
    std::vector<double> products;
    for (int64_t i : {0, 2, 7, 40}) products.push_back(sum(mul(rope(q, i), rope(k, i + 3))).item());
    for (double p : products) CHECK(std::fabs(p - products[0]) <= 1e-12);
    CHECK(std::fabs(sum(mul(rope(q, 0), rope(k, 0))).item() - sum(mul(q, k)).item()) <= 1e-12);  // p = 0: q . k
    CHECK(std::fabs(sum(mul(rope(q, 9), rope(q, 9))).item() - sum(mul(q, q)).item()) <= 1e-12);
    // pair t = 0 of position 1 turns by theta_0 = 1 radian: (1, 0) -> (cos 1, sin 1)
    check_values(rope(from_vector({1, 0, 0, 0}, {1, 4}, DType::float64), 1).narrow(1, 0, 2),
                 {std::cos(1.0), std::sin(1.0)}, 1e-15);
    CHECK_THROWS_WITH_AS(rope(random_input({2, 3}, 1), 0), "rope: x [2, 3] must be [..., L, Dh] with Dh even",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(rope(q, -1),
                         "rope: first position -1 must be in [0, 2^40 - L] = [0, 1099511627775] for L = 1 positions",
                         std::invalid_argument);
    CHECK_THROWS_AS(rope(q, std::numeric_limits<int64_t>::max()), std::invalid_argument);  // p + l would overflow
    CHECK_THROWS_AS(rope(q, 0, 0.0), std::invalid_argument);
    Generator gen(1);
    CHECK_THROWS_WITH_AS(
        RotaryMultiHeadAttention(6, 2, 10000, AttentionImpl::fused, Init{gen}),
        "RotaryMultiHeadAttention: dim = 6, heads = 2: expected heads such that the head dim dim / heads is even "
        "(RoPE rotates pairs)",
        std::invalid_argument);
}

TEST_CASE("ALiBi's slopes and T5's buckets, as the papers' code computes them") {
    // a power of two: 2^(-8h/H); 6 heads: the 4 of H = 4, then every other one of H = 8
    check_values(from_vector(alibi_slopes(8), {8}, DType::float64),
                 {1.0 / 2, 1.0 / 4, 1.0 / 8, 1.0 / 16, 1.0 / 32, 1.0 / 64, 1.0 / 128, 1.0 / 256}, 0);
    check_values(from_vector(alibi_slopes(6), {6}, DType::float64),
                 {1.0 / 4, 1.0 / 16, 1.0 / 64, 1.0 / 256, 1.0 / 2, 1.0 / 8}, 0);
    check_values(from_vector(alibi_slopes(1), {1}, DType::float64), {1.0 / 256}, 0);
    // bidirectional, 32 buckets to 128: 16 a side, exact below 8, then 8 + floor(log(n/8)/log(16) * 8)
    // (n = 20: log 2.5 / log 16 * 8 = 2.64)
    CHECK(t5_bucket(0, true, 32, 128) == 0);
    CHECK(t5_bucket(-7, true, 32, 128) == 7);
    CHECK(t5_bucket(1, true, 32, 128) == 17);
    CHECK(t5_bucket(-8, true, 32, 128) == 8);
    CHECK(t5_bucket(-20, true, 32, 128) == 10);
    CHECK(t5_bucket(20, true, 32, 128) == 26);
    CHECK(t5_bucket(-500, true, 32, 128) == 15);
    CHECK(t5_bucket(500, true, 32, 128) == 31);
    // causal: keys after the query in bucket 0, exact below 16, then 16 + floor(log(n/16)/log(8) * 16)
    // (n = 40: log 2.5 / log 8 * 16 = 7.05)
    CHECK(t5_bucket(5, false, 32, 128) == 0);
    CHECK(t5_bucket(-3, false, 32, 128) == 3);
    CHECK(t5_bucket(-40, false, 32, 128) == 23);
    CHECK(t5_bucket(-1000, false, 32, 128) == 31);
    Generator gen(2);
    RelativeFamilyOptions bad;
    bad.t5_max_distance = 16;  // not above t5_buckets / 2
    CHECK_THROWS_AS(T5BiasAttention(6, 2, bad, true, AttentionImpl::bucketed, Init{gen}), std::invalid_argument);
}

TEST_CASE("ALiBi adds no parameters; T5's table is relative_attention_bias.weight [buckets, H]") {
    Generator gen(3);
    AlibiAttention alibi(6, 3, AttentionImpl::fused, Init{gen});
    CHECK(alibi.named_parameters().size() == MultiHeadAttention(6, 3, Init{gen}).named_parameters().size());
    T5BiasAttention t5(6, 3, RelativeFamilyOptions{}, true, AttentionImpl::fused, Init{gen});
    bool found = false;
    for (const auto& [name, p] : t5.named_parameters()) {
        if (name == "relative_attention_bias.weight") found = p.shape() == Shape{32, 3};
    }
    CHECK(found);
    // another layer reading that table owns no parameter of its own
    T5BiasAttention sharing(6, 3, RelativeFamilyOptions{}, true, AttentionImpl::fused, Init{gen}, &t5.table());
    CHECK(sharing.named_parameters().size() == alibi.named_parameters().size());
}

TEST_CASE("score parts: content + position is the layer's own score, in every scheme, and the value share") {
    // What the explorer shows: the weights rebuilt from the two parts, each part against its own
    // definition, computed here without the layer's scores().
    const int64_t B = 2, L = 6, D = 12, H = 3;
    const Tensor x = random_input({B, L, D}, 21).detach();
    const Tensor padding = key_padding_mask({L, L - 2}, L);
    std::vector<std::pair<std::string, std::unique_ptr<MultiHeadAttention>>> layers;
    Generator gen(31);
    const Init init{gen, DType::float64};
    RelativeOptions shaw;
    shaw.k_left = shaw.k_right = 2;
    shaw.share_across_heads = false;
    RelativeOptions key_side = shaw;
    key_side.values = false;
    layers.emplace_back("plain", std::make_unique<MultiHeadAttention>(D, H, init));
    layers.emplace_back("shaw",
                        std::make_unique<RelativeMultiHeadAttention>(D, H, shaw, AttentionImpl::bucketed, init));
    layers.emplace_back("shaw reference",
                        std::make_unique<RelativeMultiHeadAttention>(D, H, shaw, AttentionImpl::reference, init));
    layers.emplace_back("shaw key side",
                        std::make_unique<RelativeMultiHeadAttention>(D, H, key_side, AttentionImpl::bucketed, init));
    layers.emplace_back("gated",
                        std::make_unique<GatedPositionAttention>(D, H, shaw, AttentionImpl::bucketed, true, init));
    for (Family f : {Family::rope, Family::alibi, Family::t5, Family::t5_causal})
        layers.emplace_back(family_name(f), family_layer(f, D, H, AttentionImpl::bucketed, gen));

    // the token gate from random weights, so that it differs from token to token
    auto& gated_layer = dynamic_cast<GatedPositionAttention&>(*layers[4].second);
    gated_layer.w_gate->assign_parameters({mul(randn({H, D}, gen, DType::float64), scalar(0.5, DType::float64))});
    for (auto& [name, layer] : layers) {
        CAPTURE(name);
        layer->eval();
        layer->causal = name == "t5 causal";
        NoGradGuard no_grad;
        layer->forward(x, x, padding);
        CHECK_FALSE(layer->last_score_parts.content.defined());  // kept only when asked
        layer->keep_score_parts = true;
        layer->forward(x, x, padding);
        const MultiHeadAttention::ScoreParts& parts = layer->last_score_parts;
        const double scale = 1 / std::sqrt(static_cast<double>(D / H));
        const auto heads_of = [&](const Tensor& y) { return y.reshape({B, L, H, D / H}).transpose(1, 2); };
        const Tensor q0 = heads_of(layer->w_q.forward(x)), k0 = heads_of(layer->w_k.forward(x));
        // content: the projected q . k / sqrt(Dh)
        CHECK(max_difference(parts.content, mul(matmul(q0, k0.transpose(-1, -2)), scalar(scale, DType::float64))) <=
              1e-12);
        // softmax over the allowed keys of content + position: the weights the layer attended with
        const Tensor rebuilt =
            softmax(where(parts.mask, add(parts.content, parts.position), scalar(-INFINITY, DType::float64)), -1);
        CHECK(max_difference(rebuilt, layer->last_weights) <= 1e-12);
        // position against each scheme's definition
        if (name == "plain") CHECK(max_difference(parts.position, zeros_like(parts.position)) == 0);
        if (name == "rope") {
            const Tensor rotated = matmul(rope(q0, 0, 100), rope(k0, 0, 100).transpose(-1, -2));
            CHECK(max_difference(add(parts.content, parts.position), mul(rotated, scalar(scale, DType::float64))) <=
                  1e-12);
        }
        const auto* relative = dynamic_cast<RelativeMultiHeadAttention*>(layer.get());
        if (relative && name != "gated") {  // Shaw's q_i . E_K[r(i, j)] / sqrt(Dh), from the [H, L, L, Dh] lookup
            const Tensor table = relative->rel_pos_emb_k.lookup(L, L);
            const Tensor expected =
                mul(sum(mul(q0.unsqueeze(3), table.unsqueeze(0)), {-1}), scalar(scale, DType::float64));
            CHECK(max_difference(parts.position, expected) <= 1e-12);
        }
        if (name == "t5" || name == "t5 causal") {  // W[bucket(j - i), h]
            const auto& t5 = dynamic_cast<T5BiasAttention&>(*layer);
            const std::vector<double> table = t5.table().weight.to_vector(), position = parts.position.to_vector();
            for (int64_t h = 0; h < H; ++h)
                for (int64_t i = 0; i < L; ++i)
                    for (int64_t j = 0; j < L; ++j)
                        CHECK(position[(h * L + i) * L + j] ==
                              doctest::Approx(
                                  table[t5_bucket(j - i, t5.bidirectional, t5.num_buckets, t5.max_distance) * H + h])
                                  .epsilon(1e-12));
        }
        if (name == "alibi") {
            const std::vector<double> slopes = alibi_slopes(H), position = parts.position.to_vector();
            for (int64_t h = 0; h < H; ++h)
                for (int64_t i = 0; i < L; ++i)
                    for (int64_t j = 0; j < L; ++j)
                        CHECK(position[(h * L + i) * L + j] ==
                              doctest::Approx(-slopes[h] * std::abs(j - i)).epsilon(1e-12));
        }
        // the token gate: sigmoid(lambda_h + x_i W_g^T), defined for the gated layer alone
        REQUIRE(parts.gate.defined() == (name == "gated"));
        Tensor gate;
        if (name == "gated") {
            gate = sigmoid(add(gated_layer.gate.reshape({1, H, 1, 1}),
                               matmul(x, gated_layer.w_gate->weight.transpose(0, 1)).transpose(1, 2).unsqueeze(-1)));
            CHECK(parts.gate.shape() == Shape{B, H, L, 1});
            CHECK(max_difference(parts.gate, gate) <= 1e-15);
            const std::vector<double> g = gate.to_vector();
            CHECK(*std::max_element(g.begin(), g.end()) - *std::min_element(g.begin(), g.end()) > 0.1);
        }
        // the value share: |g sum_j a_ij E_V[r]| / (|sum_j a_ij v_j| + |g sum_j a_ij E_V[r]|), g = 1 but
        // in the gated layer
        const bool has_values = relative && relative->value_term;
        REQUIRE(parts.value_share.defined() == has_values);
        if (has_values) {
            const Tensor a = layer->last_weights, v = heads_of(layer->w_v.forward(x));
            const Tensor table = relative->rel_pos_emb_v.lookup(L, L);  // [H, L, L, Dh]
            Tensor position_z = sum(mul(a.unsqueeze(-1), table.unsqueeze(0)), {3});
            if (gate.defined()) position_z = mul(gate, position_z);
            const auto norm = [](const Tensor& z) { return sqrt(sum(mul(z, z), {-1})); };
            const Tensor expected = div(norm(position_z), add(norm(matmul(a, v)), norm(position_z)));
            CHECK(max_difference(parts.value_share, expected) <= 1e-12);
        }
        layer->keep_score_parts = false;
    }
}

TEST_CASE(
    "a query_offset more than 2^40 positions from the keys is refused by every scheme, before any position overflows") {
    Generator gen(2);
    const Init init{gen, DType::float64};
    RelativeOptions relative;
    RelativeFamilyOptions family;
    std::vector<std::unique_ptr<MultiHeadAttention>> layers;
    layers.push_back(std::make_unique<MultiHeadAttention>(8, 2, init));
    layers.push_back(std::make_unique<RelativeMultiHeadAttention>(8, 2, relative, AttentionImpl::bucketed, init));
    layers.push_back(std::make_unique<RotaryMultiHeadAttention>(8, 2, 10000, AttentionImpl::fused, init));
    layers.push_back(std::make_unique<AlibiAttention>(8, 2, AttentionImpl::reference, init));
    layers.push_back(std::make_unique<T5BiasAttention>(8, 2, family, true, AttentionImpl::bucketed, init));
    const Tensor x = random_input({1, 3, 8}, 4);
    for (const auto& layer : layers) {
        for (int64_t offset : {std::numeric_limits<int64_t>::max(), (int64_t{1} << 40) - 2,
                               std::numeric_limits<int64_t>::min(), -(int64_t{1} << 40) - 1}) {
            CAPTURE(offset);
            CHECK_THROWS_WITH_AS(layer->forward(x, x, Tensor(), offset),
                                 ("attention: query_offset " + std::to_string(offset) +
                                  " must be in [-2^40, 2^40 - Lq] = [-1099511627776, 1099511627773] for Lq = 3 queries")
                                     .c_str(),
                                 std::invalid_argument);
        }
        CHECK(layer->forward(x, x, Tensor(), (int64_t{1} << 40) - 3).size(1) == 3);  // the last that fits
    }
}
