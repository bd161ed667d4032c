// The CPU backend: elementwise kernels, broadcasting and reductions on xtensor expressions over
// the tensors' own strided memory (xt::adapt, no copies); matrix products through xtensor-blas's
// cxxblas layer into OpenBLAS; index kernels and softmax as plain loops.
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include <xtensor/xadapt.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xnoalias.hpp>
#include <xtensor/xoperation.hpp>
#include <xtensor/xreducer.hpp>
#include <xtensor-blas/xblas.hpp>

#include "engine/backend/backend.hpp"

namespace relgrad {
namespace {

// ---------------------------------------------------------------- helpers

// An xtensor view of t's elements in place. xtensor wants the adapted buffer to hold exactly
// prod(shape) elements, so a dim that expand() stretched (stride 0) is handed over as size 1 and
// broadcast back by xtensor (see `input`); the elements themselves are reached through strides.
template <class T>
auto strided(const Tensor& t) {
    const int64_t rank = t.dim();
    std::vector<std::size_t> shape(rank);
    std::vector<std::ptrdiff_t> strides(rank);
    std::size_t size = 1;
    for (int64_t d = 0; d < rank; ++d) {
        const bool stretched = t.strides()[d] == 0 || t.shape()[d] == 1;
        shape[d] = stretched && t.shape()[d] > 0 ? 1 : static_cast<std::size_t>(t.shape()[d]);
        strides[d] = stretched ? 0 : t.strides()[d];
        size *= shape[d];
    }
    return xt::adapt(t.data<T>(), size, xt::no_ownership(), shape, strides);
}

// An input operand, broadcast to the output's shape.
template <class T>
auto input(const Tensor& t, const Tensor& out) {
    const std::vector<std::size_t> shape(out.shape().begin(), out.shape().end());
    return xt::broadcast(strided<T>(t), shape);
}

// Calls f(T{}) with T the C++ type of a floating dtype.
template <class F>
void dispatch_floating(DType dtype, const char* kernel, F&& f) {
    switch (dtype) {
        case DType::float32:
            f(float{});
            return;
        case DType::float64:
            f(double{});
            return;
        default:
            throw std::invalid_argument(std::string(kernel) + ": needs a float32 or float64 tensor, got " +
                                        dtype_name(dtype));
    }
}

// Calls f(T{}) for any dtype.
template <class F>
void dispatch_any(DType dtype, F&& f) {
    switch (dtype) {
        case DType::float32:
            f(float{});
            return;
        case DType::float64:
            f(double{});
            return;
        case DType::int64:
            f(int64_t{});
            return;
        case DType::boolean:
            f(bool{});
            return;
    }
}

// Visits every multi-index of `shape` in C order and calls fn(offsets), where offsets[k] is the
// element offset of that multi-index under strides[k]. Used by the index kernels.
template <std::size_t N, class F>
void walk(const Shape& shape, const std::array<Shape, N>& strides, F&& fn) {
    const int64_t total = shape_numel(shape);
    const int64_t rank = static_cast<int64_t>(shape.size());
    std::vector<int64_t> counter(rank, 0);
    std::array<int64_t, N> offsets{};
    for (int64_t n = 0; n < total; ++n) {
        fn(offsets);
        for (int64_t d = rank - 1; d >= 0; --d) {
            if (++counter[d] < shape[d]) {
                for (std::size_t k = 0; k < N; ++k) offsets[k] += strides[k][d];
                break;
            }
            for (std::size_t k = 0; k < N; ++k) offsets[k] -= strides[k][d] * (shape[d] - 1);
            counter[d] = 0;
        }
    }
}

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
    if (i < 0 || i >= size) {
        throw std::invalid_argument(std::string(kernel) + ": index " + std::to_string(i) + " is out of range for dim " +
                                    std::to_string(dim) + " of size " + std::to_string(size));
    }
    return i;
}

// How BLAS can read a rows x cols matrix stored with (row_stride, col_stride): row-major as it is,
// or as the transpose of a row-major matrix; `ok` is false when neither works (e.g. stride 0).
struct BlasOperand {
    bool ok;
    bool transposed;
    int64_t leading_dim;
};

BlasOperand blas_operand(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
    if ((cols == 1 || col_stride == 1) && (rows == 1 || row_stride >= std::max<int64_t>(cols, 1))) {
        return {true, false, rows == 1 ? std::max<int64_t>(cols, 1) : row_stride};
    }
    if ((rows == 1 || row_stride == 1) && (cols == 1 || col_stride >= std::max<int64_t>(rows, 1))) {
        return {true, true, cols == 1 ? std::max<int64_t>(rows, 1) : col_stride};
    }
    return {false, false, 0};
}

// ---------------------------------------------------------------- the backend

class CpuBackend final : public Backend {
public:
    const char* name() const override { return "cpu"; }

    void fill(Tensor& out, double value) override {
        dispatch_any(out.dtype(), [&](auto tag) {
            using T = decltype(tag);
            auto o = strided<T>(out);
            o.fill(static_cast<T>(value));
        });
    }

    void copy(const Tensor& src, Tensor& dst) override {
        if (src.shape() != dst.shape()) {
            throw std::invalid_argument("copy: source shape " + shape_str(src.shape()) +
                                        " differs from destination shape " + shape_str(dst.shape()));
        }
        if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
            std::memcpy(static_cast<char*>(dst.storage()->data()) + dst.offset() * dtype_size(dst.dtype()),
                        static_cast<const char*>(src.storage()->data()) + src.offset() * dtype_size(src.dtype()),
                        src.numel() * dtype_size(src.dtype()));
            return;
        }
        dispatch_any(dst.dtype(), [&](auto dst_tag) {
            using D = decltype(dst_tag);
            dispatch_any(src.dtype(), [&](auto src_tag) {
                using S = decltype(src_tag);
                auto d = strided<D>(dst);
                xt::noalias(d) = xt::cast<D>(input<S>(src, dst));
            });
        });
    }

    void unary(UnaryOp op, const Tensor& x, Tensor& out, double a, double b) override {
        dispatch_floating(x.dtype(), "unary", [&](auto tag) {
            using T = decltype(tag);
            auto X = input<T>(x, out);
            auto O = strided<T>(out);
            const T one(1), zero(0), half(0.5);
            const T inv_sqrt2 = T(1.0 / std::sqrt(2.0));
            const T inv_sqrt_2pi = T(1.0 / std::sqrt(2.0 * M_PI));
            switch (op) {
                case UnaryOp::neg:
                    xt::noalias(O) = -X;
                    break;
                case UnaryOp::exp:
                    xt::noalias(O) = xt::exp(X);
                    break;
                case UnaryOp::log:
                    xt::noalias(O) = xt::log(X);
                    break;
                case UnaryOp::sqrt:
                    xt::noalias(O) = xt::sqrt(X);
                    break;
                case UnaryOp::tanh:
                    xt::noalias(O) = xt::tanh(X);
                    break;
                case UnaryOp::sigmoid:
                    xt::noalias(O) = one / (one + xt::exp(-X));
                    break;
                case UnaryOp::relu:
                    xt::noalias(O) = xt::where(X > zero, X, zero);
                    break;
                case UnaryOp::gelu:
                    xt::noalias(O) = half * X * (one + xt::erf(X * inv_sqrt2));
                    break;
                case UnaryOp::relu_grad:
                    xt::noalias(O) = xt::where(X > zero, one, zero);
                    break;
                case UnaryOp::gelu_grad:
                    xt::noalias(O) = half * (one + xt::erf(X * inv_sqrt2)) + X * inv_sqrt_2pi * xt::exp(-half * X * X);
                    break;
                case UnaryOp::pow_scalar:
                    xt::noalias(O) = xt::pow(X, T(a));
                    break;
                case UnaryOp::clamp:
                    xt::noalias(O) = xt::clip(X, T(a), T(b));
                    break;
                case UnaryOp::inside:
                    xt::noalias(O) = xt::where(X > T(a) && X < T(b), one, zero);
                    break;
            }
        });
    }

    void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) override {
        dispatch_floating(a.dtype(), "binary", [&](auto tag) {
            using T = decltype(tag);
            auto A = input<T>(a, out);
            auto B = input<T>(b, out);
            auto O = strided<T>(out);
            switch (op) {
                case BinaryOp::add:
                    xt::noalias(O) = A + B;
                    break;
                case BinaryOp::sub:
                    xt::noalias(O) = A - B;
                    break;
                case BinaryOp::mul:
                    xt::noalias(O) = A * B;
                    break;
                case BinaryOp::div:
                    xt::noalias(O) = A / B;
                    break;
                case BinaryOp::pow:
                    xt::noalias(O) = xt::pow(A, B);
                    break;
                case BinaryOp::equal:
                    xt::noalias(O) = xt::cast<T>(xt::equal(A, B));
                    break;
            }
        });
    }

    void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) override {
        dispatch_floating(a.dtype(), "where", [&](auto tag) {
            using T = decltype(tag);
            dispatch_any(cond.dtype(), [&](auto cond_tag) {
                using C = decltype(cond_tag);
                auto O = strided<T>(out);
                xt::noalias(O) =
                    xt::where(xt::not_equal(input<C>(cond, out), C(0)), input<T>(a, out), input<T>(b, out));
            });
        });
    }

    void reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, Tensor& out) override {
        if (dims.empty()) {
            copy(x, out);
            return;
        }
        dispatch_floating(x.dtype(), "reduce", [&](auto tag) {
            using T = decltype(tag);
            const std::vector<std::size_t> axes(dims.begin(), dims.end());
            auto X = input<T>(x, x);
            auto O = strided<T>(out);
            if (op == ReduceOp::sum) {
                // float32 sums accumulate in float64: adding 2^25 ones one by one in float32 stops at 2^24
                xt::noalias(O) = xt::cast<T>(xt::sum(xt::cast<double>(X), axes, xt::keep_dims));
            } else {
                // xt::amax skips NaN; relgrad's max, like PyTorch's, is NaN when any element is
                const auto nan_count = xt::eval(xt::sum(xt::cast<int64_t>(xt::isnan(X)), axes, xt::keep_dims));
                xt::noalias(O) = xt::where(nan_count > 0, std::numeric_limits<T>::quiet_NaN(),
                                           xt::amax(X, axes, xt::keep_dims));
            }
        });
    }

    void batched_gemm(const Tensor& a_in, const Tensor& b_in, Tensor& out) override {
        const int64_t rank = a_in.dim();
        const int64_t M = a_in.shape()[rank - 2], K = a_in.shape()[rank - 1];
        const int64_t N = b_in.shape()[rank - 1];
        if (M == 0 || N == 0) return;
        if (K == 0) {
            fill(out, 0.0);
            return;
        }
        // Operands BLAS cannot read in place (e.g. an expanded matrix) are packed first.
        auto readable = [&](const Tensor& t, int64_t rows, int64_t cols) {
            const BlasOperand layout = blas_operand(rows, cols, t.strides()[rank - 2], t.strides()[rank - 1]);
            if (layout.ok) return t;
            Tensor packed = empty(t.shape(), t.dtype());
            copy(t, packed);
            return packed;
        };
        const Tensor a = readable(a_in, M, K);
        const Tensor b = readable(b_in, K, N);
        const BlasOperand la = blas_operand(M, K, a.strides()[rank - 2], a.strides()[rank - 1]);
        const BlasOperand lb = blas_operand(K, N, b.strides()[rank - 2], b.strides()[rank - 1]);

        const Shape batch_shape(a.shape().begin(), a.shape().end() - 2);
        const Shape a_batch_strides(a.strides().begin(), a.strides().end() - 2);
        const Shape b_batch_strides(b.strides().begin(), b.strides().end() - 2);
        const Shape out_batch_strides(out.strides().begin(), out.strides().end() - 2);
        using xt::blas_index_t;
        dispatch_floating(a.dtype(), "matmul", [&](auto tag) {
            using T = decltype(tag);
            const T* pa = a.data<T>();
            const T* pb = b.data<T>();
            T* pc = out.data<T>();
            walk<3>(batch_shape, {a_batch_strides, b_batch_strides, out_batch_strides}, [&](const auto& off) {
                cxxblas::gemm<blas_index_t>(cxxblas::StorageOrder::RowMajor,
                                            la.transposed ? cxxblas::Transpose::Trans : cxxblas::Transpose::NoTrans,
                                            lb.transposed ? cxxblas::Transpose::Trans : cxxblas::Transpose::NoTrans,
                                            blas_index_t(M), blas_index_t(N), blas_index_t(K), T(1), pa + off[0],
                                            blas_index_t(la.leading_dim), pb + off[1], blas_index_t(lb.leading_dim),
                                            T(0), pc + off[2], blas_index_t(N));
            });
        });
    }

    void gather(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) override {
        const int64_t size = x.shape()[dim], step = x.strides()[dim];
        const int64_t* idx = index.data<int64_t>();
        dispatch_floating(x.dtype(), "gather", [&](auto tag) {
            using T = decltype(tag);
            const T* px = x.data<T>();
            T* po = out.data<T>();
            walk<3>(index.shape(), {index.strides(), out.strides(), with_zero_at(x.strides(), dim)},
                    [&](const auto& off) {
                        po[off[1]] = px[off[2] + checked_index(idx[off[0]], size, "gather", dim) * step];
                    });
        });
    }

    void scatter_add(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) override {
        const int64_t size = out.shape()[dim], step = out.strides()[dim];
        const int64_t* idx = index.data<int64_t>();
        dispatch_floating(out.dtype(), "scatter_add", [&](auto tag) {
            using T = decltype(tag);
            const T* ps = src.data<T>();
            T* po = out.data<T>();
            walk<3>(index.shape(), {index.strides(), src.strides(), with_zero_at(out.strides(), dim)},
                    [&](const auto& off) {
                        po[off[2] + checked_index(idx[off[0]], size, "scatter_add", dim) * step] += ps[off[1]];
                    });
        });
    }

    void index_select(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) override {
        const int64_t size = x.shape()[dim], step = x.strides()[dim];
        const int64_t* idx = index.data<int64_t>();
        dispatch_floating(x.dtype(), "index_select", [&](auto tag) {
            using T = decltype(tag);
            const T* px = x.data<T>();
            T* po = out.data<T>();
            walk<3>(out.shape(),
                    {out.strides(), with_zero_at(x.strides(), dim), only_at(out.dim(), dim, index.strides()[0])},
                    [&](const auto& off) {
                        po[off[0]] = px[off[1] + checked_index(idx[off[2]], size, "index_select", dim) * step];
                    });
        });
    }

    void index_add(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) override {
        const int64_t size = out.shape()[dim], step = out.strides()[dim];
        const int64_t* idx = index.data<int64_t>();
        dispatch_floating(out.dtype(), "index_add", [&](auto tag) {
            using T = decltype(tag);
            const T* ps = src.data<T>();
            T* po = out.data<T>();
            walk<3>(src.shape(),
                    {src.strides(), with_zero_at(out.strides(), dim), only_at(src.dim(), dim, index.strides()[0])},
                    [&](const auto& off) {
                        po[off[1] + checked_index(idx[off[2]], size, "index_add", dim) * step] += ps[off[0]];
                    });
        });
    }

    void softmax_last_dim(const Tensor& x, bool log, Tensor& out) override {
        const int64_t C = x.dim() == 0 ? 1 : x.shape().back();
        if (C == 0) return;
        const int64_t rows = x.numel() / C;
        dispatch_floating(x.dtype(), "softmax", [&](auto tag) {
            using T = decltype(tag);
            const T* px = x.data<T>();
            T* po = out.data<T>();
            const T neg_inf = -std::numeric_limits<T>::infinity();
            for (int64_t r = 0; r < rows; ++r) {
                const T* row = px + r * C;
                T* dst = po + r * C;
                T m = neg_inf;
                for (int64_t j = 0; j < C; ++j) m = std::max(m, row[j]);
                if (m == neg_inf) {  // every entry masked: no probability mass anywhere
                    std::fill(dst, dst + C, log ? neg_inf : T(0));
                    continue;
                }
                T total(0);
                for (int64_t j = 0; j < C; ++j) total += std::exp(row[j] - m);
                const T log_total = std::log(total);
                for (int64_t j = 0; j < C; ++j) {
                    dst[j] = log ? row[j] - m - log_total : std::exp(row[j] - m) / total;
                }
            }
        });
    }
};

}  // namespace

Backend& cpu_backend() {
    static CpuBackend backend;
    return backend;
}

Backend& backend_for(Device device) {
    if (device == Device::cpu) return cpu_backend();
    throw std::invalid_argument("no backend is built for the cuda device in this build");
}

}  // namespace relgrad
