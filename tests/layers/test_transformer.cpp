// Transformer blocks and models in every position mode.
#include <algorithm>

#include "layer_check.hpp"
#include "engine/autograd.hpp"
#include "layers/transformer.hpp"

using namespace relgrad;
using namespace relgrad::testing;

namespace {

const PositionMode all_modes[] = {PositionMode::none,     PositionMode::sinusoidal, PositionMode::learned,
                                  PositionMode::relative, PositionMode::gated,      PositionMode::rope,
                                  PositionMode::alibi,    PositionMode::t5};

TransformerOptions tiny(PositionMode mode) {
    TransformerOptions o;
    o.dim = 6;
    // the relative family with 3 heads: an even head dim for RoPE, ALiBi's slopes for a head count
    // that is not a power of two
    const bool family = mode == PositionMode::rope || mode == PositionMode::alibi || mode == PositionMode::t5;
    o.heads = family ? 3 : 2;
    o.ff_dim = 5;
    o.layers = 2;
    o.dropout = 0.1;
    o.position = mode;
    o.relative.k_left = o.relative.k_right = 2;
    o.max_positions = 8;
    o.family.t5_buckets = 6;  // bidirectional: exact distances -1 .. 1, then log buckets up to 4
    o.family.t5_max_distance = 4;
    o.t5_share_layers = true;
    return o;
}

Tensor ids(const std::vector<double>& values, const Shape& shape) { return from_vector(values, shape, DType::int64); }

}  // namespace

TEST_CASE("position modes by name") {
    // the table a config, a layer spec and Python read the names with
    const auto parse = [](const std::string& name) { return parse_named(position_mode_names, name, "position mode"); };
    for (PositionMode mode : all_modes) CHECK(parse(position_mode_name(mode)) == mode);
    CHECK_THROWS_WITH_AS(parse("kerple"),
                         "unknown position mode 'kerple' (expected none, sinusoidal, learned, relative, gated, rope, "
                         "alibi or t5)",
                         std::invalid_argument);
}

TEST_CASE("encoder and decoder layers pass their gradient checks in every position mode") {
    for (PositionMode mode : all_modes) {
        const std::string mode_name = position_mode_name(mode);
        CAPTURE(mode_name);
        Generator gen(1);
        const Init init{gen, DType::float64};
        EncoderLayer encoder(tiny(mode), init);
        const Tensor mask = combine_masks(key_padding_mask({3, 2}, 3), local_window_mask(3, 3, 1));
        gradcheck_layer(encoder, {random_input({2, 3, 6}, 2)},
                        [&](const auto& in) { return encoder.forward(in[0], mask.to(encoder.device())); });
        DecoderLayer decoder(tiny(mode), init);
        gradcheck_layer(decoder, {random_input({2, 3, 6}, 3), random_input({2, 4, 6}, 4)}, [&](const auto& in) {
            const Device device = decoder.device();
            return decoder.forward(in[0], in[1], causal_mask(3, 3, 0, device), key_padding_mask({4, 1}, 4, device));
        });
    }
}

TEST_CASE("models pass their gradient checks in every position mode") {
    for (PositionMode mode : all_modes) {
        const std::string mode_name = position_mode_name(mode);
        CAPTURE(mode_name);
        Generator gen(5);
        const Init init{gen, DType::float64};
        SequenceClassifier classifier(7, 3, tiny(mode), Pooling::mean, init);
        const Tensor tokens = ids({1, 4, 6, 2, 5, 0, 0, 0}, {2, 4});
        gradcheck_layer(
            classifier, {},
            [&](const auto&) {
                return classifier.forward(tokens.to(classifier.device()), {4, 2});
            },
            true);
        CausalLanguageModel lm(7, tiny(mode), init);
        gradcheck_layer(
            lm, {},
            [&](const auto&) {
                return lm.forward(tokens.to(lm.device()), {4, 3});
            },
            true);
        EncoderDecoder seq2seq(7, 5, tiny(mode), init);
        const Tensor target = ids({1, 2, 3, 4, 0, 0}, {2, 3});
        gradcheck_layer(
            seq2seq, {},
            [&](const auto&) {
                return seq2seq.forward(tokens.to(seq2seq.device()), {4, 1}, target.to(seq2seq.device()), {3, 1});
            },
            true);
    }
}

TEST_CASE("small models gradient-check element by element too") {
    TransformerOptions o = tiny(PositionMode::gated);
    o.dim = 4;
    o.ff_dim = 3;
    o.layers = 1;
    o.token_gate = true;
    Generator gen(6);
    CausalLanguageModel lm(4, o, Init{gen, DType::float64});
    gradcheck_layer(lm, {}, [&](const auto&) { return lm.forward(ids({1, 3, 2}, {1, 3}).to(lm.device()), {3}); });
    SequenceClassifier first(4, 2, tiny(PositionMode::relative), Pooling::first, Init{gen, DType::float64});
    gradcheck_layer(first, {}, [&](const auto&) {
        return first.forward(ids({3, 1, 2, 2}, {2, 2}).to(first.device()), {2, 1});
    });
}

TEST_CASE("masks do their job inside the models") {
    for (PositionMode mode : all_modes) {
        const std::string mode_name = position_mode_name(mode);
        CAPTURE(mode_name);
        Generator gen(7);
        SequenceClassifier classifier(9, 2, tiny(mode), Pooling::mean, Init{gen, DType::float64});
        classifier.eval();
        // what sits in the padding does not matter
        const Tensor a = classifier.forward(ids({1, 2, 3, 0, 4, 5, 0, 0}, {2, 4}), {3, 2});
        const Tensor b = classifier.forward(ids({1, 2, 3, 8, 4, 5, 7, 6}, {2, 4}), {3, 2});
        CHECK(max_difference(a, b) <= 1e-12);
        // a causal model does not look ahead: changing token 3 leaves positions 0..2 alone
        CausalLanguageModel lm(9, tiny(mode), Init{gen, DType::float64});
        lm.eval();
        const Tensor before = lm.forward(ids({1, 2, 3, 4}, {1, 4}), {4});
        const Tensor after = lm.forward(ids({1, 2, 3, 8}, {1, 4}), {4});
        CHECK(max_difference(before.narrow(1, 0, 3), after.narrow(1, 0, 3)) <= 1e-12);
        CHECK(max_difference(before.narrow(1, 3, 1), after.narrow(1, 3, 1)) > 1e-6);
    }
}

TEST_CASE("gates are reported per layer and head; bad inputs are errors") {
    Generator gen(8);
    CausalLanguageModel gated(5, tiny(PositionMode::gated), Init{gen});
    const auto gates = gated.gates();
    REQUIRE(gates.size() == 2);
    CHECK(gates[0] == std::vector<double>{0.5, 0.5});
    CausalLanguageModel relative(5, tiny(PositionMode::relative), Init{gen});
    CHECK(relative.gates().empty());
    CHECK_THROWS_WITH_AS(relative.forward(ids({1, 2}, {1, 2}), {2, 2}),
                         "CausalLanguageModel: 2 lengths for a batch of 1", std::invalid_argument);
    CausalLanguageModel learned(5, tiny(PositionMode::learned), Init{gen});
    CHECK_THROWS_AS(learned.forward(ids(std::vector<double>(9, 1), {1, 9}), {9}), std::invalid_argument);
    CHECK_THROWS_AS(relative.forward(ids({1, 7}, {1, 2}), {2}),
                    std::invalid_argument);  // token id outside the vocabulary
    TransformerOptions none = tiny(PositionMode::none);
    none.layers = 0;
    CHECK_THROWS_AS(CausalLanguageModel(5, none, Init{gen}), std::invalid_argument);
}

TEST_CASE("incremental decoding sees the same relative distances as full recomputation") {
    // Decoding with a key/value cache must give each new query its true position: relative
    // distances j - i and absolute positions both come from the cache length. A cache that
    // restarted positions at 0 would change every logit after the first. (The fused form takes
    // the offset as a number, not through a precomputed index: checked too.)
    std::vector<std::pair<PositionMode, AttentionImpl>> cases;
    for (PositionMode mode : all_modes) cases.emplace_back(mode, AttentionImpl::bucketed);
    cases.emplace_back(PositionMode::relative, AttentionImpl::fused);
    for (const auto& [mode, impl] : cases) {
        const std::string mode_name = position_mode_name(mode) + std::string(" ") + attention_impl_name(impl);
        CAPTURE(mode_name);
        TransformerOptions o = tiny(mode);
        o.impl = impl;
        o.token_gate = mode == PositionMode::gated;
        Generator gen(9);
        CausalLanguageModel lm(9, o, Init{gen, DType::float64});
        lm.eval();
        const Tensor tokens = ids({1, 5, 2, 8, 3, 3, 7}, {1, 7});
        const Tensor full = lm.forward(tokens, {7});
        NoGradGuard no_grad;
        std::vector<KVCache> caches;
        std::vector<Tensor> pieces = {lm.forward_incremental(tokens.narrow(1, 0, 3), caches)};  // a prompt of 3
        for (int64_t t = 3; t < 7; ++t) pieces.push_back(lm.forward_incremental(tokens.narrow(1, t, 1), caches));
        CHECK(caches[0].length() == 7);
        CHECK(max_difference(concat(pieces, 1), full) <= 1e-12);

        EncoderDecoder seq2seq(9, 9, o, Init{gen, DType::float64});
        seq2seq.eval();
        const Tensor source = ids({4, 5, 6, 7, 8, 0}, {2, 3});
        const Tensor target = ids({2, 6, 5, 4, 2, 8, 7, 6}, {2, 4});
        const Tensor memory = seq2seq.encode(source, {3, 2});
        const Tensor whole = seq2seq.decode(target, {4, 4}, memory, {3, 2});
        std::vector<KVCache> decoder_caches;
        std::vector<Tensor> steps;
        for (int64_t t = 0; t < 4; ++t) {
            steps.push_back(seq2seq.decode_incremental(target.narrow(1, t, 1), decoder_caches, memory, {3, 2}));
        }
        CHECK(max_difference(concat(steps, 1), whole) <= 1e-12);
    }
}

TEST_CASE("greedy decoding takes the most likely token at every step, as full passes without a cache do") {
    // the argmax over the vocabulary at the last position of logits [1, L, V]
    auto most_likely_next = [](const Tensor& logits) {
        const std::vector<double> values = logits.to_vector();
        const auto last = values.end() - logits.size(-1);
        return static_cast<int64_t>(std::max_element(last, values.end()) - last);
    };
    auto length = [](const std::vector<double>& row) { return static_cast<int64_t>(row.size()); };
    // the tokens of `expected` before the first `eos`
    auto cut_at = [](std::vector<int64_t> expected, int64_t eos) {
        expected.erase(std::find(expected.begin(), expected.end(), eos), expected.end());
        return expected;
    };
    const int64_t never = -1;  // an eos no step can produce
    Generator gen(11);
    const TransformerOptions o = tiny(PositionMode::relative);

    CausalLanguageModel lm(9, o, Init{gen, DType::float64});
    lm.eval();
    const std::vector<int64_t> prompt = {5, 2, 8};
    std::vector<double> tokens(prompt.begin(), prompt.end());
    std::vector<int64_t> continuation;
    for (int step = 0; step < 4; ++step) {
        continuation.push_back(most_likely_next(lm.forward(ids(tokens, {1, length(tokens)}), {length(tokens)})));
        tokens.push_back(static_cast<double>(continuation.back()));
    }
    CHECK(lm.greedy_decode(prompt, never, 4) == continuation);
    CHECK(lm.greedy_decode(prompt, continuation[2], 4) == cut_at(continuation, continuation[2]));
    CHECK_THROWS_AS(lm.greedy_decode({}, never, 4), std::invalid_argument);
    CHECK(lm.greedy_decode(prompt, never, 0).empty());
    CHECK_THROWS_WITH_AS(lm.greedy_decode(prompt, never, -1),
                         "CausalLanguageModel::greedy_decode: max_tokens must be >= 0, got -1", std::invalid_argument);

    // a batch of two sources of different lengths decodes as each source alone
    EncoderDecoder seq2seq(9, 9, o, Init{gen, DType::float64});
    seq2seq.eval();
    const int64_t bos = 2;
    std::vector<std::vector<int64_t>> targets;
    for (const std::vector<double>& source : {std::vector<double>{4, 5, 6}, std::vector<double>{7, 8}}) {
        std::vector<double> target = {static_cast<double>(bos)};
        targets.emplace_back();
        for (int step = 0; step < 4; ++step) {
            const Tensor logits = seq2seq.forward(ids(source, {1, length(source)}), {length(source)},
                                                  ids(target, {1, length(target)}), {length(target)});
            targets.back().push_back(most_likely_next(logits));
            target.push_back(static_cast<double>(targets.back().back()));
        }
    }
    const Tensor sources = ids({4, 5, 6, 7, 8, 0}, {2, 3});
    CHECK(seq2seq.greedy_decode(sources, {3, 2}, bos, never, 4) == targets);
    const int64_t eos = targets[0][1];  // ends the first row early, the second where it gives that token
    CHECK(seq2seq.greedy_decode(sources, {3, 2}, bos, eos, 4) ==
          std::vector<std::vector<int64_t>>{cut_at(targets[0], eos), cut_at(targets[1], eos)});
    CHECK(seq2seq.greedy_decode(sources, {3, 2}, bos, eos, 0) == std::vector<std::vector<int64_t>>(2));
    CHECK_THROWS_WITH_AS(seq2seq.greedy_decode(sources, {3, 2}, bos, eos, -1),
                         "EncoderDecoder::greedy_decode: max_steps must be >= 0, got -1", std::invalid_argument);
}

TEST_CASE("gradient checkpointing gives the same outputs and gradients, dropout masks included") {
    const Tensor source = ids({4, 5, 6, 7, 8, 0}, {2, 3});
    const Tensor target = ids({2, 6, 5, 4, 2, 8, 7, 6}, {2, 4});
    for (AttentionImpl impl : {AttentionImpl::bucketed, AttentionImpl::fused}) {
        CAPTURE(attention_impl_name(impl));
        // logits and every parameter's gradient of a seq2seq model and a language model in training mode
        auto run = [&](bool checkpointed) {
            TransformerOptions o = tiny(PositionMode::relative);
            o.impl = impl;
            o.dropout = 0.3;
            o.checkpoint = checkpointed;
            Generator gen(4);
            EncoderDecoder seq2seq(9, 9, o, Init{gen, DType::float64});
            CausalLanguageModel lm(9, o, Init{gen, DType::float64});
            seq2seq.reseed(77);
            lm.reseed(78);
            const Tensor memory = seq2seq.encode(source, {3, 2});
            const Tensor logits = seq2seq.decode(target, {4, 4}, memory, {3, 2});
            const Tensor lm_logits = lm.forward(target, {4, 3});
            add(sum(mul(logits, logits)), sum(mul(lm_logits, lm_logits))).backward();
            std::vector<Tensor> result = {logits.detach(), lm_logits.detach()};
            for (const Tensor& p : seq2seq.parameters()) result.push_back(p.grad());
            for (const Tensor& p : lm.parameters()) result.push_back(p.grad());
            return result;
        };
        const std::vector<Tensor> plain = run(false), checkpointed = run(true);
        REQUIRE(plain.size() == checkpointed.size());
        for (std::size_t n = 0; n < plain.size(); ++n) {
            CAPTURE(n);
            REQUIRE(checkpointed[n].defined());
            // equal up to the order in which a tensor's contributions are summed (the memory
            // gets them from every decoder block): relative to the largest entry
            double largest = 1;
            for (double v : plain[n].to_vector()) largest = std::max(largest, std::fabs(v));
            CHECK(max_difference(plain[n], checkpointed[n]) <= 1e-14 * largest);
        }
    }
}
