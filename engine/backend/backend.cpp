// What every backend does alike: the checks each kernel starts with and the setup of the matrix
// products, before the device's own kernels (the do_ list, cpu/ and cuda/); the defaults of the
// optional kernels; the wording of the bad values the kernels find (kernel_errors.hpp); and the
// table of backends by device.
#include "engine/backend/backend.hpp"

#include "engine/autograd.hpp"

#include <algorithm>
#include <chrono>
#include <list>
#include <stdexcept>
#include <string>

#ifdef RELGRAD_CUDA_MODULE
#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <vector>
#endif

#include "engine/backend/cpu/cpu_backend.hpp"
#include "engine/backend/kernel_errors.hpp"
#include "engine/errors.hpp"
#include "engine/profile.hpp"

namespace relgrad {

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

// ---------------------------------------------------------------- 16-bit operands

Tensor Backend::widened(const Tensor& t) {
    if (!t.defined() || !is_16_bit(t.dtype())) return t;
    Tensor wide = empty(t.shape(), DType::float32, t.device());
    copy(t, wide);
    return wide;
}

namespace {

// The device kernels compute in float32 or float64 only. A bfloat16 or float16 operand reaches
// them as a float32 copy, and a 16-bit output is computed into a float32 buffer that finish()
// rounds into it once, after the kernel. These are the values of a kernel that reads and writes
// 16 bits and forms every product, sum and exponential in float32, as mixed precision asks
// (docs/precision.md); what it costs is the copies. fill and copy take 16-bit tensors themselves,
// and a backend that says so (supports()) takes them in batched_gemm, the fused attention and the
// elementwise kernels: for those, InFloat32 is made `as_they_are` and passes every tensor through.
class InFloat32 {
public:
    explicit InFloat32(Backend& backend, bool as_they_are = false) : backend_(backend), as_they_are_(as_they_are) {}

    // an input: itself, or a float32 copy of a 16-bit one
    Tensor in(const Tensor& t) { return as_they_are_ ? t : backend_.widened(t); }
    // an output: itself, or a float32 buffer for a 16-bit one (holding its values when the kernel
    // reads them too: an accumulating or in-place kernel)
    Tensor& out(Tensor& t, bool read_too = false) {
        if (as_they_are_ || !t.defined() || !is_16_bit(t.dtype())) return t;
        outputs_.push_back({&t, read_too ? in(t) : empty(t.shape(), DType::float32, t.device())});
        return outputs_.back().wide;
    }
    // rounds every float32 buffer into its 16-bit output
    void finish() {
        for (Output& o : outputs_) backend_.copy(o.wide, *o.narrow);
    }

private:
    struct Output {
        Tensor* narrow;
        Tensor wide;
    };
    Backend& backend_;
    bool as_they_are_;
    std::list<Output>
        outputs_;  // a list: out() hands out references that must stay put (and an empty one allocates nothing)
};

// A matrix product's 16-bit operand as a float32 copy. A transposed view of a packed tensor (X^T
// in a product's backward) widens in its own layout, in one pass along memory, and the product
// reads the copy transposed, as it would have read the operand: a copy in the transposed order
// reads memory a column at a time (2.9 ns a value here, against 0.3-0.7 in one pass). Only for
// products: another kernel may take another path for a strided float32 input than for a packed
// one, with other bits (xtensor's scalar erf against its SIMD one).
Tensor widened_operand(Backend& backend, const Tensor& t) {
    if (t.defined() && is_16_bit(t.dtype()) && t.dim() >= 2 && !t.is_contiguous()) {
        NoGradGuard views_only;
        const Tensor packed = t.transpose(-2, -1);
        if (packed.is_contiguous()) return backend.widened(packed).transpose(-2, -1);
    }
    return backend.widened(t);
}

}  // namespace

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
    InFloat32 f32(*this, supports(OptionalKernel::elementwise_16_bit));
    do_unary(op, f32.in(x), f32.out(out), a, b);
    f32.finish();
}

void Backend::binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
    require_on_device("binary", {&a, &b, &out});
    InFloat32 f32(*this, supports(OptionalKernel::elementwise_16_bit));
    do_binary(op, f32.in(a), f32.in(b), f32.out(out));
    f32.finish();
}

void Backend::where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
    require_on_device("where", {&cond, &a, &b, &out});
    InFloat32 f32(*this, supports(OptionalKernel::elementwise_16_bit));
    do_where(f32.in(cond), f32.in(a), f32.in(b), f32.out(out));
    f32.finish();
}

void Backend::dropout(const Tensor& x, const Tensor& residual, const DropoutMask& mask, Tensor& out) {
    require_on_device("dropout", {&x, &residual, &out});
    for (const Tensor* t : std::initializer_list<const Tensor*>{&x, &residual, &out}) {
        if (!t->defined()) continue;
        RELGRAD_CHECK(t->is_contiguous() && t->shape() == out.shape(),
                      "dropout: the kernel takes contiguous operands of one shape, got ", shape_str(t->shape()),
                      " for ", shape_str(out.shape()));
    }
    InFloat32 f32(*this, supports(OptionalKernel::elementwise_16_bit));
    do_dropout(f32.in(x), f32.in(residual), mask, f32.out(out));
    f32.finish();
}

void Backend::reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, Tensor& out) {
    require_on_device("reduce", {&x, &out});
    if (dims.empty()) {
        copy(x, out);
        return;
    }
    InFloat32 f32(*this, supports(OptionalKernel::elementwise_16_bit));
    do_reduce(op, f32.in(x), dims, f32.out(out));
    f32.finish();
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

void Backend::batched_gemm(const Tensor& a_narrow, const Tensor& b_narrow, Tensor& out_narrow) {
    require_on_device("batched_gemm", {&a_narrow, &b_narrow, &out_narrow});
    const auto started = profiling() ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
    // a device with 16-bit products of its own takes the operands as they are
    const DType dtype = a_narrow.dtype();
    const bool in_16_bits = (dtype == DType::bfloat16 && supports(OptionalKernel::bfloat16_gemm)) ||
                            (dtype == DType::float16 && supports(OptionalKernel::float16_gemm));
    InFloat32 f32(*this);
    const Tensor a_in = in_16_bits ? a_narrow : widened_operand(*this, a_narrow),
                 b_in = in_16_bits ? b_narrow : widened_operand(*this, b_narrow);
    Tensor& out = in_16_bits ? out_narrow : f32.out(out_narrow);
    const int64_t rank = a_in.dim();
    const int64_t M = a_in.shape()[rank - 2], K = a_in.shape()[rank - 1];
    const int64_t N = b_in.shape()[rank - 1];
    if (M == 0 || N == 0) return;
    if (K == 0) {
        fill(out_narrow, 0.0);
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
    f32.finish();
    if (profiling()) {
        const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) *
                             static_cast<double>(products.offsets.size());
        profile_gemm(flops, std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    }
}

void Backend::gather(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) {
    require_on_device("gather", {&x, &index, &out});
    InFloat32 f32(*this);
    do_gather(f32.in(x), dim, index, f32.out(out));
    f32.finish();
}

void Backend::scatter_add(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
    require_on_device("scatter_add", {&out, &index, &src});
    InFloat32 f32(*this);
    do_scatter_add(f32.out(out, true), dim, index, f32.in(src));
    f32.finish();
}

void Backend::index_select(const Tensor& x, int64_t dim, const Tensor& index, Tensor& out) {
    require_on_device("index_select", {&x, &index, &out});
    InFloat32 f32(*this);
    do_index_select(f32.in(x), dim, index, f32.out(out));
    f32.finish();
}

void Backend::index_add(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
    require_on_device("index_add", {&out, &index, &src});
    InFloat32 f32(*this);
    do_index_add(f32.out(out, true), dim, index, f32.in(src));
    f32.finish();
}

void Backend::softmax_last_dim(const Tensor& x, bool log, Tensor& out) {
    require_on_device("softmax_last_dim", {&x, &out});
    const int64_t columns = x.dim() == 0 ? 1 : x.shape().back();
    if (columns == 0) return;
    InFloat32 f32(*this);
    do_softmax_last_dim(f32.in(x), x.numel() / columns, columns, log, f32.out(out));
    f32.finish();
}

void Backend::pattern_mask(const AttentionPattern& pattern, Tensor& out) {
    require_on_device("pattern_mask", {&out});
    RELGRAD_CHECK(out.dim() == 2 && out.dtype() == DType::boolean && out.is_contiguous(), "pattern_mask: out ",
                  shape_str(out.shape()), " must be a contiguous bool [Lq, Lk]");
    check_pattern(pattern, out.size(0), "pattern_mask");
    if (out.numel() == 0) return;
    do_pattern_mask(pattern.causal, pattern.window, pattern.query_offset, out);
}

void Backend::rotate_pairs(const Tensor& x, const Tensor& cos, const Tensor& sin, Tensor& out) {
    require_on_device("rotate_pairs", {&x, &cos, &sin, &out});
    const int64_t L = x.dim() >= 2 ? x.size(-2) : 0, Dh = x.dim() >= 2 ? x.size(-1) : 0;
    const Shape table_shape{L, Dh / 2};
    const bool ok = x.dim() >= 2 && Dh % 2 == 0 && x.is_contiguous() && out.is_contiguous() &&
                    out.shape() == x.shape() && cos.is_contiguous() && sin.is_contiguous() &&
                    cos.shape() == table_shape && sin.shape() == table_shape && cos.dtype() == sin.dtype() &&
                    statistics_dtype(cos.dtype()) == statistics_dtype(x.dtype());
    RELGRAD_CHECK(ok, "rotate_pairs: x ", shape_str(x.shape()),
                  " must be contiguous [..., L, Dh] with Dh even, and cos ", shape_str(cos.shape()), " and sin ",
                  shape_str(sin.shape()), " [L, Dh / 2] of its compute dtype");
    if (x.numel() == 0) return;
    InFloat32 f32(*this);
    do_rotate_pairs(f32.in(x), f32.in(cos), f32.in(sin), f32.out(out));
    f32.finish();
}

void Backend::attention_softmax(Tensor& scores, const Tensor& bucket_scores, const Tensor& index, const Tensor& mask,
                                double scale, Tensor& bucket_weights) {
    require_on_device("attention_softmax", {&scores, &bucket_scores, &index, &mask, &bucket_weights});
    InFloat32 f32(*this);
    do_attention_softmax(f32.out(scores, true), f32.in(bucket_scores), index, mask, scale, f32.out(bucket_weights));
    f32.finish();
}

void Backend::attention_softmax_backward(Tensor& grad, const Tensor& weights, const Tensor& d_buckets,
                                         const Tensor& index, double scale, Tensor& d_bucket_scores) {
    require_on_device("attention_softmax_backward", {&grad, &weights, &d_buckets, &index, &d_bucket_scores});
    InFloat32 f32(*this);
    do_attention_softmax_backward(f32.out(grad, true), f32.in(weights), f32.in(d_buckets), index, scale,
                                  f32.out(d_bucket_scores));
    f32.finish();
}

void Backend::fused_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionPattern& pattern,
                              double scale, const ClippedRelativeTerms& relative, Tensor& z, Tensor& lse) {
    require_on_device("fused_attention", {&q, &k, &v, &pattern.mask, &relative.table_k, &relative.table_v, &z, &lse});
    InFloat32 f32(*this);
    const bool in_16_bits = supports(OptionalKernel::fused_attention_16_bit);
    const auto operand = [&](const Tensor& t) { return in_16_bits ? t : f32.in(t); };
    const ClippedRelativeTerms relative32{f32.in(relative.table_k), f32.in(relative.table_v), relative.k_left,
                                          relative.k_right, f32.in(relative.distance_bias)};
    do_fused_attention(operand(q), operand(k), operand(v), pattern, scale, relative32, f32.out(z), f32.out(lse));
    f32.finish();
}

void Backend::fused_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& z,
                                       const Tensor& lse, const Tensor& dz, const AttentionPattern& pattern,
                                       double scale, const ClippedRelativeTerms& relative, Tensor& dq, Tensor& dk,
                                       Tensor& dv, Tensor& d_table_k, Tensor& d_table_v, Tensor& d_distance_bias) {
    require_on_device("fused_attention_backward",
                      {&q, &k, &v, &z, &lse, &dz, &pattern.mask, &relative.table_k, &relative.table_v,
                       &relative.distance_bias, &dq, &dk, &dv, &d_table_k, &d_table_v, &d_distance_bias});
    InFloat32 f32(*this);
    const bool in_16_bits = supports(OptionalKernel::fused_attention_16_bit);
    const auto operand = [&](const Tensor& t) { return in_16_bits ? t : f32.in(t); };
    const ClippedRelativeTerms relative32{f32.in(relative.table_k), f32.in(relative.table_v), relative.k_left,
                                          relative.k_right, f32.in(relative.distance_bias)};
    do_fused_attention_backward(operand(q), operand(k), operand(v), operand(z), lse, operand(dz), pattern, scale,
                                relative32, f32.out(dq), f32.out(dk), f32.out(dv), f32.out(d_table_k),
                                f32.out(d_table_v), f32.out(d_distance_bias));
    f32.finish();
}

// The optional kernels a backend leaves out: reaching one is a bug in the op that called it.
void Backend::do_fused_attention(const Tensor&, const Tensor&, const Tensor&, const AttentionPattern&, double,
                                 const ClippedRelativeTerms&, Tensor&, Tensor&) {
    throw std::logic_error(std::string("fused_attention: the ") + name() + " backend has no fused kernel");
}
void Backend::do_fused_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                          const Tensor&, const AttentionPattern&, double, const ClippedRelativeTerms&,
                                          Tensor&, Tensor&, Tensor&, Tensor&, Tensor&, Tensor&) {
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

#ifdef RELGRAD_CUDA_MODULE
namespace {

// The file this engine is linked into (the program, or a shared library such as the Python
// module), as the dynamic loader names it.
std::string engine_file() {
    Dl_info info{};
    if (!dladdr(reinterpret_cast<void*>(&backend_for), &info) || !info.dli_fname) return "";
    return info.dli_fname;
}

// The CUDA backend is a shared library of its own (librelgrad_cuda.so, CMakeLists.txt), opened the
// first time a cuda device is asked for, so that CPU work loads no CUDA library. It is looked for
// at $RELGRAD_CUDA_LIBRARY when that is set, else beside the file that holds this engine, in
// ../lib from there (an installed relgrad), and in the build that made it.
std::vector<std::filesystem::path> cuda_module_candidates() {
    if (const char* chosen = std::getenv("RELGRAD_CUDA_LIBRARY"); chosen && *chosen) return {chosen};
    std::vector<std::filesystem::path> dirs;
    if (const std::string engine = engine_file(); !engine.empty()) {
        const std::filesystem::path here = std::filesystem::absolute(engine).lexically_normal().parent_path();
        dirs.push_back(here);
        dirs.push_back(here.parent_path() / RELGRAD_INSTALL_LIBDIR);
    }
    dirs.push_back(RELGRAD_BUILD_DIR);
    for (auto& dir : dirs) dir /= RELGRAD_CUDA_MODULE;
    return dirs;
}

// The module calls into the engine of the program that opens it. A program exports the engine's
// symbols (-rdynamic); a library that holds the engine (the Python module, which Python opens
// with RTLD_LOCAL) is made global first, so that the module's references find them.
Backend& open_cuda_module() {
    const std::vector<std::filesystem::path> candidates = cuda_module_candidates();
    const auto found = std::find_if(candidates.begin(), candidates.end(), [](const std::filesystem::path& path) {
        std::error_code ignored;
        return std::filesystem::exists(path, ignored);
    });
    if (found == candidates.end()) {
        std::string tried;
        for (const auto& path : candidates) tried += (tried.empty() ? "" : ", ") + path.string();
        throw std::runtime_error(
            "no usable CUDA device: the CUDA backend " RELGRAD_CUDA_MODULE " was not found (looked for " + tried + ")");
    }
    if (const std::string engine = engine_file(); !engine.empty()) {
        dlopen(engine.c_str(), RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);  // no effect on the main program
    }
    void* module = dlopen(found->c_str(), RTLD_NOW | RTLD_LOCAL);  // never closed: the backend lives on
    if (!module) {
        throw std::runtime_error("no usable CUDA device: cannot load the CUDA backend " + found->string() + ": " +
                                 dlerror());
    }
    using Open = Backend* (*)(std::string* why_not);
    const auto open = reinterpret_cast<Open>(dlsym(module, "relgrad_open_cuda_backend"));
    if (!open) throw std::runtime_error("no usable CUDA device: " + found->string() + " is not relgrad's CUDA backend");
    std::string why_not;
    Backend* backend = open(&why_not);
    if (!backend) throw std::runtime_error(why_not);
    return *backend;
}

}  // namespace
#endif

// The backends live as long as the program (never destroyed), so that a tensor freed during
// static destruction still finds its allocator.
Backend& backend_for(Device device) {
    static CpuBackend* const cpu = new CpuBackend(Device::cpu);
    switch (device) {
        case Device::cpu: return *cpu;
        case Device::guarded_cpu: return guarded_cpu_backend();
        case Device::cuda: {
            if (Backend* installed = installed_cuda_backend()) return *installed;
#ifdef RELGRAD_CUDA_MODULE
            static Backend& cuda = open_cuda_module();  // tried again on the next call if it threw
            return cuda;
#else
            throw std::runtime_error(
                "no usable CUDA device: this relgrad is built without its CUDA backend (RELGRAD_CUDA=OFF, or AUTO "
                "where no nvcc was found)");
#endif
        }
    }
    throw std::invalid_argument(std::string("no backend is built for the ") + device_name(device) +
                                " device in this build");
}

}  // namespace relgrad
