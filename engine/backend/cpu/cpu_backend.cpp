// The CPU backend: elementwise kernels, broadcasting and reductions on xtensor expressions over
// the tensors' own strided memory (xt::adapt, no copies); matrix products through xtensor-blas's
// cxxblas layer into OpenBLAS; index kernels and softmax as plain loops.
#include <algorithm>
#include <array>
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
#include <xsimd/xsimd.hpp>

#include "engine/backend/backend.hpp"
#include "engine/backend/cpu/kernels.hpp"

#include <omp.h>

// OpenBLAS's thread control (its cblas.h cannot be included next to xtensor-blas)
extern "C" void openblas_set_num_threads(int threads);

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
        case DType::float32: f(float{}); return;
        case DType::float64: f(double{}); return;
        default:
            throw std::invalid_argument(std::string(kernel) + ": needs a float32 or float64 tensor, got " +
                                        dtype_name(dtype));
    }
}

// Calls f(T{}) for any dtype.
template <class F>
void dispatch_any(DType dtype, F&& f) {
    switch (dtype) {
        case DType::float32: f(float{}); return;
        case DType::float64: f(double{}); return;
        case DType::int64: f(int64_t{}); return;
        case DType::boolean: f(bool{}); return;
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

// Splits [0, n) into one contiguous chunk per thread (a single chunk when n is small, where
// threads would cost more than they save) and calls f(begin, end) for each. Chunks start at
// multiples of 64 elements, so a SIMD loop inside meets the same batches and the same scalar tail
// whatever the thread count: the results do not depend on it.
template <class F>
void in_chunks(int64_t n, F&& f) {
    constexpr int64_t align = 64;
    const int64_t threads = n >= (int64_t{1} << 15) ? omp_get_max_threads() : 1;
    auto boundary = [&](int64_t t) { return t == threads ? n : n * t / threads / align * align; };
#pragma omp parallel for schedule(static) if (threads > 1)
    for (int64_t t = 0; t < threads; ++t) f(boundary(t), boundary(t + 1));
}

// The common case of a binary op, done as plain loops the compiler vectorizes: a packed output,
// each operand packed with the output's shape, a packed suffix of it (a bias row) or a single
// element. Returns false when the operands are laid out otherwise (xtensor handles those).
template <class T, class F>
bool packed_binary(const Tensor& a, const Tensor& b, Tensor& out, F f) {
    if (!out.is_contiguous() || !a.is_contiguous() || !b.is_contiguous()) return false;
    const int64_t n = out.numel();
    auto period = [&](const Tensor& t) -> int64_t {  // t repeats every `period` output elements
        if (t.numel() == 1 || t.shape() == out.shape()) return t.numel();
        Shape trimmed = t.shape();
        while (!trimmed.empty() && trimmed.front() == 1) trimmed.erase(trimmed.begin());
        if (trimmed.size() > out.shape().size() ||
            !std::equal(trimmed.rbegin(), trimmed.rend(), out.shape().rbegin())) {
            return -1;
        }
        return t.numel();
    };
    const int64_t pa = period(a), pb = period(b);
    if (pa < 0 || pb < 0 || (pa != n && pb != n) || n == 0) return n == 0 && pa >= 0 && pb >= 0;
    const T* x = a.data<T>();
    const T* y = b.data<T>();
    T* o = out.data<T>();
    if (pa == n && pb == n) {
        in_chunks(n, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) o[i] = f(x[i], y[i]);
        });
    } else if (pb == 1) {
        const T c = y[0];
        in_chunks(n, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) o[i] = f(x[i], c);
        });
    } else if (pa == 1) {
        const T c = x[0];
        in_chunks(n, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) o[i] = f(c, y[i]);
        });
    } else if (pa == n) {  // b repeats every pb elements
        for (int64_t row = 0; row < n; row += pb)
            for (int64_t j = 0; j < pb; ++j) o[row + j] = f(x[row + j], y[j]);
    } else {
        for (int64_t row = 0; row < n; row += pa)
            for (int64_t j = 0; j < pa; ++j) o[row + j] = f(x[j], y[row + j]);
    }
    return true;
}

// The two common sums as plain loops: a packed x summed over its leading dims (the bias gradient:
// one sum per column) or over its trailing dims (one sum per row). float64 accumulators.
template <class T>
bool packed_sum(const Tensor& x, const std::vector<int64_t>& dims, Tensor& out) {
    if (!x.is_contiguous() || !out.is_contiguous() || x.numel() == 0) return false;
    const int64_t rank = x.dim(), count = static_cast<int64_t>(dims.size());
    const bool leading = dims.front() == 0 && dims.back() == count - 1;
    const bool trailing = dims.front() == rank - count && dims.back() == rank - 1;
    if (!leading && !trailing) return false;
    const int64_t reduced = shape_numel(Shape(x.shape().begin() + dims.front(), x.shape().begin() + dims.back() + 1));
    const int64_t kept = x.numel() / reduced;
    const T* in = x.data<T>();
    T* o = out.data<T>();
    if (trailing) {
#pragma omp parallel for schedule(static) if (x.numel() > (1 << 16))
        for (int64_t i = 0; i < kept; ++i) {
            double total = 0;
            for (int64_t j = 0; j < reduced; ++j) total += in[i * reduced + j];
            o[i] = static_cast<T>(total);
        }
    } else {
        std::vector<double> totals(kept, 0.0);
        for (int64_t i = 0; i < reduced; ++i)
            for (int64_t j = 0; j < kept; ++j) totals[j] += in[i * kept + j];
        for (int64_t j = 0; j < kept; ++j) o[j] = static_cast<T>(totals[j]);
    }
    return true;
}

// Row n = (b, h, i) of a contiguous [B, H, Lq, Lk] tensor, with where that row's mask entries
// start (read with a step, as the mask is an expanded view), and the row's relative index as runs:
// r(i, j) takes one value over each run of consecutive j (for Shaw's clipped index: one run left
// of the clipping window, 2k - 1 single keys, one run right of it). A run is [begin, end) with its
// bucket; without an index a row is one run of bucket -1. Over a run the relative terms are
// constants, so the row kernels below stay contiguous SIMD loops.
struct AttentionRows {
    AttentionRows(const Tensor& scores, const Tensor& index, const Tensor& mask)
        : H(scores.size(1)),
          Lq(scores.size(2)),
          Lk(scores.size(3)),
          count(scores.size(0) * H * Lq),  // also when Lk = 0: each row still zeroes its bucket sums
          mask_(mask) {
        if (mask.defined()) mask_step = mask.strides()[3];
        first_run_.assign(Lq + 1, 0);
        for (int64_t i = 0; i < Lq; ++i) {
            first_run_[i] = static_cast<int64_t>(runs_.size());
            if (!index.defined()) {
                runs_.push_back({0, Lk, -1});
                continue;
            }
            const int64_t* r = index.data<int64_t>() + i * index.strides()[0];
            const int64_t step = index.strides()[1];
            for (int64_t j = 0; j < Lk; ++j) {
                if (j == 0 || r[j * step] != runs_.back().bucket) runs_.push_back({j, j, r[j * step]});
                runs_.back().end = j + 1;
            }
        }
        first_run_[Lq] = static_cast<int64_t>(runs_.size());
    }
    struct Run {
        int64_t begin, end, bucket;
    };
    const Run* runs_begin(int64_t n) const { return runs_.data() + first_run_[n % Lq]; }
    const Run* runs_end(int64_t n) const { return runs_.data() + first_run_[n % Lq + 1]; }
    const bool* mask_row(int64_t n) const {
        if (!mask_.defined()) return nullptr;
        const int64_t b = n / (H * Lq), h = (n / Lq) % H, i = n % Lq;
        const Shape& st = mask_.strides();
        return mask_.data<bool>() + b * st[0] + h * st[1] + i * st[2];
    }
    int64_t H, Lq, Lk, count;
    int64_t mask_step = 0;

private:
    Tensor mask_;
    std::vector<Run> runs_;
    std::vector<int64_t> first_run_;  // row i's runs are runs_[first_run_[i] .. first_run_[i + 1])
};

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
        if (src.dtype() == dst.dtype() && is_floating(src.dtype()) && dst.dim() > 0) {
            // same type, any strides (a transpose made contiguous, a slice filled): row by row
            dispatch_floating(src.dtype(), "copy", [&](auto tag) {
                using T = decltype(tag);
                const Shape outer(dst.shape().begin(), dst.shape().end() - 1);
                const int64_t inner = dst.shape().back(), step = src.strides().back(), dst_step = dst.strides().back();
                const T* from = src.data<T>();
                T* to = dst.data<T>();
                walk<2>(outer,
                        {Shape(src.strides().begin(), src.strides().end() - 1),
                         Shape(dst.strides().begin(), dst.strides().end() - 1)},
                        [&](const auto& off) {
                            for (int64_t j = 0; j < inner; ++j) to[off[1] + j * dst_step] = from[off[0] + j * step];
                        });
            });
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
            const T one(1), zero(0), half(0.5);
            const T inv_sqrt2 = T(1.0 / std::sqrt(2.0));
            const T inv_sqrt_2pi = T(1.0 / std::sqrt(2.0 * M_PI));
            // O = f(X) for any xtensor views X and O of one shape
            auto apply = [&](auto& O, const auto& X) {
                switch (op) {
                    case UnaryOp::neg: xt::noalias(O) = -X; break;
                    case UnaryOp::exp: xt::noalias(O) = xt::exp(X); break;
                    case UnaryOp::log: xt::noalias(O) = xt::log(X); break;
                    case UnaryOp::sqrt: xt::noalias(O) = xt::sqrt(X); break;
                    case UnaryOp::tanh: xt::noalias(O) = xt::tanh(X); break;
                    case UnaryOp::sigmoid: xt::noalias(O) = one / (one + xt::exp(-X)); break;
                    case UnaryOp::relu: xt::noalias(O) = xt::where(X > zero, X, zero); break;
                    case UnaryOp::gelu: xt::noalias(O) = half * X * (one + xt::erf(X * inv_sqrt2)); break;
                    case UnaryOp::relu_grad: xt::noalias(O) = xt::where(X > zero, one, zero); break;
                    case UnaryOp::gelu_grad:
                        xt::noalias(O) =
                            half * (one + xt::erf(X * inv_sqrt2)) + X * inv_sqrt_2pi * xt::exp(-half * X * X);
                        break;
                    case UnaryOp::pow_scalar: xt::noalias(O) = xt::pow(X, T(a)); break;
                    case UnaryOp::clamp: xt::noalias(O) = xt::clip(X, T(a), T(b)); break;
                    case UnaryOp::inside: xt::noalias(O) = xt::where(X > T(a) && X < T(b), one, zero); break;
                }
            };
            if (x.is_contiguous() && out.is_contiguous() && x.shape() == out.shape()) {
                // packed: flat chunks, one per thread, each a plain 1-d SIMD loop in xtensor
                const T* in = x.data<T>();
                T* o = out.data<T>();
                in_chunks(out.numel(), [&](int64_t begin, int64_t end) {
                    const std::size_t n = static_cast<std::size_t>(end - begin);
                    auto X = xt::adapt(in + begin, n, xt::no_ownership(), std::array<std::size_t, 1>{n});
                    auto O = xt::adapt(o + begin, n, xt::no_ownership(), std::array<std::size_t, 1>{n});
                    apply(O, X);
                });
                return;
            }
            auto X = input<T>(x, out);
            auto O = strided<T>(out);
            apply(O, X);
        });
    }

    void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) override {
        dispatch_floating(a.dtype(), "binary", [&](auto tag) {
            using T = decltype(tag);
            bool done = false;
            switch (op) {
                case BinaryOp::add: done = packed_binary<T>(a, b, out, [](T x, T y) { return x + y; }); break;
                case BinaryOp::sub: done = packed_binary<T>(a, b, out, [](T x, T y) { return x - y; }); break;
                case BinaryOp::mul: done = packed_binary<T>(a, b, out, [](T x, T y) { return x * y; }); break;
                case BinaryOp::div: done = packed_binary<T>(a, b, out, [](T x, T y) { return x / y; }); break;
                default: break;
            }
            if (done) return;
            auto A = input<T>(a, out);
            auto B = input<T>(b, out);
            auto O = strided<T>(out);
            switch (op) {
                case BinaryOp::add: xt::noalias(O) = A + B; break;
                case BinaryOp::sub: xt::noalias(O) = A - B; break;
                case BinaryOp::mul: xt::noalias(O) = A * B; break;
                case BinaryOp::div: xt::noalias(O) = A / B; break;
                case BinaryOp::pow: xt::noalias(O) = xt::pow(A, B); break;
                case BinaryOp::equal: xt::noalias(O) = xt::cast<T>(xt::equal(A, B)); break;
            }
        });
    }

    void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) override {
        dispatch_floating(a.dtype(), "where", [&](auto tag) {
            using T = decltype(tag);
            dispatch_any(cond.dtype(), [&](auto cond_tag) {
                using C = decltype(cond_tag);
                // packed: cond of out's shape, a and b each of out's shape or a single value
                auto fits = [&](const Tensor& t) {
                    return t.is_contiguous() && (t.shape() == out.shape() || t.numel() == 1);
                };
                if (out.is_contiguous() && cond.is_contiguous() && cond.shape() == out.shape() && fits(a) && fits(b)) {
                    const C* c = cond.data<C>();
                    const T* pa = a.data<T>();
                    const T* pb = b.data<T>();
                    const int64_t step_a = a.numel() == 1 ? 0 : 1, step_b = b.numel() == 1 ? 0 : 1;
                    T* o = out.data<T>();
                    in_chunks(out.numel(), [&](int64_t begin, int64_t end) {
                        for (int64_t i = begin; i < end; ++i) o[i] = c[i] != C(0) ? pa[i * step_a] : pb[i * step_b];
                    });
                    return;
                }
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
            if (op == ReduceOp::sum && packed_sum<T>(x, dims, out)) return;
            const std::vector<std::size_t> axes(dims.begin(), dims.end());
            auto X = input<T>(x, x);
            auto O = strided<T>(out);
            if (op == ReduceOp::sum) {
                // float32 sums accumulate in float64: adding 2^25 ones one by one in float32 stops at 2^24
                xt::noalias(O) = xt::cast<T>(xt::sum(xt::cast<double>(X), axes, xt::keep_dims));
            } else {
                // xt::amax skips NaN; relgrad's max, like PyTorch's, is NaN when any element is
                const auto nan_count = xt::eval(xt::sum(xt::cast<int64_t>(xt::isnan(X)), axes, xt::keep_dims));
                xt::noalias(O) =
                    xt::where(nan_count > 0, std::numeric_limits<T>::quiet_NaN(), xt::amax(X, axes, xt::keep_dims));
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
            // the offsets of every batch entry, then one gemm each
            std::vector<std::array<int64_t, 3>> offsets;
            walk<3>(batch_shape, {a_batch_strides, b_batch_strides, out_batch_strides},
                    [&](const auto& off) { offsets.push_back(off); });
            // rows [m0, m1) and columns [n0, n1) of one product; row m of op(A) starts m * leading_dim
            // in (m when A is read transposed), column n of op(B) n in (n * leading_dim transposed)
            auto gemm = [&](const std::array<int64_t, 3>& off, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
                if (m1 <= m0 || n1 <= n0) return;
                const int64_t a_row = m0 * (la.transposed ? 1 : la.leading_dim);
                const int64_t b_column = n0 * (lb.transposed ? lb.leading_dim : 1);
                cxxblas::gemm<blas_index_t>(cxxblas::StorageOrder::RowMajor,
                                            la.transposed ? cxxblas::Transpose::Trans : cxxblas::Transpose::NoTrans,
                                            lb.transposed ? cxxblas::Transpose::Trans : cxxblas::Transpose::NoTrans,
                                            blas_index_t(m1 - m0), blas_index_t(n1 - n0), blas_index_t(K), T(1),
                                            pa + off[0] + a_row, blas_index_t(la.leading_dim), pb + off[1] + b_column,
                                            blas_index_t(lb.leading_dim), T(0), pc + off[2] + m0 * N + n0,
                                            blas_index_t(N));
            };
            // Threads are relgrad's (OpenMP), OpenBLAS runs single-threaded inside them: two thread
            // pools on two cores would only fight. The work is cut into the same pieces whatever the
            // thread count and the pieces are shared out: OpenBLAS picks its kernels by the sizes it
            // is given, so cutting by the thread count would make the results depend on it. A batch
            // of 8 products or more (attention's, one per head) is cut into the products alone;
            // fewer products into blocks of rows, about an eighth of them and at least 128 (each
            // block packs all of op(B) again, so blocks are big); a product too short for that but
            // wide (N >= 256, e.g. an output layer while decoding) into blocks of columns alike.
            const int64_t count = static_cast<int64_t>(offsets.size());
            auto eighth = [](int64_t n) { return std::max<int64_t>(128, (n + 8 * 64 - 1) / (8 * 64) * 64); };
            const int64_t block_rows = count >= 8 ? M : eighth(M);
            const int64_t row_blocks = (M + block_rows - 1) / block_rows;
            const int64_t block_columns = count < 8 && row_blocks == 1 && N >= 256 ? eighth(N) : N;
            const int64_t column_blocks = (N + block_columns - 1) / block_columns;
            const int64_t blocks = row_blocks * column_blocks;
            openblas_set_num_threads(1);
            const int64_t pieces = count * blocks;
#pragma omp parallel for schedule(static) if (pieces > 1)
            for (int64_t piece = 0; piece < pieces; ++piece) {
                const int64_t row_block = piece % blocks / column_blocks, column_block = piece % column_blocks;
                gemm(offsets[piece / blocks], row_block * block_rows, std::min(M, (row_block + 1) * block_rows),
                     column_block * block_columns, std::min(N, (column_block + 1) * block_columns));
            }
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

    // ---------------------------------------------------------------- attention rows

    void attention_softmax(Tensor& scores, const Tensor& bucket_scores, const Tensor& index, const Tensor& mask,
                           double scale, Tensor& bucket_weights) override {
        dispatch_floating(scores.dtype(), "attention_softmax", [&](auto tag) {
            using T = decltype(tag);
            const AttentionRows rows(scores, index, mask);
            const int64_t K = bucket_scores.defined() ? bucket_scores.size(-1) : 0;
            T* s_all = scores.data<T>();
            const T* buckets_all = bucket_scores.defined() ? bucket_scores.data<T>() : nullptr;
            T* weights_all = bucket_weights.defined() ? bucket_weights.data<T>() : nullptr;
            const T neg_inf = -std::numeric_limits<T>::infinity();
#pragma omp parallel for schedule(static)
            for (int64_t n = 0; n < rows.count; ++n) {
                T* s = s_all + n * rows.Lk;
                const T* buckets = buckets_all ? buckets_all + n * K : nullptr;
                T* weights = weights_all ? weights_all + n * K : nullptr;
                // s = scale (s + bucket_scores[r]), run by run; masked keys become -inf
                T m = neg_inf;
                for (const auto* run = rows.runs_begin(n); run != rows.runs_end(n); ++run) {
                    const T bias = buckets ? buckets[run->bucket] : T(0);
                    m = cpu::shift_scale_max(s + run->begin, run->end - run->begin, bias, T(scale), m);
                }
                if (const bool* keep = rows.mask_row(n)) {
                    m = neg_inf;
                    for (int64_t j = 0; j < rows.Lk; ++j) {
                        if (!keep[j * rows.mask_step]) s[j] = neg_inf;
                        m = std::max(m, s[j]);
                    }
                }
                if (weights) std::fill(weights, weights + K, T(0));
                if (m == neg_inf) {  // no visible key: zero weights
                    std::fill(s, s + rows.Lk, T(0));
                    continue;
                }
                const T inverse = T(1) / cpu::exp_sum(s, rows.Lk, m);
                // a = e / sum(e), and W[r] = the sum of a over r's run
                for (const auto* run = rows.runs_begin(n); run != rows.runs_end(n); ++run) {
                    const T run_sum = cpu::scale_sum(s + run->begin, run->end - run->begin, inverse);
                    if (weights) weights[run->bucket] += run_sum;
                }
            }
        });
    }

    void attention_softmax_backward(Tensor& grad, const Tensor& weights, const Tensor& d_buckets, const Tensor& index,
                                    double scale, Tensor& d_bucket_scores) override {
        dispatch_floating(grad.dtype(), "attention_softmax_backward", [&](auto tag) {
            using T = decltype(tag);
            const AttentionRows rows(grad, index, Tensor());
            const int64_t K = d_buckets.defined() ? d_buckets.size(-1) : 0;
            T* g_all = grad.data<T>();
            const T* a_all = weights.data<T>();
            const T* db_all = d_buckets.defined() ? d_buckets.data<T>() : nullptr;
            T* d_scores_all = d_bucket_scores.defined() ? d_bucket_scores.data<T>() : nullptr;
#pragma omp parallel for schedule(static)
            for (int64_t n = 0; n < rows.count; ++n) {
                T* g = g_all + n * rows.Lk;
                const T* a = a_all + n * rows.Lk;
                const T* db = db_all ? db_all + n * K : nullptr;
                T* d_scores = d_scores_all ? d_scores_all + n * K : nullptr;
                // da = g + d_buckets[r], and dot = sum_j da_j a_j
                T dot(0);
                for (const auto* run = rows.runs_begin(n); run != rows.runs_end(n); ++run) {
                    const T shift = db ? db[run->bucket] : T(0);
                    dot += cpu::shift_dot(g + run->begin, a + run->begin, run->end - run->begin, shift);
                }
                // ds = scale a (da - dot), and dQE[r] = the sum of ds over r's run
                if (d_scores) std::fill(d_scores, d_scores + K, T(0));
                for (const auto* run = rows.runs_begin(n); run != rows.runs_end(n); ++run) {
                    const T run_sum =
                        cpu::softmax_grad_sum(g + run->begin, a + run->begin, run->end - run->begin, dot, T(scale));
                    if (d_scores) d_scores[run->bucket] += run_sum;
                }
            }
        });
    }

    void fused_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionPattern& pattern,
                         double scale, const ClippedRelativeTerms& relative, Tensor& z, Tensor& lse) override {
        openblas_set_num_threads(1);
        cpu::fused_attention_forward(q, k, v, pattern, scale, relative, z, lse);
    }

    void fused_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& z, const Tensor& lse,
                                  const Tensor& dz, const AttentionPattern& pattern, double scale,
                                  const ClippedRelativeTerms& relative, Tensor& dq, Tensor& dk, Tensor& dv,
                                  Tensor& d_table_k, Tensor& d_table_v) override {
        openblas_set_num_threads(1);
        cpu::fused_attention_backward(q, k, v, z, lse, dz, pattern, scale, relative, dq, dk, dv, d_table_k, d_table_v);
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
