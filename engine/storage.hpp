// relgrad: devices, and the memory tensors live in.
//
// A Storage is one flat buffer on one device, shared by every view of it. It is allocated and
// freed through its device's backend (engine/backend/backend.hpp), so the same Tensor code runs on
// any device; only the backend touches the bytes. Host code reads a tensor's elements only through
// explicit copies (Tensor::to(Device::cpu), to_vector(), item()); Tensor::data<T>() is for tensors
// on the CPU.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <new>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "engine/enum_names.hpp"

namespace relgrad {

// cpu: the host. guarded_cpu: the CPU kernels on memory that the host API refuses to touch, a
// stand-in for an accelerator that proves the ops device-clean (docs/engine.md). cuda: an NVIDIA
// GPU, where relgrad was built with its CUDA backend; the test build's cuda device runs the same
// kernels in an emulator.
enum class Device { cpu, guarded_cpu, cuda };
inline constexpr EnumName<Device> device_names[] = {
    {Device::cpu, "cpu"}, {Device::guarded_cpu, "guarded_cpu"}, {Device::cuda, "cuda"}};

const char* device_name(Device device);        // "cpu", "guarded_cpu", "cuda"
Device parse_device(const std::string& name);  // the inverse; throws naming the choices
bool host_can_read(Device device);             // true only for the cpu

// Bytes of tensor storage alive now, and the most alive at once since the last reset; the spare
// blocks the allocator keeps for reuse are counted apart (cached). The peak is what a computation
// really needed, whatever the process's RSS says.
struct MemoryStats {
    int64_t live_bytes = 0, peak_live_bytes = 0, cached_bytes = 0;
};
MemoryStats memory_stats(Device device = Device::cpu);
void reset_peak_memory(Device device = Device::cpu);  // peak_live_bytes <- live_bytes

// An allocation the device could not make, naming what was asked for (a std::bad_alloc, so that
// Python sees a MemoryError): "cannot allocate 4.0 TiB on the cpu for a [1099511627776] float32 tensor".
class OutOfMemory : public std::bad_alloc {
public:
    explicit OutOfMemory(std::string message) : message_(std::move(message)) {}
    const char* what() const noexcept override { return message_.c_str(); }

private:
    std::string message_;
};

// A flat, 64-byte-aligned, uninitialised buffer on one device. Shared by all views of it.
class Storage {
public:
    Storage(std::size_t nbytes, Device device);
    // Host memory that belongs to someone else (a NumPy array, for relgrad.from_numpy): `owner`
    // keeps it alive as long as this storage lives; relgrad's allocator neither frees nor counts it.
    Storage(void* host_data, std::size_t nbytes, std::shared_ptr<void> owner);
    ~Storage();
    Storage(const Storage&) = delete;
    Storage& operator=(const Storage&) = delete;

    void* data() const { return data_; }  // an address in the device's memory
    std::size_t nbytes() const { return nbytes_; }
    Device device() const { return device_; }

    // What the graph checks before a backward reads a tensor it saved (autograd.hpp): the count of
    // relgrad's in-place writes into this memory (Tensor::copy_, so an optimizer's step too), and
    // whether NumPy can write it as well (a writable Tensor.numpy() view was handed out, or the
    // memory is a NumPy array's, relgrad.from_numpy), writes no count sees.
    uint64_t version() const { return version_; }
    void count_write() { ++version_; }
    bool numpy_can_write() const { return numpy_can_write_; }
    void note_numpy_can_write() { numpy_can_write_ = true; }
    // how many recorded ops keep this memory for their backward (SavedTensor)
    std::atomic<int64_t> saved_by_graphs{0};

private:
    void* data_ = nullptr;
    std::size_t nbytes_ = 0;
    Device device_;
    std::shared_ptr<void> owner_;  // set for borrowed memory
    std::atomic<uint64_t> version_{0};
    std::atomic<bool> numpy_can_write_{false};
};

// One device's allocator: blocks from the device's raw allocation functions, with the live/peak
// accounting above and a cache of freed blocks. A training step frees and asks for the same sizes
// again, and a fresh buffer costs the system work (a page fault per 4 KiB on first touch on the
// host; on a GPU, cudaMalloc and cudaFree, which wait for the whole device), so every freed block
// goes to a cache, at most cache_limit bytes in all (the biggest dropped first), and is handed out
// again for a request of its size class: four classes per doubling (2^k, 1.25 2^k, 1.5 2^k, 1.75 2^k, in
// multiples of 64 bytes), so that the tensors of batches of other lengths reuse the same blocks,
// at a cost of at most a quarter of a block. When the device is full the cache is given back and
// the allocation tried once more. live and peak count the bytes the tensors asked for.
// The limit: 1 GiB on the host (kHostCacheBytes), whose memory other programs share; none on a
// GPU, whose memory is the process's own, so that a step's largest blocks (over 1 GiB at long
// lengths) are not given back and asked for again every step.
// With exact_sizes, a block is of the size asked for and serves only that size again: the CUDA
// emulator's, whose guard zones begin where the tensor ends (emulator.hpp).
constexpr std::size_t kHostCacheBytes = std::size_t{1} << 30;
class CachingAllocator {
public:
    using RawAllocate = void* (*)(std::size_t nbytes);  // nullptr when the device is full
    using RawFree = void (*)(void* block);
    CachingAllocator(RawAllocate raw_allocate, RawFree raw_free, std::size_t cache_limit = kHostCacheBytes,
                     bool exact_sizes = false)
        : raw_allocate_(raw_allocate), raw_free_(raw_free), cache_limit_(cache_limit), exact_sizes_(exact_sizes) {}
    ~CachingAllocator();
    CachingAllocator(const CachingAllocator&) = delete;
    CachingAllocator& operator=(const CachingAllocator&) = delete;

    void* allocate(std::size_t nbytes);                // throws std::bad_alloc when the device is full
    void deallocate(void* block, std::size_t nbytes);  // nbytes as given to allocate
    MemoryStats stats();
    void reset_peak();

private:
    RawAllocate raw_allocate_;
    RawFree raw_free_;
    std::size_t cache_limit_;
    bool exact_sizes_;
    std::size_t block_bytes(std::size_t nbytes) const;  // the size class, or nbytes itself
    std::mutex mutex_;
    std::multimap<std::size_t, void*> cache_;  // size class -> block
    int64_t live_ = 0, peak_ = 0, cached_ = 0;
};

}  // namespace relgrad
