// The fused attention's problem as its CUDA kernels read it, shared by the two files of kernels:
// fused_attention.cu (the entry points, and the scalar kernels float64 and the other head widths
// take) and fused_attention_mma.cu (the kernels on tensor cores).
#pragma once

#include <cstdint>

#include "engine/backend/cuda/cuda_backend.hpp"
#include "engine/errors.hpp"

namespace relgrad {
namespace RELGRAD_CUDA_NAMESPACE {

constexpr unsigned kTileRows = 32;  // rows of a block of the scalar kernels: one thread each

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

// blocks of rows_per_block of `rows` (x) for each (batch, head) pair (y, at most 65535)
inline dim3 grid_of(int64_t rows, int64_t batch_heads, const char* kernel, int64_t rows_per_block = kTileRows) {
    RELGRAD_CHECK(batch_heads <= 65535, kernel, ": ", batch_heads,
                  " (batch, head) pairs; the cuda kernels take at most 65535");
    return dim3(static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block),
                static_cast<unsigned>(batch_heads));
}

// ---- on tensor cores (fused_attention_mma.cu)

// q, k, v ([B, H, L, Dh], contiguous) and the backward's z and dZ, in one dtype: float32, bfloat16
// or float16, which the kernels read as they are
struct MmaOperands {
    Tensor q, k, v, z, dz;
};
// Whether the kernels on tensor cores take a problem: operands of those dtypes at head widths 32,
// 64 and 128, when each kernel's shared memory fits and the operands start at a 16-byte boundary.
bool uses_tensor_cores(const Problem& p, const MmaOperands& x);
// z and lse, and w (the value-side bucket weights, [B, H, Lq, K]) with relative terms; the caller
// adds w E_V to z.
void mma_forward(const Problem& p, int64_t B, const MmaOperands& x, const float* qe, const float* bias, float scale,
                 float* w, float* z, float* lse);
// dq, and P and dS summed by bucket (p_sums, s_sums) with relative terms, D_i (d_rows); then dk, dv;
// then, when d_bias is given, the distance bias's gradient [B, H, Lq + Lk - 1] (before its sum over
// what the bias shares)
void mma_backward(const Problem& p, int64_t B, const MmaOperands& x, const float* lse, const float* qe, const float* g,
                  const float* bias, float scale, float* dq, float* p_sums, float* s_sums, float* d_rows, float* dk,
                  float* dv, float* d_bias);

}  // namespace RELGRAD_CUDA_NAMESPACE
}  // namespace relgrad
