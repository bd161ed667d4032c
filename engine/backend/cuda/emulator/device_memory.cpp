// The CUDA emulator's device memory (state.hpp says how the parts fit): host memory laid out so that
// each block begins and ends where its tensor does, between guard zones filled with 0xff bytes. A
// read past a tensor reads NaN; a write past it is found after the launch (check_guard_zones).
//
// A block of n bytes: kGuardBytes of guard zone, the n bytes (aligned to 256, as cudaMalloc's), and
// guard zone to the next 256 bytes past another kGuardBytes. Every byte starts as 0xff; a guard
// byte that is not 0xff after a launch was written by it.
#include "engine/backend/cuda/emulator/state.hpp"

#include <array>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <stdexcept>

namespace relgrad {
namespace cuda_emulator {

namespace {

std::mutex device_blocks_mutex;
std::map<unsigned char*, std::size_t> device_blocks;  // start -> bytes asked for

std::size_t after_zone_bytes(std::size_t nbytes) {
    return (nbytes + 2 * kGuardBytes + 255) / 256 * 256 - nbytes - kGuardBytes;
}

// Whether every byte of a zone [zone, zone + bytes) is still kFill: one memcmp against a zone's
// worth of kFill (a zone is at most kGuardBytes + 255 bytes), as every launch checks every block
std::array<unsigned char, kGuardBytes + 256> all_fill() {
    std::array<unsigned char, kGuardBytes + 256> bytes;
    bytes.fill(kFill);
    return bytes;
}
bool untouched(const unsigned char* zone, std::size_t bytes) {
    static const std::array<unsigned char, kGuardBytes + 256> fill = all_fill();
    return std::memcmp(zone, fill.data(), bytes) == 0;
}

// The first and one past the last byte of [zone, zone + bytes) that is not kFill (first == last: none).
std::pair<std::size_t, std::size_t> written_range(const unsigned char* zone, std::size_t bytes) {
    std::size_t first = 0, last = bytes;
    while (first < bytes && zone[first] == kFill) ++first;
    while (last > first && zone[last - 1] == kFill) --last;
    return {first, last};
}

}  // namespace

// Where [source, source + bytes) reads a device block's guard zone: "N bytes before the start of
// a device block of M bytes" (or after its end), or nothing. (Kernels of the tests may also read
// host memory: only the zones around device blocks are known to be wrong.)
std::optional<std::string> read_outside_a_block(const unsigned char* source, std::size_t bytes) {
    const std::lock_guard<std::mutex> lock(device_blocks_mutex);
    const auto next = device_blocks.upper_bound(const_cast<unsigned char*>(source));
    const unsigned char* end = source + bytes;
    if (next != device_blocks.end() && end > next->first - kGuardBytes) {
        return std::to_string(next->first - source) + " bytes before the start of a device block of " +
               std::to_string(next->second) + " bytes";
    }
    if (next != device_blocks.begin()) {
        const auto& [start, nbytes] = *std::prev(next);
        if (end > start + nbytes && source < start + nbytes + after_zone_bytes(nbytes)) {
            return std::to_string(end - (start + nbytes)) + " bytes past the end of a device block of " +
                   std::to_string(nbytes) + " bytes";
        }
    }
    return std::nullopt;
}

// Throws, naming `kernel`, when it wrote into a guard zone (report), restoring every zone it wrote either way.
void check_guard_zones(const char* kernel, bool report) {
    std::string error;
    const std::lock_guard<std::mutex> lock(device_blocks_mutex);
    for (const auto& [start, nbytes] : device_blocks) {
        if (untouched(start - kGuardBytes, kGuardBytes) && untouched(start + nbytes, after_zone_bytes(nbytes)))
            continue;
        const auto [after_first, after_last] = written_range(start + nbytes, after_zone_bytes(nbytes));
        const auto [before_first, before_last] = written_range(start - kGuardBytes, kGuardBytes);
        if (error.empty() && after_first != after_last) {
            error = "wrote past the end of a device block of " + std::to_string(nbytes) + " bytes (bytes " +
                    std::to_string(after_first) + " to " + std::to_string(after_last - 1) + " after its end)";
        } else if (error.empty() && before_first != before_last) {
            error = "wrote before the start of a device block of " + std::to_string(nbytes) + " bytes (bytes " +
                    std::to_string(kGuardBytes - before_last + 1) + " to " +
                    std::to_string(kGuardBytes - before_first) + " before it)";
        }
        std::memset(start - kGuardBytes, kFill, kGuardBytes);
        std::memset(start + nbytes, kFill, after_zone_bytes(nbytes));
    }
    if (report && !error.empty()) throw std::logic_error(std::string("kernel ") + kernel + ": " + error);
}

void* allocate_device_memory(std::size_t nbytes) {
    const std::size_t total = kGuardBytes + nbytes + after_zone_bytes(nbytes);
    auto* raw = static_cast<unsigned char*>(std::aligned_alloc(256, total));
    if (!raw) return nullptr;
    std::memset(raw, kFill, total);
    const std::lock_guard<std::mutex> lock(device_blocks_mutex);
    device_blocks.emplace(raw + kGuardBytes, nbytes);
    return raw + kGuardBytes;
}

void free_device_memory(void* block) {
    {
        const std::lock_guard<std::mutex> lock(device_blocks_mutex);
        device_blocks.erase(static_cast<unsigned char*>(block));
    }
    std::free(static_cast<unsigned char*>(block) - kGuardBytes);
}

}  // namespace cuda_emulator
}  // namespace relgrad
