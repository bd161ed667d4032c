// Fused relative attention on the GPU: flash-style tiles in shared memory, an online softmax, and
// memory linear in L (docs/layers/fused_attention.md has the math, docs/cuda_tiling.md the tiles).
//
// Per (batch, head), with c = scale, r = r(i, j) the clipped bucket, QE = Q E_K^T and G = dZ E_V^T
// ([Lq, K] each, by cuBLAS before the kernels):
//
//   forward, one block per tile of kTileRows queries, one thread per query row; the block walks
//   the key tiles its queries can see, each loaded once into shared memory by all its threads:
//     s_ij = c (q_i . k_j + QE[i, r])
//     m'   = max(m, s_ij),  alpha = exp(m - m')          rescale what the row has so far
//     l    = alpha l + exp(s_ij - m')
//     acc  = alpha acc + exp(s_ij - m') v_j
//     W[r] = alpha W[r] + exp(s_ij - m')                 the value-side bucket accumulators
//   then z_i = (acc + sum_r W[r] E_V[r]) / l and lse_i = m + log l (-inf and z_i = 0 for a row
//   that sees no key).
//
//   backward, without atomics: each thread owns the rows it writes.
//     query_gradients: a block per query tile, a thread per query row, walking key tiles:
//       p_ij = exp(s_ij - lse_i),  dp_ij = dz_i . v_j + G[i, r],  ds_ij = p_ij (dp_ij - D_i)
//       dq_i += c ds_ij k_j,  P[i, r] += p_ij,  S[i, r] += ds_ij          (D_i = dz_i . z_i)
//     key_gradients: a block per key tile, a thread per key row, walking query tiles:
//       dv_j += p_ij dz_i,  dk_j += c ds_ij q_i
//   then by cuBLAS: dq += c S E_K, dE_V = sum P^T dZ, dE_K = c sum S^T Q.
//     distance_bias_gradient (with a distance bias b_h(j - i), added to every s_ij above): a
//       thread per entry of the (batch, head)'s bias row, walking the pairs at its distance:
//       dB[entry] = sum_i ds_{i, i + entry - (Lq - 1)}  (on tensor cores: a block per 16 entries)
//
// Tiles that the causal or window rule hides from a whole block are never loaded. QE, G, W, P and
// S are [B, H, Lq, K]: for a fixed clipping distance, memory grows linearly in L.
//
// float32, bfloat16 and float16 at head widths 32, 64 and 128 take other kernels, on tensor cores,
// of FlashAttention-2's shape (fused_attention_mma.cu): the forward, and the backward as a query
// kernel, a key kernel and the distance bias's; they read 16-bit operands as they are, and the
// scalar kernels read float32 copies of them.
#include <algorithm>
#include <limits>
#include <type_traits>

#include "engine/backend/cuda/fused_attention.hpp"
#include "engine/errors.hpp"

namespace relgrad {
namespace RELGRAD_CUDA_NAMESPACE {

namespace {

constexpr int64_t kMaxHeadDim = 128;  // a thread keeps a row of Dh values (and one of gradients)

// x and y: pointers into global, shared or a thread's own memory
template <class X, class Y>
__device__ auto dot(X x, Y y, int64_t n) {
    decltype(x[0] * y[0]) total(0);
    for (int64_t d = 0; d < n; ++d) total += x[d] * y[d];
    return total;
}

// rows [first, first + count) of a [*, Dh] matrix into shared memory (zeros past `end`), by all
// the threads of the block
template <class T>
__device__ void load_tile(Shared<T> tile, const T* matrix, int64_t first, int64_t count, int64_t end, int64_t Dh) {
    for (int64_t e = threadIdx.x; e < count * Dh; e += blockDim.x) {
        const int64_t row = first + e / Dh;
        tile[e] = row < end ? matrix[row * Dh + e % Dh] : T(0);
    }
}

template <class T>
__global__ void forward_kernel(Problem p, const T* q, const T* k, const T* v, const T* qe, const T* table_v,
                               int64_t table_stride, const T* bias, T scale, int64_t key_tile, T* w, T* z, T* lse) {
    RELGRAD_DYNAMIC_SHARED(T, shared);
    const Shared<T> keys = shared;                      // [key_tile, Dh]
    const Shared<T> values = shared + key_tile * p.Dh;  // [key_tile, Dh]
    const int64_t bh = blockIdx.y, i0 = int64_t{blockIdx.x} * kTileRows, i = i0 + threadIdx.x;
    const bool active = i < p.Lq;
    const int64_t row = bh * p.Lq + i;
    const T* kb = k + bh * p.Lk * p.Dh;
    const T* vb = v + bh * p.Lk * p.Dh;
    T qi[kMaxHeadDim], acc[kMaxHeadDim];
    T m = -std::numeric_limits<T>::infinity(), l(0);
    if (active) {
        for (int64_t d = 0; d < p.Dh; ++d) {
            qi[d] = q[row * p.Dh + d];
            acc[d] = T(0);
        }
        for (int64_t r = 0; r < p.K; ++r) w[row * p.K + r] = T(0);
    }
    const int64_t i1 = i0 + kTileRows < p.Lq ? i0 + kTileRows : p.Lq;
    const int64_t begin = p.keys_begin(i0), end = p.keys_end(i1);
    for (int64_t j0 = begin; j0 < end; j0 += key_tile) {
        load_tile(keys, kb, j0, key_tile, end, p.Dh);
        load_tile(values, vb, j0, key_tile, end, p.Dh);
        __syncthreads();
        for (int64_t t = 0; active && t < key_tile && j0 + t < end; ++t) {
            const int64_t j = j0 + t;
            if (!p.visible(bh, i, j)) continue;
            const int64_t r = p.K ? p.bucket(i, j) : 0;
            const T s = scale * (dot(qi, keys + t * p.Dh, p.Dh) + (p.K ? qe[row * p.K + r] : T(0))) +
                        bias_of(p, bias, bh, i, j);
            if (s > m) {  // a new maximum: rescale the row's sums
                const T alpha = exp(m - s);
                l *= alpha;
                for (int64_t d = 0; d < p.Dh; ++d) acc[d] *= alpha;
                for (int64_t b = 0; b < p.K; ++b) w[row * p.K + b] *= alpha;
                m = s;
            }
            const T e = exp(s - m);
            l += e;
            for (int64_t d = 0; d < p.Dh; ++d) acc[d] += e * values[t * p.Dh + d];
            if (p.K) w[row * p.K + r] += e;
        }
        __syncthreads();  // every thread is done with the tile before the next one overwrites it
    }
    if (!active) return;
    if (l == T(0)) {  // no visible key
        for (int64_t d = 0; d < p.Dh; ++d) z[row * p.Dh + d] = T(0);
        lse[row] = -std::numeric_limits<T>::infinity();
        return;
    }
    const T* ev = table_v + (bh % p.H) * table_stride;
    for (int64_t r = 0; r < p.K; ++r) {
        const T weight = w[row * p.K + r];
        for (int64_t d = 0; d < p.Dh; ++d) acc[d] += weight * ev[r * p.Dh + d];
    }
    for (int64_t d = 0; d < p.Dh; ++d) z[row * p.Dh + d] = acc[d] / l;
    lse[row] = m + log(l);
}

template <class T>
__global__ void query_gradients_kernel(Problem p, const T* q, const T* k, const T* v, const T* z, const T* lse,
                                       const T* dz, const T* qe, const T* g, const T* bias, T scale, int64_t key_tile,
                                       T* dq, T* p_sums, T* s_sums, T* d_rows) {
    RELGRAD_DYNAMIC_SHARED(T, shared);
    const Shared<T> keys = shared;
    const Shared<T> values = shared + key_tile * p.Dh;
    const int64_t bh = blockIdx.y, i0 = int64_t{blockIdx.x} * kTileRows, i = i0 + threadIdx.x;
    const int64_t row = bh * p.Lq + i;
    const bool active = i < p.Lq && lse[row] > -std::numeric_limits<T>::infinity();  // sees some key
    const T* kb = k + bh * p.Lk * p.Dh;
    const T* vb = v + bh * p.Lk * p.Dh;
    T qi[kMaxHeadDim], dzi[kMaxHeadDim], dqi[kMaxHeadDim];
    T d_row(0);
    if (i < p.Lq) {
        for (int64_t d = 0; d < p.Dh; ++d) {
            qi[d] = q[row * p.Dh + d];
            dzi[d] = dz[row * p.Dh + d];
            dqi[d] = T(0);
            d_row += dzi[d] * z[row * p.Dh + d];
        }
        for (int64_t r = 0; r < p.K; ++r) p_sums[row * p.K + r] = s_sums[row * p.K + r] = T(0);
    }
    const int64_t i1 = i0 + kTileRows < p.Lq ? i0 + kTileRows : p.Lq;
    const int64_t begin = p.keys_begin(i0), end = p.keys_end(i1);
    for (int64_t j0 = begin; j0 < end; j0 += key_tile) {
        load_tile(keys, kb, j0, key_tile, end, p.Dh);
        load_tile(values, vb, j0, key_tile, end, p.Dh);
        __syncthreads();
        for (int64_t t = 0; active && t < key_tile && j0 + t < end; ++t) {
            const int64_t j = j0 + t;
            if (!p.visible(bh, i, j)) continue;
            const int64_t r = p.K ? p.bucket(i, j) : 0;
            const T s = scale * (dot(qi, keys + t * p.Dh, p.Dh) + (p.K ? qe[row * p.K + r] : T(0))) +
                        bias_of(p, bias, bh, i, j);
            const T prob = exp(s - lse[row]);
            const T ds = prob * (dot(dzi, values + t * p.Dh, p.Dh) + (p.K ? g[row * p.K + r] : T(0)) - d_row);
            for (int64_t d = 0; d < p.Dh; ++d) dqi[d] += scale * ds * keys[t * p.Dh + d];
            if (p.K) {
                p_sums[row * p.K + r] += prob;
                s_sums[row * p.K + r] += ds;
            }
        }
        __syncthreads();
    }
    if (i >= p.Lq) return;
    for (int64_t d = 0; d < p.Dh; ++d) dq[row * p.Dh + d] = dqi[d];
    d_rows[row] = d_row;
}

template <class T>
__global__ void key_gradients_kernel(Problem p, const T* q, const T* k, const T* v, const T* lse, const T* dz,
                                     const T* qe, const T* g, const T* d_rows, const T* bias, T scale,
                                     int64_t query_tile, T* dk, T* dv) {
    RELGRAD_DYNAMIC_SHARED(T, shared);
    const Shared<T> queries = shared;                           // [query_tile, Dh]
    const Shared<T> output_grads = shared + query_tile * p.Dh;  // [query_tile, Dh]
    const int64_t bh = blockIdx.y, j0 = int64_t{blockIdx.x} * kTileRows, j = j0 + threadIdx.x;
    const bool active = j < p.Lk;
    const int64_t row = bh * p.Lk + j;
    const T* qb = q + bh * p.Lq * p.Dh;
    const T* dzb = dz + bh * p.Lq * p.Dh;
    T kj[kMaxHeadDim], vj[kMaxHeadDim], dkj[kMaxHeadDim], dvj[kMaxHeadDim];
    if (active) {
        for (int64_t d = 0; d < p.Dh; ++d) {
            kj[d] = k[row * p.Dh + d];
            vj[d] = v[row * p.Dh + d];
            dkj[d] = dvj[d] = T(0);
        }
    }
    const int64_t j1 = j0 + kTileRows < p.Lk ? j0 + kTileRows : p.Lk;
    const int64_t begin = p.queries_begin(j0), end = p.queries_end(j1);
    for (int64_t i0 = begin; i0 < end; i0 += query_tile) {
        load_tile(queries, qb, i0, query_tile, end, p.Dh);
        load_tile(output_grads, dzb, i0, query_tile, end, p.Dh);
        __syncthreads();
        for (int64_t t = 0; active && t < query_tile && i0 + t < end; ++t) {
            const int64_t i = i0 + t, query_row = bh * p.Lq + i;
            if (!(lse[query_row] > -std::numeric_limits<T>::infinity()) || !p.visible(bh, i, j)) continue;
            const int64_t r = p.K ? p.bucket(i, j) : 0;
            const Shared<T> qi = queries + t * p.Dh;
            const Shared<T> dzi = output_grads + t * p.Dh;
            const T s =
                scale * (dot(qi, kj, p.Dh) + (p.K ? qe[query_row * p.K + r] : T(0))) + bias_of(p, bias, bh, i, j);
            const T prob = exp(s - lse[query_row]);
            const T ds = prob * (dot(dzi, vj, p.Dh) + (p.K ? g[query_row * p.K + r] : T(0)) - d_rows[query_row]);
            for (int64_t d = 0; d < p.Dh; ++d) {
                dvj[d] += prob * dzi[d];
                dkj[d] += scale * ds * qi[d];
            }
        }
        __syncthreads();
    }
    if (!active) return;
    for (int64_t d = 0; d < p.Dh; ++d) {
        dk[row * p.Dh + d] = dkj[d];
        dv[row * p.Dh + d] = dvj[d];
    }
}

// dB[bh, entry] = sum over the visible pairs (i, j) at that entry's distance of ds_ij, a thread per
// entry, the pairs in order of i: each sum has one owner, no atomics
template <class T>
__global__ void distance_bias_gradient_kernel(Problem p, const T* q, const T* k, const T* v, const T* lse, const T* dz,
                                              const T* qe, const T* g, const T* d_rows, const T* bias, T scale,
                                              T* d_bias) {
    const int64_t bh = blockIdx.y, entry = int64_t{blockIdx.x} * kTileRows + threadIdx.x;
    const int64_t entries = p.Lq + p.Lk - 1;
    if (entry >= entries) return;
    T total(0);
    for (int64_t i = 0; i < p.Lq; ++i) {
        const int64_t j = i + entry - (p.Lq - 1), row = bh * p.Lq + i;
        if (j < 0 || j >= p.Lk || !(lse[row] > -std::numeric_limits<T>::infinity()) || !p.visible(bh, i, j)) continue;
        const int64_t r = p.K ? p.bucket(i, j) : 0;
        const T* qi = q + row * p.Dh;
        const T* kj = k + (bh * p.Lk + j) * p.Dh;
        const T s = scale * (dot(qi, kj, p.Dh) + (p.K ? qe[row * p.K + r] : T(0))) + bias_of(p, bias, bh, i, j);
        const T prob = exp(s - lse[row]);
        total += prob * (dot(dz + row * p.Dh, v + (bh * p.Lk + j) * p.Dh, p.Dh) + (p.K ? g[row * p.K + r] : T(0)) -
                         d_rows[row]);
    }
    d_bias[bh * entries + entry] = total;
}

Problem problem_of(const Tensor& q, const Tensor& k, const AttentionPattern& pattern,
                   const ClippedRelativeTerms& relative, const char* kernel) {
    Problem p{};
    p.H = q.size(1);
    p.Lq = q.size(2);
    p.Lk = k.size(2);
    p.Dh = q.size(3);
    RELGRAD_CHECK(p.Dh <= kMaxHeadDim, kernel, ": head dim ", p.Dh, " (the cuda kernels take at most ", kMaxHeadDim,
                  ")");
    p.K = relative.table_k.defined() ? relative.table_k.size(1) : 0;
    p.k_left = relative.k_left;
    p.k_right = relative.k_right;
    p.causal = pattern.causal;
    p.window = pattern.window;
    p.query_offset = pattern.query_offset;
    p.mask = device_data_or_null<bool>(pattern.mask);
    for (int d = 0; d < 4 && p.mask; ++d) p.mask_strides[d] = pattern.mask.strides()[d];
    const Tensor& bias = relative.distance_bias;
    p.bias_stride = bias.defined() && bias.size(0) > 1 ? bias.size(1) : 0;
    return p;
}

// Rows of a tile in shared memory: two [rows, Dh] tiles fit the 48 KiB a block may have.
template <class T>
int64_t tile_rows(int64_t Dh) {
    constexpr int64_t kSharedBytes = 48 * 1024;
    const int64_t fit = kSharedBytes / (2 * static_cast<int64_t>(sizeof(T)) * std::max<int64_t>(Dh, 1));
    return std::max<int64_t>(1, std::min<int64_t>(kTileRows, fit));
}

// out[b, h] = alpha x[b, h] op(table[h, or 0 for a shared table]) + beta out[b, h], with x
// [B, H, rows, inner] and the table [*, cols, inner] (transposed) or [*, inner, cols]: one strided
// batched product per b, over the heads
template <class T>
void per_head_product(bool trans_table, int64_t B, int64_t H, int64_t rows, int64_t inner, int64_t cols, T alpha,
                      const T* x, const T* table, int64_t table_stride, T beta, T* out) {
    const int64_t table_leading = trans_table ? inner : cols;
    for (int64_t b = 0; b < B; ++b) {
        gemm_batch<T>(false, trans_table, rows, cols, inner, alpha, x + b * H * rows * inner, inner, rows * inner,
                      table, table_leading, table_stride, beta, out + b * H * rows * cols, cols, rows * cols, H);
    }
}

// table_grad[h, or 0 for a shared table] = alpha sum over b (and h) of x[b, h]^T y[b, h], with x
// [B, H, Lq, K] and y [B, H, Lq, Dh]: added in a fixed order, b by b (and h by h)
template <class T>
void table_gradient(bool per_head, int64_t B, int64_t H, int64_t Lq, int64_t K, int64_t Dh, T alpha, const T* x,
                    const T* y, T* table_grad) {
    for (int64_t b = 0; b < B; ++b) {
        const T* xb = x + b * H * Lq * K;
        const T* yb = y + b * H * Lq * Dh;
        if (per_head) {
            gemm_batch<T>(true, false, K, Dh, Lq, alpha, xb, K, Lq * K, yb, Dh, Lq * Dh, T(b == 0 ? 0 : 1), table_grad,
                          Dh, K * Dh, H);
            continue;
        }
        for (int64_t h = 0; h < H; ++h) {
            gemm_batch<T>(true, false, K, Dh, Lq, alpha, xb + h * Lq * K, K, 0, yb + h * Lq * Dh, Dh, 0,
                          T(b == 0 && h == 0 ? 0 : 1), table_grad, Dh, 0, 1);
        }
    }
}

}  // namespace

bool CudaBackend::supports(OptionalKernel kernel) const {
    switch (kernel) {
        case OptionalKernel::fused_attention: return true;
        case OptionalKernel::bfloat16_gemm: return has_gemm_in(DType::bfloat16);
        case OptionalKernel::float16_gemm: return has_gemm_in(DType::float16);
        case OptionalKernel::fused_attention_16_bit: return true;
        case OptionalKernel::elementwise_16_bit: return false;
    }
    return false;
}

void CudaBackend::do_fused_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionPattern& pattern,
                                     double scale, const ClippedRelativeTerms& relative, Tensor& z, Tensor& lse) {
    const Problem p = problem_of(q, k, pattern, relative, "fused_attention");
    const MmaOperands operands{q, k, v, Tensor(), Tensor()};
    const bool on_tensor_cores = uses_tensor_cores(p, operands);
    if (is_16_bit(q.dtype()) && !on_tensor_cores) {  // float32 copies, for the kernels that take them
        return do_fused_attention(widened(q), widened(k), widened(v), pattern, scale, relative, z, lse);
    }
    const int64_t B = q.size(0);
    // T: the dtype of the outputs, the tables and the products around the kernels (float32 for
    // 16-bit operands, which only the tensor-core kernels read)
    dispatch_floating(z.dtype(), "fused_attention", [&](auto tag) {
        using T = decltype(tag);
        Tensor qe, w;
        int64_t table_stride = 0;
        if (p.K) {  // QE = Q E_K^T, and room for the bucket accumulators W
            qe = empty({B, p.H, p.Lq, p.K}, z.dtype(), Device::cuda);
            w = empty({B, p.H, p.Lq, p.K}, z.dtype(), Device::cuda);
            table_stride = relative.table_k.size(0) > 1 ? p.K * p.Dh : 0;
            per_head_product<T>(true, B, p.H, p.Lq, p.Dh, p.K, T(1), device_data<T>(widened(q)),
                                device_data<T>(relative.table_k), table_stride, T(0), device_data<T>(qe));
        }
        if constexpr (std::is_same_v<T, float>) {
            if (on_tensor_cores) {
                mma_forward(p, B, operands, device_data_or_null<float>(qe),
                            device_data_or_null<float>(relative.distance_bias), float(scale),
                            p.K ? device_data<float>(w) : nullptr, device_data<float>(z), device_data<float>(lse));
                if (p.K) {  // z += w E_V
                    per_head_product<float>(false, B, p.H, p.Lq, p.K, p.Dh, 1.0f, device_data<float>(w),
                                            device_data<float>(relative.table_v), table_stride, 1.0f,
                                            device_data<float>(z));
                }
                return;
            }
        }
        const int64_t key_tile = tile_rows<T>(p.Dh);
        launch("fused_attention", forward_kernel<T>, grid_of(p.Lq, B * p.H, "fused_attention"), kTileRows,
               2 * key_tile * p.Dh * sizeof(T), p, device_data<T>(q), device_data<T>(k), device_data<T>(v),
               device_data_or_null<T>(qe), device_data_or_null<T>(relative.table_v), table_stride,
               device_data_or_null<T>(relative.distance_bias), T(scale), key_tile, p.K ? device_data<T>(w) : nullptr,
               device_data<T>(z), device_data<T>(lse));
    });
}

void CudaBackend::do_fused_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& z,
                                              const Tensor& lse, const Tensor& dz, const AttentionPattern& pattern,
                                              double scale, const ClippedRelativeTerms& relative, Tensor& dq,
                                              Tensor& dk, Tensor& dv, Tensor& d_table_k, Tensor& d_table_v,
                                              Tensor& d_distance_bias) {
    const Problem p = problem_of(q, k, pattern, relative, "fused_attention_backward");
    const MmaOperands operands{q, k, v, z, dz};
    const bool on_tensor_cores = uses_tensor_cores(p, operands);
    if (is_16_bit(q.dtype()) && !on_tensor_cores) {  // float32 copies, for the kernels that take them
        return do_fused_attention_backward(widened(q), widened(k), widened(v), widened(z), lse, widened(dz), pattern,
                                           scale, relative, dq, dk, dv, d_table_k, d_table_v, d_distance_bias);
    }
    const int64_t B = q.size(0);
    dispatch_floating(dq.dtype(), "fused_attention_backward", [&](auto tag) {  // T: as in the forward
        using T = decltype(tag);
        Tensor qe, g, p_sums, s_sums;
        const Tensor d_rows = empty({B, p.H, p.Lq}, dq.dtype(), Device::cuda);
        const bool per_head = p.K && relative.table_k.size(0) > 1;
        const int64_t table_stride = per_head ? p.K * p.Dh : 0;
        // Shaw's products around the kernels read q and dz in T (a float32 copy of 16-bit ones)
        const Tensor q_wide = p.K ? widened(q) : Tensor(), dz_wide = p.K ? widened(dz) : Tensor();
        if (p.K) {  // QE = Q E_K^T and G = dZ E_V^T
            for (Tensor* t : {&qe, &g, &p_sums, &s_sums}) *t = empty({B, p.H, p.Lq, p.K}, dq.dtype(), Device::cuda);
            per_head_product<T>(true, B, p.H, p.Lq, p.Dh, p.K, T(1), device_data<T>(q_wide),
                                device_data<T>(relative.table_k), table_stride, T(0), device_data<T>(qe));
            per_head_product<T>(true, B, p.H, p.Lq, p.Dh, p.K, T(1), device_data<T>(dz_wide),
                                device_data<T>(relative.table_v), table_stride, T(0), device_data<T>(g));
        }
        const int64_t tile = tile_rows<T>(p.Dh);
        const std::size_t shared_bytes = 2 * tile * p.Dh * sizeof(T);
        if (on_tensor_cores) {  // every kernel on tensor cores
            mma_backward(p, B, operands, device_data<float>(lse), device_data_or_null<float>(qe),
                         device_data_or_null<float>(g), device_data_or_null<float>(relative.distance_bias),
                         float(scale), device_data<float>(dq), p.K ? device_data<float>(p_sums) : nullptr,
                         p.K ? device_data<float>(s_sums) : nullptr, device_data<float>(d_rows), device_data<float>(dk),
                         device_data<float>(dv), device_data_or_null<float>(d_distance_bias));
        } else {
            launch("fused_attention_backward (queries)", query_gradients_kernel<T>,
                   grid_of(p.Lq, B * p.H, "fused_attention_backward"), kTileRows, shared_bytes, p, device_data<T>(q),
                   device_data<T>(k), device_data<T>(v), device_data<T>(z), device_data<T>(lse), device_data<T>(dz),
                   device_data_or_null<T>(qe), device_data_or_null<T>(g),
                   device_data_or_null<T>(relative.distance_bias), T(scale), tile, device_data<T>(dq),
                   p.K ? device_data<T>(p_sums) : nullptr, p.K ? device_data<T>(s_sums) : nullptr,
                   device_data<T>(d_rows));
            launch("fused_attention_backward (keys)", key_gradients_kernel<T>,
                   grid_of(p.Lk, B * p.H, "fused_attention_backward"), kTileRows, shared_bytes, p, device_data<T>(q),
                   device_data<T>(k), device_data<T>(v), device_data<T>(lse), device_data<T>(dz),
                   device_data_or_null<T>(qe), device_data_or_null<T>(g), device_data<T>(d_rows),
                   device_data_or_null<T>(relative.distance_bias), T(scale), tile, device_data<T>(dk),
                   device_data<T>(dv));
            if (d_distance_bias.defined()) {
                launch("fused_attention_backward (distance bias)", distance_bias_gradient_kernel<T>,
                       grid_of(p.Lq + p.Lk - 1, B * p.H, "fused_attention_backward"), kTileRows, 0, p,
                       device_data<T>(q), device_data<T>(k), device_data<T>(v), device_data<T>(lse), device_data<T>(dz),
                       device_data_or_null<T>(qe), device_data_or_null<T>(g), device_data<T>(d_rows),
                       device_data<T>(relative.distance_bias), T(scale), device_data<T>(d_distance_bias));
            }
        }
        if (!p.K) return;
        // dq += c S E_K, dE_V = sum P^T dZ, dE_K = c sum S^T Q
        per_head_product<T>(false, B, p.H, p.Lq, p.K, p.Dh, T(scale), device_data<T>(s_sums),
                            device_data<T>(relative.table_k), table_stride, T(1), device_data<T>(dq));
        table_gradient<T>(per_head, B, p.H, p.Lq, p.K, p.Dh, T(1), device_data<T>(p_sums), device_data<T>(dz_wide),
                          device_data<T>(d_table_v));
        table_gradient<T>(per_head, B, p.H, p.Lq, p.K, p.Dh, T(scale), device_data<T>(s_sums), device_data<T>(q_wide),
                          device_data<T>(d_table_k));
    });
}

}  // namespace RELGRAD_CUDA_NAMESPACE
}  // namespace relgrad
