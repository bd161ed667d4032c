#include "engine/storage.hpp"

#include <algorithm>
#include <iterator>
#include <new>
#include <stdexcept>

#include "engine/backend/backend.hpp"

namespace relgrad {

// ---------------------------------------------------------------- devices

const char* device_name(Device device) { return name_of(device_names, device); }
Device parse_device(const std::string& name) { return parse_named(device_names, name, "device"); }
bool host_can_read(Device device) { return device == Device::cpu; }

// ---------------------------------------------------------------- the caching allocator

namespace {

// The size class of a request (see storage.hpp): the next of 2^k, 1.25 2^k, 1.5 2^k and 1.75 2^k
// at or above it, in steps of at least 64 bytes (the alignment).
std::size_t size_class(std::size_t nbytes) {
    const std::size_t bytes = std::max<std::size_t>(nbytes, 64);
    std::size_t power = 64;
    while (power * 2 <= bytes) power *= 2;  // the power of two at or below
    const std::size_t step = std::max<std::size_t>(power / 4, 64);
    return (bytes + step - 1) / step * step;
}

}  // namespace

std::size_t CachingAllocator::block_bytes(std::size_t nbytes) const {
    return exact_sizes_ ? nbytes : size_class(nbytes);
}

void* CachingAllocator::allocate(std::size_t nbytes) {
    const std::size_t bytes = block_bytes(nbytes);
    void* block = nullptr;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        const auto same_size = cache_.find(bytes);
        if (same_size != cache_.end()) {
            block = same_size->second;
            cache_.erase(same_size);
            cached_ -= static_cast<int64_t>(bytes);
        }
    }
    if (!block) block = raw_allocate_(bytes);
    if (!block) {  // the device is full: give the cached blocks back and try once more
        std::lock_guard<std::mutex> lock(mutex_);
        for (auto& cached : cache_) raw_free_(cached.second);
        cache_.clear();
        cached_ = 0;
    }
    if (!block) block = raw_allocate_(bytes);
    if (!block) throw std::bad_alloc();
    std::lock_guard<std::mutex> lock(mutex_);
    live_ += static_cast<int64_t>(nbytes);
    peak_ = std::max(peak_, live_);
    return block;
}

void CachingAllocator::deallocate(void* block, std::size_t nbytes) {
    const std::size_t bytes = block_bytes(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    live_ -= static_cast<int64_t>(nbytes);
    cache_.emplace(bytes, block);
    cached_ += static_cast<int64_t>(bytes);
    while (static_cast<std::size_t>(cached_) > cache_limit_) {
        const auto biggest = std::prev(cache_.end());
        raw_free_(biggest->second);
        cached_ -= static_cast<int64_t>(biggest->first);
        cache_.erase(biggest);
    }
}

MemoryStats CachingAllocator::stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {live_, peak_, cached_};
}

void CachingAllocator::reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    peak_ = live_;
}

CachingAllocator::~CachingAllocator() {
    for (auto& block : cache_) raw_free_(block.second);
}

MemoryStats memory_stats(Device device) { return backend_for(device).allocator().stats(); }
void reset_peak_memory(Device device) { backend_for(device).allocator().reset_peak(); }

// ---------------------------------------------------------------- storage

Storage::Storage(std::size_t nbytes, Device device)
    : data_(backend_for(device).allocator().allocate(nbytes)), nbytes_(nbytes), device_(device) {}

Storage::Storage(void* host_data, std::size_t nbytes, std::shared_ptr<void> owner)
    : data_(host_data), nbytes_(nbytes), device_(Device::cpu), owner_(std::move(owner)) {}

Storage::~Storage() {
    if (!owner_) backend_for(device_).allocator().deallocate(data_, nbytes_);
}

}  // namespace relgrad
