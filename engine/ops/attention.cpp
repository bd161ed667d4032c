// Attention as one op. Composing it from matmul, gather, scatter_add, where and softmax works
// (layers/attention.cpp does exactly that for the reference form) but keeps a dozen [B, H, Lq, Lk]
// intermediates alive for the backward; here only the weights a are kept, and the backward is
// written out by hand:
//
//   forward                                     backward (g = dL/dz)
//   s  = q k^T + gather_r(q E_K^T)              dv   = a^T g
//   a  = softmax(mask ? scale s : -inf)         dW   = g E_V^T                 [B, H, Lq, K]
//   W  = bucket_sum_r(a)        [B, H, Lq, K]   dE_V = sum_{b,h} W^T g
//   z  = a v + W E_V                            da   = g v^T + gather_r(dW)
//                                               ds   = scale a (da - rowsum(da a))
//                                               dQE  = bucket_sum_r(ds)       [B, H, Lq, K]
//                                               dq   = ds k + dQE E_K,  dk = ds^T q
//                                               dE_K = sum_{b,h} dQE^T q
//
// gather_r(X)[i, j] = X[i, r(i, j)] and bucket_sum_r(Y)[i, r] = sum_{j: r(i,j)=r} Y[i, j] are each
// other's adjoints; both are folded into the two backend row kernels, attention_softmax (which
// also returns W) and attention_softmax_backward (which also returns dQE).
//
// A score bias per bucket (ALiBi, T5) rides on the key-side bucket scores: scale (s + QE + bias /
// scale) = scale (s + QE) + bias, so the kernels add it with QE, and dbias = sum_{b,i} dQE / scale.
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/autograd.hpp"
#include "engine/backend/backend.hpp"
#include "engine/errors.hpp"
#include "engine/ops.hpp"
#include "engine/ops/common.hpp"
#include "engine/profile.hpp"

namespace relgrad {

static void check_attention_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                   const RelativeTerms& rel, const char* op) {
    require_same_device({q, k, v, mask, rel.table_k, rel.table_v, rel.index, rel.bias}, op);
    const bool ok = q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.shape() == v.shape() && q.size(0) == k.size(0) &&
                    q.size(1) == k.size(1) && q.size(3) == k.size(3) && q.dtype() == k.dtype() &&
                    k.dtype() == v.dtype();
    RELGRAD_CHECK(ok, "attention: q ", shape_str(q.shape()), ", k ", shape_str(k.shape()), " and v ",
                  shape_str(v.shape()), " must be [B, H, Lq, Dh], [B, H, Lk, Dh], [B, H, Lk, Dh] of one dtype");
    require_floating(q, "attention");
    const bool tables = rel.table_k.defined() || rel.table_v.defined();
    if (!rel.index.defined()) {
        RELGRAD_CHECK(!tables && !rel.bias.defined(), op, ": relative tables or a bias need the bucket index");
        return;
    }
    const int64_t H = q.size(1), Dh = q.size(3);
    auto table_ok = [&](const Tensor& t) {
        return t.defined() && t.dim() == 3 && (t.size(0) == 1 || t.size(0) == H) && t.size(2) == Dh &&
               t.dtype() == q.dtype();
    };
    const bool index_ok = rel.index.dtype() == DType::int64 && rel.index.shape() == Shape{q.size(2), k.size(2)};
    const bool tables_ok =
        !tables || (table_ok(rel.table_k) && table_ok(rel.table_v) && rel.table_k.shape() == rel.table_v.shape());
    RELGRAD_CHECK(index_ok && tables_ok && (tables || rel.bias.defined()), op, ": relative tables ",
                  shape_str(rel.table_k.shape()), " and ", shape_str(rel.table_v.shape()),
                  " must be [1 or H, K, Dh] and the index ", shape_str(rel.index.shape()),
                  " int64 [Lq, Lk], with tables or a bias");
    if (!rel.bias.defined()) return;
    const bool bias_ok = rel.bias.dim() == 2 && (rel.bias.size(0) == 1 || rel.bias.size(0) == H) &&
                         rel.bias.dtype() == q.dtype() && (!tables || rel.bias.size(1) == rel.table_k.size(1));
    RELGRAD_CHECK(bias_ok, op, ": the score bias ", shape_str(rel.bias.shape()), " must be [1 or H, K] of q's dtype",
                  tables ? " with the tables' K" : "");
    // the buckets themselves are checked by the attention_softmax kernel, on the device
}

// The mask as a bool view expanded to [B, H, Lq, Lk] (no copy of its elements), or undefined.
static Tensor expanded_bool_mask(const Tensor& mask, const Shape& shape, const std::string& op) {
    if (!mask.defined()) return Tensor();
    RELGRAD_CHECK(broadcast_shapes(mask.shape(), shape, "attention mask") == shape, op, ": mask of shape ",
                  shape_str(mask.shape()), " does not broadcast to [B, H, Lq, Lk] = ", shape_str(shape));
    return mask.to(DType::boolean).expand(shape);
}

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, double scale,
                 const RelativeTerms& rel, Tensor* weights) {
    const ProfileScope profiled("attention");
    check_attention_inputs(q, k, v, mask, rel, "attention");
    if (is_16_bit(q.dtype())) {
        // see ops.hpp, 16 bits: the scores, their softmax and the bucket sums in float32 (the
        // weights kept for the backward too), the output rounded once
        const DType f32 = DType::float32;
        auto widened = [](const Tensor& t) { return t.defined() ? t.to(DType::float32) : Tensor(); };
        const RelativeTerms wide{widened(rel.table_k), widened(rel.table_v), rel.index, widened(rel.bias)};
        Tensor wide_weights;
        const Tensor z =
            attention(q.to(f32), k.to(f32), v.to(f32), mask, scale, wide, weights ? &wide_weights : nullptr);
        if (weights) *weights = wide_weights.to(q.dtype());
        return z.to(q.dtype());
    }
    const int64_t B = q.size(0), H = q.size(1), Lq = q.size(2), Lk = k.size(2);
    const bool tables = rel.table_k.defined(), biased = rel.bias.defined();
    RELGRAD_CHECK(!biased || scale != 0, "attention: a score bias needs a non-zero scale");
    const int64_t K = tables ? rel.table_k.size(1) : biased ? rel.bias.size(1) : 0;
    const Shape bias_view{1, biased ? rel.bias.size(0) : 1, 1, K};  // the bias as [1, H or 1, 1, K]
    Backend& backend = backend_for(q.device());
    Tensor a, bucket_weights, z;
    {
        NoGradGuard forward_only;
        a = matmul(q, k.transpose(-1, -2));  // a fresh [B, H, Lq, Lk]: the softmax runs in place
        Tensor bucket_scores = tables ? matmul(q, rel.table_k.transpose(-1, -2)) : Tensor();
        if (biased) {
            const Tensor bias_scores = mul(rel.bias.reshape(bias_view), 1.0 / scale);
            bucket_scores = tables ? add(bucket_scores, bias_scores) : bias_scores.expand({B, H, Lq, K}).contiguous();
        }
        const Tensor expanded_mask = expanded_bool_mask(mask, {B, H, Lq, Lk}, "attention");
        if (tables) bucket_weights = empty({B, H, Lq, K}, q.dtype(), q.device());
        backend.attention_softmax(a, bucket_scores, rel.index, expanded_mask, scale, bucket_weights);
        z = matmul(a, v);
        if (tables) z = add(z, matmul(bucket_weights, rel.table_v));
    }
    if (weights) *weights = a;
    std::vector<Tensor> inputs = {q, k, v};
    if (tables) inputs.insert(inputs.end(), {rel.table_k, rel.table_v});
    if (biased) inputs.push_back(rel.bias);
    // a constant bias (ALiBi's) needs no bucket sums of ds
    const bool bias_gradient = biased && rel.bias.requires_grad();
    auto detached = [](const Tensor& t) { return t.defined() ? t.detach() : Tensor(); };
    const std::vector<Save> saved = {{"q", q},
                                     {"k", k},
                                     {"v", v},
                                     {"weights", a},
                                     {"table_k", rel.table_k},
                                     {"table_v", rel.table_v},
                                     {"index", rel.index},
                                     {"bias", rel.bias}};
    return record(z, "attention", inputs, saved,
                  [q = q.detach(), k = k.detach(), v = v.detach(), a, bucket_weights, scale, bias_view, bias_gradient,
                   rel = RelativeTerms{detached(rel.table_k), detached(rel.table_v), rel.index, detached(rel.bias)}](
                      const Tensor& g) {
                      Backend& backend = backend_for(g.device());
                      const bool tables = rel.table_k.defined(), biased = rel.bias.defined();
                      std::vector<Tensor> grads(3 + (tables ? 2 : 0) + (biased ? 1 : 0));
                      grads[2] = matmul(a.transpose(-1, -2), g);   // dv
                      Tensor ds = matmul(g, v.transpose(-1, -2));  // da, a fresh tensor turned into ds in place
                      Tensor d_buckets;
                      if (tables) {
                          d_buckets = matmul(g, rel.table_v.transpose(-1, -2));
                          grads[4] = sum_to(matmul(bucket_weights.transpose(-1, -2), g), rel.table_v.shape());
                      }
                      const Shape bucket_shape{a.size(0), a.size(1), a.size(2), bias_view[3]};
                      Tensor d_bucket_scores =
                          tables || bias_gradient ? empty(bucket_shape, g.dtype(), g.device()) : Tensor();
                      const bool by_bucket = d_buckets.defined() || d_bucket_scores.defined();
                      backend.attention_softmax_backward(ds, a, d_buckets, by_bucket ? rel.index : Tensor(), scale,
                                                         d_bucket_scores);
                      grads[0] = matmul(ds, k);                    // dq
                      grads[1] = matmul(ds.transpose(-1, -2), q);  // dk
                      if (tables) {
                          grads[0] = add(grads[0], matmul(d_bucket_scores, rel.table_k));
                          grads[3] = sum_to(matmul(d_bucket_scores.transpose(-1, -2), q), rel.table_k.shape());
                      }
                      if (bias_gradient)
                          grads.back() = mul(sum_to(d_bucket_scores, bias_view), 1.0 / scale).reshape(rel.bias.shape());
                      return grads;
                  });
}

}  // namespace relgrad

// ---------------------------------------------------------------- fused attention
//
// The same math as `attention`, with the weights never stored: the kernels (the CPU's in
// engine/backend/cpu/fused_attention.cpp) visit the keys in tiles with an online softmax, keep
// per query row a running max m, a running sum l, the output accumulator and the K = k_left + k_right + 1 bucket sums
// of the weights (for the E_V term), and save only lse = m + log l. The backward recomputes the
// weights tile by tile as exp(s - lse). A distance bias b_h(j - i) is read per pair from its row
// of Lq + Lk - 1 entries, and its gradient is the sum of ds_ij over the pairs at each distance.

namespace relgrad {

static void check_fused_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionPattern& pattern,
                               const ClippedRelativeTerms& rel) {
    check_attention_inputs(q, k, v, pattern.mask, RelativeTerms{}, "fused_attention");
    check_pattern(pattern, q.size(2), "fused_attention");
    require_same_device({q, rel.table_k, rel.table_v, rel.distance_bias}, "fused_attention");
    const bool tables = rel.table_k.defined() || rel.table_v.defined();
    if (rel.distance_bias.defined()) {
        const Tensor& bias = rel.distance_bias;
        const int64_t H = q.size(1), entries = q.size(2) + k.size(2) - 1;
        RELGRAD_CHECK(!tables, "fused_attention: Shaw's tables or a distance bias, not both");
        RELGRAD_CHECK(bias.dim() == 2 && (bias.size(0) == 1 || bias.size(0) == H) && bias.size(1) == entries &&
                          bias.dtype() == q.dtype(),
                      "fused_attention: the distance bias ", shape_str(bias.shape()),
                      " must be [1 or H, Lq + Lk - 1] = [1 or ", H, ", ", entries, "] of q's dtype");
    }
    if (!tables) return;
    RELGRAD_CHECK(rel.k_left <= kMaxClippingDistance && rel.k_right <= kMaxClippingDistance,
                  "fused_attention: clipping distances k_left ", rel.k_left, " and k_right ", rel.k_right,
                  " must be at most 2^40");
    const int64_t H = q.size(1), Dh = q.size(3), K = rel.k_left + rel.k_right + 1;
    auto table_ok = [&](const Tensor& t) {
        return t.defined() && t.dim() == 3 && (t.size(0) == 1 || t.size(0) == H) && t.size(1) == K && t.size(2) == Dh &&
               t.dtype() == q.dtype();
    };
    RELGRAD_CHECK(rel.k_left >= 0 && rel.k_right >= 0 && table_ok(rel.table_k) && table_ok(rel.table_v) &&
                      rel.table_k.shape() == rel.table_v.shape(),
                  "fused_attention: relative tables ", shape_str(rel.table_k.shape()), " and ",
                  shape_str(rel.table_v.shape()), " must both be [1 or H, k_left + k_right + 1, Dh] = [1 or ", H, ", ",
                  K, ", ", Dh, "] with k_left, k_right >= 0 (got ", rel.k_left, ", ", rel.k_right, ")");
}

Tensor combine_masks(const Tensor& a, const Tensor& b) {
    if (!a.defined()) return b;
    if (!b.defined()) return a;
    NoGradGuard no_grad;
    return mul(a.to(DType::float32), b.to(DType::float32)).to(DType::boolean);  // logical and
}

// The rules written by the device's kernel (Backend::pattern_mask), and the given mask and-ed in.
Tensor pattern_mask(const AttentionPattern& pattern, int64_t query_len, int64_t key_len, Device device) {
    const ProfileScope profiled("pattern_mask");
    check_pattern(pattern, query_len, "attention");
    if (!pattern.causal && pattern.window < 0) return pattern.mask;
    Tensor visible = empty({query_len, key_len}, DType::boolean, device);  // "shape [-1, 4] has a negative size"
    backend_for(device).pattern_mask(pattern, visible);
    return combine_masks(pattern.mask, visible);
}

Tensor distance_entry_index(int64_t query_len, int64_t key_len, Device device) {
    std::vector<double> entry(query_len * key_len);
    for (int64_t i = 0; i < query_len; ++i)
        for (int64_t j = 0; j < key_len; ++j)
            entry[i * key_len + j] = static_cast<double>(distance_entry(i, j, query_len));
    return from_vector(entry, {query_len, key_len}, DType::int64, device);
}

// For a backend without the fused kernels: the same attention by the bucketed op, with the
// pattern as a mask and the clipped index written out as [Lq, Lk] tensors (made on the host and
// copied to q's device). Memory grows as Lq Lk again.
static Tensor bucketed_fallback(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionPattern& pattern,
                                double scale, const ClippedRelativeTerms& rel) {
    const int64_t Lq = q.size(2), Lk = k.size(2);
    RelativeTerms relative;
    if (rel.distance_bias.defined()) {  // the bias row indexed by each pair's entry
        relative = {Tensor(), Tensor(), distance_entry_index(Lq, Lk, q.device()), rel.distance_bias};
    }
    if (rel.table_k.defined()) {
        std::vector<double> bucket(Lq * Lk);  // r(i, j)
        for (int64_t i = 0; i < Lq; ++i) {
            for (int64_t j = 0; j < Lk; ++j) {
                const int64_t distance = j - (pattern.query_offset + i);
                bucket[i * Lk + j] = static_cast<double>(clipped_bucket(distance, rel.k_left, rel.k_right));
            }
        }
        relative = {rel.table_k, rel.table_v, from_vector(bucket, {Lq, Lk}, DType::int64, q.device())};
    }
    return attention(q, k, v, pattern_mask(pattern, Lq, Lk, q.device()), scale, relative);
}

Tensor fused_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const AttentionPattern& pattern_in,
                       double scale, const ClippedRelativeTerms& rel_in) {
    const ProfileScope profiled("fused_attention");
    check_fused_inputs(q_in, k_in, v_in, pattern_in, rel_in);
    const int64_t B = q_in.size(0), H = q_in.size(1), Lq = q_in.size(2), Lk = k_in.size(2), Dh = q_in.size(3);
    AttentionPattern pattern = pattern_in;
    pattern.mask = expanded_bool_mask(pattern.mask, {B, H, Lq, Lk}, "fused_attention");
    if (!backend_for(q_in.device()).supports(OptionalKernel::fused_attention)) {
        return bucketed_fallback(q_in, k_in, v_in, pattern, scale, rel_in);
    }
    const bool relative = rel_in.table_k.defined(), biased = rel_in.distance_bias.defined();
    // the kernels read packed operands; the mask stays a (broadcast) view
    const Tensor q = q_in.detach().contiguous(), k = k_in.detach().contiguous(), v = v_in.detach().contiguous();
    ClippedRelativeTerms rel = rel_in;
    if (relative) {
        rel.table_k = rel_in.table_k.detach().contiguous();
        rel.table_v = rel_in.table_v.detach().contiguous();
    }
    if (biased) rel.distance_bias = rel_in.distance_bias.detach().contiguous();
    // a constant bias (ALiBi's) needs no gradient
    const bool bias_gradient = biased && rel_in.distance_bias.requires_grad();
    const bool empty_problem = q.numel() == 0 || Dh == 0;
    // lse is a statistic: float32 for 16-bit inputs, as the kernels compute it
    const DType lse_dtype = is_16_bit(q.dtype()) ? DType::float32 : q.dtype();
    Tensor z = zeros({B, H, Lq, Dh}, q.dtype(), q.device()), lse = empty({B, H, Lq}, lse_dtype, q.device());
    if (!empty_problem) backend_for(q.device()).fused_attention(q, k, v, pattern, scale, rel, z, lse);
    std::vector<Tensor> inputs = {q_in, k_in, v_in};
    if (relative) inputs.insert(inputs.end(), {rel_in.table_k, rel_in.table_v});
    if (biased) inputs.push_back(rel_in.distance_bias);
    const std::vector<Save> saved = {{"q", q},
                                     {"k", k},
                                     {"v", v},
                                     {"z", z},
                                     {"mask", pattern.mask},
                                     {"table_k", rel.table_k},
                                     {"table_v", rel.table_v},
                                     {"distance_bias", rel.distance_bias}};
    return record(z, "fused_attention", inputs, saved,
                  [q, k, v, z = z.detach(), lse, pattern, scale, rel, empty_problem, bias_gradient](const Tensor& g) {
                      // zeros when there is nothing to compute; else the kernel writes every element
                      auto fresh = [empty_problem](const Tensor& t) {
                          return empty_problem ? zeros_like(t) : empty(t.shape(), t.dtype(), t.device());
                      };
                      const bool relative = rel.table_k.defined(), biased = rel.distance_bias.defined();
                      std::vector<Tensor> grads = {fresh(q), fresh(k), fresh(v)};
                      if (relative) grads.insert(grads.end(), {fresh(rel.table_k), fresh(rel.table_v)});
                      // the bias's gradient per (batch, head), summed over them below
                      const Shape bias_grad_shape{q.size(0), q.size(1), biased ? rel.distance_bias.size(1) : 0};
                      Tensor d_bias = !bias_gradient  ? Tensor()
                                      : empty_problem ? zeros(bias_grad_shape, q.dtype(), q.device())
                                                      : empty(bias_grad_shape, q.dtype(), q.device());
                      if (!empty_problem) {
                          Tensor unused_k, unused_v;
                          backend_for(g.device())
                              .fused_attention_backward(q, k, v, z, lse, g.contiguous(), pattern, scale, rel, grads[0],
                                                        grads[1], grads[2], relative ? grads[3] : unused_k,
                                                        relative ? grads[4] : unused_v, d_bias);
                      }
                      if (biased) grads.push_back(bias_gradient ? sum_to(d_bias, rel.distance_bias.shape()) : Tensor());
                      return grads;
                  });
}

}  // namespace relgrad

// ---------------------------------------------------------------- RoPE
//
//   forward                                          backward (g = dL/dy)
//   y_2t   = x_2t cos(a) - x_2t+1 sin(a)             dx_2t   = g_2t cos(a) + g_2t+1 sin(a)
//   y_2t+1 = x_2t sin(a) + x_2t+1 cos(a)             dx_2t+1 = -g_2t sin(a) + g_2t+1 cos(a)
//   with a = p theta_t                               (the rotation by -a: R(a)^T = R(-a))

namespace relgrad {

RopeTables rope_tables(int64_t length, int64_t head_dim, int64_t first_position, double base, DType dtype,
                       Device device) {
    RELGRAD_CHECK(length >= 0 && head_dim >= 0 && head_dim % 2 == 0, "rope: length ", length, " and head dim ",
                  head_dim, " must be >= 0, the head dim even");
    RELGRAD_CHECK(first_position >= 0 && first_position <= kMaxPosition - length, "rope: first position ",
                  first_position, " must be in [0, 2^40 - L] = [0, ", kMaxPosition - length, "] for L = ", length,
                  " positions");
    RELGRAD_CHECK(std::isfinite(base) && base > 0, "rope: base ", base, " must be a positive number");
    const int64_t pairs = head_dim / 2;
    std::vector<double> cos_values(length * pairs), sin_values(length * pairs);
    for (int64_t t = 0; t < pairs; ++t) {
        const double theta = std::pow(base, -2.0 * static_cast<double>(t) / static_cast<double>(head_dim));
        for (int64_t l = 0; l < length; ++l) {
            const double angle = static_cast<double>(first_position + l) * theta;
            cos_values[l * pairs + t] = std::cos(angle);
            sin_values[l * pairs + t] = std::sin(angle);
        }
    }
    return {from_vector(cos_values, {length, pairs}, dtype, device),
            from_vector(sin_values, {length, pairs}, dtype, device)};
}

Tensor rope(const Tensor& x, int64_t first_position, double base) {
    const ProfileScope profiled("rope");
    RELGRAD_CHECK(x.dim() >= 2 && x.size(-1) % 2 == 0, "rope: x ", shape_str(x.shape()),
                  " must be [..., L, Dh] with Dh even");
    require_floating(x, "rope");
    // the angles in the dtype the kernel computes in (float32 for 16-bit x)
    const RopeTables tables =
        rope_tables(x.size(-2), x.size(-1), first_position, base, statistics_dtype(x.dtype()), x.device());
    Tensor y = empty(x.shape(), x.dtype(), x.device());
    backend_for(x.device()).rotate_pairs(x.detach().contiguous(), tables.cos, tables.sin, y);
    return record(y, "rope", {x}, [tables](const Tensor& g) {
        Tensor dx = empty(g.shape(), g.dtype(), g.device());
        backend_for(g.device()).rotate_pairs(g.contiguous(), tables.cos, neg(tables.sin), dx);
        return std::vector<Tensor>{dx};
    });
}

}  // namespace relgrad
