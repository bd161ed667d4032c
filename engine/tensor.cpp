#include "engine/tensor.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "engine/autograd.hpp"
#include "engine/backend/backend.hpp"
#include "engine/ops.hpp"

namespace relgrad {

// ---------------------------------------------------------------- dtypes and shapes

std::size_t dtype_size(DType dtype) {
    switch (dtype) {
        case DType::float32: return 4;
        case DType::float64: return 8;
        case DType::int64: return 8;
        case DType::boolean: return 1;
    }
    throw std::logic_error("unknown dtype");
}

const char* dtype_name(DType dtype) {
    switch (dtype) {
        case DType::float32: return "float32";
        case DType::float64: return "float64";
        case DType::int64: return "int64";
        case DType::boolean: return "bool";
    }
    throw std::logic_error("unknown dtype");
}

bool is_floating(DType dtype) { return dtype == DType::float32 || dtype == DType::float64; }

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
        if (s < 0) throw std::invalid_argument("shape " + shape_str(shape) + " has a negative size");
        if (s != 0 && count > kMaxElements / s) {
            throw std::invalid_argument("shape " + shape_str(shape) + " has too many elements");
        }
        count *= s;
    }
    return count;
}

Shape contiguous_strides(const Shape& shape) {
    Shape strides(shape.size());
    int64_t stride = 1;
    for (std::size_t i = shape.size(); i-- > 0;) {
        strides[i] = stride;
        stride *= std::max<int64_t>(shape[i], 1);
    }
    return strides;
}

int64_t wrap_dim(int64_t dim, int64_t rank, const char* op) {
    const int64_t wrapped = dim < 0 ? dim + rank : dim;
    if (wrapped < 0 || wrapped >= rank) {
        throw std::invalid_argument(std::string(op) + ": dim " + std::to_string(dim) +
                                    " is out of range for a tensor of rank " + std::to_string(rank));
    }
    return wrapped;
}

// ---------------------------------------------------------------- storage

// Big buffers are recycled: a training step frees and asks for the same sizes again, and a fresh
// buffer from the system costs a page fault per 4 KiB on first touch. Blocks of 1 MiB or more go
// to a small cache when freed (at most kCacheBytes in all, oldest dropped first) and are handed
// out again for the same rounded size.
namespace {

constexpr std::size_t kCachedFrom = std::size_t{1} << 20;
constexpr std::size_t kCacheBytes = std::size_t{1} << 30;

std::atomic<int64_t> live_bytes{0}, peak_live_bytes{0};

void count_allocation(int64_t bytes) {
    const int64_t now = live_bytes.fetch_add(bytes) + bytes;
    int64_t peak = peak_live_bytes.load();
    while (now > peak && !peak_live_bytes.compare_exchange_weak(peak, now)) {
    }
}

class BlockCache {
public:
    std::size_t cached() {
        std::lock_guard<std::mutex> lock(mutex_);
        return cached_;
    }
    void* take(std::size_t bytes) {
        std::lock_guard<std::mutex> lock(mutex_);
        for (auto it = blocks_.begin(); it != blocks_.end(); ++it) {
            if (it->first == bytes) {
                void* block = it->second;
                blocks_.erase(it);
                cached_ -= bytes;
                return block;
            }
        }
        return nullptr;
    }
    void give(void* block, std::size_t bytes) {
        std::lock_guard<std::mutex> lock(mutex_);
        blocks_.emplace_back(bytes, block);
        cached_ += bytes;
        while (cached_ > kCacheBytes) {
            std::free(blocks_.front().second);
            cached_ -= blocks_.front().first;
            blocks_.pop_front();
        }
    }
    ~BlockCache() {
        for (auto& block : blocks_) std::free(block.second);
    }

private:
    std::mutex mutex_;
    std::deque<std::pair<std::size_t, void*>> blocks_;
    std::size_t cached_ = 0;
};

BlockCache& block_cache() {
    static BlockCache cache;
    return cache;
}

std::size_t rounded_size(std::size_t nbytes) {
    const std::size_t unit = nbytes >= kCachedFrom ? 4096 : 64;
    return (std::max<std::size_t>(nbytes, 1) + unit - 1) / unit * unit;
}

}  // namespace

Storage::Storage(std::size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
    if (device != Device::cpu) throw std::invalid_argument("Storage: only the cpu device is built");
    const std::size_t bytes = rounded_size(nbytes);
    if (bytes >= kCachedFrom) data_ = block_cache().take(bytes);
    if (!data_) data_ = std::aligned_alloc(64, bytes);
    if (!data_) throw std::bad_alloc();
    count_allocation(static_cast<int64_t>(bytes));
}

Storage::~Storage() {
    const std::size_t bytes = rounded_size(nbytes_);
    live_bytes -= static_cast<int64_t>(bytes);
    if (bytes >= kCachedFrom) {
        block_cache().give(data_, bytes);
    } else {
        std::free(data_);
    }
}

MemoryStats memory_stats() {
    return {live_bytes.load(), peak_live_bytes.load(), static_cast<int64_t>(block_cache().cached())};
}

void reset_peak_memory() { peak_live_bytes = live_bytes.load(); }

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

template <class T>
static constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
    return DType::float32;
}
template <>
constexpr DType dtype_of<double>() {
    return DType::float64;
}
template <>
constexpr DType dtype_of<int64_t>() {
    return DType::int64;
}
template <>
constexpr DType dtype_of<bool>() {
    return DType::boolean;
}

template <class T>
T* Tensor::data() const {
    const auto& impl = checked();
    if (impl.dtype != dtype_of<T>()) {
        throw std::logic_error(std::string("data<T>: the tensor holds ") + dtype_name(impl.dtype) + ", not " +
                               dtype_name(dtype_of<T>()));
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
    if (!is_leaf()) {
        throw std::invalid_argument(
            "requires_grad_: only a leaf tensor's flag can be set; use "
            "detach() to make a leaf");
    }
    if (value && !is_floating(dtype())) {
        throw std::invalid_argument(std::string("requires_grad_: a ") + dtype_name(dtype()) +
                                    " tensor cannot require a gradient");
    }
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

// ---------------------------------------------------------------- values

double Tensor::item() const {
    if (numel() != 1) {
        throw std::invalid_argument("item: the tensor has " + std::to_string(numel()) + " elements (shape " +
                                    shape_str(shape()) + "), expected 1");
    }
    return to_vector()[0];
}

std::vector<double> Tensor::to_vector() const {
    Tensor packed = empty(shape(), DType::float64);
    backend_for(device()).copy(*this, packed);
    const double* p = packed.data<double>();
    return std::vector<double>(p, p + packed.numel());
}

// A float that has no int64 value (NaN, +-inf, beyond +-2^63) is an error, not undefined behaviour.
static void check_representable_as_int64(const std::vector<double>& values, const char* op) {
    for (double v : values) {
        if (!(v > -9.2e18 && v < 9.2e18)) {
            throw std::invalid_argument(std::string(op) + ": " + std::to_string(v) + " has no int64 value");
        }
    }
}

Tensor Tensor::to(DType target) const {
    if (target == dtype()) return *this;
    if (target == DType::int64 && is_floating(dtype())) check_representable_as_int64(to_vector(), "to(int64)");
    Tensor out = empty(shape(), target);
    backend_for(device()).copy(*this, out);
    const DType source = dtype();
    // d(to)/dx = identity, converted back to the source dtype
    return record(out, "to", {*this}, [source](const Tensor& g) { return std::vector<Tensor>{g.to(source)}; });
}

Tensor Tensor::clone() const {
    Tensor out = empty(shape(), dtype());
    backend_for(device()).copy(*this, out);
    return record(out, "clone", {*this}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

// ---------------------------------------------------------------- views

// A new TensorImpl over the same storage.
static Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = base.storage();
    impl->shape = std::move(shape);
    impl->strides = std::move(strides);
    impl->offset = offset;
    impl->dtype = base.dtype();
    return Tensor(impl);
}

Tensor Tensor::view(const Shape& requested) const {
    if (!is_contiguous()) {
        throw std::invalid_argument("view: the tensor of shape " + shape_str(shape()) +
                                    " is not contiguous; use reshape()");
    }
    Shape target = requested;
    int64_t inferred = -1;
    for (std::size_t i = 0; i < target.size(); ++i) {
        if (target[i] != -1) continue;
        if (inferred >= 0) throw std::invalid_argument("view: more than one -1 in " + shape_str(requested));
        inferred = static_cast<int64_t>(i);
        target[i] = 1;
    }
    const int64_t known = shape_numel(target);  // throws on a negative size or an overflow
    const bool fits = inferred >= 0 ? known > 0 && numel() % known == 0 : known == numel();
    if (!fits) {
        throw std::invalid_argument("view: cannot view a tensor of shape " + shape_str(shape()) + " (" +
                                    std::to_string(numel()) + " elements) as " + shape_str(requested));
    }
    if (inferred >= 0) target[inferred] = numel() / known;
    Tensor out = make_view(*this, target, contiguous_strides(target), offset());
    const Shape input_shape = shape();
    // d(view)/dx: the gradient viewed back to the input's shape
    return record(out, "view", {*this},
                  [input_shape](const Tensor& g) { return std::vector<Tensor>{g.reshape(input_shape)}; });
}

Tensor Tensor::reshape(const Shape& shape) const { return contiguous().view(shape); }

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
    const int64_t rank = dim();
    if (static_cast<int64_t>(dims.size()) != rank) {
        throw std::invalid_argument("permute: " + std::to_string(dims.size()) + " dims given for a tensor of shape " +
                                    shape_str(shape()));
    }
    Shape new_shape(rank), new_strides(rank);
    std::vector<int64_t> inverse(rank, -1);
    for (int64_t i = 0; i < rank; ++i) {
        const int64_t d = wrap_dim(dims[i], rank, "permute");
        if (inverse[d] != -1) throw std::invalid_argument("permute: dim " + std::to_string(d) + " repeated");
        inverse[d] = i;
        new_shape[i] = shape()[d];
        new_strides[i] = strides()[d];
    }
    Tensor out = make_view(*this, new_shape, new_strides, offset());
    // d(permute)/dx: permute the gradient back with the inverse permutation
    return record(out, "permute", {*this},
                  [inverse](const Tensor& g) { return std::vector<Tensor>{g.permute(inverse)}; });
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
    std::vector<int64_t> dims(dim());
    std::iota(dims.begin(), dims.end(), 0);
    std::swap(dims[wrap_dim(d0, dim(), "transpose")], dims[wrap_dim(d1, dim(), "transpose")]);
    return permute(dims);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
    d = wrap_dim(d, dim(), "slice");
    const int64_t n = shape()[d];
    if (step <= 0) throw std::invalid_argument("slice: step must be positive, got " + std::to_string(step));
    if (start < 0) start += n;
    if (end < 0) end += n;
    if (start < 0 || end > n || start > end) {
        throw std::invalid_argument("slice: range [" + std::to_string(start) + ", " + std::to_string(end) +
                                    ") is outside dim " + std::to_string(d) + " of a tensor of shape " +
                                    shape_str(shape()));
    }
    Shape new_shape = shape(), new_strides = strides();
    new_shape[d] = end == start ? 0 : (end - start - 1) / step + 1;
    new_strides[d] = new_shape[d] > 1 ? strides()[d] * step : strides()[d];
    Tensor out = make_view(*this, new_shape, new_strides, offset() + start * strides()[d]);
    const Shape input_shape = shape();
    // d(slice)/dx: the gradient placed into the sliced positions of a zero tensor
    return record(out, "slice", {*this}, [input_shape, d, start, end, step](const Tensor& g) {
        Tensor grad_input = zeros(input_shape, g.dtype());
        Tensor window = grad_input.slice(d, start, end, step);
        backend_for(g.device()).copy(g, window);
        return std::vector<Tensor>{grad_input};
    });
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
    if (length < 0 || start < 0 || length > size(d) - start) {
        throw std::invalid_argument("narrow: start " + std::to_string(start) + " and length " + std::to_string(length) +
                                    " do not fit dim " + std::to_string(d) + " of shape " + shape_str(shape()));
    }
    return slice(d, start, start + length, 1);
}

Tensor Tensor::expand(const Shape& target) const {
    const int64_t rank = dim();
    const int64_t new_rank = static_cast<int64_t>(target.size());
    auto fail = [&] {
        return std::invalid_argument("expand: cannot expand shape " + shape_str(shape()) + " to " + shape_str(target));
    };
    if (new_rank < rank) throw fail();
    Shape new_shape = target, new_strides(new_rank, 0);
    for (int64_t i = 0; i < new_rank; ++i) {
        const int64_t j = i - (new_rank - rank);                   // the matching input dim, if any
        if (j >= 0 && target[i] == -1) new_shape[i] = shape()[j];  // -1 keeps the size
        if (new_shape[i] < 0) throw fail();
        if (j < 0) continue;  // a new leading dim: stride 0
        if (shape()[j] == new_shape[i]) {
            new_strides[i] = strides()[j];
        } else if (shape()[j] != 1) {
            throw fail();
        }
    }
    shape_numel(new_shape);  // rejects a size overflow
    Tensor out = make_view(*this, new_shape, new_strides, offset());
    const Shape input_shape = shape();
    // d(expand)/dx: sum the gradient over the broadcast dims
    return record(out, "expand", {*this},
                  [input_shape](const Tensor& g) { return std::vector<Tensor>{sum_to(g, input_shape)}; });
}

Tensor Tensor::unsqueeze(int64_t d) const {
    d = wrap_dim(d, dim() + 1, "unsqueeze");
    Shape s = shape();
    s.insert(s.begin() + d, 1);
    return reshape(s);
}

Tensor Tensor::squeeze(int64_t d) const {
    d = wrap_dim(d, dim(), "squeeze");
    if (shape()[d] != 1) {
        throw std::invalid_argument("squeeze: dim " + std::to_string(d) + " of shape " + shape_str(shape()) +
                                    " has size " + std::to_string(shape()[d]) + ", not 1");
    }
    Shape s = shape();
    s.erase(s.begin() + d);
    return reshape(s);
}

// ---------------------------------------------------------------- factories

Tensor empty(const Shape& shape, DType dtype) {
    for (int64_t s : shape) {
        if (s < 0) throw std::invalid_argument("empty: negative size in shape " + shape_str(shape));
    }
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = std::make_shared<Storage>(shape_numel(shape) * dtype_size(dtype), Device::cpu);
    impl->shape = shape;
    impl->strides = contiguous_strides(shape);
    impl->dtype = dtype;
    return Tensor(impl);
}

Tensor full(const Shape& shape, double value, DType dtype) {
    Tensor out = empty(shape, dtype);
    cpu_backend().fill(out, value);
    return out;
}

Tensor zeros(const Shape& shape, DType dtype) { return full(shape, 0.0, dtype); }
Tensor ones(const Shape& shape, DType dtype) { return full(shape, 1.0, dtype); }
Tensor scalar(double value, DType dtype) { return full({}, value, dtype); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype()); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), t.dtype()); }

Tensor from_vector(const std::vector<double>& values, const Shape& shape, DType dtype) {
    if (static_cast<int64_t>(values.size()) != shape_numel(shape)) {
        throw std::invalid_argument("from_vector: " + std::to_string(values.size()) + " values given for shape " +
                                    shape_str(shape) + " (" + std::to_string(shape_numel(shape)) + " elements)");
    }
    if (dtype == DType::int64) check_representable_as_int64(values, "from_vector");
    Tensor source = empty(shape, DType::float64);
    std::copy(values.begin(), values.end(), source.data<double>());
    return source.to(dtype);
}

Tensor arange(int64_t n, DType dtype) {
    if (n < 0) throw std::invalid_argument("arange: negative length " + std::to_string(n));
    std::vector<double> values(n);
    std::iota(values.begin(), values.end(), 0.0);
    return from_vector(values, {n}, dtype);
}

uint64_t Generator::next_u64() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

double Generator::next_uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

double Generator::next_normal() {
    const double u1 = 1.0 - next_uniform();  // in (0, 1]: log(u1) is finite
    const double u2 = next_uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

Tensor randn(const Shape& shape, Generator& gen, DType dtype) {
    std::vector<double> values(shape_numel(shape));  // shape_numel rejects negative sizes
    for (double& v : values) v = gen.next_normal();
    return from_vector(values, shape, dtype);
}

Tensor rand(const Shape& shape, Generator& gen, DType dtype) {
    std::vector<double> values(shape_numel(shape));
    for (double& v : values) v = gen.next_uniform();
    return from_vector(values, shape, dtype);
}

}  // namespace relgrad
