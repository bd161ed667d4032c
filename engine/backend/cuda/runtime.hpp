// relgrad: what the CUDA backend's sources need from CUDA, on a GPU or in the emulator.
//
// Every file of engine/backend/cuda/ is compiled twice: by nvcc for the GPU (namespace
// relgrad::cuda, into librelgrad_cuda.so when RELGRAD_CUDA is on), and by the host compiler with
// RELGRAD_CUDA_EMULATION for the emulated device of the test build (namespace
// relgrad::cuda_emulated, emulator.hpp). The kernels are one source; the two builds differ in
// this header (kernel launches, shared memory, the math functions, the block size) and in the two
// definitions of what it declares below: the device's memory and size (cuda_backend.cu: the CUDA
// runtime, or host memory) and the matrix products (gemm.cu: cuBLAS on a GPU, the CPU's BLAS in
// the emulator). RELGRAD_HOST_DEVICE (engine/host_device.hpp) is __host__ __device__ for nvcc
// alone.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cmath>
#include <stdexcept>
#include <string>

#ifdef RELGRAD_CUDA_EMULATION
#include <functional>
#include <tuple>
#include "engine/backend/cuda/emulator.hpp"
#define RELGRAD_CUDA_NAMESPACE cuda_emulated
#define RELGRAD_SHARED(T, name, n)                                      \
    static const char name##_tag = 0;                                   \
    const ::relgrad::cuda_emulator::SharedPointer<T> name(              \
        static_cast<T*>(::relgrad::cuda_emulator::static_shared_memory( \
            &name##_tag, sizeof(T) * static_cast<std::size_t>(n), alignof(T))))
#define RELGRAD_DYNAMIC_SHARED(T, name)                    \
    const ::relgrad::cuda_emulator::SharedPointer<T> name( \
        static_cast<T*>(::relgrad::cuda_emulator::dynamic_shared_memory()))
#else
#include <cuda_pipeline_primitives.h>  // cp.async: __pipeline_memcpy_async, _commit, _wait_prior
#include <cuda_runtime.h>
#define RELGRAD_CUDA_NAMESPACE cuda
#define RELGRAD_SHARED(T, name, n) __shared__ T name[n]
#define RELGRAD_DYNAMIC_SHARED(T, name)                           \
    extern __shared__ __align__(16) unsigned char name##_bytes[]; \
    T* const name = reinterpret_cast<T*>(name##_bytes)
#endif
// A loop over fragment registers, unrolled by nvcc so that every register index is a constant
// (an array indexed at run time would live in local memory); the host compiler takes it as it is.
#ifdef RELGRAD_CUDA_EMULATION
#define RELGRAD_UNROLL
#else
#define RELGRAD_UNROLL _Pragma("unroll")
#endif
// Shared memory, one copy per block, declared in a kernel as
//   RELGRAD_SHARED(T, name, n);       __shared__ T name[n]          (n a constant)
//   RELGRAD_DYNAMIC_SHARED(T, name);  extern __shared__ T name[]    (sized at launch)
// and used as name[i] in both; a pointer into it is a Shared<T> (below): T* on a GPU, and in the
// emulator a pointer whose accesses are checked for races (emulator.hpp).

namespace relgrad {
namespace RELGRAD_CUDA_NAMESPACE {

#ifdef RELGRAD_CUDA_EMULATION
template <class T>
using Shared = cuda_emulator::SharedPointer<T>;
#else
template <class T>
using Shared = T*;
#endif

// A pointer into shared memory as one to U: where a block's shared memory holds regions of two
// types (16-bit tiles, then float32 sums), the second region's start.
template <class U, class T>
__device__ Shared<U> shared_cast(Shared<T> pointer) {
#ifdef RELGRAD_CUDA_EMULATION
    return reinterpret_cast<U*>(pointer.address());
#else
    return reinterpret_cast<U*>(pointer);
#endif
}

#ifdef RELGRAD_CUDA_EMULATION
// the math functions a kernel calls unqualified, as CUDA's device overloads are called
using std::erf;
using std::exp;
using std::fabs;
using std::isnan;
using std::log;
using std::pow;
using std::sqrt;
using std::tanh;
#endif

// The name of the last kernel launched, for the message of a fault met later (cuda_backend.cu).
std::atomic<const char*>& last_kernel_launched();

// kernel<<<grid, block, shared_bytes>>>(args...), checked: a launch CUDA refuses is an
// std::logic_error naming the kernel. An empty grid launches nothing.
template <class... Params, class... Args>
void launch(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes,
            Args... args) {
    if (uint64_t{grid.x} * grid.y * grid.z == 0) return;
    last_kernel_launched() = name;
#ifdef RELGRAD_CUDA_EMULATION
    const std::tuple<Params...> params(static_cast<Params>(args)...);  // copied once, as CUDA copies them
    cuda_emulator::run_grid(name, reinterpret_cast<cuda_emulator::KernelAddress>(kernel), grid, block, shared_bytes,
                            [&] { std::apply(kernel, params); });
#else
    // clang-format off
    kernel<<<grid, block, shared_bytes>>>(static_cast<Params>(args)...);
    // clang-format on
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) {
        throw std::logic_error(std::string("kernel ") + name + ": " + cudaGetErrorString(status));
    }
#endif
}

// Lets `kernel` launch with up to `bytes` of dynamic shared memory: CUDA refuses a launch with more
// than 48 KiB to a kernel that has not opted in, and an opt-in past the device's limit.
template <class... Params>
void allow_dynamic_shared(const char* name, void (*kernel)(Params...), std::size_t bytes) {
#ifdef RELGRAD_CUDA_EMULATION
    cuda_emulator::set_max_dynamic_shared_bytes(name, reinterpret_cast<cuda_emulator::KernelAddress>(kernel), bytes);
#else
    const cudaError_t status =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    if (status != cudaSuccess) {
        throw std::logic_error(std::string("kernel ") + name + ": an opt-in to " + std::to_string(bytes) +
                               " bytes of dynamic shared memory: " + cudaGetErrorString(status));
    }
#endif
}

// The block size of the kernels with one thread per element (elementwise.cu, index.cu): 256 on a
// GPU; 32 in the emulator, where each thread of a block costs a fiber, so that a launch runs a
// few blocks of a warp's size (the kernels loop over their elements, right for any block size).
#ifdef RELGRAD_CUDA_EMULATION
constexpr unsigned kElementThreads = 32;
#else
constexpr unsigned kElementThreads = 256;
#endif
// The flat indices [0, n) a thread of such a kernel takes: its global index, then every grid's
// width on (a grid-stride loop).
#define RELGRAD_FOR_EACH_INDEX(i, n) \
    for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < (n); i += int64_t{gridDim.x} * blockDim.x)

// --- the device (cuda_backend.cu)
// Why no kernel can run, or an empty string when one can: no device, a driver too old, ...
std::string unusable_reason();
int multiprocessor_count();
void* device_allocate(std::size_t nbytes);  // nullptr when the device is full
void device_free(void* block) noexcept;
void copy_to_device(const void* host, void* device, std::size_t nbytes);
void copy_to_host(const void* device, void* host, std::size_t nbytes);

// The grid of a loop over `work` items with `threads` per block, each thread taking every
// (gridDim.x * blockDim.x)-th item: enough blocks to give each multiprocessor a few, no more.
inline dim3 grid_for(int64_t work, unsigned threads) {
    const int64_t wanted = (work + threads - 1) / threads, most = int64_t{4} * multiprocessor_count();
    return dim3(static_cast<unsigned>(work <= 0 ? 0 : (wanted < most ? wanted : most)));
}

// C = alpha op(A) op(B) + beta C for `batch` products, row-major, the i-th operands at
// A + i * stride_a, ... (gemm.cu)
template <class T>
void gemm_batch(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
                int64_t stride_a, const T* B, int64_t ldb, int64_t stride_b, T beta, T* C, int64_t ldc,
                int64_t stride_c, int64_t batch);
// Whether gemm_batch takes operands of this 16-bit dtype itself (float32 sums): cuBLAS takes both;
// the emulator's CPU products take bfloat16 where the CPU runs it at speed (gemm.cu)
bool has_gemm_in(DType dtype);

}  // namespace RELGRAD_CUDA_NAMESPACE
}  // namespace relgrad
