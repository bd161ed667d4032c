// The fused relative attention on the GPU, forward + backward: q, k, v [B, H, L, Dh] and Shaw's two
// tables [1, 2k + 1, Dh] to z and all five gradients (the fused_attention op, run on the cuda
// device); or, with --plain, attention without relative terms (what FlashAttention-2 computes).
//
//   build/bench/bench_cuda_attention [--dtype float32|bfloat16|float16] [--plain]
//                                    [B D H k repeats budget_seconds L...]
//     defaults float32, B=8 D=512 H=8 k=16 repeats=3 budget=60, L = 512 1024 ... 65536
//
// One JSON line per L: the median seconds per forward + backward (after one warm-up round), the
// rate against the matmul FLOP count, and the device memory the step needed (the most tensor
// storage alive at once). The FLOP count is that of the seven L x L x Dh products a flash-style
// forward + backward does (forward: Q K^T and P V; backward: Q K^T again, dZ V^T, P^T dZ, dS K
// and dS^T Q), 2 L^2 Dh each per (batch, head): 14 B H L^2 Dh. An L whose time, extrapolated as
// L^2 from the one before, would pass the budget is not run ({"skipped": ...}); one that does not
// fit in device memory prints {"error": "out of memory"}.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/enum_names.hpp"
#include "engine/ops.hpp"

using namespace relgrad;

int main(int argc, char** argv) {
    try {
        DType dtype = DType::float32;
        bool relative_terms = true;
        std::vector<std::string> numbers;
        for (int i = 1; i < argc; ++i) {
            const std::string a = argv[i];
            if (a == "--dtype" && i + 1 < argc) {
                dtype = parse_named(floating_dtype_names, argv[++i], "dtype");
            } else if (a == "--plain") {
                relative_terms = false;
            } else if (a.rfind("--", 0) == 0) {
                throw std::invalid_argument("unknown option '" + a + "' (--dtype takes a dtype after it)");
            } else {
                numbers.push_back(a);
            }
        }
        const auto whole = [](const std::string& text) {
            std::size_t used = 0;
            const int64_t value = [&] {
                try {
                    return static_cast<int64_t>(std::stoll(text, &used));
                } catch (const std::exception&) {
                    return int64_t{0};
                }
            }();
            if (used == 0 || used != text.size()) throw std::invalid_argument("'" + text + "' is not a whole number");
            return value;
        };
        auto arg = [&](std::size_t i, int64_t fallback) { return numbers.size() > i ? whole(numbers[i]) : fallback; };
        const int64_t B = arg(0, 8), D = arg(1, 512), H = arg(2, 8), k = arg(3, 16), repeats = arg(4, 3);
        const double budget = static_cast<double>(arg(5, 60));
        std::vector<int64_t> lengths;
        for (std::size_t i = 6; i < numbers.size(); ++i) lengths.push_back(whole(numbers[i]));
        if (lengths.empty()) lengths = {512, 1024, 2048, 4096, 8192, 16384, 32768, 65536};
        const bool lengths_positive = std::all_of(lengths.begin(), lengths.end(), [](int64_t L) { return L > 0; });
        if (B <= 0 || D <= 0 || H <= 0 || D % H != 0 || k < 0 || repeats <= 0 || !lengths_positive) {
            throw std::invalid_argument("B, D, H, repeats and every L must be positive, H must divide D, k >= 0");
        }
        const int64_t Dh = D / H, K = 2 * k + 1;
        double previous_seconds = 0;
        int64_t previous_L = 0;
        for (const int64_t L : lengths) {
            const double flops = 14.0 * B * H * static_cast<double>(L) * L * Dh;
            const double predicted =
                previous_L ? previous_seconds * (double(L) / previous_L) * (double(L) / previous_L) : 0;
            if (predicted * (repeats + 1) > budget) {
                std::printf("{\"L\": %lld, \"skipped\": \"predicted %.1f s per step, over the %.0f s budget\"}\n",
                            (long long)L, predicted, budget);
                std::fflush(stdout);
                continue;
            }
            try {
                Generator gen(1);
                std::vector<Tensor> inputs;
                for (int n = 0; n < 3; ++n) inputs.push_back(randn({B, H, L, Dh}, gen).to(dtype).to(Device::cuda));
                if (relative_terms) {
                    for (int n = 0; n < 2; ++n) inputs.push_back(randn({1, K, Dh}, gen).to(dtype).to(Device::cuda));
                }
                for (Tensor& t : inputs) t.requires_grad_(true);
                const Tensor dz = randn({B, H, L, Dh}, gen).to(dtype).to(Device::cuda);
                const ClippedRelativeTerms relative =
                    relative_terms ? ClippedRelativeTerms{inputs[3], inputs[4], k, k} : ClippedRelativeTerms{};
                const double scale = 1.0 / std::sqrt(static_cast<double>(Dh));
                reset_peak_memory(Device::cuda);
                const int64_t before = memory_stats(Device::cuda).live_bytes;
                std::vector<double> seconds;
                for (int64_t r = 0; r < repeats + 1; ++r) {  // the first round warms up
                    for (Tensor& t : inputs) t.zero_grad();
                    const auto start = std::chrono::steady_clock::now();
                    fused_attention(inputs[0], inputs[1], inputs[2], AttentionPattern{}, scale, relative).backward(dz);
                    sum(inputs[0].grad()).item();  // waits for the GPU
                    const double elapsed =
                        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
                    if (r > 0) seconds.push_back(elapsed);
                }
                std::sort(seconds.begin(), seconds.end());
                const double median = seconds[seconds.size() / 2];
                std::printf(
                    "{\"L\": %lld, \"B\": %lld, \"D\": %lld, \"H\": %lld, \"k\": %lld, \"dtype\": \"%s\", "
                    "\"relative\": %s, \"seconds\": %.6f, \"tflop_per_second\": %.2f, \"step_mib\": %.1f, "
                    "\"inputs_mib\": %.1f}\n",
                    (long long)L, (long long)B, (long long)D, (long long)H, (long long)k, dtype_name(dtype),
                    relative_terms ? "true" : "false", median, flops / median / 1e12,
                    (memory_stats(Device::cuda).peak_live_bytes - before) / 1048576.0, before / 1048576.0);
                std::fflush(stdout);
                previous_seconds = median;
                previous_L = L;
            } catch (const std::bad_alloc&) {
                std::printf("{\"L\": %lld, \"error\": \"out of memory\"}\n", (long long)L);
                std::fflush(stdout);
            }
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_cuda_attention: %s\n", e.what());
        return 2;
    }
    return 0;
}
