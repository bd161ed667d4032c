// Matmul forward + backward through the engine against the same three sgemm calls made directly
// on OpenBLAS (C = A B, dA = G B^T, dB = A^T G), float32, square N x N. The two are timed
// alternately in one run; the figure that matters is the ratio of the medians.
//
//   build/bench/bench_matmul [repeats-at-512] [repeats-at-2048]
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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

}  // namespace

int main(int argc, char** argv) {
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
