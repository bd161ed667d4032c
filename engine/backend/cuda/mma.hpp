// relgrad: one warp's matrix product on tensor cores (PTX mma.sync), where each lane holds its
// part of the tiles, and the loads of 16-bit fragments from shared memory (ldmatrix).
//
// mma_sync<In>(d, a, b, c) computes D = A B + C for one tile per warp: A is 16 x K, B is K x 8,
// C and D are 16 x 8 in float32; K = 8 for tf32 inputs, 16 for bfloat16 and float16. All 32 lanes
// of the warp call it together. No lane holds a whole row: each holds a fragment, a few registers
// whose elements sit where the PTX ISA places them ("Matrix Fragments for mma.m16n8k8" and
// "... mma.m16n8k16"). With g = lane / 4 (its groupID) and t = lane % 4 (threadID_in_group),
// element i of a lane's fragment is at
//
//   tf32 A      4 registers, 1 element each    row g + 8 (i % 2)        col t + 4 (i / 2)
//   tf32 B      2 registers, 1 element each    row t + 4 i              col g
//   16-bit A    4 registers, 2 elements each   row g + 8 (i / 2 % 2)    col 2t + i % 2 + 8 (i / 4)
//   16-bit B    2 registers, 2 elements each   row 2t + i % 2 + 8 (i / 2)  col g
//   C and D     4 float32                      row g + 8 (i / 2)        col 2t + i % 2
//
// (16-bit element i is in register i / 2, the low half first.) The functions below give these
// places; a kernel loads and stores its fragments by them, and the emulator assembles the tiles
// by them, so that a fragment loaded into the wrong register gives a wrong product there as on a
// GPU.
//
// Precision: each product of two inputs is exact in float32 (tf32 and the 16-bit types keep at
// most 11 significant bits); the sums are float32. The emulator adds in double and rounds once,
// where tensor cores round (or cut) along the way, so results agree to float32's rounding of
// the sum, not bit for bit. tf32 inputs are float32 values whose low 13 mantissa bits are
// ignored: round them with tf32_of first.
#pragma once

#include <cstdint>

#include "engine/half.hpp"
#include "engine/host_device.hpp"
#ifdef RELGRAD_CUDA_EMULATION
#include "engine/backend/cuda/emulator.hpp"
#endif

namespace relgrad {

enum class MmaInputs { tf32, bfloat16, float16 };

struct TilePlace {
    int row, col;
};

RELGRAD_HOST_DEVICE constexpr int mma_k(MmaInputs inputs) { return inputs == MmaInputs::tf32 ? 8 : 16; }
// elements of A and B in a lane's fragment (C and D: 4)
RELGRAD_HOST_DEVICE constexpr int mma_a_elements(MmaInputs inputs) { return inputs == MmaInputs::tf32 ? 4 : 8; }
RELGRAD_HOST_DEVICE constexpr int mma_b_elements(MmaInputs inputs) { return inputs == MmaInputs::tf32 ? 2 : 4; }

RELGRAD_HOST_DEVICE constexpr TilePlace mma_a_place(MmaInputs inputs, int lane, int i) {
    const int g = lane / 4, t = lane % 4;
    if (inputs == MmaInputs::tf32) return {g + 8 * (i % 2), t + 4 * (i / 2)};
    return {g + 8 * (i / 2 % 2), 2 * t + i % 2 + 8 * (i / 4)};
}
RELGRAD_HOST_DEVICE constexpr TilePlace mma_b_place(MmaInputs inputs, int lane, int i) {
    const int g = lane / 4, t = lane % 4;
    if (inputs == MmaInputs::tf32) return {t + 4 * i, g};
    return {2 * t + i % 2 + 8 * (i / 2), g};
}
RELGRAD_HOST_DEVICE constexpr TilePlace mma_c_place(int lane, int i) {
    const int g = lane / 4, t = lane % 4;
    return {g + 8 * (i / 2), 2 * t + i % 2};
}

// The bits of a float32 that tf32 keeps: sign, exponent and the top 10 of the 23 mantissa bits.
constexpr uint32_t kTf32Bits = 0xffffe000u;

// float32 -> tf32 (in float32's bits, the low 13 mantissa bits zero), to nearest, ties away from
// zero: PTX's cvt.rna.tf32.f32. Infinities and NaN stay as they are.
RELGRAD_HOST_DEVICE inline uint32_t tf32_of(float value) {
#if defined(__CUDA_ARCH__)
    uint32_t bits;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(bits) : "f"(value));
    return bits;
#else
    const uint32_t bits = half_bits::of(value);
    if ((bits & 0x7f800000u) == 0x7f800000u) return bits;
    return (bits + 0x1000u) & kTf32Bits;  // half of the cut-off part added to the magnitude
#endif
}

// Two 16-bit inputs in one register, `low` the element with the lower index, each rounded to
// nearest even (on the GPU one cvt.rn for the pair, which puts its first operand in the high half).
RELGRAD_HOST_DEVICE inline uint32_t pack_16_bit(MmaInputs inputs, float low, float high) {
#if defined(__CUDA_ARCH__)
    uint32_t bits;
    if (inputs == MmaInputs::bfloat16) {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(bits) : "f"(high), "f"(low));
    } else {
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(bits) : "f"(high), "f"(low));
    }
    return bits;
#else
    const auto bits = [&](float f) -> uint32_t {
        return inputs == MmaInputs::bfloat16 ? half_bits::bfloat16_of(f) : half_bits::float16_of(f);
    };
    return bits(low) | bits(high) << 16;
#endif
}

// Element i of an A or B fragment (registers `regs`) as a float.
RELGRAD_HOST_DEVICE inline float mma_input(MmaInputs inputs, const uint32_t* regs, int i) {
    if (inputs == MmaInputs::tf32) return half_bits::to_float(regs[i] & kTf32Bits);
    const auto bits = static_cast<uint16_t>(regs[i / 2] >> (16 * (i % 2)));
    return inputs == MmaInputs::bfloat16 ? half_bits::float_of_bfloat16(bits) : half_bits::float_of_float16(bits);
}

template <MmaInputs In>
__device__ inline void mma_sync(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4]) {
#ifdef RELGRAD_CUDA_EMULATION
    cuda_emulator::mma_sync_point(In, d, a, b, c);
#else
#define RELGRAD_MMA(shape_and_types)                                                                                  \
    asm volatile("mma.sync.aligned." shape_and_types                                                                  \
                 " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"                               \
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])                                                     \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), \
                   "f"(c[3]))
    if constexpr (In == MmaInputs::tf32) {
        RELGRAD_MMA("m16n8k8.row.col.f32.tf32.tf32.f32");
    } else if constexpr (In == MmaInputs::bfloat16) {
        RELGRAD_MMA("m16n8k16.row.col.f32.bf16.bf16.f32");
    } else {
        RELGRAD_MMA("m16n8k16.row.col.f32.f16.f16.f32");
    }
#undef RELGRAD_MMA
#endif
}

// ldmatrix.x4: four 8 x 8 matrices of 16-bit values from shared memory into the warp's fragments,
// one instruction for a lane's four registers. Lane 8 m + r names `row`, the address of row r of
// matrix m (8 values, 16 bytes, at a 16-byte boundary); lane l receives in out[m] matrix m's
// elements at row l / 4, columns 2 (l % 4) and + 1 (the low half first), which are the places of
// an A or B fragment register (g = l / 4, t = l % 4); Transposed, at column l / 4, rows 2 (l % 4)
// and + 1: a B register from a matrix stored with B's rows as its rows. All 32 lanes call it
// together. `row` is a pointer into shared memory (runtime.hpp's Shared<T>).
template <bool Transposed, class SharedRow>
__device__ inline void load_matrices(SharedRow row, uint32_t (&out)[4]) {
#ifdef RELGRAD_CUDA_EMULATION
    cuda_emulator::ldmatrix_point(Transposed, row.address(), out);
#else
    const auto address = static_cast<unsigned>(__cvta_generic_to_shared(row));
    if constexpr (Transposed) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(out[0]), "=r"(out[1]), "=r"(out[2]), "=r"(out[3])
                     : "r"(address));
    } else {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(out[0]), "=r"(out[1]), "=r"(out[2]), "=r"(out[3])
                     : "r"(address));
    }
#endif
}

}  // namespace relgrad
