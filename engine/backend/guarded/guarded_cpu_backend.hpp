// The guarded CPU device: the CPU backend's kernels, registered as a device whose memory the host
// API refuses to touch: Tensor::data<T>() throws, and only to(), copy_(), to_vector() and item()
// copy its values out, as they would from a GPU. It has its own allocator, so its own
// memory_stats. Every op, layer and training run that passes on it is device-clean: it never
// reads device memory from the host, never mixes devices, and allocates on its inputs' device.
// Each of its kernels first checks that every operand is on this device, so a kernel handed
// CPU memory fails here as it would on a GPU. The tests run on it beside the CPU and expect
// identical results.
#pragma once

#include "engine/backend/cpu/cpu_backend.hpp"

namespace relgrad {

class GuardedCpuBackend final : public CpuBackend {
public:
    const char* name() const override { return "guarded_cpu"; }
    bool supports(OptionalKernel kernel) const override;

    void fill(Tensor& out, double value) override;
    void copy(const Tensor& src, Tensor& dst) override;
    void unary(UnaryOp op, const Tensor& x, Tensor& out, double a = 0, double b = 0) override;
    void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) override;
    void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) override;
    void reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, Tensor& out) override;
    void batched_gemm(const Tensor& a, const Tensor& b, Tensor& out) override;
    void gather(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) override;
    void scatter_add(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) override;
    void index_select(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) override;
    void index_add(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) override;
    void softmax_last_dim(const Tensor& x, bool log, Tensor& out) override;
    void attention_softmax(Tensor& scores, const Tensor& bucket_scores, const Tensor& index, const Tensor& mask,
                           double scale, Tensor& bucket_weights) override;
    void attention_softmax_backward(Tensor& grad, const Tensor& weights, const Tensor& d_buckets, const Tensor& index,
                                    double scale, Tensor& d_bucket_scores) override;
    void fused_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionPattern& pattern,
                         double scale, const ClippedRelativeTerms& relative, Tensor& z, Tensor& lse) override;
    void fused_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& z, const Tensor& lse,
                                  const Tensor& dz, const AttentionPattern& pattern, double scale,
                                  const ClippedRelativeTerms& relative, Tensor& dq, Tensor& dk, Tensor& dv,
                                  Tensor& d_table_k, Tensor& d_table_v) override;

    // Whether it offers the fused attention kernels (on by default); off, the fused op must fall
    // back to the bucketed one, which the tests check.
    bool offers_fused_attention = true;
};

GuardedCpuBackend& guarded_cpu_backend();

}  // namespace relgrad
