// The CPU's elementwise kernels (engine/ops/elementwise.cpp, and the copies of views.cpp): xtensor
// expressions over the tensors' own strided memory (xt::adapt, no copies), and plain loops the
// compiler vectorizes for the packed common cases.
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
    const T* x = device_data<T>(a);
    const T* y = device_data<T>(b);
    T* o = device_data<T>(out);
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
