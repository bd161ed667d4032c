// relgrad: the two 16-bit floating types, each stored as its 16 bits.
//
//                sign  exponent  mantissa   largest finite   smallest normal   epsilon
//   bfloat16       1      8          7        3.39e38           1.18e-38       2^-7 = 0.0078
//   float16        1      5         10        65504             6.10e-5        2^-10 = 0.00098
//   (float32       1      8         23        3.40e38           1.18e-38       2^-23)
//
// bfloat16 is float32 with the low 16 mantissa bits cut off: float32's range, 3 significant
// digits. float16 (IEEE binary16) keeps 4 digits but overflows past 65504 and goes subnormal
// below 6.1e-5 (its smallest subnormal is 2^-24 = 6e-8). Arithmetic is never done in 16 bits: a
// value converts to float exactly (an implicit conversion), and a float or double converts to one
// rounded to the nearest 16-bit value, ties to the even one; too large a value becomes +-inf,
// NaN stays NaN. Host code and CUDA kernels share these (RELGRAD_HOST_DEVICE).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "engine/host_device.hpp"

namespace relgrad {

namespace half_bits {

RELGRAD_HOST_DEVICE inline uint32_t of(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return bits;
}

RELGRAD_HOST_DEVICE inline float to_float(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

// double -> float rounded to odd: truncated toward zero, then the last bit set when anything was
// cut off. Rounding that to 16 bits to nearest even gives the same value as rounding the double
// directly, because float keeps more than two bits beyond either 16-bit mantissa; rounding to
// nearest twice could land on the wrong side of a tie instead.
RELGRAD_HOST_DEVICE inline float round_to_odd(double d) {
    float f = static_cast<float>(d);  // to nearest (inf past float's range)
    if (static_cast<double>(f) == d || f != f) return f;
    uint32_t bits = of(f);
    const double magnitude = d < 0 ? -d : d, rounded = f < 0 ? -static_cast<double>(f) : static_cast<double>(f);
    if (rounded > magnitude) bits -= 1;  // rounded away from zero: one step back toward it
    return to_float(bits | 1u);
}

// float -> bfloat16 bits: add just under half of the cut-off part, plus its last kept bit (so a
// tie goes to the even neighbour), and cut; a carry moves into the exponent, up to inf.
RELGRAD_HOST_DEVICE inline uint16_t bfloat16_of(float f) {
    const uint32_t x = of(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // NaN, quiet
    const uint32_t kept_lsb = (x >> 16) & 1u;
    return static_cast<uint16_t>((x + 0x7fffu + kept_lsb) >> 16);
}

// x if `condition`, else y, without a branch: the float16 conversions below compute every case
// and pick one, so that a loop over an array of them becomes SIMD code (a branch per value would
// keep it one value at a time, several times slower)
RELGRAD_HOST_DEVICE inline uint32_t pick(bool condition, uint32_t x, uint32_t y) {
    const uint32_t all_ones = 0u - static_cast<uint32_t>(condition);
    return (x & all_ones) | (y & ~all_ones);
}

// float -> float16 bits (IEEE binary16)
RELGRAD_HOST_DEVICE inline uint16_t float16_of(float f) {
    const uint32_t x = of(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t a = x & 0x7fffffffu;  // |f|
    // normal: round the 13 cut-off mantissa bits as bfloat16_of does, and rebias the exponent
    // (float's bias 127, float16's 15: 112 << 23 = 0x38000000)
    const uint32_t normal = (a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13;
    // below 2^-14, subnormal: |f| + 0.5 has its last mantissa bit worth 2^-24, float16's subnormal
    // step, so the float addition rounds to nearest even exactly as float16 must; the low bits are
    // the result
    const uint32_t subnormal = of(to_float(a) + 0.5f) - 0x3f000000u;
    uint32_t bits = pick(a < 0x38800000u, subnormal, normal);
    bits = pick(a >= 0x477ff000u, 0x7c00u, bits);  // >= 65520 rounds to inf
    bits = pick(a > 0x7f800000u, 0x7e00u, bits);   // NaN, quiet
    return static_cast<uint16_t>(sign | bits);
}

RELGRAD_HOST_DEVICE inline float float_of_bfloat16(uint16_t h) { return to_float(static_cast<uint32_t>(h) << 16); }

RELGRAD_HOST_DEVICE inline float float_of_float16(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    const uint32_t normal = ((exponent + 112u) << 23) | (mantissa << 13);
    const uint32_t inf_or_nan = 0x7f800000u | (mantissa << 13);
    // m 2^-24, exact in float
    const uint32_t zero_or_subnormal = of(static_cast<float>(static_cast<int32_t>(mantissa)) * 5.9604644775390625e-8f);
    const uint32_t bits = pick(exponent == 0, zero_or_subnormal, pick(exponent == 0x1f, inf_or_nan, normal));
    return to_float(sign | bits);
}

}  // namespace half_bits

// A 16-bit value of a Format (one of the two below): constructed from a float, a double or an
// integer (explicitly, rounded as above), read as a float (implicitly, exactly).
template <class Format>
struct Half {
    uint16_t bits = 0;

    Half() = default;
    RELGRAD_HOST_DEVICE explicit Half(float f) : bits(Format::bits_of(f)) {}
    RELGRAD_HOST_DEVICE explicit Half(double d) : bits(Format::bits_of(half_bits::round_to_odd(d))) {}
    template <class I, class = std::enable_if_t<std::is_integral_v<I>>>
    RELGRAD_HOST_DEVICE explicit Half(I i) : Half(static_cast<double>(i)) {}
    RELGRAD_HOST_DEVICE operator float() const { return Format::float_of(bits); }
};

struct BFloat16Format {
    RELGRAD_HOST_DEVICE static uint16_t bits_of(float f) { return half_bits::bfloat16_of(f); }
    RELGRAD_HOST_DEVICE static float float_of(uint16_t bits) { return half_bits::float_of_bfloat16(bits); }
};
struct Float16Format {
    RELGRAD_HOST_DEVICE static uint16_t bits_of(float f) { return half_bits::float16_of(f); }
    RELGRAD_HOST_DEVICE static float float_of(uint16_t bits) { return half_bits::float_of_float16(bits); }
};

using BFloat16 = Half<BFloat16Format>;
using Float16 = Half<Float16Format>;
static_assert(sizeof(BFloat16) == 2 && sizeof(Float16) == 2);

// float, double and the two 16-bit types: what a kernel may treat as a real number
template <class T>
inline constexpr bool is_real_v =
    std::is_floating_point_v<T> || std::is_same_v<T, BFloat16> || std::is_same_v<T, Float16>;

template <class T>
inline constexpr bool is_16_bit_v = std::is_same_v<T, BFloat16> || std::is_same_v<T, Float16>;

// The type arithmetic on a T happens in: float for the 16-bit types, T itself otherwise.
template <class T>
using compute_type = std::conditional_t<is_16_bit_v<T>, float, T>;

}  // namespace relgrad
