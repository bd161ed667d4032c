// relgrad: pre-LayerNorm Transformer blocks and the three models built from them.
//
//   encoder layer   x = x + drop(self_attention(norm1(x)));  x = x + drop(ff(norm2(x)))
//   decoder layer   x = x + drop(causal_self_attention(norm1(x)))
//                   x = x + drop(cross_attention(norm2(x), memory))
//                   x = x + drop(ff(norm3(x)))
//
// Every model takes a position mode: none, sinusoidal or learned (added to the token
// embeddings), relative (Shaw's terms in every self-attention), gated (relative and an absolute
// term mixed by a learned gate in every self-attention), or one of the relative family in every
// self-attention: rope (q and k rotated), alibi (-m_h |j - i|) or t5 (a learned bias per bucket;
// causal buckets in causal self-attention, bidirectional ones elsewhere). Cross-attention carries no
// position terms: its queries and keys live in different sequences.
#pragma once

#include <functional>

#include "layers/attention.hpp"

namespace relgrad {

enum class PositionMode { none, sinusoidal, learned, relative, gated, rope, alibi, t5 };
inline constexpr EnumName<PositionMode> position_mode_names[] = {
    {PositionMode::none, "none"},       {PositionMode::sinusoidal, "sinusoidal"},
    {PositionMode::learned, "learned"}, {PositionMode::relative, "relative"},
    {PositionMode::gated, "gated"},     {PositionMode::rope, "rope"},
    {PositionMode::alibi, "alibi"},     {PositionMode::t5, "t5"}};
const char* position_mode_name(PositionMode mode);

// A Transformer's options; the descriptions below give each one's range and default.
struct TransformerOptions {
    TransformerOptions();  // every default of the descriptions below
    int64_t dim;
    int64_t heads;
    int64_t ff_dim;
    int64_t layers;
    double dropout;
    PositionMode position;
    RelativeOptions relative;      // k_left, k_right, share_across_heads, rank, values, init_std (relative and gated)
    RelativeFamilyOptions family;  // rope_base, t5_buckets, t5_max_distance (rope and t5)
    bool t5_share_layers;          // t5: one bias table for all layers of a stack, as T5 has
    AttentionImpl impl;
    bool token_gate;        // gated: a token-dependent gate
    int64_t max_positions;  // learned positions: the table's rows, so the longest input
    // gradient checkpointing: keep only each block's input in training and recompute the block
    // in the backward pass (same dropout masks, the same gradients, less memory, more time)
    bool checkpoint;
};

// The description of TransformerOptions (layers/options.hpp), in parts: the sizes, what one
// attention layer takes for its position scheme (a layer spec's attention types, relgrad.nn's
// attention classes), what one block takes (the encoder_layer of a layer spec,
// relgrad.nn.EncoderLayer), the whole stack (a config's model section, the models), and the two
// options a config gives elsewhere (gradient_checkpointing in its training section; max_positions
// from its data).
template <class Fields>
void dim_field(Fields& f, TransformerOptions& o) {
    f.integer("dim", o.dim, 1, 8192, 64, "the model width D");
}
template <class Fields>
void heads_field(Fields& f, TransformerOptions& o) {
    f.integer("heads", o.heads, 1, 256, 4, "attention heads H (a divisor of dim)");
    check_rule(f, heads_divide_dim(o.dim, o.heads));
}
template <class Fields>
void ff_dim_field(Fields& f, TransformerOptions& o) {
    f.integer("ff_dim", o.ff_dim, 1, 65536, 4 * o.dim, "the feed-forward's hidden width: 4 dim unless given");
}
// The options of an attention layer with the position scheme `position` (none: plain attention;
// sinusoidal and learned positions are outside attention, so none too), only those it reads.
// t5_bidirectional: T5's direction, defaulting to `bidirectional_default`.
template <class Fields>
void attention_option_fields(Fields& f, PositionMode position, TransformerOptions& o, bool& t5_bidirectional,
                             bool bidirectional_default) {
    dim_field(f, o);
    heads_field(f, o);
    if (position == PositionMode::relative || position == PositionMode::gated) relative_option_fields(f, o.relative);
    if (position == PositionMode::rope) rope_option_fields(f, o.family);
    if (position == PositionMode::t5) {
        t5_option_fields(f, o.family);
        t5_direction_field(f, t5_bidirectional, bidirectional_default);
    }
    const bool plain =
        position == PositionMode::none || position == PositionMode::sinusoidal || position == PositionMode::learned;
    if (!plain) attention_form_field(f, o.impl);
    if (position == PositionMode::rope) check_rule(f, rope_head_dim_is_even(o.dim, o.heads));
    if (position == PositionMode::gated) {
        check_rule(f, gated_form_is_composed(o.impl));
        token_gate_field(f, o.token_gate);
    }
}
template <class Fields>
void block_option_fields(Fields& f, TransformerOptions& o) {
    dim_field(f, o);
    heads_field(f, o);
    ff_dim_field(f, o);
    f.number("dropout", o.dropout, 0, 0.99, false, 0.1, "dropout after attention, feed-forward and embeddings");
    f.named("position", o.position, position_mode_names, PositionMode::relative, "how positions enter");
    relative_option_fields(f, o.relative);
    relative_family_option_fields(f, o.family);
    attention_form_field(f, o.impl);
    if (o.position == PositionMode::gated) check_rule(f, gated_form_is_composed(o.impl));
    if (o.position == PositionMode::rope) check_rule(f, rope_head_dim_is_even(o.dim, o.heads));
    token_gate_field(f, o.token_gate);
}
template <class Fields>
void transformer_option_fields(Fields& f, TransformerOptions& o) {
    f.integer("layers", o.layers, 1, 64, 2, "blocks in the stack (the encoder's and the decoder's each)");
    block_option_fields(f, o);
    f.flag("t5_share_layers", o.t5_share_layers, false, "T5 bias: one table for all layers of a stack, as T5 has");
}
template <class Fields>
void gradient_checkpointing_field(Fields& f, TransformerOptions& o) {
    f.flag("gradient_checkpointing", o.checkpoint, false, "recompute each block in the backward pass");
}
template <class Fields>
void max_positions_field(Fields& f, TransformerOptions& o) {
    f.integer("max_positions", o.max_positions, 1, int64_t{1} << 16, 512, "learned positions: the longest input");
}

inline TransformerOptions::TransformerOptions() {
    DefaultFields defaults;
    transformer_option_fields(defaults, *this);
    gradient_checkpointing_field(defaults, *this);
    max_positions_field(defaults, *this);
}

// The self-attention of options.position, the one builder of every attention class by its scheme
// (plain MultiHeadAttention for none, sinusoidal and learned). t5_bidirectional: T5's direction;
// t5_table: a stack's shared T5 table (t5_share_layers), or null for a table of its own.
std::unique_ptr<MultiHeadAttention> make_attention(const TransformerOptions& options, const Init& init,
                                                   bool t5_bidirectional = true, const Embedding* t5_table = nullptr);

// Makes a self-attention causal: only keys at or before each query, and T5's causal buckets.
void make_causal(MultiHeadAttention& attention);

class EncoderLayer : public Module {
public:
    // t5_table: the stack's shared T5 table (t5_share_layers), or null for a table of its own
    EncoderLayer(const TransformerOptions& options, const Init& init, const Embedding* t5_table = nullptr);
    Tensor forward(const Tensor& x, const Tensor& mask, int64_t query_offset = 0);
    // x [B, n, D]: new positions under a causal mask, attending to the cached ones (see KVCache)
    Tensor forward_incremental(const Tensor& x, KVCache& cache);

    TransformerOptions options;  // as built
    LayerNorm norm1;
    std::unique_ptr<MultiHeadAttention> self_attention;
    LayerNorm norm2;
    FeedForward feed_forward;
    Dropout dropout;
};

class DecoderLayer : public Module {
public:
    DecoderLayer(const TransformerOptions& options, const Init& init, const Embedding* t5_table = nullptr);
    Tensor forward(const Tensor& x, const Tensor& memory, const Tensor& self_mask, const Tensor& memory_mask);
    Tensor forward_incremental(const Tensor& x, KVCache& cache, const Tensor& memory, const Tensor& memory_mask);

    TransformerOptions options;  // as built
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

enum class Pooling { mean, first };  // a classifier's summary of the tokens: their mean, or the first
inline constexpr EnumName<Pooling> pooling_names[] = {{Pooling::mean, "mean"}, {Pooling::first, "first"}};

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

// Told the steps a greedy decode has done, after each one (a command's progress line).
using DecodeProgress = std::function<void(int64_t steps_done, int64_t max_steps)>;

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
    // without eos. `progress`, if given, is told the steps done after each.
    std::vector<int64_t> greedy_decode(const std::vector<int64_t>& prompt, int64_t eos, int64_t max_tokens,
                                       const DecodeProgress& progress = {});
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
    // max_steps tokens. Returns each row's tokens, without bos and eos. `progress` as above.
    std::vector<std::vector<int64_t>> greedy_decode(const Tensor& source, const std::vector<int64_t>& source_lengths,
                                                    int64_t bos, int64_t eos, int64_t max_steps,
                                                    const DecodeProgress& progress = {});
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
