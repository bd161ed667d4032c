// relgrad: the backend interface, one flat list of kernels that every device implements.
//
// Ops (engine/ops/) are written once on top of these kernels; a kernel knows nothing about
// autograd. Inputs may be any strided view (transposed, sliced, expanded with stride 0); outputs
// are freshly allocated by the op unless a kernel says otherwise, always on the backend's own
// device (the ops check that every operand is). A backend also owns its device's memory: it
// allocates the storages and copies bytes to and from the host. The CPU backend (cpu/) is always
// built, and serves the guarded_cpu device too: the same kernels as a device the host may not
// read. The CUDA backend (cuda/) implements the same list on a GPU's memory, or in the emulator of
// the test build.
//
// Each kernel is a public call that does what every device does alike (backend.cpp): it checks
// that each operand is on the backend's device and the kernel's own preconditions, then calls the
// device's private do_ kernel, as std::pmr::memory_resource's allocate calls do_allocate. So a
// device implements the do_ list and nothing it shares with the others.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/attention_pattern.hpp"
#include "engine/half.hpp"
#include "engine/host_device.hpp"
#include "engine/storage.hpp"
#include "engine/tensor.hpp"

namespace relgrad {

enum class UnaryOp {
    neg,
    exp,
    log,
    sqrt,
    tanh,
    sigmoid,
    relu,
    gelu,
    relu_grad,   // 1 if x > 0 else 0           (the local derivative of relu)
    gelu_grad,   // Phi(x) + x phi(x)            (the local derivative of gelu)
    pow_scalar,  // x^a
    clamp,       // min(max(x, a), b)
    inside,      // 1 if a < x < b else 0       (the local derivative of clamp)
};

// gelu(x) = x Phi(x), with Phi(x) = (1 + erf(x / sqrt 2)) / 2 the standard normal's CDF, and its
// local derivative Phi(x) + x phi(x), with phi(x) = exp(-x^2 / 2) / sqrt(2 pi) the normal's density.
// Written once for both backends: x is a float or a double in a CUDA kernel and an xtensor
// expression in a CPU one (erf and exp are then xtensor's, found by argument-dependent lookup).
template <class T, class X>
RELGRAD_HOST_DEVICE auto gelu_formula(const X& x) {
    return T(0.5) * x * (T(1) + erf(x * T(0.70710678118654752440)));  // 0.707... = 1 / sqrt 2
}
template <class T, class X>
RELGRAD_HOST_DEVICE auto gelu_grad_formula(const X& x) {
    return T(0.5) * (T(1) + erf(x * T(0.70710678118654752440))) +
           x * T(0.39894228040143267794) * exp(T(-0.5) * x * x);  // 0.398... = 1 / sqrt(2 pi)
}

enum class BinaryOp { add, sub, mul, div, pow, equal };

enum class ReduceOp { sum, max };

// Kernels a backend may leave out; the op that needs one then falls back to other ops, as ggml's
// supports_op lets a backend do.
enum class OptionalKernel {
    fused_attention,         // fused_attention and its backward; else the bucketed attention op
    bfloat16_gemm,           // batched_gemm of bfloat16 operands itself; else on float32 copies
    float16_gemm,            // the same for float16
    fused_attention_16_bit,  // fused_attention of 16-bit q, k, v (z, dz) itself; else on float32 copies
    elementwise_16_bit,      // unary, binary, where, dropout and reduce of 16-bit tensors themselves, computing
                             // in float32 and rounding each result once; else on float32 copies
};

// The address of element [0, ..., 0] of t in its device's memory, for kernels only: host code
// uses Tensor::data<T>(), which refuses tensors the host cannot read.
template <class T>
T* device_data(const Tensor& t) {
    return static_cast<T*>(t.storage()->data()) + t.offset();
}

// The same, or null for an undefined tensor (an operand a kernel may go without).
template <class T>
T* device_data_or_null(const Tensor& t) {
    return t.defined() ? device_data<T>(t) : nullptr;
}

// Calls f(T{}) with T the C++ type of a dtype, for kernels written once as templates; the floating
// and numeric forms refuse other dtypes naming the kernel.
template <class F>
void dispatch_floating(DType dtype, const char* kernel, F&& f) {
    switch (dtype) {
        case DType::float32: f(float{}); return;
        case DType::float64: f(double{}); return;
        default:
            throw std::invalid_argument(std::string(kernel) + ": needs a float32 or float64 tensor, got " +
                                        dtype_name(dtype));
    }
}

// float32, float64 or int64 (which where and equal take too)
template <class F>
void dispatch_numeric(DType dtype, const char* kernel, F&& f) {
    if (dtype == DType::int64) {
        f(int64_t{});
    } else {
        dispatch_floating(dtype, kernel, f);
    }
}

// float32, float64 and the two 16-bit types: the kernels that read and write 16 bits themselves
// (elementwise_16_bit) and compute in compute_type<T>
template <class F>
void dispatch_real(DType dtype, const char* kernel, F&& f) {
    switch (dtype) {
        case DType::bfloat16: f(BFloat16{}); return;
        case DType::float16: f(Float16{}); return;
        default: dispatch_floating(dtype, kernel, f);
    }
}

// any dtype (fill and copy, and the kernels of elementwise_16_bit, see the 16-bit ones: the other
// kernels get float32 copies)
template <class F>
void dispatch_any(DType dtype, F&& f) {
    switch (dtype) {
        case DType::float32: f(float{}); return;
        case DType::float64: f(double{}); return;
        case DType::int64: f(int64_t{}); return;
        case DType::boolean: f(bool{}); return;
        case DType::bfloat16: f(BFloat16{}); return;
        case DType::float16: f(Float16{}); return;
    }
}

// How a BLAS (OpenBLAS, cuBLAS) reads a matrix of batched_gemm: row-major as it is stored, or as
// the transpose of a row-major matrix, so that a transposed view costs a flag and no copy. `ok` is
// false when neither works (e.g. stride 0): batched_gemm then packs the matrix first.
struct BlasOperand {
    bool ok;
    bool transposed;
    int64_t leading_dim;
};

// The products of batched_gemm, set up for the device's BLAS: out[e] = op(a[e]) op(b[e]) for each
// entry e of the batch, with op(a[e]) [M, K] starting offsets[e][0] elements into a, op(b[e])
// [K, N] offsets[e][1] into b and out[e] [M, N] offsets[e][2] into out; the entries in C order
// over the batch dims, and M, N, K > 0.
struct GemmBatch {
    Tensor a, b;  // a or b itself, or a packed copy where a BLAS could not read it in place
    BlasOperand a_operand, b_operand;
    int64_t M, N, K;
    std::vector<std::array<int64_t, 3>> offsets;
};

class Backend {
public:
    virtual ~Backend() = default;
    const char* name() const { return device_name(device_); }  // the device's
    virtual bool supports(OptionalKernel kernel) const = 0;

    // --- memory: the device's allocator, and bytes between host memory and device memory
    virtual CachingAllocator& allocator() = 0;
    virtual void copy_from_host(const void* host, void* device, std::size_t nbytes) = 0;
    virtual void copy_to_host(const void* device, void* host, std::size_t nbytes) = 0;

    // out[...] = value
    void fill(Tensor& out, double value);
    // dst[...] = src[...]; same shape, any strides, converts between dtypes
    void copy(const Tensor& src, Tensor& dst);
    // t itself, or a float32 copy of a 16-bit t (undefined stays undefined)
    Tensor widened(const Tensor& t);
    // out = f(x) elementwise; a and b are the scalar parameters some ops take
    void unary(UnaryOp op, const Tensor& x, Tensor& out, double a = 0, double b = 0);
    // out = a (op) b elementwise, a and b broadcast to out's shape
    void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out);
    // out = residual + x * m / (1 - p), m_i the mask's for the flat (C-order) index i (random.hpp),
    // drawn by the kernel itself; without a residual (undefined), out = x * m / (1 - p). x, residual
    // and out contiguous, of one shape.
    void dropout(const Tensor& x, const Tensor& residual, const DropoutMask& mask, Tensor& out);
    // out = cond ? a : b, all broadcast to out's shape; cond may have any dtype (non-zero = true)
    void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out);
    // out (x's shape with `dims` set to 1) = reduction of x over `dims`; over no dims, a copy
    void reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, Tensor& out);
    // out[b] = op(a[b]) @ op(b[b]) for every batch index b; a [..., M, K], b [..., K, N] with
    // identical batch dims (expanded by the caller); out contiguous [..., M, N]
    void batched_gemm(const Tensor& a, const Tensor& b, Tensor& out);
    // The index kernels check every index against its dim (an index outside it is an
    // std::invalid_argument naming the kernel, the index and the dim's size), on the device.
    // out[i][j][k] = x[i][index[i][j][k]][k] (for dim = 1); index int64 of out's shape
    void gather(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out);
    // out[i][index[i][j][k]][k] += src[i][j][k] (for dim = 1); out contiguous
    void scatter_add(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src);
    // out = x with dim `dim` replaced by the rows index[0..n); index int64 [n]
    void index_select(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out);
    // out[..., index[i], ...] += src[..., i, ...]; out contiguous
    void index_add(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src);
    // softmax (or log_softmax) over the last dim of a contiguous x; a row whose entries are all
    // -inf gives zeros (softmax) or -inf (log_softmax), never NaN
    void softmax_last_dim(const Tensor& x, bool log, Tensor& out);
    // RoPE's rotation of the pairs of x's rows: x and out contiguous [..., L, Dh] (Dh even), cos and
    // sin contiguous [L, Dh / 2]; out[.., p, 2t] = x_2t cos[p, t] - x_2t+1 sin[p, t],
    // out[.., p, 2t+1] = x_2t sin[p, t] + x_2t+1 cos[p, t] (the inverse rotation: -sin)
    void rotate_pairs(const Tensor& x, const Tensor& cos, const Tensor& sin, Tensor& out);

    // The causal and window rules of `pattern` as bool out [Lq, Lk], true where query i (at
    // position query_offset + i) may see key j: d = j - (query_offset + i) <= 0 if causal, and
    // |d| <= window if window >= 0 (pattern.mask is not read)
    void pattern_mask(const AttentionPattern& pattern, Tensor& out);

    // --- attention (engine/ops/attention.cpp). Rows are (b, h, i) of [B, H, Lq, Lk] tensors;
    // `index` is int64 [Lq, Lk] with the bucket r(i, j); `mask` is bool, already expanded to
    // [B, H, Lq, Lk]; undefined tensors are skipped. A bucket outside [0, K) is an
    // std::invalid_argument, checked by the kernel.
    // In place: scores <- softmax_j(mask ? scale * (scores + bucket_scores[r(i, j)]) : -inf), where
    // bucket_scores is [B, H, Lq, K]; a fully masked row becomes zeros. If bucket_weights
    // ([B, H, Lq, K]) is defined it receives, per row, the weights summed by bucket:
    // bucket_weights[r] = sum of a_ij over the j with r(i, j) = r.
    void attention_softmax(Tensor& scores, const Tensor& bucket_scores, const Tensor& index, const Tensor& mask,
                           double scale, Tensor& bucket_weights);
    // In place, from dL/da to dL/ds (s the scores before scaling): with da += d_buckets[r(i, j)],
    // ds = scale * a (da - sum_j da_j a_j). If d_bucket_scores is defined it receives ds summed by
    // bucket, as bucket_weights above. K is d_buckets' last dim, else d_bucket_scores'.
    void attention_softmax_backward(Tensor& grad, const Tensor& weights, const Tensor& d_buckets, const Tensor& index,
                                    double scale, Tensor& d_bucket_scores);

    // --- fused attention (engine/ops/attention.cpp), where supports(OptionalKernel::fused_attention);
    // the default do_ kernels throw. q, k, v, z, dz contiguous [B, H, L, Dh]; tables contiguous; the pattern's mask
    // bool and expanded to [B, H, Lq, Lk] (a view). Forward: z (the attention output) and lse [B, H, Lq], the
    // log-sum-exp of each row's scaled scores (-inf for a row that sees no key, whose z is 0).
    void fused_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionPattern& pattern,
                         double scale, const ClippedRelativeTerms& relative, Tensor& z, Tensor& lse);
    // Backward from dz: overwrites dq, dk, dv and, with relative terms, d_table_k and d_table_v;
    // with a distance bias and a defined d_distance_bias [B, H, Lq + Lk - 1], that bias's gradient
    // per (batch, head), which the op sums.
    void fused_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& z, const Tensor& lse,
                                  const Tensor& dz, const AttentionPattern& pattern, double scale,
                                  const ClippedRelativeTerms& relative, Tensor& dq, Tensor& dk, Tensor& dv,
                                  Tensor& d_table_k, Tensor& d_table_v, Tensor& d_distance_bias);

protected:
    // The backend of `device`, whose kernels take operands of at most max_dims dims.
    explicit Backend(Device device, int64_t max_dims = std::numeric_limits<int64_t>::max());

private:
    // The device's kernels (device_kernels.inc), called once the public ones above have checked
    // their operands.
#define RELGRAD_DEVICE_KERNEL(...) virtual __VA_ARGS__ = 0;
#define RELGRAD_OPTIONAL_DEVICE_KERNEL(...) virtual __VA_ARGS__;
#include "engine/backend/device_kernels.inc"
#undef RELGRAD_DEVICE_KERNEL
#undef RELGRAD_OPTIONAL_DEVICE_KERNEL

    // Every kernel starts here: an operand on another device is a bug of the op that called it
    // (std::logic_error); one of more dims than the device's kernels take, an std::invalid_argument.
    void require_on_device(const char* kernel, std::initializer_list<const Tensor*> operands) const;

    Device device_;
    int64_t max_dims_;
};

// The backend of a device. For cuda: the one install_cuda_backend gave, else the GPU's when relgrad
// is built with CUDA; without a usable GPU a std::runtime_error says why ("no usable CUDA device:
// ...").
Backend& backend_for(Device device);
// Makes `backend` the cuda device's, for the rest of the program: the test build installs the
// CUDA backend's kernels running in the emulator (engine/backend/cuda/emulator.hpp).
void install_cuda_backend(Backend& backend);

}  // namespace relgrad
