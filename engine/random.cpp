// Philox streams (random.hpp): the sequential draws and the reservation of blocks for kernels.
#include "engine/random.hpp"

#include <cmath>
#include <string>

#include "engine/errors.hpp"

namespace relgrad {

uint64_t Generator::next_u64() {
    const PhiloxBlock block = philox_block(seed_, offset_++);
    return uint64_t{block.word[0]} | uint64_t{block.word[1]} << 32;
}

// the top 53 bits of 64 random bits, times 2^-53
static double uniform_of(uint32_t low, uint32_t high) {
    return static_cast<double>((uint64_t{low} | uint64_t{high} << 32) >> 11) * 0x1.0p-53;
}

double Generator::next_uniform() {
    const PhiloxBlock block = philox_block(seed_, offset_++);
    return uniform_of(block.word[0], block.word[1]);
}

// sqrt(-2 log u1) cos(2 pi u2) is standard normal for independent u1 in (0, 1], u2 in [0, 1)
double Generator::next_normal() {
    const PhiloxBlock block = philox_block(seed_, offset_++);
    const double u1 = 1.0 - uniform_of(block.word[0], block.word[1]);  // in (0, 1]: log(u1) is finite
    const double u2 = uniform_of(block.word[2], block.word[3]);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

uint64_t Generator::take_blocks(uint64_t count) {
    const uint64_t first = offset_;
    offset_ += count;
    return first;
}

DropoutMask draw_dropout_mask(Generator& gen, double p, int64_t n) {
    RELGRAD_CHECK(p >= 0 && p <= 1, "dropout: p must be in [0, 1], got ", std::to_string(p));
    RELGRAD_CHECK(n >= 0, "dropout: negative element count ", n);
    DropoutMask mask;
    mask.seed = gen.seed();
    mask.first_block = gen.take_blocks((static_cast<uint64_t>(n) + 3) / 4);
    mask.threshold = static_cast<uint64_t>(std::ceil(p * 0x1.0p32));  // exact: p 2^32 < 2^53
    mask.keep_scale = p < 1 ? 1.0 / (1.0 - p) : 0.0;
    return mask;
}

}  // namespace relgrad
