#include "engine/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "engine/autograd.hpp"
#include "engine/backend/backend.hpp"
#include "engine/errors.hpp"
#include "engine/system.hpp"

namespace relgrad {

// ---------------------------------------------------------------- dtypes and shapes

std::size_t dtype_size(DType dtype) {
    switch (dtype) {
        case DType::float32: return 4;
        case DType::float64: return 8;
        case DType::int64: return 8;
        case DType::boolean: return 1;
        case DType::bfloat16: return 2;
        case DType::float16: return 2;
    }
    throw std::logic_error("unknown dtype");
}

const char* dtype_name(DType dtype) { return name_of(dtype_names, dtype); }

bool is_floating(DType dtype) { return dtype == DType::float32 || dtype == DType::float64 || is_16_bit(dtype); }
bool is_16_bit(DType dtype) { return dtype == DType::bfloat16 || dtype == DType::float16; }
DType statistics_dtype(DType dtype) { return is_16_bit(dtype) ? DType::float32 : dtype; }

std::string shape_str(const Shape& shape) {
    std::ostringstream out;
    out << "[";
    for (std::size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
    out << "]";
    return out.str();
}

int64_t shape_numel(const Shape& shape) {
    constexpr int64_t kMaxElements = int64_t{1} << 56;  // so that a byte count cannot overflow either
    int64_t count = 1;
    for (int64_t s : shape) {
        RELGRAD_CHECK(s >= 0, "shape ", shape_str(shape), " has a negative size");
        RELGRAD_CHECK(s == 0 || count <= kMaxElements / s, "shape ", shape_str(shape), " has too many elements");
        count *= s;
    }
    return count;
}

// A size-0 dim makes the tensor empty but not its strides small: (0, 2^32, 2^32, 2) has no element
// and a stride of 2^65, which is refused before it overflows.
Shape contiguous_strides(const Shape& shape) {
    Shape strides(shape.size());
    int64_t stride = 1;
    for (std::size_t i = shape.size(); i-- > 0;) {
        strides[i] = stride;
        if (i == 0) break;  // the stride past the first dim is never used
        const int64_t size = std::max<int64_t>(shape[i], 1);
        RELGRAD_CHECK(stride <= std::numeric_limits<int64_t>::max() / size, "shape ", shape_str(shape),
                      " is too large: its strides overflow int64");
        stride *= size;
    }
    return strides;
}

int64_t wrap_dim(int64_t dim, int64_t rank, const char* op) {
    const int64_t wrapped = dim < 0 ? dim + rank : dim;
    RELGRAD_CHECK(wrapped >= 0 && wrapped < rank, op, ": dim ", dim, " is out of range for a tensor of rank ", rank);
    return wrapped;
}

// ---------------------------------------------------------------- metadata

const TensorImpl& Tensor::checked() const {
    if (!impl_) throw std::logic_error("use of an undefined Tensor");
    return *impl_;
}

const Shape& Tensor::shape() const { return checked().shape; }
const Shape& Tensor::strides() const { return checked().strides; }
int64_t Tensor::offset() const { return checked().offset; }
int64_t Tensor::dim() const { return static_cast<int64_t>(shape().size()); }
int64_t Tensor::size(int64_t d) const { return shape()[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::numel() const { return shape_numel(shape()); }
DType Tensor::dtype() const { return checked().dtype; }
Device Tensor::device() const { return checked().storage->device(); }
const std::shared_ptr<Storage>& Tensor::storage() const { return checked().storage; }

bool Tensor::is_contiguous() const {
    const auto& impl = checked();
    if (numel() == 0) return true;  // nothing to lay out
    int64_t expected = 1;
    for (std::size_t i = impl.shape.size(); i-- > 0;) {
        if (impl.shape[i] != 1 && impl.strides[i] != expected) return false;
        expected *= impl.shape[i];
    }
    return true;
}

// The dtype whose elements are T.
template <class T>
static constexpr DType dtype_of() {
    if constexpr (std::is_same_v<T, float>) {
        return DType::float32;
    } else if constexpr (std::is_same_v<T, double>) {
        return DType::float64;
    } else if constexpr (std::is_same_v<T, int64_t>) {
        return DType::int64;
    } else {
        static_assert(std::is_same_v<T, bool>, "tensors hold float, double, int64_t or bool");
        return DType::boolean;
    }
}

template <class T>
T* Tensor::data() const {
    const auto& impl = checked();
    if (impl.dtype != dtype_of<T>()) {
        throw std::logic_error(std::string("data<T>: the tensor holds ") + dtype_name(impl.dtype) + ", not " +
                               dtype_name(dtype_of<T>()));
    }
    if (!host_can_read(impl.storage->device())) {
        throw std::logic_error(std::string("data<T>: the tensor is on the ") + device_name(impl.storage->device()) +
                               " device, which the host cannot read; copy it with to(Device::cpu) first");
    }
    return static_cast<T*>(impl.storage->data()) + impl.offset;
}
template float* Tensor::data<float>() const;
template double* Tensor::data<double>() const;
template int64_t* Tensor::data<int64_t>() const;
template bool* Tensor::data<bool>() const;

// ---------------------------------------------------------------- autograd entry points

bool Tensor::requires_grad() const { return checked().requires_grad; }

Tensor& Tensor::requires_grad_(bool value) {
    RELGRAD_CHECK(is_leaf(), "requires_grad_: only a leaf tensor's flag can be set; use detach() to make a leaf");
    RELGRAD_CHECK(!value || is_floating(dtype()), "requires_grad_: a ", dtype_name(dtype()),
                  " tensor cannot require a gradient");
    impl_->requires_grad = value;
    return *this;
}

bool Tensor::is_leaf() const { return checked().grad_fn == nullptr; }
const std::shared_ptr<Node>& Tensor::grad_fn() const { return checked().grad_fn; }
Tensor Tensor::grad() const { return checked().grad; }
void Tensor::zero_grad() {
    checked();
    impl_->grad = Tensor();
}
void Tensor::retain_grad() {
    checked();
    impl_->retains_grad = true;
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const { run_backward(*this, gradient, retain_graph); }

Tensor Tensor::detach() const {
    const auto& impl = checked();
    auto out = std::make_shared<TensorImpl>();
    out->storage = impl.storage;
    out->shape = impl.shape;
    out->strides = impl.strides;
    out->offset = impl.offset;
    out->dtype = impl.dtype;
    return Tensor(out);
}

// ---------------------------------------------------------------- factories

namespace {

// "cannot allocate 4.0 TiB on the cpu for a [1099511627776] float32 tensor"
OutOfMemory out_of_memory(std::size_t nbytes, Device device, const Shape& shape, DType dtype) {
    return OutOfMemory("cannot allocate " + readable_bytes(static_cast<double>(nbytes)) + " on the " +
                       device_name(device) + " for a " + shape_str(shape) + " " + dtype_name(dtype) + " tensor");
}

}  // namespace

std::vector<double> host_values(const Shape& shape, DType dtype) {
    const int64_t count = shape_numel(shape);  // rejects negative sizes
    try {
        return std::vector<double>(static_cast<std::size_t>(count));
    } catch (const std::bad_alloc&) {
        throw out_of_memory(static_cast<std::size_t>(count) * sizeof(double), Device::cpu, shape, dtype);
    }
}

Tensor empty(const Shape& shape, DType dtype, Device device) {
    // shape_numel rejects sizes < 0, and more than 2^56 elements: the byte count cannot overflow
    const auto nbytes = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
    auto impl = std::make_shared<TensorImpl>();
    try {
        impl->storage = std::make_shared<Storage>(nbytes, device);
    } catch (const std::bad_alloc&) {
        throw out_of_memory(nbytes, device, shape, dtype);
    }
    impl->shape = shape;
    impl->strides = contiguous_strides(shape);
    impl->dtype = dtype;
    return Tensor(impl);
}

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
    Tensor out = empty(shape, dtype, device);
    backend_for(device).fill(out, value);
    return out;
}

Tensor zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0, dtype, device); }
Tensor ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }
Tensor scalar(double value, DType dtype, Device device) { return full({}, value, dtype, device); }
Tensor empty_like(const Tensor& t) { return empty(t.shape(), t.dtype(), t.device()); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype(), t.device()); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), t.dtype(), t.device()); }
Tensor scalar_like(const Tensor& t, double value) { return scalar(value, t.dtype(), t.device()); }

Tensor from_vector(const std::vector<double>& values, const Shape& shape, DType dtype, Device device) {
    RELGRAD_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
                  " values given for shape ", shape_str(shape), " (", shape_numel(shape), " elements)");
    if (dtype == DType::int64) {
        // a float without an int64 value (NaN, +-inf, beyond +-2^63) is an error, not undefined behaviour
        for (double v : values) {
            RELGRAD_CHECK(v > -9.2e18 && v < 9.2e18, "from_vector: ", std::to_string(v), " has no int64 value");
        }
    }
    Tensor source = empty(shape, DType::float64);
    std::copy(values.begin(), values.end(), source.data<double>());
    return source.to(dtype).to(device);
}

Tensor arange(int64_t n, DType dtype, Device device) {
    RELGRAD_CHECK(n >= 0, "arange: negative length ", n);
    std::vector<double> values(n);
    std::iota(values.begin(), values.end(), 0.0);
    return from_vector(values, {n}, dtype, device);
}

Tensor randn(const Shape& shape, Generator& gen, DType dtype, Device device) {
    std::vector<double> values = host_values(shape, dtype);
    for (double& v : values) v = gen.next_normal();
    return from_vector(values, shape, dtype, device);
}

Tensor rand(const Shape& shape, Generator& gen, DType dtype, Device device) {
    std::vector<double> values = host_values(shape, dtype);
    for (double& v : values) v = gen.next_uniform();
    return from_vector(values, shape, dtype, device);
}

}  // namespace relgrad
