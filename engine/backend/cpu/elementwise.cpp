// The CPU's elementwise kernels (engine/ops/elementwise.cpp, the copies of views.cpp, and rope's
// rotation of pairs for engine/ops/attention.cpp): xtensor expressions over the tensors' own
// strided memory (xt::adapt, no copies), and plain loops the compiler vectorizes for the packed
// common cases.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include <xtensor/xeval.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xnoalias.hpp>
#include <xtensor/xoperation.hpp>

#include "engine/backend/cpu/cpu_backend.hpp"
#include "engine/backend/cpu/strided_loops.hpp"
#include "engine/backend/kernel_errors.hpp"
#include "engine/errors.hpp"

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

// o[i] = g(full[i], the element of `other` (laid out as lo) that output element i uses), g on
// compute_type<T> values (float for the 16-bit types: each result rounded once)
template <class T, class G>
bool full_and_other(const T* full, const T* other, Lined lo, int64_t n, T* o, G g) {
    using C = compute_type<T>;
    switch (lo.layout) {
        case Layout::full:
            in_chunks(n, [&](int64_t begin, int64_t end) {
                for (int64_t i = begin; i < end; ++i) o[i] = static_cast<T>(g(C(full[i]), C(other[i])));
            });
            return true;
        case Layout::scalar: {
            const C c = other[0];
            in_chunks(n, [&](int64_t begin, int64_t end) {
                for (int64_t i = begin; i < end; ++i) o[i] = static_cast<T>(g(C(full[i]), c));
            });
            return true;
        }
        case Layout::suffix:  // a bias row: output element i uses other[i % width]
            in_row_pieces(n, lo.width, [&](int64_t row, int64_t begin, int64_t end) {
                const T* repeated = other + (begin - row * lo.width);
                const int64_t count = end - begin;
                const T* f_in = full + begin;
                T* f_out = o + begin;
                for (int64_t j = 0; j < count; ++j) f_out[j] = static_cast<T>(g(C(f_in[j]), C(repeated[j])));
            });
            return true;
        case Layout::prefix:  // a per-row scalar: output element i uses other[i / width]
            in_row_pieces(n, lo.width, [&](int64_t row, int64_t begin, int64_t end) {
                const C c = other[row];
                for (int64_t i = begin; i < end; ++i) o[i] = static_cast<T>(g(C(full[i]), c));
            });
            return true;
        default: return false;
    }
}

// A binary op over packed tensors as plain loops the compiler vectorizes, where one operand is
// full and the other is laid out as line_up finds it (full too, or another layout). Returns false for other layouts
// (xtensor's strided broadcasting handles those, or float32 copies of 16-bit operands).
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
    if (lb.layout == Layout::full) return full_and_other<T>(y, x, la, n, o, [&](auto v, auto w) { return f(w, v); });
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

namespace {

// dst = src where either is not of a floating type (integers, booleans): xtensor's strided
// assignment
void convert_by_xtensor(const Tensor& src, Tensor& dst) {
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

}  // namespace

void CpuBackend::do_copy(const Tensor& src, Tensor& dst) {
    if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
        std::memcpy(static_cast<char*>(dst.storage()->data()) + dst.offset() * dtype_size(dst.dtype()),
                    static_cast<const char*>(src.storage()->data()) + src.offset() * dtype_size(src.dtype()),
                    src.numel() * dtype_size(src.dtype()));
        return;
    }
    if (!is_floating(src.dtype()) || !is_floating(dst.dtype())) {
        convert_by_xtensor(src, dst);
        return;
    }
    // between floating types: element by element, each value rounded once (the copies around
    // every 16-bit kernel, see backend.cpp, and a transpose or slice made contiguous)
    dispatch_any(dst.dtype(), [&](auto dst_tag) {
        using D = decltype(dst_tag);
        dispatch_any(src.dtype(), [&](auto src_tag) {
            using S = decltype(src_tag);
            if constexpr (is_real_v<S> && is_real_v<D>) {
                const S* from = device_data<S>(src);
                D* to = device_data<D>(dst);
                if (src.is_contiguous() && dst.is_contiguous()) {  // flat chunks, one per thread
                    in_chunks(dst.numel(), [&](int64_t begin, int64_t end) {
                        for (int64_t i = begin; i < end; ++i) to[i] = static_cast<D>(from[i]);
                    });
                    return;
                }
                // any strides: row by row along the last dim, a SIMD loop where both rows are packed
                const Shape outer(dst.shape().begin(), dst.shape().end() - 1);
                const int64_t inner = dst.shape().back(), step = src.strides().back(), dst_step = dst.strides().back();
                walk<2>(outer,
                        {Shape(src.strides().begin(), src.strides().end() - 1),
                         Shape(dst.strides().begin(), dst.strides().end() - 1)},
                        [&](const auto& off) {
                            const S* row = from + off[0];
                            D* out_row = to + off[1];
                            if (step == 1 && dst_step == 1) {
                                for (int64_t j = 0; j < inner; ++j) out_row[j] = static_cast<D>(row[j]);
                            } else {
                                for (int64_t j = 0; j < inner; ++j)
                                    out_row[j * dst_step] = static_cast<D>(row[j * step]);
                            }
                        });
            }
        });
    });
}

namespace {

// O = f(X) for xtensor views X and O of one shape, of float or double
template <class T, class Out, class In>
void apply_unary(UnaryOp op, Out& O, const In& X, double a, double b) {
    const T one(1), zero(0);
    switch (op) {
        case UnaryOp::neg: xt::noalias(O) = -X; break;
        case UnaryOp::exp: xt::noalias(O) = xt::exp(X); break;
        case UnaryOp::log: xt::noalias(O) = xt::log(X); break;
        case UnaryOp::sqrt: xt::noalias(O) = xt::sqrt(X); break;
        case UnaryOp::tanh: xt::noalias(O) = xt::tanh(X); break;
        case UnaryOp::sigmoid: xt::noalias(O) = one / (one + xt::exp(-X)); break;
        case UnaryOp::relu: xt::noalias(O) = xt::where(X > zero, X, zero); break;
        case UnaryOp::gelu: xt::noalias(O) = gelu_formula<T>(X); break;
        case UnaryOp::relu_grad: xt::noalias(O) = xt::where(X > zero, one, zero); break;
        case UnaryOp::gelu_grad: xt::noalias(O) = gelu_grad_formula<T>(X); break;
        case UnaryOp::pow_scalar: xt::noalias(O) = xt::pow(X, T(a)); break;
        case UnaryOp::clamp: xt::noalias(O) = xt::clip(X, T(a), T(b)); break;
        case UnaryOp::inside: xt::noalias(O) = xt::where(X > T(a) && X < T(b), one, zero); break;
    }
}

// A 1-d xtensor view of n elements at p, in place
template <class T>
auto flat(T* p, int64_t n) {
    const std::size_t size = static_cast<std::size_t>(n);
    return xt::adapt(p, size, xt::no_ownership(), std::array<std::size_t, 1>{size});
}

// 16-bit operands pass through a float32 kernel a tile at a time: widened into a buffer that stays
// in the core's cache (two tiles of 32 KiB), computed by the float32 code itself, and rounded once
// into the output.
// The tiles are multiples of 64 elements from a chunk's start, so the SIMD loop meets the same
// batches as on a whole float32 tensor: the same values as widening the whole tensor first.
constexpr int64_t kWideTile = 8192;

}  // namespace

void CpuBackend::do_unary(UnaryOp op, const Tensor& x, Tensor& out, double a, double b) {
    const bool packed = x.is_contiguous() && out.is_contiguous() && x.shape() == out.shape();
    if (is_16_bit(x.dtype()) && !packed) {
        on_float32_copies(*this, out, [&](Tensor& wide) { do_unary(op, widened(x), wide, a, b); });
        return;
    }
    dispatch_real(x.dtype(), "unary", [&](auto tag) {
        using T = decltype(tag);
        using C = compute_type<T>;
        if (packed) {
            // flat chunks, one per thread, each a plain 1-d SIMD loop in xtensor
            const T* in = device_data<T>(x);
            T* o = device_data<T>(out);
            in_chunks(out.numel(), [&](int64_t begin, int64_t end) {
                if constexpr (is_16_bit_v<T>) {
                    alignas(64) C wide_in[kWideTile], wide_out[kWideTile];
                    for (int64_t tile = begin; tile < end; tile += kWideTile) {
                        const int64_t count = std::min(kWideTile, end - tile);
                        for (int64_t i = 0; i < count; ++i) wide_in[i] = in[tile + i];
                        auto X = flat(wide_in, count);
                        auto O = flat(wide_out, count);
                        apply_unary<C>(op, O, X, a, b);
                        for (int64_t i = 0; i < count; ++i) o[tile + i] = static_cast<T>(wide_out[i]);
                    }
                } else {
                    auto X = flat(in + begin, end - begin);
                    auto O = flat(o + begin, end - begin);
                    apply_unary<T>(op, O, X, a, b);
                }
            });
            return;
        }
        if constexpr (!is_16_bit_v<T>) {
            auto X = input<T>(x, out);
            auto O = strided<T>(out);
            apply_unary<T>(op, O, X, a, b);
        }
    });
}

void CpuBackend::do_binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
    auto run = [&](auto tag) {
        using T = decltype(tag);
        using C = compute_type<T>;
        bool done = false;
        switch (op) {
            case BinaryOp::add: done = packed_binary<T>(a, b, out, [](C x, C y) { return x + y; }); break;
            case BinaryOp::sub: done = packed_binary<T>(a, b, out, [](C x, C y) { return x - y; }); break;
            case BinaryOp::mul: done = packed_binary<T>(a, b, out, [](C x, C y) { return x * y; }); break;
            case BinaryOp::div: done = packed_binary<T>(a, b, out, [](C x, C y) { return x / y; }); break;
            default: break;
        }
        if (done) return;
        if constexpr (is_16_bit_v<T>) {  // another layout, or an op without a packed loop
            on_float32_copies(*this, out, [&](Tensor& wide) { do_binary(op, widened(a), widened(b), wide); });
        } else {
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
        }
    };
    const bool all_16_bit = is_16_bit(out.dtype()) && a.dtype() == out.dtype() && b.dtype() == out.dtype();
    if (all_16_bit) {
        dispatch_real(out.dtype(), "binary", run);
    } else {
        dispatch_numeric(a.dtype(), "binary", run);
    }
}

void CpuBackend::do_where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
    // packed: cond of out's shape, a and b each of out's shape or a single value
    auto fits = [&](const Tensor& t) { return t.is_contiguous() && (t.shape() == out.shape() || t.numel() == 1); };
    const bool packed =
        out.is_contiguous() && cond.is_contiguous() && cond.shape() == out.shape() && fits(a) && fits(b);
    if (is_16_bit(out.dtype()) && !packed) {
        on_float32_copies(*this, out, [&](Tensor& wide) { do_where(cond, widened(a), widened(b), wide); });
        return;
    }
    auto run = [&](auto tag) {
        using T = decltype(tag);
        dispatch_any(cond.dtype(), [&](auto cond_tag) {
            using C = decltype(cond_tag);
            if (packed) {
                const C* c = device_data<C>(cond);
                const T* pa = device_data<T>(a);
                const T* pb = device_data<T>(b);
                const int64_t step_a = a.numel() == 1 ? 0 : 1, step_b = b.numel() == 1 ? 0 : 1;
                T* o = device_data<T>(out);
                in_chunks(out.numel(), [&](int64_t begin, int64_t end) {
                    for (int64_t i = begin; i < end; ++i) o[i] = C(c[i]) != C(0) ? pa[i * step_a] : pb[i * step_b];
                });
                return;
            }
            if constexpr (!is_16_bit_v<T>) {
                auto O = strided<T>(out);
                xt::noalias(O) =
                    xt::where(xt::not_equal(input<C>(cond, out), C(0)), input<T>(a, out), input<T>(b, out));
            }
        });
    };
    if (is_16_bit(out.dtype())) {
        dispatch_real(out.dtype(), "where", run);
    } else {
        dispatch_numeric(a.dtype(), "where", run);
    }
}

// The words of the Philox blocks first .. first + 7 (random.hpp) in the order dropout's elements
// take them: words[e] is word e % 4 of block first + e / 4. With AVX2 the 8 blocks run in 8 lanes:
// _mm256_mul_epu32 forms the 64-bit products of the even 32-bit lanes, so each of a round's
// products takes two of them (the odd lanes shifted down), and a 4 x 8 transpose puts the words
// in element order. The same values as 8 calls of philox_block, four times as fast.
void philox_8_blocks(uint64_t seed, uint64_t first, uint32_t words[32]) {
#ifdef __AVX2__
    auto mulhilo = [](__m256i x, __m256i m, __m256i& hi, __m256i& lo) {
        const __m256i even = _mm256_mul_epu32(x, m), odd = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), m);
        lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
        hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
    };
    uint32_t low[8], high[8];
    for (int j = 0; j < 8; ++j) {
        low[j] = static_cast<uint32_t>(first + j);
        high[j] = static_cast<uint32_t>((first + j) >> 32);
    }
    __m256i c0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(low));
    __m256i c1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(high));
    __m256i c2 = _mm256_setzero_si256(), c3 = _mm256_setzero_si256();
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    const __m256i A = _mm256_set1_epi32(static_cast<int>(0xD2511F53u));
    const __m256i B = _mm256_set1_epi32(static_cast<int>(0xCD9E8D57u));
    for (int round = 0; round < 10; ++round) {
        __m256i a_hi, a_lo, b_hi, b_lo;
        mulhilo(c0, A, a_hi, a_lo);
        mulhilo(c2, B, b_hi, b_lo);
        c0 = _mm256_xor_si256(_mm256_xor_si256(b_hi, c1), _mm256_set1_epi32(static_cast<int>(k0)));
        c1 = b_lo;
        c2 = _mm256_xor_si256(_mm256_xor_si256(a_hi, c3), _mm256_set1_epi32(static_cast<int>(k1)));
        c3 = a_lo;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    // transpose: c_w holds word w of blocks 0..7; each 128-bit half of a result holds one block
    const __m256i t0 = _mm256_unpacklo_epi32(c0, c1), t1 = _mm256_unpacklo_epi32(c2, c3);
    const __m256i t2 = _mm256_unpackhi_epi32(c0, c1), t3 = _mm256_unpackhi_epi32(c2, c3);
    const __m256i blocks04 = _mm256_unpacklo_epi64(t0, t1), blocks15 = _mm256_unpackhi_epi64(t0, t1);
    const __m256i blocks26 = _mm256_unpacklo_epi64(t2, t3), blocks37 = _mm256_unpackhi_epi64(t2, t3);
    __m256i* out = reinterpret_cast<__m256i*>(words);
    _mm256_storeu_si256(out + 0, _mm256_permute2x128_si256(blocks04, blocks15, 0x20));  // blocks 0, 1
    _mm256_storeu_si256(out + 1, _mm256_permute2x128_si256(blocks26, blocks37, 0x20));  // blocks 2, 3
    _mm256_storeu_si256(out + 2, _mm256_permute2x128_si256(blocks04, blocks15, 0x31));  // blocks 4, 5
    _mm256_storeu_si256(out + 3, _mm256_permute2x128_si256(blocks26, blocks37, 0x31));  // blocks 6, 7
#else
    for (int j = 0; j < 8; ++j) {
        const PhiloxBlock block = philox_block(seed, first + j);
        for (int w = 0; w < 4; ++w) words[4 * j + w] = block.word[w];
    }
#endif
}

// Each thread's chunk starts at a multiple of 64 elements, so on a whole group of 8 Philox blocks:
// element i takes word i % 4 of block i / 4, whichever thread computes it. 16-bit operands are
// read as they are, and each result is rounded once from float32.
template <class T, bool with_residual>
void dropout_chunk(const T* x, const T* residual, const DropoutMask mask, T* out, int64_t begin, int64_t end) {
    using C = compute_type<T>;
    const C keep_scale = static_cast<C>(mask.keep_scale);
    for (int64_t first = begin; first < end; first += 32) {
        uint32_t words[32];
        philox_8_blocks(mask.seed, mask.first_block + static_cast<uint64_t>(first / 4), words);
        const int64_t count = std::min<int64_t>(32, end - first);
        for (int64_t e = 0; e < count; ++e) {
            const C scale = words[e] >= mask.threshold ? keep_scale : C(0);
            // residual + x m / (1 - p) as one fused multiply-add, so that no compiler's choice to
            // fuse or not changes a bit (the CUDA kernel does the same)
            out[first + e] = static_cast<T>(with_residual ? std::fma(C(x[first + e]), scale, C(residual[first + e]))
                                                          : C(x[first + e]) * scale);
        }
    }
}

void CpuBackend::do_dropout(const Tensor& x, const Tensor& residual, const DropoutMask& mask, Tensor& out) {
    dispatch_real(x.dtype(), "dropout", [&](auto tag) {
        using T = decltype(tag);
        const T* px = device_data<T>(x);
        const T* pr = device_data_or_null<T>(residual);
        T* o = device_data<T>(out);
        in_chunks(out.numel(), [&](int64_t begin, int64_t end) {
            if (pr) {
                dropout_chunk<T, true>(px, pr, mask, o, begin, end);
            } else {
                dropout_chunk<T, false>(px, pr, mask, o, begin, end);
            }
        });
    });
}

// RoPE's rotation, row by row: the row at position p (rows cycle through the L positions)
void CpuBackend::do_rotate_pairs(const Tensor& x, const Tensor& cos, const Tensor& sin, Tensor& out) {
    dispatch_floating(x.dtype(), "rotate_pairs", [&](auto tag) {
        using T = decltype(tag);
        const int64_t L = x.size(-2), pairs = x.size(-1) / 2, rows = x.numel() / std::max<int64_t>(2 * pairs, 1);
        const T* px = device_data<T>(x);
        const T* c = device_data<T>(cos);
        const T* s = device_data<T>(sin);
        T* o = device_data<T>(out);
#pragma omp parallel for schedule(static)
        for (int64_t row = 0; row < rows; ++row) {
            const T* x_row = px + row * 2 * pairs;
            const T* c_row = c + (row % L) * pairs;
            const T* s_row = s + (row % L) * pairs;
            T* o_row = o + row * 2 * pairs;
            for (int64_t t = 0; t < pairs; ++t) {
                const T even = x_row[2 * t], odd = x_row[2 * t + 1];
                o_row[2 * t] = even * c_row[t] - odd * s_row[t];
                o_row[2 * t + 1] = even * s_row[t] + odd * c_row[t];
            }
        }
    });
}

}  // namespace relgrad
