// Fused relative attention on the CPU: tiled, with an online softmax, in memory linear in L.
// One file: the forward and the backward walk the same tiles with the same helpers (below).
//
// Per (batch, head), with c = scale, r = r(i, j) the clipped distance bucket, E_K and E_V the
// head's tables, QE = Q E_K^T [Lq, K], and only the visible keys j of each query i:
//
//   forward, query tile by query tile, key tile by key tile (m, l, acc, W kept per query row):
//     s_ij   = c (q_i . k_j + QE[i, r])                   S = Q_t K_t^T by BLAS, then per row
//     m'     = max(m, max_j s_ij),  alpha = exp(m - m')    rescale what the row has so far
//     p_ij   = exp(s_ij - m')
//     l      = alpha l + sum_j p_ij
//     acc    = alpha acc + sum_j p_ij v_j                  acc += P V_t by BLAS
//     W[r]   = alpha W[r] + sum_{j: r(i,j)=r} p_ij         the value-side buckets
//   and after the last tile: z_i = (acc + W E_V) / l, lse_i = m + log l (kept for the backward).
//
//   backward, with D_i = dz_i . z_i and G = dz E_V^T [Lq, K]; key tile by key tile, and for each
//   key tile query tile by query tile (so dk, dv of a key tile are finished before the next):
//     p_ij   = exp(s_ij - lse_i)                          recomputed, never stored
//     dp_ij  = dz_i . v_j + G[i, r]                       dz_t V_t^T by BLAS
//     ds_ij  = p_ij (dp_ij - D_i)
//     dv_j  += p_ij dz_i,  dk_j += c ds_ij q_i,  dq_i += c ds_ij k_j          by BLAS
//     P[i, r] += p_ij,  S[i, r] += ds_ij                  bucket sums per query row
//   and then: dE_V += P^T dz,  dE_K += c S^T Q,  dq += c S E_K.
//
// With a distance bias instead of Shaw's tables, s_ij = c q_i . k_j + b_h(j - i), read from the
// head's bias row at distance_entry(i, j) (contiguous in j), and the backward sums ds_ij by that
// entry: dB[entry] += ds_ij, in a row of Lq + Lk - 1 per (batch, head).
//
// A row that sees no key keeps l = 0: its z is 0, its lse -inf, and the backward skips it.
// Threads: the forward splits (batch, head, query tile), the backward (batch, head, key group),
// with groups of key tiles only when there are fewer than 8 (batch, head) pairs; each output
// element is summed by one thread in a fixed order, and the cut depends on the shapes alone, so
// results do not depend on the thread count.
//
// bfloat16 q, k, v (and z, dz) are read as they are where this CPU multiplies bfloat16 at speed
// (supports(fused_attention_16_bit)): the tile products above take them through oneDNN's bfloat16
// gemm with float32 sums, everything else is float32, and P and dS are rounded to bfloat16 before
// the products that read them, as the CUDA kernels round them (FlashAttention-2's rule). Q and dz
// are widened to float32 for the products with the float32 tables E_K and E_V. float16 operands
// run on float32 copies (these CPUs have no fast float16 products).
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include <omp.h>

#include "engine/backend/cpu/attention_rows.hpp"
#include "engine/backend/cpu/cpu_backend.hpp"

namespace relgrad {
namespace cpu {
namespace {

// The tile products: C = alpha op(A) op(B) + beta C, A and B of the operands' type T, C of
// compute_type<T> (float32 sums for bfloat16 operands)
template <class T>
void tile_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, compute_type<T> alpha, const T* A,
               int64_t lda, const T* B, int64_t ldb, compute_type<T> beta, compute_type<T>* C, int64_t ldc) {
    if constexpr (std::is_same_v<T, BFloat16>) {
        gemm_bfloat16_to_float(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    } else {
        gemm<T>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    }
}

// x[0, n) as an operand of type T: x itself, or for 16-bit operands rounded into `buffer` (P and
// dS before the products that read them)
template <class T>
const T* as_operand(const compute_type<T>* x, int64_t n, std::vector<T>& buffer) {
    if constexpr (is_16_bit_v<T>) {
        for (int64_t e = 0; e < n; ++e) buffer[e] = static_cast<T>(x[e]);
        return buffer.data();
    } else {
        return x;
    }
}

// operands x[0, n) in compute_type<T>: x itself, or for 16-bit operands widened into `buffer` (Q
// and dz before the products with the tables)
template <class T>
const compute_type<T>* as_computed(const T* x, int64_t n, std::vector<compute_type<T>>& buffer) {
    if constexpr (is_16_bit_v<T>) {
        for (int64_t e = 0; e < n; ++e) buffer[e] = x[e];
        return buffer.data();
    } else {
        return x;
    }
}

// the size of a buffer of as_operand or as_computed: n for 16-bit operands, none otherwise
template <class T>
int64_t only_16_bit(int64_t n) {
    return is_16_bit_v<T> ? n : 0;
}

// The sizes, the rules of the pattern and where each (batch, head) finds its operands: q, k and v
// of type T, the rest (the tables, the bias, the scale) of C = compute_type<T>.
template <class T, class C = compute_type<T>>
struct Problem {
    Problem(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionPattern& pattern, double scale,
            const ClippedRelativeTerms& relative)
        : B(q.size(0)),
          H(q.size(1)),
          Lq(q.size(2)),
          Lk(k.size(2)),
          Dh(q.size(3)),
          scale(static_cast<C>(scale)),
          relative(relative.table_k.defined()),
          K(relative.table_k.defined() ? relative.table_k.size(1) : 0),
          k_left(relative.k_left),
          k_right(relative.k_right),
          tables_per_head(relative.table_k.defined() && relative.table_k.size(0) > 1),
          causal(pattern.causal),
          window(pattern.window),
          query_offset(pattern.query_offset),
          mask(device_data_or_null<bool>(pattern.mask)),
          q_all(device_data<T>(q)),
          k_all(device_data<T>(k)),
          v_all(device_data<T>(v)),
          table_k(device_data_or_null<C>(relative.table_k)),
          table_v(device_data_or_null<C>(relative.table_v)),
          distance_bias(device_data_or_null<C>(relative.distance_bias)),
          bias_per_head(relative.distance_bias.defined() && relative.distance_bias.size(0) > 1) {
        if (mask) mask_strides = pattern.mask.strides();
    }
    int64_t B, H, Lq, Lk, Dh;
    C scale;
    bool relative;
    int64_t K, k_left, k_right;
    bool tables_per_head;
    bool causal;
    int64_t window, query_offset;
    const bool* mask;
    Shape mask_strides;
    const T *q_all, *k_all, *v_all;
    const C *table_k, *table_v;
    const C* distance_bias;  // [H or 1, Lq + Lk - 1], or null
    bool bias_per_head;

    // where (batch, head) bh finds its queries, keys and values, and head h its tables E_K and E_V
    // (null without relative terms)
    const T* queries(int64_t bh) const { return q_all + bh * Lq * Dh; }
    const T* keys(int64_t bh) const { return k_all + bh * Lk * Dh; }
    const T* values(int64_t bh) const { return v_all + bh * Lk * Dh; }
    const C* head_table_k(int64_t h) const { return table_k ? table_k + (tables_per_head ? h : 0) * K * Dh : nullptr; }
    const C* head_table_v(int64_t h) const { return table_v ? table_v + (tables_per_head ? h : 0) * K * Dh : nullptr; }
    int64_t bias_entries() const { return distance_bias ? Lq + Lk - 1 : 0; }
    // head h's bias for the keys of query i from key j0 on (null without a distance bias)
    const C* bias_row(int64_t h, int64_t i, int64_t j0) const {
        return distance_bias ? distance_bias + (bias_per_head ? h : 0) * bias_entries() + distance_entry(i, j0, Lq)
                             : nullptr;
    }

    // the keys [lo, hi) that the causal and window rules leave to query i
    int64_t visible_begin(int64_t i) const { return window >= 0 ? std::max<int64_t>(0, query_offset + i - window) : 0; }
    int64_t visible_end(int64_t i) const {
        int64_t end = Lk;
        if (causal) end = std::min(end, query_offset + i + 1);
        if (window >= 0) end = std::min(end, query_offset + i + window + 1);
        return std::max<int64_t>(end, 0);
    }
    // does any query of [i0, i1) see any key of [j0, j1) under those rules?
    bool tile_visible(int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
        return visible_begin(i0) < j1 && visible_end(i1 - 1) > j0;  // both bounds grow with i
    }
    // Splits the keys [j0, j1) of query i by their bucket, offsets from j0: calls run(begin, end,
    // bucket) for the keys left of the clipping window (bucket 0) and right of it (bucket K - 1),
    // and diagonal(begin, end, first) for the keys inside it, whose buckets count up one per key
    // from `first`. Without relative terms: one run, bucket -1.
    template <class Run, class Diagonal>
    void for_each_run(int64_t i, int64_t j0, int64_t j1, Run&& run, Diagonal&& diagonal) const {
        if (!relative) {
            run(0, j1 - j0, -1);
            return;
        }
        const int64_t position = query_offset + i;
        const int64_t left_end = std::clamp(position - k_left + 1, j0, j1);        // r = 0 before it
        const int64_t right_begin = std::clamp(position + k_right, left_end, j1);  // r = K - 1 from it
        if (left_end > j0) run(0, left_end - j0, 0);
        if (right_begin > left_end) {
            diagonal(left_end - j0, right_begin - j0, clipped_bucket(left_end - position, k_left, k_right));
        }
        if (right_begin < j1) run(right_begin - j0, j1 - j0, K - 1);
    }
    // s <- c (s + QE[i, r]) (or c s + b_h(j - i)) over the keys [j0, j1) of query i, the keys it
    // may not see to -inf; returns the row's max
    C scores_row(C* s, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t j1, const C* qe_row) const {
        const C neg_inf = -std::numeric_limits<C>::infinity();
        C m = neg_inf;
        if (const C* bias = bias_row(h, i, j0)) {
            m = scale_add_max(s, bias, j1 - j0, scale, m);
        } else {
            for_each_run(
                i, j0, j1,
                [&](int64_t begin, int64_t end, int64_t bucket) {
                    m = shift_scale_max(s + begin, end - begin, bucket >= 0 ? qe_row[bucket] : C(0), scale, m);
                },
                [&](int64_t begin, int64_t end, int64_t first) {
                    m = add_scale_max(s + begin, qe_row + first, end - begin, scale, m);
                });
        }
        const int64_t lo = std::clamp(visible_begin(i), j0, j1), hi = std::clamp(visible_end(i), lo, j1);
        const bool all_visible = lo == j0 && hi == j1;
        if (all_visible && !mask) return m;
        std::fill(s, s + (lo - j0), neg_inf);
        std::fill(s + (hi - j0), s + (j1 - j0), neg_inf);
        if (mask) {
            const bool* keep = mask + b * mask_strides[0] + h * mask_strides[1] + i * mask_strides[2];
            for (int64_t j = lo; j < hi; ++j)
                if (!keep[j * mask_strides[3]]) s[j - j0] = neg_inf;
        }
        m = neg_inf;
        for (int64_t j = lo; j < hi; ++j) m = std::max(m, s[j - j0]);
        return m;
    }
};

template <class T>
void forward(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const AttentionPattern& pattern, double scale,
             const ClippedRelativeTerms& relative, Tensor& z_out, Tensor& lse_out) {
    using C = compute_type<T>;
    const Problem<T> P(q_in, k_in, v_in, pattern, scale, relative);
    const int64_t Lq = P.Lq, Lk = P.Lk, Dh = P.Dh, K = P.K;
    C* z_all = device_data<C>(z_out);
    C* lse_all = device_data<C>(lse_out);
    const C neg_inf = -std::numeric_limits<C>::infinity();
    const int64_t tiles = (Lq + kQueryTile - 1) / kQueryTile;
    // each thread's tile buffers, allocated here so that running out of memory is an exception
    struct Scratch {
        std::vector<C> s, qe, acc, w, m, l, q_wide;
        std::vector<T> p_rounded;
    };
    std::vector<Scratch> scratch(omp_get_max_threads());
    for (Scratch& mine : scratch) {
        mine = {std::vector<C>(kQueryTile * kKeyTile),
                std::vector<C>(kQueryTile * K),
                std::vector<C>(kQueryTile * Dh),
                std::vector<C>(kQueryTile * K),
                std::vector<C>(kQueryTile),
                std::vector<C>(kQueryTile),
                std::vector<C>(only_16_bit<T>(kQueryTile * Dh)),
                std::vector<T>(only_16_bit<T>(kQueryTile * kKeyTile))};
    }
#pragma omp parallel
    {
        Scratch& mine = scratch[omp_get_thread_num()];
        std::vector<C>&s = mine.s, &qe = mine.qe, &acc = mine.acc, &w = mine.w, &m = mine.m, &l = mine.l;
#pragma omp for schedule(dynamic)
        for (int64_t task = 0; task < P.B * P.H * tiles; ++task) {
            const int64_t bh = task / tiles, b = bh / P.H, h = bh % P.H;
            const int64_t i0 = (task % tiles) * kQueryTile, i1 = std::min(Lq, i0 + kQueryTile), rows = i1 - i0;
            const T* q = P.queries(bh) + i0 * Dh;
            const T *k = P.keys(bh), *v = P.values(bh);
            const C *ek = P.head_table_k(h), *ev = P.head_table_v(h);
            std::fill(acc.begin(), acc.end(), C(0));
            std::fill(w.begin(), w.end(), C(0));
            std::fill(m.begin(), m.end(), neg_inf);
            std::fill(l.begin(), l.end(), C(0));
            if (ek) {  // QE = Q_t E_K^T
                const C* q_computed = as_computed(q, rows * Dh, mine.q_wide);
                gemm(false, true, rows, K, Dh, C(1), q_computed, Dh, ek, Dh, C(0), qe.data(), K);
            }
            for (int64_t j0 = 0; j0 < Lk; j0 += kKeyTile) {
                const int64_t j1 = std::min(Lk, j0 + kKeyTile), cols = j1 - j0;
                if (!P.tile_visible(i0, i1, j0, j1)) continue;
                // S = Q_t K_t^T
                tile_gemm(false, true, rows, cols, Dh, C(1), q, Dh, k + j0 * Dh, Dh, C(0), s.data(), cols);
                for (int64_t row = 0; row < rows; ++row) {
                    C* s_row = s.data() + row * cols;
                    const C tile_max = P.scores_row(s_row, b, h, i0 + row, j0, j1, qe.data() + row * K);
                    if (tile_max == neg_inf) {  // nothing visible in this tile: p = 0
                        std::fill(s_row, s_row + cols, C(0));
                        continue;
                    }
                    const C new_max = std::max(m[row], tile_max);
                    const C alpha = m[row] == neg_inf ? C(0) : std::exp(m[row] - new_max);
                    if (alpha != C(1)) {
                        for (int64_t d = 0; d < Dh; ++d) acc[row * Dh + d] *= alpha;
                        for (int64_t r = 0; r < K; ++r) w[row * K + r] *= alpha;
                    }
                    l[row] = alpha * l[row] + exp_sum(s_row, cols, new_max);  // s_row is now p
                    m[row] = new_max;
                    if (K > 0) {
                        P.for_each_run(
                            i0 + row, j0, j1,
                            [&](int64_t begin, int64_t end, int64_t bucket) {
                                w[row * K + bucket] += sum(s_row + begin, end - begin);
                            },
                            [&](int64_t begin, int64_t end, int64_t first) {
                                accumulate(w.data() + row * K + first, s_row + begin, end - begin);
                            });
                    }
                }
                const T* p = as_operand(s.data(), rows * cols, mine.p_rounded);
                tile_gemm(false, false, rows, Dh, cols, C(1), p, cols, v + j0 * Dh, Dh, C(1), acc.data(), Dh);  // P V_t
            }
            if (ev) gemm(false, false, rows, Dh, K, C(1), w.data(), K, ev, Dh, C(1), acc.data(), Dh);  // + W E_V
            C* z = z_all + (bh * Lq + i0) * Dh;
            C* lse = lse_all + bh * Lq + i0;
            for (int64_t row = 0; row < rows; ++row) {
                const bool sees_a_key = l[row] > C(0);
                const C inverse = sees_a_key ? C(1) / l[row] : C(0);
                for (int64_t d = 0; d < Dh; ++d) z[row * Dh + d] = acc[row * Dh + d] * inverse;
                lse[row] = sees_a_key ? m[row] + std::log(l[row]) : neg_inf;
            }
        }
    }
}

template <class T>
void backward(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Tensor& z_in, const Tensor& lse_in,
              const Tensor& dz_in, const AttentionPattern& pattern, double scale, const ClippedRelativeTerms& relative,
              Tensor& dq_out, Tensor& dk_out, Tensor& dv_out, Tensor& d_table_k, Tensor& d_table_v,
              Tensor& d_distance_bias) {
    using C = compute_type<T>;
    const Problem<T> P(q_in, k_in, v_in, pattern, scale, relative);
    const int64_t Lq = P.Lq, Lk = P.Lk, Dh = P.Dh, K = P.K, BH = P.B * P.H;
    const C c = P.scale;
    const T* z_all = device_data<T>(z_in);
    const C* lse_all = device_data<C>(lse_in);
    const T* dz_all = device_data<T>(dz_in);
    C* dq_all = device_data<C>(dq_out);
    C* dk_all = device_data<C>(dk_out);
    C* dv_all = device_data<C>(dv_out);
    const C neg_inf = -std::numeric_limits<C>::infinity();
    // Tasks: (batch, head, key group). With fewer (batch, head) pairs than 8 the key tiles are cut
    // into groups, so that a single sequence and head still keeps several threads busy; a group
    // owns dk and dv of its keys and adds into its own share of dq and of the bucket sums P and S,
    // which are summed over the groups in order afterwards. The cut depends on the shapes alone.
    const int64_t key_tiles = (Lk + kKeyTile - 1) / kKeyTile;
    const int64_t groups =
        std::clamp<int64_t>((8 + BH - 1) / std::max<int64_t>(BH, 1), 1, std::max<int64_t>(key_tiles, 1));
    const int64_t shares = groups > 1 ? BH * groups : 0;
    std::vector<C> dq_shares(shares * Lq * Dh), p_shares(shares * Lq * K), ds_shares(shares * Lq * K);
    // each (batch, head)'s share of dE_K and dE_V, summed in a fixed order afterwards
    std::vector<C> dek_parts(P.relative ? BH * K * Dh : 0), dev_parts(P.relative ? BH * K * Dh : 0);
    // the distance bias's gradient, [B, H, Lq + Lk - 1], each group's share apart when there are several
    C* d_bias_all = device_data_or_null<C>(d_distance_bias);
    const int64_t entries = d_bias_all ? P.bias_entries() : 0;
    std::vector<C> d_bias_shares(shares * entries);
    // each thread's buffers, allocated here so that running out of memory is an exception
    struct Scratch {
        std::vector<C> s, dp, dot, qe, g, p_buckets, ds_buckets, q_wide, dz_wide;
        std::vector<T> p_rounded, ds_rounded;
    };
    const int team = static_cast<int>(std::min<int64_t>(omp_get_max_threads(), std::max<int64_t>(BH * groups, 1)));
    const int64_t wide_rows = P.relative ? only_16_bit<T>(Lq * Dh) : 0;
    std::vector<Scratch> scratch(team);
    for (Scratch& mine : scratch) {
        mine = {std::vector<C>(kQueryTile * kKeyTile),
                std::vector<C>(kQueryTile * kKeyTile),
                std::vector<C>(Lq),
                std::vector<C>(Lq * K),
                std::vector<C>(Lq * K),
                std::vector<C>(Lq * K),
                std::vector<C>(Lq * K),
                std::vector<C>(wide_rows),
                std::vector<C>(wide_rows),
                std::vector<T>(only_16_bit<T>(kQueryTile * kKeyTile)),
                std::vector<T>(only_16_bit<T>(kQueryTile * kKeyTile))};
    }
    // after the last key tile: dq += c S E_K, and the (batch, head)'s c S^T Q and P^T dz (Q and dz
    // in C)
    auto finish = [&](int64_t bh, const C* p_sums, const C* ds_sums, const C* q, const C* dz) {
        const int64_t h = bh % P.H;
        gemm(false, false, Lq, Dh, K, c, ds_sums, K, P.head_table_k(h), Dh, C(1), dq_all + bh * Lq * Dh, Dh);
        gemm(true, false, K, Dh, Lq, c, ds_sums, K, q, Dh, C(0), dek_parts.data() + bh * K * Dh, Dh);
        gemm(true, false, K, Dh, Lq, C(1), p_sums, K, dz, Dh, C(0), dev_parts.data() + bh * K * Dh, Dh);
    };
#pragma omp parallel num_threads(team)
    {
        Scratch& mine = scratch[omp_get_thread_num()];
        std::vector<C>&s = mine.s, &dp = mine.dp, &dot = mine.dot, &qe = mine.qe, &g = mine.g;
#pragma omp for schedule(dynamic)
        for (int64_t task = 0; task < BH * groups; ++task) {
            const int64_t bh = task / groups, group = task % groups, b = bh / P.H, h = bh % P.H;
            const T *q = P.queries(bh), *k = P.keys(bh), *v = P.values(bh);
            const T* z = z_all + bh * Lq * Dh;
            const T* dz = dz_all + bh * Lq * Dh;
            const C* lse = lse_all + bh * Lq;
            C* dq = groups > 1 ? dq_shares.data() + task * Lq * Dh : dq_all + bh * Lq * Dh;
            C* p_buckets = groups > 1 ? p_shares.data() + task * Lq * K : mine.p_buckets.data();
            C* ds_buckets = groups > 1 ? ds_shares.data() + task * Lq * K : mine.ds_buckets.data();
            C* d_bias = groups > 1 ? d_bias_shares.data() + task * entries : d_bias_all + bh * entries;
            if (d_bias_all) std::fill(d_bias, d_bias + entries, C(0));
            C* dk = dk_all + bh * Lk * Dh;
            C* dv = dv_all + bh * Lk * Dh;
            const C *ek = P.head_table_k(h), *ev = P.head_table_v(h);
            // this group's keys: whole tiles [key_begin, key_end)
            const int64_t key_begin = std::min(Lk, key_tiles * group / groups * kKeyTile);
            const int64_t key_end = std::min(Lk, key_tiles * (group + 1) / groups * kKeyTile);
            for (int64_t i = 0; i < Lq; ++i) {  // D_i = dz_i . z_i
                C total(0);
                for (int64_t d = 0; d < Dh; ++d) total += C(dz[i * Dh + d]) * C(z[i * Dh + d]);
                dot[i] = total;
            }
            const C *q_computed = nullptr, *dz_computed = nullptr;
            if (ek) {
                q_computed = as_computed(q, Lq * Dh, mine.q_wide);
                dz_computed = as_computed(dz, Lq * Dh, mine.dz_wide);
                gemm(false, true, Lq, K, Dh, C(1), q_computed, Dh, ek, Dh, C(0), qe.data(), K);  // QE = Q E_K^T
                gemm(false, true, Lq, K, Dh, C(1), dz_computed, Dh, ev, Dh, C(0), g.data(), K);  // G = dz E_V^T
                std::fill(p_buckets, p_buckets + Lq * K, C(0));
                std::fill(ds_buckets, ds_buckets + Lq * K, C(0));
            }
            std::fill(dq, dq + Lq * Dh, C(0));
            std::fill(dk + key_begin * Dh, dk + key_end * Dh, C(0));
            std::fill(dv + key_begin * Dh, dv + key_end * Dh, C(0));
            for (int64_t j0 = key_begin; j0 < key_end; j0 += kKeyTile) {
                const int64_t j1 = std::min(key_end, j0 + kKeyTile), cols = j1 - j0;
                for (int64_t i0 = 0; i0 < Lq; i0 += kQueryTile) {
                    const int64_t i1 = std::min(Lq, i0 + kQueryTile), rows = i1 - i0;
                    if (!P.tile_visible(i0, i1, j0, j1)) continue;
                    const T* q_t = q + i0 * Dh;
                    const T* dz_t = dz + i0 * Dh;
                    tile_gemm(false, true, rows, cols, Dh, C(1), q_t, Dh, k + j0 * Dh, Dh, C(0), s.data(), cols);
                    tile_gemm(false, true, rows, cols, Dh, C(1), dz_t, Dh, v + j0 * Dh, Dh, C(0), dp.data(), cols);
                    for (int64_t row = 0; row < rows; ++row) {
                        const int64_t i = i0 + row;
                        C* s_row = s.data() + row * cols;
                        C* dp_row = dp.data() + row * cols;
                        if (lse[i] == neg_inf) {  // the row sees no key
                            std::fill(s_row, s_row + cols, C(0));
                            std::fill(dp_row, dp_row + cols, C(0));
                            continue;
                        }
                        P.scores_row(s_row, b, h, i, j0, j1, qe.data() + i * K);
                        exp_sum(s_row, cols, lse[i]);  // s_row is now p
                        P.for_each_run(
                            i, j0, j1,
                            [&](int64_t begin, int64_t end, int64_t bucket) {
                                C p_total(0), ds_total(0);
                                softmax_backward_run(s_row + begin, dp_row + begin, end - begin,
                                                     bucket >= 0 ? g[i * K + bucket] : C(0), dot[i], p_total, ds_total);
                                if (bucket >= 0) {
                                    p_buckets[i * K + bucket] += p_total;
                                    ds_buckets[i * K + bucket] += ds_total;
                                }
                            },
                            [&](int64_t begin, int64_t end, int64_t first) {
                                softmax_backward_diagonal(s_row + begin, dp_row + begin, end - begin,
                                                          g.data() + i * K + first, dot[i], p_buckets + i * K + first,
                                                          ds_buckets + i * K + first);
                            });  // dp_row is now ds
                        if (d_bias_all) accumulate(d_bias + distance_entry(i, j0, Lq), dp_row, cols);
                    }
                    const T* p = as_operand(s.data(), rows * cols, mine.p_rounded);
                    const T* ds = as_operand(dp.data(), rows * cols, mine.ds_rounded);
                    tile_gemm(true, false, cols, Dh, rows, C(1), p, cols, dz_t, Dh, C(1), dv + j0 * Dh, Dh);
                    tile_gemm(true, false, cols, Dh, rows, c, ds, cols, q_t, Dh, C(1), dk + j0 * Dh, Dh);
                    tile_gemm(false, false, rows, Dh, cols, c, ds, cols, k + j0 * Dh, Dh, C(1), dq + i0 * Dh, Dh);
                }
            }
            if (ek && groups == 1) finish(bh, p_buckets, ds_buckets, q_computed, dz_computed);
        }
    }
    if (groups > 1) {  // sum each (batch, head)'s shares in group order, then finish it
#pragma omp parallel for schedule(dynamic) num_threads(team)
        for (int64_t bh = 0; bh < BH; ++bh) {
            Scratch& mine = scratch[omp_get_thread_num()];
            C* dq = dq_all + bh * Lq * Dh;
            std::fill(dq, dq + Lq * Dh, C(0));
            std::fill(mine.p_buckets.begin(), mine.p_buckets.end(), C(0));
            std::fill(mine.ds_buckets.begin(), mine.ds_buckets.end(), C(0));
            if (d_bias_all) std::fill(d_bias_all + bh * entries, d_bias_all + (bh + 1) * entries, C(0));
            for (int64_t group = 0; group < groups; ++group) {
                const int64_t share = bh * groups + group;
                accumulate(dq, dq_shares.data() + share * Lq * Dh, Lq * Dh);
                if (d_bias_all) accumulate(d_bias_all + bh * entries, d_bias_shares.data() + share * entries, entries);
                accumulate(mine.p_buckets.data(), p_shares.data() + share * Lq * K, Lq * K);
                accumulate(mine.ds_buckets.data(), ds_shares.data() + share * Lq * K, Lq * K);
            }
            if (P.relative) {
                finish(bh, mine.p_buckets.data(), mine.ds_buckets.data(),
                       as_computed(P.queries(bh), Lq * Dh, mine.q_wide),
                       as_computed(dz_all + bh * Lq * Dh, Lq * Dh, mine.dz_wide));
            }
        }
    }
    if (!P.relative) return;
    C* dek = device_data<C>(d_table_k);
    C* dev = device_data<C>(d_table_v);
    std::fill(dek, dek + d_table_k.numel(), C(0));
    std::fill(dev, dev + d_table_v.numel(), C(0));
    for (int64_t bh = 0; bh < BH; ++bh) {
        const int64_t table = P.tables_per_head ? bh % P.H : 0;
        for (int64_t e = 0; e < K * Dh; ++e) {
            dek[table * K * Dh + e] += dek_parts[bh * K * Dh + e];
            dev[table * K * Dh + e] += dev_parts[bh * K * Dh + e];
        }
    }
}

}  // namespace

}  // namespace cpu

void CpuBackend::do_fused_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionPattern& pattern,
                                    double scale, const ClippedRelativeTerms& relative, Tensor& z, Tensor& lse) {
    cpu::use_one_blas_thread();
    switch (q.dtype()) {
        case DType::float32: cpu::forward<float>(q, k, v, pattern, scale, relative, z, lse); break;
        case DType::bfloat16: cpu::forward<BFloat16>(q, k, v, pattern, scale, relative, z, lse); break;
        case DType::float16:  // no fast float16 products here: on float32 copies
            cpu::forward<float>(widened(q), widened(k), widened(v), pattern, scale, relative, z, lse);
            break;
        default: cpu::forward<double>(q, k, v, pattern, scale, relative, z, lse);
    }
}

void CpuBackend::do_fused_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& z,
                                             const Tensor& lse, const Tensor& dz, const AttentionPattern& pattern,
                                             double scale, const ClippedRelativeTerms& relative, Tensor& dq, Tensor& dk,
                                             Tensor& dv, Tensor& d_table_k, Tensor& d_table_v,
                                             Tensor& d_distance_bias) {
    cpu::use_one_blas_thread();
    switch (q.dtype()) {
        case DType::float32:
            cpu::backward<float>(q, k, v, z, lse, dz, pattern, scale, relative, dq, dk, dv, d_table_k, d_table_v,
                                 d_distance_bias);
            break;
        case DType::bfloat16:
            cpu::backward<BFloat16>(q, k, v, z, lse, dz, pattern, scale, relative, dq, dk, dv, d_table_k, d_table_v,
                                    d_distance_bias);
            break;
        case DType::float16:  // no fast float16 products here: on float32 copies
            cpu::backward<float>(widened(q), widened(k), widened(v), widened(z), lse, widened(dz), pattern, scale,
                                 relative, dq, dk, dv, d_table_k, d_table_v, d_distance_bias);
            break;
        default:
            cpu::backward<double>(q, k, v, z, lse, dz, pattern, scale, relative, dq, dk, dv, d_table_k, d_table_v,
                                  d_distance_bias);
    }
}

}  // namespace relgrad
