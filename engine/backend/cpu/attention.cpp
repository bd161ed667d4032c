// The CPU's attention row kernels (engine/ops/attention.cpp, the bucketed op): softmax and its
// backward over the rows of [B, H, Lq, Lk] scores, with Shaw's bucket terms folded in run by run.
// The fused kernels are in fused_attention.cpp.
#include <algorithm>
#include <limits>
#include <vector>

#include "engine/backend/cpu/attention_rows.hpp"
#include "engine/backend/cpu/cpu_backend.hpp"
#include "engine/backend/kernel_errors.hpp"
#include "engine/errors.hpp"

namespace relgrad {

using namespace cpu;

namespace {

// Row n = (b, h, i) of a contiguous [B, H, Lq, Lk] tensor, with where that row's mask entries
// start (read with a step, as the mask is an expanded view), and the row's relative index as runs:
// r(i, j) takes one value over each run of consecutive j (for Shaw's clipped index: one run left
// of the clipping window, 2k - 1 single keys, one run right of it). A run is [begin, end) with its
// bucket; without an index a row is one run of bucket -1. Over a run the relative terms are
// constants, so the row kernels below stay contiguous SIMD loops. Every bucket is checked against
// the K = `buckets` there are.
struct AttentionRows {
    AttentionRows(const Tensor& scores, const Tensor& index, const Tensor& mask, int64_t buckets)
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
            const int64_t* r = device_data<int64_t>(index) + i * index.strides()[0];
            const int64_t step = index.strides()[1];
            for (int64_t j = 0; j < Lk; ++j) {
                RELGRAD_CHECK(r[j * step] >= 0 && r[j * step] < buckets, bucket_out_of_range(r[j * step], buckets));
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
        return device_data<bool>(mask_) + b * st[0] + h * st[1] + i * st[2];
    }
    int64_t H, Lq, Lk, count;
    int64_t mask_step = 0;

private:
    Tensor mask_;
    std::vector<Run> runs_;
    std::vector<int64_t> first_run_;  // row i's runs are runs_[first_run_[i] .. first_run_[i + 1])
};

}  // namespace

void CpuBackend::do_pattern_mask(bool causal, int64_t window, int64_t query_offset, Tensor& out) {
    const int64_t Lq = out.size(0), Lk = out.size(1);
    bool* visible = device_data<bool>(out);
    for (int64_t i = 0; i < Lq; ++i)
        for (int64_t j = 0; j < Lk; ++j) visible[i * Lk + j] = seen_by_rules(causal, window, j - (query_offset + i));
}

void CpuBackend::do_attention_softmax(Tensor& scores, const Tensor& bucket_scores, const Tensor& index,
                                      const Tensor& mask, double scale, Tensor& bucket_weights) {
    dispatch_floating(scores.dtype(), "attention_softmax", [&](auto tag) {
        using T = decltype(tag);
        const int64_t K = bucket_scores.defined() ? bucket_scores.size(-1) : 0;
        const AttentionRows rows(scores, index, mask, K);
        T* s_all = device_data<T>(scores);
        const T* buckets_all = device_data_or_null<T>(bucket_scores);
        T* weights_all = device_data_or_null<T>(bucket_weights);
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

void CpuBackend::do_attention_softmax_backward(Tensor& grad, const Tensor& weights, const Tensor& d_buckets,
                                               const Tensor& index, double scale, Tensor& d_bucket_scores) {
    dispatch_floating(grad.dtype(), "attention_softmax_backward", [&](auto tag) {
        using T = decltype(tag);
        const int64_t K = d_buckets.defined()         ? d_buckets.size(-1)
                          : d_bucket_scores.defined() ? d_bucket_scores.size(-1)
                                                      : 0;
        const AttentionRows rows(grad, index, Tensor(), K);
        T* g_all = device_data<T>(grad);
        const T* a_all = device_data<T>(weights);
        const T* db_all = device_data_or_null<T>(d_buckets);
        T* d_scores_all = device_data_or_null<T>(d_bucket_scores);
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

}  // namespace relgrad
