#include "layers/transformer.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "engine/autograd.hpp"
#include "engine/errors.hpp"
#include "engine/ops.hpp"

namespace relgrad {

const char* position_mode_name(PositionMode mode) { return name_of(position_mode_names, mode); }

std::unique_ptr<MultiHeadAttention> make_attention(const TransformerOptions& o, const Init& init, bool t5_bidirectional,
                                                   const Embedding* t5_table) {
    switch (o.position) {
        case PositionMode::rope:
            return std::make_unique<RotaryMultiHeadAttention>(o.dim, o.heads, o.family.rope_base, o.impl, init);
        case PositionMode::alibi: return std::make_unique<AlibiAttention>(o.dim, o.heads, o.impl, init);
        case PositionMode::t5:
            return std::make_unique<T5BiasAttention>(o.dim, o.heads, o.family, t5_bidirectional, o.impl, init,
                                                     t5_table);
        case PositionMode::relative:
            return std::make_unique<RelativeMultiHeadAttention>(o.dim, o.heads, o.relative, o.impl, init);
        case PositionMode::gated:
            return std::make_unique<GatedPositionAttention>(o.dim, o.heads, o.relative, o.impl, o.token_gate, init);
        case PositionMode::none:
        case PositionMode::sinusoidal:
        case PositionMode::learned: return std::make_unique<MultiHeadAttention>(o.dim, o.heads, init);
    }
    RELGRAD_INTERNAL_ASSERT(false, "make_attention: position mode ", static_cast<int>(o.position));
}

// The T5 table a stack's later layers share with its first (t5_share_layers), or null.
static const Embedding* shared_t5_table(const TransformerOptions& o, MultiHeadAttention& first_attention) {
    if (o.position != PositionMode::t5 || !o.t5_share_layers) return nullptr;
    return &dynamic_cast<T5BiasAttention&>(first_attention).table();
}

void make_causal(MultiHeadAttention& attention) {
    attention.causal = true;
    if (auto* t5 = dynamic_cast<T5BiasAttention*>(&attention)) t5->bidirectional = false;
}

EncoderLayer::EncoderLayer(const TransformerOptions& o, const Init& init, const Embedding* t5_table)
    : options(o),
      norm1(o.dim, init),
      self_attention(make_attention(o, init, /*t5_bidirectional=*/true, t5_table)),
      norm2(o.dim, init),
      feed_forward(o.dim, o.ff_dim, o.dropout, init),
      dropout(o.dropout, init.gen.next_u64()) {
    register_module("norm1", norm1);
    register_module("self_attention", *self_attention);
    register_module("norm2", norm2);
    register_module("feed_forward", feed_forward);
    register_module("dropout", dropout);
}

Tensor EncoderLayer::forward(const Tensor& x, const Tensor& mask, int64_t query_offset) {
    const Tensor h = norm1.forward(x);
    const Tensor x1 = dropout.add_to(x, self_attention->forward(h, h, mask, query_offset));
    return dropout.add_to(x1, feed_forward.forward(norm2.forward(x1)));
}

Tensor EncoderLayer::forward_incremental(const Tensor& x, KVCache& cache) {
    const Tensor x1 = dropout.add_to(x, self_attention->forward_incremental(norm1.forward(x), cache));
    return dropout.add_to(x1, feed_forward.forward(norm2.forward(x1)));
}

DecoderLayer::DecoderLayer(const TransformerOptions& o, const Init& init, const Embedding* t5_table)
    : options(o),
      norm1(o.dim, init),
      self_attention(make_attention(o, init, /*t5_bidirectional=*/true, t5_table)),
      norm2(o.dim, init),
      cross_attention(o.dim, o.heads, init),
      norm3(o.dim, init),
      feed_forward(o.dim, o.ff_dim, o.dropout, init),
      dropout(o.dropout, init.gen.next_u64()) {
    register_module("norm1", norm1);
    register_module("self_attention", *self_attention);
    register_module("norm2", norm2);
    register_module("cross_attention", cross_attention);
    register_module("norm3", norm3);
    register_module("feed_forward", feed_forward);
    register_module("dropout", dropout);
}

Tensor DecoderLayer::forward(const Tensor& x, const Tensor& memory, const Tensor& self_mask,
                             const Tensor& memory_mask) {
    const Tensor h = norm1.forward(x);
    const Tensor x1 = dropout.add_to(x, self_attention->forward(h, h, self_mask));
    const Tensor x2 = dropout.add_to(x1, cross_attention.forward(norm2.forward(x1), memory, memory_mask));
    return dropout.add_to(x2, feed_forward.forward(norm3.forward(x2)));
}

Tensor DecoderLayer::forward_incremental(const Tensor& x, KVCache& cache, const Tensor& memory,
                                         const Tensor& memory_mask) {
    const Tensor x1 = dropout.add_to(x, self_attention->forward_incremental(norm1.forward(x), cache));
    const Tensor x2 = dropout.add_to(x1, cross_attention.forward(norm2.forward(x1), memory, memory_mask));
    return dropout.add_to(x2, feed_forward.forward(norm3.forward(x2)));
}

TokenEmbedding::TokenEmbedding(int64_t vocab, const TransformerOptions& o, const Init& init)
    : tokens(vocab, o.dim, init), position(o.position), sinusoidal(o.dim), dropout(o.dropout, init.gen.next_u64()) {
    register_module("tokens", tokens);
    if (position == PositionMode::learned) {
        learned = std::make_unique<LearnedPositionalEmbedding>(o.max_positions, o.dim, init);
        register_module("positions", *learned);
    }
    register_module("dropout", dropout);
}

Tensor TokenEmbedding::forward(const Tensor& ids, int64_t offset) {
    RELGRAD_CHECK(ids.dim() == 2, "token ids must be [B, L], got shape ", shape_str(ids.shape()));
    // scaled by sqrt(D) as in Vaswani et al.: embeddings drawn with std 0.02 (norm about
    // 0.0176 sqrt(D) after the truncation) would otherwise be about 40 times shorter than the
    // sinusoids (norm sqrt(D/2)) added to them, whatever D; scaled, 40 / sqrt(D) times
    Tensor x = mul(tokens.forward(ids),
                   scalar(std::sqrt(static_cast<double>(tokens.dim)), tokens.weight.dtype(), tokens.weight.device()));
    if (position == PositionMode::sinusoidal) x = sinusoidal.forward(x, offset);
    if (position == PositionMode::learned) x = learned->forward(x, offset);
    return dropout.forward(x);
}

// One block of a stack, checkpointed or not: with checkpointing (and a graph being recorded) only
// the block's inputs are kept, and the backward pass runs the block again from the random state
// its dropouts had, so it draws the same masks.
static Tensor run_block(Module& block, bool checkpointed, const std::vector<Tensor>& inputs,
                        const CheckpointFn& forward) {
    if (!checkpointed || !grad_mode_enabled()) return forward(inputs);
    const std::vector<Generator> random_state = block.random_state();
    return checkpoint(forward, inputs, block.parameters(),
                      [&block, random_state] { block.set_random_state(random_state); });
}

Encoder::Encoder(const TransformerOptions& o, const Init& init) : final_norm(o.dim, init), checkpoint(o.checkpoint) {
    RELGRAD_CHECK(o.layers > 0, "Transformer: layers must be positive, got ", o.layers);
    for (int64_t i = 0; i < o.layers; ++i) {
        const Embedding* t5_table = i > 0 ? shared_t5_table(o, *layers[0]->self_attention) : nullptr;
        layers.push_back(std::make_unique<EncoderLayer>(o, init, t5_table));
        register_module("layers." + std::to_string(i), *layers.back());
    }
    register_module("final_norm", final_norm);
}

Tensor Encoder::forward(const Tensor& x, const Tensor& mask) {
    Tensor h = x;
    for (auto& layer : layers) {
        h = run_block(*layer, checkpoint, {h}, [block = layer.get(), mask](const std::vector<Tensor>& in) {
            return block->forward(in[0], mask);
        });
    }
    return final_norm.forward(h);
}

Tensor Encoder::forward_incremental(const Tensor& x, std::vector<KVCache>& caches) {
    caches.resize(layers.size());
    Tensor h = x;
    for (std::size_t i = 0; i < layers.size(); ++i) h = layers[i]->forward_incremental(h, caches[i]);
    return final_norm.forward(h);
}

std::vector<std::vector<double>> attention_gates(const std::vector<MultiHeadAttention*>& attentions) {
    std::vector<std::vector<double>> gates;
    for (MultiHeadAttention* attention : attentions) {
        if (auto* gated = dynamic_cast<GatedPositionAttention*>(attention)) gates.push_back(gated->gate_values());
    }
    return gates;
}

std::vector<int64_t> argmax_rows(const Tensor& logits) {
    const std::vector<double> values = logits.to_vector();
    const int64_t C = logits.size(-1);
    std::vector<int64_t> best;
    for (std::size_t row = 0; row * C < values.size(); ++row) {
        const auto start = values.begin() + static_cast<std::ptrdiff_t>(row * C);
        best.push_back(std::max_element(start, start + C) - start);
    }
    return best;
}

static std::vector<MultiHeadAttention*> self_attentions(const Encoder& encoder) {
    std::vector<MultiHeadAttention*> out;
    for (const auto& layer : encoder.layers) out.push_back(layer->self_attention.get());
    return out;
}

static void check_lengths(const Tensor& ids, const std::vector<int64_t>& lengths, const char* what) {
    RELGRAD_CHECK(static_cast<int64_t>(lengths.size()) == ids.size(0), what, ": ", lengths.size(),
                  " lengths for a batch of ", ids.size(0));
}

SequenceClassifier::SequenceClassifier(int64_t vocab, int64_t classes, const TransformerOptions& o, Pooling pooling_,
                                       const Init& init)
    : embed(vocab, o, init), encoder(o, init), classifier(o.dim, classes, init), pooling(pooling_) {
    register_module("embed", embed);
    register_module("encoder", encoder);
    register_module("classifier", classifier);
}

Tensor SequenceClassifier::forward(const Tensor& ids, const std::vector<int64_t>& lengths) {
    check_lengths(ids, lengths, "SequenceClassifier");
    const int64_t B = ids.size(0), L = ids.size(1);
    const Tensor keep = key_padding_mask(lengths, L, ids.device());  // [B, 1, 1, L]
    const Tensor h = encoder.forward(embed.forward(ids), keep);
    Tensor pooled;
    if (pooling == Pooling::first) {
        pooled = h.narrow(1, 0, 1).squeeze(1);
    } else {  // mean over the real tokens: sum_i keep_i h_i / length
        std::vector<double> counts;
        for (int64_t n : lengths) counts.push_back(n > 0 ? static_cast<double>(n) : 1.0);
        const Tensor weights = keep.reshape({B, L, 1}).to(h.dtype());
        pooled = div(sum(mul(h, weights), {1}), from_vector(counts, {B, 1}, h.dtype(), h.device()));
    }
    return classifier.forward(pooled);
}

std::vector<std::vector<double>> SequenceClassifier::gates() const { return attention_gates(self_attentions(encoder)); }

CausalLanguageModel::CausalLanguageModel(int64_t vocab, const TransformerOptions& o, const Init& init)
    : embed(vocab, o, init), decoder(o, init), lm_head(o.dim, vocab, init) {
    // causal by the layers' rule, not by an [L, L] mask: the fused form skips the hidden tiles
    for (auto& layer : decoder.layers) make_causal(*layer->self_attention);
    register_module("embed", embed);
    register_module("decoder", decoder);
    register_module("lm_head", lm_head);
}

Tensor CausalLanguageModel::forward(const Tensor& ids, const std::vector<int64_t>& lengths) {
    check_lengths(ids, lengths, "CausalLanguageModel");
    const int64_t L = ids.size(1);
    return lm_head.forward(decoder.forward(embed.forward(ids), key_padding_mask(lengths, L, ids.device())));
}

Tensor CausalLanguageModel::forward_incremental(const Tensor& ids, std::vector<KVCache>& caches) {
    const int64_t offset = caches.empty() ? 0 : caches[0].length();
    return lm_head.forward(decoder.forward_incremental(embed.forward(ids, offset), caches));
}

std::vector<int64_t> CausalLanguageModel::greedy_decode(const std::vector<int64_t>& prompt, int64_t eos,
                                                        int64_t max_tokens, const DecodeProgress& progress) {
    RELGRAD_CHECK(!prompt.empty(), "CausalLanguageModel::greedy_decode: the prompt is empty");
    RELGRAD_CHECK(max_tokens >= 0, "CausalLanguageModel::greedy_decode: max_tokens must be >= 0, got ", max_tokens);
    NoGradGuard no_grad;
    std::vector<KVCache> caches;
    std::vector<double> input(prompt.begin(), prompt.end());
    std::vector<int64_t> out;
    for (int64_t step = 0; step < max_tokens; ++step) {
        const Tensor ids = from_vector(input, {1, static_cast<int64_t>(input.size())}, DType::int64, device());
        const Tensor logits = forward_incremental(ids, caches);
        const int64_t next = argmax_rows(logits.narrow(1, logits.size(1) - 1, 1))[0];
        if (progress) progress(step + 1, max_tokens);
        if (next == eos) break;
        out.push_back(next);
        input = {static_cast<double>(next)};
    }
    return out;
}

std::vector<std::vector<double>> CausalLanguageModel::gates() const {
    return attention_gates(self_attentions(decoder));
}

EncoderDecoder::EncoderDecoder(int64_t source_vocab, int64_t target_vocab, const TransformerOptions& o,
                               const Init& init)
    : source_embed(source_vocab, o, init),
      target_embed(target_vocab, o, init),
      encoder(o, init),
      decoder_norm(o.dim, init),
      output(o.dim, target_vocab, init),
      checkpoint(o.checkpoint) {
    register_module("source_embed", source_embed);
    register_module("target_embed", target_embed);
    register_module("encoder", encoder);
    for (int64_t i = 0; i < o.layers; ++i) {
        const Embedding* t5_table = i > 0 ? shared_t5_table(o, *decoder_layers[0]->self_attention) : nullptr;
        decoder_layers.push_back(std::make_unique<DecoderLayer>(o, init, t5_table));
        make_causal(*decoder_layers.back()->self_attention);  // the layers' rule (see CausalLanguageModel)
        register_module("decoder_layers." + std::to_string(i), *decoder_layers.back());
    }
    register_module("decoder_norm", decoder_norm);
    register_module("output", output);
}

Tensor EncoderDecoder::encode(const Tensor& source, const std::vector<int64_t>& source_lengths) {
    check_lengths(source, source_lengths, "EncoderDecoder source");
    return encoder.forward(source_embed.forward(source),
                           key_padding_mask(source_lengths, source.size(1), source.device()));
}

Tensor EncoderDecoder::decode(const Tensor& target, const std::vector<int64_t>& target_lengths, const Tensor& memory,
                              const std::vector<int64_t>& source_lengths) {
    check_lengths(target, target_lengths, "EncoderDecoder target");
    const int64_t Lt = target.size(1);
    const Tensor self_mask =
        key_padding_mask(target_lengths, Lt, memory.device());  // causal: the self-attentions' rule
    const Tensor memory_mask = key_padding_mask(source_lengths, memory.size(1), memory.device());
    Tensor h = target_embed.forward(target);
    for (auto& layer : decoder_layers) {
        h = run_block(*layer, checkpoint, {h, memory},
                      [block = layer.get(), self_mask, memory_mask](const std::vector<Tensor>& in) {
                          return block->forward(in[0], in[1], self_mask, memory_mask);
                      });
    }
    return output.forward(decoder_norm.forward(h));
}

Tensor EncoderDecoder::decode_incremental(const Tensor& target, std::vector<KVCache>& caches, const Tensor& memory,
                                          const std::vector<int64_t>& source_lengths) {
    caches.resize(decoder_layers.size());
    const int64_t offset = caches[0].length();
    const Tensor memory_mask = key_padding_mask(source_lengths, memory.size(1), memory.device());
    Tensor h = target_embed.forward(target, offset);
    for (std::size_t i = 0; i < decoder_layers.size(); ++i) {
        h = decoder_layers[i]->forward_incremental(h, caches[i], memory, memory_mask);
    }
    return output.forward(decoder_norm.forward(h));
}

// Each new query gets its true position from the cache, so the relative distances are those of a
// full pass over the tokens so far.
std::vector<std::vector<int64_t>> EncoderDecoder::greedy_decode(const Tensor& source,
                                                                const std::vector<int64_t>& source_lengths, int64_t bos,
                                                                int64_t eos, int64_t max_steps,
                                                                const DecodeProgress& progress) {
    RELGRAD_CHECK(max_steps >= 0, "EncoderDecoder::greedy_decode: max_steps must be >= 0, got ", max_steps);
    NoGradGuard no_grad;
    const Tensor memory = encode(source, source_lengths);
    const std::size_t B = source_lengths.size();
    std::vector<std::vector<int64_t>> out(B);
    std::vector<bool> done(B, false);
    std::vector<KVCache> caches;
    std::vector<double> last(B, static_cast<double>(bos));
    for (int64_t step = 0; step < max_steps; ++step) {
        const Tensor input = from_vector(last, {static_cast<int64_t>(B), 1}, DType::int64, source.device());
        const std::vector<int64_t> next = argmax_rows(decode_incremental(input, caches, memory, source_lengths));
        bool all_done = true;
        for (std::size_t b = 0; b < B; ++b) {
            if (!done[b] && next[b] == eos) done[b] = true;
            if (!done[b]) out[b].push_back(next[b]);
            last[b] = static_cast<double>(next[b]);
            all_done = all_done && done[b];
        }
        if (progress) progress(step + 1, max_steps);
        if (all_done) break;
    }
    return out;
}

Tensor EncoderDecoder::forward(const Tensor& source, const std::vector<int64_t>& source_lengths, const Tensor& target,
                               const std::vector<int64_t>& target_lengths) {
    return decode(target, target_lengths, encode(source, source_lengths), source_lengths);
}

std::vector<std::vector<double>> EncoderDecoder::gates() const {
    std::vector<MultiHeadAttention*> attentions = self_attentions(encoder);
    for (const auto& layer : decoder_layers) attentions.push_back(layer->self_attention.get());
    return attention_gates(attentions);
}

}  // namespace relgrad
