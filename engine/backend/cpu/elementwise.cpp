// The CPU's elementwise kernels (engine/ops/elementwise.cpp, and the copies of views.cpp): xtensor
// expressions over the tensors' own strided memory (xt::adapt, no copies), and plain loops the
// compiler vectorizes for the packed common cases.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include <xtensor/xeval.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xnoalias.hpp>
#include <xtensor/xoperation.hpp>

#include "engine/backend/cpu/cpu_backend.hpp"
#include "engine/backend/cpu/strided_loops.hpp"
#include "engine/backend/kernel_checks.hpp"
#include "engine/check.hpp"

namespace relgrad {

using namespace cpu;

namespace {

// How a packed operand of a binary op lines up with the packed output's n elements, for the
// layouts a training step uses: the output's own shape (full), a single element (scalar), a
// packed suffix of the output's shape repeated (a bias row: element i uses t[i % width]), or a
// packed prefix with trailing 1s (a per-row scalar, as a mean over the last dim: element i uses
// t[i / width]).
enum class Layout { full, scalar, suffix, prefix, other };
struct Lined {
    Layout layout;
    int64_t width;  // suffix: the period; prefix: the output elements each element of t covers
};

Lined line_up(const Tensor& t, const Tensor& out) {
    const int64_t n = out.numel();
    if (!t.is_contiguous()) return {Layout::other, 0};
    if (t.shape() == out.shape()) return {Layout::full, n};
    if (t.numel() == 1) return {Layout::scalar, n};
    const Shape& o = out.shape();
    const int64_t rank = static_cast<int64_t>(o.size()), lead = rank - t.dim();
    if (lead < 0) return {Layout::other, 0};
    auto size_of = [&](int64_t d) { return d < lead ? int64_t{1} : t.shape()[d - lead]; };  // t aligned right
    int64_t first_kept = 0;  // suffix: t is 1 before first_kept and equal to out from there
    while (first_kept < rank && size_of(first_kept) == 1) ++first_kept;
    bool suffix = true;
    for (int64_t d = first_kept; d < rank; ++d) suffix &= size_of(d) == o[d];
    if (suffix) return {Layout::suffix, t.numel()};
    int64_t end_kept = rank;  // prefix: t equals out before end_kept and is 1 from there
    while (end_kept > 0 && size_of(end_kept - 1) == 1) --end_kept;
    bool prefix = true;
    for (int64_t d = 0; d < end_kept; ++d) prefix &= size_of(d) == o[d];
    if (prefix) return {Layout::prefix, n / t.numel()};
    return {Layout::other, 0};
}

// in_chunks over n elements cut into rows of `width`: f(row, begin, end) for each piece of a row
template <class F>
void in_row_pieces(int64_t n, int64_t width, F&& f) {
    in_chunks(n, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end;) {
            const int64_t row = i / width, stop = std::min(end, (row + 1) * width);
            f(row, i, stop);
            i = stop;
        }
    });
}

// o[i] = g(full[i], the element of `other` (laid out as lo) that output element i uses)
template <class T, class G>
bool full_and_other(const T* full, const T* other, Lined lo, int64_t n, T* o, G g) {
    switch (lo.layout) {
        case Layout::full:
            in_chunks(n, [&](int64_t begin, int64_t end) {
                for (int64_t i = begin; i < end; ++i) o[i] = g(full[i], other[i]);
            });
            return true;
        case Layout::scalar: {
            const T c = other[0];
            in_chunks(n, [&](int64_t begin, int64_t end) {
                for (int64_t i = begin; i < end; ++i) o[i] = g(full[i], c);
            });
            return true;
        }
        case Layout::suffix:  // a bias row: output element i uses other[i % width]
            in_row_pieces(n, lo.width, [&](int64_t row, int64_t begin, int64_t end) {
                const T* repeated = other + (begin - row * lo.width);
                const int64_t count = end - begin;
                const T* f_in = full + begin;
                T* f_out = o + begin;
                for (int64_t j = 0; j < count; ++j) f_out[j] = g(f_in[j], repeated[j]);
            });
            return true;
        case Layout::prefix:  // a per-row scalar: output element i uses other[i / width]
            in_row_pieces(n, lo.width, [&](int64_t row, int64_t begin, int64_t end) {
                const T c = other[row];
                for (int64_t i = begin; i < end; ++i) o[i] = g(full[i], c);
            });
            return true;
        default: return false;
    }
}

// A binary op over packed tensors as plain loops the compiler vectorizes, where one operand is
// full and the other is laid out as line_up finds it (full too, or another layout). Returns false for other layouts (xtensor's
// strided broadcasting handles those).
template <class T, class F>
bool packed_binary(const Tensor& a, const Tensor& b, Tensor& out, F f) {
    if (!out.is_contiguous()) return false;
    const int64_t n = out.numel();
    if (n == 0) return true;
    const Lined la = line_up(a, out), lb = line_up(b, out);
    if (la.layout == Layout::other || lb.layout == Layout::other) return false;
    const T* x = device_data<T>(a);
    const T* y = device_data<T>(b);
    T* o = device_data<T>(out);
    // one full operand and the other of any layout; the lambda keeps f's order with b full
    if (la.layout == Layout::full) return full_and_other<T>(x, y, lb, n, o, f);
    if (lb.layout == Layout::full) return full_and_other<T>(y, x, la, n, o, [&](T v, T w) { return f(w, v); });
    return false;
}

}  // namespace

void CpuBackend::do_fill(Tensor& out, double value) {
    dispatch_any(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        auto o = strided<T>(out);
        o.fill(static_cast<T>(value));
    });
}

void CpuBackend::do_copy(const Tensor& src, Tensor& dst) {
    if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
        std::memcpy(static_cast<char*>(dst.storage()->data()) + dst.offset() * dtype_size(dst.dtype()),
                    static_cast<const char*>(src.storage()->data()) + src.offset() * dtype_size(src.dtype()),
                    src.numel() * dtype_size(src.dtype()));
        return;
    }
    if (src.dtype() == dst.dtype() && is_floating(src.dtype()) && dst.dim() > 0) {
        // same type, any strides (a transpose made contiguous, a slice filled): row by row
        dispatch_any(src.dtype(), [&](auto tag) {
            using T = decltype(tag);
            const Shape outer(dst.shape().begin(), dst.shape().end() - 1);
            const int64_t inner = dst.shape().back(), step = src.strides().back(), dst_step = dst.strides().back();
            const T* from = device_data<T>(src);
            T* to = device_data<T>(dst);
            walk<2>(outer,
                    {Shape(src.strides().begin(), src.strides().end() - 1),
                     Shape(dst.strides().begin(), dst.strides().end() - 1)},
                    [&](const auto& off) {
                        for (int64_t j = 0; j < inner; ++j) to[off[1] + j * dst_step] = from[off[0] + j * step];
                    });
        });
        return;
    }
    if (src.is_contiguous() && dst.is_contiguous() && (is_16_bit(src.dtype()) || is_16_bit(dst.dtype())) &&
        is_floating(src.dtype()) && is_floating(dst.dtype())) {
        // to and from 16 bits, element by element (the copies around every 16-bit kernel, see backend.cpp)
        dispatch_any(dst.dtype(), [&](auto dst_tag) {
            using D = decltype(dst_tag);
            dispatch_any(src.dtype(), [&](auto src_tag) {
                using S = decltype(src_tag);
                if constexpr (is_real_v<S> && is_real_v<D>) {
                    const S* from = device_data<S>(src);
                    D* to = device_data<D>(dst);
                    in_chunks(dst.numel(), [&](int64_t begin, int64_t end) {
                        for (int64_t i = begin; i < end; ++i) to[i] = static_cast<D>(from[i]);
                    });
                }
            });
        });
        return;
    }
    dispatch_any(dst.dtype(), [&](auto dst_tag) {
        using D = decltype(dst_tag);
        dispatch_any(src.dtype(), [&](auto src_tag) {
            using S = decltype(src_tag);
            if constexpr (std::is_same_v<D, int64_t> && is_real_v<S>) {
                // a float without an int64 value (NaN, +-inf, beyond +-2^63) is an error, not undefined behaviour
                for (S v : xt::eval(input<S>(src, dst))) RELGRAD_CHECK(has_int64_value(v), no_int64_value(v));
            }
            auto d = strided<D>(dst);
            xt::noalias(d) = xt::cast<D>(input<S>(src, dst));
        });
    });
}

void CpuBackend::do_unary(UnaryOp op, const Tensor& x, Tensor& out, double a, double b) {
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
                    xt::noalias(O) = half * (one + xt::erf(X * inv_sqrt2)) + X * inv_sqrt_2pi * xt::exp(-half * X * X);
                    break;
                case UnaryOp::pow_scalar: xt::noalias(O) = xt::pow(X, T(a)); break;
                case UnaryOp::clamp: xt::noalias(O) = xt::clip(X, T(a), T(b)); break;
                case UnaryOp::inside: xt::noalias(O) = xt::where(X > T(a) && X < T(b), one, zero); break;
            }
        };
        if (x.is_contiguous() && out.is_contiguous() && x.shape() == out.shape()) {
            // packed: flat chunks, one per thread, each a plain 1-d SIMD loop in xtensor
            const T* in = device_data<T>(x);
            T* o = device_data<T>(out);
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

void CpuBackend::do_binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
    dispatch_numeric(a.dtype(), "binary", [&](auto tag) {
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

void CpuBackend::do_where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
    dispatch_numeric(a.dtype(), "where", [&](auto tag) {
        using T = decltype(tag);
        dispatch_any(cond.dtype(), [&](auto cond_tag) {
            using C = decltype(cond_tag);
            // packed: cond of out's shape, a and b each of out's shape or a single value
            auto fits = [&](const Tensor& t) {
                return t.is_contiguous() && (t.shape() == out.shape() || t.numel() == 1);
            };
            if (out.is_contiguous() && cond.is_contiguous() && cond.shape() == out.shape() && fits(a) && fits(b)) {
                const C* c = device_data<C>(cond);
                const T* pa = device_data<T>(a);
                const T* pb = device_data<T>(b);
                const int64_t step_a = a.numel() == 1 ? 0 : 1, step_b = b.numel() == 1 ? 0 : 1;
                T* o = device_data<T>(out);
                in_chunks(out.numel(), [&](int64_t begin, int64_t end) {
                    for (int64_t i = begin; i < end; ++i) o[i] = c[i] != C(0) ? pa[i * step_a] : pb[i * step_b];
                });
                return;
            }
            auto O = strided<T>(out);
            xt::noalias(O) = xt::where(xt::not_equal(input<C>(cond, out), C(0)), input<T>(a, out), input<T>(b, out));
        });
    });
}

}  // namespace relgrad
