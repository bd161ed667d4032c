// relgrad: random numbers from Philox 4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random
// numbers: as easy as 1, 2, 3", SC 2011), the counter-based generator of cuRAND and of PyTorch's
// CUDA generator. A value is a pure function of (seed, counter): the stream of a seed is the
// blocks philox(seed, 0), philox(seed, 1), ..., four 32-bit words each, and any block is computed
// without the ones before it. So a kernel draws a dropout mask in parallel, on the device that
// uses it, and a seed gives the same mask on every device and thread count; the backward draws it
// again instead of keeping it.
#pragma once

#include <cstdint>

#include "engine/host_device.hpp"

namespace relgrad {

struct PhiloxBlock {
    uint32_t word[4];
};

// Ten rounds of the Philox network on the counter (c0, c1, c2, c3) under the key (k0, k1):
//   (c0, c1, c2, c3) <- (hi(B c2) ^ c1 ^ k0, lo(B c2), hi(A c0) ^ c3 ^ k1, lo(A c0))
// with hi and lo the halves of a 64-bit product, and the key advanced by two Weyl constants
// between rounds.
RELGRAD_HOST_DEVICE inline PhiloxBlock philox4x32_10(PhiloxBlock counter, uint32_t k0, uint32_t k1) {
    constexpr uint64_t A = 0xD2511F53, B = 0xCD9E8D57;
    constexpr uint32_t weyl0 = 0x9E3779B9, weyl1 = 0xBB67AE85;
    uint32_t c0 = counter.word[0], c1 = counter.word[1], c2 = counter.word[2], c3 = counter.word[3];
    for (int round = 0; round < 10; ++round) {
        const uint64_t a = A * c0, b = B * c2;
        c0 = static_cast<uint32_t>(b >> 32) ^ c1 ^ k0;
        c1 = static_cast<uint32_t>(b);
        c2 = static_cast<uint32_t>(a >> 32) ^ c3 ^ k1;
        c3 = static_cast<uint32_t>(a);
        k0 += weyl0;
        k1 += weyl1;
    }
    return {{c0, c1, c2, c3}};
}

// Block `index` of the stream of `seed`: the counter (index's low and high words, 0, 0) under the
// key (seed's low and high words).
RELGRAD_HOST_DEVICE inline PhiloxBlock philox_block(uint64_t seed, uint64_t index) {
    return philox4x32_10({{static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0, 0}},
                         static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// A position in the stream of a seed. Each sequential draw takes the next block; a kernel that
// draws for itself reserves its blocks with take_blocks. A Generator is a plain value: a copy
// draws what the original would (checkpointed recomputation restores one that way).
class Generator {
public:
    explicit Generator(uint64_t seed = 0) : seed_(seed) {}
    uint64_t next_u64();    // words 0 and 1 of the next block
    double next_uniform();  // in [0, 1): 53 bits of words 0 and 1
    double next_normal();   // Box-Muller of two uniforms, from words 0-1 and 2-3 of one block
    // The first of `count` blocks reserved for a kernel, which draws them itself.
    uint64_t take_blocks(uint64_t count);
    uint64_t seed() const { return seed_; }
    uint64_t offset() const { return offset_; }  // the next block's index

private:
    uint64_t seed_;
    uint64_t offset_ = 0;
};

// Dropout's mask over n elements, from blocks first_block, first_block + 1, ...: element i is
// kept when word i % 4 of block first_block + i / 4 is at least threshold = ceil(p 2^32), so with
// probability 1 - p (to within 2^-32; p = 1 keeps nothing), and then scaled by 1 / (1 - p).
struct DropoutMask {
    uint64_t seed = 0, first_block = 0;
    uint64_t threshold = 0;  // up to 2^32: compared with a 32-bit word in 64 bits
    double keep_scale = 1;   // 1 / (1 - p); 0 for p = 1

    // m_i / (1 - p) for the 4 elements of block b of the mask (elements 4b .. 4b + 3)
    template <class T>
    RELGRAD_HOST_DEVICE void scales_of_block(uint64_t b, T scales[4]) const {
        const PhiloxBlock words = philox_block(seed, first_block + b);
        for (int lane = 0; lane < 4; ++lane) scales[lane] = words.word[lane] >= threshold ? T(keep_scale) : T(0);
    }
};
// The mask of n elements with drop probability p in [0, 1], its blocks taken from gen.
DropoutMask draw_dropout_mask(Generator& gen, double p, int64_t n);

}  // namespace relgrad
