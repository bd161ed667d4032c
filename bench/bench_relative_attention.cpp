// Relative multi-head attention forward + backward, one implementation and one length per run,
// so that the process's peak RSS belongs to that configuration alone.
//
//   build/bench/bench_relative_attention IMPL L [B D H k repeats window part]
//     IMPL: reference | bucketed | fused; defaults B=8 D=256 H=8 k=8 repeats=5 window=-1 (none),
//     part=layer, float32; a window w >= 0 lets each query see the keys within w positions (the
//     layer's rule); part=core times the attention alone: from q, k, v [B, H, L, D/H] to z, without
//     the four projections and the head split and merge, which all three forms share
//
// Prints one JSON line: the median seconds per forward+backward, the peak RSS of the process, the
// RSS before the first forward (so peak - baseline is what the attention itself needed), and the
// most tensor storage alive at once (the allocator's spare blocks not counted). A configuration
// that does not fit in memory prints {"error": "out of memory"} and exits with 3.
//
//   build/bench/bench_relative_attention sgemm [N]
//     the engine's float32 matmul rate at N x N x N (default 2048), in GFLOP/s, median of 5
//
//   build/bench/bench_relative_attention floor L [B D H]
//     the least time the fused kernel's forward + backward (no mask, float32) can take on this
//     machine, whatever its row work: its seven products per tile (the forward's Q K^T and P V, the
//     backward's Q K^T again, dZ V^T, P^T dZ, dS^T Q and dS K) timed at the tiles' own shapes
//     through the CPU's gemm on one thread, and the exponentials it takes (each score once in the
//     forward and once in the backward) timed through its exp_sum row kernel; the sum over the
//     B H (batch, head) pairs, divided by the threads as if they shared it perfectly
//
//   build/bench/bench_relative_attention family L [B D H repeats]
//     the relative family beside the fused kernel without position terms (float32, no mask, median
//     seconds of forward + backward): the kernel alone (fused_attention from q, k, v) with no terms,
//     with ALiBi's bias and with T5's bias by distance; the whole fused layer (projections
//     included) without position terms, with RoPE, ALiBi and T5; and the rope op alone on q and k
//     (forward + backward), as a share of the RoPE layer's time; each the median of `repeats` rounds
//     that run all eight in turn. One JSON line.
// bench/relative_attention.py runs these for every configuration next to the PyTorch versions.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <omp.h>

#include "engine/backend/cpu/attention_rows.hpp"
#include "engine/backend/cpu/cpu_backend.hpp"
#include "engine/ops.hpp"
#include "engine/system.hpp"
#include "layers/attention.hpp"

using namespace relgrad;

namespace {

double current_rss_mib() {
    std::ifstream statm("/proc/self/statm");
    long pages_total = 0, pages_resident = 0;
    statm >> pages_total >> pages_resident;
    return pages_resident * 4096.0 / (1024 * 1024);
}

int sgemm_rate(int64_t n) {
    Generator gen(1);
    const Tensor a = randn({n, n}, gen), b = randn({n, n}, gen);
    std::vector<double> seconds;
    for (int r = 0; r < 6; ++r) {
        const auto start = std::chrono::steady_clock::now();
        const Tensor c = matmul(a, b);
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (r > 0) seconds.push_back(elapsed);
    }
    std::sort(seconds.begin(), seconds.end());
    const double gflops = 2.0 * n * n * n / seconds[seconds.size() / 2] / 1e9;
    std::printf("{\"sgemm_n\": %lld, \"gflop_per_second\": %.1f}\n", (long long)n, gflops);
    return 0;
}

// The median seconds of one call of run, over 5 rounds of `calls` calls.
template <class Run>
double seconds_per_call(int calls, Run&& run) {
    std::vector<double> rounds;
    for (int round = 0; round < 6; ++round) {  // the first round warms up
        const auto start = std::chrono::steady_clock::now();
        for (int c = 0; c < calls; ++c) run();
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (round > 0) rounds.push_back(elapsed / calls);
    }
    std::sort(rounds.begin(), rounds.end());
    return rounds[rounds.size() / 2];
}

int fused_floor(int64_t L, int64_t B, int64_t D, int64_t H) {
    using cpu::kKeyTile;
    using cpu::kQueryTile;
    const int64_t Dh = D / H;
    cpu::use_one_blas_thread();
    // operands and result big enough for every product of a tile (each of its matrices is at most
    // kKeyTile x max(Dh, kQueryTile)), the values immaterial to the time
    const int64_t biggest = kKeyTile * std::max(Dh, kQueryTile);
    std::vector<float> a(biggest, 0.5f), b(biggest, 0.25f), c(biggest, 0.0f);
    auto product = [&](bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K) {
        const int64_t lda = trans_a ? M : K, ldb = trans_b ? K : N;
        return seconds_per_call(200, [&] {
            cpu::gemm<float>(trans_a, trans_b, M, N, K, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), N);
        });
    };
    // a tile's seven products, timed once per tile shape (at most four shapes: the last tile of
    // each direction may be shorter): S = Q K^T (forward, backward) and dP = dZ V^T, [rows, cols]
    // from Dh; P V and dQ = dS K, [rows, Dh] from cols; dV = P^T dZ and dK = dS^T Q, [cols, Dh]
    // from rows
    std::map<std::pair<int64_t, int64_t>, double> tile_seconds;
    double product_seconds = 0, flops = 0;
    for (int64_t i0 = 0; i0 < L; i0 += kQueryTile) {
        for (int64_t j0 = 0; j0 < L; j0 += kKeyTile) {
            const int64_t rows = std::min(kQueryTile, L - i0), cols = std::min(kKeyTile, L - j0);
            auto timed = tile_seconds.find({rows, cols});
            if (timed == tile_seconds.end()) {
                const double seconds = 3 * product(false, true, rows, cols, Dh) +
                                       2 * product(false, false, rows, Dh, cols) +
                                       2 * product(true, false, cols, Dh, rows);
                timed = tile_seconds.emplace(std::make_pair(rows, cols), seconds).first;
            }
            product_seconds += timed->second;
            flops += 7.0 * 2 * rows * cols * Dh;
        }
    }
    // the exponentials: rows of a key tile's length, 2 L^2 elements per (batch, head); exp_sum works
    // in place, and exp(s - 1) keeps every s in (0, 1] from one call to the next
    const int64_t row = std::min(kKeyTile, L);
    std::vector<float> scores(row);
    for (int64_t j = 0; j < row; ++j) scores[j] = -0.01f * static_cast<float>(j);
    float sink = 0;
    const double exp_seconds =
        seconds_per_call(20000, [&] { sink += cpu::exp_sum(scores.data(), row, 1.0f); }) * (2.0 * L * L / row);
    const double pairs_per_thread = static_cast<double>(B * H) / omp_get_max_threads();
    std::printf(
        "{\"L\": %lld, \"B\": %lld, \"D\": %lld, \"H\": %lld, \"threads\": %d, \"product_seconds\": %.6f, "
        "\"product_gflop_per_second\": %.1f, \"exp_seconds\": %.6f, \"floor_seconds\": %.6f}\n",
        (long long)L, (long long)B, (long long)D, (long long)H, omp_get_max_threads(),
        product_seconds * pairs_per_thread, flops / product_seconds / 1e9, exp_seconds * pairs_per_thread,
        (product_seconds + exp_seconds) * pairs_per_thread);
    if (!(sink > 0)) std::fprintf(stderr, "bench_relative_attention floor: exp_sum gave no positive sum\n");
    return 0;
}

// The layer's attention alone (attend: q, k, v -> z), for part=core.
struct AttentionCore : RelativeMultiHeadAttention {
    using RelativeMultiHeadAttention::attend;
    using RelativeMultiHeadAttention::RelativeMultiHeadAttention;
};

// The fused layer without position terms: multi-head attention through fused_attention.
struct PlainFusedAttention : MultiHeadAttention {
    using MultiHeadAttention::MultiHeadAttention;
    Tensor attend(const Tensor&, const Tensor& q, const Tensor& k, const Tensor& v,
                  const AttentionPattern& pattern) override {
        return fused_attention(q, k, v, pattern, scale());
    }
};

// The median seconds of each step over `repeats` rounds after one to warm up; a round runs every
// step once, in turn, so that a machine's load drifting over the run weighs on all of them alike.
std::vector<double> interleaved_medians(int64_t repeats, const std::vector<std::function<void()>>& steps) {
    std::vector<std::vector<double>> seconds(steps.size());
    for (int64_t r = 0; r < repeats + 1; ++r) {
        for (std::size_t n = 0; n < steps.size(); ++n) {
            const auto start = std::chrono::steady_clock::now();
            steps[n]();
            const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            if (r > 0) seconds[n].push_back(elapsed);
        }
    }
    std::vector<double> medians;
    for (std::vector<double>& s : seconds) {
        std::sort(s.begin(), s.end());
        medians.push_back(s[s.size() / 2]);
    }
    return medians;
}

int family(int64_t L, int64_t B, int64_t D, int64_t H, int64_t repeats) {
    Generator gen(1);
    const int64_t Dh = D / H;
    const Tensor q = randn({B, H, L, Dh}, gen).requires_grad_(true), k = randn({B, H, L, Dh}, gen).requires_grad_(true),
                 v = randn({B, H, L, Dh}, gen).requires_grad_(true), dz = randn({B, H, L, Dh}, gen);
    const double scale = 1 / std::sqrt(static_cast<double>(Dh));
    // ALiBi's row is a constant; T5's is looked up from a learned table, so its gradient is formed
    std::vector<double> alibi_row(H * (2 * L - 1));
    const std::vector<double> slopes = alibi_slopes(H);
    for (int64_t h = 0; h < H; ++h)
        for (int64_t e = 0; e < 2 * L - 1; ++e) alibi_row[h * (2 * L - 1) + e] = -slopes[h] * std::abs(e - (L - 1));
    const Tensor alibi = from_vector(alibi_row, {H, 2 * L - 1}, DType::float32);
    const Tensor t5 = randn({H, 2 * L - 1}, gen).requires_grad_(true);
    auto kernel = [&](const Tensor& bias) {
        return [&, bias] {
            ClippedRelativeTerms terms;
            terms.distance_bias = bias;
            fused_attention(q, k, v, AttentionPattern{}, scale, terms).backward(dz);
        };
    };
    const Init init{gen};
    PlainFusedAttention plain(D, H, init);
    RotaryMultiHeadAttention rotary(D, H, 10000, AttentionImpl::fused, init);
    AlibiAttention alibi_layer(D, H, AttentionImpl::fused, init);
    T5BiasAttention t5_layer(D, H, RelativeFamilyOptions{}, true, AttentionImpl::fused, init);
    const Tensor x = randn({B, L, D}, gen).requires_grad_(true), dy = randn({B, L, D}, gen);
    auto layer = [&](MultiHeadAttention& m) { return [&] { m.forward(x, x).backward(dy); }; };
    const std::vector<double> t =
        interleaved_medians(repeats, {kernel(Tensor()), kernel(alibi), kernel(t5), layer(plain), layer(rotary),
                                      layer(alibi_layer), layer(t5_layer), [&] {
                                          rope(q, 0).backward(dz);
                                          rope(k, 0).backward(dz);
                                      }});
    const double kernel_none = t[0], kernel_alibi = t[1], kernel_t5 = t[2], layer_none = t[3], layer_rope = t[4],
                 layer_alibi = t[5], layer_t5 = t[6], rope_alone = t[7];
    std::printf(
        "{\"L\": %lld, \"B\": %lld, \"D\": %lld, \"H\": %lld, \"kernel_none\": %.6f, \"kernel_alibi\": %.6f, "
        "\"kernel_t5\": %.6f, \"layer_none\": %.6f, \"layer_rope\": %.6f, \"layer_alibi\": %.6f, \"layer_t5\": %.6f, "
        "\"rope_alone\": %.6f, \"alibi_over_none\": %.3f, \"t5_over_none\": %.3f, \"rope_share\": %.4f}\n",
        (long long)L, (long long)B, (long long)D, (long long)H, kernel_none, kernel_alibi, kernel_t5, layer_none,
        layer_rope, layer_alibi, layer_t5, rope_alone, kernel_alibi / kernel_none, kernel_t5 / kernel_none,
        rope_alone / layer_rope);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2 || (argc < 3 && std::string(argv[1]) != "sgemm")) {
        std::fprintf(stderr,
                     "usage: bench_relative_attention reference|bucketed|fused L [B D H k repeats window part]\n"
                     "       bench_relative_attention sgemm [N]\n"
                     "       bench_relative_attention floor L [B D H]\n"
                     "       bench_relative_attention family L [B D H repeats]\n");
        return 2;
    }
    auto arg = [&](int i, int64_t fallback) { return argc > i ? std::stoll(argv[i]) : fallback; };
    if (std::string(argv[1]) == "sgemm") return sgemm_rate(arg(2, 2048));
    if (std::string(argv[1]) == "floor") {
        const int64_t L = arg(2, 0), B = arg(3, 8), D = arg(4, 256), H = arg(5, 8);
        if (L <= 0 || B <= 0 || H <= 0 || D <= 0 || D % H != 0) {
            std::fprintf(stderr, "bench_relative_attention floor: L, B, D and H must be positive and H divide D\n");
            return 2;
        }
        return fused_floor(L, B, D, H);
    }
    if (std::string(argv[1]) == "family") {
        const int64_t L = arg(2, 0), B = arg(3, 8), D = arg(4, 256), H = arg(5, 8), repeats = arg(6, 5);
        if (L <= 0 || B <= 0 || H <= 0 || D <= 0 || D % H != 0 || (D / H) % 2 != 0 || repeats <= 0) {
            std::fprintf(stderr,
                         "bench_relative_attention family: L, B, D, H and repeats must be positive, H divide D "
                         "and D / H be even\n");
            return 2;
        }
        return family(L, B, D, H, repeats);
    }
    try {
        const AttentionImpl impl = parse_attention_impl(argv[1]);
        const int64_t L = arg(2, 0), B = arg(3, 8), D = arg(4, 256), H = arg(5, 8), k = arg(6, 8), repeats = arg(7, 5),
                      window = arg(8, -1);
        if (L <= 0 || repeats <= 0) throw std::invalid_argument("L and repeats must be positive");
        if (window < -1) throw std::invalid_argument("window must be >= 0, or -1 for none");
        const std::string part = argc > 9 ? argv[9] : "layer";
        if (part != "layer" && part != "core") throw std::invalid_argument("part must be layer or core");
        Generator gen(1);
        RelativeOptions options;
        options.k_left = options.k_right = k;
        AttentionCore attention(D, H, options, impl, Init{gen});
        attention.window = window;
        const bool core = part == "core";
        const int64_t Dh = D / H;
        Tensor x = randn({B, L, D}, gen).requires_grad_(true), q, k_in, v;  // q, k, v: part=core only
        if (core) {
            for (Tensor* t : {&q, &k_in, &v}) *t = randn({B, H, L, Dh}, gen).requires_grad_(true);
        }
        const Tensor dy = core ? randn({B, H, L, Dh}, gen) : randn({B, L, D}, gen);
        const double baseline = current_rss_mib();
        reset_peak_memory();
        std::vector<double> seconds;
        for (int64_t r = 0; r < repeats + 1; ++r) {  // the first round warms up
            attention.zero_grad();
            for (Tensor* t : {&x, &q, &k_in, &v})
                if (t->defined()) t->zero_grad();
            const auto start = std::chrono::steady_clock::now();
            if (core) {
                attention.attend(x, q, k_in, v, AttentionPattern{Tensor(), false, window, 0}).backward(dy);
            } else {
                attention.forward(x, x).backward(dy);
            }
            const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            if (r > 0) seconds.push_back(elapsed);
        }
        std::sort(seconds.begin(), seconds.end());
        std::printf(
            "{\"impl\": \"%s\", \"part\": \"%s\", \"L\": %lld, \"B\": %lld, \"D\": %lld, \"H\": %lld, "
            "\"k\": %lld, \"window\": %lld, \"seconds\": %.6f, \"peak_rss_mib\": %.1f, \"baseline_rss_mib\": %.1f, "
            "\"peak_live_mib\": %.1f}\n",
            argv[1], part.c_str(), (long long)L, (long long)B, (long long)D, (long long)H, (long long)k,
            (long long)window, seconds[seconds.size() / 2], peak_rss_mib(), baseline,
            memory_stats().peak_live_bytes / 1048576.0);
    } catch (const std::bad_alloc&) {
        std::printf("{\"error\": \"out of memory\"}\n");
        return 3;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_relative_attention: %s\n", e.what());
        return 2;
    }
    return 0;
}
