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

constexpr int64_t kCacheBytes = int64_t{1} << 30;

// Small blocks are rounded to 64 bytes (the alignment), blocks of 1 MiB or more to whole pages.
std::size_t rounded_size(std::size_t nbytes) {
    const std::size_t unit = nbytes >= (std::size_t{1} << 20) ? 4096 : 64;
    return (std::max<std::size_t>(nbytes, 1) + unit - 1) / unit * unit;
}

}  // namespace

void* CachingAllocator::allocate(std::size_t nbytes) {
    const std::size_t bytes = rounded_size(nbytes);
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
    live_ += static_cast<int64_t>(bytes);
    peak_ = std::max(peak_, live_);
    return block;
}

void CachingAllocator::deallocate(void* block, std::size_t nbytes) {
    const std::size_t bytes = rounded_size(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    live_ -= static_cast<int64_t>(bytes);
    if (bytes < cached_from_) {
        raw_free_(block);
        return;
    }
    cache_.emplace(bytes, block);
    cached_ += static_cast<int64_t>(bytes);
    while (cached_ > kCacheBytes) {
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
