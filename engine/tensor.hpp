// relgrad: the Tensor.
//
// A Tensor is a handle (a shared pointer) to a TensorImpl, which is a strided view into a Storage:
//
//     element [i0, i1, ..., in] lives at  storage + offset + i0*strides[0] + ... + in*strides[n]
//
// (offset and strides count elements, not bytes). Views such as transpose, narrow or expand make a
// new TensorImpl over the same Storage with other shape/strides/offset; nothing is copied.
//
// Each TensorImpl also carries the autograd metadata: requires_grad, the Node that produced it
// (grad_fn, empty for leaves) and, for leaves, the accumulated gradient. See autograd.hpp.
//
// Dimension legend used across relgrad: B batch, L length, D model width, H heads, Dh head width,
// K = k_left + k_right + 1 relative buckets (2k + 1 for one clipping distance k). In the engine,
// M x K times K x N is the matmul convention.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/random.hpp"
#include "engine/storage.hpp"

namespace relgrad {

// Element types. float32 is the working type, float64 is for gradient checks; bfloat16 and
// float16 store values in 16 bits (engine/half.hpp) that every kernel computes with in float32;
// int64 holds indices (gather, embedding, targets) and boolean holds masks.
enum class DType { float32, float64, int64, boolean, bfloat16, float16 };
inline constexpr EnumName<DType> dtype_names[] = {
    {DType::float32, "float32"}, {DType::float64, "float64"}, {DType::bfloat16, "bfloat16"},
    {DType::float16, "float16"}, {DType::int64, "int64"},     {DType::boolean, "bool"}};
// the dtypes a layer computes in (a layer spec's and a module's dtype)
inline constexpr EnumName<DType> floating_dtype_names[] = {
    entry_of(dtype_names, DType::float32), entry_of(dtype_names, DType::float64),
    entry_of(dtype_names, DType::bfloat16), entry_of(dtype_names, DType::float16)};

std::size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
bool is_floating(DType dtype);  // float32, float64, bfloat16, float16
bool is_16_bit(DType dtype);    // bfloat16, float16
// what an op that forms a statistic (a mean, a normaliser) computes in: float32 for the 16-bit types
DType statistics_dtype(DType dtype);

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& shape);  // "[2, 3]"
int64_t shape_numel(const Shape& shape);
Shape contiguous_strides(const Shape& shape);  // row-major (C order) strides

struct Node;
struct TensorImpl;

class Tensor {
public:
    Tensor() = default;  // an undefined tensor (no storage); used for "no gradient"
    explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

    bool defined() const { return impl_ != nullptr; }

    // --- metadata
    const Shape& shape() const;
    const Shape& strides() const;
    int64_t offset() const;
    int64_t dim() const;
    int64_t size(int64_t d) const;  // negative d counts from the end
    int64_t numel() const;
    DType dtype() const;
    Device device() const;
    bool is_contiguous() const;
    const std::shared_ptr<Storage>& storage() const;

    // Pointer to element [0, ..., 0] in host memory. T must match dtype(), and the tensor must be
    // on the CPU (both checked): copy a tensor of another device with to(Device::cpu) first.
    template <class T>
    T* data() const;

    // --- autograd
    bool requires_grad() const;
    Tensor& requires_grad_(bool value = true);  // only on leaves
    bool is_leaf() const;
    const std::shared_ptr<Node>& grad_fn() const;
    Tensor grad() const;  // undefined until a backward pass reaches this tensor
    void zero_grad();     // forget the accumulated gradient
    void retain_grad();   // keep the gradient of a non-leaf too
    // Reverse-mode pass from this tensor. A non-scalar needs an explicit gradient of its shape.
    // The graph is freed afterwards unless retain_graph is true.
    void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
    Tensor detach() const;  // same storage, no history

    // --- values
    double item() const;                    // the single element, as double
    std::vector<double> to_vector() const;  // all elements in C order, as double
    Tensor to(DType dtype) const;           // a converted copy (or *this when dtype matches)
    Tensor to(Device device) const;         // a copy on `device` (or *this when already there)
    // Copies src's values into this tensor's elements in place (shapes must match; the dtype is
    // converted and src may be on any device). Not recorded by autograd: refused on a tensor that
    // requires a gradient while recording is on.
    Tensor& copy_(const Tensor& src);
    Tensor contiguous() const;  // *this if already contiguous, else a packed copy
    Tensor clone() const;       // always a packed copy, no history

    // --- views (no copy; differentiable). Negative dims count from the end.
    Tensor view(const Shape& shape) const;     // needs a contiguous tensor; one dim may be -1
    Tensor reshape(const Shape& shape) const;  // view when possible, else copy
    Tensor transpose(int64_t d0, int64_t d1) const;
    Tensor permute(const std::vector<int64_t>& dims) const;
    Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
    Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
    Tensor expand(const Shape& shape) const;  // broadcast size-1 dims (stride 0)
    Tensor unsqueeze(int64_t dim) const;
    Tensor squeeze(int64_t dim) const;

    TensorImpl* impl() const { return impl_.get(); }
    const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

private:
    const TensorImpl& checked() const;
    std::shared_ptr<TensorImpl> impl_;
};

struct TensorImpl {
    std::shared_ptr<Storage> storage;
    Shape shape;
    Shape strides;
    int64_t offset = 0;
    DType dtype = DType::float32;

    bool requires_grad = false;
    bool retains_grad = false;
    std::shared_ptr<Node> grad_fn;  // the op that produced this tensor; null for leaves
    Tensor grad;                    // accumulated gradient (leaves, or retain_grad())
};

// --- factories (contiguous; on the CPU unless a device is given). *_like keep t's dtype and device.
Tensor empty(const Shape& shape, DType dtype = DType::float32, Device device = Device::cpu);
Tensor zeros(const Shape& shape, DType dtype = DType::float32, Device device = Device::cpu);
Tensor ones(const Shape& shape, DType dtype = DType::float32, Device device = Device::cpu);
Tensor full(const Shape& shape, double value, DType dtype = DType::float32, Device device = Device::cpu);
Tensor scalar(double value, DType dtype = DType::float32, Device device = Device::cpu);  // a 0-d tensor
// values (C order) made on the host and copied to `device`
Tensor from_vector(const std::vector<double>& values, const Shape& shape, DType dtype = DType::float32,
                   Device device = Device::cpu);
Tensor arange(int64_t n, DType dtype = DType::float32, Device device = Device::cpu);  // 0, 1, ..., n-1
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor scalar_like(const Tensor& t, double value);  // a 0-d tensor

// Room for the values of a `shape` tensor of `dtype` made on the host, a double each (random draws,
// initial weights, for from_vector); a shape too large for memory is named as empty() names it
// (OutOfMemory, engine/storage.hpp).
std::vector<double> host_values(const Shape& shape, DType dtype);

// Random tensors from a Generator (engine/random.hpp): value i from the generator's next block,
// so the same seed gives the same tensors on every machine.
Tensor randn(const Shape& shape, Generator& gen, DType dtype = DType::float32, Device device = Device::cpu);
Tensor rand(const Shape& shape, Generator& gen, DType dtype = DType::float32,
            Device device = Device::cpu);  // U[0, 1)

// Resolve a possibly negative dim against a rank; throws naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t rank, const char* op);

}  // namespace relgrad
