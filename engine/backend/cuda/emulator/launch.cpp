// The CUDA emulator's launches (state.hpp says how the parts fit): run_grid checks a launch against
// the limits of a GPU, then runs its blocks one at a time in a shuffled order. A block's threads
// run phase by phase: between two barriers, every thread in an order drawn afresh, each to its next
// barrier, warp point or end. A barrier that some threads never reach is an error.
#include "engine/backend/cuda/emulator/state.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <stdexcept>

thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace relgrad {
namespace cuda_emulator {

namespace {

// The orders: splitmix64 draws and a Fisher-Yates shuffle (std::shuffle's distribution costs more
// than the fiber switches it orders).
struct OrderGenerator {
    uint64_t state;
    uint64_t next() {
        uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }
    template <class T>
    void shuffle(std::vector<T>& items) {
        for (std::size_t i = items.size(); i > 1; --i) std::swap(items[i - 1], items[next() % i]);
    }
};

thread_local Block block_state;
uint64_t seed = 0x5eed;
// the dynamic shared memory each kernel opted in to (set_max_dynamic_shared_bytes), by its address
std::mutex opt_in_mutex;
std::map<KernelAddress, std::size_t> opted_in_shared_bytes;
thread_local uint64_t launches = 0;
thread_local uint64_t phases = 0;  // the serial numbers of Block::phase

// Runs one block to its end, phase by phase: every runnable thread in a fresh shuffled order, each
// until its next barrier, its next warp point or its end; then the warps whose lanes have met go on,
// until every thread waits at the block's barrier (which then opens) or has ended.
void run_block(const char* kernel, Block& block, OrderGenerator& orders) {
    std::vector<Fiber*> order;
    for (Fiber& fiber : block.fibers) {
        fiber.state = Fiber::State::not_started;
        fiber.async_batches.assign(1, {});
        // what a lane of an earlier block left at a warp point it never passed (a failed launch)
        fiber.mma = {};
        fiber.ldmatrix = {};
        order.push_back(&fiber);
    }
    block.kernel = kernel;
    block.phase = ++phases;
    block.warp_epochs.assign((block.fibers.size() + kWarpSize - 1) / kWarpSize, 0);
    if (block.dynamic_accesses.size() < block.dynamic_shared.size())
        block.dynamic_accesses.resize(block.dynamic_shared.size());
    const auto fail = [&](const std::string& what) {
        // threads waiting at a barrier are dropped where they stand; their stacks are kept
        for (Fiber* fiber : order) {
            if (fiber->stack) block.spare_stacks.push_back(std::move(fiber->stack));
        }
        throw std::logic_error(std::string("kernel ") + kernel + ": " + what);
    };
    while (true) {
        orders.shuffle(order);
        for (Fiber* fiber : order) {
            if (fiber->state == Fiber::State::not_started || fiber->state == Fiber::State::runnable) {
                resume(block, *fiber);
            }
        }
        if (block.error) {
            for (Fiber* fiber : order) {
                if (fiber->stack) block.spare_stacks.push_back(std::move(fiber->stack));
            }
            std::rethrow_exception(std::exchange(block.error, nullptr));
        }
        if (release_warps(block)) continue;
        for (const Fiber* fiber : order) {
            if (fiber->state != Fiber::State::at_warp_point) continue;
            unsigned missing = 0;
            for (int lane = 0; lane < kWarpSize; ++lane) {
                const uint64_t t = fiber->linear - fiber->linear % kWarpSize + lane;
                if ((fiber->warp_mask >> lane & 1u) &&
                    (t >= block.fibers.size() || block.fibers[t].state != Fiber::State::at_warp_point)) {
                    missing |= 1u << lane;
                }
            }
            fail("lane " + std::to_string(fiber->linear % kWarpSize) + " of warp " +
                 std::to_string(fiber->linear / kWarpSize) + " waits at " + fiber->warp_op + " for lanes " +
                 lane_list(missing) + " of its mask, which never reach it");
        }
        const auto waiting = static_cast<std::size_t>(std::count_if(
            order.begin(), order.end(), [](const Fiber* f) { return f->state == Fiber::State::at_barrier; }));
        if (waiting == 0) {
            for (const Fiber* fiber : order) {
                std::size_t never_landed = 0;
                for (const auto& batch : fiber->async_batches) never_landed += batch.size();
                if (never_landed) {
                    fail("thread " + std::to_string(fiber->linear) + " ended with " + std::to_string(never_landed) +
                         " cp.async copies that never landed (no __pipeline_commit and __pipeline_wait_prior "
                         "covering them)");
                }
            }
            return;
        }
        if (waiting != order.size()) {
            fail(std::to_string(waiting) + " of " + std::to_string(order.size()) +
                 " threads of a block wait at __syncthreads() that the others never reach");
        }
        for (Fiber* fiber : order) fiber->state = Fiber::State::runnable;  // the barrier opens
        block.phase = ++phases;
    }
}

}  // namespace

void set_max_dynamic_shared_bytes(const char* kernel, KernelAddress address, std::size_t bytes) {
    if (bytes > kMaxOptInDynamicSharedBytes) {
        throw std::logic_error(std::string("kernel ") + kernel + ": an opt-in to " + std::to_string(bytes) +
                               " bytes of dynamic shared memory (CUDA allows at most " +
                               std::to_string(kMaxOptInDynamicSharedBytes) + ")");
    }
    const std::lock_guard<std::mutex> lock(opt_in_mutex);
    opted_in_shared_bytes[address] = bytes;
}

void run_grid(const char* kernel, KernelAddress address, dim3 grid, dim3 block, std::size_t dynamic_shared_bytes,
              const std::function<void()>& thread) {
    const auto refuse = [kernel](const std::string& what) {
        throw std::logic_error(std::string("kernel ") + kernel + ": " + what);
    };
    const uint64_t threads = uint64_t{block.x} * block.y * block.z;
    const uint64_t blocks = uint64_t{grid.x} * grid.y * grid.z;
    if (threads == 0 || threads > kMaxThreadsPerBlock) {
        refuse("a block of " + std::to_string(threads) + " threads (CUDA allows 1 to " +
               std::to_string(kMaxThreadsPerBlock) + ")");
    }
    const unsigned block_dims[3] = {block.x, block.y, block.z}, grid_dims[3] = {grid.x, grid.y, grid.z};
    for (int axis = 0; axis < 3; ++axis) {
        const std::string name(1, "xyz"[axis]);
        if (block_dims[axis] > kMaxBlockDim[axis]) {
            refuse("blockDim." + name + " = " + std::to_string(block_dims[axis]) + " (CUDA allows at most " +
                   std::to_string(kMaxBlockDim[axis]) + ")");
        }
        if (grid_dims[axis] > kMaxGridDim[axis]) {
            refuse("gridDim." + name + " = " + std::to_string(grid_dims[axis]) + " (CUDA allows at most " +
                   std::to_string(kMaxGridDim[axis]) + ")");
        }
    }
    std::size_t allowed = kMaxDynamicSharedBytes;
    {
        const std::lock_guard<std::mutex> lock(opt_in_mutex);
        const auto opted_in = opted_in_shared_bytes.find(address);
        if (opted_in != opted_in_shared_bytes.end()) allowed = std::max(allowed, opted_in->second);
    }
    if (dynamic_shared_bytes > allowed) {
        refuse(std::to_string(dynamic_shared_bytes) + " bytes of dynamic shared memory (at most " +
               std::to_string(allowed) +
               (allowed == kMaxDynamicSharedBytes ? " without an opt-in: cudaFuncSetAttribute)" : " as opted in)"));
    }
    if (blocks == 0) refuse("an empty grid");
    if (running_block) throw std::logic_error(std::string("kernel ") + kernel + ": launched from inside a kernel");

    Block& state = block_state;
    state.fibers.resize(threads);
    for (uint64_t t = 0; t < threads; ++t) {
        state.fibers[t].linear = t;
        state.fibers[t].index = dim3(static_cast<unsigned>(t % block.x), static_cast<unsigned>(t / block.x % block.y),
                                     static_cast<unsigned>(t / (uint64_t{block.x} * block.y)));
    }
    state.thread = &thread;
    OrderGenerator orders{seed + 0x9e3779b97f4a7c15ULL * ++launches};
    std::vector<uint64_t> block_order(blocks);
    for (uint64_t b = 0; b < blocks; ++b) block_order[b] = b;
    orders.shuffle(block_order);

    gridDim = grid;
    blockDim = block;
    running_block = &state;
    struct Leave {  // the thread is outside any kernel again, however the launch ends
        ~Leave() { running_block = nullptr; }
    } leave;
    try {
        for (uint64_t b : block_order) {
            blockIdx = dim3(static_cast<unsigned>(b % grid.x), static_cast<unsigned>(b / grid.x % grid.y),
                            static_cast<unsigned>(b / (uint64_t{grid.x} * grid.y)));
            state.dynamic_shared.assign(dynamic_shared_bytes, kFill);
            state.static_offsets.clear();  // each array is filled with 0xff as a thread first asks for it
            state.static_used = 0;
            run_block(kernel, state, orders);
        }
    } catch (...) {
        check_guard_zones(kernel, false);  // the kernel's own error is the one to report
        throw;
    }
    check_guard_zones(kernel, true);
}

void set_seed(uint64_t new_seed) { seed = new_seed; }

}  // namespace cuda_emulator
}  // namespace relgrad

void __syncthreads() {
    using namespace relgrad::cuda_emulator;
    if (!running_block || !running_block->current) throw std::logic_error("__syncthreads() outside a kernel");
    running_block->current->state = Fiber::State::at_barrier;
    yield_to_scheduler(false);
}
