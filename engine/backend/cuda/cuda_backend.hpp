// The CUDA backend: the Backend interface (backend.hpp) on an NVIDIA GPU, laid out like cpu/:
// cuda_backend.cu (the device, its memory, the Layouts), elementwise.cu (fill, copy, unary,
// binary, where), reduce.cu (reduce, softmax_last_dim), gemm.cu (batched_gemm through cuBLAS),
// index.cu (gather, scatter_add, index_select, index_add), attention.cu (the attention rows) and
// fused_attention.cu (the fused attention, flash-style, and where supports() is).
// The same sources run in CUDA's execution model emulated on the host (runtime.hpp, emulator.hpp):
// the test build's cuda device.
//
// Every kernel is deterministic: each output element is computed by one thread, or reduced by one
// block in a fixed tree, in an order that depends on the shapes alone; no floating-point atomics.
// The same inputs give bitwise the same results, run after run.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <vector>

#include "engine/backend/backend.hpp"
#include "engine/backend/cuda/runtime.hpp"

namespace relgrad {
namespace RELGRAD_CUDA_NAMESPACE {

// Bad input found by a kernel (an index out of range, a bucket outside [0, K), a float without an
// int64 value) is not waited for: the kernel stores it in the backend's one error record, and the
// host reads that record when it next waits for the device anyway, at its next copy from the device
// (a training step reads its loss: once a step at least), and throws there the
// std::invalid_argument the CPU backend throws at once, worded by kernel_errors.hpp. The first
// report since the last read is the one thrown; each launch that may report has a serial.
struct DeviceError {
    int64_t launch = 0;           // the serial of the launch that stored it; 0: none yet
    int64_t index = 0, size = 0;  // the index and the size of its dim (or the number of buckets)
    double value = 0;             // the float that has no int64 value
};
// What a kernel reports to: the record and its own launch's serial (CudaBackend::error_report).
struct ErrorReport {
    DeviceError* record;
    int64_t launch;
};
// Stores a bad index (or value) unless an earlier launch has stored one; any thread of the launch
// may, and the host reads one of them.
__device__ inline void report(ErrorReport to, int64_t index, int64_t size, double value = 0) {
    DeviceError& record = *to.record;
    if (record.launch != 0 && record.launch != to.launch) return;
    record.index = index;
    record.size = size;
    record.value = value;
    record.launch = to.launch;
}

class CudaBackend final : public Backend {
public:
    CudaBackend();
    bool supports(OptionalKernel kernel) const override;

    CachingAllocator& allocator() override { return allocator_; }
    void copy_from_host(const void* host, void* device, std::size_t nbytes) override;
    // Copies, then throws the bad input a kernel has reported since the last copy, if any.
    void copy_to_host(const void* device, void* host, std::size_t nbytes) override;

    // The bad input a launch of `kernel` may find, and where it reports it (a kernel argument).
    enum class BadInput { index, bucket, int64_value };
    ErrorReport error_report(const char* kernel, BadInput kind, int64_t dim = 0);

private:
#define RELGRAD_DEVICE_KERNEL(...) __VA_ARGS__ override;
#define RELGRAD_OPTIONAL_DEVICE_KERNEL(...) __VA_ARGS__ override;
#include "engine/backend/device_kernels.inc"
#undef RELGRAD_DEVICE_KERNEL
#undef RELGRAD_OPTIONAL_DEVICE_KERNEL

    // throws what the error record holds, if anything, and empties it and unread_
    void throw_reported_error();

    CachingAllocator allocator_;
    // The error record (made on first use, never freed) and the launches that may have written it
    // since it was last read: launch serial s is unread_[s - 1]. Read at the next copy to the host,
    // or when kMaxUnread launches wait.
    struct ReportingLaunch {
        const char* kernel;
        BadInput kind;
        int64_t dim;
    };
    static constexpr std::size_t kMaxUnread = 1024;
    DeviceError* error_record_ = nullptr;
    std::vector<ReportingLaunch> unread_;
    std::mutex unread_mutex_;
};

// The backend, made on first use; throws std::runtime_error naming why when no kernel can run here
// ("no usable CUDA device: ...").
CudaBackend& cuda_backend();

// --- shared by the kernel files

// Where a kernel finds the elements of a tensor seen with `shape`: the tensor's strides aligned
// to the right, 0 on the dims it is broadcast along. At most kMaxDims dims.
constexpr int kMaxDims = 8;
struct Layout {
    int rank = 0;
    bool index32 = true;  // fewer than 2^32 elements: offset_of divides in 32 bits
    int64_t shape[kMaxDims] = {};
    int64_t strides[kMaxDims] = {};
};
Layout layout_of(const Tensor& t, const Shape& shape, const char* kernel);
inline Layout layout_of(const Tensor& t, const char* kernel) { return layout_of(t, t.shape(), kernel); }
// Any shape with any strides (of the same length), e.g. a tensor's with one stride zeroed.
Layout layout_of(const Shape& shape, const Shape& strides, const char* kernel);

// The element offset of the flat (C-order) index `flat` under `layout`: the index along each dim
// from the last, what is left of flat at the end being the index along dim 0.
template <class Index>
__host__ __device__ inline int64_t offset_with(const Layout& layout, Index flat) {
    int64_t offset = 0;
    for (int d = layout.rank - 1; d > 0; --d) {
        const Index size = static_cast<Index>(layout.shape[d]);
        offset += static_cast<int64_t>(flat % size) * layout.strides[d];
        flat /= size;
    }
    return offset + static_cast<int64_t>(flat) * layout.strides[0];
}
// Integer division is what an elementwise kernel spends most on, on a GPU as on a CPU, and 32-bit
// division is several times faster than 64-bit: used whenever every index fits.
__host__ __device__ inline int64_t offset_of(const Layout& layout, int64_t flat) {
    if (layout.rank == 0) return 0;
    return layout.index32 ? offset_with<uint32_t>(layout, static_cast<uint32_t>(flat))
                          : offset_with<int64_t>(layout, flat);
}

// Merges, in layouts of one shape, the dims of size 1 and each pair of neighbouring dims that
// every layout steps across evenly (stride of the outer = stride of the inner x its size): a
// contiguous tensor becomes a single dim, and offset_of does one division per dim left.
void merge_dims(std::initializer_list<Layout*> layouts);

// The largest block of the row kernels (reduce, softmax, attention): one block per row, its
// threads striding over the row, then combined in a tree. Shorter rows get smaller blocks.
constexpr unsigned kRowThreads = 128;
// The block size for rows of n: a power of two, each thread taking about 32 elements (a tree step
// costs a barrier), between 1 and kRowThreads.
inline unsigned row_threads(int64_t n) {
    unsigned threads = 1;
    while (threads < kRowThreads && int64_t{threads} * 32 < n) threads *= 2;
    return threads;
}

// Combines one value per thread of the block into one, the same on every thread, in a fixed tree
// (so the same inputs give bitwise the same result): blockDim.x a power of two, partial a
// shared array (RELGRAD_SHARED) of blockDim.x values. Every thread of the block must call it.
template <class A, class Combine>
__device__ A block_reduce(A value, Shared<A> partial, Combine combine) {
    const unsigned t = threadIdx.x;
    partial[t] = value;
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
        if (t < half) {  // combine takes values: read both first
            const A mine = partial[t], other = partial[t + half];
            partial[t] = combine(mine, other);
        }
        __syncthreads();
    }
    const A total = partial[0];
    __syncthreads();  // every thread has read it: partial may be written again
    return total;
}
struct Add {
    template <class A>
    __device__ A operator()(A x, A y) const {
        return x + y;
    }
};
struct Max {  // max of two; NaN when either is NaN
    template <class A>
    __device__ A operator()(A x, A y) const {
        return isnan(x) || x > y ? x : y;
    }
};

}  // namespace RELGRAD_CUDA_NAMESPACE
}  // namespace relgrad
