// The emulator of CUDA's execution model (engine/backend/cuda/emulator.hpp) that runs the CUDA
// backend's kernels in the test build: indices, shared memory and barriers behave as on a GPU, and
// a kernel with a barrier removed or with a race is reported here. Then the backend's
// kernels on the emulated cuda device against the CPU's, on the shapes the op tests do not reach.
// No gradient check here: this file tests the execution model and kernel values, not an op's
// derivative; every op's and layer's gradient check runs on this device in its own test
// (tests/engine/test_helpers.hpp, tests/layers/layer_check.hpp). One file: the emulator's one test
// program, each test kernel written beside the test that runs it.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "engine/backend/cuda/cuda_backend.hpp"
#include "engine/backend/cuda/mma.hpp"
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
// partial sum that another thread writes in the same phase, a race.
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
// and the read, a lane may read its neighbour's slot before the neighbour wrote it (a race)
template <bool with_syncwarp>
__global__ void warp_shift_left(const double* x, double* out) {
    RELGRAD_SHARED(double, tile, 32);
    const unsigned lane = threadIdx.x;
    tile[lane] = x[lane];
    if (with_syncwarp) __syncwarp();
    out[lane] = tile[(lane + 1) % 32];
}
// Each lane scales its own slot, then adds 1 to its neighbour's: with __syncwarp between, the
// neighbour's read-and-write follows the owner's (ordered, whatever the lanes' order); without it,
// a race. out[t] = 2 x[t] + 1.
template <bool with_syncwarp>
__global__ void scale_then_bump_neighbour(const double* x, double* out) {
    RELGRAD_SHARED(double, tile, 32);
    const unsigned lane = threadIdx.x;
    tile[lane] = x[lane];
    __syncwarp();
    tile[lane] *= 2.0;  // a read and a write of the lane's own slot
    if (with_syncwarp) __syncwarp();
    tile[(lane + 1) % 32] += 1.0;  // a read and a write of the next lane's slot
    __syncwarp();
    out[lane] = tile[lane];
}
// Each lane writes its slot, the warp meets at `Point` (a shuffle, an mma.sync, or __syncwarp),
// then reads its neighbour's slot: only __syncwarp orders the write before the read.
// out[t] = x[t + 1].
enum class WarpPoint { shuffle, mma, syncwarp };
template <WarpPoint Point>
__global__ void neighbour_after_point(const double* x, double* out) {
    RELGRAD_SHARED(double, tile, 32);
    const unsigned lane = threadIdx.x;
    tile[lane] = x[lane];
    if (Point == WarpPoint::shuffle) static_cast<void>(__shfl_sync(0xffffffffu, 1.0, 0));
    if (Point == WarpPoint::mma) {
        float d[4];
        const uint32_t a[4] = {}, b[2] = {};
        const float c[4] = {};
        relgrad::mma_sync<relgrad::MmaInputs::tf32>(d, a, b, c);
    }
    if (Point == WarpPoint::syncwarp) __syncwarp();
    out[lane] = tile[(lane + 1) % 32];
}
// A tile read by warp 0, then refilled by warp 1's cp.async: with a barrier between the read and
// the copy's issue, or with only one between the issue and the wait (where the copy lands). A GPU
// may write the destination any time after the issue, so only the first is right.
// out[t] = x[t + 1], then out[32 + t] = x[32 + t].
template <bool barrier_before_issue>
__global__ void refill_after_read(const double* x, double* out) {
    RELGRAD_DYNAMIC_SHARED(double, tile);  // [32]
    const unsigned t = threadIdx.x;        // 64 threads
    if (t < 32) tile[t] = x[t];
    __syncthreads();
    if (t < 32) out[t] = tile[(t + 1) % 32];
    if (barrier_before_issue) __syncthreads();
    if (t >= 32) {
        __pipeline_memcpy_async(tile + (t - 32), x + t, sizeof(double));
        __pipeline_commit();
    }
    __syncthreads();
    if (t >= 32) __pipeline_wait_prior(0);
    __syncthreads();
    if (t < 32) out[32 + t] = tile[t];
}
// the mistakes: out[t] = x[t + 32] through shared memory, 64 threads, with __syncwarp where
// __syncthreads is needed; a write one past the end of a shared array
__global__ void shift_across_warps(const double* x, double* out) {
    RELGRAD_SHARED(double, tile, 64);
    const unsigned t = threadIdx.x;
    tile[t] = x[t];
    __syncwarp();
    out[t] = tile[(t + 32) % 64];
}
__global__ void write_past_shared(double* out) {
    RELGRAD_SHARED(double, tile, 32);
    tile[threadIdx.x + 1] = 1;
    out[threadIdx.x] = 0;
}

// --- cp.async: two tiles of 32 doubles staged into shared memory as two batches (double
// buffering); out[t] = the first tile's x[t + 1] after waiting for all but the newest batch, then
// the thread's own second-tile element read too early (before its wait), and x[32 + t + 1] after
// the wait and a barrier. With zfill, each
// thread copies 16 bytes of which the last 8 are zeros.
__global__ void staged_tiles(const double* x, double* out) {
    RELGRAD_DYNAMIC_SHARED(double, tiles);  // [2, 32]
    const unsigned t = threadIdx.x, next = (t + 1) % 32;
    __pipeline_memcpy_async(tiles + t, x + t, sizeof(double));
    __pipeline_commit();
    __pipeline_memcpy_async(tiles + 32 + t, x + 32 + t, sizeof(double));
    __pipeline_commit();
    __pipeline_wait_prior(1);  // the first batch has landed, the second may not have
    __syncthreads();
    out[t] = tiles[next];
    out[32 + t] = tiles[32 + t];  // the mistake: the second batch is not waited for yet
    __pipeline_wait_prior(0);
    __syncthreads();
    out[64 + t] = tiles[32 + next];
}
__global__ void staged_with_zeros(const double* x, double* out) {
    RELGRAD_DYNAMIC_SHARED(double, tile);  // [64]: pairs of (x, 0)
    const unsigned t = threadIdx.x;
    __pipeline_memcpy_async(tile + 2 * t, x + 2 * t, 2 * sizeof(double), sizeof(double));
    __pipeline_commit();
    __pipeline_wait_prior(0);
    out[2 * t] = tile[2 * t];
    out[2 * t + 1] = tile[2 * t + 1];
}
// the mistakes: a copy never waited for; a copy of 12 bytes; a destination in global memory
__global__ void copy_never_waited(const double* x, double* out) {
    RELGRAD_DYNAMIC_SHARED(double, tile);
    __pipeline_memcpy_async(tile + threadIdx.x, x + threadIdx.x, sizeof(double));
    __pipeline_commit();
    out[threadIdx.x] = 0;
}
__global__ void copy_of_12_bytes(const double* x, double*) {
    RELGRAD_DYNAMIC_SHARED(double, tile);
    __pipeline_memcpy_async(tile, x, 12);
}
__global__ void copy_to_global(const double* x, double* out) {
    __pipeline_memcpy_async(out + threadIdx.x, x + threadIdx.x, sizeof(double));
}
// x[at] into shared memory: outside a device block when `at` is
__global__ void copy_element(const double* x, int64_t at) {
    RELGRAD_DYNAMIC_SHARED(double, tile);
    __pipeline_memcpy_async(tile, x + at, sizeof(double));
    __pipeline_commit();
    __pipeline_wait_prior(0);
}

// --- device memory: out[0] = the sum of x[0, n), reading `extra` elements past its end; and a
// write of 1 at x[index]
__global__ void sum_past_end(const double* x, int64_t n, int64_t extra, double* out) {
    double total = 0;
    for (int64_t i = 0; i < n + extra; ++i) total += x[i];
    out[0] = total;
}
__global__ void write_at(double* x, int64_t index) { x[index] = 1; }

// --- the tree of block_reduce (cuda_backend.hpp) with the barrier after the step `skipped` left
// out (blockDim.x: the step's width; 0: none), as reduce_kernel calls it on a row of n: each thread
// sums its stride of the row, the block combines. out[t] = the total thread t returns.
template <unsigned skipped>
__global__ void tree_sum_skipping(const double* x, int64_t n, double* out) {
    RELGRAD_SHARED(double, partial, relgrad::cuda_emulated::kRowThreads);
    const unsigned t = threadIdx.x;
    double value = 0;
    for (int64_t i = t; i < n; i += blockDim.x) value += x[i];
    partial[t] = value;
    if (skipped != blockDim.x) __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
        if (t < half) partial[t] = partial[t] + partial[t + half];
        if (skipped != half) __syncthreads();
    }
    out[t] = partial[0];
}

// --- mma.sync: warp w of the block computes d_w = a_w b_w + c_w for its own tiles, a_w (16 x K),
// b_w (K x 8), c_w and d_w (16 x 8), row-major one after another in global memory, loading and
// storing its fragments by mma.hpp's places. `mistake` 1: a lane's A elements 1 and 2 swapped as
// it loads them; 2: lane 5 leaves before the product.
// a tile place's offset in a row-major tile `width` wide
int row_major(relgrad::TilePlace place, int width) { return place.row * width + place.col; }

template <relgrad::MmaInputs In, int mistake = 0>
__global__ void warp_tile_product(const float* a, const float* b, const float* c, float* d) {
    using namespace relgrad;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, K = mma_k(In);
    a += warp * 16 * K, b += warp * K * 8, c += warp * 16 * 8, d += warp * 16 * 8;
    float a_values[8], b_values[4], c_fragment[4], d_fragment[4];
    for (int i = 0; i < mma_a_elements(In); ++i) a_values[i] = a[row_major(mma_a_place(In, lane, i), K)];
    for (int i = 0; i < mma_b_elements(In); ++i) b_values[i] = b[row_major(mma_b_place(In, lane, i), 8)];
    for (int i = 0; i < 4; ++i) c_fragment[i] = c[row_major(mma_c_place(lane, i), 8)];
    if (mistake == 1) std::swap(a_values[1], a_values[2]);
    if (mistake == 2 && lane == 5) return;
    uint32_t a_fragment[4], b_fragment[2];
    for (int r = 0; r < 4; ++r) {
        a_fragment[r] =
            In == MmaInputs::tf32 ? tf32_of(a_values[r]) : pack_16_bit(In, a_values[2 * r], a_values[2 * r + 1]);
    }
    for (int r = 0; r < 2; ++r) {
        b_fragment[r] =
            In == MmaInputs::tf32 ? tf32_of(b_values[r]) : pack_16_bit(In, b_values[2 * r], b_values[2 * r + 1]);
    }
    mma_sync<In>(d_fragment, a_fragment, b_fragment, c_fragment);
    for (int i = 0; i < 4; ++i) d[row_major(mma_c_place(lane, i), 8)] = d_fragment[i];
}

// --- ldmatrix: one warp loads the 16 x 16 16-bit values `values` (row-major), put in shared memory
// with rows 24 values (48 bytes) apart, by load_matrices<Transposed>, lane 8 m + r naming row
// 8 (m % 2) + r, columns 8 (m / 2); out[4 lane + m] is the lane's register m. `mistake` 1: lane 3
// names lane 4's row; 2: no __syncwarp between the writes and the load; 3: a row 8 bytes on; 4:
// lane 5 leaves before the load.
template <bool Transposed, int mistake = 0>
__global__ void load_16_by_16_values(const uint16_t* values, uint32_t* out) {
    RELGRAD_DYNAMIC_SHARED(uint16_t, rows);
    const int lane = threadIdx.x;
    for (int e = lane; e < 256; e += 32) rows[e / 16 * 24 + e % 16] = values[e];
    if (mistake != 2) __syncwarp();
    const int m = lane / 8, r = mistake == 1 && lane == 3 ? 4 : lane % 8;
    if (mistake == 4 && lane == 5) return;
    uint32_t registers[4];
    relgrad::load_matrices<Transposed>(rows + (8 * (m % 2) + r) * 24 + 8 * (m / 2) + (mistake == 3 ? 4 : 0), registers);
    for (int i = 0; i < 4; ++i) out[4 * lane + i] = registers[i];
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

TEST_CASE("a shared-memory reduction is right with its barriers, and a race is reported without them") {
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
    // without the barriers, whatever the order: a thread reads a partial sum another writes in
    // the same phase
    for (uint64_t seed : {1, 2, 3}) {
        relgrad::cuda_emulator::set_seed(seed);
        CHECK_THROWS_WITH_AS(launch("block_sums", block_sums<true>, blocks, 64, 0, x.data(), sums.data()),
                             doctest::Contains("a race on byte "), std::logic_error);
    }
}

TEST_CASE("a race on shared memory is reported where it happens, and the barrier fixes it") {
    const std::vector<double> x = iota(64);
    std::vector<double> out(64);
    launch("shift_left", shift_left<true>, 1, 32, 0, x.data(), out.data());
    for (int t = 0; t < 32; ++t) CHECK(out[t] == x[(t + 1) % 32]);
    // a thread reads its neighbour's element before or after the neighbour writes it, by the order
    // it runs in: either way the pair is reported, under every seed
    for (uint64_t seed : {1, 2, 3}) {
        relgrad::cuda_emulator::set_seed(seed);
        CHECK_THROWS_WITH_AS(launch("shift_left", shift_left<false>, 1, 32, 0, x.data(), out.data()),
                             doctest::Contains("of static shared memory: thread "), std::logic_error);
    }
    // __syncwarp orders the lanes of one warp, not two warps
    CHECK_THROWS_WITH_AS(launch("across_warps", shift_across_warps, 1, 64, 0, x.data(), out.data()),
                         doctest::Contains("with no __syncthreads() between them"), std::logic_error);
    // an element past the end of a shared array
    CHECK_THROWS_WITH_AS(launch("write_past_shared", write_past_shared, 1, 32, 0, out.data()),
                         "kernel write_past_shared, block (0, 0, 0): thread 31 wrote 8 bytes outside the block's "
                         "shared memory",
                         std::logic_error);
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

TEST_CASE("mma.sync's fragment places are the PTX ISA's, and each covers its tile once") {
    using relgrad::MmaInputs;
    // lane 5: groupID 1, threadID_in_group 1 (PTX ISA, "Matrix Fragments for mma.m16n8k8/k16")
    const auto is = [](relgrad::TilePlace place, int row, int col) { return place.row == row && place.col == col; };
    CHECK(is(relgrad::mma_a_place(MmaInputs::tf32, 5, 1), 9, 1));       // a1: groupID + 8, threadID_in_group
    CHECK(is(relgrad::mma_a_place(MmaInputs::tf32, 5, 2), 1, 5));       // a2: groupID, threadID_in_group + 4
    CHECK(is(relgrad::mma_b_place(MmaInputs::tf32, 5, 1), 5, 1));       // b1: threadID_in_group + 4, groupID
    CHECK(is(relgrad::mma_a_place(MmaInputs::bfloat16, 5, 3), 9, 3));   // a3: groupID + 8, 2 threadID_in_group + 1
    CHECK(is(relgrad::mma_a_place(MmaInputs::float16, 5, 6), 9, 10));   // a6: groupID + 8, 2 threadID_in_group + 8
    CHECK(is(relgrad::mma_b_place(MmaInputs::bfloat16, 5, 3), 11, 1));  // b3: 2 threadID_in_group + 9, groupID
    CHECK(is(relgrad::mma_c_place(5, 3), 9, 3));                        // c3: groupID + 8, 2 threadID_in_group + 1
    for (MmaInputs inputs : {MmaInputs::tf32, MmaInputs::bfloat16, MmaInputs::float16}) {
        const int K = relgrad::mma_k(inputs);
        std::multiset<int> a_places, b_places, c_places;
        for (int lane = 0; lane < 32; ++lane) {
            for (int i = 0; i < relgrad::mma_a_elements(inputs); ++i) {
                const auto at = relgrad::mma_a_place(inputs, lane, i);
                a_places.insert(at.row < 16 && at.col < K ? row_major(at, K) : -1);
            }
            for (int i = 0; i < relgrad::mma_b_elements(inputs); ++i) {
                const auto at = relgrad::mma_b_place(inputs, lane, i);
                b_places.insert(at.row < K && at.col < 8 ? row_major(at, 8) : -1);
            }
            for (int i = 0; i < 4; ++i) c_places.insert(row_major(relgrad::mma_c_place(lane, i), 8));
        }
        for (int place = 0; place < 16 * K; ++place) CHECK(a_places.count(place) == 1);
        for (int place = 0; place < K * 8; ++place) CHECK(b_places.count(place) == 1);
        for (int place = 0; place < 16 * 8; ++place) CHECK(c_places.count(place) == 1);
    }
}

TEST_CASE("every lane's every fragment element is where the PTX ISA's tables put it") {
    using relgrad::MmaInputs;
    // The ISA's tables ("Matrix Fragments for mma.m16n8k8" with .tf32, and "... mma.m16n8k16"
    // with .f16 and .bf16), written as they are there, element by element, rather than as
    // mma.hpp's closed forms: a row and column swapped, or an element off by 8, fails here.
    //   m16n8k8 tf32   A  row: groupID for a0, a2; groupID + 8 for a1, a3
    //                     col: threadID_in_group for a0, a1; threadID_in_group + 4 for a2, a3
    //                  B  row: threadID_in_group for b0; threadID_in_group + 4 for b1.  col: groupID
    //   m16n8k16       A  row: groupID for a0, a1, a4, a5; groupID + 8 for a2, a3, a6, a7
    //                     col: threadID_in_group * 2 + (i & 1) for a0-a3; the same + 8 for a4-a7
    //                  B  row: threadID_in_group * 2 + (i & 1) for b0, b1; the same + 8 for b2, b3
    //                     col: groupID
    //   C, D (both)       row: groupID for c0, c1; groupID + 8 for c2, c3
    //                     col: threadID_in_group * 2 + (i & 1)
    const int tf32_a_row_plus[4] = {0, 8, 0, 8}, tf32_a_col_plus[4] = {0, 0, 4, 4};
    const int tf32_b_row_plus[2] = {0, 4};
    const int half_a_row_plus[8] = {0, 0, 8, 8, 0, 0, 8, 8}, half_a_col_plus[8] = {0, 0, 0, 0, 8, 8, 8, 8};
    const int half_b_row_plus[4] = {0, 0, 8, 8};
    const int c_row_plus[4] = {0, 0, 8, 8};
    int checked = 0;
    for (int lane = 0; lane < 32; ++lane) {
        CAPTURE(lane);
        const int group = lane / 4, in_group = lane % 4;
        const auto expect = [&](relgrad::TilePlace got, int row, int col) {
            CHECK(got.row == row);
            CHECK(got.col == col);
            ++checked;
        };
        for (int i = 0; i < 4; ++i) {
            CAPTURE(i);
            expect(relgrad::mma_a_place(MmaInputs::tf32, lane, i), group + tf32_a_row_plus[i],
                   in_group + tf32_a_col_plus[i]);
            expect(relgrad::mma_c_place(lane, i), group + c_row_plus[i], in_group * 2 + (i & 1));
        }
        for (int i = 0; i < 2; ++i) {
            CAPTURE(i);
            expect(relgrad::mma_b_place(MmaInputs::tf32, lane, i), in_group + tf32_b_row_plus[i], group);
        }
        for (MmaInputs half : {MmaInputs::bfloat16, MmaInputs::float16}) {
            for (int i = 0; i < 8; ++i) {
                CAPTURE(i);
                expect(relgrad::mma_a_place(half, lane, i), group + half_a_row_plus[i],
                       in_group * 2 + (i & 1) + half_a_col_plus[i]);
            }
            for (int i = 0; i < 4; ++i) {
                CAPTURE(i);
                expect(relgrad::mma_b_place(half, lane, i), in_group * 2 + (i & 1) + half_b_row_plus[i], group);
            }
        }
    }
    CHECK(checked == 32 * (4 + 4 + 2 + 2 * (8 + 4)));  // every element of every fragment
}

TEST_CASE("ldmatrix hands each lane the PTX ISA's elements: an A fragment, or transposed a B one") {
    std::vector<uint16_t> values(256);
    for (int e = 0; e < 256; ++e) values[e] = static_cast<uint16_t>(1000 + 7 * e);  // distinct
    const auto value = [&](int row, int col) { return uint32_t{values[row * 16 + col]}; };
    const std::size_t shared_bytes = 16 * 24 * sizeof(uint16_t);
    std::vector<uint32_t> plain(128), transposed(128);
    launch("load_16_by_16_values<false>", load_16_by_16_values<false>, 1, 32, shared_bytes, values.data(),
           plain.data());
    launch("load_16_by_16_values<true>", load_16_by_16_values<true>, 1, 32, shared_bytes, values.data(),
           transposed.data());
    for (int lane = 0; lane < 32; ++lane) {
        CAPTURE(lane);
        const int g = lane / 4, t = lane % 4;
        for (int m = 0; m < 4; ++m) {
            CAPTURE(m);
            const int row0 = 8 * (m % 2), col0 = 8 * (m / 2);  // matrix m's place in the 16 x 16
            // PTX ISA ("Warp-level matrix load instruction: ldmatrix"): row g, columns 2t and 2t + 1;
            // .trans: column g, rows 2t and 2t + 1
            CHECK(plain[4 * lane + m] == (value(row0 + g, col0 + 2 * t) | value(row0 + g, col0 + 2 * t + 1) << 16));
            CHECK(transposed[4 * lane + m] ==
                  (value(row0 + 2 * t, col0 + g) | value(row0 + 2 * t + 1, col0 + g) << 16));
        }
        // untransposed, the registers are the A fragment of the 16 x 16 for a 16-bit mma (mma.hpp)
        for (int i = 0; i < 8; ++i) {
            const relgrad::TilePlace at = relgrad::mma_a_place(relgrad::MmaInputs::bfloat16, lane, i);
            CHECK((plain[4 * lane + i / 2] >> (16 * (i % 2)) & 0xffffu) == value(at.row, at.col));
        }
    }
    // a lane naming another row loads other values; a load racing the writes, a row off a 16-byte
    // boundary, or a lane that never comes are errors
    std::vector<uint32_t> wrong(128);
    launch("load_16_by_16_values<false, 1>", load_16_by_16_values<false, 1>, 1, 32, shared_bytes, values.data(),
           wrong.data());
    CHECK(wrong != plain);
    CHECK_THROWS_WITH_AS(launch("load_16_by_16_values<false, 2>", load_16_by_16_values<false, 2>, 1, 32, shared_bytes,
                                values.data(), wrong.data()),
                         doctest::Contains("a race on byte "), std::logic_error);
    CHECK_THROWS_WITH_AS(launch("load_16_by_16_values<false, 3>", load_16_by_16_values<false, 3>, 1, 32, shared_bytes,
                                values.data(), wrong.data()),
                         doctest::Contains("names a row that does not start at a 16-byte boundary"), std::logic_error);
    CHECK_THROWS_WITH_AS(launch("load_16_by_16_values<false, 4>", load_16_by_16_values<false, 4>, 1, 32, shared_bytes,
                                values.data(), wrong.data()),
                         doctest::Contains("waits at ldmatrix.sync.m8n8.x4.shared.b16 for lanes 5 of its mask"),
                         std::logic_error);
}

TEST_CASE("pack_16_bit's host form is cvt.rn.bf16x2.f32 and cvt.rn.f16x2.f32: to nearest even, in two halves") {
    // The PTX ISA: "cvt.rn.bf16x2.f32 d, a, b" converts a and b, each rounded to nearest, ties to
    // even, and puts a's result in d's upper half, b's in its lower; pack_16_bit(low, high) passes
    // (high, low) on a GPU, so that element 0 of a fragment register is its low half, as mma.sync
    // reads it. The reference rounds a double to the type's significant bits with nearbyint
    // (to nearest even), for normal values of both types.
    using relgrad::MmaInputs;
    const auto rounded = [](double x, int significant_bits) {
        int exponent = 0;
        const double fraction = std::frexp(x, &exponent);
        return std::ldexp(std::nearbyint(std::ldexp(fraction, significant_bits)), exponent - significant_bits);
    };
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> values = {1.0f + std::ldexp(1.0f, -8),
                                 1.0f + 3 * std::ldexp(1.0f, -8),  // bfloat16's ties
                                 1.0f + std::ldexp(1.0f, -11),
                                 1.0f + 3 * std::ldexp(1.0f, -11),  // float16's ties
                                 -2.5f,
                                 1000.0f,
                                 0.1f};
    for (int n = 0; n < 2000; ++n) values.push_back(normal(rng));
    for (MmaInputs half : {MmaInputs::bfloat16, MmaInputs::float16}) {
        CAPTURE(static_cast<int>(half));
        const int significant_bits = half == MmaInputs::bfloat16 ? 8 : 11;
        for (std::size_t n = 0; n + 1 < values.size(); ++n) {
            const float low = values[n], high = values[n + 1];
            CAPTURE(low);
            CAPTURE(high);
            // one register (mma_input's tf32 form, not taken here, would index a second)
            const std::array<uint32_t, 2> packed = {relgrad::pack_16_bit(half, low, high), 0};
            CHECK(relgrad::mma_input(half, packed.data(), 0) == rounded(low, significant_bits));   // the low half
            CHECK(relgrad::mma_input(half, packed.data(), 1) == rounded(high, significant_bits));  // the high half
        }
    }
}

TEST_CASE("tf32_of rounds to nearest, ties away from zero, as cvt.rna.tf32.f32") {
    const auto tf32 = [](float f) {
        return relgrad::mma_input(relgrad::MmaInputs::tf32, std::array<uint32_t, 1>{relgrad::tf32_of(f)}.data(), 0);
    };
    CHECK(tf32(1.0f + std::ldexp(1.0f, -12)) == 1.0f);                          // below half of tf32's step 2^-10
    CHECK(tf32(1.0f + std::ldexp(1.0f, -11)) == 1.0f + std::ldexp(1.0f, -10));  // a tie, away from zero
    CHECK(tf32(-1.0f - std::ldexp(1.0f, -11)) == -1.0f - std::ldexp(1.0f, -10));
    CHECK(tf32(1.0f + 3 * std::ldexp(1.0f, -12)) == 1.0f + std::ldexp(1.0f, -10));
    CHECK(std::isinf(tf32(INFINITY)));
    CHECK(std::isnan(tf32(NAN)));
}

// Tiles for warp_tile_product: entries multiples of 1/4 in [-2, 2], which tf32, bfloat16 and float16
// hold exactly and whose products and sums float32 holds exactly, so the product is exact.
struct WarpTiles {
    std::vector<float> a, b, c, d;
    std::vector<double> expected;  // a b + c in double
};
WarpTiles warp_tiles(relgrad::MmaInputs inputs, int warps, uint64_t seed) {
    const int K = relgrad::mma_k(inputs);
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> quarters(-8, 8);
    WarpTiles tiles;
    const auto fill = [&](std::vector<float>& v, int n) {
        for (int i = 0; i < n; ++i) v.push_back(quarters(rng) / 4.0f);
    };
    fill(tiles.a, warps * 16 * K);
    fill(tiles.b, warps * K * 8);
    fill(tiles.c, warps * 16 * 8);
    tiles.d.assign(tiles.c.size(), NAN);
    for (int w = 0; w < warps; ++w) {
        for (int row = 0; row < 16; ++row) {
            for (int col = 0; col < 8; ++col) {
                double sum = tiles.c[(w * 16 + row) * 8 + col];
                for (int k = 0; k < K; ++k)
                    sum += double{tiles.a[(w * 16 + row) * K + k]} * tiles.b[(w * K + k) * 8 + col];
                tiles.expected.push_back(sum);
            }
        }
    }
    return tiles;
}

template <relgrad::MmaInputs In>
void check_warp_tile_product(const char* name) {
    WarpTiles tiles = warp_tiles(In, 2, 11);
    launch(name, warp_tile_product<In>, 1, 64, 0, tiles.a.data(), tiles.b.data(), tiles.c.data(), tiles.d.data());
    for (std::size_t i = 0; i < tiles.d.size(); ++i) CHECK(tiles.d[i] == tiles.expected[i]);
    // a lane's A elements in the wrong registers: some elements of D are wrong
    tiles.d.assign(tiles.c.size(), NAN);
    launch(name, warp_tile_product<In, 1>, 1, 32, 0, tiles.a.data(), tiles.b.data(), tiles.c.data(), tiles.d.data());
    int wrong = 0;
    for (std::size_t i = 0; i < 16 * 8; ++i) wrong += tiles.d[i] != tiles.expected[i];
    CHECK(wrong > 0);
}

TEST_CASE(
    "mma.sync: one warp's tile product from the lanes' fragments, exact; a fragment in the wrong register is wrong") {
    check_warp_tile_product<relgrad::MmaInputs::tf32>("warp_tile_product (tf32)");
    check_warp_tile_product<relgrad::MmaInputs::bfloat16>("warp_tile_product (bfloat16)");
    check_warp_tile_product<relgrad::MmaInputs::float16>("warp_tile_product (float16)");
    // every lane of the warp must come, and a warp must have 32 lanes
    WarpTiles tiles = warp_tiles(relgrad::MmaInputs::tf32, 1, 12);
    CHECK_THROWS_WITH_AS(
        launch("lane_leaves", warp_tile_product<relgrad::MmaInputs::tf32, 2>, 1, 32, 0, tiles.a.data(), tiles.b.data(),
               tiles.c.data(), tiles.d.data()),
        doctest::Contains("waits at mma.sync.m16n8k8 (tf32) for lanes 5 of its mask, which never reach it"),
        std::logic_error);
    CHECK_THROWS_WITH_AS(launch("half_warp", warp_tile_product<relgrad::MmaInputs::tf32>, 1, 16, 0, tiles.a.data(),
                                tiles.b.data(), tiles.c.data(), tiles.d.data()),
                         doctest::Contains("mma.sync.m16n8k8 (tf32): the mask names lanes 16, 17"), std::logic_error);
}

TEST_CASE("lanes of a warp do not run in lockstep: shared memory between lanes needs __syncwarp") {
    const std::vector<double> x = iota(32);
    for (uint64_t seed = 1; seed <= 3; ++seed) {
        relgrad::cuda_emulator::set_seed(seed);
        std::vector<double> with(32), without(32);
        launch("warp_shift_left<true>", warp_shift_left<true>, 1, 32, 0, x.data(), with.data());
        for (int lane = 0; lane < 32; ++lane) CHECK(with[lane] == x[(lane + 1) % 32]);
        CHECK_THROWS_WITH_AS(
            launch("warp_shift_left<false>", warp_shift_left<false>, 1, 32, 0, x.data(), without.data()),
            doctest::Contains("a race on byte "), std::logic_error);
    }
}

TEST_CASE("a lane's read before a warp-scoped point does not race with another lane's read and write after it") {
    const std::vector<double> x = iota(32);
    for (uint64_t seed = 1; seed <= 3; ++seed) {
        relgrad::cuda_emulator::set_seed(seed);
        std::vector<double> out(32);
        launch("scale_then_bump_neighbour<true>", scale_then_bump_neighbour<true>, 1, 32, 0, x.data(), out.data());
        for (int lane = 0; lane < 32; ++lane) CHECK(out[lane] == 2 * x[lane] + 1);
        CHECK_THROWS_WITH_AS(launch("scale_then_bump_neighbour<false>", scale_then_bump_neighbour<false>, 1, 32, 0,
                                    x.data(), out.data()),
                             doctest::Contains("a race on byte "), std::logic_error);
    }
}

TEST_CASE(
    "shuffles and mma.sync meet the lanes but order no memory: a write then another lane's read needs __syncwarp") {
    const std::vector<double> x = iota(32);
    for (uint64_t seed = 1; seed <= 3; ++seed) {
        relgrad::cuda_emulator::set_seed(seed);
        std::vector<double> out(32);
        launch("neighbour_after_point<syncwarp>", neighbour_after_point<WarpPoint::syncwarp>, 1, 32, 0, x.data(),
               out.data());
        for (int lane = 0; lane < 32; ++lane) CHECK(out[lane] == x[(lane + 1) % 32]);
        CHECK_THROWS_WITH_AS(
            launch("neighbour_after_point<mma>", neighbour_after_point<WarpPoint::mma>, 1, 32, 0, x.data(), out.data()),
            doctest::Contains("a race on byte "), std::logic_error);
        CHECK_THROWS_WITH_AS(launch("neighbour_after_point<shuffle>", neighbour_after_point<WarpPoint::shuffle>, 1, 32,
                                    0, x.data(), out.data()),
                             doctest::Contains("a race on byte "), std::logic_error);
    }
}

TEST_CASE("cp.async writes its destination from the issue on: a buffer refilled while another warp reads it races") {
    const std::vector<double> x = iota(64);
    std::vector<double> out(64);
    launch("refill_after_read<true>", refill_after_read<true>, 1, 64, 32 * sizeof(double), x.data(), out.data());
    for (int t = 0; t < 32; ++t) {
        CHECK(out[t] == x[(t + 1) % 32]);
        CHECK(out[32 + t] == x[32 + t]);
    }
    // the read and the issue in one phase: a race, though the copy lands only after a barrier
    CHECK_THROWS_WITH_AS(
        launch("refill_after_read<false>", refill_after_read<false>, 1, 64, 32 * sizeof(double), x.data(), out.data()),
        doctest::Contains("a race on byte "), std::logic_error);
}

TEST_CASE("cp.async: a copy lands at the wait that covers it, not before; copies never waited for are errors") {
    const std::vector<double> x = iota(64);
    std::vector<double> out(96);
    for (uint64_t seed : {1, 2, 3}) {
        relgrad::cuda_emulator::set_seed(seed);
        launch("staged_tiles", staged_tiles, 1, 32, 64 * sizeof(double), x.data(), out.data());
        for (int t = 0; t < 32; ++t) {
            CHECK(out[t] == x[(t + 1) % 32]);
            CHECK(std::isnan(out[32 + t]));  // shared memory as the block found it: the copy has not landed
            CHECK(out[64 + t] == x[32 + (t + 1) % 32]);
        }
    }
    launch("staged_with_zeros", staged_with_zeros, 1, 32, 64 * sizeof(double), x.data(), out.data());
    for (int t = 0; t < 32; ++t) {
        CHECK(out[2 * t] == x[2 * t]);
        CHECK(out[2 * t + 1] == 0);
    }
    CHECK_THROWS_WITH_AS(
        launch("copy_never_waited", copy_never_waited, 1, 32, 32 * sizeof(double), x.data(), out.data()),
        doctest::Contains("ended with 1 cp.async copies that never landed"), std::logic_error);
    CHECK_THROWS_WITH_AS(launch("copy_of_12_bytes", copy_of_12_bytes, 1, 1, 32 * sizeof(double), x.data(), out.data()),
                         "__pipeline_memcpy_async of 12 bytes: copies 4, 8 or 16 bytes", std::logic_error);
    CHECK_THROWS_WITH_AS(launch("copy_to_global", copy_to_global, 1, 1, 0, x.data(), out.data()),
                         "__pipeline_memcpy_async of 8 bytes: the destination is not the block's shared memory",
                         std::logic_error);
    // a tile row before a tensor's start or past its end, where a GPU would read another
    // allocation or fault: an error (zero-filled copies read nothing, and are fine)
    auto* on_device = static_cast<double*>(relgrad::cuda_emulated::device_allocate(5 * sizeof(double)));
    launch("copy_element", copy_element, 1, 1, sizeof(double), static_cast<const double*>(on_device), int64_t{4});
    CHECK_THROWS_WITH_AS(
        launch("copy_element", copy_element, 1, 1, sizeof(double), static_cast<const double*>(on_device), int64_t{-1}),
        "__pipeline_memcpy_async of 8 bytes: the source reads 8 bytes before the start of a device block of 40 bytes",
        std::logic_error);
    CHECK_THROWS_WITH_AS(
        launch("copy_element", copy_element, 1, 1, sizeof(double), static_cast<const double*>(on_device), int64_t{5}),
        "__pipeline_memcpy_async of 8 bytes: the source reads 8 bytes past the end of a device block of 40 bytes",
        std::logic_error);
    relgrad::cuda_emulated::device_free(on_device);
}

TEST_CASE("device memory ends where the tensor ends: a read past it is NaN, a write past it an error") {
    using namespace relgrad::cuda_emulated;
    const int64_t n = 5;  // 40 bytes: a size class would have padded it to 64
    const std::vector<double> x = iota(n);
    auto* on_device = static_cast<double*>(device_allocate(n * sizeof(double)));
    auto* out = static_cast<double*>(device_allocate(sizeof(double)));
    copy_to_device(x.data(), on_device, n * sizeof(double));
    double total = 0;
    launch("sum_past_end", sum_past_end, 1, 1, 0, on_device, n, int64_t{0}, out);
    copy_to_host(out, &total, sizeof(double));
    CHECK(total == doctest::Approx(x[0] + x[1] + x[2] + x[3] + x[4]));
    launch("sum_past_end", sum_past_end, 1, 1, 0, on_device, n, int64_t{1}, out);  // one element too many
    copy_to_host(out, &total, sizeof(double));
    CHECK(std::isnan(total));
    CHECK_THROWS_WITH_AS(launch("write_at", write_at, 1, 1, 0, on_device, n),
                         "kernel write_at: wrote past the end of a device block of 40 bytes (bytes 0 to 7 after its "
                         "end)",
                         std::logic_error);
    CHECK_THROWS_WITH_AS(launch("write_at", write_at, 1, 1, 0, on_device, int64_t{-2}),
                         "kernel write_at: wrote before the start of a device block of 40 bytes (bytes 9 to 16 "
                         "before it)",
                         std::logic_error);
    // the guard zones were restored: a kernel that stays inside is fine again, and reads past the
    // end are NaN again
    launch("write_at", write_at, 1, 1, 0, on_device, n - 1);
    launch("sum_past_end", sum_past_end, 1, 1, 0, on_device, n, int64_t{1}, out);
    copy_to_host(out, &total, sizeof(double));
    CHECK(std::isnan(total));
    device_free(on_device);
    device_free(out);
}

TEST_CASE("block_reduce's tree at row lengths that use every step: a missing barrier at any step is reported") {
    using namespace relgrad;
    using cuda_emulated::kRowThreads;
    using cuda_emulated::row_threads;
    // a row length for each block size row_threads gives (1 to 128 threads), each a little over it
    // so that the last thread has a value of its own: 1, 33, 65, 129, ..., 2049
    std::vector<int64_t> lengths = {1};
    for (int64_t threads = 2; threads <= kRowThreads; threads *= 2) lengths.push_back(16 * threads + 1);
    for (int64_t n : lengths) REQUIRE(row_threads(n) == (n == 1 ? 1 : (n - 1) / 16));
    auto run = [&](auto kernel, int64_t n) {
        const std::vector<double> x = iota(static_cast<int>(n));
        std::vector<double> out(row_threads(n));
        launch("tree_sum_skipping", kernel, 1, row_threads(n), 0, x.data(), n, out.data());
        double expected = 0;
        for (double v : x) expected += v;
        bool right = true;
        for (double total : out) right = right && total == doctest::Approx(expected).epsilon(1e-13);
        return right;
    };
    // the whole tree is right at every length; with one barrier left out, a race is reported at
    // the length with 128 threads, which takes every step
    for (int64_t n : lengths) CHECK(run(tree_sum_skipping<0>, n));
    const auto race = doctest::Contains("kernel tree_sum_skipping, block (0, 0, 0): a race on byte ");
    const int64_t longest = lengths.back();
    CHECK_THROWS_WITH_AS(run(tree_sum_skipping<128>, longest), race, std::logic_error);
    CHECK_THROWS_WITH_AS(run(tree_sum_skipping<64>, longest), race, std::logic_error);
    CHECK_THROWS_WITH_AS(run(tree_sum_skipping<32>, longest), race, std::logic_error);
    CHECK_THROWS_WITH_AS(run(tree_sum_skipping<16>, longest), race, std::logic_error);
    CHECK_THROWS_WITH_AS(run(tree_sum_skipping<8>, longest), race, std::logic_error);
    CHECK_THROWS_WITH_AS(run(tree_sum_skipping<4>, longest), race, std::logic_error);
    CHECK_THROWS_WITH_AS(run(tree_sum_skipping<2>, longest), race, std::logic_error);
    CHECK_THROWS_WITH_AS(run(tree_sum_skipping<1>, longest), race, std::logic_error);
    // the backend's reductions and softmax at those lengths, against the CPU (below: longer rows)
    for (int64_t n : lengths) {
        Generator gen(static_cast<uint64_t>(n));
        const Tensor x = randn({2, n}, gen, DType::float64);
        const std::vector<double> sums = sum(x.to(Device::cuda), {1}).to_vector(), expected = sum(x, {1}).to_vector();
        const std::vector<double> maxes = max(x.to(Device::cuda), {1}).to_vector(), top = max(x, {1}).to_vector();
        const std::vector<double> soft = softmax(x.to(Device::cuda), 1).to_vector(), cpu = softmax(x, 1).to_vector();
        for (int r = 0; r < 2; ++r) {
            CHECK(sums[r] == doctest::Approx(expected[r]).epsilon(1e-12));
            CHECK(maxes[r] == top[r]);
        }
        for (std::size_t i = 0; i < soft.size(); ++i) CHECK(soft[i] == doctest::Approx(cpu[i]).epsilon(1e-12));
    }
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
        // 400 bytes, a block of exactly 400: the emulator's blocks end where their tensors do
        const Tensor x = zeros({100}, DType::float32, Device::cuda);
        CHECK(memory_stats(Device::cuda).live_bytes == before.live_bytes + 400);
        CHECK(memory_stats(Device::cpu).live_bytes == cpu_before.live_bytes);
    }
    const MemoryStats freed = memory_stats(Device::cuda);
    CHECK(freed.live_bytes == before.live_bytes);
    CHECK(freed.cached_bytes >= 400);  // small blocks are cached too
    const Tensor again = zeros({100}, DType::float32, Device::cuda);
    CHECK(memory_stats(Device::cuda).cached_bytes == freed.cached_bytes - 400);  // the same block again
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
