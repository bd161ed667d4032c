// Matmul forward + backward through the engine against the same three sgemm calls made directly
// on OpenBLAS (C = A B, dA = G B^T, dB = A^T G), float32, square N x N. The two are timed
// alternately in one run; the figure that matters is the ratio of the medians.
//
//   build/bench/bench_matmul [repeats-at-512] [repeats-at-2048]
//
// And the engine's forward + backward in float32 against bfloat16 and float16 (docs/precision.md),
// for each class of product a training step makes: the projections and the feed-forward's two
// (tokens x D x D, tokens x D x F, tokens x F x D) and attention's per-head products
// (B H of L x Dh x L and L x L x Dh), at the larger bench model's sizes.
//
//   build/bench/bench_matmul 16bit [repeats]
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/ops.hpp"

using namespace relgrad;

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

void bench(int n, int repeats) {
    Generator gen(1);
    Tensor a = randn({n, n}, gen), b = randn({n, n}, gen), g = randn({n, n}, gen);
    a.requires_grad_(true);
    b.requires_grad_(true);
    const float* pa = a.data<float>();
    const float* pb = b.data<float>();
    const float* pg = g.data<float>();
    std::vector<float> c(n * n), da(n * n), db(n * n);

    // Blocks of engine runs and blocks of direct runs, alternating. relgrad runs OpenBLAS
    // single-threaded inside its own threads; the direct calls get OpenBLAS's own threads, as
    // many as relgrad uses, switched on once per block (switching costs a thread wake-up).
    std::vector<double> engine_times, blas_times;
    const int blocks = 4;
    for (int block = 0; block < blocks; ++block) {
        for (int r = 0; r <= repeats / blocks; ++r) {  // the first run of a block warms up
            const auto start = std::chrono::steady_clock::now();
            a.zero_grad();
            b.zero_grad();
            matmul(a, b).backward(g);
            if (r > 0) engine_times.push_back(seconds_since(start));
        }
        openblas_set_num_threads(omp_get_max_threads());
        for (int r = 0; r <= repeats / blocks; ++r) {
            const auto start = std::chrono::steady_clock::now();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, pa, n, pb, n, 0, c.data(), n);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1, pg, n, pb, n, 0, da.data(), n);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, n, n, 1, pa, n, pg, n, 0, db.data(), n);
            if (r > 0) blas_times.push_back(seconds_since(start));
        }
    }
    // the engine's gradients must be the ones BLAS computed, or the timing means nothing
    const std::vector<double> engine_da = a.grad().to_vector();
    double worst = 0;
    for (int i = 0; i < n * n; ++i) worst = std::max(worst, std::abs(engine_da[i] - da[i]) / (1 + std::abs(da[i])));
    const double engine_ms = 1e3 * median(engine_times), blas_ms = 1e3 * median(blas_times);
    const double gflops = 3 * 2.0 * n * n * double(n) / (blas_ms * 1e6);
    std::printf("%6d %8d %12.3f %12.3f %10.3f %+9.1f%% %10.1f %12.1e\n", n, repeats, engine_ms, blas_ms,
                engine_ms / blas_ms, 100 * (engine_ms / blas_ms - 1), gflops, worst);
}

// Median seconds of matmul(a, b).backward(g) in each dtype, blocks of each alternating.
void bench_16_bit(const char* name, const Shape& a_shape, const Shape& b_shape, int repeats) {
    Generator gen(2);
    const Tensor a = randn(a_shape, gen), b = randn(b_shape, gen);
    const Tensor g = randn(matmul(a, b).shape(), gen);
    const DType dtypes[] = {DType::float32, DType::bfloat16, DType::float16};
    std::vector<double> times[3];
    for (int block = 0; block < 4; ++block) {
        for (int d = 0; d < 3; ++d) {
            Tensor x = a.to(dtypes[d]).detach().requires_grad_(true), y = b.to(dtypes[d]).detach().requires_grad_(true);
            const Tensor dz = g.to(dtypes[d]);
            for (int r = 0; r <= repeats / 4; ++r) {  // the first run of a block warms up
                const auto start = std::chrono::steady_clock::now();
                x.zero_grad();
                y.zero_grad();
                matmul(x, y).backward(dz);
                if (r > 0) times[d].push_back(seconds_since(start));
            }
        }
    }
    const double f32 = 1e3 * median(times[0]), bf16 = 1e3 * median(times[1]), f16 = 1e3 * median(times[2]);
    std::printf("%-34s %10.3f %10.3f %10.3f %10.2f %10.2f\n", name, f32, bf16, f16, f32 / bf16, f32 / f16);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc > 1 && std::string(argv[1]) == "16bit") {
        const int repeats = argc > 2 ? std::atoi(argv[2]) : 20;
        if (repeats < 4) {
            std::fprintf(stderr, "bench_matmul: repeats must be an integer >= 4\n");
            return 2;
        }
        const int64_t T = 32 * 96, D = 256, F = 1024, BH = 32 * 8, L = 96, Dh = 32;  // batch 32, L ~ 96
        std::printf("matmul forward+backward, median ms of %d (threads: %d); speed-up = float32 ms / 16-bit ms\n",
                    repeats, omp_get_max_threads());
        std::printf("%-34s %10s %10s %10s %10s %10s\n", "product", "float32", "bfloat16", "float16", "bf16 x", "f16 x");
        bench_16_bit("projection [3072,256] [256,256]", {T, D}, {D, D}, repeats);
        bench_16_bit("feed-forward 1 [3072,256] [256,1024]", {T, D}, {D, F}, repeats);
        bench_16_bit("feed-forward 2 [3072,1024] [1024,256]", {T, F}, {F, D}, repeats);
        bench_16_bit("scores 256 x [96,32] [32,96]", {BH, L, Dh}, {BH, Dh, L}, repeats);
        bench_16_bit("values 256 x [96,96] [96,32]", {BH, L, L}, {BH, L, Dh}, repeats);
        return 0;
    }
    const int repeats_small = argc > 1 ? std::atoi(argv[1]) : 40;
    const int repeats_large = argc > 2 ? std::atoi(argv[2]) : 8;
    if (repeats_small < 4 || repeats_large < 4) {
        std::fprintf(stderr, "bench_matmul: repeats must be integers >= 4\n");
        return 2;
    }
    std::printf("matmul forward+backward, float32, median of repeats (threads: %d)\n", omp_get_max_threads());
    std::printf("%6s %8s %12s %12s %10s %10s %10s %12s\n", "N", "repeats", "engine ms", "openblas ms", "ratio",
                "overhead", "GFLOP/s", "max rel diff");
    bench(512, repeats_small);
    bench(2048, repeats_large);
    return 0;
}
