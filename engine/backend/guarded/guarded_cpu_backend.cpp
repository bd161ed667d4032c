#include "engine/backend/guarded/guarded_cpu_backend.hpp"

#include <initializer_list>
#include <stdexcept>
#include <string>

namespace relgrad {

namespace {

// Every defined operand must be on the guarded device; a tensor of another device reaching these
// kernels is a bug in the op that called them.
void require_guarded(const char* kernel, std::initializer_list<const Tensor*> operands) {
    for (const Tensor* t : operands) {
        if (t->defined() && t->device() != Device::guarded_cpu) {
            throw std::logic_error(std::string(kernel) + ": an operand on the " + device_name(t->device()) +
                                   " device reached the guarded_cpu kernels");
        }
    }
}

}  // namespace

bool GuardedCpuBackend::supports(OptionalKernel kernel) const {
    switch (kernel) {
        case OptionalKernel::fused_attention: return offers_fused_attention;
    }
    return false;
}

void GuardedCpuBackend::fill(Tensor& out, double value) {
    require_guarded("fill", {&out});
    CpuBackend::fill(out, value);
}

void GuardedCpuBackend::copy(const Tensor& src, Tensor& dst) {
    require_guarded("copy", {&src, &dst});
    CpuBackend::copy(src, dst);
}

void GuardedCpuBackend::unary(UnaryOp op, const Tensor& x, Tensor& out, double a, double b) {
    require_guarded("unary", {&x, &out});
    CpuBackend::unary(op, x, out, a, b);
}

void GuardedCpuBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
    require_guarded("binary", {&a, &b, &out});
    CpuBackend::binary(op, a, b, out);
}

void GuardedCpuBackend::where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
    require_guarded("where", {&cond, &a, &b, &out});
    CpuBackend::where(cond, a, b, out);
}

void GuardedCpuBackend::reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, Tensor& out) {
    require_guarded("reduce", {&x, &out});
    CpuBackend::reduce(op, x, dims, out);
}

void GuardedCpuBackend::batched_gemm(const Tensor& a, const Tensor& b, Tensor& out) {
    require_guarded("batched_gemm", {&a, &b, &out});
    CpuBackend::batched_gemm(a, b, out);
}

void GuardedCpuBackend::gather(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) {
    require_guarded("gather", {&x, &index, &out});
    CpuBackend::gather(x, dim, index, out);
}

void GuardedCpuBackend::scatter_add(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
    require_guarded("scatter_add", {&out, &index, &src});
    CpuBackend::scatter_add(out, dim, index, src);
}

void GuardedCpuBackend::index_select(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) {
    require_guarded("index_select", {&x, &index, &out});
    CpuBackend::index_select(x, dim, index, out);
}

void GuardedCpuBackend::index_add(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
    require_guarded("index_add", {&out, &index, &src});
    CpuBackend::index_add(out, dim, index, src);
}

void GuardedCpuBackend::softmax_last_dim(const Tensor& x, bool log, Tensor& out) {
    require_guarded("softmax_last_dim", {&x, &out});
    CpuBackend::softmax_last_dim(x, log, out);
}

void GuardedCpuBackend::attention_softmax(Tensor& scores, const Tensor& bucket_scores, const Tensor& index,
                                          const Tensor& mask, double scale, Tensor& bucket_weights) {
    require_guarded("attention_softmax", {&scores, &bucket_scores, &index, &mask, &bucket_weights});
    CpuBackend::attention_softmax(scores, bucket_scores, index, mask, scale, bucket_weights);
}

void GuardedCpuBackend::attention_softmax_backward(Tensor& grad, const Tensor& weights, const Tensor& d_buckets,
                                                   const Tensor& index, double scale, Tensor& d_bucket_scores) {
    require_guarded("attention_softmax_backward", {&grad, &weights, &d_buckets, &index, &d_bucket_scores});
    CpuBackend::attention_softmax_backward(grad, weights, d_buckets, index, scale, d_bucket_scores);
}

void GuardedCpuBackend::fused_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const AttentionPattern& pattern, double scale,
                                        const ClippedRelativeTerms& relative, Tensor& z, Tensor& lse) {
    require_guarded("fused_attention",
                    {&q, &k, &v, &pattern.mask, &relative.table_k, &relative.table_v, &z, &lse});
    CpuBackend::fused_attention(q, k, v, pattern, scale, relative, z, lse);
}

void GuardedCpuBackend::fused_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& z,
                                                 const Tensor& lse, const Tensor& dz, const AttentionPattern& pattern,
                                                 double scale, const ClippedRelativeTerms& relative, Tensor& dq,
                                                 Tensor& dk, Tensor& dv, Tensor& d_table_k, Tensor& d_table_v) {
    require_guarded("fused_attention_backward", {&q, &k, &v, &z, &lse, &dz, &pattern.mask, &relative.table_k,
                                                 &relative.table_v, &dq, &dk, &dv, &d_table_k, &d_table_v});
    CpuBackend::fused_attention_backward(q, k, v, z, lse, dz, pattern, scale, relative, dq, dk, dv, d_table_k,
                                         d_table_v);
}

GuardedCpuBackend& guarded_cpu_backend() {
    static GuardedCpuBackend* const backend = new GuardedCpuBackend();  // never destroyed, as the CPU's
    return *backend;
}

}  // namespace relgrad
