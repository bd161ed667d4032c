// The CUDA emulator's fibers (state.hpp says how the parts fit): each thread of a block runs on a
// stack of its own, switched to and from on the launching OS thread by a dozen instructions of
// x86-64 assembly. The scheduler (launch.cpp) resumes a fiber; the fiber runs the kernel's body
// until it yields back, at a barrier, at a warp point or at its end.
#include "engine/backend/cuda/emulator/state.hpp"

#include <cstdlib>
#include <utility>

#ifdef RELGRAD_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__)
#error "the CUDA emulator's fiber switch is written for x86-64"
#endif

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

thread_local Block* running_block = nullptr;

namespace {

#ifdef RELGRAD_ASAN
constexpr std::size_t kStackBytes = 512 * 1024;  // AddressSanitizer's redzones need room
#else
constexpr std::size_t kStackBytes = 128 * 1024;
#endif

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

}  // namespace

void yield_to_scheduler(bool finished) {
    Block& block = *running_block;
    void* fake_stack = nullptr;
    before_switch_to_scheduler(finished ? nullptr : &fake_stack);
    relgrad_switch_stack(&block.current->stack_pointer, block.scheduler_stack_pointer);
    after_switch_to_fiber(fake_stack);
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

}  // namespace cuda_emulator
}  // namespace relgrad
