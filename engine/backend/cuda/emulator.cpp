// The CUDA emulator (emulator.hpp): a block's threads as fibers on the launching OS thread, switched
// by a dozen instructions of x86-64 assembly, run phase by phase between barriers in shuffled order.
#include "engine/backend/cuda/emulator.hpp"

#include "engine/backend/cuda/mma.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define RELGRAD_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RELGRAD_ASAN 1
#endif
#endif
#ifdef RELGRAD_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__)
#error "the CUDA emulator's fiber switch is written for x86-64"
#endif

thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

// ---------------------------------------------------------------- the fiber switch
//
// relgrad_switch_stack(&save, load): pushes the registers the System V ABI says a call preserves
// (rbp, rbx, r12-r15), stores the stack pointer in *save, loads `load` as the stack pointer, and
// pops the same registers off the other stack: the call returns in the fiber that last stored
// `load`. The registers a call may clobber need no saving (the compiler already assumes they are
// lost across the call), nor do the SSE and x87 control words, which no kernel changes.
extern "C" void relgrad_switch_stack(void** save, void* load);
asm(R"(
    .text
    .globl relgrad_switch_stack
    .type relgrad_switch_stack, @function
relgrad_switch_stack:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size relgrad_switch_stack, .-relgrad_switch_stack
    .section .note.GNU-stack,"",@progbits
)");

namespace relgrad {
namespace cuda_emulator {

namespace {

#ifdef RELGRAD_ASAN
constexpr std::size_t kStackBytes = 512 * 1024;  // AddressSanitizer's redzones need room
#else
constexpr std::size_t kStackBytes = 128 * 1024;
#endif

using Stack = std::unique_ptr<unsigned char[]>;

struct Fiber {
    enum class State { not_started, runnable, at_barrier, at_warp_point, finished };
    State state = State::not_started;
    dim3 index;
    uint64_t linear = 0;            // the thread's index in the block: lane linear % 32 of warp linear / 32
    Stack stack;                    // while it runs or waits; given back when it finishes
    void* stack_pointer = nullptr;  // where relgrad_switch_stack resumes it
    // at a warp point (__syncwarp, __shfl_*_sync): what the lane brought, and what it takes away
    const char* warp_op = nullptr;
    unsigned warp_mask = 0;
    ShuffleKind shuffle_kind = ShuffleKind::none;
    int shuffle_operand = 0;
    uint64_t warp_value = 0, warp_result = 0;
    std::string warp_error;  // thrown by the lane when it goes on
    // cp.async: the copies issued and not landed, in batches (the last one not yet committed)
    struct AsyncCopy {
        void* destination;
        const void* source;
        std::size_t copied, zeroed;
    };
    std::vector<std::vector<AsyncCopy>> async_batches;
    // at mma.sync: the lane's fragments
    struct MmaFragments {
        MmaInputs inputs;
        const uint32_t *a, *b;
        const float* c;
        float* d;
    };
    MmaFragments mma{};
    // at ldmatrix: the row the lane names, and where its registers go
    struct MatrixLoad {
        bool transposed;
        const uint16_t* row;
        uint32_t* out;
    };
    MatrixLoad ldmatrix{};
};

// One block in flight on this OS thread: its fibers and the scheduler's saved stack pointer.
struct Block {
    std::vector<Fiber> fibers;
    std::vector<Stack> spare_stacks;  // a thread that ends before any barrier hands its stack on
    Fiber* current = nullptr;
    void* scheduler_stack_pointer = nullptr;
    const std::function<void()>* thread = nullptr;
    std::exception_ptr error;  // the first exception a thread threw (a kernel must not throw)
    std::vector<unsigned char> dynamic_shared;
    // the static shared arrays, laid out one after another as the threads first ask for them
    std::unique_ptr<unsigned char[]> static_shared{new unsigned char[kMaxStaticSharedBytes]};
    std::vector<std::pair<const void*, std::size_t>> static_offsets;  // (tag, offset)
    std::size_t static_used = 0;
    // The race check (note_shared_access): each byte of shared memory's last write and its reads in
    // the current phase. A phase is a serial number, new at each block's start and each opened
    // barrier (so entries of earlier phases and blocks never match and need no clearing); a warp's
    // epoch counts the warp-scoped points it has passed in this block.
    struct ByteAccesses {
        uint64_t write_phase = 0, read_phase = 0;
        uint32_t writer = 0, write_epoch = 0;
        uint32_t first_reader = 0, other_reader = 0, reader_in_other_warp = 0, read_epoch = 0;
        bool several_readers = false, readers_in_two_warps = false;
    };
    std::vector<ByteAccesses> dynamic_accesses, static_accesses;
    uint64_t phase = 0;
    std::vector<uint32_t> warp_epochs;
    const char* kernel = nullptr;
#ifdef RELGRAD_ASAN
    const void* scheduler_stack_bottom = nullptr;
    std::size_t scheduler_stack_size = 0;
#endif
};

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

thread_local Block* running_block = nullptr;
thread_local Block block_state;
uint64_t seed = 0x5eed;
// the dynamic shared memory each kernel opted in to (set_max_dynamic_shared_bytes), by its address
std::mutex opt_in_mutex;
std::map<KernelAddress, std::size_t> opted_in_shared_bytes;
thread_local uint64_t launches = 0;
thread_local uint64_t phases = 0;  // the serial numbers of Block::phase

// ---------------------------------------------------------------- device memory
//
// A block of n bytes: kGuardBytes of guard zone, the n bytes (aligned to 256, as cudaMalloc's), and
// guard zone to the next 256 bytes past another kGuardBytes. Every byte starts as 0xff; a guard
// byte that is not 0xff after a launch was written by it.
constexpr unsigned char kFill = 0xff;
std::mutex device_blocks_mutex;
std::map<unsigned char*, std::size_t> device_blocks;  // start -> bytes asked for

std::size_t after_zone_bytes(std::size_t nbytes) {
    return (nbytes + 2 * kGuardBytes + 255) / 256 * 256 - nbytes - kGuardBytes;
}

// The first and one past the last byte of [zone, zone + bytes) that is not kFill (first == last: none).
std::pair<std::size_t, std::size_t> written_range(const unsigned char* zone, std::size_t bytes) {
    std::size_t first = 0, last = bytes;
    while (first < bytes && zone[first] == kFill) ++first;
    while (last > first && zone[last - 1] == kFill) --last;
    return {first, last};
}

// Where [source, source + bytes) reads a device block's guard zone: "N bytes before the start of
// a device block of M bytes" (or after its end), or nothing. (Kernels of the tests may also read
// host memory: only the zones around device blocks are known to be wrong.)
std::optional<std::string> read_outside_a_block(const unsigned char* source, std::size_t bytes) {
    const std::lock_guard<std::mutex> lock(device_blocks_mutex);
    const auto next = device_blocks.upper_bound(const_cast<unsigned char*>(source));
    const unsigned char* end = source + bytes;
    if (next != device_blocks.end() && end > next->first - kGuardBytes) {
        return std::to_string(next->first - source) + " bytes before the start of a device block of " +
               std::to_string(next->second) + " bytes";
    }
    if (next != device_blocks.begin()) {
        const auto& [start, nbytes] = *std::prev(next);
        if (end > start + nbytes && source < start + nbytes + after_zone_bytes(nbytes)) {
            return std::to_string(end - (start + nbytes)) + " bytes past the end of a device block of " +
                   std::to_string(nbytes) + " bytes";
        }
    }
    return std::nullopt;
}

// Throws, naming `kernel`, when it wrote into a guard zone (report), restoring every zone either way.
void check_guard_zones(const char* kernel, bool report) {
    std::string error;
    const std::lock_guard<std::mutex> lock(device_blocks_mutex);
    for (const auto& [start, nbytes] : device_blocks) {
        const auto [after_first, after_last] = written_range(start + nbytes, after_zone_bytes(nbytes));
        const auto [before_first, before_last] = written_range(start - kGuardBytes, kGuardBytes);
        if (error.empty() && after_first != after_last) {
            error = "wrote past the end of a device block of " + std::to_string(nbytes) + " bytes (bytes " +
                    std::to_string(after_first) + " to " + std::to_string(after_last - 1) + " after its end)";
        } else if (error.empty() && before_first != before_last) {
            error = "wrote before the start of a device block of " + std::to_string(nbytes) + " bytes (bytes " +
                    std::to_string(kGuardBytes - before_last + 1) + " to " +
                    std::to_string(kGuardBytes - before_first) + " before it)";
        }
        std::memset(start - kGuardBytes, kFill, kGuardBytes);
        std::memset(start + nbytes, kFill, after_zone_bytes(nbytes));
    }
    if (report && !error.empty()) throw std::logic_error(std::string("kernel ") + kernel + ": " + error);
}

// AddressSanitizer must be told of every switch between stacks (its fake stacks and bounds).
#ifdef RELGRAD_ASAN
void* scheduler_fake_stack = nullptr;
void before_switch_to_fiber(Fiber& fiber) {
    __sanitizer_start_switch_fiber(&scheduler_fake_stack, fiber.stack.get(), kStackBytes);
}
void after_switch_to_scheduler() { __sanitizer_finish_switch_fiber(scheduler_fake_stack, nullptr, nullptr); }
void before_switch_to_scheduler(void** fake_stack) {
    __sanitizer_start_switch_fiber(fake_stack, running_block->scheduler_stack_bottom,
                                   running_block->scheduler_stack_size);
}
void after_switch_to_fiber(void* fake_stack) {
    __sanitizer_finish_switch_fiber(fake_stack, &running_block->scheduler_stack_bottom,
                                    &running_block->scheduler_stack_size);
}
#else
void before_switch_to_fiber(Fiber&) {}
void after_switch_to_scheduler() {}
void before_switch_to_scheduler(void**) {}
void after_switch_to_fiber(void*) {}
#endif

// The current fiber gives the OS thread back to the scheduler (at a barrier, or finished).
void yield_to_scheduler(bool finished) {
    Block& block = *running_block;
    void* fake_stack = nullptr;
    before_switch_to_scheduler(finished ? nullptr : &fake_stack);
    relgrad_switch_stack(&block.current->stack_pointer, block.scheduler_stack_pointer);
    after_switch_to_fiber(fake_stack);
}

// Where every fiber starts (entered by the `ret` of relgrad_switch_stack): runs the kernel's body,
// then hands back for good.
[[noreturn]] void fiber_main() {
    after_switch_to_fiber(nullptr);
    Block& block = *running_block;
    try {
        (*block.thread)();
    } catch (...) {
        if (!block.error) block.error = std::current_exception();
    }
    block.current->state = Fiber::State::finished;
    yield_to_scheduler(true);
    std::abort();  // a finished fiber is never resumed
}

// Gives the fiber a stack laid out so that the first switch to it "returns" into fiber_main: a
// stack top aligned to 16 bytes, a null return address for fiber_main (entered as if called),
// fiber_main's address for the `ret`, and six zeroed registers.
void start_on_a_stack(Block& block, Fiber& fiber) {
    if (block.spare_stacks.empty()) block.spare_stacks.emplace_back(new unsigned char[kStackBytes]);
    fiber.stack = std::move(block.spare_stacks.back());
    block.spare_stacks.pop_back();
#ifdef RELGRAD_ASAN
    __asan_unpoison_memory_region(fiber.stack.get(), kStackBytes);
#endif
    auto top = reinterpret_cast<uintptr_t>(fiber.stack.get() + kStackBytes) & ~uintptr_t{15};
    auto* slot = reinterpret_cast<uint64_t*>(top);
    *--slot = 0;                                        // fiber_main's return address
    *--slot = reinterpret_cast<uint64_t>(&fiber_main);  // popped by `ret`
    for (int r = 0; r < 6; ++r) *--slot = 0;            // rbp, rbx, r12-r15
    fiber.stack_pointer = slot;
    fiber.state = Fiber::State::runnable;
}

void resume(Block& block, Fiber& fiber) {
    if (fiber.state == Fiber::State::not_started) start_on_a_stack(block, fiber);
    block.current = &fiber;
    threadIdx = fiber.index;
    before_switch_to_fiber(fiber);
    relgrad_switch_stack(&block.scheduler_stack_pointer, fiber.stack_pointer);
    after_switch_to_scheduler();
    if (fiber.state == Fiber::State::finished) block.spare_stacks.push_back(std::move(fiber.stack));
}

// The lane a shuffling lane reads (-1: its own value, as CUDA gives past the warp's ends).
int shuffle_source(const Fiber& lane) {
    const int own = static_cast<int>(lane.linear % kWarpSize), operand = lane.shuffle_operand;
    switch (lane.shuffle_kind) {
        case ShuffleKind::index: return operand % kWarpSize;
        case ShuffleKind::up: return own - operand < 0 ? -1 : own - operand;
        case ShuffleKind::down: return own + operand >= kWarpSize ? -1 : own + operand;
        case ShuffleKind::xor_lanes: return own ^ operand;
        case ShuffleKind::none: break;
    }
    return -1;
}

std::string lane_list(unsigned mask) {
    std::string out;
    for (int lane = 0; lane < kWarpSize; ++lane) {
        if (mask >> lane & 1u) out += (out.empty() ? "" : ", ") + std::to_string(lane);
    }
    return out;
}

// mma.sync for one warp whose 32 lanes all wait at it: A (16 x K), B (K x 8) and C (16 x 8)
// assembled from the lanes' fragments by the PTX ISA's layouts (mma.hpp), then each lane's
// D = A B + C elements written, summed in double and rounded to float once.
void multiply_accumulate(Fiber* const* lanes) {
    const MmaInputs inputs = lanes[0]->mma.inputs;
    double a[16][16], b[16][8], c[16][8];
    for (int lane = 0; lane < kWarpSize; ++lane) {
        const Fiber::MmaFragments& own = lanes[lane]->mma;
        for (int i = 0; i < mma_a_elements(inputs); ++i) {
            const TilePlace at = mma_a_place(inputs, lane, i);
            a[at.row][at.col] = mma_input(inputs, own.a, i);
        }
        for (int i = 0; i < mma_b_elements(inputs); ++i) {
            const TilePlace at = mma_b_place(inputs, lane, i);
            b[at.row][at.col] = mma_input(inputs, own.b, i);
        }
        for (int i = 0; i < 4; ++i) {
            const TilePlace at = mma_c_place(lane, i);
            c[at.row][at.col] = own.c[i];
        }
    }
    for (int lane = 0; lane < kWarpSize; ++lane) {  // after every C is read: a lane's d may be its c
        for (int i = 0; i < 4; ++i) {
            const TilePlace at = mma_c_place(lane, i);
            double sum = c[at.row][at.col];
            for (int k = 0; k < mma_k(inputs); ++k) sum += a[at.row][k] * b[k][at.col];
            lanes[lane]->mma.d[i] = static_cast<float>(sum);
        }
    }
}

// ldmatrix.m8n8.x4 of the warp's lanes: matrix m's row r is the 8 values at the address lane 8 m + r
// named; lane l gets in register m its row l / 4, columns 2 (l % 4) and + 1, or, transposed, its
// column l / 4, rows 2 (l % 4) and + 1 (the lower index in the low half).
void load_matrices(Fiber* const* lanes) {
    const bool transposed = lanes[0]->ldmatrix.transposed;
    for (int lane = 0; lane < kWarpSize; ++lane) {
        for (int m = 0; m < 4; ++m) {
            const auto value = [&](int row, int col) { return uint32_t{lanes[8 * m + row]->ldmatrix.row[col]}; };
            const int g = lane / 4, t = lane % 4;
            lanes[lane]->ldmatrix.out[m] =
                transposed ? value(2 * t, g) | value(2 * t + 1, g) << 16 : value(g, 2 * t) | value(g, 2 * t + 1) << 16;
        }
    }
}

// Lets every warp whose lanes of the mask all wait at the same warp point go on, with what each
// lane reads; returns whether one went on. A lane of the mask that is not there yet holds its warp.
// Lanes at one point with other masks or other operations, or a lane that reads a lane outside the
// mask, are errors (CUDA leaves them undefined): the lane throws when it goes on.
bool release_warps(Block& block) {
    bool released = false;
    const std::size_t threads = block.fibers.size();
    for (std::size_t first = 0; first < threads; first += kWarpSize) {
        Fiber* lanes[kWarpSize] = {};
        unsigned waiting = 0;
        for (std::size_t t = first; t < std::min(threads, first + kWarpSize); ++t) {
            lanes[t - first] = &block.fibers[t];
            if (block.fibers[t].state == Fiber::State::at_warp_point) waiting |= 1u << (t - first);
        }
        if (!waiting) continue;
        const Fiber& leader = *lanes[__builtin_ctz(waiting)];
        const unsigned mask = leader.warp_mask;
        if ((waiting & mask) != mask) continue;  // some lane of the mask is not there yet
        for (int lane = 0; lane < kWarpSize; ++lane) {
            if (!(mask >> lane & 1u)) continue;
            Fiber& fiber = *lanes[lane];
            fiber.warp_error.clear();
            if (fiber.warp_mask != mask || std::strcmp(fiber.warp_op, leader.warp_op) != 0) {
                fiber.warp_error = std::string(fiber.warp_op) + " with mask of lanes " + lane_list(fiber.warp_mask) +
                                   " met " + leader.warp_op + " with mask of lanes " + lane_list(mask) +
                                   " (the lanes of a mask must all call one operation with one mask)";
            } else if (fiber.shuffle_kind != ShuffleKind::none) {
                const int source = shuffle_source(fiber);
                if (source < 0) {
                    fiber.warp_result = fiber.warp_value;
                } else if (!(mask >> source & 1u)) {
                    fiber.warp_error = std::string(fiber.warp_op) + ": lane " + std::to_string(lane) +
                                       " reads lane " + std::to_string(source) + ", which is not in the mask (lanes " +
                                       lane_list(mask) + ")";
                } else {
                    fiber.warp_result = lanes[source]->warp_value;
                }
            }
            fiber.state = Fiber::State::runnable;
        }
        ++block.warp_epochs[first / kWarpSize];
        const bool agreed =
            std::none_of(lanes, lanes + kWarpSize, [&](const Fiber* f) { return f && !f->warp_error.empty(); });
        if (leader.mma.d && agreed) multiply_accumulate(lanes);
        if (leader.ldmatrix.out && agreed) load_matrices(lanes);
        released = true;
    }
    return released;
}

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

void* allocate_device_memory(std::size_t nbytes) {
    const std::size_t total = kGuardBytes + nbytes + after_zone_bytes(nbytes);
    auto* raw = static_cast<unsigned char*>(std::aligned_alloc(256, total));
    if (!raw) return nullptr;
    std::memset(raw, kFill, total);
    const std::lock_guard<std::mutex> lock(device_blocks_mutex);
    device_blocks.emplace(raw + kGuardBytes, nbytes);
    return raw + kGuardBytes;
}

void free_device_memory(void* block) {
    {
        const std::lock_guard<std::mutex> lock(device_blocks_mutex);
        device_blocks.erase(static_cast<unsigned char*>(block));
    }
    std::free(static_cast<unsigned char*>(block) - kGuardBytes);
}

void* dynamic_shared_memory() {
    if (!running_block) throw std::logic_error("dynamic shared memory outside a kernel");
    return running_block->dynamic_shared.data();
}

void* static_shared_memory(const void* tag, std::size_t bytes, std::size_t alignment) {
    if (!running_block) throw std::logic_error("shared memory outside a kernel");
    Block& block = *running_block;
    for (const auto& [known, offset] : block.static_offsets) {
        if (known == tag) return block.static_shared.get() + offset;
    }
    const std::size_t offset = (block.static_used + alignment - 1) / alignment * alignment;
    if (offset + bytes > kMaxStaticSharedBytes) {
        throw std::logic_error("a block's static shared memory exceeds " + std::to_string(kMaxStaticSharedBytes) +
                               " bytes");
    }
    std::memset(block.static_shared.get() + offset, kFill, bytes);
    block.static_offsets.emplace_back(tag, offset);
    block.static_used = offset + bytes;
    return block.static_shared.get() + offset;
}

void set_seed(uint64_t new_seed) { seed = new_seed; }

}  // namespace cuda_emulator
}  // namespace relgrad

namespace relgrad {
namespace cuda_emulator {

uint64_t warp_point(const char* op, unsigned mask, uint64_t value, ShuffleKind kind, int operand) {
    if (!running_block || !running_block->current) throw std::logic_error(std::string(op) + " outside a kernel");
    Fiber& lane = *running_block->current;
    const unsigned own = static_cast<unsigned>(lane.linear % kWarpSize);
    const std::size_t warp_start = lane.linear - own, threads = running_block->fibers.size();
    const std::size_t lanes = std::min<std::size_t>(threads - warp_start, kWarpSize);
    const unsigned exists = lanes == kWarpSize ? ~0u : (1u << lanes) - 1;
    if (!(mask >> own & 1u)) {
        throw std::logic_error(std::string(op) + ": lane " + std::to_string(own) + " is not in its own mask (lanes " +
                               lane_list(mask) + ")");
    }
    if (mask & ~exists) {
        throw std::logic_error(std::string(op) + ": the mask names lanes " + lane_list(mask & ~exists) +
                               ", which the block does not have");
    }
    if (kind == ShuffleKind::xor_lanes && (operand < 0 || operand >= kWarpSize)) {
        throw std::logic_error(std::string(op) + ": a lane mask of " + std::to_string(operand) + " (0 to 31)");
    }
    if ((kind == ShuffleKind::up || kind == ShuffleKind::down) && operand < 0) {
        throw std::logic_error(std::string(op) + ": a negative delta (" + std::to_string(operand) + ")");
    }
    lane.warp_op = op;
    lane.warp_mask = mask;
    lane.shuffle_kind = kind;
    lane.shuffle_operand = operand;
    lane.warp_value = value;
    lane.state = Fiber::State::at_warp_point;
    yield_to_scheduler(false);
    if (!lane.warp_error.empty()) throw std::logic_error(lane.warp_error);
    return lane.warp_result;
}

void note_shared_access(const void* address, std::size_t bytes, bool write) {
    if (!running_block || !running_block->current) throw std::logic_error("a shared-memory access outside a kernel");
    Block& block = *running_block;
    const auto* first = static_cast<const unsigned char*>(address);
    const unsigned char* dynamic_start = block.dynamic_shared.data();
    const unsigned char* static_start = block.static_shared.get();
    const uint32_t me = static_cast<uint32_t>(block.current->linear), my_warp = me / kWarpSize;
    const auto describe = [&](uint32_t thread) { return "thread " + std::to_string(thread); };
    const auto fail = [&](const std::string& what) {
        throw std::logic_error(std::string("kernel ") + block.kernel + ", block (" + std::to_string(blockIdx.x) + ", " +
                               std::to_string(blockIdx.y) + ", " + std::to_string(blockIdx.z) + "): " + what);
    };
    Block::ByteAccesses* accesses = nullptr;
    std::string region;
    std::size_t offset = 0;
    if (first >= dynamic_start && first + bytes <= dynamic_start + block.dynamic_shared.size()) {
        offset = static_cast<std::size_t>(first - dynamic_start);
        accesses = block.dynamic_accesses.data() + offset;
        region = "dynamic";
    } else if (first >= static_start && first + bytes <= static_start + block.static_used) {
        offset = static_cast<std::size_t>(first - static_start);
        if (block.static_accesses.size() < block.static_used) block.static_accesses.resize(block.static_used);
        accesses = block.static_accesses.data() + offset;
        region = "static";
    } else {
        fail(describe(me) + (write ? " wrote " : " read ") + std::to_string(bytes) +
             " bytes outside the block's shared memory");
    }
    const uint32_t epoch = block.warp_epochs[my_warp];
    // another thread's access is ordered before mine by a barrier (another phase), or, for a lane of
    // my warp, by a warp-scoped point since
    const auto unordered = [&](uint32_t other, uint32_t other_epoch) {
        return other != me && !(other / kWarpSize == my_warp && other_epoch != epoch);
    };
    const auto race = [&](uint32_t other, const char* other_did, std::size_t byte) {
        fail("a race on byte " + std::to_string(offset + byte) + " of " + region + " shared memory: " +
             describe(other) + " " + other_did + " it and " + describe(me) + (write ? " wrote" : " read") +
             " it with no __syncthreads() between them (nor, for lanes of one warp, a warp-scoped point)");
    };
    for (std::size_t byte = 0; byte < bytes; ++byte) {
        Block::ByteAccesses& a = accesses[byte];
        if (a.write_phase == block.phase && unordered(a.writer, a.write_epoch)) race(a.writer, "wrote", byte);
        if (write) {
            if (a.read_phase == block.phase) {  // a read by another thread not ordered before this write?
                if (a.first_reader / kWarpSize != my_warp) race(a.first_reader, "read", byte);
                if (a.readers_in_two_warps) race(a.reader_in_other_warp, "read", byte);
                if (a.read_epoch == epoch && (a.first_reader != me || a.several_readers)) {
                    race(a.first_reader != me ? a.first_reader : a.other_reader, "read", byte);
                }
            }
            a.write_phase = block.phase;
            a.writer = me;
            a.write_epoch = epoch;
        } else if (a.read_phase != block.phase) {
            a = {a.write_phase, block.phase, a.writer, a.write_epoch, me, me, me, epoch, false, false};
        } else if (my_warp == a.first_reader / kWarpSize && a.read_epoch != epoch) {
            // my warp's reads so far are ordered before its lanes' writes from now on by a warp-scoped
            // point: they are forgotten (a read by another warp in this phase is kept)
            a.first_reader = a.other_reader = me;
            a.read_epoch = epoch;
            a.several_readers = false;
        } else {
            if (me != a.first_reader && !a.several_readers) a.several_readers = true, a.other_reader = me;
            if (my_warp != a.first_reader / kWarpSize && !a.readers_in_two_warps) {
                a.readers_in_two_warps = true, a.reader_in_other_warp = me;
            }
            if (my_warp == a.first_reader / kWarpSize) a.read_epoch = epoch;
        }
    }
}

void mma_sync_point(MmaInputs inputs, float* d, const uint32_t* a, const uint32_t* b, const float* c) {
    const char* op = inputs == MmaInputs::tf32       ? "mma.sync.m16n8k8 (tf32)"
                     : inputs == MmaInputs::bfloat16 ? "mma.sync.m16n8k16 (bfloat16)"
                                                     : "mma.sync.m16n8k16 (float16)";
    if (!running_block || !running_block->current) throw std::logic_error(std::string(op) + " outside a kernel");
    Fiber& lane = *running_block->current;
    lane.mma = {inputs, a, b, c, d};
    struct Clear {  // the fragments are the lane's only while it waits
        Fiber& lane;
        ~Clear() { lane.mma = {}; }
    } clear{lane};
    warp_point(op, ~0u, 0, ShuffleKind::none, 0);  // all 32 lanes, as .aligned requires
}

void ldmatrix_point(bool transposed, const void* row, uint32_t* out) {
    // a name that is no string of the lane's own, which a failed launch, leaving the lane's stack
    // where it stands, would never free
    const char* const op = transposed ? "ldmatrix.sync.m8n8.x4.trans.shared.b16" : "ldmatrix.sync.m8n8.x4.shared.b16";
    if (!running_block || !running_block->current) throw std::logic_error(std::string(op) + " outside a kernel");
    Fiber& lane = *running_block->current;
    if (reinterpret_cast<uintptr_t>(row) % 16) {
        throw std::logic_error(std::string(op) + ": lane " + std::to_string(lane.linear % kWarpSize) +
                               " names a row that does not start at a 16-byte boundary");
    }
    note_shared_access(row, 16, false);  // also refuses a row outside the block's shared memory
    lane.ldmatrix = {transposed, static_cast<const uint16_t*>(row), out};
    struct Clear {  // the row and the registers are the lane's only while it waits
        Fiber& lane;
        ~Clear() { lane.ldmatrix = {}; }
    } clear{lane};
    warp_point(op, ~0u, 0, ShuffleKind::none, 0);  // all 32 lanes, as .aligned requires
}

}  // namespace cuda_emulator
}  // namespace relgrad

namespace {
relgrad::cuda_emulator::Fiber& pipeline_thread(const char* op) {
    using namespace relgrad::cuda_emulator;
    if (!running_block || !running_block->current) throw std::logic_error(std::string(op) + " outside a kernel");
    return *running_block->current;
}
}  // namespace

void __pipeline_memcpy_async(void* dst_shared, const void* src_global, std::size_t size_and_align, std::size_t zfill) {
    using namespace relgrad::cuda_emulator;
    Fiber& thread = pipeline_thread("__pipeline_memcpy_async");
    const std::string op = "__pipeline_memcpy_async of " + std::to_string(size_and_align) + " bytes: ";
    if (size_and_align != 4 && size_and_align != 8 && size_and_align != 16) {
        throw std::logic_error(op + "copies 4, 8 or 16 bytes");
    }
    if (zfill > size_and_align)
        throw std::logic_error(op + "zfill " + std::to_string(zfill) + " is more than the copy");
    if (reinterpret_cast<uintptr_t>(dst_shared) % size_and_align ||
        reinterpret_cast<uintptr_t>(src_global) % size_and_align) {
        throw std::logic_error(op + "an address not aligned to the copy's size");
    }
    const Block& block = *running_block;
    const auto* destination = static_cast<const unsigned char*>(dst_shared);
    const auto inside = [&](const unsigned char* begin, std::size_t bytes) {
        return destination >= begin && destination + size_and_align <= begin + bytes;
    };
    if (!inside(block.dynamic_shared.data(), block.dynamic_shared.size()) &&
        !inside(block.static_shared.get(), block.static_used)) {
        throw std::logic_error(op + "the destination is not the block's shared memory");
    }
    const std::size_t copied = size_and_align - zfill;
    if (copied > 0) {
        if (const auto outside = read_outside_a_block(static_cast<const unsigned char*>(src_global), copied)) {
            throw std::logic_error(op + "the source reads " + *outside);
        }
    }
    thread.async_batches.back().push_back({dst_shared, src_global, copied, zfill});
}

void __pipeline_commit() { pipeline_thread("__pipeline_commit").async_batches.emplace_back(); }

void __pipeline_wait_prior(std::size_t prior) {
    auto& batches = pipeline_thread("__pipeline_wait_prior").async_batches;
    // batches.back() is the open one; the committed ones before it land, oldest first, but `prior`
    while (batches.size() - 1 > prior) {
        for (const auto& copy : batches.front()) {
            relgrad::cuda_emulator::note_shared_access(copy.destination, copy.copied + copy.zeroed, true);
            std::memcpy(copy.destination, copy.source, copy.copied);
            std::memset(static_cast<unsigned char*>(copy.destination) + copy.copied, 0, copy.zeroed);
        }
        batches.erase(batches.begin());
    }
}

void __syncwarp(unsigned mask) {
    relgrad::cuda_emulator::warp_point("__syncwarp", mask, 0, relgrad::cuda_emulator::ShuffleKind::none, 0);
}

void __syncthreads() {
    using namespace relgrad::cuda_emulator;
    if (!running_block || !running_block->current) throw std::logic_error("__syncthreads() outside a kernel");
    running_block->current->state = Fiber::State::at_barrier;
    yield_to_scheduler(false);
}
