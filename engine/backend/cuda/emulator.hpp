// relgrad: CUDA's execution model emulated on the host, so that the CUDA backend's kernels run and
// are tested on machines without a GPU.
//
// The kernel sources (engine/backend/cuda/*.cu) are compiled a second time by the host compiler
// with RELGRAD_CUDA_EMULATION defined; runtime.hpp then includes this header instead of CUDA's.
// What a kernel sees is CUDA's:
//   - threadIdx, blockIdx, blockDim and gridDim;
//   - shared memory, static (RELGRAD_SHARED, for __shared__ T name[n]) and dynamic
//     (RELGRAD_DYNAMIC_SHARED, for extern __shared__), one copy per block, filled with 0xff bytes
//     (NaN in floats) as each block starts: a read before any write shows, and nothing is left
//     over from an earlier block;
//   - __syncthreads(), a real barrier.
// Each thread of a block is a fiber with a stack of its own (the stack of a thread that has ended is
// handed to the next one to start), on the launching OS thread. Between two barriers, the threads run
// one after another to the next barrier, in an order drawn afresh for every phase (and the blocks
// in a shuffled order). So a kernel that reads shared memory another thread writes without a
// barrier in between reads it before the write in some orders and after it in others; and such a
// race on shared memory is reported as it happens (Shared<T>, below; tests/engine/
// test_cuda_emulator.cpp shows races and missing barriers caught).
// A barrier that some threads of a block skip, or a thread that exits while others wait at one,
// is an error (CUDA leaves it undefined).
//
// Device memory (allocate_device_memory) is host memory laid out as a GPU's is not: each block
// begins and ends where its tensor does, between guard zones of kGuardBytes, and is filled with
// 0xff bytes as it is allocated. A read past a tensor's end (or before its start) reads NaN, which
// shows in every result it reaches; a write there is reported when the launch ends, naming the
// kernel (what compute-sanitizer's memcheck reports on a GPU).
//
// Warps: __syncwarp and the __shfl_*_sync shuffles are warp-scoped barriers of their own (below);
// between two of them the lanes run one after another like the threads between block barriers, so
// code that leans on lanes running in lockstep without them shows as a race.
//
// cp.async (below): a copy lands in shared memory only at the wait that covers it. mma.sync
// (mma.hpp): the warp's tiles are assembled from the lanes' fragments as the PTX ISA lays them out;
// ldmatrix (mma.hpp) hands each lane the values the PTX ISA gives it from the rows the lanes name.
//
// What it cannot show: timing, memory coalescing, bank conflicts, real concurrency between blocks
// (they run one at a time), atomics (relgrad's kernels use none), the tensor cores' rounding.
// docs/backends.md says more. The implementation is in emulator/, one file per part (fibers,
// launches, warp points, shared memory and its race check, device memory); emulator/state.hpp says
// how they fit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <type_traits>

#ifndef RELGRAD_CUDA_EMULATION
#error "emulator.hpp is for the kernels compiled with RELGRAD_CUDA_EMULATION (runtime.hpp includes it)"
#endif

// CUDA's built-in types and variables, in the global namespace as CUDA has them. dim3 is also the
// type of threadIdx and blockIdx here (uint3 in CUDA: the same three unsigned fields).
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
extern thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

// Waits until every thread of the block has reached it: the running fiber yields to the block's
// scheduler, which resumes the threads once all of them are here.
void __syncthreads();

// CUDA's warp-scoped operations, for the lanes named in `mask` (warps are 32 consecutive threads of
// the block, lane = thread index % 32). The lanes of the mask wait for one another, as a barrier of
// their own; each lane of a shuffle then reads `var` from one lane: __shfl_sync the lane src_lane,
// __shfl_up_sync lane - delta, __shfl_down_sync lane + delta (past the warp's ends: its own var),
// __shfl_xor_sync lane ^ lane_mask. Errors (CUDA leaves them undefined): a lane of the mask that never
// comes, lanes of one mask calling other operations or other masks, a lane reading a lane outside
// the mask, a caller outside its own mask. Only width 32 (the default) is emulated.
constexpr int warpSize = 32;
void __syncwarp(unsigned mask = 0xffffffffu);

namespace relgrad {
namespace cuda_emulator {
constexpr int kWarpSize = warpSize;
enum class ShuffleKind { none, index, up, down, xor_lanes };
// The lane waits at a warp point with `value` (the bytes of var); returns the value it reads.
uint64_t warp_point(const char* op, unsigned mask, uint64_t value, ShuffleKind kind, int operand);

template <class T>
T shuffle(const char* op, unsigned mask, T var, ShuffleKind kind, int operand, int width) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= sizeof(uint64_t), "a shuffle moves 8 bytes at most");
    if (width != warpSize) throw std::logic_error(std::string(op) + ": the emulator takes width 32 only");
    uint64_t bits = 0;
    std::memcpy(&bits, &var, sizeof(T));
    bits = warp_point(op, mask, bits, kind, operand);
    std::memcpy(&var, &bits, sizeof(T));
    return var;
}
}  // namespace cuda_emulator
}  // namespace relgrad

template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {
    using namespace relgrad::cuda_emulator;
    return shuffle("__shfl_sync", mask, var, ShuffleKind::index, src_lane, width);
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
    using namespace relgrad::cuda_emulator;
    return shuffle("__shfl_up_sync", mask, var, ShuffleKind::up, static_cast<int>(delta), width);
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
    using namespace relgrad::cuda_emulator;
    return shuffle("__shfl_down_sync", mask, var, ShuffleKind::down, static_cast<int>(delta), width);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
    using namespace relgrad::cuda_emulator;
    return shuffle("__shfl_xor_sync", mask, var, ShuffleKind::xor_lanes, lane_mask, width);
}

// Shared memory is reached through Shared<T> (runtime.hpp): T* on a GPU; here a pointer each of
// whose element accesses is noted (note_shared_access), so that a race is reported where it
// happens: two threads of a block that access one byte in one phase (no __syncthreads() between
// them, nor, for two lanes of one warp, a warp-scoped point), at least one of them writing. That is
// what compute-sanitizer's racecheck reports on a GPU. An access outside the block's shared memory
// is an error too.
namespace relgrad {
namespace cuda_emulator {
void note_shared_access(const void* address, std::size_t bytes, bool write);

// An element of shared memory: reading it (as a T) and writing it are noted.
template <class T>
class SharedElement {
public:
    explicit SharedElement(T* address) : address_(address) {}
    operator T() const {
        note_shared_access(address_, sizeof(T), false);
        return *address_;
    }
    SharedElement& operator=(const T& value) {
        note_shared_access(address_, sizeof(T), true);
        *address_ = value;
        return *this;
    }
    SharedElement& operator=(const SharedElement& other) { return *this = static_cast<T>(other); }
    SharedElement& operator+=(const T& value) { return *this = static_cast<T>(*this) + value; }
    SharedElement& operator-=(const T& value) { return *this = static_cast<T>(*this) - value; }
    SharedElement& operator*=(const T& value) { return *this = static_cast<T>(*this) * value; }

private:
    T* address_;
};

template <class T>
class SharedPointer {
public:
    SharedPointer(T* address) : address_(address) {}  // implicit, as a shared array decays to T*
    SharedElement<T> operator*() const { return SharedElement<T>(address_); }
    SharedElement<T> operator[](int64_t i) const { return SharedElement<T>(address_ + i); }
    SharedPointer operator+(int64_t i) const { return address_ + i; }
    T* address() const { return address_; }  // not noted: for cp.async, which notes its own write

private:
    T* address_;
};
}  // namespace cuda_emulator
}  // namespace relgrad

// cp.async, as CUDA's pipeline primitives (cuda_pipeline_primitives.h) give it: a thread's copy of
// size_and_align bytes (4, 8 or 16, both addresses aligned to it) from global to shared memory, its
// last zfill bytes zeros instead, is only issued; __pipeline_commit closes the thread's batch of
// copies issued since the last one, and __pipeline_wait_prior(n) lands all of the thread's committed
// batches but the newest n. Until it lands, the shared memory a copy writes keeps what it held (NaN
// in a fresh block): a kernel that reads a tile before its wait reads that. A copy that never lands
// (its batch not waited for, or never committed) is an error when the block ends; so is a
// destination outside the block's shared memory.
void __pipeline_memcpy_async(void* dst_shared, const void* src_global, std::size_t size_and_align,
                             std::size_t zfill = 0);
template <class T>
void __pipeline_memcpy_async(relgrad::cuda_emulator::SharedPointer<T> dst_shared, const void* src_global,
                             std::size_t size_and_align, std::size_t zfill = 0) {
    __pipeline_memcpy_async(static_cast<void*>(dst_shared.address()), src_global, size_and_align, zfill);
}
void __pipeline_commit();
void __pipeline_wait_prior(std::size_t prior);

namespace relgrad {
enum class MmaInputs;  // mma.hpp
namespace cuda_emulator {
// mma.sync (mma.hpp): a warp-scoped point of all 32 lanes, each with its fragments (on its own stack,
// read while the warp waits); when the last lane comes, the tiles are assembled from the
// fragments by the PTX ISA's layouts, multiplied, and each lane's d written.
void mma_sync_point(MmaInputs inputs, float* d, const uint32_t* a, const uint32_t* b, const float* c);
// ldmatrix.x4 (mma.hpp's load_matrices): a warp-scoped point of all 32 lanes, each with the address
// of one row of 8 16-bit values in shared memory (its read noted as the lane arrives); when the
// last lane comes, each lane's four registers are filled from the rows the PTX ISA names.
void ldmatrix_point(bool transposed, const void* row, uint32_t* out);
}  // namespace cuda_emulator
}  // namespace relgrad

// CUDA's qualifiers: kernels and device functions are plain host functions. __shared__ is left
// undefined, so that a kernel declares its shared memory with RELGRAD_SHARED (runtime.hpp).
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

namespace relgrad {
namespace cuda_emulator {

// A kernel's address, whatever its parameters: what the opt-in below is kept by.
using KernelAddress = void (*)();

// Runs `thread` as every thread of a grid (see the top of this file); throws std::logic_error on a
// launch CUDA would refuse (an empty or too large block or grid, more dynamic shared memory than
// the kernel may have) and on a barrier that not all threads of a block reach. `kernel` names it in
// the messages; `address` is the kernel's, for its dynamic shared memory opt-in.
void run_grid(const char* kernel, KernelAddress address, dim3 grid, dim3 block, std::size_t dynamic_shared_bytes,
              const std::function<void()>& thread);

// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes): lets the kernel
// at `address` launch with up to `bytes` of dynamic shared memory (CUDA allows 48 KiB to a kernel
// that has not opted in); more than kMaxOptInDynamicSharedBytes is refused, as CUDA refuses it.
void set_max_dynamic_shared_bytes(const char* kernel, KernelAddress address, std::size_t bytes);

// The emulated device's memory (see the top of this file): nullptr when the host is out of memory.
// A launch that wrote into a guard zone throws std::logic_error when it ends, the zone restored.
void* allocate_device_memory(std::size_t nbytes);
void free_device_memory(void* block);
constexpr std::size_t kGuardBytes = 256;

// The running block's dynamic shared memory (RELGRAD_DYNAMIC_SHARED).
void* dynamic_shared_memory();
// The running block's copy of the static shared array that `tag` (a static variable of the
// declaration) stands for, of `bytes` bytes (RELGRAD_SHARED): every thread of the block gets the same.
void* static_shared_memory(const void* tag, std::size_t bytes, std::size_t alignment);

// The seed of the thread orders; each launch draws from it, so a run is repeatable. Tests set it to
// see a kernel under many orders.
void set_seed(uint64_t seed);

// The limits a launch is checked against: those of NVIDIA's sm_80 (A100) and sm_90 (H100, H200),
// the smaller where they differ.
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxBlockDim[3] = {1024, 1024, 64};          // x, y, z
constexpr unsigned kMaxGridDim[3] = {2147483647, 65535, 65535};  // x, y, z
constexpr std::size_t kMaxDynamicSharedBytes = 48 * 1024;        // without opting in
constexpr std::size_t kMaxOptInDynamicSharedBytes = 163 * 1024;  // sm_80's; sm_90 allows 227 KiB
constexpr std::size_t kMaxStaticSharedBytes = 48 * 1024;

}  // namespace cuda_emulator
}  // namespace relgrad
