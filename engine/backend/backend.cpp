// What every backend does alike: the checks each kernel starts with and the setup of the matrix
// products, before the device's own kernels (the do_ list, cpu/ and cuda/); the defaults of the
// optional kernels; the wording of the bad values the kernels find (kernel_checks.hpp); and the
// table of backends by device.
#include "engine/backend/backend.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "engine/backend/cpu/cpu_backend.hpp"
#include "engine/backend/kernel_checks.hpp"
#include "engine/check.hpp"

namespace relgrad {

#ifdef RELGRAD_HAVE_CUDA
namespace cuda {
Backend& gpu_backend();  // cuda_backend.cu (compiled by nvcc; its header is CUDA's)
}
#endif

Backend::Backend(Device device, int64_t max_dims) : device_(device), max_dims_(max_dims) {}

void Backend::require_on_device(const char* kernel, std::initializer_list<const Tensor*> operands) const {
    for (const Tensor* t : operands) {
        if (!t->defined()) continue;
        if (t->device() != device_) {
            throw std::logic_error(std::string(kernel) + ": an operand on the " + device_name(t->device()) +
                                   " device reached the " + name() + " kernels");
        }
        RELGRAD_CHECK(t->dim() <= max_dims_, kernel, ": a tensor of ", t->dim(), " dims; the ", name(),
                      " kernels take at most ", max_dims_);
    }
}

// ---------------------------------------------------------------- the kernels

void Backend::fill(Tensor& out, double value) {
    require_on_device("fill", {&out});
    do_fill(out, value);
}

void Backend::copy(const Tensor& src, Tensor& dst) {
    require_on_device("copy", {&src, &dst});
    RELGRAD_CHECK(src.shape() == dst.shape(), "copy: source shape ", shape_str(src.shape()),
                  " differs from destination shape ", shape_str(dst.shape()));
    do_copy(src, dst);
}

void Backend::unary(UnaryOp op, const Tensor& x, Tensor& out, double a, double b) {
    require_on_device("unary", {&x, &out});
    do_unary(op, x, out, a, b);
}

void Backend::binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
    require_on_device("binary", {&a, &b, &out});
    do_binary(op, a, b, out);
}

void Backend::where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
    require_on_device("where", {&cond, &a, &b, &out});
    do_where(cond, a, b, out);
}

void Backend::reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, Tensor& out) {
    require_on_device("reduce", {&x, &out});
    if (dims.empty()) {
        copy(x, out);
        return;
    }
    do_reduce(op, x, dims, out);
}

// How a BLAS can read a rows x cols matrix stored with (row_stride, col_stride).
static BlasOperand blas_operand(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
    if ((cols == 1 || col_stride == 1) && (rows == 1 || row_stride >= std::max<int64_t>(cols, 1))) {
        return {true, false, rows == 1 ? std::max<int64_t>(cols, 1) : row_stride};
    }
    if ((rows == 1 || row_stride == 1) && (cols == 1 || col_stride >= std::max<int64_t>(rows, 1))) {
        return {true, true, cols == 1 ? std::max<int64_t>(rows, 1) : col_stride};
    }
    return {false, false, 0};
}

void Backend::batched_gemm(const Tensor& a_in, const Tensor& b_in, Tensor& out) {
    require_on_device("batched_gemm", {&a_in, &b_in, &out});
    const int64_t rank = a_in.dim();
    const int64_t M = a_in.shape()[rank - 2], K = a_in.shape()[rank - 1];
    const int64_t N = b_in.shape()[rank - 1];
    if (M == 0 || N == 0) return;
    if (K == 0) {
        fill(out, 0.0);
        return;
    }
    // Operands BLAS cannot read in place (e.g. an expanded matrix) are packed first.
    auto readable = [&](const Tensor& t, int64_t rows, int64_t cols) {
        if (blas_operand(rows, cols, t.strides()[rank - 2], t.strides()[rank - 1]).ok) return t;
        Tensor packed = empty_like(t);
        copy(t, packed);
        return packed;
    };
    GemmBatch products;
    products.a = readable(a_in, M, K);
    products.b = readable(b_in, K, N);
    const Tensor &a = products.a, &b = products.b;
    products.a_operand = blas_operand(M, K, a.strides()[rank - 2], a.strides()[rank - 1]);
    products.b_operand = blas_operand(K, N, b.strides()[rank - 2], b.strides()[rank - 1]);
    products.M = M;
    products.N = N;
    products.K = K;
    // the offsets of every batch entry in a, b and out, in C order over the batch dims: built dim by
    // dim from the last, which varies fastest
    products.offsets.assign(1, {0, 0, 0});
    for (int64_t d = rank - 3; d >= 0; --d) {
        std::vector<std::array<int64_t, 3>> wider;
        for (int64_t i = 0; i < a.shape()[d]; ++i) {
            for (const auto& o : products.offsets) {
                wider.push_back({o[0] + i * a.strides()[d], o[1] + i * b.strides()[d], o[2] + i * out.strides()[d]});
            }
        }
        products.offsets = std::move(wider);
    }
    do_batched_gemm(products, out);
}

void Backend::gather(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) {
    require_on_device("gather", {&x, &index, &out});
    do_gather(x, dim, index, out);
}

void Backend::scatter_add(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
    require_on_device("scatter_add", {&out, &index, &src});
    do_scatter_add(out, dim, index, src);
}

void Backend::index_select(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) {
    require_on_device("index_select", {&x, &index, &out});
    do_index_select(x, dim, index, out);
}

void Backend::index_add(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
    require_on_device("index_add", {&out, &index, &src});
    do_index_add(out, dim, index, src);
}

void Backend::softmax_last_dim(const Tensor& x, bool log, Tensor& out) {
    require_on_device("softmax_last_dim", {&x, &out});
    const int64_t columns = x.dim() == 0 ? 1 : x.shape().back();
    if (columns == 0) return;
    do_softmax_last_dim(x, x.numel() / columns, columns, log, out);
}

void Backend::attention_softmax(Tensor& scores, const Tensor& bucket_scores, const Tensor& index, const Tensor& mask,
                                double scale, Tensor& bucket_weights) {
    require_on_device("attention_softmax", {&scores, &bucket_scores, &index, &mask, &bucket_weights});
    do_attention_softmax(scores, bucket_scores, index, mask, scale, bucket_weights);
}

void Backend::attention_softmax_backward(Tensor& grad, const Tensor& weights, const Tensor& d_buckets,
                                         const Tensor& index, double scale, Tensor& d_bucket_scores) {
    require_on_device("attention_softmax_backward", {&grad, &weights, &d_buckets, &index, &d_bucket_scores});
    do_attention_softmax_backward(grad, weights, d_buckets, index, scale, d_bucket_scores);
}

void Backend::fused_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionPattern& pattern,
                              double scale, const ClippedRelativeTerms& relative, Tensor& z, Tensor& lse) {
    require_on_device("fused_attention", {&q, &k, &v, &pattern.mask, &relative.table_k, &relative.table_v, &z, &lse});
    do_fused_attention(q, k, v, pattern, scale, relative, z, lse);
}

void Backend::fused_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& z,
                                       const Tensor& lse, const Tensor& dz, const AttentionPattern& pattern,
                                       double scale, const ClippedRelativeTerms& relative, Tensor& dq, Tensor& dk,
                                       Tensor& dv, Tensor& d_table_k, Tensor& d_table_v) {
    require_on_device("fused_attention_backward", {&q, &k, &v, &z, &lse, &dz, &pattern.mask, &relative.table_k,
                                                   &relative.table_v, &dq, &dk, &dv, &d_table_k, &d_table_v});
    do_fused_attention_backward(q, k, v, z, lse, dz, pattern, scale, relative, dq, dk, dv, d_table_k, d_table_v);
}

// The optional kernels a backend leaves out: reaching one is a bug in the op that called it.
void Backend::do_fused_attention(const Tensor&, const Tensor&, const Tensor&, const AttentionPattern&, double,
                                 const ClippedRelativeTerms&, Tensor&, Tensor&) {
    throw std::logic_error(std::string("fused_attention: the ") + name() + " backend has no fused kernel");
}
void Backend::do_fused_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                          const Tensor&, const AttentionPattern&, double, const ClippedRelativeTerms&,
                                          Tensor&, Tensor&, Tensor&, Tensor&, Tensor&) {
    throw std::logic_error(std::string("fused_attention_backward: the ") + name() + " backend has no fused kernel");
}

// ---------------------------------------------------------------- the bad values kernels find

std::string index_out_of_range(const char* kernel, int64_t index, int64_t dim, int64_t size) {
    return std::string(kernel) + ": index " + std::to_string(index) + " is out of range for dim " +
           std::to_string(dim) + " of size " + std::to_string(size);
}

std::string bucket_out_of_range(int64_t bucket, int64_t buckets) {
    return "attention: bucket " + std::to_string(bucket) + " in the relative index is outside [0, " +
           std::to_string(buckets) + ")";
}

std::string no_int64_value(double value) {
    return "conversion to int64: " + std::to_string(value) + " has no int64 value";
}

// ---------------------------------------------------------------- the table of backends

CpuBackend& guarded_cpu_backend() {
    static CpuBackend* const guarded = new CpuBackend(Device::guarded_cpu);  // never destroyed, as below
    return *guarded;
}

Backend*& installed_cuda_backend() {
    static Backend* installed = nullptr;
    return installed;
}
void install_cuda_backend(Backend& backend) { installed_cuda_backend() = &backend; }

// The backends live as long as the program (never destroyed), so that a tensor freed during
// static destruction still finds its allocator.
Backend& backend_for(Device device) {
    static CpuBackend* const cpu = new CpuBackend(Device::cpu);
    switch (device) {
        case Device::cpu: return *cpu;
        case Device::guarded_cpu: return guarded_cpu_backend();
        case Device::cuda:
            if (Backend* installed = installed_cuda_backend()) return *installed;
#ifdef RELGRAD_HAVE_CUDA
            return cuda::gpu_backend();
#else
            throw std::runtime_error(
                "no usable CUDA device: this relgrad is built without its CUDA backend (RELGRAD_CUDA=OFF, or AUTO "
                "where no nvcc was found)");
#endif
    }
    throw std::invalid_argument(std::string("no backend is built for the ") + device_name(device) +
                                " device in this build");
}

}  // namespace relgrad
