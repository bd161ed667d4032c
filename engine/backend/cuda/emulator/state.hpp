// The CUDA emulator's parts and the state they share. emulator.hpp is the emulator's one public
// header (what a kernel and the CUDA backend call); this one is for the parts alone:
//
//   fibers.cpp         each thread of a block as a fiber, a stack of its own switched to and from
//                      on the launching OS thread; a thread yields at a barrier or a warp point
//   launch.cpp         a launch (run_grid): its limits checked, its blocks one at a time, each
//                      block's threads resumed phase by phase in shuffled orders; __syncthreads
//   warps.cpp          the warp-scoped points (__syncwarp, the shuffles, mma.sync, ldmatrix): a lane
//                      waits until every lane of its mask has come, then each takes its result
//   shared_memory.cpp  a block's shared memory, the race check on each access to it, and cp.async's
//                      copies into it
//   device_memory.cpp  device memory between guard zones, checked for writes after each launch
//
// How they fit: run_grid (launch.cpp) fills one Block with a Fiber per thread and runs the block:
// it resumes each runnable fiber (fibers.cpp) until the fiber yields back; a fiber at a warp point
// waits until release_warps (warps.cpp) lets its warp go on; when every fiber waits at
// __syncthreads() the barrier opens and a new phase starts. Every access to shared memory is noted
// against the phase it happens in (shared_memory.cpp), and the launch ends with the guard zones
// checked (device_memory.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend/cuda/emulator.hpp"
#include "engine/backend/cuda/mma.hpp"

// RELGRAD_ASAN: AddressSanitizer instruments this build (a Block then keeps the scheduler's stack
// bounds, and the fibers' stacks are larger).
#if defined(__SANITIZE_ADDRESS__)
#define RELGRAD_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RELGRAD_ASAN 1
#endif
#endif

namespace relgrad {
namespace cuda_emulator {

using Stack = std::unique_ptr<unsigned char[]>;

// One thread of the running block: its state, its stack, and what it brings to the warp point it
// waits at.
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
    // epoch counts the __syncwarp()s it has passed in this block (the one warp-scoped point that
    // orders memory: shuffles, mma.sync and ldmatrix do not).
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

// The block this OS thread runs (nullptr outside a launch); its `current` fiber is the running thread.
extern thread_local Block* running_block;

// fibers.cpp: starts or resumes `fiber` until it yields; the running fiber gives the OS thread back
// to the scheduler (at a barrier or a warp point, or `finished`).
void resume(Block& block, Fiber& fiber);
void yield_to_scheduler(bool finished);

// warps.cpp: lets every warp whose lanes of the mask all wait at one warp point go on; returns
// whether one went on. lane_list(0b1011) is "0, 1, 3".
bool release_warps(Block& block);
std::string lane_list(unsigned mask);

// device_memory.cpp: what every byte of device memory and of a block's shared memory starts as
// (NaN in floats); where a read of `bytes` at `source` reaches into a device block's guard zone;
// and the guard zones checked after a launch.
constexpr unsigned char kFill = 0xff;
std::optional<std::string> read_outside_a_block(const unsigned char* source, std::size_t bytes);
void check_guard_zones(const char* kernel, bool report);

}  // namespace cuda_emulator
}  // namespace relgrad
