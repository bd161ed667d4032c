// The CUDA backend's index kernels (engine/ops/index.cpp). Reads (gather, index_select) take one
// thread per output element. The adds (scatter_add, index_add) take one thread per line along the
// indexed dim, which walks its line in order: several sources may add to one output element, and
// a single thread adding them in a fixed order keeps the sums deterministic without atomics.
// An index out of range is reported through an ErrorSlot and thrown on the host.
#include "engine/backend/cuda/cuda_backend.hpp"

namespace relgrad {
namespace RELGRAD_CUDA_NAMESPACE {

namespace {

Shape with_zero_at(Shape strides, int64_t dim) {
    strides[dim] = 0;
    return strides;
}

Shape with_one_at(Shape shape, int64_t dim) {
    shape[dim] = 1;
    return shape;
}

// out[e] = x[x_base(e) + index[e] * step] over the elements e of index (gather) or of out
// (index_select, where index is read at e's coordinate along dim)
template <class T>
__global__ void read_kernel(const T* x, Layout x_base, int64_t step, int64_t size, const int64_t* index,
                            Layout index_layout, T* out, Layout out_layout, int64_t n, DeviceError* error) {
    RELGRAD_FOR_EACH_INDEX(e, n) {
        const int64_t i = index[offset_of(index_layout, e)];
        if (i < 0 || i >= size) {
            report(error, i, size);
            continue;
        }
        out[offset_of(out_layout, e)] = x[offset_of(x_base, e) + i * step];
    }
}

// For each line l (the elements with every coordinate but dim fixed), in order along dim:
// out[out_base(l) + index[...] * step] += src[...], index and src read at line l's k-th element.
template <class T>
__global__ void add_kernel(T* out, Layout out_base, int64_t step, int64_t size, const int64_t* index,
                           Layout index_lines, int64_t index_step, const T* src, Layout src_lines, int64_t src_step,
                           int64_t length, int64_t lines, DeviceError* error) {
    RELGRAD_FOR_EACH_INDEX(l, lines) {
        const int64_t* line_index = index + offset_of(index_lines, l);
        const T* line_src = src + offset_of(src_lines, l);
        T* line_out = out + offset_of(out_base, l);
        for (int64_t k = 0; k < length; ++k) {
            const int64_t i = line_index[k * index_step];
            if (i < 0 || i >= size) {
                report(error, i, size);
                continue;
            }
            line_out[i * step] += line_src[k * src_step];
        }
    }
}

}  // namespace

void CudaBackend::do_gather(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) {
    const int64_t n = index.numel();
    const ErrorSlot error;
    dispatch_floating(x.dtype(), "gather", [&](auto tag) {
        using T = decltype(tag);
        launch("gather", read_kernel<T>, grid_for(n, kElementThreads), kElementThreads, 0, device_data<T>(x),
               layout_of(index.shape(), with_zero_at(x.strides(), dim), "gather"), x.strides()[dim], x.shape()[dim],
               device_data<int64_t>(index), layout_of(index, "gather"), device_data<T>(out), layout_of(out, "gather"),
               n, error.device());
    });
    error.throw_if_index_error("gather", dim);
}

void CudaBackend::do_index_select(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) {
    const int64_t n = out.numel();
    Shape index_strides(out.dim(), 0);  // the index varies along dim only
    index_strides[dim] = index.strides()[0];
    const ErrorSlot error;
    dispatch_floating(x.dtype(), "index_select", [&](auto tag) {
        using T = decltype(tag);
        launch("index_select", read_kernel<T>, grid_for(n, kElementThreads), kElementThreads, 0, device_data<T>(x),
               layout_of(out.shape(), with_zero_at(x.strides(), dim), "index_select"), x.strides()[dim], x.shape()[dim],
               device_data<int64_t>(index), layout_of(out.shape(), index_strides, "index_select"), device_data<T>(out),
               layout_of(out, "index_select"), n, error.device());
    });
    error.throw_if_index_error("index_select", dim);
}

void CudaBackend::do_scatter_add(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
    const Shape lines_shape = with_one_at(index.shape(), dim);
    const int64_t lines = shape_numel(lines_shape), length = index.shape()[dim];
    const ErrorSlot error;
    dispatch_floating(out.dtype(), "scatter_add", [&](auto tag) {
        using T = decltype(tag);
        launch("scatter_add", add_kernel<T>, grid_for(lines, kElementThreads), kElementThreads, 0, device_data<T>(out),
               layout_of(lines_shape, with_zero_at(out.strides(), dim), "scatter_add"), out.strides()[dim],
               out.shape()[dim], device_data<int64_t>(index), layout_of(lines_shape, index.strides(), "scatter_add"),
               index.strides()[dim], device_data<T>(src), layout_of(lines_shape, src.strides(), "scatter_add"),
               src.strides()[dim], length, lines, error.device());
    });
    error.throw_if_index_error("scatter_add", dim);
}

void CudaBackend::do_index_add(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
    const Shape lines_shape = with_one_at(src.shape(), dim);
    const int64_t lines = shape_numel(lines_shape), length = src.shape()[dim];
    const ErrorSlot error;
    dispatch_floating(out.dtype(), "index_add", [&](auto tag) {
        using T = decltype(tag);
        launch("index_add", add_kernel<T>, grid_for(lines, kElementThreads), kElementThreads, 0, device_data<T>(out),
               layout_of(lines_shape, with_zero_at(out.strides(), dim), "index_add"), out.strides()[dim],
               out.shape()[dim], device_data<int64_t>(index), layout_of(lines_shape, Shape(src.dim(), 0), "index_add"),
               index.strides()[0], device_data<T>(src), layout_of(lines_shape, src.strides(), "index_add"),
               src.strides()[dim], length, lines, error.device());
    });
    error.throw_if_index_error("index_add", dim);
}

}  // namespace RELGRAD_CUDA_NAMESPACE
}  // namespace relgrad
