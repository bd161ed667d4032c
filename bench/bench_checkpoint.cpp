// One training step (forward + backward) of a causal language model with and without gradient
// checkpointing: seconds and memory. One setting per run, so that the process's peak RSS is that
// setting's alone.
//
//   build/bench/bench_checkpoint off|on [L B layers dim impl repeats]
//     defaults L=1024 B=4 layers=6 dim=256 (heads dim/32, feed-forward 4 dim) impl=fused repeats=3
//
// Prints one JSON line: the median seconds per step, the peak RSS, and the most tensor storage
// alive at once during the steps (peak live: the allocator's spare blocks not counted).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/ops.hpp"
#include "engine/system.hpp"
#include "layers/transformer.hpp"

using namespace relgrad;

int main(int argc, char** argv) {
    if (argc < 2 || (std::string(argv[1]) != "on" && std::string(argv[1]) != "off")) {
        std::fprintf(stderr, "usage: bench_checkpoint off|on [L B layers dim impl repeats]\n");
        return 2;
    }
    auto arg = [&](int i, int64_t fallback) { return argc > i ? std::stoll(argv[i]) : fallback; };
    try {
        const bool checkpointed = std::string(argv[1]) == "on";
        const int64_t L = arg(2, 1024), B = arg(3, 4), layers = arg(4, 6), dim = arg(5, 256), repeats = arg(7, 3);
        const AttentionImpl impl = parse_attention_impl(argc > 6 ? argv[6] : "fused");
        const int64_t vocab = 256;
        TransformerOptions o;
        o.layers = layers;
        o.dim = dim;
        o.heads = std::max<int64_t>(1, dim / 32);
        o.ff_dim = 4 * dim;
        o.dropout = 0.1;
        o.position = PositionMode::relative;
        o.relative.k_left = o.relative.k_right = 8;
        o.impl = impl;
        o.max_positions = L;
        o.checkpoint = checkpointed;
        Generator gen(1);
        CausalLanguageModel model(vocab, o, Init{gen});
        std::vector<double> ids;
        for (int64_t i = 0; i < B * (L + 1); ++i) ids.push_back(static_cast<double>(gen.next_u64() % vocab));
        const Tensor tokens = from_vector(ids, {B, L + 1}, DType::int64);
        const Tensor inputs = tokens.narrow(1, 0, L), targets = tokens.narrow(1, 1, L).reshape({B * L});
        const std::vector<int64_t> lengths(B, L);
        std::vector<double> seconds;
        for (int64_t r = 0; r < repeats + 1; ++r) {  // the first step warms up
            model.zero_grad();
            model.reseed(static_cast<uint64_t>(r));
            if (r == 1) reset_peak_memory();
            const auto start = std::chrono::steady_clock::now();
            const Tensor logits = model.forward(inputs, lengths);
            cross_entropy(logits.reshape({B * L, vocab}), targets).backward();
            const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            if (r > 0) seconds.push_back(elapsed);
        }
        std::sort(seconds.begin(), seconds.end());
        std::printf(
            "{\"checkpointing\": %s, \"L\": %lld, \"B\": %lld, \"layers\": %lld, \"dim\": %lld, \"impl\": \"%s\", "
            "\"seconds\": %.4f, \"peak_rss_mib\": %.1f, \"peak_live_mib\": %.1f}\n",
            checkpointed ? "true" : "false", (long long)L, (long long)B, (long long)layers, (long long)dim,
            attention_impl_name(impl), seconds[seconds.size() / 2], peak_rss_mib(),
            memory_stats().peak_live_bytes / 1048576.0);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_checkpoint: %s\n", e.what());
        return 2;
    }
    return 0;
}
