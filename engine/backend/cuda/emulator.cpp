// The CUDA emulator (emulator.hpp): a block's threads as fibers on the launching OS thread, switched
// by a dozen instructions of x86-64 assembly, run phase by phase between barriers in shuffled order.
#include "engine/backend/cuda/emulator.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
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
        order.push_back(&fiber);
    }
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
        if (waiting == 0) return;
        if (waiting != order.size()) {
            fail(std::to_string(waiting) + " of " + std::to_string(order.size()) +
                 " threads of a block wait at __syncthreads() that the others never reach");
        }
        for (Fiber* fiber : order) fiber->state = Fiber::State::runnable;  // the barrier opens
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
    for (uint64_t b : block_order) {
        blockIdx = dim3(static_cast<unsigned>(b % grid.x), static_cast<unsigned>(b / grid.x % grid.y),
                        static_cast<unsigned>(b / (uint64_t{grid.x} * grid.y)));
        state.dynamic_shared.assign(dynamic_shared_bytes, 0xff);
        state.static_offsets.clear();  // each array is filled with 0xff as a thread first asks for it
        state.static_used = 0;
        run_block(kernel, state, orders);
    }
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
    std::memset(block.static_shared.get() + offset, 0xff, bytes);
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

}  // namespace cuda_emulator
}  // namespace relgrad

void __syncwarp(unsigned mask) {
    relgrad::cuda_emulator::warp_point("__syncwarp", mask, 0, relgrad::cuda_emulator::ShuffleKind::none, 0);
}

void __syncthreads() {
    using namespace relgrad::cuda_emulator;
    if (!running_block || !running_block->current) throw std::logic_error("__syncthreads() outside a kernel");
    running_block->current->state = Fiber::State::at_barrier;
    yield_to_scheduler(false);
}
