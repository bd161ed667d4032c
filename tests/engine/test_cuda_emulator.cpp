// The emulator of CUDA's execution model (engine/backend/cuda/emulator.hpp) that runs the CUDA
// backend's kernels in the test build: indices, shared memory and barriers behave as on a GPU, and
// a kernel with a barrier removed or with a race gives wrong answers here. Then the backend's
// kernels on the emulated cuda device against the CPU's, on the shapes the op tests do not reach.
// No gradient check here: this file tests the execution model and kernel values, not an op's
// derivative; every op's and layer's gradient check runs on this device in its own test
// (tests/engine/check.hpp, tests/layers/layer_check.hpp).
#include <doctest/doctest.h>

#include <cmath>
#include <set>
#include <vector>

#include "engine/backend/cuda/cuda_backend.hpp"
#include "engine/ops.hpp"

namespace {

using relgrad::cuda_emulated::launch;

// --- kernels written for the tests, as CUDA kernels

// ids[global thread] = (thread, block) coordinates packed into one number
__global__ void write_indices(int64_t* ids) {
    const int64_t block = (int64_t{blockIdx.z} * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    const int64_t thread = (int64_t{threadIdx.z} * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    const int64_t threads = int64_t{blockDim.x} * blockDim.y * blockDim.z;
    ids[block * threads + thread] = threadIdx.x + 10 * threadIdx.y + 100 * threadIdx.z + 1000 * blockIdx.x +
                                    10000 * blockIdx.y + 100000 * blockIdx.z;
}

// sums[block] = sum of x over the block's 64 elements, by a tree in shared memory. With
// `skip_barrier` the barrier after each step of the tree is left out: a thread then reads a
// partial sum that another thread has not written yet, or has already overwritten.
template <bool skip_barrier>
__global__ void block_sums(const double* x, double* sums) {
    RELGRAD_SHARED(double, partial, 64);
    const unsigned t = threadIdx.x;
    partial[t] = x[blockIdx.x * 64 + t];
    __syncthreads();
    for (unsigned half = 32; half > 0; half /= 2) {
        if (t < half) partial[t] += partial[t + half];
        if (!skip_barrier) __syncthreads();
    }
    if (t == 0) sums[blockIdx.x] = partial[0];
}

// out[t] = x[t + 1] (wrapping), through shared memory: each thread writes its element, then reads
// its neighbour's. Without the barrier in between that is a race.
template <bool with_barrier>
__global__ void shift_left(const double* x, double* out) {
    RELGRAD_SHARED(double, tile, 32);
    const unsigned t = threadIdx.x;
    tile[t] = x[t];
    if (with_barrier) __syncthreads();
    out[t] = tile[(t + 1) % 32];
}

// a barrier inside a branch that only half of the block takes
__global__ void divergent_barrier(double* out) {
    if (threadIdx.x < 16) __syncthreads();
    out[threadIdx.x] = 1;
}

// out[t] = dynamic shared memory as the block found it, then written and read back reversed
__global__ void dynamic_shared(double* before, double* after) {
    RELGRAD_DYNAMIC_SHARED(double, tile);
    const unsigned t = threadIdx.x;
    before[t] = tile[t];
    __syncthreads();
    tile[t] = t;
    __syncthreads();
    after[t] = tile[blockDim.x - 1 - t];
}

// --- warps

constexpr unsigned kFullMask = 0xffffffffu;

// out[t] = the sum of x over t's warp, by a butterfly of shuffles: every lane ends with the sum
__global__ void warp_sums_xor(const double* x, double* out) {
    const unsigned t = threadIdx.x;
    double v = x[t];
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
    out[t] = v;
}

// out[t] = the inclusive prefix sum of x over t's warp (shuffles up), then lane 5's sum broadcast
// to out[64 + t] and the warp's total gathered down to its lane 0 in out[128 + t]
__global__ void warp_scan_broadcast_down(const double* x, double* out) {
    const unsigned t = threadIdx.x, lane = t % 32;
    double v = x[t];
    for (unsigned delta = 1; delta < 32; delta *= 2) {
        const double below = __shfl_up_sync(kFullMask, v, delta);
        if (lane >= delta) v += below;
    }
    out[t] = v;
    out[64 + t] = __shfl_sync(kFullMask, v, 5);
    double total = x[t];
    for (unsigned delta = 16; delta > 0; delta /= 2) total += __shfl_down_sync(kFullMask, total, delta);
    out[128 + t] = total;
}

// the mistakes: half a warp skips a shuffle the whole mask must join; a lane reads a lane outside
// the mask; two halves of a warp call with masks that disagree
__global__ void half_warp_skips_shuffle(double* out) {
    double v = threadIdx.x;
    if (threadIdx.x < 16) v = __shfl_xor_sync(kFullMask, v, 1);
    out[threadIdx.x] = v;
}
__global__ void reads_outside_mask(double* out) {
    double v = threadIdx.x;
    if (threadIdx.x < 16) v = __shfl_xor_sync(0x0000ffffu, v, 16);
    out[threadIdx.x] = v;
}
__global__ void masks_disagree(double* out) {
    double v = threadIdx.x;
    v = __shfl_xor_sync(threadIdx.x < 16 ? kFullMask : 0xffff0000u, v, 1);
    out[threadIdx.x] = v;
}

// out[t] = x[t + 1 within the warp], through shared memory: without __syncwarp between the write
// and the read, a lane may read its neighbour's slot before the neighbour wrote it
template <bool with_syncwarp>
__global__ void warp_shift_left(const double* x, double* out) {
    RELGRAD_SHARED(double, tile, 32);
    const unsigned lane = threadIdx.x;
    tile[lane] = x[lane];
    if (with_syncwarp) __syncwarp();
    out[lane] = tile[(lane + 1) % 32];
}

std::vector<double> iota(int n) {
    std::vector<double> v(n);
    for (int i = 0; i < n; ++i) v[i] = 1.0 + 0.5 * i + 0.001 * i * i;
    return v;
}

}  // namespace

TEST_CASE("every thread of a 3-d grid of 3-d blocks runs once with its own indices") {
    const dim3 grid(3, 2, 2), block(4, 2, 3);
    std::vector<int64_t> ids(12 * 24, -1);
    launch("write_indices", write_indices, grid, block, 0, ids.data());
    std::set<int64_t> seen(ids.begin(), ids.end());
    CHECK(seen.size() == ids.size());  // all distinct, none left at -1
    CHECK(seen.count(-1) == 0);
    // the last thread of the last block
    CHECK(ids.back() == 3 + 10 * 1 + 100 * 2 + 1000 * 2 + 10000 * 1 + 100000 * 1);
}

TEST_CASE("a shared-memory reduction is right with its barriers, and wrong with one removed") {
    const int blocks = 16;
    const std::vector<double> x = iota(64 * blocks);
    // the kernel's tree on the host: halves added pairwise, 32 + 16 + ... + 1
    std::vector<double> expected(blocks), sums(blocks);
    for (int b = 0; b < blocks; ++b) {
        std::vector<double> partial(x.begin() + b * 64, x.begin() + (b + 1) * 64);
        for (int half = 32; half > 0; half /= 2)
            for (int t = 0; t < half; ++t) partial[t] += partial[t + half];
        expected[b] = partial[0];
    }
    // the tree adds in one order whatever order the threads run in: equal to the last bit
    for (uint64_t seed : {1, 2, 3}) {
        relgrad::cuda_emulator::set_seed(seed);
        launch("block_sums", block_sums<false>, blocks, 64, 0, x.data(), sums.data());
        for (int b = 0; b < blocks; ++b) CHECK(sums[b] == expected[b]);
    }
    // without the barrier some block sums are wrong, under every seed tried
    for (uint64_t seed : {1, 2, 3}) {
        relgrad::cuda_emulator::set_seed(seed);
        launch("block_sums", block_sums<true>, blocks, 64, 0, x.data(), sums.data());
        int wrong = 0;
        for (int b = 0; b < blocks; ++b) wrong += sums[b] != expected[b];
        CHECK_MESSAGE(wrong > 0, "seed " << seed << ": the missing barrier went unnoticed");
    }
}

TEST_CASE("a race on shared memory gives wrong answers, and the barrier fixes it") {
    const std::vector<double> x = iota(32);
    std::vector<double> out(32);
    launch("shift_left", shift_left<true>, 1, 32, 0, x.data(), out.data());
    for (int t = 0; t < 32; ++t) CHECK(out[t] == x[(t + 1) % 32]);
    for (uint64_t seed : {1, 2, 3}) {
        relgrad::cuda_emulator::set_seed(seed);
        launch("shift_left", shift_left<false>, 1, 32, 0, x.data(), out.data());
        int wrong = 0;
        for (int t = 0; t < 32; ++t) wrong += out[t] != x[(t + 1) % 32];
        // a thread reads its neighbour before the neighbour runs in about half of the orders
        CHECK_MESSAGE(wrong > 4, "seed " << seed << ": the race gave " << wrong << " wrong elements");
    }
}

TEST_CASE("the order of the threads changes from one barrier to the next and between launches") {
    // each thread appends its index to a log at each of three phases
    static std::vector<unsigned> log;
    auto logger = +[](int phases) {
        for (int p = 0; p < phases; ++p) {
            log.push_back(threadIdx.x);
            __syncthreads();
        }
    };
    log.clear();
    launch("logger", logger, 1, 16, 0, 3);
    REQUIRE(log.size() == 48);
    const std::vector<unsigned> first(log.begin(), log.begin() + 16), second(log.begin() + 16, log.begin() + 32);
    CHECK(std::set<unsigned>(first.begin(), first.end()).size() == 16);  // a phase runs every thread once
    CHECK(first != second);
    const std::vector<unsigned> one_launch = log;
    log.clear();
    launch("logger", logger, 1, 16, 0, 3);
    CHECK(log != one_launch);
}

TEST_CASE("a barrier that only some threads reach is an error") {
    std::vector<double> out(32);
    CHECK_THROWS_WITH_AS(launch("divergent_barrier", divergent_barrier, 1, 32, 0, out.data()),
                         "kernel divergent_barrier: 16 of 32 threads of a block wait at __syncthreads() that the "
                         "others never reach",
                         std::logic_error);
    // the emulator is usable again afterwards
    const std::vector<double> x = iota(32);
    launch("shift_left", shift_left<true>, 1, 32, 0, x.data(), out.data());
    CHECK(out[0] == x[1]);
}

TEST_CASE("dynamic shared memory starts as NaN and is the block's own") {
    std::vector<double> before(64), after(64);
    launch("dynamic_shared", dynamic_shared, 1, 64, 64 * sizeof(double), before.data(), after.data());
    for (int t = 0; t < 64; ++t) {
        CHECK(std::isnan(before[t]));
        CHECK(after[t] == 63 - t);
    }
}

TEST_CASE("launches CUDA would refuse are errors") {
    std::vector<int64_t> ids(2048);
    CHECK_THROWS_WITH_AS(launch("write_indices", write_indices, 1, 2048, 0, ids.data()),
                         "kernel write_indices: a block of 2048 threads (CUDA allows 1 to 1024)", std::logic_error);
    CHECK_THROWS_WITH_AS(launch("write_indices", write_indices, 1, 32, 64 * 1024, ids.data()),
                         "kernel write_indices: 65536 bytes of dynamic shared memory (at most 49152 without an "
                         "opt-in: cudaFuncSetAttribute)",
                         std::logic_error);
    CHECK_THROWS_WITH_AS(launch("write_indices", write_indices, 1, dim3(1, 1, 65), 0, ids.data()),
                         "kernel write_indices: blockDim.z = 65 (CUDA allows at most 64)", std::logic_error);
    CHECK_THROWS_WITH_AS(launch("write_indices", write_indices, dim3(1, 65536), 1, 0, ids.data()),
                         "kernel write_indices: gridDim.y = 65536 (CUDA allows at most 65535)", std::logic_error);
    CHECK_THROWS_WITH_AS(launch("write_indices", write_indices, dim3(1, 1, 65536), 1, 0, ids.data()),
                         "kernel write_indices: gridDim.z = 65536 (CUDA allows at most 65535)", std::logic_error);
    CHECK_THROWS_WITH_AS(__syncthreads(), "__syncthreads() outside a kernel", std::logic_error);
}

TEST_CASE("more than 48 KiB of dynamic shared memory only after the kernel opted in, up to the device's limit") {
    using relgrad::cuda_emulated::allow_dynamic_shared;
    const std::size_t bytes = 8192 * sizeof(double);  // 64 KiB
    std::vector<double> before(64), after(64);
    CHECK_THROWS_AS(launch("dynamic_shared", dynamic_shared, 1, 64, bytes, before.data(), after.data()),
                    std::logic_error);
    CHECK_THROWS_WITH_AS(allow_dynamic_shared("dynamic_shared", dynamic_shared, 200 * 1024),
                         "kernel dynamic_shared: an opt-in to 204800 bytes of dynamic shared memory (CUDA allows "
                         "at most 166912)",
                         std::logic_error);
    allow_dynamic_shared("dynamic_shared", dynamic_shared, bytes);
    launch("dynamic_shared", dynamic_shared, 1, 64, bytes, before.data(), after.data());
    CHECK(after[0] == 63);
    CHECK_THROWS_WITH_AS(launch("dynamic_shared", dynamic_shared, 1, 64, bytes + 8, before.data(), after.data()),
                         "kernel dynamic_shared: 65544 bytes of dynamic shared memory (at most 65536 as opted in)",
                         std::logic_error);
    // the opt-in is the kernel's own: another kernel still has 48 KiB
    std::vector<int64_t> ids(32);
    CHECK_THROWS_AS(launch("write_indices", write_indices, 1, 32, bytes, ids.data()), std::logic_error);
}

TEST_CASE("warp shuffles: a butterfly sum, a scan, a broadcast and a reduction down to lane 0") {
    const std::vector<double> x = iota(64);
    std::vector<double> sums(64), out(192);
    launch("warp_sums_xor", warp_sums_xor, 1, 64, 0, x.data(), sums.data());
    launch("warp_scan_broadcast_down", warp_scan_broadcast_down, 1, 64, 0, x.data(), out.data());
    for (int warp = 0; warp < 2; ++warp) {
        double total = 0, prefix[32];
        for (int lane = 0; lane < 32; ++lane) prefix[lane] = total += x[32 * warp + lane];
        for (int lane = 0; lane < 32; ++lane) {
            const int t = 32 * warp + lane;
            CHECK(sums[t] == doctest::Approx(total).epsilon(1e-15));
            CHECK(out[t] == doctest::Approx(prefix[lane]).epsilon(1e-15));
            CHECK(out[64 + t] == prefix[5]);
        }
        CHECK(out[128 + 32 * warp] == doctest::Approx(total).epsilon(1e-15));
    }
}

TEST_CASE("warp mistakes are errors: a missing partner, a lane outside the mask, masks that disagree") {
    std::vector<double> out(32);
    CHECK_THROWS_WITH_AS(launch("half_warp_skips_shuffle", half_warp_skips_shuffle, 1, 32, 0, out.data()),
                         doctest::Contains("waits at __shfl_xor_sync for lanes 16, 17, 18, 19, 20, 21, 22, 23, 24, "
                                           "25, 26, 27, 28, 29, 30, 31 of its mask, which never reach it"),
                         std::logic_error);
    CHECK_THROWS_WITH_AS(launch("reads_outside_mask", reads_outside_mask, 1, 32, 0, out.data()),
                         doctest::Contains("which is not in the mask (lanes 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, "
                                           "12, 13, 14, 15)"),
                         std::logic_error);
    CHECK_THROWS_WITH_AS(launch("masks_disagree", masks_disagree, 1, 32, 0, out.data()),
                         doctest::Contains("(the lanes of a mask must all call one operation with one mask)"),
                         std::logic_error);
    // a mask naming lanes a 16-thread block does not have
    CHECK_THROWS_WITH_AS(launch("half_warp_skips_shuffle", half_warp_skips_shuffle, 1, 16, 0, out.data()),
                         "__shfl_xor_sync: the mask names lanes 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, "
                         "29, 30, 31, which the block does not have",
                         std::logic_error);
}

TEST_CASE("lanes of a warp do not run in lockstep: shared memory between lanes needs __syncwarp") {
    const std::vector<double> x = iota(32);
    int wrong_without = 0;
    for (uint64_t seed = 1; seed <= 8; ++seed) {
        relgrad::cuda_emulator::set_seed(seed);
        std::vector<double> with(32), without(32);
        launch("warp_shift_left<true>", warp_shift_left<true>, 1, 32, 0, x.data(), with.data());
        launch("warp_shift_left<false>", warp_shift_left<false>, 1, 32, 0, x.data(), without.data());
        for (int lane = 0; lane < 32; ++lane) {
            CHECK(with[lane] == x[(lane + 1) % 32]);
            if (without[lane] != x[(lane + 1) % 32]) ++wrong_without;
        }
    }
    CHECK(wrong_without > 0);
}

// ---------------------------------------------------------------- the backend on the emulated device

namespace {

using namespace relgrad;

// |a - b| <= tol (1 + |b|) elementwise, where both are finite, else equal
void check_close(const Tensor& on_cuda, const Tensor& on_cpu, double tol) {
    REQUIRE(on_cuda.device() == Device::cuda);
    REQUIRE(on_cuda.shape() == on_cpu.shape());
    const std::vector<double> a = on_cuda.to_vector(), b = on_cpu.to_vector();
    for (std::size_t i = 0; i < a.size(); ++i) {
        const bool same = std::isfinite(b[i]) ? std::fabs(a[i] - b[i]) <= tol * (1 + std::fabs(b[i]))
                                              : (std::isnan(b[i]) ? std::isnan(a[i]) : a[i] == b[i]);
        CHECK_MESSAGE(same, "element " << i << ": cuda " << a[i] << ", cpu " << b[i]);
        if (!same) return;
    }
}

Tensor random(const Shape& shape, uint64_t seed, DType dtype = DType::float64) {
    Generator gen(seed);
    return randn(shape, gen, dtype);
}

}  // namespace

TEST_CASE("rows longer than a block: reductions and softmax match the CPU") {
    // 1000 elements per row: 128 threads each sum a strided part, then the tree
    for (DType dtype : {DType::float64, DType::float32}) {
        const double tol = dtype == DType::float64 ? 1e-12 : 1e-5;
        const Tensor x = random({3, 1000}, 7, dtype);
        const Tensor on_cuda = x.to(Device::cuda);
        check_close(sum(on_cuda, {1}), sum(x, {1}), tol);
        check_close(sum(on_cuda, {0}), sum(x, {0}), tol);
        check_close(max(on_cuda, {1}), max(x, {1}), 0);
        check_close(softmax(on_cuda, 1), softmax(x, 1), tol);
        check_close(log_softmax(on_cuda, 1), log_softmax(x, 1), tol);
    }
}

TEST_CASE("the emulated device refuses host access, as a GPU does") {
    const Tensor x = random({2, 3}, 1).to(Device::cuda);
    CHECK_THROWS_AS(x.data<double>(), std::logic_error);
    CHECK(x.to_vector().size() == 6);  // copies out are the way
}

TEST_CASE("the same inputs give bitwise the same results, run after run") {
    const Tensor x = random({4, 300}, 3).to(Device::cuda), w = random({300, 50}, 4).to(Device::cuda);
    const std::vector<double> first = softmax(matmul(x, w), 1).to_vector();
    for (int run = 0; run < 3; ++run) CHECK(softmax(matmul(x, w), 1).to_vector() == first);
}

TEST_CASE("the cuda device's caching allocator: its own memory_stats, freed blocks of every size reused") {
    const MemoryStats before = memory_stats(Device::cuda);
    const MemoryStats cpu_before = memory_stats(Device::cpu);
    {
        const Tensor x = zeros({100}, DType::float32, Device::cuda);  // 400 bytes, a block of 448
        CHECK(memory_stats(Device::cuda).live_bytes == before.live_bytes + 400);
        CHECK(memory_stats(Device::cpu).live_bytes == cpu_before.live_bytes);
    }
    const MemoryStats freed = memory_stats(Device::cuda);
    CHECK(freed.live_bytes == before.live_bytes);
    CHECK(freed.cached_bytes >= 448);  // small blocks are cached too
    const Tensor again = zeros({100}, DType::float32, Device::cuda);
    CHECK(memory_stats(Device::cuda).cached_bytes == freed.cached_bytes - 448);  // the same block again
}

TEST_CASE("the fused attention on cuda needs memory linear in L") {
    // forward + backward at L and 2L: the most storage alive at once grows about 2x, not 4x
    auto peak = [](int64_t L) {
        Generator gen(5);
        std::vector<Tensor> in;
        for (int n = 0; n < 3; ++n) in.push_back(randn({1, 2, L, 8}, gen).to(Device::cuda).requires_grad_(true));
        const Tensor table_k = randn({1, 9, 8}, gen).to(Device::cuda).requires_grad_(true);
        const Tensor table_v = randn({1, 9, 8}, gen).to(Device::cuda).requires_grad_(true);
        reset_peak_memory(Device::cuda);
        const int64_t before = memory_stats(Device::cuda).live_bytes;
        fused_attention(in[0], in[1], in[2], AttentionPattern{}, 0.35, {table_k, table_v, 4, 4})
            .backward(ones({1, 2, L, 8}, DType::float32, Device::cuda));
        return static_cast<double>(memory_stats(Device::cuda).peak_live_bytes - before);
    };
    const double at_256 = peak(256), at_512 = peak(512);
    CHECK(at_512 / at_256 > 1.8);
    CHECK(at_512 / at_256 < 2.3);
}
