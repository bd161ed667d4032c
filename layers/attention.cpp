#include "layers/attention.hpp"

#include <cmath>
#include <limits>
#include <string>

#include "engine/autograd.hpp"
#include "engine/errors.hpp"
#include "engine/ops.hpp"

namespace relgrad {

// "dim = 10, heads = 3", the sizes a broken rule names
static std::string sizes_text(int64_t dim, int64_t heads) {
    return "dim = " + std::to_string(dim) + ", heads = " + std::to_string(heads);
}

// ---------------------------------------------------------------- masks

Tensor key_padding_mask(const std::vector<int64_t>& lengths, int64_t key_len, Device device) {
    const int64_t B = static_cast<int64_t>(lengths.size());
    std::vector<double> keep(B * key_len);
    for (int64_t b = 0; b < B; ++b) {
        RELGRAD_CHECK(lengths[b] >= 0 && lengths[b] <= key_len, "key_padding_mask: length ", lengths[b],
                      " of sequence ", b, " is outside [0, ", key_len, "]");
        for (int64_t j = 0; j < key_len; ++j) keep[b * key_len + j] = j < lengths[b];
    }
    return from_vector(keep, {B, 1, 1, key_len}, DType::boolean, device);
}

Tensor key_padding_mask(const Tensor& keep) {
    RELGRAD_CHECK(keep.dim() == 2, "key_padding_mask: expects [B, Lk], got shape ", shape_str(keep.shape()));
    return keep.to(DType::boolean).reshape({keep.size(0), 1, 1, keep.size(1)});
}

Tensor causal_mask(int64_t query_len, int64_t key_len, int64_t query_offset, Device device) {
    return pattern_mask(AttentionPattern{Tensor(), true, -1, query_offset}, query_len, key_len, device);
}

Tensor local_window_mask(int64_t query_len, int64_t key_len, int64_t window, int64_t query_offset, Device device) {
    RELGRAD_CHECK(window >= 0, "local_window_mask: window must be >= 0, got ", window);
    return pattern_mask(AttentionPattern{Tensor(), false, window, query_offset}, query_len, key_len, device);
}

AttentionImpl parse_attention_impl(const std::string& name) {
    return parse_named(attention_impl_names, name, "attention implementation");
}

const char* attention_impl_name(AttentionImpl impl) { return name_of(attention_impl_names, impl); }

// ---------------------------------------------------------------- multi-head attention

void require_rule(const AttentionRule& rule, const char* layer, const std::string& given) {
    RELGRAD_CHECK(rule.holds, layer, ": ", given, ": expected ", rule.key, " ", rule.expected);
}

static int64_t head_dim_of(int64_t dim, int64_t heads) {
    RELGRAD_CHECK(dim > 0 && heads > 0, "attention: dim and heads must be positive, got dim = ", dim,
                  ", heads = ", heads);
    require_rule(heads_divide_dim(dim, heads), "attention", sizes_text(dim, heads));
    return dim / heads;
}

MultiHeadAttention::MultiHeadAttention(int64_t d, int64_t h, const Init& init)
    : dim(d),
      heads(h),
      head_dim(head_dim_of(d, h)),
      w_q(d, d, init),
      w_k(d, d, init),
      w_v(d, d, init),
      w_o(d, d, init) {
    register_module("w_q", w_q);
    register_module("w_k", w_k);
    register_module("w_v", w_v);
    register_module("w_o", w_o);
}

Tensor MultiHeadAttention::split_heads(const Tensor& x) const {
    return x.reshape({x.size(0), x.size(1), heads, head_dim}).transpose(1, 2);
}

Tensor MultiHeadAttention::merge_heads(const Tensor& z) const {
    return z.transpose(1, 2).reshape({z.size(0), z.size(2), dim});
}

MultiHeadAttention::Scores MultiHeadAttention::scores(const Tensor&, const Tensor& q, const Tensor& k, int64_t) {
    return {matmul(q, k.transpose(-1, -2)), Tensor()};
}

Tensor MultiHeadAttention::values(const Tensor& a, const Tensor& v, int64_t, const Tensor&) { return matmul(a, v); }

Tensor MultiHeadAttention::forward(const Tensor& query, const Tensor& key_value, const Tensor& mask,
                                   int64_t query_offset) {
    RELGRAD_CHECK(query.dim() == 3 && key_value.dim() == 3 && query.size(2) == dim && key_value.size(2) == dim &&
                      query.size(0) == key_value.size(0),
                  "attention: query ", shape_str(query.shape()), " and key/value ", shape_str(key_value.shape()),
                  " must be [B, Lq, D] and [B, Lk, D] with D = ", dim);
    const int64_t B = query.size(0), Lq = query.size(1), Lk = key_value.size(1);
    const Shape scores_shape{B, heads, Lq, Lk};
    RELGRAD_CHECK(!mask.defined() || broadcast_shapes(mask.shape(), scores_shape, "attention mask") == scores_shape,
                  "attention: mask of shape ", shape_str(mask.shape()),
                  " does not broadcast to [B, H, Lq, Lk] = ", shape_str(scores_shape));
    const AttentionPattern pattern{mask, causal, window, query_offset};
    check_pattern(pattern, Lq, "attention");  // before any position is computed from it
    const Tensor q0 = split_heads(w_q.forward(query)), k0 = split_heads(w_k.forward(key_value));
    const Tensor q = at_positions(q0, query_offset), k = at_positions(k0, 0);
    const Tensor v = split_heads(w_v.forward(key_value));
    if (keep_score_parts) last_score_parts = score_parts(query, q0, k0, q, k, v, pattern);
    return w_o.forward(merge_heads(attend(query, q, k, v, pattern)));
}

MultiHeadAttention::ScoreParts MultiHeadAttention::score_parts(const Tensor& query_input, const Tensor& q0,
                                                               const Tensor& k0, const Tensor& q, const Tensor& k,
                                                               const Tensor& v, const AttentionPattern& pattern) {
    NoGradGuard no_grad;
    const Tensor scale_factor = scalar(scale(), q.dtype(), q.device());
    ScoreParts parts;
    parts.mask = pattern_mask(pattern, q.size(2), k.size(2), q.device());
    parts.content = mul(matmul(q0, k0.transpose(-1, -2)), scale_factor);
    // e = scores * scale + bias, as attend_composed adds them
    const Scores s = scores(query_input, q, k, pattern.query_offset);
    Tensor e = mul(s.scores, scale_factor);
    if (s.bias.defined()) e = add(e, s.bias);
    parts.position = sub(e, parts.content);
    parts.gate = s.gate;
    if (!has_position_values()) return parts;
    // the values' position side: values() less sum_j a_ij v_j, for the weights of these scores
    if (parts.mask.defined())
        e = where(parts.mask, e, scalar(-std::numeric_limits<double>::infinity(), e.dtype(), e.device()));
    const Tensor a = softmax(e, -1), content_z = matmul(a, v);
    const Tensor position_z = sub(values(a, v, pattern.query_offset, s.gate), content_z);
    // in float64, where a row with no key (both norms 0) gives 0 / (0 + 1e-300) = 0
    const auto norm = [](const Tensor& z) {
        const Tensor wide = z.to(DType::float64);
        return sqrt(sum(mul(wide, wide), {-1}));
    };
    const Tensor position_norm = norm(position_z);
    parts.value_share = div(position_norm, add(add(norm(content_z), position_norm),
                                               scalar(1e-300, DType::float64, position_norm.device())));
    return parts;
}

Tensor MultiHeadAttention::forward_incremental(const Tensor& x, KVCache& cache) {
    const int64_t offset = cache.length(), n = x.size(1);
    const Tensor q = at_positions(split_heads(w_q.forward(x)), offset);
    Tensor k = at_positions(split_heads(w_k.forward(x)), offset), v = split_heads(w_v.forward(x));
    if (offset > 0) {
        k = concat({cache.k, k}, 2);
        v = concat({cache.v, v}, 2);
    }
    cache.k = k;
    cache.v = v;
    // the new positions see each other causally; every cached one comes before them all
    AttentionPattern pattern{Tensor(), n > 1, window, offset};
    return w_o.forward(merge_heads(attend(x, q, k, v, pattern)));
}

double MultiHeadAttention::scale() const { return 1.0 / std::sqrt(static_cast<double>(head_dim)); }

Tensor MultiHeadAttention::at_positions(const Tensor& x, int64_t) const { return x; }

Tensor MultiHeadAttention::attend(const Tensor&, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const AttentionPattern& pattern) {
    return attention(q, k, v, pattern_mask(pattern, q.size(2), k.size(2), q.device()), scale(), {}, &last_weights);
}

// e = scale * scores, masked keys -inf, a = softmax(e), z = values(a)
Tensor MultiHeadAttention::attend_composed(const Tensor& query_input, const Tensor& q, const Tensor& k, const Tensor& v,
                                           const AttentionPattern& pattern) {
    const int64_t query_offset = pattern.query_offset;
    const Tensor mask = pattern_mask(pattern, q.size(2), k.size(2), q.device());
    const Scores s = scores(query_input, q, k, query_offset);
    Tensor e = mul(s.scores, scalar(scale(), q.dtype(), q.device()));
    if (s.bias.defined()) e = add(e, s.bias);
    if (mask.defined()) e = where(mask, e, scalar(-std::numeric_limits<double>::infinity(), q.dtype(), q.device()));
    const Tensor a = softmax(e, -1);
    last_weights = a.detach();
    return values(a, v, query_offset, s.gate);
}

// ---------------------------------------------------------------- relative (Shaw)

RelativeMultiHeadAttention::RelativeMultiHeadAttention(int64_t d, int64_t h, const RelativeOptions& options,
                                                       AttentionImpl impl_, const Init& init)
    : MultiHeadAttention(d, h, init),
      impl(impl_),
      value_term(options.values),
      rel_pos_emb_k(head_dim, h, options, init),
      rel_pos_emb_v(head_dim, h, options, init) {
    register_module("rel_pos_emb_k", rel_pos_emb_k);
    if (value_term) register_module("rel_pos_emb_v", rel_pos_emb_v);
}

Tensor RelativeMultiHeadAttention::value_table(const Tensor& q) const {
    if (value_term) return rel_pos_emb_v.table();
    return zeros({rel_pos_emb_v.shared ? 1 : heads, rel_pos_emb_v.buckets(), head_dim}, q.dtype(), q.device());
}

// Reference: build A_K[i, j] = E_K[r(i, j)] ([H or 1, Lq, Lk, Dh]) and contract over Dh, one
// query position i at a time as in Shaw et al.: a shared table is one [B*H, Dh] @ [Dh, Lk] product
// per i, a per-head table one [B, Dh] @ [Dh, Lk] product per (h, i).
// Bucketed: Q E_K^T ([B, H, Lq, K]) holds every q_i . E_K[r] there is; gather picks r(i, j).
Tensor RelativeMultiHeadAttention::relative_scores(const Tensor& q, int64_t key_len, int64_t query_offset) const {
    const int64_t B = q.size(0), Lq = q.size(2);
    if (impl == AttentionImpl::reference) {
        const Tensor table = rel_pos_emb_k.lookup(Lq, key_len, query_offset);
        if (rel_pos_emb_k.shared) {
            const Tensor rows = q.permute({2, 0, 1, 3}).reshape({Lq, B * heads, head_dim});
            return matmul(rows, table.squeeze(0).transpose(-1, -2))
                .reshape({Lq, B, heads, key_len})
                .permute({1, 2, 0, 3});
        }
        return matmul(q.permute({1, 2, 0, 3}), table.transpose(-1, -2)).permute({2, 0, 1, 3});
    }
    const Tensor q_dot_table = matmul(q, rel_pos_emb_k.table().transpose(-1, -2));  // [B, H, Lq, K]
    const Tensor r = rel_pos_emb_k.index(Lq, key_len, query_offset).expand({B, heads, Lq, key_len});
    return gather(q_dot_table, -1, r);
}

// Reference: sum_j a_ij A_V[i, j], laid out as the scores above.
// Bucketed: sum the weights that share a bucket (scatter_add into [B, H, Lq, K]), then times E_V.
Tensor RelativeMultiHeadAttention::relative_values(const Tensor& a, int64_t query_offset) const {
    const int64_t B = a.size(0), Lq = a.size(2), Lk = a.size(3);
    if (impl == AttentionImpl::reference) {
        const Tensor table = rel_pos_emb_v.lookup(Lq, Lk, query_offset);
        if (rel_pos_emb_v.shared) {
            const Tensor rows = a.permute({2, 0, 1, 3}).reshape({Lq, B * heads, Lk});
            return matmul(rows, table.squeeze(0)).reshape({Lq, B, heads, head_dim}).permute({1, 2, 0, 3});
        }
        return matmul(a.permute({1, 2, 0, 3}), table).permute({2, 0, 1, 3});
    }
    const Tensor r = rel_pos_emb_v.index(Lq, Lk, query_offset).expand({B, heads, Lq, Lk});
    const Tensor bucket_weights =
        scatter_add(zeros({B, heads, Lq, rel_pos_emb_v.buckets()}, a.dtype(), a.device()), -1, r, a);
    return matmul(bucket_weights, rel_pos_emb_v.table());
}

Tensor RelativeMultiHeadAttention::attend(const Tensor& query_input, const Tensor& q, const Tensor& k, const Tensor& v,
                                          const AttentionPattern& pattern) {
    switch (impl) {
        case AttentionImpl::reference: return attend_composed(query_input, q, k, v, pattern);
        case AttentionImpl::bucketed: {
            const RelativeTerms terms{rel_pos_emb_k.table(), value_table(q),
                                      rel_pos_emb_k.index(q.size(2), k.size(2), pattern.query_offset)};
            return attention(q, k, v, pattern_mask(pattern, q.size(2), k.size(2), q.device()), scale(), terms,
                             &last_weights);
        }
        case AttentionImpl::fused: {
            last_weights = Tensor();
            const ClippedRelativeTerms terms{rel_pos_emb_k.table(), value_table(q), rel_pos_emb_k.k_left,
                                             rel_pos_emb_k.k_right};
            return fused_attention(q, k, v, pattern, scale(), terms);
        }
    }
    RELGRAD_INTERNAL_ASSERT(false, "an attention form that is not reference, bucketed or fused");
}

MultiHeadAttention::Scores RelativeMultiHeadAttention::scores(const Tensor& query_input, const Tensor& q,
                                                              const Tensor& k, int64_t query_offset) {
    return {add(MultiHeadAttention::scores(query_input, q, k, query_offset).scores,
                relative_scores(q, k.size(2), query_offset)),
            Tensor()};
}

Tensor RelativeMultiHeadAttention::values(const Tensor& a, const Tensor& v, int64_t query_offset, const Tensor& gate) {
    if (!value_term) return MultiHeadAttention::values(a, v, query_offset, gate);
    const Tensor relative = relative_values(a, query_offset);
    return add(MultiHeadAttention::values(a, v, query_offset, gate), gate.defined() ? mul(gate, relative) : relative);
}

// ---------------------------------------------------------------- gated

// The gate mixes the relative term with an absolute one inside the scores, which the fused kernel
// does not take: the gated layer composes its scores op by op (bucketed) or from the tables
// (reference).
static void require_composed_form(AttentionImpl impl) {
    require_rule(gated_form_is_composed(impl), "GatedPositionAttention",
                 std::string("attention = ") + attention_impl_name(impl));
}

GatedPositionAttention::GatedPositionAttention(int64_t d, int64_t h, const RelativeOptions& options,
                                               AttentionImpl impl_, bool token_gate_, const Init& init)
    : RelativeMultiHeadAttention(d, h, options, impl_, init),
      positions(d),
      w_pq(d, d, init),
      w_pk(d, d, init),
      token_gate(token_gate_) {
    require_composed_form(impl);
    register_module("w_pq", w_pq);
    register_module("w_pk", w_pk);
    register_parameter("gate", gate, zeros({h}, init.dtype));
    if (token_gate) {
        // no bias (lambda is the per-head offset) and zero weights: every gate starts at 0.5
        w_gate = std::make_unique<Linear>(d, h, init, /*bias=*/false);
        w_gate->assign_parameters({zeros({h, d}, init.dtype).requires_grad_(true)});
        register_module("w_gate", *w_gate);
    }
}

std::vector<double> GatedPositionAttention::gate_values() const {
    NoGradGuard no_grad;
    return sigmoid(gate).to_vector();
}

Tensor GatedPositionAttention::gate_for(const Tensor& query_input) const {
    const Tensor lambda = gate.reshape({1, heads, 1, 1});
    if (!token_gate) return sigmoid(lambda);
    // per token and head: lambda_h + x_i W_g^T, [B, Lq, H] -> [B, H, Lq, 1]
    return sigmoid(add(lambda, w_gate->forward(query_input).transpose(1, 2).unsqueeze(-1)));
}

Tensor GatedPositionAttention::attend(const Tensor& query_input, const Tensor& q, const Tensor& k, const Tensor& v,
                                      const AttentionPattern& pattern) {
    require_composed_form(impl);  // impl is a public member: it may have changed since construction
    return attend_composed(query_input, q, k, v, pattern);
}

MultiHeadAttention::Scores GatedPositionAttention::scores(const Tensor& query_input, const Tensor& q, const Tensor& k,
                                                          int64_t query_offset) {
    const int64_t Lq = q.size(2), Lk = k.size(2);
    const Tensor g = gate_for(query_input);
    const Tensor one = scalar(1, q.dtype(), q.device());
    // the untied absolute term (P_i U_q) . (P_j U_k), shared by the batch: [1, H, Lq, Lk]
    const Tensor P =
        positions.encoding(query_offset + Lq > Lk ? query_offset + Lq : Lk, q.dtype(), q.device()).unsqueeze(0);
    const Tensor pq = split_heads(w_pq.forward(P.narrow(1, query_offset, Lq)));
    const Tensor pk = split_heads(w_pk.forward(P.narrow(1, 0, Lk)));
    const Tensor absolute = matmul(pq, pk.transpose(-1, -2));
    const Tensor relative = relative_scores(q, Lk, query_offset);
    return {add(MultiHeadAttention::scores(query_input, q, k, query_offset).scores,
                add(mul(g, relative), mul(sub(one, g), absolute))),
            g};
}

// ---------------------------------------------------------------- RoPE

RotaryMultiHeadAttention::RotaryMultiHeadAttention(int64_t d, int64_t h, double base_, AttentionImpl impl_,
                                                   const Init& init)
    : MultiHeadAttention(d, h, init), base(base_), impl(impl_) {
    require_rule(rope_head_dim_is_even(d, h), "RotaryMultiHeadAttention", sizes_text(d, h));
    rope_tables(0, head_dim, 0, base, init.dtype);  // checks the base
}

// Reference: the rotation op by op, on the pairs [..., L, Dh / 2, 2] of x; the other forms: the
// rope op, one kernel each way.
Tensor RotaryMultiHeadAttention::at_positions(const Tensor& x, int64_t first_position) const {
    if (impl != AttentionImpl::reference) return rope(x, first_position, base);
    const int64_t L = x.size(2);
    const RopeTables t = rope_tables(L, head_dim, first_position, base, x.dtype(), x.device());
    const Tensor pairs = x.reshape({x.size(0), x.size(1), L, head_dim / 2, 2});
    const Tensor even = pairs.narrow(-1, 0, 1), odd = pairs.narrow(-1, 1, 1);
    const Tensor c = t.cos.unsqueeze(-1), s = t.sin.unsqueeze(-1);  // [L, Dh / 2, 1]
    return concat({sub(mul(even, c), mul(odd, s)), add(mul(even, s), mul(odd, c))}, -1).reshape(x.shape());
}

Tensor RotaryMultiHeadAttention::attend(const Tensor& query_input, const Tensor& q, const Tensor& k, const Tensor& v,
                                        const AttentionPattern& pattern) {
    switch (impl) {
        case AttentionImpl::reference: return attend_composed(query_input, q, k, v, pattern);
        case AttentionImpl::bucketed: return MultiHeadAttention::attend(query_input, q, k, v, pattern);
        case AttentionImpl::fused: last_weights = Tensor(); return fused_attention(q, k, v, pattern, scale());
    }
    RELGRAD_INTERNAL_ASSERT(false, "an attention form that is not reference, bucketed or fused");
}

// ---------------------------------------------------------------- a bias by distance (ALiBi, T5)

DistanceBiasAttention::DistanceBiasAttention(int64_t d, int64_t h, AttentionImpl impl_, const Init& init)
    : MultiHeadAttention(d, h, init), impl(impl_) {}

std::vector<int64_t> DistanceBiasAttention::entry_distances(int64_t query_len, int64_t key_len, int64_t query_offset) {
    // entry e = j - i + Lq - 1 holds d = j - (query_offset + i) = e - (Lq - 1) - query_offset
    std::vector<int64_t> distances(std::max<int64_t>(query_len + key_len - 1, 0));
    for (std::size_t e = 0; e < distances.size(); ++e)
        distances[e] = static_cast<int64_t>(e) - (query_len - 1) - query_offset;
    return distances;
}

std::vector<int64_t> DistanceBiasAttention::pair_distances(int64_t query_len, int64_t key_len, int64_t query_offset) {
    std::vector<int64_t> distances(query_len * key_len);
    for (int64_t i = 0; i < query_len; ++i)
        for (int64_t j = 0; j < key_len; ++j) distances[i * key_len + j] = j - (query_offset + i);
    return distances;
}

Tensor DistanceBiasAttention::attend(const Tensor& query_input, const Tensor& q, const Tensor& k, const Tensor& v,
                                     const AttentionPattern& pattern) {
    const int64_t Lq = q.size(2), Lk = k.size(2), offset = pattern.query_offset;
    switch (impl) {
        case AttentionImpl::reference: return attend_composed(query_input, q, k, v, pattern);
        case AttentionImpl::bucketed:
            return attention(q, k, v, pattern_mask(pattern, Lq, Lk, q.device()), scale(), bucketed_bias(Lq, Lk, offset),
                             &last_weights);
        case AttentionImpl::fused: {
            last_weights = Tensor();
            ClippedRelativeTerms terms;
            terms.distance_bias = distance_bias(Lq, Lk, offset);
            return fused_attention(q, k, v, pattern, scale(), terms);
        }
    }
    RELGRAD_INTERNAL_ASSERT(false, "an attention form that is not reference, bucketed or fused");
}

MultiHeadAttention::Scores DistanceBiasAttention::scores(const Tensor& query_input, const Tensor& q, const Tensor& k,
                                                         int64_t query_offset) {
    Scores s = MultiHeadAttention::scores(query_input, q, k, query_offset);
    s.bias = bias_matrix(q.size(2), k.size(2), query_offset);
    return s;
}

// ---------------------------------------------------------------- ALiBi

AlibiAttention::AlibiAttention(int64_t d, int64_t h, AttentionImpl impl_, const Init& init)
    : DistanceBiasAttention(d, h, impl_, init), slopes(alibi_slopes(h)) {}

// -m_h |d| = m_h * (-|d|): the slopes [H, 1, 1] times the distances [Lq, Lk]
Tensor AlibiAttention::bias_matrix(int64_t query_len, int64_t key_len, int64_t query_offset) const {
    std::vector<double> minus_distance;
    for (int64_t d : pair_distances(query_len, key_len, query_offset))
        minus_distance.push_back(-static_cast<double>(std::llabs(d)));
    const DType dtype = w_q.weight.dtype();
    const Device device = w_q.weight.device();
    return mul(from_vector(slopes, {heads, 1, 1}, dtype, device),
               from_vector(minus_distance, {query_len, key_len}, dtype, device));
}

// the bucket of a pair is its entry of the distance row
RelativeTerms AlibiAttention::bucketed_bias(int64_t query_len, int64_t key_len, int64_t query_offset) const {
    RelativeTerms terms;
    terms.index = distance_entry_index(query_len, key_len, w_q.weight.device());
    terms.bias = distance_bias(query_len, key_len, query_offset);
    return terms;
}

Tensor AlibiAttention::distance_bias(int64_t query_len, int64_t key_len, int64_t query_offset) const {
    const std::vector<int64_t> distances = entry_distances(query_len, key_len, query_offset);
    const int64_t n = static_cast<int64_t>(distances.size());
    std::vector<double> bias(heads * n);
    for (int64_t h = 0; h < heads; ++h)
        for (int64_t e = 0; e < n; ++e) bias[h * n + e] = -slopes[h] * static_cast<double>(std::llabs(distances[e]));
    return from_vector(bias, {heads, n}, w_q.weight.dtype(), w_q.weight.device());
}

// ---------------------------------------------------------------- T5's bias

T5BiasAttention::T5BiasAttention(int64_t d, int64_t h, const RelativeFamilyOptions& options, bool bidirectional_,
                                 AttentionImpl impl_, const Init& init, const Embedding* shared_table)
    : DistanceBiasAttention(d, h, impl_, init),
      num_buckets(options.t5_buckets),
      max_distance(options.t5_max_distance),
      bidirectional(bidirectional_),
      shared_table_(shared_table) {
    RELGRAD_CHECK(num_buckets >= 4 && max_distance > num_buckets / 2, "T5BiasAttention: t5_buckets ", num_buckets,
                  " must be >= 4 and t5_max_distance ", max_distance, " more than t5_buckets / 2");
    if (shared_table_) {
        RELGRAD_CHECK(shared_table_->num_embeddings == num_buckets && shared_table_->dim == heads,
                      "T5BiasAttention: a shared table must be [t5_buckets, heads]");
        return;
    }
    own_table_ = std::make_unique<Embedding>(num_buckets, h, init);
    register_module("relative_attention_bias", *own_table_);
}

Tensor T5BiasAttention::buckets_of(const std::vector<int64_t>& distances, const Shape& shape) const {
    std::vector<double> buckets(distances.size());
    for (std::size_t e = 0; e < distances.size(); ++e)
        buckets[e] = static_cast<double>(t5_bucket(distances[e], bidirectional, num_buckets, max_distance));
    return from_vector(buckets, shape, DType::int64, table().weight.device());
}

// W[bucket(d), h] for every pair: [Lq, Lk, H] -> [H, Lq, Lk]
Tensor T5BiasAttention::bias_matrix(int64_t query_len, int64_t key_len, int64_t query_offset) const {
    const Tensor buckets = buckets_of(pair_distances(query_len, key_len, query_offset), {query_len, key_len});
    return table().forward(buckets).permute({2, 0, 1});
}

RelativeTerms T5BiasAttention::bucketed_bias(int64_t query_len, int64_t key_len, int64_t query_offset) const {
    RelativeTerms terms;
    terms.index = buckets_of(pair_distances(query_len, key_len, query_offset), {query_len, key_len});
    terms.bias = table().weight.transpose(0, 1);  // [H, buckets]
    return terms;
}

Tensor T5BiasAttention::distance_bias(int64_t query_len, int64_t key_len, int64_t query_offset) const {
    const std::vector<int64_t> distances = entry_distances(query_len, key_len, query_offset);
    return table().forward(buckets_of(distances, {static_cast<int64_t>(distances.size())})).transpose(0, 1);
}

}  // namespace relgrad
