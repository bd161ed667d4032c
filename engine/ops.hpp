// relgrad: the differentiable ops. Each is defined, forward and backward side by side, in one
// file of engine/ops/ (named in the section headers below). Binary ops broadcast as NumPy does;
// inputs of a binary op must share a dtype. Negative dims count from the end.
//
// 16 bits (bfloat16, float16): every op takes them, and its output keeps its inputs' dtype. The
// kernels compute in float32 and round each result once (backend.cpp); the ops that form a
// statistic (softmax, log_softmax, layer_norm, attention) form it in float32 (statistics_dtype)
// and round only their output, and their backward computes in float32 too; fused_attention keeps
// lse in float32, and cross_entropy returns its loss in float32.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/attention_pattern.hpp"
#include "engine/tensor.hpp"

namespace relgrad {

// --- elementwise.cpp
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);  // a^b, a > 0 where b is differentiated
Tensor pow(const Tensor& a, double exponent);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);  // exact form: x * Phi(x)
Tensor clamp(const Tensor& x, double low, double high);
// cond ? a : b (cond: any dtype, non-zero = true; all three broadcast)
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// x with `value` where mask is non-zero (mask broadcasts to x)
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& x);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator*(double a, const Tensor& b);
Tensor mul(const Tensor& a, double b);  // a * b with b as a 0-d tensor of a's dtype
Tensor add(const Tensor& a, double b);

// Broadcasting helpers (no autograd of their own)
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Sum g over the dims that broadcasting added or stretched, giving a tensor of `shape`.
Tensor sum_to(const Tensor& g, const Shape& shape);

// --- reduce.cpp
Tensor sum(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);  // {} = all
Tensor mean(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
// Maximum over dims; the gradient is shared equally between tied maxima.
Tensor max(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);

// --- linalg.cpp
// [M, K] @ [K, N], or batched [..., M, K] @ [..., K, N] with broadcast batch dims; 1-d operands
// are treated as a row (left) or a column (right) vector and that dim is dropped from the result.
Tensor matmul(const Tensor& a, const Tensor& b);

// --- shape.cpp (views live on Tensor; these build new tensors)
Tensor concat(const std::vector<Tensor>& tensors, int64_t dim);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim);

// --- index.cpp (index tensors are int64)
// out[i][j] = x[i][index[i][j]] for dim = 1 (as torch.gather)
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// a copy of x with src added at the indexed places: out[i][index[i][j]] += src[i][j] (dim = 1)
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
// the rows index[0..n) of x along dim (index 1-d)
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// weight [V, D] looked up by ids of any shape S: [S..., D]
Tensor embedding(const Tensor& weight, const Tensor& ids);

// --- nn.cpp
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
// Normalise over the last dim: (x - mean) / sqrt(var + eps) * weight + bias (weight, bias [D])
// the default eps, PyTorch's (LayerNorm, `relgrad layer` and Python default to it too)
inline constexpr double layer_norm_eps = 1e-5;
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = layer_norm_eps);
// Zero each element with probability p and scale the rest by 1/(1-p); identity when !training.
// The mask takes ceil(numel / 4) of gen's blocks (engine/random.hpp), and only when it is drawn.
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen);
// residual + dropout(x, ...) in one pass (the residual connection after a sublayer); residual has
// x's shape, dtype and device.
Tensor dropout_add(const Tensor& residual, const Tensor& x, double p, bool training, Generator& gen);
// Mean over targets != ignore_index of -log_softmax(logits)[n, target[n]]; logits [N, C],
// target int64 [N]. 0 when every target is ignored. Reduction::sum: their sum (what a shard of a
// batch gives, divided by the batch's count after the shards are added: docs/distributed.md).
enum class Reduction { mean, sum };
Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100,
                     Reduction reduction = Reduction::mean);

// --- attention.cpp
// Relative position terms in the bucketed form, over the bucket index r(i, j), int64 [Lq, Lk]:
// Shaw et al.'s tables E_K, E_V [H or 1, K, Dh], and/or a score bias per head and bucket,
// bias [H or 1, K] (ALiBi's and T5's, added after the scale). All undefined: plain attention.
struct RelativeTerms {
    Tensor table_k, table_v, index;
    Tensor bias = Tensor();  // (a default: the forms without it need not name it)
};
// Scaled dot-product attention as one op with a hand-written backward, storing only the weights:
//   a_ij = softmax_j(mask_ij ? scale (q_i . k_j + q_i . E_K[r(i,j)]) + bias[r(i,j)] : -inf)
//   z_i  = sum_j a_ij v_j + sum_r (sum_{j: r(i,j)=r} a_ij) E_V[r]
// q [B, H, Lq, Dh], k and v [B, H, Lk, Dh], mask bool broadcastable to [B, H, Lq, Lk] (or
// undefined). Returns z [B, H, Lq, Dh]; *weights (if given) receives a, detached.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, double scale,
                 const RelativeTerms& relative = {}, Tensor* weights = nullptr);

// Masks are bool tensors, true = may attend, broadcastable to [B, H, Lq, Lk].
// Attend only where both masks allow; an undefined mask allows everything.
Tensor combine_masks(const Tensor& a, const Tensor& b);
// The pattern's mask with its causal and window rules folded in, on `device` (undefined when
// nothing is hidden): what the fused op's rules are as an [Lq, Lk] tensor.
Tensor pattern_mask(const AttentionPattern& pattern, int64_t query_len, int64_t key_len, Device device = Device::cpu);
// distance_entry(i, j, Lq) of every pair as an int64 [Lq, Lk] index, on `device`: the buckets under
// which the attention op reads a bias by distance (a row of Lq + Lk - 1 entries per head)
Tensor distance_entry_index(int64_t query_len, int64_t key_len, Device device = Device::cpu);

// The same attention as `attention` above, in memory linear in L: the keys are visited in tiles
// with an online softmax, and the backward recomputes the weights tile by tile from the saved
// log-sum-exp of each row, so no [Lq, Lk] tensor exists at any time (docs/layers/fused_attention.md).
// Tiles that the causal or window rule hides entirely are skipped. Returns z [B, H, Lq, Dh].
Tensor fused_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionPattern& pattern, double scale,
                       const ClippedRelativeTerms& relative = {});

// RoPE (Su et al. 2021): rotates every pair (x_2t, x_2t+1) of the rows of x [..., L, Dh] (Dh
// even), the row l at position p = first_position + l, by the angle p theta_t, theta_t =
// base^(-2t/Dh):
//   y_2t = x_2t cos(p theta_t) - x_2t+1 sin(p theta_t),  y_2t+1 = x_2t sin(p theta_t) + x_2t+1 cos(p theta_t)
// so that rope(q)_i . rope(k)_j depends on j - i only. Backward: the rotation by -p theta_t.
inline constexpr double rope_default_base = 10000;  // RoFormer's (Su et al. 2021); rope_base's default too
Tensor rope(const Tensor& x, int64_t first_position, double base = rope_default_base);
// The cos and sin of those angles, [L, Dh / 2] each, in `dtype` (computed in float64)
struct RopeTables {
    Tensor cos, sin;
};
RopeTables rope_tables(int64_t length, int64_t head_dim, int64_t first_position, double base, DType dtype,
                       Device device = Device::cpu);

}  // namespace relgrad
