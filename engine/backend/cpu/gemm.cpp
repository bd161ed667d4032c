// The CPU's matrix products (engine/ops/linalg.cpp), set up by Backend::batched_gemm (backend.cpp):
// every BLAS call of the backend goes through cpu::gemm below: float32 into oneDNN's sgemm, which
// ran the products of a training step 4-13% faster than OpenBLAS on an AVX2 machine and twice as
// fast on an AVX-512 one (docs/performance.md), float64 into OpenBLAS by xtensor-blas's cxxblas
// layer; bfloat16 products through cpu::gemm_bfloat16, into oneDNN's matmul.
#include <algorithm>
#include <array>
#include <vector>

#include <map>
#include <type_traits>
#include <tuple>

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>
#include <xtensor-blas/xblas.hpp>

#include "engine/backend/cpu/cpu_backend.hpp"

// OpenBLAS's thread control (its cblas.h cannot be included next to xtensor-blas)
extern "C" void openblas_set_num_threads(int threads);
// oneDNN's bfloat16 gemm with float32 sums and output, row-major like dnnl_sgemm: the library
// exports it, its header (oneDNN 2.6) does not declare it
extern "C" dnnl_status_t dnnl_gemm_bf16bf16f32(char transa, char transb, dnnl_dim_t M, dnnl_dim_t N, dnnl_dim_t K,
                                               float alpha, const uint16_t* A, dnnl_dim_t lda, const uint16_t* B,
                                               dnnl_dim_t ldb, float beta, float* C, dnnl_dim_t ldc);

namespace relgrad {
namespace cpu {

template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
          int64_t ldb, T beta, T* C, int64_t ldc) {
    using xt::blas_index_t;
    cxxblas::gemm<blas_index_t>(
        cxxblas::StorageOrder::RowMajor, trans_a ? cxxblas::Transpose::Trans : cxxblas::Transpose::NoTrans,
        trans_b ? cxxblas::Transpose::Trans : cxxblas::Transpose::NoTrans, blas_index_t(M), blas_index_t(N),
        blas_index_t(K), alpha, A, blas_index_t(lda), B, blas_index_t(ldb), beta, C, blas_index_t(ldc));
}
// float32: oneDNN's sgemm, single-threaded: outside a parallel region (a lone product) it would
// take OpenMP's threads, and cut the product by their number; the setting is the calling thread's
// own, restored after
template <>
void gemm<float>(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                 const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
    const int threads = omp_get_max_threads();
    if (threads != 1) omp_set_num_threads(1);
    dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (threads != 1) omp_set_num_threads(threads);
}
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t, const double*,
                           int64_t, double, double*, int64_t);

void gemm_bfloat16_to_float(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const BFloat16* A,
                            int64_t lda, const BFloat16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
    static_assert(sizeof(BFloat16) == sizeof(uint16_t));
    const int threads = omp_get_max_threads();  // single-threaded, as gemm<float> above
    if (threads != 1) omp_set_num_threads(1);
    dnnl_gemm_bf16bf16f32(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha,
                          reinterpret_cast<const uint16_t*>(A), lda, reinterpret_cast<const uint16_t*>(B), ldb, beta, C,
                          ldc);
    if (threads != 1) omp_set_num_threads(threads);
}

void use_one_blas_thread() { openblas_set_num_threads(1); }

namespace {

// A row-major matrix of `rows` x `columns` (op(X) as the product reads it) for oneDNN: strides
// (leading_dim, 1), or (1, leading_dim) when X is read transposed.
dnnl::memory::desc matrix(int64_t rows, int64_t columns, bool transposed, int64_t leading_dim) {
    return dnnl::memory::desc({rows, columns}, dnnl::memory::data_type::bf16,
                              transposed ? dnnl::memory::dims{1, leading_dim} : dnnl::memory::dims{leading_dim, 1});
}

const dnnl::engine& dnnl_cpu() {
    static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    return engine;
}

}  // namespace

void gemm_bfloat16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const BFloat16* A, int64_t lda,
                   const BFloat16* B, int64_t ldb, BFloat16* C, int64_t ldc) {
    // a primitive per shape, made once per thread (making one takes longer than a small product)
    using Shape = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;
    thread_local std::map<Shape, dnnl::matmul> made;
    thread_local dnnl::stream stream(dnnl_cpu());
    const dnnl::memory::desc a = matrix(M, K, trans_a, lda), b = matrix(K, N, trans_b, ldb),
                             c = matrix(M, N, false, ldc);
    const Shape shape{trans_a, trans_b, M, N, K, lda, ldb, ldc};
    auto found = made.find(shape);
    if (found == made.end()) {
        const dnnl::matmul::primitive_desc plan(dnnl::matmul::desc(a, b, c), dnnl_cpu());
        found = made.emplace(shape, dnnl::matmul(plan)).first;
    }
    // oneDNN reads through non-const handles; it writes only C
    dnnl::memory a_memory(a, dnnl_cpu(), const_cast<BFloat16*>(A)), b_memory(b, dnnl_cpu(), const_cast<BFloat16*>(B));
    dnnl::memory c_memory(c, dnnl_cpu(), C);
    found->second.execute(stream, {{DNNL_ARG_SRC, a_memory}, {DNNL_ARG_WEIGHTS, b_memory}, {DNNL_ARG_DST, c_memory}});
    stream.wait();
}

bool fast_bfloat16_gemm() {
    // oneDNN's ISA values are sets of bits, each a superset of the ones it extends
    const auto bits = [](dnnl::cpu_isa isa) { return static_cast<unsigned>(isa); };
    static const bool fast = (bits(dnnl::get_effective_cpu_isa()) & bits(dnnl::cpu_isa::avx512_core_bf16)) ==
                             bits(dnnl::cpu_isa::avx512_core_bf16);
    return fast;
}

}  // namespace cpu

using namespace cpu;

namespace {

// How a batch of products is cut into pieces for the threads. The cut depends on the shapes alone
// (see batched_gemm): a batch of kWholeProducts products or more (attention's, one per head) is cut
// into the products; fewer products are cut into blocks of rows, or, when a product is too short
// for that but at least kWideColumns wide (an output layer while decoding), into blocks of columns.
constexpr int64_t kWholeProducts = 8;
constexpr int64_t kWideColumns = 256;

// The rows (or columns) of one block: about an eighth of n, rounded up to a multiple of 64 and at
// least 128 (each block packs all of op(B) again, so blocks are kept big).
int64_t block_size(int64_t n) {
    constexpr int64_t parts = 8, multiple = 64, smallest = 128;
    return std::max<int64_t>(smallest, (n + parts * multiple - 1) / (parts * multiple) * multiple);
}

}  // namespace

void CpuBackend::do_batched_gemm(const GemmBatch& products, Tensor& out) {
    const int64_t M = products.M, N = products.N, K = products.K;
    const BlasOperand &la = products.a_operand, &lb = products.b_operand;
    const std::vector<std::array<int64_t, 3>>& offsets = products.offsets;
    auto multiply = [&](auto tag) {
        using T = decltype(tag);
        const T* pa = device_data<T>(products.a);
        const T* pb = device_data<T>(products.b);
        T* pc = device_data<T>(out);
        // rows [m0, m1) and columns [n0, n1) of one product; row m of op(A) starts m * leading_dim
        // in (m when A is read transposed), column n of op(B) n in (n * leading_dim transposed)
        auto product_block = [&](const std::array<int64_t, 3>& off, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
            if (m1 <= m0 || n1 <= n0) return;
            const int64_t a_row = m0 * (la.transposed ? 1 : la.leading_dim);
            const int64_t b_column = n0 * (lb.transposed ? lb.leading_dim : 1);
            if constexpr (std::is_same_v<T, BFloat16>) {
                gemm_bfloat16(la.transposed, lb.transposed, m1 - m0, n1 - n0, K, pa + off[0] + a_row, la.leading_dim,
                              pb + off[1] + b_column, lb.leading_dim, pc + off[2] + m0 * N + n0, N);
            } else {
                gemm<T>(la.transposed, lb.transposed, m1 - m0, n1 - n0, K, T(1), pa + off[0] + a_row, la.leading_dim,
                        pb + off[1] + b_column, lb.leading_dim, T(0), pc + off[2] + m0 * N + n0, N);
            }
        };
        // Threads are relgrad's (OpenMP), the BLAS runs single-threaded inside them: two thread
        // pools on two cores would only fight. The work is cut into the same pieces whatever the
        // thread count and the pieces are shared out: a BLAS picks its kernels by the sizes it
        // is given, so cutting by the thread count would make the results depend on it (the rule
        // is at kWholeProducts above).
        const int64_t count = static_cast<int64_t>(offsets.size());
        const int64_t block_rows = count >= kWholeProducts ? M : block_size(M);
        const int64_t row_blocks = (M + block_rows - 1) / block_rows;
        const bool cut_columns = count < kWholeProducts && row_blocks == 1 && N >= kWideColumns;
        const int64_t block_columns = cut_columns ? block_size(N) : N;
        const int64_t column_blocks = (N + block_columns - 1) / block_columns;
        const int64_t blocks = row_blocks * column_blocks;
        use_one_blas_thread();
        const int64_t pieces = count * blocks;
        // oneDNN, called inside a parallel region, runs single-threaded; a lone piece gets one too,
        // so that no product is ever cut by the thread count
        const bool parallel = pieces > 1 || std::is_same_v<T, BFloat16>;
#pragma omp parallel for schedule(static) if (parallel)
        for (int64_t piece = 0; piece < pieces; ++piece) {
            const int64_t row_block = piece % blocks / column_blocks, column_block = piece % column_blocks;
            product_block(offsets[piece / blocks], row_block * block_rows, std::min(M, (row_block + 1) * block_rows),
                          column_block * block_columns, std::min(N, (column_block + 1) * block_columns));
        }
    };
    if (products.a.dtype() == DType::bfloat16) {  // only where supports(OptionalKernel::bfloat16_gemm)
        multiply(BFloat16{});
    } else {
        dispatch_floating(products.a.dtype(), "matmul", multiply);
    }
}

}  // namespace relgrad
