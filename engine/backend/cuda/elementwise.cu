// The CUDA backend's elementwise kernels (engine/ops/elementwise.cpp, and the copies of views.cpp):
// one thread per output element in a grid-stride loop, every operand read through its Layout
// (strided, broadcast with stride 0), so any view works without a copy.
#include <cstdint>
#include <type_traits>

#include "engine/backend/cuda/cuda_backend.hpp"
#include "engine/backend/kernel_errors.hpp"

namespace relgrad {
namespace RELGRAD_CUDA_NAMESPACE {

namespace {

template <class T>
__global__ void fill_kernel(T* out, Layout out_layout, int64_t n, T value) {
    RELGRAD_FOR_EACH_INDEX(i, n) out[offset_of(out_layout, i)] = value;
}

// dst = src converted to D; a float without an int64 value (NaN, +-inf, beyond +-2^63) is reported
template <class S, class D>
__global__ void copy_kernel(const S* src, Layout src_layout, D* dst, Layout dst_layout, int64_t n, ErrorReport error) {
    RELGRAD_FOR_EACH_INDEX(i, n) {
        const S v = src[offset_of(src_layout, i)];
        if constexpr (std::is_same_v<D, int64_t> && is_real_v<S>) {
            if (!has_int64_value(v)) {
                report(error, i, n, static_cast<double>(v));
                continue;
            }
        }
        if constexpr (std::is_same_v<D, bool>) {
            dst[offset_of(dst_layout, i)] = v != S(0);
        } else {
            dst[offset_of(dst_layout, i)] = static_cast<D>(v);
        }
    }
}

// f(x) for the UnaryOp op; a and b are the scalar parameters of pow_scalar, clamp and inside
template <class T>
__device__ T unary_value(UnaryOp op, T x, T a, T b) {
    const T one(1), zero(0);
    switch (op) {
        case UnaryOp::neg: return -x;
        case UnaryOp::exp: return exp(x);
        case UnaryOp::log: return log(x);
        case UnaryOp::sqrt: return sqrt(x);
        case UnaryOp::tanh: return tanh(x);
        case UnaryOp::sigmoid: return one / (one + exp(-x));
        case UnaryOp::relu: return x > zero ? x : zero;
        case UnaryOp::gelu: return gelu_formula<T>(x);
        case UnaryOp::relu_grad: return x > zero ? one : zero;
        case UnaryOp::gelu_grad: return gelu_grad_formula<T>(x);
        case UnaryOp::pow_scalar: return pow(x, a);
        case UnaryOp::clamp: return x < a ? a : (x > b ? b : x);
        case UnaryOp::inside: return x > a && x < b ? one : zero;
    }
    return x;
}

template <class T>
__global__ void unary_kernel(UnaryOp op, const T* x, Layout x_layout, T* out, Layout out_layout, int64_t n, T a, T b) {
    RELGRAD_FOR_EACH_INDEX(i, n) out[offset_of(out_layout, i)] = unary_value(op, x[offset_of(x_layout, i)], a, b);
}

template <class T>
__device__ T binary_value(BinaryOp op, T x, T y) {
    switch (op) {
        case BinaryOp::add: return x + y;
        case BinaryOp::sub: return x - y;
        case BinaryOp::mul: return x * y;
        case BinaryOp::div: return x / y;
        case BinaryOp::pow:
            if constexpr (std::is_floating_point_v<T>) {
                return pow(x, y);
            } else {
                return static_cast<T>(pow(static_cast<double>(x), static_cast<double>(y)));
            }
        case BinaryOp::equal: return x == y ? T(1) : T(0);
    }
    return x;
}

template <class T>
__global__ void binary_kernel(BinaryOp op, const T* a, Layout a_layout, const T* b, Layout b_layout, T* out,
                              Layout out_layout, int64_t n) {
    RELGRAD_FOR_EACH_INDEX(i, n) {
        out[offset_of(out_layout, i)] = binary_value(op, a[offset_of(a_layout, i)], b[offset_of(b_layout, i)]);
    }
}

template <class T, class C>
__global__ void where_kernel(const C* cond, Layout cond_layout, const T* a, Layout a_layout, const T* b,
                             Layout b_layout, T* out, Layout out_layout, int64_t n) {
    RELGRAD_FOR_EACH_INDEX(i, n) {
        out[offset_of(out_layout, i)] =
            cond[offset_of(cond_layout, i)] != C(0) ? a[offset_of(a_layout, i)] : b[offset_of(b_layout, i)];
    }
}

// one thread per Philox block: elements 4b .. 4b + 3 (random.hpp)
template <class T>
__global__ void dropout_kernel(const T* x, const T* residual, DropoutMask mask, T* out, int64_t n) {
    RELGRAD_FOR_EACH_INDEX(b, (n + 3) / 4) {
        T scales[4];
        mask.scales_of_block(static_cast<uint64_t>(b), scales);
        for (int64_t i = 4 * b; i < 4 * b + 4 && i < n; ++i) {
            // residual + x m / (1 - p) as one fused multiply-add, as the CPU's kernel does
            out[i] = residual ? fma(x[i], scales[i - 4 * b], residual[i]) : x[i] * scales[i - 4 * b];
        }
    }
}

// RoPE's rotation: one thread per pair; row r of x sits at position r % L
template <class T>
__global__ void rotate_pairs_kernel(const T* x, const T* cos, const T* sin, T* out, int64_t L, int64_t pairs,
                                    int64_t n) {
    RELGRAD_FOR_EACH_INDEX(e, n) {
        const int64_t row = e / pairs, t = e % pairs, angle = (row % L) * pairs + t;
        const T even = x[2 * e], odd = x[2 * e + 1];
        out[2 * e] = even * cos[angle] - odd * sin[angle];
        out[2 * e + 1] = even * sin[angle] + odd * cos[angle];
    }
}

}  // namespace

void CudaBackend::do_fill(Tensor& out, double value) {
    const int64_t n = out.numel();
    dispatch_any(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        Layout out_layout = layout_of(out, "fill");
        merge_dims({&out_layout});
        launch("fill", fill_kernel<T>, grid_for(n, kElementThreads), kElementThreads, 0, device_data<T>(out),
               out_layout, n, static_cast<T>(value));
    });
}

void CudaBackend::do_copy(const Tensor& src, Tensor& dst) {
    const int64_t n = dst.numel();
    // a float converted to int64 may have no int64 value: the kernel reports one
    const bool checked = dst.dtype() == DType::int64 && is_floating(src.dtype());
    const ErrorReport error = checked ? error_report("copy", BadInput::int64_value) : ErrorReport{nullptr, 0};
    Layout src_layout = layout_of(src, "copy"), dst_layout = layout_of(dst, "copy");
    merge_dims({&src_layout, &dst_layout});
    dispatch_any(dst.dtype(), [&](auto dst_tag) {
        using D = decltype(dst_tag);
        dispatch_any(src.dtype(), [&](auto src_tag) {
            using S = decltype(src_tag);
            launch("copy", copy_kernel<S, D>, grid_for(n, kElementThreads), kElementThreads, 0, device_data<S>(src),
                   src_layout, device_data<D>(dst), dst_layout, n, error);
        });
    });
}

void CudaBackend::do_unary(UnaryOp op, const Tensor& x, Tensor& out, double a, double b) {
    const int64_t n = out.numel();
    Layout x_layout = layout_of(x, out.shape(), "unary"), out_layout = layout_of(out, "unary");
    merge_dims({&x_layout, &out_layout});
    dispatch_floating(x.dtype(), "unary", [&](auto tag) {
        using T = decltype(tag);
        launch("unary", unary_kernel<T>, grid_for(n, kElementThreads), kElementThreads, 0, op, device_data<T>(x),
               x_layout, device_data<T>(out), out_layout, n, T(a), T(b));
    });
}

void CudaBackend::do_binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
    const int64_t n = out.numel();
    Layout a_layout = layout_of(a, out.shape(), "binary"), b_layout = layout_of(b, out.shape(), "binary"),
           out_layout = layout_of(out, "binary");
    merge_dims({&a_layout, &b_layout, &out_layout});
    dispatch_numeric(a.dtype(), "binary", [&](auto tag) {
        using T = decltype(tag);
        launch("binary", binary_kernel<T>, grid_for(n, kElementThreads), kElementThreads, 0, op, device_data<T>(a),
               a_layout, device_data<T>(b), b_layout, device_data<T>(out), out_layout, n);
    });
}

void CudaBackend::do_where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
    const int64_t n = out.numel();
    Layout cond_layout = layout_of(cond, out.shape(), "where"), a_layout = layout_of(a, out.shape(), "where"),
           b_layout = layout_of(b, out.shape(), "where"), out_layout = layout_of(out, "where");
    merge_dims({&cond_layout, &a_layout, &b_layout, &out_layout});
    dispatch_numeric(a.dtype(), "where", [&](auto tag) {
        using T = decltype(tag);
        dispatch_any(cond.dtype(), [&](auto cond_tag) {
            using C = decltype(cond_tag);
            launch("where", where_kernel<T, C>, grid_for(n, kElementThreads), kElementThreads, 0, device_data<C>(cond),
                   cond_layout, device_data<T>(a), a_layout, device_data<T>(b), b_layout, device_data<T>(out),
                   out_layout, n);
        });
    });
}

void CudaBackend::do_dropout(const Tensor& x, const Tensor& residual, const DropoutMask& mask, Tensor& out) {
    const int64_t n = out.numel();
    dispatch_floating(x.dtype(), "dropout", [&](auto tag) {
        using T = decltype(tag);
        launch("dropout", dropout_kernel<T>, grid_for((n + 3) / 4, kElementThreads), kElementThreads, 0,
               device_data<T>(x), device_data_or_null<T>(residual), mask, device_data<T>(out), n);
    });
}

void CudaBackend::do_rotate_pairs(const Tensor& x, const Tensor& cos, const Tensor& sin, Tensor& out) {
    const int64_t pairs = x.size(-1) / 2, n = x.numel() / 2;
    if (pairs == 0) return;
    dispatch_floating(x.dtype(), "rotate_pairs", [&](auto tag) {
        using T = decltype(tag);
        launch("rotate_pairs", rotate_pairs_kernel<T>, grid_for(n, kElementThreads), kElementThreads, 0,
               device_data<T>(x), device_data<T>(cos), device_data<T>(sin), device_data<T>(out), x.size(-2), pairs, n);
    });
}

}  // namespace RELGRAD_CUDA_NAMESPACE
}  // namespace relgrad
