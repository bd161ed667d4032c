// The CUDA backend's attention row kernels (engine/ops/attention.cpp, the bucketed op): softmax
// and its backward over the rows of [B, H, Lq, Lk] scores with Shaw's bucket terms, one block per
// row. The per-bucket sums (bucket_weights, d_bucket_scores) take one thread per bucket, which
// walks the row in order: deterministic, no atomics.
#include <limits>

#include "engine/backend/cuda/cuda_backend.hpp"

namespace relgrad {
namespace RELGRAD_CUDA_NAMESPACE {

namespace {

// Where a row finds its relative index: r(i, j) = index[i * row_step + j * column_step].
struct RelativeIndex {
    const int64_t* index;  // nullptr: no relative terms
    int64_t row_step, column_step, buckets;
};

// r(i, j), or -1 without an index; a bucket outside [0, K) is reported and read as -1
__device__ inline int64_t bucket_of(const RelativeIndex& rel, int64_t i, int64_t j, ErrorReport error) {
    if (!rel.index) return -1;
    const int64_t r = rel.index[i * rel.row_step + j * rel.column_step];
    if (r < 0 || r >= rel.buckets) {
        report(error, r, rel.buckets);
        return -1;
    }
    return r;
}

// bucket_sums[r] = the sum of row[j] over the j with r(i, j) = r, one thread per bucket
template <class T>
__device__ void sum_by_bucket(const T* row, int64_t Lk, const RelativeIndex& rel, int64_t i, T* bucket_sums,
                              ErrorReport error) {
    for (int64_t r = threadIdx.x; r < rel.buckets; r += blockDim.x) {
        T total(0);
        for (int64_t j = 0; j < Lk; ++j) {
            if (bucket_of(rel, i, j, error) == r) total += row[j];
        }
        bucket_sums[r] = total;
    }
}

// scores <- softmax_j(mask ? scale (scores + bucket_scores[r(i, j)]) : -inf), in place, and the
// weights summed by bucket into bucket_weights (when given)
template <class T>
__global__ void attention_softmax_kernel(T* scores, const T* bucket_scores, RelativeIndex rel, const bool* mask,
                                         Layout mask_layout, T scale, T* bucket_weights, int64_t Lq, int64_t Lk,
                                         int64_t rows, ErrorReport error) {
    RELGRAD_SHARED(T, partial, kRowThreads);
    const T neg_inf = -std::numeric_limits<T>::infinity();
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const int64_t i = row % Lq;
        T* s = scores + row * Lk;
        const T* biases = bucket_scores ? bucket_scores + row * rel.buckets : nullptr;
        T m = neg_inf;
        for (int64_t j = threadIdx.x; j < Lk; j += blockDim.x) {
            const int64_t r = bucket_of(rel, i, j, error);
            T v = scale * (s[j] + (biases && r >= 0 ? biases[r] : T(0)));
            if (mask && !mask[offset_of(mask_layout, row * Lk + j)]) v = neg_inf;
            s[j] = v;
            m = v > m ? v : m;
        }
        m = block_reduce(m, partial, Max());
        if (m == neg_inf) {  // no visible key: zero weights
            for (int64_t j = threadIdx.x; j < Lk; j += blockDim.x) s[j] = T(0);
        } else {
            T total(0);
            for (int64_t j = threadIdx.x; j < Lk; j += blockDim.x) total += (s[j] = exp(s[j] - m));
            const T inverse = T(1) / block_reduce(total, partial, Add());
            for (int64_t j = threadIdx.x; j < Lk; j += blockDim.x) s[j] *= inverse;
        }
        if (bucket_weights) {
            __syncthreads();  // the whole row is written before the bucket sums read it
            sum_by_bucket(s, Lk, rel, i, bucket_weights + row * rel.buckets, error);
        }
    }
}

// grad <- scale a (da - sum_j da_j a_j) with da = grad + d_buckets[r(i, j)], in place, and the
// result summed by bucket into d_bucket_scores (when given)
template <class T>
__global__ void attention_softmax_backward_kernel(T* grad, const T* weights, const T* d_buckets, RelativeIndex rel,
                                                  T scale, T* d_bucket_scores, int64_t Lq, int64_t Lk, int64_t rows,
                                                  ErrorReport error) {
    RELGRAD_SHARED(T, partial, kRowThreads);
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const int64_t i = row % Lq;
        T* g = grad + row * Lk;
        const T* a = weights + row * Lk;
        const T* shifts = d_buckets ? d_buckets + row * rel.buckets : nullptr;
        T dot(0);
        for (int64_t j = threadIdx.x; j < Lk; j += blockDim.x) {
            const int64_t r = bucket_of(rel, i, j, error);
            g[j] += shifts && r >= 0 ? shifts[r] : T(0);
            dot += g[j] * a[j];
        }
        dot = block_reduce(dot, partial, Add());
        for (int64_t j = threadIdx.x; j < Lk; j += blockDim.x) g[j] = scale * a[j] * (g[j] - dot);
        if (d_bucket_scores) {
            __syncthreads();  // the whole row is written before the bucket sums read it
            sum_by_bucket(g, Lk, rel, i, d_bucket_scores + row * rel.buckets, error);
        }
    }
}

// the causal and window rules, a thread per (i, j)
__global__ void pattern_mask_kernel(bool causal, int64_t window, int64_t query_offset, int64_t Lk, bool* out,
                                    int64_t n) {
    RELGRAD_FOR_EACH_INDEX(e, n) out[e] = seen_by_rules(causal, window, e % Lk - (query_offset + e / Lk));
}

RelativeIndex relative_index(const Tensor& index, int64_t buckets) {
    if (!index.defined()) return {nullptr, 0, 0, 0};
    return {device_data<int64_t>(index), index.strides()[0], index.strides()[1], buckets};
}

// The rows of a [B, H, Lq, Lk] score tensor (one block each), and K, the buckets of its relative
// terms (0 without them).
struct ScoreRows {
    ScoreRows(const Tensor& scores, const Tensor& buckets)
        : K(buckets.defined() ? buckets.size(-1) : 0),
          Lq(scores.size(2)),
          Lk(scores.size(3)),
          count(scores.size(0) * scores.size(1) * Lq) {}
    int64_t K, Lq, Lk, count;
};

}  // namespace

void CudaBackend::do_pattern_mask(bool causal, int64_t window, int64_t query_offset, Tensor& out) {
    const int64_t n = out.numel();
    launch("pattern_mask", pattern_mask_kernel, grid_for(n, kElementThreads), kElementThreads, 0, causal, window,
           query_offset, out.size(1), device_data<bool>(out), n);
}

void CudaBackend::do_attention_softmax(Tensor& scores, const Tensor& bucket_scores, const Tensor& index,
                                       const Tensor& mask, double scale, Tensor& bucket_weights) {
    const ScoreRows rows(scores, bucket_scores);
    const ErrorReport error = error_report("attention_softmax", BadInput::bucket);  // a bucket outside [0, K)
    dispatch_floating(scores.dtype(), "attention_softmax", [&](auto tag) {
        using T = decltype(tag);
        launch("attention_softmax", attention_softmax_kernel<T>, grid_for(rows.count, 1), row_threads(rows.Lk), 0,
               device_data<T>(scores), device_data_or_null<T>(bucket_scores), relative_index(index, rows.K),
               device_data_or_null<bool>(mask), mask.defined() ? layout_of(mask, "attention_softmax") : Layout(),
               T(scale), device_data_or_null<T>(bucket_weights), rows.Lq, rows.Lk, rows.count, error);
    });
}

void CudaBackend::do_attention_softmax_backward(Tensor& grad, const Tensor& weights, const Tensor& d_buckets,
                                                const Tensor& index, double scale, Tensor& d_bucket_scores) {
    const ScoreRows rows(grad, d_buckets.defined() ? d_buckets : d_bucket_scores);
    const ErrorReport error = error_report("attention_softmax_backward", BadInput::bucket);
    dispatch_floating(grad.dtype(), "attention_softmax_backward", [&](auto tag) {
        using T = decltype(tag);
        launch("attention_softmax_backward", attention_softmax_backward_kernel<T>, grid_for(rows.count, 1),
               row_threads(rows.Lk), 0, device_data<T>(grad), device_data<T>(weights),
               device_data_or_null<T>(d_buckets), relative_index(index, rows.K), T(scale),
               device_data_or_null<T>(d_bucket_scores), rows.Lq, rows.Lk, rows.count, error);
    });
}

}  // namespace RELGRAD_CUDA_NAMESPACE
}  // namespace relgrad
