// relgrad: pre-LayerNorm Transformer blocks and the three models built from them.
//
//   encoder layer   x = x + drop(self_attention(norm1(x)));  x = x + drop(ff(norm2(x)))
//   decoder layer   x = x + drop(causal_self_attention(norm1(x)))
//                   x = x + drop(cross_attention(norm2(x), memory))
//                   x = x + drop(ff(norm3(x)))
//
// Every model takes a position mode: none, sinusoidal or learned (added to the token
// embeddings), relative (Shaw's terms in every self-attention) or gated (relative and an
// absolute term mixed by a learned gate in every self-attention). Cross-attention carries no
// position terms: its queries and keys live in different sequences.
#pragma once

#include "layers/attention.hpp"

namespace relgrad {

enum class PositionMode { none, sinusoidal, learned, relative, gated };
inline constexpr EnumName<PositionMode> position_mode_names[] = {{PositionMode::none, "none"},
                                                                 {PositionMode::sinusoidal, "sinusoidal"},
                                                                 {PositionMode::learned, "learned"},
                                                                 {PositionMode::relative, "relative"},
                                                                 {PositionMode::gated, "gated"}};
PositionMode parse_position_mode(const std::string& name);
const char* position_mode_name(PositionMode mode);

struct TransformerOptions {
    int64_t dim = 64;
    int64_t heads = 4;
    int64_t ff_dim = 256;
    int64_t layers = 2;
    double dropout = 0.1;
    PositionMode position = PositionMode::relative;
    RelativeOptions relative;  // k_left, k_right, share_across_heads, rank (relative and gated)
    AttentionImpl impl = AttentionImpl::bucketed;
    bool token_gate = false;  // gated: a token-dependent gate
    int64_t max_len = 512;    // learned positions: the longest input
    // gradient checkpointing: keep only each block's input in training and recompute the block
    // in the backward pass (same dropout masks, the same gradients, less memory, more time)
    bool checkpoint = false;
};

class EncoderLayer : public Module {
public:
    EncoderLayer(const TransformerOptions& options, const Init& init);
    Tensor forward(const Tensor& x, const Tensor& mask, int64_t query_offset = 0);
    // x [B, n, D]: new positions under a causal mask, attending to the cached ones (see KVCache)
    Tensor forward_incremental(const Tensor& x, KVCache& cache);

    LayerNorm norm1;
    std::unique_ptr<MultiHeadAttention> self_attention;
    LayerNorm norm2;
    FeedForward feed_forward;
    Dropout dropout;
};

class DecoderLayer : public Module {
public:
    DecoderLayer(const TransformerOptions& options, const Init& init);
    Tensor forward(const Tensor& x, const Tensor& memory, const Tensor& self_mask, const Tensor& memory_mask);
    Tensor forward_incremental(const Tensor& x, KVCache& cache, const Tensor& memory, const Tensor& memory_mask);

    LayerNorm norm1;
    std::unique_ptr<MultiHeadAttention> self_attention;
    LayerNorm norm2;
    MultiHeadAttention cross_attention;
    LayerNorm norm3;
    FeedForward feed_forward;
    Dropout dropout;
};

// Token embeddings times sqrt(D), plus the absolute position encoding the mode asks for, then dropout.
class TokenEmbedding : public Module {
public:
    TokenEmbedding(int64_t vocab, const TransformerOptions& options, const Init& init);
    Tensor forward(const Tensor& ids, int64_t offset = 0);  // int64 [B, L] at positions offset.. -> [B, L, D]

    Embedding tokens;
    PositionMode position;
    SinusoidalPositionalEncoding sinusoidal;
    std::unique_ptr<LearnedPositionalEmbedding> learned;
    Dropout dropout;
};

// A stack of encoder layers with a final LayerNorm.
class Encoder : public Module {
public:
    Encoder(const TransformerOptions& options, const Init& init);
    Tensor forward(const Tensor& x, const Tensor& mask);
    // causal, one cache per layer (created on the first call)
    Tensor forward_incremental(const Tensor& x, std::vector<KVCache>& caches);

    std::vector<std::unique_ptr<EncoderLayer>> layers;
    LayerNorm final_norm;
    bool checkpoint;  // TransformerOptions::checkpoint
};

// The learned gates of every gated attention layer: gates[layer][head] (empty if none).
std::vector<std::vector<double>> attention_gates(const std::vector<MultiHeadAttention*>& attentions);

// The index of the largest value in each row of a [..., C] tensor: the greedy choice among C.
std::vector<int64_t> argmax_rows(const Tensor& logits);

enum class Pooling { mean, first };

// ids [B, L] (padding past lengths[b]) -> logits [B, classes]
class SequenceClassifier : public Module {
public:
    SequenceClassifier(int64_t vocab, int64_t classes, const TransformerOptions& options, Pooling pooling,
                       const Init& init);
    Tensor forward(const Tensor& ids, const std::vector<int64_t>& lengths);
    std::vector<std::vector<double>> gates() const;

    TokenEmbedding embed;
    Encoder encoder;
    Linear classifier;
    Pooling pooling;
};

// ids [B, L] -> next-token logits [B, L, vocab] (position i sees tokens 0..i)
class CausalLanguageModel : public Module {
public:
    CausalLanguageModel(int64_t vocab, const TransformerOptions& options, const Init& init);
    Tensor forward(const Tensor& ids, const std::vector<int64_t>& lengths);
    // Logits for new tokens ids [B, n] that continue the positions in `caches` (which receive
    // their keys and values): decoding token by token gives what forward() gives for the whole.
    Tensor forward_incremental(const Tensor& ids, std::vector<KVCache>& caches);
    // Greedy decoding: after `prompt` (not empty), the most likely next token, one at a time with
    // a key/value cache, until `eos` or max_tokens tokens. Returns the tokens after the prompt,
    // without eos.
    std::vector<int64_t> greedy_decode(const std::vector<int64_t>& prompt, int64_t eos, int64_t max_tokens);
    std::vector<std::vector<double>> gates() const;

    TokenEmbedding embed;
    Encoder decoder;  // encoder layers under a causal mask
    Linear lm_head;
};

// source ids [B, Ls], target input ids [B, Lt] -> logits [B, Lt, target_vocab]
class EncoderDecoder : public Module {
public:
    EncoderDecoder(int64_t source_vocab, int64_t target_vocab, const TransformerOptions& options, const Init& init);
    Tensor encode(const Tensor& source, const std::vector<int64_t>& source_lengths);
    Tensor decode(const Tensor& target, const std::vector<int64_t>& target_lengths, const Tensor& memory,
                  const std::vector<int64_t>& source_lengths);
    // the decoder's logits for new target tokens [B, n] continuing the positions in `caches`
    Tensor decode_incremental(const Tensor& target, std::vector<KVCache>& caches, const Tensor& memory,
                              const std::vector<int64_t>& source_lengths);
    // Greedy decoding of a batch of sources: the decoder reads `bos`, then appends its most likely
    // next token, one at a time with a key/value cache, until every row has given `eos` or
    // max_steps tokens. Returns each row's tokens, without bos and eos.
    std::vector<std::vector<int64_t>> greedy_decode(const Tensor& source, const std::vector<int64_t>& source_lengths,
                                                    int64_t bos, int64_t eos, int64_t max_steps);
    Tensor forward(const Tensor& source, const std::vector<int64_t>& source_lengths, const Tensor& target,
                   const std::vector<int64_t>& target_lengths);
    std::vector<std::vector<double>> gates() const;

    TokenEmbedding source_embed, target_embed;
    Encoder encoder;
    std::vector<std::unique_ptr<DecoderLayer>> decoder_layers;
    LayerNorm decoder_norm;
    Linear output;
    bool checkpoint;  // TransformerOptions::checkpoint (the decoder's blocks; the encoder has its own)
};

}  // namespace relgrad
