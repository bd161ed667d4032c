// The CPU's index kernels (engine/ops/index.cpp): reads and adds at integer positions, each index
// checked against its dim as it is used.
#include "engine/backend/cpu/cpu_backend.hpp"
#include "engine/backend/cpu/strided_loops.hpp"
#include "engine/backend/kernel_errors.hpp"
#include "engine/errors.hpp"

namespace relgrad {

using namespace cpu;

namespace {

Shape with_zero_at(Shape strides, int64_t dim) {
    strides[dim] = 0;
    return strides;
}

Shape only_at(int64_t rank, int64_t dim, int64_t stride) {
    Shape strides(rank, 0);
    strides[dim] = stride;
    return strides;
}

int64_t checked_index(int64_t i, int64_t size, const char* kernel, int64_t dim) {
    RELGRAD_CHECK(i >= 0 && i < size, index_out_of_range(kernel, i, dim, size));
    return i;
}

}  // namespace

void CpuBackend::do_gather(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) {
    const int64_t size = x.shape()[dim], step = x.strides()[dim];
    const int64_t* idx = device_data<int64_t>(index);
    dispatch_floating(x.dtype(), "gather", [&](auto tag) {
        using T = decltype(tag);
        const T* px = device_data<T>(x);
        T* po = device_data<T>(out);
        walk<3>(index.shape(), {index.strides(), out.strides(), with_zero_at(x.strides(), dim)}, [&](const auto& off) {
            po[off[1]] = px[off[2] + checked_index(idx[off[0]], size, "gather", dim) * step];
        });
    });
}

void CpuBackend::do_scatter_add(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
    const int64_t size = out.shape()[dim], step = out.strides()[dim];
    const int64_t* idx = device_data<int64_t>(index);
    dispatch_floating(out.dtype(), "scatter_add", [&](auto tag) {
        using T = decltype(tag);
        const T* ps = device_data<T>(src);
        T* po = device_data<T>(out);
        walk<3>(index.shape(), {index.strides(), src.strides(), with_zero_at(out.strides(), dim)},
                [&](const auto& off) {
                    po[off[2] + checked_index(idx[off[0]], size, "scatter_add", dim) * step] += ps[off[1]];
                });
    });
}

void CpuBackend::do_index_select(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) {
    const int64_t size = x.shape()[dim], step = x.strides()[dim];
    const int64_t* idx = device_data<int64_t>(index);
    dispatch_floating(x.dtype(), "index_select", [&](auto tag) {
        using T = decltype(tag);
        const T* px = device_data<T>(x);
        T* po = device_data<T>(out);
        walk<3>(out.shape(),
                {out.strides(), with_zero_at(x.strides(), dim), only_at(out.dim(), dim, index.strides()[0])},
                [&](const auto& off) {
                    po[off[0]] = px[off[1] + checked_index(idx[off[2]], size, "index_select", dim) * step];
                });
    });
}

void CpuBackend::do_index_add(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
    const int64_t size = out.shape()[dim], step = out.strides()[dim];
    const int64_t* idx = device_data<int64_t>(index);
    dispatch_floating(out.dtype(), "index_add", [&](auto tag) {
        using T = decltype(tag);
        const T* ps = device_data<T>(src);
        T* po = device_data<T>(out);
        walk<3>(src.shape(),
                {src.strides(), with_zero_at(out.strides(), dim), only_at(src.dim(), dim, index.strides()[0])},
                [&](const auto& off) {
                    po[off[1] + checked_index(idx[off[2]], size, "index_add", dim) * step] += ps[off[0]];
                });
    });
}

}  // namespace relgrad
