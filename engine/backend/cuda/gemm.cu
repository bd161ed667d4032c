// The CUDA backend's matrix products (engine/ops/linalg.cpp), set up by Backend::batched_gemm
// (backend.cpp): cuBLAS's strided batched gemm, a transposed view passed as a transpose flag, and
// for bfloat16 and float16 its GemmEx form with float32 sums; in the emulator, the CPU's products
// (cpu::gemm, cpu::gemm_bfloat16).
#include <array>
#include <type_traits>
#include <vector>

#include "engine/backend/cuda/cuda_backend.hpp"

#ifdef RELGRAD_CUDA_EMULATION
#include "engine/backend/cpu/cpu_backend.hpp"
#else
#include <cublas_v2.h>
#endif

namespace relgrad {
namespace RELGRAD_CUDA_NAMESPACE {

#ifdef RELGRAD_CUDA_EMULATION

template <class T>
void gemm_batch(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
                int64_t stride_a, const T* B, int64_t ldb, int64_t stride_b, T beta, T* C, int64_t ldc,
                int64_t stride_c, int64_t batch) {
    cpu::use_one_blas_thread();
    for (int64_t i = 0; i < batch; ++i) {
        if constexpr (std::is_same_v<T, BFloat16>) {  // C = A B: alpha 1, beta 0, as batched_gemm asks
            cpu::gemm_bfloat16(trans_a, trans_b, M, N, K, A + i * stride_a, lda, B + i * stride_b, ldb,
                               C + i * stride_c, ldc);
        } else {
            cpu::gemm<T>(trans_a, trans_b, M, N, K, alpha, A + i * stride_a, lda, B + i * stride_b, ldb, beta,
                         C + i * stride_c, ldc);
        }
    }
}

bool has_gemm_in(DType dtype) { return dtype == DType::bfloat16 && cpu::fast_bfloat16_gemm(); }

#else

namespace {

cublasHandle_t cublas() {
    static const cublasHandle_t handle = [] {
        cublasHandle_t h = nullptr;
        if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cublasCreate failed");
        return h;
    }();
    return handle;
}

cublasOperation_t operation(bool transposed) { return transposed ? CUBLAS_OP_T : CUBLAS_OP_N; }

// cuBLAS's strided batched gemm of each type, under one name
cublasStatus_t strided_batched_gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* alpha,
                                    const float* A, int lda, long long sa, const float* B, int ldb, long long sb,
                                    const float* beta, float* C, int ldc, long long sc, int batch) {
    return cublasSgemmStridedBatched(cublas(), ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batch);
}
cublasStatus_t strided_batched_gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                    const double* alpha, const double* A, int lda, long long sa, const double* B,
                                    int ldb, long long sb, const double* beta, double* C, int ldc, long long sc,
                                    int batch) {
    return cublasDgemmStridedBatched(cublas(), ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batch);
}
// bfloat16 or float16 operands and result, float32 sums (tensor cores)
template <class Half>
cublasStatus_t strided_batched_gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const Half* alpha,
                                    const Half* A, int lda, long long sa, const Half* B, int ldb, long long sb,
                                    const Half* beta, Half* C, int ldc, long long sc, int batch) {
    const cudaDataType type = std::is_same_v<Half, BFloat16> ? CUDA_R_16BF : CUDA_R_16F;
    const float alpha32 = *alpha, beta32 = *beta;
    return cublasGemmStridedBatchedEx(cublas(), ta, tb, m, n, k, &alpha32, A, type, lda, sa, B, type, ldb, sb, &beta32,
                                      C, type, ldc, sc, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

}  // namespace

// cuBLAS is column-major: the row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T,
// so the operands go in swapped, with the sizes N, M.
template <class T>
void gemm_batch(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
                int64_t stride_a, const T* B, int64_t ldb, int64_t stride_b, T beta, T* C, int64_t ldc,
                int64_t stride_c, int64_t batch) {
    const cublasStatus_t status =
        strided_batched_gemm(operation(trans_b), operation(trans_a), int(N), int(M), int(K), &alpha, B, int(ldb),
                             stride_b, A, int(lda), stride_a, &beta, C, int(ldc), stride_c, int(batch));
    if (status != CUBLAS_STATUS_SUCCESS) {
        throw std::runtime_error("cuBLAS's strided batched gemm failed with status " + std::to_string(status));
    }
}

bool has_gemm_in(DType dtype) { return is_16_bit(dtype); }

#endif

template void gemm_batch<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, int64_t,
                                const float*, int64_t, int64_t, float, float*, int64_t, int64_t, int64_t);
template void gemm_batch<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t, int64_t,
                                 const double*, int64_t, int64_t, double, double*, int64_t, int64_t, int64_t);
template void gemm_batch<BFloat16>(bool, bool, int64_t, int64_t, int64_t, BFloat16, const BFloat16*, int64_t, int64_t,
                                   const BFloat16*, int64_t, int64_t, BFloat16, BFloat16*, int64_t, int64_t, int64_t);
#ifndef RELGRAD_CUDA_EMULATION
template void gemm_batch<Float16>(bool, bool, int64_t, int64_t, int64_t, Float16, const Float16*, int64_t, int64_t,
                                  const Float16*, int64_t, int64_t, Float16, Float16*, int64_t, int64_t, int64_t);
#endif

namespace {

// A run of batch entries whose offsets step evenly: entries [first, first + count), each `step`
// elements on from the one before in a, b and out. One strided batched call does a run.
struct EvenRun {
    std::size_t first, count;
    std::array<int64_t, 3> step;
};

// The batch cut into runs from the front, each as long as the offsets keep its step.
std::vector<EvenRun> even_runs(const std::vector<std::array<int64_t, 3>>& offsets) {
    std::vector<EvenRun> runs;
    std::size_t first = 0;
    while (first < offsets.size()) {
        std::size_t last = first + 1;
        std::array<int64_t, 3> step{0, 0, 0};
        if (last < offsets.size()) {
            for (int k = 0; k < 3; ++k) step[k] = offsets[last][k] - offsets[first][k];
            auto steps_evenly = [&](std::size_t i) {
                for (int k = 0; k < 3; ++k)
                    if (offsets[i][k] - offsets[i - 1][k] != step[k]) return false;
                return true;
            };
            while (last < offsets.size() && steps_evenly(last)) ++last;
        }
        runs.push_back({first, last - first, step});
        first = last;
    }
    return runs;
}

}  // namespace

void CudaBackend::do_batched_gemm(const GemmBatch& products, Tensor& out) {
    const BlasOperand &la = products.a_operand, &lb = products.b_operand;
    auto multiply = [&](auto tag) {
        using T = decltype(tag);
        for (const EvenRun& run : even_runs(products.offsets)) {
            const auto& o = products.offsets[run.first];
            gemm_batch<T>(la.transposed, lb.transposed, products.M, products.N, products.K, T(1),
                          device_data<T>(products.a) + o[0], la.leading_dim, run.step[0],
                          device_data<T>(products.b) + o[1], lb.leading_dim, run.step[1], T(0),
                          device_data<T>(out) + o[2], products.N, run.step[2], static_cast<int64_t>(run.count));
        }
    };
    // 16-bit operands only where has_gemm_in says (supports(), which Backend::batched_gemm asks)
    if (products.a.dtype() == DType::bfloat16) return multiply(BFloat16{});
#ifndef RELGRAD_CUDA_EMULATION
    if (products.a.dtype() == DType::float16) return multiply(Float16{});
#endif
    dispatch_floating(products.a.dtype(), "matmul", multiply);
}

}  // namespace RELGRAD_CUDA_NAMESPACE
}  // namespace relgrad
