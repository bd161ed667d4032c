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
    enum class State { not_started, runnable, at_barrier, finished };
    State state = State::not_started;
    dim3 index;
    Stack stack;                    // while it runs or waits; given back when it finishes
    void* stack_pointer = nullptr;  // where relgrad_switch_stack resumes it
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

// Runs one block to its end, phase by phase: every runnable thread in a fresh shuffled order, each
// until its next barrier or its end.
void run_block(const char* kernel, Block& block, OrderGenerator& orders) {
    std::vector<Fiber*> order;
    for (Fiber& fiber : block.fibers) {
        fiber.state = Fiber::State::not_started;
        order.push_back(&fiber);
    }
    while (true) {
        orders.shuffle(order);
        for (Fiber* fiber : order) resume(block, *fiber);
        if (block.error) {
            // threads waiting at a barrier are dropped where they stand; their stacks are kept
            for (Fiber* fiber : order) {
                if (fiber->stack) block.spare_stacks.push_back(std::move(fiber->stack));
            }
            std::rethrow_exception(std::exchange(block.error, nullptr));
        }
        const auto waiting = std::count_if(order.begin(), order.end(),
                                           [](const Fiber* f) { return f->state == Fiber::State::at_barrier; });
        if (waiting == 0) return;
        if (static_cast<std::size_t>(waiting) != order.size()) {
            for (Fiber* fiber : order) {
                if (fiber->stack) block.spare_stacks.push_back(std::move(fiber->stack));
            }
            throw std::logic_error(std::string("kernel ") + kernel + ": " + std::to_string(waiting) + " of " +
                                   std::to_string(order.size()) +
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

void __syncthreads() {
    using namespace relgrad::cuda_emulator;
    if (!running_block || !running_block->current) throw std::logic_error("__syncthreads() outside a kernel");
    running_block->current->state = Fiber::State::at_barrier;
    yield_to_scheduler(false);
}
