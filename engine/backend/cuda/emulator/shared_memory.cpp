// The CUDA emulator's shared memory (state.hpp says how the parts fit): where a block's static and
// dynamic shared memory live; the race check, which notes every access to them (Shared<T>) against
// the phase it happens in and reports two threads' unordered accesses to one byte, one a write (what
// compute-sanitizer's racecheck reports on a GPU); and cp.async, whose copies into shared memory
// count as written when issued and land at the wait that covers them.
#include "engine/backend/cuda/emulator/state.hpp"

#include <cstring>
#include <stdexcept>

namespace relgrad {
namespace cuda_emulator {

void* dynamic_shared_memory() {
    if (!running_block) throw std::logic_error("dynamic shared memory outside a kernel");
    return running_block->dynamic_shared.data();
}

void* static_shared_memory(const void* tag, std::size_t bytes, std::size_t alignment) {
    if (!running_block) throw std::logic_error("shared memory outside a kernel");
    Block& block = *running_block;
    for (const auto& [known, offset] : block.static_offsets) {
        if (known == tag) return block.static_shared.get() + offset;
    }
    const std::size_t offset = (block.static_used + alignment - 1) / alignment * alignment;
    if (offset + bytes > kMaxStaticSharedBytes) {
        throw std::logic_error("a block's static shared memory exceeds " + std::to_string(kMaxStaticSharedBytes) +
                               " bytes");
    }
    std::memset(block.static_shared.get() + offset, kFill, bytes);
    block.static_offsets.emplace_back(tag, offset);
    block.static_used = offset + bytes;
    return block.static_shared.get() + offset;
}

void note_shared_access(const void* address, std::size_t bytes, bool write) {
    if (!running_block || !running_block->current) throw std::logic_error("a shared-memory access outside a kernel");
    Block& block = *running_block;
    const auto* first = static_cast<const unsigned char*>(address);
    const unsigned char* dynamic_start = block.dynamic_shared.data();
    const unsigned char* static_start = block.static_shared.get();
    const uint32_t me = static_cast<uint32_t>(block.current->linear), my_warp = me / kWarpSize;
    const auto describe = [&](uint32_t thread) { return "thread " + std::to_string(thread); };
    const auto fail = [&](const std::string& what) {
        throw std::logic_error(std::string("kernel ") + block.kernel + ", block (" + std::to_string(blockIdx.x) + ", " +
                               std::to_string(blockIdx.y) + ", " + std::to_string(blockIdx.z) + "): " + what);
    };
    Block::ByteAccesses* accesses = nullptr;
    std::string region;
    std::size_t offset = 0;
    if (first >= dynamic_start && first + bytes <= dynamic_start + block.dynamic_shared.size()) {
        offset = static_cast<std::size_t>(first - dynamic_start);
        accesses = block.dynamic_accesses.data() + offset;
        region = "dynamic";
    } else if (first >= static_start && first + bytes <= static_start + block.static_used) {
        offset = static_cast<std::size_t>(first - static_start);
        if (block.static_accesses.size() < block.static_used) block.static_accesses.resize(block.static_used);
        accesses = block.static_accesses.data() + offset;
        region = "static";
    } else {
        fail(describe(me) + (write ? " wrote " : " read ") + std::to_string(bytes) +
             " bytes outside the block's shared memory");
    }
    const uint32_t epoch = block.warp_epochs[my_warp];
    // another thread's access is ordered before mine by a barrier (another phase), or, for a lane of
    // my warp, by a warp-scoped point since
    const auto unordered = [&](uint32_t other, uint32_t other_epoch) {
        return other != me && !(other / kWarpSize == my_warp && other_epoch != epoch);
    };
    const auto race = [&](uint32_t other, const char* other_did, std::size_t byte) {
        fail("a race on byte " + std::to_string(offset + byte) + " of " + region + " shared memory: " +
             describe(other) + " " + other_did + " it and " + describe(me) + (write ? " wrote" : " read") +
             " it with no __syncthreads() between them (nor, for lanes of one warp, a warp-scoped point)");
    };
    for (std::size_t byte = 0; byte < bytes; ++byte) {
        Block::ByteAccesses& a = accesses[byte];
        if (a.write_phase == block.phase && unordered(a.writer, a.write_epoch)) race(a.writer, "wrote", byte);
        if (write) {
            if (a.read_phase == block.phase) {  // a read by another thread not ordered before this write?
                if (a.first_reader / kWarpSize != my_warp) race(a.first_reader, "read", byte);
                if (a.readers_in_two_warps) race(a.reader_in_other_warp, "read", byte);
                if (a.read_epoch == epoch && (a.first_reader != me || a.several_readers)) {
                    race(a.first_reader != me ? a.first_reader : a.other_reader, "read", byte);
                }
            }
            a.write_phase = block.phase;
            a.writer = me;
            a.write_epoch = epoch;
        } else if (a.read_phase != block.phase) {
            a = {a.write_phase, block.phase, a.writer, a.write_epoch, me, me, me, epoch, false, false};
        } else if (my_warp == a.first_reader / kWarpSize && a.read_epoch != epoch) {
            // my warp's reads so far are ordered before its lanes' writes from now on by a warp-scoped
            // point: they are forgotten (a read by another warp in this phase is kept)
            a.first_reader = a.other_reader = me;
            a.read_epoch = epoch;
            a.several_readers = false;
        } else {
            if (me != a.first_reader && !a.several_readers) a.several_readers = true, a.other_reader = me;
            if (my_warp != a.first_reader / kWarpSize && !a.readers_in_two_warps) {
                a.readers_in_two_warps = true, a.reader_in_other_warp = me;
            }
            if (my_warp == a.first_reader / kWarpSize) a.read_epoch = epoch;
        }
    }
}

}  // namespace cuda_emulator
}  // namespace relgrad

namespace {
relgrad::cuda_emulator::Fiber& pipeline_thread(const char* op) {
    using namespace relgrad::cuda_emulator;
    if (!running_block || !running_block->current) throw std::logic_error(std::string(op) + " outside a kernel");
    return *running_block->current;
}
}  // namespace

void __pipeline_memcpy_async(void* dst_shared, const void* src_global, std::size_t size_and_align, std::size_t zfill) {
    using namespace relgrad::cuda_emulator;
    Fiber& thread = pipeline_thread("__pipeline_memcpy_async");
    const std::string op = "__pipeline_memcpy_async of " + std::to_string(size_and_align) + " bytes: ";
    if (size_and_align != 4 && size_and_align != 8 && size_and_align != 16) {
        throw std::logic_error(op + "copies 4, 8 or 16 bytes");
    }
    if (zfill > size_and_align)
        throw std::logic_error(op + "zfill " + std::to_string(zfill) + " is more than the copy");
    if (reinterpret_cast<uintptr_t>(dst_shared) % size_and_align ||
        reinterpret_cast<uintptr_t>(src_global) % size_and_align) {
        throw std::logic_error(op + "an address not aligned to the copy's size");
    }
    const Block& block = *running_block;
    const auto* destination = static_cast<const unsigned char*>(dst_shared);
    const auto inside = [&](const unsigned char* begin, std::size_t bytes) {
        return destination >= begin && destination + size_and_align <= begin + bytes;
    };
    if (!inside(block.dynamic_shared.data(), block.dynamic_shared.size()) &&
        !inside(block.static_shared.get(), block.static_used)) {
        throw std::logic_error(op + "the destination is not the block's shared memory");
    }
    const std::size_t copied = size_and_align - zfill;
    if (copied > 0) {
        if (const auto outside = read_outside_a_block(static_cast<const unsigned char*>(src_global), copied)) {
            throw std::logic_error(op + "the source reads " + *outside);
        }
    }
    // The destination is written from now until the wait that covers it (a GPU may write it at any
    // moment in between): a thread's access to it that nothing orders after this one is a race,
    // a tile buffer refilled while another warp still reads it among them. The bytes change at the
    // wait.
    relgrad::cuda_emulator::note_shared_access(dst_shared, size_and_align, true);
    thread.async_batches.back().push_back({dst_shared, src_global, copied, zfill});
}

void __pipeline_commit() { pipeline_thread("__pipeline_commit").async_batches.emplace_back(); }

void __pipeline_wait_prior(std::size_t prior) {
    auto& batches = pipeline_thread("__pipeline_wait_prior").async_batches;
    // batches.back() is the open one; the committed ones before it land, oldest first, but `prior`
    while (batches.size() - 1 > prior) {
        for (const auto& copy : batches.front()) {
            relgrad::cuda_emulator::note_shared_access(copy.destination, copy.copied + copy.zeroed, true);
            std::memcpy(copy.destination, copy.source, copy.copied);
            std::memset(static_cast<unsigned char*>(copy.destination) + copy.copied, 0, copy.zeroed);
        }
        batches.erase(batches.begin());
    }
}
