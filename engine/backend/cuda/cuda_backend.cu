// The CUDA backend's device: whether one is usable, and its memory through the caching allocator.
// On a GPU through the CUDA runtime; in the emulator the device's memory is host memory that the
// host API refuses to touch, as a GPU's.
#include "engine/backend/cuda/cuda_backend.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>

#include "engine/backend/kernel_errors.hpp"
#include "engine/errors.hpp"

namespace relgrad {
namespace RELGRAD_CUDA_NAMESPACE {

// ---------------------------------------------------------------- the runtime (runtime.hpp)

std::atomic<const char*>& last_kernel_launched() {
    static std::atomic<const char*> name{"none yet"};
    return name;
}

#ifdef RELGRAD_CUDA_EMULATION

std::string unusable_reason() { return ""; }
int multiprocessor_count() { return 1; }  // a small device: grids of a few blocks
void* device_allocate(std::size_t nbytes) { return cuda_emulator::allocate_device_memory(nbytes); }
void device_free(void* block) noexcept { cuda_emulator::free_device_memory(block); }
constexpr bool kExactSizes = true;  // a block ends where its tensor ends: a read past it meets a guard zone
constexpr std::size_t kCacheLimit = kHostCacheBytes;  // host memory, and blocks of many exact sizes
void copy_to_device(const void* host, void* device, std::size_t nbytes) {
    if (nbytes) std::memcpy(device, host, nbytes);
}
void copy_to_host(const void* device, void* host, std::size_t nbytes) {
    if (nbytes) std::memcpy(host, device, nbytes);
}

#else

namespace {
// A kernel's fault (an illegal address, ...) is met by the next call that waits for the device,
// and stays (CUDA's sticky errors): the message names the last kernel launched.
void check(cudaError_t status, const char* call) {
    if (status != cudaSuccess) {
        throw std::runtime_error(std::string(call) + ": " + cudaGetErrorString(status) +
                                 " (the last kernel launched: " + last_kernel_launched().load() + ")");
    }
}
}  // namespace

std::string unusable_reason() {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) return cudaGetErrorString(status);  // no driver, a driver too old, ...
    if (count == 0) return "no CUDA device is present";
    int major = 0;
    check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), "cudaDeviceGetAttribute");
    if (major < 8) return "device 0 has compute capability " + std::to_string(major) + ".x; relgrad needs 8.0 or newer";
    return "";
}

int multiprocessor_count() {
    static const int count = [] {
        int n = 0;
        check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0), "cudaDeviceGetAttribute");
        return n;
    }();
    return count;
}

void* device_allocate(std::size_t nbytes) {
    void* block = nullptr;
    const cudaError_t status = cudaMalloc(&block, nbytes);
    if (status == cudaErrorMemoryAllocation) {
        cudaGetLastError();  // clear the out-of-memory error: the allocator retries after emptying its cache
        return nullptr;
    }
    check(status, "cudaMalloc");  // anything else is an earlier kernel's fault, not a full device
    return block;
}
// Called from destructors (a tensor's storage), so it never throws: a failure is an earlier
// kernel's fault, which stays and is thrown by the next call that checks.
void device_free(void* block) noexcept { cudaFree(block); }
constexpr bool kExactSizes = false;  // the caching allocator's size classes
// no limit: the device's memory is the process's own, and a full device gives the cache back
constexpr std::size_t kCacheLimit = std::numeric_limits<std::size_t>::max();
void copy_to_device(const void* host, void* device, std::size_t nbytes) {
    if (nbytes) check(cudaMemcpy(device, host, nbytes, cudaMemcpyHostToDevice), "cudaMemcpy");
}
void copy_to_host(const void* device, void* host, std::size_t nbytes) {
    // waits for the kernels before it, and reports an error any of them met
    if (nbytes) check(cudaMemcpy(host, device, nbytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
}

#endif

// ---------------------------------------------------------------- the backend

CudaBackend& cuda_backend() {
    static CudaBackend* const backend = [] {  // never destroyed, as the other backends
        const std::string reason = unusable_reason();
        if (!reason.empty()) throw std::runtime_error("no usable CUDA device: " + reason);
        return new CudaBackend();
    }();
    return *backend;
}

// A Layout holds kMaxDims dims: Backend refuses an operand of more before any kernel sees it.
CudaBackend::CudaBackend()
    : Backend(Device::cuda, kMaxDims), allocator_(device_allocate, device_free, kCacheLimit, kExactSizes) {}

void CudaBackend::copy_from_host(const void* host, void* device, std::size_t nbytes) {
    copy_to_device(host, device, nbytes);
}
void CudaBackend::copy_to_host(const void* device, void* host, std::size_t nbytes) {
    RELGRAD_CUDA_NAMESPACE::copy_to_host(device, host, nbytes);
    std::lock_guard<std::mutex> lock(unread_mutex_);
    throw_reported_error();
}

// ---------------------------------------------------------------- shared by the kernel files

Layout layout_of(const Shape& shape, const Shape& strides, const char* kernel) {
    RELGRAD_CHECK(static_cast<int64_t>(shape.size()) <= kMaxDims, kernel, ": a tensor of ", shape.size(),
                  " dims; the cuda kernels take at most ", kMaxDims);
    Layout layout;
    layout.rank = static_cast<int>(shape.size());
    for (int d = 0; d < layout.rank; ++d) {
        layout.shape[d] = shape[d];
        layout.strides[d] = strides[d];
    }
    layout.index32 = shape_numel(shape) < (int64_t{1} << 32);
    return layout;
}

Layout layout_of(const Tensor& t, const Shape& shape, const char* kernel) {
    Shape strides(shape.size(), 0);
    const int64_t skipped = static_cast<int64_t>(shape.size()) - t.dim();  // t's dims are aligned to the right
    for (int64_t d = std::max<int64_t>(skipped, 0); d < static_cast<int64_t>(shape.size()); ++d) {
        if (t.shape()[d - skipped] == shape[d] && shape[d] != 1) strides[d] = t.strides()[d - skipped];
    }
    return layout_of(shape, strides, kernel);
}

void merge_dims(std::initializer_list<Layout*> layouts) {
    const Layout shape = **layouts.begin();  // the shape they share
    int kept = 0;
    for (int d = 0; d < shape.rank; ++d) {
        if (shape.shape[d] == 1) continue;
        const bool even = kept > 0 && std::all_of(layouts.begin(), layouts.end(), [&](const Layout* l) {
                              return l->strides[kept - 1] == l->strides[d] * shape.shape[d];
                          });
        for (Layout* l : layouts) {
            if (even) {
                l->shape[kept - 1] *= shape.shape[d];
                l->strides[kept - 1] = l->strides[d];
            } else {
                l->shape[kept] = shape.shape[d];
                l->strides[kept] = l->strides[d];
            }
        }
        if (!even) ++kept;
    }
    for (Layout* l : layouts) l->rank = kept;
}

// ---------------------------------------------------------------- bad input found by kernels

ErrorReport CudaBackend::error_report(const char* kernel, BadInput kind, int64_t dim) {
    std::lock_guard<std::mutex> lock(unread_mutex_);
    if (!error_record_) {
        error_record_ = static_cast<DeviceError*>(allocator_.allocate(sizeof(DeviceError)));
        const DeviceError none;
        copy_to_device(&none, error_record_, sizeof(DeviceError));
    }
    if (unread_.size() == kMaxUnread) throw_reported_error();  // waits for the launches before
    unread_.push_back({kernel, kind, dim});
    return {error_record_, static_cast<int64_t>(unread_.size())};
}

void CudaBackend::throw_reported_error() {
    if (unread_.empty()) return;
    DeviceError error;
    RELGRAD_CUDA_NAMESPACE::copy_to_host(error_record_, &error, sizeof(DeviceError));
    const std::vector<ReportingLaunch> launches = std::move(unread_);
    unread_.clear();
    if (error.launch == 0) return;
    const DeviceError none;
    copy_to_device(&none, error_record_, sizeof(DeviceError));
    if (error.launch > static_cast<int64_t>(launches.size())) {  // a launch of another thread, between its two steps
        throw std::invalid_argument("a cuda kernel found a bad index or value (" + std::to_string(error.index) + ")");
    }
    const ReportingLaunch& launch = launches[static_cast<std::size_t>(error.launch - 1)];
    switch (launch.kind) {
        case BadInput::index:
            throw std::invalid_argument(index_out_of_range(launch.kernel, error.index, launch.dim, error.size));
        case BadInput::bucket: throw std::invalid_argument(bucket_out_of_range(error.index, error.size));
        case BadInput::int64_value: throw std::invalid_argument(no_int64_value(error.value));
    }
}

}  // namespace RELGRAD_CUDA_NAMESPACE
}  // namespace relgrad

#ifndef RELGRAD_CUDA_EMULATION
// The module's one entry point (the engine opens librelgrad_cuda.so and calls it: backend.cpp):
// the backend, or nullptr and why not.
extern "C" relgrad::Backend* relgrad_open_cuda_backend(std::string* why_not) noexcept {
    try {
        return &relgrad::cuda::cuda_backend();
    } catch (const std::exception& error) {
        *why_not = error.what();
        return nullptr;
    }
}
#endif
