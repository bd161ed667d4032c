// The CUDA backend's reductions (engine/ops/reduce.cpp) and the softmax over the last dim
// (engine/ops/nn.cpp): one block per output row, its threads striding over the row, combined by
// block_reduce in a fixed tree. float32 sums accumulate in float64, as on the CPU.
#include <algorithm>
#include <limits>
#include <vector>

#include "engine/backend/cuda/cuda_backend.hpp"

namespace relgrad {
namespace RELGRAD_CUDA_NAMESPACE {

namespace {

// out[o] = the sum (or max) of x over the `count` elements of row o: row o starts at
// offset_of(kept, o), its r-th element offset_of(reduced, r) further on. A is the accumulator.
template <class T, class A, bool is_max>
__global__ void reduce_kernel(const T* x, Layout kept, Layout reduced, int64_t count, T* out, Layout out_layout,
                              int64_t rows) {
    RELGRAD_SHARED(A, partial, kRowThreads);
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const T* base = x + offset_of(kept, row);
        A total = is_max ? -std::numeric_limits<A>::infinity() : A(0);
        for (int64_t r = threadIdx.x; r < count; r += blockDim.x) {
            const A v = static_cast<A>(base[offset_of(reduced, r)]);
            total = is_max ? Max()(total, v) : total + v;
        }
        total = is_max ? block_reduce(total, partial, Max()) : block_reduce(total, partial, Add());
        if (threadIdx.x == 0) out[offset_of(out_layout, row)] = static_cast<T>(total);
    }
}

// out = softmax (or log_softmax) of each row of `columns` elements; a row that is all -inf gives
// zeros (or -inf)
template <class T>
__global__ void softmax_kernel(const T* x, T* out, int64_t rows, int64_t columns, bool log_softmax) {
    RELGRAD_SHARED(T, partial, kRowThreads);
    const T neg_inf = -std::numeric_limits<T>::infinity();
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const T* in = x + row * columns;
        T* dst = out + row * columns;
        T m = neg_inf;
        for (int64_t j = threadIdx.x; j < columns; j += blockDim.x) m = in[j] > m ? in[j] : m;
        m = block_reduce(m, partial, Max());
        if (m == neg_inf) {  // every entry masked: no probability mass anywhere
            for (int64_t j = threadIdx.x; j < columns; j += blockDim.x) dst[j] = log_softmax ? neg_inf : T(0);
            continue;
        }
        T total(0);
        for (int64_t j = threadIdx.x; j < columns; j += blockDim.x) total += exp(in[j] - m);
        total = block_reduce(total, partial, Add());
        const T log_total = log(total);
        for (int64_t j = threadIdx.x; j < columns; j += blockDim.x) {
            dst[j] = log_softmax ? in[j] - m - log_total : exp(in[j] - m) / total;
        }
    }
}

}  // namespace

void CudaBackend::do_reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, Tensor& out) {
    // the kept dims index the rows, the reduced dims the elements of a row
    Shape kept_shape, kept_strides, out_strides, reduced_shape, reduced_strides;
    for (int64_t d = 0; d < x.dim(); ++d) {
        const bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
        (reduced ? reduced_shape : kept_shape).push_back(x.shape()[d]);
        (reduced ? reduced_strides : kept_strides).push_back(x.strides()[d]);
        if (!reduced) out_strides.push_back(out.strides()[d]);
    }
    const int64_t rows = shape_numel(kept_shape), count = shape_numel(reduced_shape);
    const unsigned threads = row_threads(count);
    dispatch_floating(x.dtype(), "reduce", [&](auto tag) {
        using T = decltype(tag);
        const auto kernel = op == ReduceOp::max ? reduce_kernel<T, T, true> : reduce_kernel<T, double, false>;
        launch("reduce", kernel, grid_for(rows, 1), threads, 0, device_data<T>(x),
               layout_of(kept_shape, kept_strides, "reduce"), layout_of(reduced_shape, reduced_strides, "reduce"),
               count, device_data<T>(out), layout_of(kept_shape, out_strides, "reduce"), rows);
    });
}

void CudaBackend::do_softmax_last_dim(const Tensor& x, int64_t rows, int64_t columns, bool log, Tensor& out) {
    dispatch_floating(x.dtype(), "softmax", [&](auto tag) {
        using T = decltype(tag);
        launch("softmax_last_dim", softmax_kernel<T>, grid_for(rows, 1), row_threads(columns), 0, device_data<T>(x),
               device_data<T>(out), rows, columns, log);
    });
}

}  // namespace RELGRAD_CUDA_NAMESPACE
}  // namespace relgrad
