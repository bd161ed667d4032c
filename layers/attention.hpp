// relgrad: masks and multi-head attention, plain, relative (Shaw et al. 2018) and gated.
//
// Shapes: B batch, Lq/Lk query/key lengths, D model width, H heads, Dh = D / H, K = k_left +
// k_right + 1 buckets.
//
//   q, k, v = split_heads(x W_q^T + b_q), ...              [B, H, L, Dh]
//   e_ij    = (q_i . k_j [+ position terms]) / sqrt(Dh)     [B, H, Lq, Lk]
//   a_i     = softmax_j(e_ij), masked keys get -inf         (a fully masked row gives a_i = 0)
//   z_i     = sum_j a_ij v_j [+ position terms]             [B, H, Lq, Dh]
//   y       = merge_heads(z) W_o^T + b_o                    [B, Lq, D]
//
// Relative (Shaw), with r = r(i, j) the clipped distance bucket (position.hpp):
//   e_ij += q_i . E_K[r] / sqrt(Dh)        z_i += sum_j a_ij E_V[r]
// Gated, per head h with g_h = sigmoid(lambda_h) (or a token-dependent gate, sigmoid(lambda_h + x_i W_g^T)):
//   e_ij += g_h q_i . E_K[r] / sqrt(Dh) + (1 - g_h) (P_i U_q) . (P_j U_k) / sqrt(Dh)
//   z_i  += g_h sum_j a_ij E_V[r]
// so g = 1 is Shaw's relative attention and g = 0 attention with an untied absolute term built
// from the sinusoidal positions P (projected per layer by U_q = w_pq, U_k = w_pk).
// The relative family beside Shaw (position.hpp), with d = j - i:
//   RoPE    q_i, k_j rotated by their positions (rope), so q'_i . k'_j depends on d alone
//   ALiBi   e_ij += -m_h |d|                         (after the scale; no parameters)
//   T5      e_ij += W[bucket(d), h]                  (after the scale; W [buckets, H] learned)
#pragma once

#include "engine/enum_names.hpp"
#include "engine/ops.hpp"
#include "layers/position.hpp"

namespace relgrad {

// --- masks: bool tensors, true = may attend, broadcastable to [B, H, Lq, Lk]

// keys at positions >= lengths[b] are padding: [B, 1, 1, Lk]
Tensor key_padding_mask(const std::vector<int64_t>& lengths, int64_t key_len, Device device = Device::cpu);
// from a [B, Lk] tensor of any dtype, non-zero = a real token: [B, 1, 1, Lk]
Tensor key_padding_mask(const Tensor& keep);
// query i (at position query_offset + i) sees keys j <= its position: [Lq, Lk]
Tensor causal_mask(int64_t query_len, int64_t key_len, int64_t query_offset = 0, Device device = Device::cpu);
// query i sees keys within `window` positions on either side: |j - (query_offset + i)| <= window
Tensor local_window_mask(int64_t query_len, int64_t key_len, int64_t window, int64_t query_offset = 0,
                         Device device = Device::cpu);
// combine_masks and pattern_mask (the fused op's rules as a mask) are in engine/ops.hpp

// The keys and values of every position decoded so far, [B, H, T, Dh] each, so that decoding one
// token at a time computes each position's keys and values once.
struct KVCache {
    Tensor k, v;
    int64_t length() const { return k.defined() ? k.size(2) : 0; }
};

// reference: composed op by op, builds [L, L, Dh] tables (the readable one); bucketed: the engine's
// attention op, keeps the [L, L] weights; fused: the engine's fused_attention op, memory linear in L.
// All three take the same parameters.
enum class AttentionImpl { reference, bucketed, fused };
inline constexpr EnumName<AttentionImpl> attention_impl_names[] = {
    {AttentionImpl::reference, "reference"}, {AttentionImpl::bucketed, "bucketed"}, {AttentionImpl::fused, "fused"}};
AttentionImpl parse_attention_impl(const std::string& name);  // "reference" | "bucketed" | "fused"
const char* attention_impl_name(AttentionImpl impl);

// The rows of the relative attention layers' own options (layers/options.hpp), beside Shaw's
// relative_option_fields: the form (all three compute the same), and the gated layer's token gate.
template <class Fields>
void attention_form_field(Fields& f, AttentionImpl& impl) {
    f.named("attention", impl, attention_impl_names, AttentionImpl::bucketed,
            "the form of relative attention: reference, bucketed or fused (the same math)");
}
template <class Fields>
void token_gate_field(Fields& f, bool& token_gate) {
    f.flag("token_gate", token_gate, false, "gated positions: a gate per token as well as per head");
}

// The three rules on attention's sizes and form, each stated once here. An options description
// reports a broken rule at its key (check_rule: a config, a layer spec, Python keywords); a layer
// built in C++ from sizes given directly throws it (require_rule, naming the layer).
struct AttentionRule {
    bool holds;
    const char* key;       // the option it is reported at
    std::string expected;  // what that option must be
};
inline AttentionRule heads_divide_dim(int64_t dim, int64_t heads) {
    return {heads > 0 && dim % heads == 0, "heads", "a divisor of dim = " + std::to_string(dim)};
}
inline AttentionRule rope_head_dim_is_even(int64_t dim, int64_t heads) {  // RoPE rotates pairs
    return {heads > 0 && (dim / heads) % 2 == 0, "heads",
            "such that the head dim dim / heads is even (RoPE rotates pairs)"};
}
inline AttentionRule gated_form_is_composed(AttentionImpl impl) {  // the gate sits inside the scores
    return {impl != AttentionImpl::fused, "attention", "reference or bucketed (the gated layer has no fused form)"};
}
template <class Fields>
void check_rule(Fields& f, const AttentionRule& rule) {
    f.check(rule.holds, rule.key, rule.expected);
}
// throws std::invalid_argument "layer: given: expected ...", e.g. "attention: dim = 10, heads = 3:
// expected heads a divisor of dim = 10"
void require_rule(const AttentionRule& rule, const char* layer, const std::string& given);

class MultiHeadAttention : public Module {
public:
    MultiHeadAttention(int64_t dim, int64_t heads, const Init& init);

    // query [B, Lq, D] attends to key_value [B, Lk, D]; mask bool, broadcastable to
    // [B, H, Lq, Lk]; query_offset is the position of the first query (for incremental decoding)
    Tensor forward(const Tensor& query, const Tensor& key_value, const Tensor& mask = Tensor(),
                   int64_t query_offset = 0);

    // Self-attention of new positions x [B, n, D], at positions cache.length() ... onward, to every
    // position so far (causal among the new ones); appends their keys and values to the cache. The
    // queries get query_offset = cache.length(), so relative distances are those of a full pass.
    Tensor forward_incremental(const Tensor& x, KVCache& cache);

    int64_t dim, heads, head_dim;
    Linear w_q, w_k, w_v, w_o;
    // Rules that hide keys without a mask tensor, on top of forward's mask: only keys at or before
    // the query (causal), only keys within `window` positions (-1: no window). The fused form skips
    // the key tiles they hide; the others build the equivalent mask.
    bool causal = false;
    int64_t window = -1;
    // the attention weights a of the last forward, detached [B, H, Lq, Lk] (the fused form keeps
    // none: undefined after its forward)
    Tensor last_weights;

    // A look inside the scores (the explorer, docs/explorer.md): e_ij = content_ij + position_ij,
    // both after the scale and detached [B, H, Lq, Lk]. content is the product of the queries and
    // keys as projected (before RoPE rotates them): q_i . k_j / sqrt(Dh); position is the rest of
    // the layer's own score: Shaw's q_i . E_K[r] / sqrt(Dh), ALiBi's or T5's bias, RoPE's rotated
    // score less the unrotated one, the gated mix. value_share [B, H, Lq] is the part of z_i from
    // the position side of the values (Shaw's sum_j a_ij E_V[r], weighed by the gate):
    // |pos_i| / (|content_i| + |pos_i|) with |.| the Euclidean norm over Dh; undefined where the
    // layer has no such term. mask, broadcastable to [B, H, Lq, Lk]: the pairs that may attend
    // (undefined: all). gate: the gated layer's g, [1, H, 1, 1] or per token [B, H, Lq, 1].
    struct ScoreParts {
        Tensor content, position, value_share, mask, gate;
    };
    // Set, forward() also keeps its ScoreParts in last_score_parts, computed by scores() and
    // values(), the functions of the reference form. Under no-grad; for looking, not for training.
    bool keep_score_parts = false;
    ScoreParts last_score_parts;

protected:
    // z [B, H, Lq, Dh]; the pattern holds forward's mask, the layer's rules and the query offset.
    // By default the engine's attention op (engine/ops/attention.cpp), which keeps only the weights
    // for the backward.
    virtual Tensor attend(const Tensor& query_input, const Tensor& q, const Tensor& k, const Tensor& v,
                          const AttentionPattern& pattern);
    // The same, composed op by op from scores() and values(): the readable form
    Tensor attend_composed(const Tensor& query_input, const Tensor& q, const Tensor& k, const Tensor& v,
                           const AttentionPattern& pattern);
    // q k^T plus any position terms, before scaling: [B, H, Lq, Lk]; the gate g the gated layer
    // weighed its position terms with, which values() applies again; and a bias added after the
    // scale, [H, Lq, Lk] (ALiBi's, T5's). Undefined where a layer has none.
    struct Scores {
        Tensor scores, gate;
        Tensor bias = Tensor();  // (a default: the layers without one need not name it)
    };
    virtual Scores scores(const Tensor& query_input, const Tensor& q, const Tensor& k, int64_t query_offset);
    // a v plus any position terms (the relative one weighed by `gate` where it is defined): [B, H, Lq, Dh]
    virtual Tensor values(const Tensor& a, const Tensor& v, int64_t query_offset, const Tensor& gate);
    double scale() const;  // 1 / sqrt(Dh)
    // last_score_parts for the queries and keys as projected (q0, k0) and as attention reads them (q, k)
    ScoreParts score_parts(const Tensor& query_input, const Tensor& q0, const Tensor& k0, const Tensor& q,
                           const Tensor& k, const Tensor& v, const AttentionPattern& pattern);
    // whether values() adds a position term to sum_j a_ij v_j (Shaw's E_V)
    virtual bool has_position_values() const { return false; }
    // The queries or keys x [B, H, L, Dh] of positions first_position.. as attention reads them:
    // themselves here, rotated in RoPE's layer. forward() and forward_incremental() call it before
    // any attention form, and the cache keeps the keys it returns.
    virtual Tensor at_positions(const Tensor& x, int64_t first_position) const;

    Tensor split_heads(const Tensor& x) const;  // [B, L, D] -> [B, H, L, Dh]
    Tensor merge_heads(const Tensor& z) const;  // [B, H, L, Dh] -> [B, L, D]
};

class RelativeMultiHeadAttention : public MultiHeadAttention {
public:
    RelativeMultiHeadAttention(int64_t dim, int64_t heads, const RelativeOptions& options, AttentionImpl impl,
                               const Init& init);

    AttentionImpl impl;
    bool value_term;  // options.values: without it, rel_pos_emb_v is not a parameter and adds nothing
    RelativePositionEmbedding rel_pos_emb_k, rel_pos_emb_v;

protected:
    // reference: attend_composed; bucketed: the engine's attention op with the tables; fused: its
    // fused_attention op
    Tensor attend(const Tensor& query_input, const Tensor& q, const Tensor& k, const Tensor& v,
                  const AttentionPattern& pattern) override;
    Scores scores(const Tensor& query_input, const Tensor& q, const Tensor& k, int64_t query_offset) override;
    Tensor values(const Tensor& a, const Tensor& v, int64_t query_offset, const Tensor& gate) override;
    bool has_position_values() const override { return value_term; }

    // The relative terms alone: q_i . E_K[r(i,j)] [B, H, Lq, Lk] and sum_j a_ij E_V[r(i,j)] [B, H, Lq, Dh]
    Tensor relative_scores(const Tensor& q, int64_t key_len, int64_t query_offset) const;
    Tensor relative_values(const Tensor& a, int64_t query_offset) const;
    // E_V for the attention ops, or without the value term a table of zeros
    Tensor value_table(const Tensor& q) const;
};

class GatedPositionAttention : public RelativeMultiHeadAttention {
public:
    GatedPositionAttention(int64_t dim, int64_t heads, const RelativeOptions& options, AttentionImpl impl,
                           bool token_gate, const Init& init);

    // g per head, sigmoid(lambda): 1 = relative, 0 = absolute (with a token gate: the gate of a
    // token whose x_i W_g^T is 0, the per-head part)
    std::vector<double> gate_values() const;

    SinusoidalPositionalEncoding positions;
    Linear w_pq, w_pk;  // project the sinusoidal positions P per layer
    Tensor gate;        // lambda [H], initialised to 0 (g = 0.5)
    bool token_gate;
    std::unique_ptr<Linear> w_gate;  // token gate: g = sigmoid(lambda_h + (x_i W_g^T)_h), W_g [H, D] from 0

protected:
    Tensor attend(const Tensor& query_input, const Tensor& q, const Tensor& k, const Tensor& v,
                  const AttentionPattern& pattern) override;  // always composed: the gate scales the terms
    Scores scores(const Tensor& query_input, const Tensor& q, const Tensor& k, int64_t query_offset) override;

private:
    Tensor gate_for(const Tensor& query_input) const;  // [1, H, 1, 1] or [B, H, Lq, 1]
};

// RoPE: attention of the rotated queries and keys, in any form (the reference one rotates them op
// by op, the others with the rope op).
class RotaryMultiHeadAttention : public MultiHeadAttention {
public:
    RotaryMultiHeadAttention(int64_t dim, int64_t heads, double base, AttentionImpl impl, const Init& init);

    double base;  // theta_t = base^(-2t/Dh)
    AttentionImpl impl;

protected:
    Tensor at_positions(const Tensor& x, int64_t first_position) const override;
    Tensor attend(const Tensor& query_input, const Tensor& q, const Tensor& k, const Tensor& v,
                  const AttentionPattern& pattern) override;
};

// A score bias that depends on the head and the distance d = j - (query_offset + i) alone, in
// the three forms: reference, the [H, Lq, Lk] bias built op by op; bucketed, the attention op's
// bias per bucket; fused, fused_attention's bias by distance, a row of Lq + Lk - 1 per head.
class DistanceBiasAttention : public MultiHeadAttention {
public:
    AttentionImpl impl;
    // [H, Lq + Lk - 1], entry distance_entry(i, j, Lq) for the pair (i, j): with Lq = Lk = n + 1
    // and no offset, b_h(d) for d = -n..n (the explorer's curves)
    virtual Tensor distance_bias(int64_t query_len, int64_t key_len, int64_t query_offset) const = 0;

protected:
    DistanceBiasAttention(int64_t dim, int64_t heads, AttentionImpl impl, const Init& init);
    // [H, Lq, Lk], built by ops
    virtual Tensor bias_matrix(int64_t query_len, int64_t key_len, int64_t query_offset) const = 0;
    // the bias per bucket [H, K] with the bucket index [Lq, Lk] (RelativeTerms' index and bias)
    virtual RelativeTerms bucketed_bias(int64_t query_len, int64_t key_len, int64_t query_offset) const = 0;
    // the distances d of the entries of a distance_bias row
    static std::vector<int64_t> entry_distances(int64_t query_len, int64_t key_len, int64_t query_offset);
    // the distance d of every pair (i, j), row by row: [Lq, Lk] flattened
    static std::vector<int64_t> pair_distances(int64_t query_len, int64_t key_len, int64_t query_offset);

    Tensor attend(const Tensor& query_input, const Tensor& q, const Tensor& k, const Tensor& v,
                  const AttentionPattern& pattern) override;
    Scores scores(const Tensor& query_input, const Tensor& q, const Tensor& k, int64_t query_offset) override;
};

// ALiBi (Press et al. 2022): b_h(d) = -m_h |d|, the slopes of alibi_slopes; no parameters.
class AlibiAttention : public DistanceBiasAttention {
public:
    AlibiAttention(int64_t dim, int64_t heads, AttentionImpl impl, const Init& init);
    std::vector<double> slopes;
    Tensor distance_bias(int64_t query_len, int64_t key_len, int64_t query_offset) const override;

protected:
    Tensor bias_matrix(int64_t query_len, int64_t key_len, int64_t query_offset) const override;
    RelativeTerms bucketed_bias(int64_t query_len, int64_t key_len, int64_t query_offset) const override;
};

// T5's bias (Raffel et al. 2020): b_h(d) = W[t5_bucket(d), h], W = relative_attention_bias.weight
// [buckets, H]. T5 shares one table across the layers of a stack: a layer built with another's
// table (`shared_table`) reads that one and has no parameter of its own.
class T5BiasAttention : public DistanceBiasAttention {
public:
    T5BiasAttention(int64_t dim, int64_t heads, const RelativeFamilyOptions& options, bool bidirectional,
                    AttentionImpl impl, const Init& init, const Embedding* shared_table = nullptr);
    const Embedding& table() const { return shared_table_ ? *shared_table_ : *own_table_; }

    int64_t num_buckets, max_distance;
    bool bidirectional;  // false: causal buckets (T5's decoder)
    Tensor distance_bias(int64_t query_len, int64_t key_len, int64_t query_offset) const override;

protected:
    Tensor bias_matrix(int64_t query_len, int64_t key_len, int64_t query_offset) const override;
    RelativeTerms bucketed_bias(int64_t query_len, int64_t key_len, int64_t query_offset) const override;

private:
    // the buckets of distances, int64 on the table's device
    Tensor buckets_of(const std::vector<int64_t>& distances, const Shape& shape) const;
    std::unique_ptr<Embedding> own_table_;
    const Embedding* shared_table_ = nullptr;
};

}  // namespace relgrad
