// Fused relative attention on tensor cores: the forward and the backward's kernels of
// FlashAttention-2's shape, for float32, bfloat16 and float16 operands at head widths 32, 64 and
// 128, read in their own dtype (docs/cuda_tiling.md has the tiles, fused_attention.cu the math and
// the scalar kernels everything else takes). One file: the four kernels share the fragment loaders
// and tile loops above them, and are instantiated here for every input type and head width.
#include <algorithm>
#include <limits>
#include <type_traits>

#include "engine/backend/cuda/fused_attention.hpp"
#include "engine/backend/cuda/mma.hpp"
#include "engine/errors.hpp"

namespace relgrad {
namespace RELGRAD_CUDA_NAMESPACE {

namespace {

// float32, bfloat16 and float16 at head widths 32, 64 and 128 (float64 keeps the scalar kernels of
// fused_attention.cu): FlashAttention-2's split of the queries, on tensor cores. A block of kMmaWarps warps takes 16
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
// in one tile fall in distinct buckets: no two lanes add to one place). In a product of a 16 x 32
// tile of values (P, dS) with a tile of keys' rows, the values enter as A fragments straight from
// the lane's C fragments for 16-bit inputs, and through the warp's scratch in shared memory for
// tf32, whose A places differ from C's.
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
// K, V (and dZ) rows Dh + 8 values, the scratch kMmaKeys + 4 floats.
constexpr int kTilePad = 8, kScratchStride = kMmaKeys + 4;
constexpr unsigned kFullWarp = 0xffffffffu;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The shared memory of these kernels, in bytes, for operands of `stored` bytes an element: two
// buffers of a pair of tiles (K and V, or Q and dZ) and `own_matrices` [kMmaRows, Dh] matrices of
// the block's own rows (dZ; K and V), of operands; a scratch per warp and `band_rows` rows of
// interior buckets per row of the block, of floats.
int64_t mma_shared_bytes(int64_t stored, int64_t Dh, int64_t K, int64_t band_rows, int64_t own_matrices) {
    const int64_t operands = (4 * kMmaKeys + own_matrices * kMmaRows) * (Dh + kTilePad);
    const int64_t floats = kMmaWarps * 16 * kScratchStride + band_rows * kMmaRows * std::max<int64_t>(K - 2, 0);
    return stored * operands + static_cast<int64_t>(sizeof(float)) * floats;
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

// The type q, k, v, z and dZ have in memory (global and shared) for tensor-core inputs In: float32
// for tf32, else the 16-bit type itself.
template <MmaInputs In>
using Stored =
    std::conditional_t<In == MmaInputs::tf32, float, std::conditional_t<In == MmaInputs::bfloat16, BFloat16, Float16>>;

// q, k, v ([B, H, L, Dh]) and the backward's z and dZ, as the kernels read them
template <class S>
struct Operands {
    const S *q, *k, *v, *z, *dz;
};

// Two elements of a 16-bit A or B fragment in one register, `low` the one with the lower index: an
// operand's 16-bit values as they are, a float32 value (P, dS) rounded to nearest even, as
// FlashAttention-2 rounds them.
template <MmaInputs In, class Value>
__device__ inline uint32_t input_pair(Value low, Value high) {
    if constexpr (std::is_same_v<Value, float>) {
        return pack_16_bit(In, low, high);
    } else {
        static_assert(std::is_same_v<Value, Stored<In>>, "16-bit values of another type than the mma's");
        return uint32_t{low.bits} | uint32_t{high.bits} << 16;
    }
}

// A lane's fragment of an mma operand for inputs In: element e, at place_of(e) (mma.hpp), holds
// value_at(row, col) (a float, or a Stored<In> value), rounded to tf32 or two to a register.
template <MmaInputs In, int Registers, class PlaceOf, class ValueAt>
__device__ inline void fragment(const PlaceOf& place_of, const ValueAt& value_at, uint32_t (&regs)[Registers]) {
    RELGRAD_UNROLL
    for (int r = 0; r < Registers; ++r) {
        if constexpr (In == MmaInputs::tf32) {
            const TilePlace at = place_of(r);
            regs[r] = tf32_of(value_at(at.row, at.col));
        } else {
            const TilePlace low = place_of(2 * r), high = place_of(2 * r + 1);
            regs[r] = input_pair<In>(value_at(low.row, low.col), value_at(high.row, high.col));
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

// rows [first, first + Rows) of two [*, Dh] matrices (K and V, or Q and dZ) into one buffer
// each, 16 bytes a copy, zeros for the rows outside [begin, end) (begin < end)
template <int Dh, int Rows = kMmaKeys, class S>
__device__ void copy_tile_pair(Shared<S> to_a, Shared<S> to_b, const S* a, const S* b, int64_t first, int64_t begin,
                               int64_t end) {
    constexpr int kPerCopy = 16 / sizeof(S), kRowStride = Dh + kTilePad, kChunks = Dh / kPerCopy;
    for (int c = threadIdx.x; c < Rows * kChunks; c += kMmaThreads) {
        const int row = c / kChunks, col = kPerCopy * (c % kChunks);
        const int64_t n = first + row;
        const bool exists = n >= begin && n < end;
        const int64_t from = (exists ? n : begin) * Dh + col;  // a row that exists, when zeros are copied
        const std::size_t zeros = exists ? 0 : 16;
        __pipeline_memcpy_async(to_a + row * kRowStride + col, a + from, 16, zeros);
        __pipeline_memcpy_async(to_b + row * kRowStride + col, b + from, 16, zeros);
    }
}

// The 16 rows [i0, i0 + 16) of a [*, Dh] matrix as the A fragment of k-step ks (dims
// [kK ks, kK ks + kK), kK = mma_k(In)), zeros past Lq
template <MmaInputs In, int Dh>
__device__ void row_fragment(const Stored<In>* rows, int64_t i0, int64_t Lq, int lane, int ks, uint32_t (&a)[4]) {
    constexpr int kK = mma_k(In);
    a_fragment<In>(
        lane,
        [&](int row, int col) { return i0 + row < Lq ? rows[(i0 + row) * Dh + kK * ks + col] : Stored<In>(0.0f); }, a);
}
// ... and as the fragments of every k-step
template <MmaInputs In, int Dh>
__device__ void load_row_fragments(const Stored<In>* rows, int64_t i0, int64_t Lq, int lane,
                                   uint32_t (&a)[Dh / mma_k(In)][4]) {
    RELGRAD_UNROLL
    for (int ks = 0; ks < Dh / mma_k(In); ++ks) row_fragment<In, Dh>(rows, i0, Lq, lane, ks, a[ks]);
}

// ldmatrix.x4 (mma.hpp) of the 16 x 16 16-bit values of shared memory from `top_left` (rows
// kRowStride apart): out[m] from the 8 x 8 matrix at rows 8 (m % 2), columns 8 (m / 2) of them, so
// that untransposed, out is the A fragment of those rows and columns
template <bool Transposed, int kRowStride, class S>
__device__ void load_16_by_16(Shared<S> top_left, int lane, uint32_t (&out)[4]) {
    const int m = lane / 8, r = lane % 8;
    load_matrices<Transposed>(top_left + (8 * (m % 2) + r) * kRowStride + 8 * (m / 2), out);
}

// The A fragment of k-step ks of the warp's 16 rows of a [16, Dh] matrix in shared memory (row
// stride Dh + kTilePad): by ldmatrix for 16-bit inputs
template <MmaInputs In, int Dh>
__device__ void shared_rows_fragment(Shared<Stored<In>> rows, int lane, int ks, uint32_t (&a)[4]) {
    constexpr int kRowStride = Dh + kTilePad, kK = mma_k(In);
    if constexpr (In == MmaInputs::tf32) {
        a_fragment<In>(
            lane, [&](int row, int col) { return float(rows[row * kRowStride + kK * ks + col]); }, a);
    } else {
        load_16_by_16<false, kRowStride>(rows + kK * ks, lane, a);
    }
}

// out = A T^T for the warp's 16 rows: A [16, Dh], its fragment for dims [kK ks, kK ks + kK) given
// by a_of(ks, a) (from registers, or read from shared memory one k-step at a time, which keeps
// registers free), T a tile of kMmaKeys rows of Dh in shared memory (row stride Dh + kTilePad):
// out[n][e] at C place e of T's rows [8 n, 8 n + 8)
template <MmaInputs In, int Dh, class AOf>
__device__ void rows_times_tile_rows(AOf&& a_of, Shared<Stored<In>> tile, int lane, float (&out)[kKeyTiles][4]) {
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
        if constexpr (In == MmaInputs::tf32) {
            RELGRAD_UNROLL
            for (int n = 0; n < kKeyTiles; ++n) {
                uint32_t b[2];
                b_fragment<In>(  // B's row is a dim, its column a tile row
                    lane, [&](int row, int col) { return tile[(8 * n + col) * kRowStride + kK * ks + row]; }, b);
                mma_sync<In>(out[n], a, b, out[n]);
            }
        } else {  // two key tiles' B fragments a load: tile rows 8 n + [0, 16), dims kK ks + [0, 16)
            RELGRAD_UNROLL
            for (int n = 0; n < kKeyTiles; n += 2) {
                uint32_t loaded[4];
                load_16_by_16<false, kRowStride>(tile + 8 * n * kRowStride + kK * ks, lane, loaded);
                const uint32_t b_first[2] = {loaded[0], loaded[2]}, b_second[2] = {loaded[1], loaded[3]};
                mma_sync<In>(out[n], a, b_first, out[n]);
                mma_sync<In>(out[n + 1], a, b_second, out[n + 1]);
            }
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

// acc += X T for the warp's 16 rows: X [16, kMmaKeys] at C places (x), T a tile of kMmaKeys rows
// of Dh in shared memory. X enters the mma as A fragments. With 16-bit inputs a lane's A element i
// of k-step ks is its own C element i % 4 of key tile 2 ks + i / 4 (the same row and column, as
// mma.hpp's places give), so X is packed from registers, as FlashAttention-2 does. tf32's A puts
// a lane's columns t and t + 4 where C has 2t and 2t + 1: X goes through the warp's scratch in
// shared memory, written at C places and read at A places.
template <MmaInputs In, int Dh>
__device__ void add_values_times_tile(const float (&x)[kKeyTiles][4], Shared<float> scratch, Shared<Stored<In>> tile,
                                      int lane, float (&acc)[Dh / 8][4]) {
    constexpr int kRowStride = Dh + kTilePad, kK = mma_k(In);
    if constexpr (In == MmaInputs::tf32) {
        RELGRAD_UNROLL
        for (int n = 0; n < kKeyTiles; ++n) {
            RELGRAD_UNROLL
            for (int e = 0; e < 4; ++e) {
                const TilePlace at = mma_c_place(lane, e);
                scratch[at.row * kScratchStride + 8 * n + at.col] = x[n][e];
            }
        }
        __syncwarp();  // written at C places, read at A places
    }
    RELGRAD_UNROLL
    for (int ks = 0; ks < kMmaKeys / kK; ++ks) {
        uint32_t a[4];
        if constexpr (In == MmaInputs::tf32) {
            a_fragment<In>(  // A's column is a tile row
                lane, [&](int row, int col) { return float(scratch[row * kScratchStride + kK * ks + col]); }, a);
        } else {
            RELGRAD_UNROLL
            for (int r = 0; r < 4; ++r) {  // elements 2r and 2r + 1
                a[r] = pack_16_bit(In, x[2 * ks + r / 2][2 * (r % 2)], x[2 * ks + r / 2][2 * (r % 2) + 1]);
            }
        }
        if constexpr (In == MmaInputs::tf32) {
            RELGRAD_UNROLL
            for (int n = 0; n < Dh / 8; ++n) {
                uint32_t b[2];
                b_fragment<In>(  // B's row is a tile row, its column a dim
                    lane, [&](int row, int col) { return tile[(kK * ks + row) * kRowStride + 8 * n + col]; }, b);
                mma_sync<In>(acc[n], a, b, acc[n]);
            }
        } else {  // two dim tiles' B fragments a transposed load: tile rows kK ks + [0, 16), dims 8 n + [0, 16)
            RELGRAD_UNROLL
            for (int n = 0; n < Dh / 8; n += 2) {
                uint32_t loaded[4];
                load_16_by_16<true, kRowStride>(tile + kK * ks * kRowStride + 8 * n, lane, loaded);
                const uint32_t b_first[2] = {loaded[0], loaded[1]}, b_second[2] = {loaded[2], loaded[3]};
                mma_sync<In>(acc[n], a, b_first, acc[n]);
                mma_sync<In>(acc[n + 1], a, b_second, acc[n + 1]);
            }
        }
    }
    if constexpr (In == MmaInputs::tf32) __syncwarp();  // every lane has read the scratch before it is written again
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
template <int Dh, class S, class Step>
__device__ void walk_tiles(Shared<S> shared, const S* a, const S* b, int64_t begin, int64_t end, Step&& step) {
    constexpr int kBuffer = kMmaKeys * (Dh + kTilePad);
    const int64_t tiles = end > begin ? (end - begin + kMmaKeys - 1) / kMmaKeys : 0;
    const Shared<S> a_tiles = shared, b_tiles = shared + 2 * kBuffer;  // two buffers each
    if (tiles > 0) copy_tile_pair<Dh>(a_tiles, b_tiles, a, b, begin, begin, end);
    __pipeline_commit();
    for (int64_t tile = 0; tile < tiles; ++tile) {
        const int64_t first = begin + tile * kMmaKeys, buffer = tile % 2;
        if (tile + 1 < tiles) {  // the next tile's copy, in flight while this one is used
            copy_tile_pair<Dh>(a_tiles + (1 - buffer) * kBuffer, b_tiles + (1 - buffer) * kBuffer, a, b,
                               first + kMmaKeys, first + kMmaKeys, end);
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
    mma_forward_kernel(Problem p, Operands<Stored<In>> operands, const float* qe, const float* bias, float scale,
                       float* w, float* z, float* lse) {
    using S = Stored<In>;
    RELGRAD_DYNAMIC_SHARED(S, shared);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int64_t interior = p.K > 2 ? p.K - 2 : 0;
    const Shared<float> after_tiles = shared_cast<float>(shared + 4 * kMmaKeys * (Dh + kTilePad));
    const Shared<float> scratch = after_tiles + warp * 16 * kScratchStride;
    const int64_t bh = blockIdx.y, i0 = int64_t{blockIdx.x} * kMmaRows, warp_i0 = i0 + 16 * warp;
    uint32_t qa[Dh / mma_k(In)][4];
    load_row_fragments<In, Dh>(operands.q + bh * p.Lq * Dh, warp_i0, p.Lq, lane, qa);
    float o[Dh / 8][4] = {};
    float m[2] = {kNegInf, kNegInf}, l[2] = {0, 0};  // rows g, g + 8
    BucketSums weights{{0, 0}, {0, 0}, after_tiles + kMmaWarps * 16 * kScratchStride + warp * 16 * interior, interior};
    for (int64_t e = lane; e < 16 * interior; e += 32) weights.band[e] = 0.0f;
    __syncwarp();

    const KeyRange seen(p, i0);
    const auto key_tile = [&](int64_t j0, Shared<S> keys, Shared<S> values) {
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
    walk_tiles<Dh>(shared, operands.k + bh * p.Lk * Dh, operands.v + bh * p.Lk * Dh, seen.begin, seen.end, key_tile);
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
    mma_query_gradients_kernel(Problem p, Operands<Stored<In>> operands, const float* lse, const float* qe,
                               const float* g_rows, const float* bias, float scale, float* dq, float* p_sums,
                               float* s_sums, float* d_rows) {
    using S = Stored<In>;
    constexpr int kRowStride = Dh + kTilePad;
    RELGRAD_DYNAMIC_SHARED(S, shared);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int64_t interior = p.K > 2 ? p.K - 2 : 0;
    const Shared<float> after_tiles = shared_cast<float>(shared + 4 * kMmaKeys * kRowStride);
    const Shared<float> scratch = after_tiles + warp * 16 * kScratchStride;
    const Shared<float> bands = after_tiles + kMmaWarps * 16 * kScratchStride;
    const Shared<S> dz_rows = shared_cast<S>(bands + 2 * kMmaRows * interior) + warp * 16 * kRowStride;  // its dZ rows
    const int64_t bh = blockIdx.y, i0 = int64_t{blockIdx.x} * kMmaRows, warp_i0 = i0 + 16 * warp;
    uint32_t qa[Dh / mma_k(In)][4];
    load_row_fragments<In, Dh>(operands.q + bh * p.Lq * Dh, warp_i0, p.Lq, lane, qa);
    // the warp's dZ rows into shared memory (read as A fragments per tile), and D_i = dz_i . z_i
    float d[2], row_lse[2];
    RELGRAD_UNROLL
    for (int h = 0; h < 2; ++h) {
        const int64_t i = warp_i0 + g + 8 * h, row = bh * p.Lq + i;
        float partial = 0.0f;
        for (int c = t; c < Dh; c += 4) {
            const S x = i < p.Lq ? operands.dz[row * Dh + c] : S(0.0f);
            dz_rows[(g + 8 * h) * kRowStride + c] = x;
            partial += i < p.Lq ? float(x) * float(operands.z[row * Dh + c]) : 0.0f;
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
    const auto key_tile = [&](int64_t j0, Shared<S> keys, Shared<S> values) {
        float s[kKeyTiles][4], dp[kKeyTiles][4];
        rows_times_tile_rows<In, Dh>(FromRegisters<In, Dh>{qa}, keys, lane, s);
        scores_of(p, s, qe, bias, scale, bh, warp_i0, j0, seen.end, lane);
        const auto dz_fragment = [&](int ks, uint32_t(&a)[4]) {  // dZ's, read from the warp's rows
            shared_rows_fragment<In, Dh>(dz_rows, lane, ks, a);
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
    walk_tiles<Dh>(shared, operands.k + bh * p.Lk * Dh, operands.v + bh * p.Lk * Dh, seen.begin, seen.end, key_tile);
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

// What the backward's pair terms read besides S and dP: QE and G ([B, H, Lq, K], with Shaw's
// terms), lse and D ([B, H, Lq]) and the distance bias.
struct PairInputs {
    const float *qe, *g_rows, *lse, *d_rows, *bias;
    float scale;
};
struct PairGradient {
    float prob = 0.0f, ds = 0.0f;
};
// p_ij = exp(s_ij - lse_i) and dS_ij = p_ij (dP_ij + G[i, r] - D_i) of a pair the pattern shows,
// from S_ij = q_i . k_j and dP_ij = dz_i . v_j
__device__ inline PairGradient pair_gradient(const Problem& p, const PairInputs& in, int64_t bh, int64_t i, int64_t j,
                                             float s, float dp) {
    const int64_t row = bh * p.Lq + i, r = p.K ? p.bucket(i, j) : 0;
    const float score = in.scale * (s + (p.K ? in.qe[row * p.K + r] : 0.0f)) + bias_of(p, in.bias, bh, i, j);
    const float prob = exp(score - in.lse[row]);
    return {prob, prob * (dp + (p.K ? in.g_rows[row * p.K + r] : 0.0f) - in.d_rows[row])};
}

// dK and dV for a block of kMmaRows keys, 16 a warp, walking the tiles of the queries that can see
// them (Q and dZ through cp.async), with the roles of queries and keys swapped: per tile
//   S^T = K Q^T,  P^T = exp(s - lse_i),  dP^T = V dZ^T + G[i, r],  dS^T = P^T (dP^T - D_i)
//   dV += P^T dZ,  dK += c dS^T Q
// The warp's K and V rows stay in shared memory (registers hold dK and dV), read one k-step at a
// time as A fragments.
template <MmaInputs In, int Dh>
__global__ void __launch_bounds__(kMmaThreads, 1)
    mma_key_gradients_kernel(Problem p, Operands<Stored<In>> operands, const float* lse, const float* qe,
                             const float* g_rows, const float* d_rows, const float* bias, float scale, float* dk,
                             float* dv) {
    using S = Stored<In>;
    constexpr int kRowStride = Dh + kTilePad;
    RELGRAD_DYNAMIC_SHARED(S, shared);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const Shared<float> after_tiles = shared_cast<float>(shared + 4 * kMmaKeys * kRowStride);
    const Shared<float> scratch = after_tiles + warp * 16 * kScratchStride;
    const Shared<S> key_rows = shared_cast<S>(after_tiles + kMmaWarps * 16 * kScratchStride) + warp * 16 * kRowStride;
    const Shared<S> value_rows = key_rows + kMmaRows * kRowStride;
    const int64_t bh = blockIdx.y, j0 = int64_t{blockIdx.x} * kMmaRows, warp_j0 = j0 + 16 * warp;
    const PairInputs inputs{qe, g_rows, lse, d_rows, bias, scale};
    for (int64_t e = lane; e < 16 * Dh; e += 32) {  // the warp's rows of K and V, zeros past Lk
        const int64_t row = e / Dh, col = e % Dh, j = warp_j0 + row;
        key_rows[row * kRowStride + col] = j < p.Lk ? operands.k[(bh * p.Lk + j) * Dh + col] : S(0.0f);
        value_rows[row * kRowStride + col] = j < p.Lk ? operands.v[(bh * p.Lk + j) * Dh + col] : S(0.0f);
    }
    __syncwarp();
    const auto fragment_of = [&](Shared<S> rows) {
        return [=](int ks, uint32_t(&a)[4]) { shared_rows_fragment<In, Dh>(rows, lane, ks, a); };
    };
    float dk_acc[Dh / 8][4] = {}, dv_acc[Dh / 8][4] = {};
    const int64_t j1 = j0 + kMmaRows < p.Lk ? j0 + kMmaRows : p.Lk;
    const int64_t begin = p.queries_begin(j0), end = p.queries_end(j1);
    const auto query_tile = [&](int64_t i0, Shared<S> queries, Shared<S> dz_tile) {
        float probs[kKeyTiles][4], slopes[kKeyTiles][4];  // P^T and c dS^T: key rows, query columns
        rows_times_tile_rows<In, Dh>(fragment_of(key_rows), queries, lane, probs);     // S^T = K Q^T
        rows_times_tile_rows<In, Dh>(fragment_of(value_rows), dz_tile, lane, slopes);  // dP^T = V dZ^T
        RELGRAD_UNROLL
        for (int n = 0; n < kKeyTiles; ++n) {
            RELGRAD_UNROLL
            for (int e = 0; e < 4; ++e) {
                const TilePlace at = mma_c_place(lane, e);
                const int64_t j = warp_j0 + at.row, i = i0 + 8 * n + at.col, row = bh * p.Lq + i;
                PairGradient pair;
                if (j < p.Lk && i < end && p.visible(bh, i, j) && lse[row] > kNegInf) {
                    pair = pair_gradient(p, inputs, bh, i, j, probs[n][e], slopes[n][e]);
                }
                probs[n][e] = pair.prob;
                slopes[n][e] = scale * pair.ds;
            }
        }
        add_values_times_tile<In, Dh>(probs, scratch, dz_tile, lane, dv_acc);   // dV += P^T dZ
        add_values_times_tile<In, Dh>(slopes, scratch, queries, lane, dk_acc);  // dK += c dS^T Q
    };
    walk_tiles<Dh>(shared, operands.q + bh * p.Lq * Dh, operands.dz + bh * p.Lq * Dh, begin, end, query_tile);
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

// dB, the distance bias's gradient, for a block of kBiasDistances entries of its row (batch, head)
// by (batch, head): dB[e] = sum_i dS_{i, i + d}, d = e - (Lq - 1) = j - i, with dS as the query
// kernel has it (from q_i . k_j and dz_i . v_j). A warp takes 16 queries at a time, whose keys at
// the block's distances lie in a window of kMmaKeys keys (16 rows + 15 distances): S = Q K^T and
// dP = dZ V^T over the window on tensor cores, dS (0 off the band) into the warp's scratch, and
// each distance's diagonal summed by one lane in a fixed order; then the warps' sums in warp
// order. No atomics: a block owns its entries.
constexpr int kBiasDistances = 16;
constexpr int kBiasKeys = 16 * (kMmaWarps - 1) + kMmaKeys;  // the block's keys at a time: 80
template <MmaInputs In, int Dh>
__global__ void __launch_bounds__(kMmaThreads, 1)
    mma_distance_bias_gradient_kernel(Problem p, Operands<Stored<In>> operands, const float* lse, const float* qe,
                                      const float* g_rows, const float* d_rows, const float* bias, float scale,
                                      float* d_bias) {
    using S = Stored<In>;
    constexpr int kRowStride = Dh + kTilePad;
    RELGRAD_DYNAMIC_SHARED(S, shared);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const Shared<S> keys = shared, values = keys + kBiasKeys * kRowStride;
    const Shared<float> after_windows = shared_cast<float>(values + kBiasKeys * kRowStride);
    const Shared<float> scratch = after_windows + warp * 16 * kScratchStride;
    const Shared<float> warp_sums = after_windows + kMmaWarps * 16 * kScratchStride;
    const int64_t bh = blockIdx.y, entries = p.Lq + p.Lk - 1;
    const PairInputs inputs{qe, g_rows, lse, d_rows, bias, scale};
    const int64_t e0 = int64_t{blockIdx.x} * kBiasDistances, d0 = e0 - (p.Lq - 1);
    // the queries that have a key at one of the block's distances, none where the causal or window
    // rule hides all of them (the offset d - query_offset is what the rules see)
    const int64_t seen_low = d0 - p.query_offset, seen_high = seen_low + kBiasDistances - 1;
    const bool hidden = (p.causal && seen_low > 0) || (p.window >= 0 && (seen_low > p.window || seen_high < -p.window));
    const int64_t rows_begin = d0 + kBiasDistances - 1 < 0 ? -(d0 + kBiasDistances - 1) : 0;
    const int64_t rows_end = hidden ? rows_begin : (p.Lk - d0 < p.Lq ? p.Lk - d0 : p.Lq);
    float sum = 0.0f;  // lanes below kBiasDistances: the warp's part of dB[e0 + lane]
    for (int64_t i0 = rows_begin; i0 < rows_end; i0 += kMmaRows) {
        __syncthreads();  // every warp is done with the last keys
        // the block's keys [i0 + d0, + kBiasKeys), zeros for those before 0 or past Lk
        copy_tile_pair<Dh, kBiasKeys>(keys, values, operands.k + bh * p.Lk * Dh, operands.v + bh * p.Lk * Dh, i0 + d0,
                                      0, p.Lk);
        __pipeline_commit();
        __pipeline_wait_prior(0);
        __syncthreads();                                                 // every thread's copies have landed
        const int64_t warp_i0 = i0 + 16 * warp, warp_j0 = warp_i0 + d0;  // its window: [warp_j0, + kMmaKeys)
        // the warp's rows of Q or dZ, read one k-step at a time
        const auto rows_of = [&p, bh, lane, warp_i0](const S* matrix) {
            return [&p, bh, lane, warp_i0, matrix](int ks, uint32_t(&a)[4]) {
                row_fragment<In, Dh>(matrix + bh * p.Lq * Dh, warp_i0, p.Lq, lane, ks, a);
            };
        };
        float s[kKeyTiles][4], dp[kKeyTiles][4];
        rows_times_tile_rows<In, Dh>(rows_of(operands.q), keys + 16 * warp * kRowStride, lane, s);      // S = Q K^T
        rows_times_tile_rows<In, Dh>(rows_of(operands.dz), values + 16 * warp * kRowStride, lane, dp);  // dP = dZ V^T
        RELGRAD_UNROLL
        for (int n = 0; n < kKeyTiles; ++n) {
            RELGRAD_UNROLL
            for (int e = 0; e < 4; ++e) {
                const TilePlace at = mma_c_place(lane, e);
                const int64_t i = warp_i0 + at.row, j = warp_j0 + 8 * n + at.col, row = bh * p.Lq + i;
                const bool on_band = j - i >= d0 && j - i < d0 + kBiasDistances;
                PairGradient pair;
                if (on_band && i < p.Lq && j >= 0 && j < p.Lk && lse[row] > kNegInf && p.visible(bh, i, j)) {
                    pair = pair_gradient(p, inputs, bh, i, j, s[n][e], dp[n][e]);
                }
                scratch[at.row * kScratchStride + 8 * n + at.col] = pair.ds;
            }
        }
        __syncwarp();  // written at C places, read along diagonals
        if (lane < kBiasDistances) {
            for (int row = 0; row < 16; ++row) sum += scratch[row * kScratchStride + row + lane];  // j - i = d0 + lane
        }
        __syncwarp();  // read before the next window's writes
    }
    if (lane < kBiasDistances) warp_sums[warp * kBiasDistances + lane] = sum;
    __syncthreads();
    const int64_t e = e0 + threadIdx.x;
    if (threadIdx.x < kBiasDistances && e < entries) {
        float total = 0.0f;
        for (int w = 0; w < kMmaWarps; ++w) total += warp_sums[w * kBiasDistances + threadIdx.x];
        d_bias[bh * entries + e] = total;
    }
}

// The most shared memory a kernel may use: 163 KiB, sm_80's most (Shaw's tables add K - 2 interior
// buckets a row).
constexpr int64_t kMaxMmaSharedBytes = 163 * 1024;
// The shared memory of each kernel (mma_shared_bytes): the forward's band; the query gradients'
// two bands (P and dS by bucket) and dZ rows; the key gradients' K and V rows.
int64_t forward_bytes(const Problem& p, int64_t stored) { return mma_shared_bytes(stored, p.Dh, p.K, 1, 0); }
int64_t query_gradients_bytes(const Problem& p, int64_t stored) { return mma_shared_bytes(stored, p.Dh, p.K, 2, 1); }
int64_t key_gradients_bytes(const Problem& p, int64_t stored) { return mma_shared_bytes(stored, p.Dh, p.K, 0, 2); }
// the distance bias's gradient: a window of keys and one of values; the warps' scratch and sums
int64_t bias_gradient_bytes(const Problem& p, int64_t stored) {
    return stored * 2 * kBiasKeys * (p.Dh + kTilePad) +
           static_cast<int64_t>(sizeof(float)) * (kMmaWarps * 16 * kScratchStride + kMmaWarps * kBiasDistances);
}

// The tensor-core inputs for operands of a dtype: tf32 for float32, the 16-bit type itself for
// bfloat16 and float16.
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
constexpr NamesByInputs kBiasGradientNames = {"fused_attention_backward (distance bias, tensor cores, tf32)",
                                              "fused_attention_backward (distance bias, tensor cores, bfloat16)",
                                              "fused_attention_backward (distance bias, tensor cores, float16)"};

// Launches kernel_for(In, Dh) (a kernel template's instance, In and Dh given as integral constants)
// for the inputs of the operands' dtype and p.Dh (32, 64 or 128) over blocks of `per_block` of
// `rows` (queries, keys or distances), with bytes_for(stored) of shared memory, as
// kernel(p, the operands as Stored<In>, args...).
template <class KernelFor, class BytesFor, class... Args>
void launch_on_tensor_cores(const NamesByInputs& names, const Problem& p, const MmaOperands& x, int64_t rows,
                            int64_t per_block, int64_t B, BytesFor bytes_for, KernelFor kernel_for, Args... args) {
    const MmaInputs inputs = mma_inputs_for(x.q.dtype());
    const char* name = names[static_cast<int>(inputs)];
    const dim3 grid = grid_of(rows, B * p.H, name, per_block);
    const auto run = [&](auto in) {
        using S = Stored<decltype(in)::value>;
        const Operands<S> operands{device_data<S>(x.q), device_data<S>(x.k), device_data<S>(x.v),
                                   device_data_or_null<S>(x.z), device_data_or_null<S>(x.dz)};
        const auto bytes = static_cast<std::size_t>(bytes_for(p, int64_t{sizeof(S)}));
        const auto run_for = [&](auto Dh) {
            const auto kernel = kernel_for(in, Dh);
            allow_dynamic_shared(name, kernel, bytes);
            launch(name, kernel, grid, kMmaThreads, bytes, p, operands, args...);
        };
        if (p.Dh == 32) run_for(std::integral_constant<int, 32>());
        if (p.Dh == 64) run_for(std::integral_constant<int, 64>());
        if (p.Dh == 128) run_for(std::integral_constant<int, 128>());
    };
    switch (inputs) {
        case MmaInputs::tf32: return run(std::integral_constant<MmaInputs, MmaInputs::tf32>());
        case MmaInputs::bfloat16: return run(std::integral_constant<MmaInputs, MmaInputs::bfloat16>());
        case MmaInputs::float16: return run(std::integral_constant<MmaInputs, MmaInputs::float16>());
    }
}

}  // namespace

bool uses_tensor_cores(const Problem& p, const MmaOperands& x) {
    const DType dtype = x.q.dtype();
    if (dtype != DType::float32 && !is_16_bit(dtype)) return false;
    if (p.Dh != 32 && p.Dh != 64 && p.Dh != 128) return false;
    const int64_t stored = dtype_size(dtype);
    const int64_t most = std::max({forward_bytes(p, stored), query_gradients_bytes(p, stored),
                                   key_gradients_bytes(p, stored), bias_gradient_bytes(p, stored)});
    // cp.async copies 16 bytes from a 16-byte boundary: every row's start is one when the tensor's is
    const auto aligned = [](const Tensor& t) {
        return !t.defined() || (reinterpret_cast<std::uintptr_t>(t.storage()->data()) % 16 == 0 &&
                                t.offset() * static_cast<int64_t>(dtype_size(t.dtype())) % 16 == 0);
    };
    return most <= kMaxMmaSharedBytes && aligned(x.q) && aligned(x.k) && aligned(x.v) && aligned(x.dz);
}

void mma_forward(const Problem& p, int64_t B, const MmaOperands& x, const float* qe, const float* bias, float scale,
                 float* w, float* z, float* lse) {
    launch_on_tensor_cores(
        kForwardNames, p, x, p.Lq, kMmaRows, B, forward_bytes,
        [](auto in, auto Dh) { return mma_forward_kernel<decltype(in)::value, decltype(Dh)::value>; }, qe, bias, scale,
        w, z, lse);
}

void mma_backward(const Problem& p, int64_t B, const MmaOperands& x, const float* lse, const float* qe, const float* g,
                  const float* bias, float scale, float* dq, float* p_sums, float* s_sums, float* d_rows, float* dk,
                  float* dv, float* d_bias) {
    launch_on_tensor_cores(
        kQueryGradientsNames, p, x, p.Lq, kMmaRows, B, query_gradients_bytes,
        [](auto in, auto Dh) { return mma_query_gradients_kernel<decltype(in)::value, decltype(Dh)::value>; }, lse, qe,
        g, bias, scale, dq, p_sums, s_sums, d_rows);
    launch_on_tensor_cores(
        kKeyGradientsNames, p, x, p.Lk, kMmaRows, B, key_gradients_bytes,
        [](auto in, auto Dh) { return mma_key_gradients_kernel<decltype(in)::value, decltype(Dh)::value>; }, lse, qe, g,
        static_cast<const float*>(d_rows), bias, scale, dk, dv);
    if (!d_bias) return;
    launch_on_tensor_cores(
        kBiasGradientNames, p, x, p.Lq + p.Lk - 1, kBiasDistances, B, bias_gradient_bytes,
        [](auto in, auto Dh) { return mma_distance_bias_gradient_kernel<decltype(in)::value, decltype(Dh)::value>; },
        lse, qe, g, static_cast<const float*>(d_rows), bias, scale, d_bias);
}

}  // namespace RELGRAD_CUDA_NAMESPACE
}  // namespace relgrad
