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
//       dB[entry] = sum_i ds_{i, i + entry - (Lq - 1)}
//
// Tiles that the causal or window rule hides from a whole block are never loaded. QE, G, W, P and
// S are [B, H, Lq, K]: for a fixed clipping distance, memory grows linearly in L.
//
// float32 at head widths 32, 64 and 128 takes three other kernels, on tensor cores, of
// FlashAttention-2's shape (below): the forward, and the backward as a query kernel and a key kernel.
#include <algorithm>
#include <limits>
#include <type_traits>

#include "engine/backend/cuda/cuda_backend.hpp"
#include "engine/backend/cuda/mma.hpp"
#include "engine/check.hpp"

namespace relgrad {
namespace RELGRAD_CUDA_NAMESPACE {

namespace {

constexpr unsigned kTileRows = 32;    // rows of a block: one thread each
constexpr int64_t kMaxHeadDim = 128;  // a thread keeps a row of Dh values (and one of gradients)

// The sizes and the pattern, as the kernels read them.
struct Problem {
    int64_t H, Lq, Lk, Dh;
    int64_t K, k_left, k_right;  // K = 0: no relative terms
    bool causal;
    int64_t window, query_offset;
    const bool* mask;  // nullptr, or [B, H, Lq, Lk] with mask_strides
    int64_t mask_strides[4];
    int64_t bias_stride;  // a distance bias row per head (Lq + Lk - 1), or 0 for one shared row

    // the keys [begin, end) the causal and window rules leave to queries [i0, i1)
    __device__ int64_t keys_begin(int64_t i0) const {
        return window >= 0 ? (query_offset + i0 - window > 0 ? query_offset + i0 - window : 0) : 0;
    }
    __device__ int64_t keys_end(int64_t i1) const {
        int64_t end = Lk;
        if (causal && query_offset + i1 < end) end = query_offset + i1;
        if (window >= 0 && query_offset + i1 + window < end) end = query_offset + i1 + window;
        return end > 0 ? end : 0;
    }
    // the queries [begin, end) that the rules let see some key of [j0, j1)
    __device__ int64_t queries_begin(int64_t j0) const {
        int64_t begin = 0;
        if (causal && j0 - query_offset > begin) begin = j0 - query_offset;
        if (window >= 0 && j0 - query_offset - window > begin) begin = j0 - query_offset - window;
        return begin < Lq ? begin : Lq;
    }
    __device__ int64_t queries_end(int64_t j1) const {
        int64_t end = Lq;
        if (window >= 0 && j1 - query_offset + window < end) end = j1 - query_offset + window;
        return end > 0 ? end : 0;
    }
    __device__ bool visible(int64_t bh, int64_t i, int64_t j) const {
        const int64_t distance = j - (query_offset + i);
        if (causal && distance > 0) return false;
        if (window >= 0 && (distance > window || -distance > window)) return false;
        if (!mask) return true;
        const int64_t b = bh / H, h = bh % H;
        return mask[b * mask_strides[0] + h * mask_strides[1] + i * mask_strides[2] + j * mask_strides[3]];
    }
    __device__ int64_t bucket(int64_t i, int64_t j) const {
        return clipped_bucket(j - (query_offset + i), k_left, k_right);
    }
};

// b_h(j - i) from the distance bias (0 without one)
template <class T>
__device__ T bias_of(const Problem& p, const T* bias, int64_t bh, int64_t i, int64_t j) {
    return bias ? bias[(bh % p.H) * p.bias_stride + distance_entry(i, j, p.Lq)] : T(0);
}

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

// ---------------------------------------------------------------- on tensor cores
//
// float32, bfloat16 and float16 at head widths 32, 64 and 128 (float64 keeps the kernels above):
// FlashAttention-2's split
// of the queries, on tensor cores (docs/cuda_tiling.md). A block of kMmaWarps warps takes 16
// queries a warp, whose Q rows stay in registers as mma A fragments. The block walks the key tiles
// its queries can see (kMmaKeys keys each), copied into shared memory by cp.async, the next tile's
// copy in flight while this one is used (two buffers). A lane of an m16n8 tile holds rows g and
// g + 8 (g = lane / 4) of it: a row's values lie in the 4 lanes of a quad, whose maxima and sums
// take two shuffles. Per warp and key tile, both kernels first compute
//   S = Q K^T                              mma: tf32 inputs (m16n8k8) for float32 operands,
//                                          16-bit ones (m16n8k16) for bfloat16 and float16;
//                                          float32 sums
//   s_ij = c (S_ij + QE[i, r]) + b(j - i)  -inf where the pattern hides j
// and sum a value per row and bucket, X[i, r] = sum_{j: r(i, j) = r} x_ij, split by the band: the
// two edge buckets (r = 0: j - i <= -k_left; r = K - 1: j - i >= k_right) as per-row scalars in
// registers, the K - 2 interior ones in shared memory, each row's owned by its warp (a row's keys
// in one tile fall in distinct buckets: no two lanes add to one place). A product of a 16 x 32
// tile of values with a tile of keys' rows goes through the warp's scratch in shared memory, from
// the C fragments' places to the A fragments'.
//
//   mma_forward_kernel:   m' = max(m, max_j s_ij),  alpha = exp(m - m'),  P_ij = exp(s_ij - m')
//                         l = alpha l + sum_j P_ij,  O = alpha O + P V,  W = alpha W + (P by bucket)
//                         then z = O / l, w = W / l, lse = m + log l; the host adds w E_V to z
//   mma_query_gradients_kernel:  P_ij = exp(s_ij - lse_i),  dP = dZ V^T + G[i, r],
//                         dS = P (dP - D_i),  dQ += c dS K,  and P and dS summed by bucket
constexpr int kMmaWarps = 4, kMmaRows = 16 * kMmaWarps, kMmaThreads = 32 * kMmaWarps;
// (The kernels declare __launch_bounds__(kMmaThreads, 1): a block of kMmaThreads, at least one per
// multiprocessor, so that ptxas may give a thread up to 255 registers instead of spilling at 128.)
constexpr int kMmaKeys = 32, kKeyTiles = kMmaKeys / 8;
// Row strides in shared memory, padded so that the lanes of a fragment read distinct banks:
// K, V (and dZ) rows Dh + 8 floats, the scratch kMmaKeys + 4.
constexpr int kTilePad = 8, kScratchStride = kMmaKeys + 4;
constexpr unsigned kFullWarp = 0xffffffffu;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The shared memory of these kernels, in floats: two buffers of a pair of tiles (K and V, or Q and
// dZ), a scratch per warp, `band_rows` rows of interior buckets per row of the block, and
// `own_matrices` [kMmaRows, Dh] matrices of the block's own rows (dZ; K and V).
int64_t mma_shared_floats(int64_t Dh, int64_t K, int64_t band_rows, int64_t own_matrices) {
    return 4 * kMmaKeys * (Dh + kTilePad) + kMmaWarps * 16 * kScratchStride +
           band_rows * kMmaRows * std::max<int64_t>(K - 2, 0) + own_matrices * kMmaRows * (Dh + kTilePad);
}

// a lane's row value combined over its quad
__device__ inline float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(kFullWarp, x, 1));
    return fmaxf(x, __shfl_xor_sync(kFullWarp, x, 2));
}
__device__ inline float quad_sum(float x) {
    x += __shfl_xor_sync(kFullWarp, x, 1);
    return x + __shfl_xor_sync(kFullWarp, x, 2);
}

// A lane's fragment of an mma operand for inputs In: element e, at place_of(e) (mma.hpp), holds
// value_at(row, col), rounded to tf32 or packed two to a register as 16-bit values. A 16-bit
// operand's values (Q, K, V, dZ) are exact; P and dS are rounded, as FlashAttention-2 does.
template <MmaInputs In, int Registers, class PlaceOf, class ValueAt>
__device__ inline void fragment(const PlaceOf& place_of, const ValueAt& value_at, uint32_t (&regs)[Registers]) {
    RELGRAD_UNROLL
    for (int r = 0; r < Registers; ++r) {
        if constexpr (In == MmaInputs::tf32) {
            const TilePlace at = place_of(r);
            regs[r] = tf32_of(value_at(at.row, at.col));
        } else {
            const TilePlace low = place_of(2 * r), high = place_of(2 * r + 1);
            regs[r] = pack_16_bit(In, value_at(low.row, low.col), value_at(high.row, high.col));
        }
    }
}
template <MmaInputs In, class ValueAt>
__device__ inline void a_fragment(int lane, const ValueAt& value_at, uint32_t (&a)[4]) {
    fragment<In>([lane](int e) { return mma_a_place(In, lane, e); }, value_at, a);
}
template <MmaInputs In, class ValueAt>
__device__ inline void b_fragment(int lane, const ValueAt& value_at, uint32_t (&b)[2]) {
    fragment<In>([lane](int e) { return mma_b_place(In, lane, e); }, value_at, b);
}

// rows [first, first + kMmaKeys) of two [*, Dh] matrices (K and V, or Q and dZ) into one buffer
// each, 16 bytes a copy, zeros past `end`
template <int Dh>
__device__ void copy_tile_pair(Shared<float> to_a, Shared<float> to_b, const float* a, const float* b, int64_t first,
                               int64_t end) {
    constexpr int kRowStride = Dh + kTilePad, kChunks = Dh / 4;
    for (int c = threadIdx.x; c < kMmaKeys * kChunks; c += kMmaThreads) {
        const int row = c / kChunks, col = 4 * (c % kChunks);
        const int64_t n = first + row;
        const int64_t from = (n < end ? n : first) * Dh + col;  // a row that exists, when zeros are copied
        const std::size_t zeros = n < end ? 0 : 16;
        __pipeline_memcpy_async(to_a + row * kRowStride + col, a + from, 16, zeros);
        __pipeline_memcpy_async(to_b + row * kRowStride + col, b + from, 16, zeros);
    }
}

// The 16 rows [i0, i0 + 16) of a [*, Dh] matrix as A fragments (zeros past Lq), a k-step of
// mma_k(In) dims each
template <MmaInputs In, int Dh>
__device__ void load_row_fragments(const float* rows, int64_t i0, int64_t Lq, int lane,
                                   uint32_t (&a)[Dh / mma_k(In)][4]) {
    constexpr int kK = mma_k(In);
    RELGRAD_UNROLL
    for (int ks = 0; ks < Dh / kK; ++ks) {
        a_fragment<In>(
            lane, [&](int row, int col) { return i0 + row < Lq ? rows[(i0 + row) * Dh + kK * ks + col] : 0.0f; },
            a[ks]);
    }
}

// out = A T^T for the warp's 16 rows: A [16, Dh], its fragment for dims [kK ks, kK ks + kK) given
// by a_of(ks, a) (from registers, or read from shared memory one k-step at a time, which keeps
// registers free), T a tile of kMmaKeys rows of Dh in shared memory (row stride Dh + kTilePad):
// out[n][e] at C place e of T's rows [8 n, 8 n + 8)
template <MmaInputs In, int Dh, class AOf>
__device__ void rows_times_tile_rows(AOf&& a_of, Shared<float> tile, int lane, float (&out)[kKeyTiles][4]) {
    constexpr int kRowStride = Dh + kTilePad, kK = mma_k(In);
    RELGRAD_UNROLL
    for (int n = 0; n < kKeyTiles; ++n) {
        RELGRAD_UNROLL
        for (int e = 0; e < 4; ++e) out[n][e] = 0.0f;
    }
    RELGRAD_UNROLL
    for (int ks = 0; ks < Dh / kK; ++ks) {
        uint32_t a[4];
        a_of(ks, a);
        RELGRAD_UNROLL
        for (int n = 0; n < kKeyTiles; ++n) {
            uint32_t b[2];
            b_fragment<In>(  // B's row is a dim, its column a tile row
                lane, [&](int row, int col) { return tile[(8 * n + col) * kRowStride + kK * ks + row]; }, b);
            mma_sync<In>(out[n], a, b, out[n]);
        }
    }
}

// A fragments from registers (the Q rows each kernel keeps)
template <MmaInputs In, int Dh>
struct FromRegisters {
    const uint32_t (&fragments)[Dh / mma_k(In)][4];
    __device__ void operator()(int ks, uint32_t (&a)[4]) const {
        RELGRAD_UNROLL
        for (int e = 0; e < 4; ++e) a[e] = fragments[ks][e];
    }
};

// acc += X T for the warp's 16 rows: X [16, kMmaKeys] at C places (x) through the warp's scratch,
// T a tile of kMmaKeys rows of Dh in shared memory
template <MmaInputs In, int Dh>
__device__ void add_values_times_tile(const float (&x)[kKeyTiles][4], Shared<float> scratch, Shared<float> tile,
                                      int lane, float (&acc)[Dh / 8][4]) {
    constexpr int kRowStride = Dh + kTilePad, kK = mma_k(In);
    RELGRAD_UNROLL
    for (int n = 0; n < kKeyTiles; ++n) {
        RELGRAD_UNROLL
        for (int e = 0; e < 4; ++e) {
            const TilePlace at = mma_c_place(lane, e);
            scratch[at.row * kScratchStride + 8 * n + at.col] = x[n][e];
        }
    }
    __syncwarp();  // written at C places, read at A places
    RELGRAD_UNROLL
    for (int ks = 0; ks < kMmaKeys / kK; ++ks) {
        uint32_t a[4];
        a_fragment<In>(  // A's column is a tile row
            lane, [&](int row, int col) { return scratch[row * kScratchStride + kK * ks + col]; }, a);
        RELGRAD_UNROLL
        for (int n = 0; n < Dh / 8; ++n) {
            uint32_t b[2];
            b_fragment<In>(  // B's row is a tile row, its column a dim
                lane, [&](int row, int col) { return tile[(kK * ks + row) * kRowStride + 8 * n + col]; }, b);
            mma_sync<In>(acc[n], a, b, acc[n]);
        }
    }
    __syncwarp();  // every lane has read the scratch before it is written again
}

// s from S = Q K^T: c (S + QE[i, r]) + b(j - i), -inf where the pattern hides (i, j)
__device__ inline void scores_of(const Problem& p, float (&s)[kKeyTiles][4], const float* qe, const float* bias,
                                 float scale, int64_t bh, int64_t warp_i0, int64_t j0, int64_t end, int lane) {
    RELGRAD_UNROLL
    for (int n = 0; n < kKeyTiles; ++n) {
        RELGRAD_UNROLL
        for (int e = 0; e < 4; ++e) {
            const TilePlace at = mma_c_place(lane, e);
            const int64_t i = warp_i0 + at.row, j = j0 + 8 * n + at.col;
            float score = kNegInf;
            if (i < p.Lq && j < end && p.visible(bh, i, j)) {
                const float relative = p.K ? qe[(bh * p.Lq + i) * p.K + p.bucket(i, j)] : 0.0f;
                score = scale * (s[n][e] + relative) + bias_of(p, bias, bh, i, j);
            }
            s[n][e] = score;
        }
    }
}

// The per-bucket sums of one value per pair for a lane's two rows (h = 0: row g, 1: row g + 8):
// edges in registers, the interior in the warp's band [16, K - 2] of shared memory.
struct BucketSums {
    float left[2] = {0, 0}, right[2] = {0, 0};
    Shared<float> band;
    int64_t interior;

    __device__ void add(const Problem& p, int row, int h, int64_t r, float x) {
        if (r == 0) {
            left[h] += x;
        } else if (r == p.K - 1) {
            right[h] += x;
        } else {
            band[row * interior + r - 1] += x;
        }
    }
    __device__ void scale_row(int lane, int h, float alpha) {
        left[h] *= alpha;
        right[h] *= alpha;
        for (int64_t r = lane % 4; r < interior; r += 4) band[(lane / 4 + 8 * h) * interior + r] *= alpha;
    }
    // out[row, r] = the sums x `factor`, row i of the warp (local row lane / 4 + 8 h); every lane of
    // the warp calls it (the edges are summed over the quad), after a __syncwarp
    __device__ void write_row(const Problem& p, int lane, int h, bool row_exists, float factor, float* out) {
        const float left_sum = quad_sum(left[h]), right_sum = quad_sum(right[h]);
        if (!row_exists) return;
        const int t = lane % 4;
        if (t == 0) out[0] = left_sum * factor;
        if (t == 1 && p.K > 1) out[p.K - 1] = right_sum * factor;
        for (int64_t r = t; r < interior; r += 4) out[1 + r] = band[(lane / 4 + 8 * h) * interior + r] * factor;
    }
};

// The tiles of rows [begin, end) of two [*, Dh] matrices (K and V, or Q and dZ), kMmaKeys rows
// each, walked with the copies double-buffered: step(first, a_tile, b_tile) for each tile, after
// every thread's copy of it has landed.
template <int Dh, class Step>
__device__ void walk_tiles(Shared<float> shared, const float* a, const float* b, int64_t begin, int64_t end,
                           Step&& step) {
    constexpr int kBuffer = kMmaKeys * (Dh + kTilePad);
    const int64_t tiles = end > begin ? (end - begin + kMmaKeys - 1) / kMmaKeys : 0;
    const Shared<float> a_tiles = shared, b_tiles = shared + 2 * kBuffer;  // two buffers each
    if (tiles > 0) copy_tile_pair<Dh>(a_tiles, b_tiles, a, b, begin, end);
    __pipeline_commit();
    for (int64_t tile = 0; tile < tiles; ++tile) {
        const int64_t first = begin + tile * kMmaKeys, buffer = tile % 2;
        if (tile + 1 < tiles) {  // the next tile's copy, in flight while this one is used
            copy_tile_pair<Dh>(a_tiles + (1 - buffer) * kBuffer, b_tiles + (1 - buffer) * kBuffer, a, b,
                               first + kMmaKeys, end);
        }
        __pipeline_commit();
        __pipeline_wait_prior(1);  // this tile's copies have landed
        __syncthreads();           // ... every thread's
        step(first, a_tiles + buffer * kBuffer, b_tiles + buffer * kBuffer);
        __syncthreads();  // every warp is done with this buffer before it is copied into again
    }
}

// The keys [begin, end) the rows of a query block see
struct KeyRange {
    int64_t begin, end;
    __device__ KeyRange(const Problem& p, int64_t i0) {
        begin = p.keys_begin(i0);
        end = p.keys_end(i0 + kMmaRows < p.Lq ? i0 + kMmaRows : p.Lq);
    }
};

template <MmaInputs In, int Dh>
__global__ void __launch_bounds__(kMmaThreads, 1)
    mma_forward_kernel(Problem p, const float* q, const float* k, const float* v, const float* qe, const float* bias,
                       float scale, float* w, float* z, float* lse) {
    RELGRAD_DYNAMIC_SHARED(float, shared);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int64_t interior = p.K > 2 ? p.K - 2 : 0;
    const Shared<float> after_tiles = shared + 4 * kMmaKeys * (Dh + kTilePad);
    const Shared<float> scratch = after_tiles + warp * 16 * kScratchStride;
    const int64_t bh = blockIdx.y, i0 = int64_t{blockIdx.x} * kMmaRows, warp_i0 = i0 + 16 * warp;
    uint32_t qa[Dh / mma_k(In)][4];
    load_row_fragments<In, Dh>(q + bh * p.Lq * Dh, warp_i0, p.Lq, lane, qa);
    float o[Dh / 8][4] = {};
    float m[2] = {kNegInf, kNegInf}, l[2] = {0, 0};  // rows g, g + 8
    BucketSums weights{{0, 0}, {0, 0}, after_tiles + kMmaWarps * 16 * kScratchStride + warp * 16 * interior, interior};
    for (int64_t e = lane; e < 16 * interior; e += 32) weights.band[e] = 0.0f;
    __syncwarp();

    const KeyRange seen(p, i0);
    const auto key_tile = [&](int64_t j0, Shared<float> keys, Shared<float> values) {
        float s[kKeyTiles][4];
        rows_times_tile_rows<In, Dh>(FromRegisters<In, Dh>{qa}, keys, lane, s);
        scores_of(p, s, qe, bias, scale, bh, warp_i0, j0, seen.end, lane);
        float shift[2];  // the new row maxima, 0 for a row that sees nothing yet (every P is then 0)
        RELGRAD_UNROLL
        for (int h = 0; h < 2; ++h) {
            float tile_max = kNegInf;
            RELGRAD_UNROLL
            for (int n = 0; n < kKeyTiles; ++n) tile_max = fmaxf(tile_max, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
            const float new_max = fmaxf(m[h], quad_max(tile_max));
            shift[h] = new_max == kNegInf ? 0.0f : new_max;
            const float alpha = exp(m[h] - shift[h]);
            m[h] = new_max;
            l[h] *= alpha;
            RELGRAD_UNROLL
            for (int n = 0; n < Dh / 8; ++n) {
                o[n][2 * h] *= alpha;
                o[n][2 * h + 1] *= alpha;
            }
            if (p.K) weights.scale_row(lane, h, alpha);
        }
        __syncwarp();  // the rescaled buckets before the adds, by other lanes of the quad

        RELGRAD_UNROLL
        for (int n = 0; n < kKeyTiles; ++n) {
            RELGRAD_UNROLL
            for (int e = 0; e < 4; ++e) {
                const TilePlace at = mma_c_place(lane, e);
                s[n][e] = exp(s[n][e] - shift[e / 2]);  // now P
                l[e / 2] += s[n][e];
                if (p.K && s[n][e] > 0.0f) {
                    weights.add(p, at.row, e / 2, p.bucket(warp_i0 + at.row, j0 + 8 * n + at.col), s[n][e]);
                }
            }
        }
        add_values_times_tile<In, Dh>(s, scratch, values, lane, o);  // O += P V
    };
    walk_tiles<Dh>(shared, k + bh * p.Lk * Dh, v + bh * p.Lk * Dh, seen.begin, seen.end, key_tile);
    __syncwarp();  // the interior buckets, added by every lane of a quad, are read below
    RELGRAD_UNROLL
    for (int h = 0; h < 2; ++h) {
        const float row_sum = quad_sum(l[h]);
        const int64_t i = warp_i0 + g + 8 * h, row = bh * p.Lq + i;
        const float inverse = row_sum > 0.0f ? 1.0f / row_sum : 0.0f;  // 0: a row that sees no key
        if (p.K) weights.write_row(p, lane, h, i < p.Lq, inverse, w + row * p.K);
        if (i >= p.Lq) continue;
        RELGRAD_UNROLL
        for (int n = 0; n < Dh / 8; ++n) {
            z[row * Dh + 8 * n + 2 * t] = o[n][2 * h] * inverse;
            z[row * Dh + 8 * n + 2 * t + 1] = o[n][2 * h + 1] * inverse;
        }
        if (t == 0) lse[row] = row_sum > 0.0f ? m[h] + log(row_sum) : kNegInf;
    }
}

template <MmaInputs In, int Dh>
__global__ void __launch_bounds__(kMmaThreads, 1)
    mma_query_gradients_kernel(Problem p, const float* q, const float* k, const float* v, const float* z,
                               const float* lse, const float* dz, const float* qe, const float* g_rows,
                               const float* bias, float scale, float* dq, float* p_sums, float* s_sums, float* d_rows) {
    constexpr int kRowStride = Dh + kTilePad;
    RELGRAD_DYNAMIC_SHARED(float, shared);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int64_t interior = p.K > 2 ? p.K - 2 : 0;
    const Shared<float> after_tiles = shared + 4 * kMmaKeys * kRowStride;
    const Shared<float> scratch = after_tiles + warp * 16 * kScratchStride;
    const Shared<float> bands = after_tiles + kMmaWarps * 16 * kScratchStride;
    const Shared<float> dz_rows = bands + 2 * kMmaRows * interior + warp * 16 * kRowStride;  // its rows of dZ
    const int64_t bh = blockIdx.y, i0 = int64_t{blockIdx.x} * kMmaRows, warp_i0 = i0 + 16 * warp;
    uint32_t qa[Dh / mma_k(In)][4];
    load_row_fragments<In, Dh>(q + bh * p.Lq * Dh, warp_i0, p.Lq, lane, qa);
    // the warp's dZ rows into shared memory (read as A fragments per tile), and D_i = dz_i . z_i
    float d[2], row_lse[2];
    RELGRAD_UNROLL
    for (int h = 0; h < 2; ++h) {
        const int64_t i = warp_i0 + g + 8 * h, row = bh * p.Lq + i;
        float partial = 0.0f;
        for (int c = t; c < Dh; c += 4) {
            const float x = i < p.Lq ? dz[row * Dh + c] : 0.0f;
            dz_rows[(g + 8 * h) * kRowStride + c] = x;
            partial += i < p.Lq ? x * z[row * Dh + c] : 0.0f;
        }
        d[h] = quad_sum(partial);
        row_lse[h] = i < p.Lq ? lse[row] : kNegInf;
        if (i < p.Lq && t == 0) d_rows[row] = d[h];
    }
    BucketSums p_by_bucket{{0, 0}, {0, 0}, bands + warp * 16 * interior, interior};
    BucketSums ds_by_bucket{{0, 0}, {0, 0}, bands + (kMmaWarps + warp) * 16 * interior, interior};
    for (int64_t e = lane; e < 16 * interior; e += 32) p_by_bucket.band[e] = ds_by_bucket.band[e] = 0.0f;
    float dq_acc[Dh / 8][4] = {};
    __syncwarp();

    const KeyRange seen(p, i0);
    const auto key_tile = [&](int64_t j0, Shared<float> keys, Shared<float> values) {
        float s[kKeyTiles][4], dp[kKeyTiles][4];
        rows_times_tile_rows<In, Dh>(FromRegisters<In, Dh>{qa}, keys, lane, s);
        scores_of(p, s, qe, bias, scale, bh, warp_i0, j0, seen.end, lane);
        const auto dz_fragment = [&](int ks, uint32_t(&a)[4]) {  // dZ's, read from the warp's rows
            a_fragment<In>(
                lane, [&](int row, int col) { return dz_rows[row * kRowStride + mma_k(In) * ks + col]; }, a);
        };
        rows_times_tile_rows<In, Dh>(dz_fragment, values, lane, dp);  // dP = dZ V^T
        RELGRAD_UNROLL
        for (int n = 0; n < kKeyTiles; ++n) {
            RELGRAD_UNROLL
            for (int e = 0; e < 4; ++e) {
                const TilePlace at = mma_c_place(lane, e);
                const int h = e / 2;
                const int64_t i = warp_i0 + at.row, j = j0 + 8 * n + at.col;
                const float prob = s[n][e] == kNegInf || row_lse[h] == kNegInf ? 0.0f : exp(s[n][e] - row_lse[h]);
                float ds = 0.0f;
                if (prob > 0.0f) {
                    const int64_t r = p.K ? p.bucket(i, j) : 0;
                    ds = prob * (dp[n][e] + (p.K ? g_rows[(bh * p.Lq + i) * p.K + r] : 0.0f) - d[h]);
                    if (p.K) {
                        p_by_bucket.add(p, at.row, h, r, prob);
                        ds_by_bucket.add(p, at.row, h, r, ds);
                    }
                }
                s[n][e] = scale * ds;  // now c dS
            }
        }
        add_values_times_tile<In, Dh>(s, scratch, keys, lane, dq_acc);  // dQ += c dS K
    };
    walk_tiles<Dh>(shared, k + bh * p.Lk * Dh, v + bh * p.Lk * Dh, seen.begin, seen.end, key_tile);
    __syncwarp();  // the interior buckets, added by every lane of a quad, are read below
    RELGRAD_UNROLL
    for (int h = 0; h < 2; ++h) {
        const int64_t i = warp_i0 + g + 8 * h, row = bh * p.Lq + i;
        if (p.K) {
            p_by_bucket.write_row(p, lane, h, i < p.Lq, 1.0f, p_sums + row * p.K);
            ds_by_bucket.write_row(p, lane, h, i < p.Lq, 1.0f, s_sums + row * p.K);
        }
        if (i >= p.Lq) continue;
        RELGRAD_UNROLL
        for (int n = 0; n < Dh / 8; ++n) {
            dq[row * Dh + 8 * n + 2 * t] = dq_acc[n][2 * h];
            dq[row * Dh + 8 * n + 2 * t + 1] = dq_acc[n][2 * h + 1];
        }
    }
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

dim3 grid_of(int64_t rows, int64_t batch_heads, const char* kernel, int64_t rows_per_block = kTileRows) {
    RELGRAD_CHECK(batch_heads <= 65535, kernel, ": ", batch_heads,
                  " (batch, head) pairs; the cuda kernels take at most 65535");
    return dim3(static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block),
                static_cast<unsigned>(batch_heads));
}

// dK and dV for a block of kMmaRows keys, 16 a warp, walking the tiles of the queries that can see
// them (Q and dZ through cp.async), with the roles of queries and keys swapped: per tile
//   S^T = K Q^T,  P^T = exp(s - lse_i),  dP^T = V dZ^T + G[i, r],  dS^T = P^T (dP^T - D_i)
//   dV += P^T dZ,  dK += c dS^T Q
// The warp's K and V rows stay in shared memory (registers hold dK and dV), read one k-step at a
// time as A fragments.
template <MmaInputs In, int Dh>
__global__ void __launch_bounds__(kMmaThreads, 1)
    mma_key_gradients_kernel(Problem p, const float* q, const float* k, const float* v, const float* lse,
                             const float* dz, const float* qe, const float* g_rows, const float* d_rows,
                             const float* bias, float scale, float* dk, float* dv) {
    constexpr int kRowStride = Dh + kTilePad;
    RELGRAD_DYNAMIC_SHARED(float, shared);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const Shared<float> after_tiles = shared + 4 * kMmaKeys * kRowStride;
    const Shared<float> scratch = after_tiles + warp * 16 * kScratchStride;
    const Shared<float> key_rows = after_tiles + kMmaWarps * 16 * kScratchStride + warp * 16 * kRowStride;
    const Shared<float> value_rows = key_rows + kMmaRows * kRowStride;
    const int64_t bh = blockIdx.y, j0 = int64_t{blockIdx.x} * kMmaRows, warp_j0 = j0 + 16 * warp;
    for (int64_t e = lane; e < 16 * Dh; e += 32) {  // the warp's rows of K and V, zeros past Lk
        const int64_t row = e / Dh, col = e % Dh, j = warp_j0 + row;
        key_rows[row * kRowStride + col] = j < p.Lk ? k[(bh * p.Lk + j) * Dh + col] : 0.0f;
        value_rows[row * kRowStride + col] = j < p.Lk ? v[(bh * p.Lk + j) * Dh + col] : 0.0f;
    }
    __syncwarp();
    const auto fragment_of = [&](Shared<float> rows) {
        return [=](int ks, uint32_t(&a)[4]) {
            a_fragment<In>(
                lane, [&](int row, int col) { return rows[row * kRowStride + mma_k(In) * ks + col]; }, a);
        };
    };
    float dk_acc[Dh / 8][4] = {}, dv_acc[Dh / 8][4] = {};
    const int64_t j1 = j0 + kMmaRows < p.Lk ? j0 + kMmaRows : p.Lk;
    const int64_t begin = p.queries_begin(j0), end = p.queries_end(j1);
    const auto query_tile = [&](int64_t i0, Shared<float> queries, Shared<float> dz_tile) {
        float probs[kKeyTiles][4], slopes[kKeyTiles][4];  // P^T and c dS^T: key rows, query columns
        rows_times_tile_rows<In, Dh>(fragment_of(key_rows), queries, lane, probs);     // S^T = K Q^T
        rows_times_tile_rows<In, Dh>(fragment_of(value_rows), dz_tile, lane, slopes);  // dP^T = V dZ^T
        RELGRAD_UNROLL
        for (int n = 0; n < kKeyTiles; ++n) {
            RELGRAD_UNROLL
            for (int e = 0; e < 4; ++e) {
                const TilePlace at = mma_c_place(lane, e);
                const int64_t j = warp_j0 + at.row, i = i0 + 8 * n + at.col, row = bh * p.Lq + i;
                float prob = 0.0f, ds = 0.0f;
                if (j < p.Lk && i < end && p.visible(bh, i, j) && lse[row] > kNegInf) {
                    const int64_t r = p.K ? p.bucket(i, j) : 0;
                    const float score =
                        scale * (probs[n][e] + (p.K ? qe[row * p.K + r] : 0.0f)) + bias_of(p, bias, bh, i, j);
                    prob = exp(score - lse[row]);
                    ds = prob * (slopes[n][e] + (p.K ? g_rows[row * p.K + r] : 0.0f) - d_rows[row]);
                }
                probs[n][e] = prob;
                slopes[n][e] = scale * ds;
            }
        }
        add_values_times_tile<In, Dh>(probs, scratch, dz_tile, lane, dv_acc);   // dV += P^T dZ
        add_values_times_tile<In, Dh>(slopes, scratch, queries, lane, dk_acc);  // dK += c dS^T Q
    };
    walk_tiles<Dh>(shared, q + bh * p.Lq * Dh, dz + bh * p.Lq * Dh, begin, end, query_tile);
    RELGRAD_UNROLL
    for (int h = 0; h < 2; ++h) {
        const int64_t j = warp_j0 + g + 8 * h, row = bh * p.Lk + j;
        if (j >= p.Lk) continue;
        RELGRAD_UNROLL
        for (int n = 0; n < Dh / 8; ++n) {
            RELGRAD_UNROLL
            for (int c = 0; c < 2; ++c) {
                dk[row * Dh + 8 * n + 2 * t + c] = dk_acc[n][2 * h + c];
                dv[row * Dh + 8 * n + 2 * t + c] = dv_acc[n][2 * h + c];
            }
        }
    }
}

// The kernels on tensor cores take float32 (and the float32 copies of 16-bit operands) at head
// widths 32, 64 and 128 when each one's shared memory fits in 163 KiB, sm_80's most (Shaw's tables
// add K - 2 interior buckets a row).
constexpr int64_t kMaxMmaSharedBytes = 163 * 1024;
// The shared memory of each kernel (mma_shared_floats): the forward's band; the query gradients'
// two bands (P and dS by bucket) and dZ rows; the key gradients' K and V rows.
int64_t forward_floats(const Problem& p) { return mma_shared_floats(p.Dh, p.K, 1, 0); }
int64_t query_gradients_floats(const Problem& p) { return mma_shared_floats(p.Dh, p.K, 2, 1); }
int64_t key_gradients_floats(const Problem& p) { return mma_shared_floats(p.Dh, p.K, 0, 2); }
bool uses_tensor_cores(DType dtype, const Problem& p) {
    const int64_t most = std::max({forward_floats(p), query_gradients_floats(p), key_gradients_floats(p)});
    return dtype == DType::float32 && (p.Dh == 32 || p.Dh == 64 || p.Dh == 128) &&
           most * static_cast<int64_t>(sizeof(float)) <= kMaxMmaSharedBytes;
}

// The tensor-core inputs for operands of a dtype: tf32 for float32, the 16-bit type itself for
// bfloat16 and float16 (whose values reach the kernels exact, in float32 copies).
MmaInputs mma_inputs_for(DType operands) {
    if (operands == DType::bfloat16) return MmaInputs::bfloat16;
    if (operands == DType::float16) return MmaInputs::float16;
    return MmaInputs::tf32;
}

// A kernel's name per tensor-core inputs, in MmaInputs' order (the name a fault message gives)
using NamesByInputs = const char* const[3];
constexpr NamesByInputs kForwardNames = {"fused_attention (tensor cores, tf32)",
                                         "fused_attention (tensor cores, bfloat16)",
                                         "fused_attention (tensor cores, float16)"};
constexpr NamesByInputs kQueryGradientsNames = {"fused_attention_backward (queries, tensor cores, tf32)",
                                                "fused_attention_backward (queries, tensor cores, bfloat16)",
                                                "fused_attention_backward (queries, tensor cores, float16)"};
constexpr NamesByInputs kKeyGradientsNames = {"fused_attention_backward (keys, tensor cores, tf32)",
                                              "fused_attention_backward (keys, tensor cores, bfloat16)",
                                              "fused_attention_backward (keys, tensor cores, float16)"};

// Launches kernel_for(In, Dh) (a kernel template's instance, In and Dh given as integral constants)
// for the inputs of `operands` and p.Dh (32, 64 or 128) over blocks of kMmaRows of `rows` (queries
// or keys), with `floats` of shared memory.
template <class KernelFor, class... Args>
void launch_on_tensor_cores(const NamesByInputs& names, const Problem& p, DType operands, int64_t rows, int64_t B,
                            int64_t floats, KernelFor kernel_for, Args... args) {
    const char* name = names[static_cast<int>(mma_inputs_for(operands))];
    const auto bytes = static_cast<std::size_t>(floats) * sizeof(float);
    const dim3 grid = grid_of(rows, B * p.H, name, kMmaRows);
    const auto run = [&](auto in) {
        const auto run_for = [&](auto Dh) {
            const auto kernel = kernel_for(in, Dh);
            allow_dynamic_shared(name, kernel, bytes);
            launch(name, kernel, grid, kMmaThreads, bytes, p, args...);
        };
        if (p.Dh == 32) run_for(std::integral_constant<int, 32>());
        if (p.Dh == 64) run_for(std::integral_constant<int, 64>());
        if (p.Dh == 128) run_for(std::integral_constant<int, 128>());
    };
    switch (mma_inputs_for(operands)) {
        case MmaInputs::tf32: return run(std::integral_constant<MmaInputs, MmaInputs::tf32>());
        case MmaInputs::bfloat16: return run(std::integral_constant<MmaInputs, MmaInputs::bfloat16>());
        case MmaInputs::float16: return run(std::integral_constant<MmaInputs, MmaInputs::float16>());
    }
}

}  // namespace

bool CudaBackend::supports(OptionalKernel kernel) const {
    switch (kernel) {
        case OptionalKernel::fused_attention: return true;
        case OptionalKernel::bfloat16_gemm: return has_gemm_in(DType::bfloat16);
        case OptionalKernel::float16_gemm: return has_gemm_in(DType::float16);
    }
    return false;
}

void CudaBackend::do_fused_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionPattern& pattern,
                                     double scale, const ClippedRelativeTerms& relative, Tensor& z, Tensor& lse,
                                     DType operands) {
    const Problem p = problem_of(q, k, pattern, relative, "fused_attention");
    const int64_t B = q.size(0);
    dispatch_floating(q.dtype(), "fused_attention", [&](auto tag) {
        using T = decltype(tag);
        Tensor qe, w;
        int64_t table_stride = 0;
        if (p.K) {  // QE = Q E_K^T, and room for the bucket accumulators W
            qe = empty({B, p.H, p.Lq, p.K}, q.dtype(), Device::cuda);
            w = empty({B, p.H, p.Lq, p.K}, q.dtype(), Device::cuda);
            table_stride = relative.table_k.size(0) > 1 ? p.K * p.Dh : 0;
            per_head_product<T>(true, B, p.H, p.Lq, p.Dh, p.K, T(1), device_data<T>(q),
                                device_data<T>(relative.table_k), table_stride, T(0), device_data<T>(qe));
        }
        if constexpr (std::is_same_v<T, float>) {
            if (uses_tensor_cores(q.dtype(), p)) {
                launch_on_tensor_cores(
                    kForwardNames, p, operands, p.Lq, B, forward_floats(p),
                    [](auto in, auto Dh) { return mma_forward_kernel<decltype(in)::value, decltype(Dh)::value>; },
                    device_data<float>(q), device_data<float>(k), device_data<float>(v), device_data_or_null<float>(qe),
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
                                              Tensor& d_distance_bias, DType operands) {
    const Problem p = problem_of(q, k, pattern, relative, "fused_attention_backward");
    const int64_t B = q.size(0);
    dispatch_floating(q.dtype(), "fused_attention_backward", [&](auto tag) {
        using T = decltype(tag);
        Tensor qe, g, p_sums, s_sums;
        const Tensor d_rows = empty({B, p.H, p.Lq}, q.dtype(), Device::cuda);
        const bool per_head = p.K && relative.table_k.size(0) > 1;
        const int64_t table_stride = per_head ? p.K * p.Dh : 0;
        if (p.K) {  // QE = Q E_K^T and G = dZ E_V^T
            for (Tensor* t : {&qe, &g, &p_sums, &s_sums}) *t = empty({B, p.H, p.Lq, p.K}, q.dtype(), Device::cuda);
            per_head_product<T>(true, B, p.H, p.Lq, p.Dh, p.K, T(1), device_data<T>(q),
                                device_data<T>(relative.table_k), table_stride, T(0), device_data<T>(qe));
            per_head_product<T>(true, B, p.H, p.Lq, p.Dh, p.K, T(1), device_data<T>(dz),
                                device_data<T>(relative.table_v), table_stride, T(0), device_data<T>(g));
        }
        const int64_t tile = tile_rows<T>(p.Dh);
        const std::size_t shared_bytes = 2 * tile * p.Dh * sizeof(T);
        if (uses_tensor_cores(q.dtype(), p)) {  // float32 at Dh 32, 64, 128: both kernels on tensor cores
            launch_on_tensor_cores(
                kQueryGradientsNames, p, operands, p.Lq, B, query_gradients_floats(p),
                [](auto in, auto Dh) { return mma_query_gradients_kernel<decltype(in)::value, decltype(Dh)::value>; },
                device_data<float>(q), device_data<float>(k), device_data<float>(v), device_data<float>(z),
                device_data<float>(lse), device_data<float>(dz), device_data_or_null<float>(qe),
                device_data_or_null<float>(g), device_data_or_null<float>(relative.distance_bias), float(scale),
                device_data<float>(dq), p.K ? device_data<float>(p_sums) : nullptr,
                p.K ? device_data<float>(s_sums) : nullptr, device_data<float>(d_rows));
            launch_on_tensor_cores(
                kKeyGradientsNames, p, operands, p.Lk, B, key_gradients_floats(p),
                [](auto in, auto Dh) { return mma_key_gradients_kernel<decltype(in)::value, decltype(Dh)::value>; },
                device_data<float>(q), device_data<float>(k), device_data<float>(v), device_data<float>(lse),
                device_data<float>(dz), device_data_or_null<float>(qe), device_data_or_null<float>(g),
                device_data<float>(d_rows), device_data_or_null<float>(relative.distance_bias), float(scale),
                device_data<float>(dk), device_data<float>(dv));
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
        }
        if (d_distance_bias.defined()) {
            launch("fused_attention_backward (distance bias)", distance_bias_gradient_kernel<T>,
                   grid_of(p.Lq + p.Lk - 1, B * p.H, "fused_attention_backward"), kTileRows, 0, p, device_data<T>(q),
                   device_data<T>(k), device_data<T>(v), device_data<T>(lse), device_data<T>(dz),
                   device_data_or_null<T>(qe), device_data_or_null<T>(g), device_data<T>(d_rows),
                   device_data<T>(relative.distance_bias), T(scale), device_data<T>(d_distance_bias));
        }
        if (!p.K) return;
        // dq += c S E_K, dE_V = sum P^T dZ, dE_K = c sum S^T Q
        per_head_product<T>(false, B, p.H, p.Lq, p.K, p.Dh, T(scale), device_data<T>(s_sums),
                            device_data<T>(relative.table_k), table_stride, T(1), device_data<T>(dq));
        table_gradient<T>(per_head, B, p.H, p.Lq, p.K, p.Dh, T(1), device_data<T>(p_sums), device_data<T>(dz),
                          device_data<T>(d_table_v));
        table_gradient<T>(per_head, B, p.H, p.Lq, p.K, p.Dh, T(scale), device_data<T>(s_sums), device_data<T>(q),
                          device_data<T>(d_table_k));
    });
}

}  // namespace RELGRAD_CUDA_NAMESPACE
}  // namespace relgrad
