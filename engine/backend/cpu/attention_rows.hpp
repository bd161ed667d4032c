// The CPU backend's attention row kernels: contiguous SIMD loops (xsimd batches, scalar tail)
// over one row of scores or of their gradient, shared by the bucketed attention kernels
// (attention.cpp) and the fused ones (fused_attention.cpp). Each returns the reduction the
// caller needs next, so that a row is read once per step of the softmax or its backward.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include <xsimd/xsimd.hpp>

namespace relgrad {
namespace cpu {

// The loops below are always inlined into their caller: called out of line (as the compiler may
// choose for a caller with several of them), store_max's running batch would live in memory, and
// every store through s might alias it, so it would be stored and loaded again for every batch
// (measured: the fused forward 17% slower with a bias by distance).
#define RELGRAD_ROW_LOOP inline __attribute__((always_inline))

// Calls step(j) for each full batch at j and tail(j) for the elements left over.
template <class T, class Step, class Tail>
RELGRAD_ROW_LOOP void simd_loop(int64_t n, Step&& step, Tail&& tail) {
    using Batch = xsimd::batch<T>;
    constexpr int64_t width = static_cast<int64_t>(Batch::size);
    int64_t j = 0;
    for (; j + width <= n; j += width) step(j);
    for (; j < n; ++j) tail(j);
}

// s_j <- new_batch(j) a batch at a time, new_tail(j) for the elements left over, over [0, n); the
// two give the same value, one as an xsimd batch and one as a T. Returns the largest new s_j and
// running_max. (The callers' lambdas capture by copy: by reference, a store through s might alias
// their scalars, and the compiler would load them again for every batch, ~10% of the kernel.)
template <class T, class NewBatch, class NewTail>
RELGRAD_ROW_LOOP T store_max(T* s, int64_t n, T running_max, NewBatch&& new_batch, NewTail&& new_tail) {
    using Batch = xsimd::batch<T>;
    Batch batch_max(running_max);
    simd_loop<T>(
        n,
        [&](int64_t j) {
            const Batch v = new_batch(j);
            v.store_unaligned(s + j);
            batch_max = xsimd::max(batch_max, v);
        },
        [&](int64_t j) { running_max = std::max(running_max, s[j] = new_tail(j)); });
    alignas(64) T lanes[Batch::size];
    batch_max.store_aligned(lanes);
    return std::max(running_max, *std::max_element(lanes, lanes + Batch::size));
}

// The same, returning the sum of the new s_j.
template <class T, class NewBatch, class NewTail>
RELGRAD_ROW_LOOP T store_sum(T* s, int64_t n, NewBatch&& new_batch, NewTail&& new_tail) {
    using Batch = xsimd::batch<T>;
    Batch total(T(0));
    T tail_total(0);
    simd_loop<T>(
        n,
        [&](int64_t j) {
            const Batch v = new_batch(j);
            v.store_unaligned(s + j);
            total += v;
        },
        [&](int64_t j) { tail_total += (s[j] = new_tail(j)); });
    return xsimd::hadd(total) + tail_total;
}

// s <- scale (s + bias) over [0, n); returns the max
template <class T>
T shift_scale_max(T* s, int64_t n, T bias, T scale, T running_max) {
    using Batch = xsimd::batch<T>;
    return store_max(
        s, n, running_max, [=](int64_t j) { return Batch(scale) * (Batch::load_unaligned(s + j) + Batch(bias)); },
        [=](int64_t j) { return scale * (s[j] + bias); });
}

// s <- scale (s + bias) over [0, n) with a bias per element; returns the max
template <class T>
T add_scale_max(T* s, const T* bias, int64_t n, T scale, T running_max) {
    using Batch = xsimd::batch<T>;
    return store_max(
        s, n, running_max,
        [=](int64_t j) { return Batch(scale) * (Batch::load_unaligned(s + j) + Batch::load_unaligned(bias + j)); },
        [=](int64_t j) { return scale * (s[j] + bias[j]); });
}

// s <- scale s + bias over [0, n) with a bias per element, added after the scale; returns the max
template <class T>
T scale_add_max(T* s, const T* bias, int64_t n, T scale, T running_max) {
    using Batch = xsimd::batch<T>;
    return store_max(
        s, n, running_max,
        [=](int64_t j) { return Batch(scale) * Batch::load_unaligned(s + j) + Batch::load_unaligned(bias + j); },
        [=](int64_t j) { return scale * s[j] + bias[j]; });
}

// s <- exp(s - max) over [0, n); returns the sum
template <class T>
T exp_sum(T* s, int64_t n, T max) {
    using Batch = xsimd::batch<T>;
    return store_sum(
        s, n, [=](int64_t j) { return xsimd::exp(Batch::load_unaligned(s + j) - Batch(max)); },
        [=](int64_t j) { return std::exp(s[j] - max); });
}

// s <- factor s over [0, n); returns the sum of the new s
template <class T>
T scale_sum(T* s, int64_t n, T factor) {
    using Batch = xsimd::batch<T>;
    return store_sum(
        s, n, [=](int64_t j) { return Batch::load_unaligned(s + j) * Batch(factor); },
        [=](int64_t j) { return s[j] * factor; });
}

// g <- scale a (g - dot) over [0, n); returns the sum of the new g
template <class T>
T softmax_grad_sum(T* g, const T* a, int64_t n, T dot, T scale) {
    using Batch = xsimd::batch<T>;
    return store_sum(
        g, n,
        [=](int64_t j) {
            return Batch(scale) * Batch::load_unaligned(a + j) * (Batch::load_unaligned(g + j) - Batch(dot));
        },
        [=](int64_t j) { return scale * a[j] * (g[j] - dot); });
}

// g <- g + shift over [0, n); returns sum_j g_j a_j of the new g
template <class T>
T shift_dot(T* g, const T* a, int64_t n, T shift) {
    using Batch = xsimd::batch<T>;
    Batch total(T(0));
    T tail_total(0);
    simd_loop<T>(
        n,
        [&](int64_t j) {
            const Batch v = Batch::load_unaligned(g + j) + Batch(shift);
            v.store_unaligned(g + j);
            total = xsimd::fma(v, Batch::load_unaligned(a + j), total);
        },
        [&](int64_t j) { tail_total += (g[j] += shift) * a[j]; });
    return xsimd::hadd(total) + tail_total;
}

// dst <- dst + src over [0, n)
template <class T>
void accumulate(T* dst, const T* src, int64_t n) {
    using Batch = xsimd::batch<T>;
    simd_loop<T>(
        n,
        [&](int64_t j) { (Batch::load_unaligned(dst + j) + Batch::load_unaligned(src + j)).store_unaligned(dst + j); },
        [&](int64_t j) { dst[j] += src[j]; });
}

// returns the sum over [0, n)
template <class T>
T sum(const T* s, int64_t n) {
    using Batch = xsimd::batch<T>;
    Batch total(T(0));
    T tail_total(0);
    simd_loop<T>(
        n, [&](int64_t j) { total += Batch::load_unaligned(s + j); }, [&](int64_t j) { tail_total += s[j]; });
    return xsimd::hadd(total) + tail_total;
}

// The softmax backward on one run of keys, from the probabilities p: dp <- p (dp + shift - dot)
// over [0, n) (shift the relative term that the run shares, dot = sum_j p_j dp_j of the whole row).
// Adds the run's sums of p and of the new dp to p_total and ds_total.
template <class T>
void softmax_backward_run(const T* p, T* dp, int64_t n, T shift, T dot, T& p_total, T& ds_total) {
    using Batch = xsimd::batch<T>;
    Batch batch_p(T(0)), batch_ds(T(0));
    T tail_p(0), tail_ds(0);
    simd_loop<T>(
        n,
        [&](int64_t j) {
            const Batch pj = Batch::load_unaligned(p + j);
            const Batch ds = pj * (Batch::load_unaligned(dp + j) + Batch(shift - dot));
            ds.store_unaligned(dp + j);
            batch_p += pj;
            batch_ds += ds;
        },
        [&](int64_t j) {
            tail_p += p[j];
            tail_ds += (dp[j] = p[j] * (dp[j] + shift - dot));
        });
    p_total += xsimd::hadd(batch_p) + tail_p;
    ds_total += xsimd::hadd(batch_ds) + tail_ds;
}

// The same over keys whose buckets count up one per key (inside the clipping window): a shift per
// element, and p and the new dp added to their own bucket's sums, p_sums[j] and ds_sums[j].
template <class T>
void softmax_backward_diagonal(const T* p, T* dp, int64_t n, const T* shift, T dot, T* p_sums, T* ds_sums) {
    using Batch = xsimd::batch<T>;
    simd_loop<T>(
        n,
        [&](int64_t j) {
            const Batch pj = Batch::load_unaligned(p + j);
            const Batch ds = pj * (Batch::load_unaligned(dp + j) + Batch::load_unaligned(shift + j) - Batch(dot));
            ds.store_unaligned(dp + j);
            (Batch::load_unaligned(p_sums + j) + pj).store_unaligned(p_sums + j);
            (Batch::load_unaligned(ds_sums + j) + ds).store_unaligned(ds_sums + j);
        },
        [&](int64_t j) {
            dp[j] = p[j] * (dp[j] + shift[j] - dot);
            p_sums[j] += p[j];
            ds_sums[j] += dp[j];
        });
}

}  // namespace cpu
}  // namespace relgrad
