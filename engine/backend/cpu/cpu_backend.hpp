// The CPU backend: the Backend interface (backend.hpp) on host memory. Its kernels live by family
// in the files beside this one, as the ops do in engine/ops/: elementwise.cpp (fill, copy, unary,
// binary, where), reduce.cpp (reduce, softmax_last_dim), gemm.cpp (batched_gemm and the one BLAS
// call, cpu::gemm), index.cpp (gather, scatter_add, index_select, index_add), attention.cpp (the
// attention rows) and fused_attention.cpp (the fused kernels); cpu_backend.cpp holds the memory.
// The loops they share: strided_loops.hpp (xtensor views, multi-index walks, thread chunks, the
// float32 copies of the 16-bit layouts the packed loops leave) and attention_rows.hpp (the SIMD
// row loops of both attentions). The CUDA backend mirrors this layout.
//
// The same class serves two devices: the cpu, and guarded_cpu, the CPU's kernels on memory of
// their own that the host API refuses to touch (Tensor::data<T>() throws there; only to(),
// copy_(), to_vector() and item() copy values out, as from a GPU). Every kernel first checks that
// each operand is on its backend's device (Backend, in backend.cpp). So an op, layer or training
// run that passes on guarded_cpu is device-clean: it never reads device memory from the host, never
// hands a kernel memory of another device, and allocates on its inputs' device
// (docs/engine.md#devices).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/backend/backend.hpp"

namespace relgrad {

class CpuBackend final : public Backend {
public:
    explicit CpuBackend(Device device);  // Device::cpu or Device::guarded_cpu
    bool supports(OptionalKernel kernel) const override;

    CachingAllocator& allocator() override { return allocator_; }
    void copy_from_host(const void* host, void* device, std::size_t nbytes) override;
    void copy_to_host(const void* device, void* host, std::size_t nbytes) override;

private:
#define RELGRAD_DEVICE_KERNEL(...) __VA_ARGS__ override;
#define RELGRAD_OPTIONAL_DEVICE_KERNEL(...) __VA_ARGS__ override;
#include "engine/backend/device_kernels.inc"
#undef RELGRAD_DEVICE_KERNEL
#undef RELGRAD_OPTIONAL_DEVICE_KERNEL

    friend class NoFusedAttentionGuard;
    bool offers_fused_attention_ = true;  // what supports(OptionalKernel::fused_attention) says

    CachingAllocator allocator_;  // each device its own memory, so its own memory_stats
};

// For the tests: while a NoFusedAttentionGuard lives, its backend offers no fused attention
// kernels, so that the fused op must fall back to the bucketed one (which the tests check on the
// guarded device); it is restored when the guard goes, however the test leaves its scope.
class NoFusedAttentionGuard {
public:
    explicit NoFusedAttentionGuard(CpuBackend& backend) : backend_(backend), offered_(backend.offers_fused_attention_) {
        backend_.offers_fused_attention_ = false;
    }
    ~NoFusedAttentionGuard() { backend_.offers_fused_attention_ = offered_; }
    NoFusedAttentionGuard(const NoFusedAttentionGuard&) = delete;
    NoFusedAttentionGuard& operator=(const NoFusedAttentionGuard&) = delete;

private:
    CpuBackend& backend_;
    bool offered_;
};

// The backend of the guarded_cpu device (backend_for(Device::guarded_cpu)), for the tests that
// switch its fused kernels off (NoFusedAttentionGuard).
CpuBackend& guarded_cpu_backend();

namespace cpu {
// C = alpha op(A) op(B) + beta C, row-major: float32 through oneDNN, float64 through OpenBLAS
// (gemm.cpp), each single-threaded. Call use_one_blas_thread()
// first: the threads are relgrad's (OpenMP), and two thread pools on two cores would only fight.
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
          int64_t ldb, T beta, T* C, int64_t ldc);
void use_one_blas_thread();
// C = op(A) op(B) in bfloat16 through oneDNN (OpenBLAS has no 16-bit products): float32 sums, each
// result rounded once; single-threaded inside relgrad's threads, as the float32 products are.
void gemm_bfloat16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const BFloat16* A, int64_t lda,
                   const BFloat16* B, int64_t ldb, BFloat16* C, int64_t ldc);
// C = alpha op(A) op(B) + beta C with bfloat16 A and B, float32 sums and C, row-major (oneDNN's
// gemm; the fused attention's tiles): single-threaded, as gemm<float> is.
void gemm_bfloat16_to_float(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const BFloat16* A,
                            int64_t lda, const BFloat16* B, int64_t ldb, float beta, float* C, int64_t ldc);
// Whether this CPU runs oneDNN's bfloat16 products at speed (AVX512-BF16 or AMX): without those
// instructions oneDNN emulates them at under half of OpenBLAS's float32 rate, and the products
// run on float32 copies instead.
bool fast_bfloat16_gemm();

// The fused attention's tiles (fused_attention.cpp): query rows and key columns of one tile; a
// [64, 256] score tile is 64 KiB in float32
constexpr int64_t kQueryTile = 64;
constexpr int64_t kKeyTile = 256;
}  // namespace cpu

}  // namespace relgrad
