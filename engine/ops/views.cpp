// Views and copies of a tensor, each with its backward. A view is a new TensorImpl over the same
// storage with other shape, strides and offset (nothing is copied); its backward maps the gradient
// back to the input's shape: a view back, an inverse permutation, a sum over broadcast dims, or a
// zero tensor with the gradient placed in the sliced positions. Copies (to, clone, contiguous)
// pass the gradient through, converted back to the source's dtype or device.
#include <numeric>

#include "engine/autograd.hpp"
#include "engine/backend/backend.hpp"
#include "engine/errors.hpp"
#include "engine/ops.hpp"
#include "engine/profile.hpp"

namespace relgrad {

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
    RELGRAD_CHECK(is_contiguous(), "view: the tensor of shape ", shape_str(shape()),
                  " is not contiguous; use reshape()");
    Shape target = requested;
    int64_t inferred = -1;
    for (std::size_t i = 0; i < target.size(); ++i) {
        if (target[i] != -1) continue;
        RELGRAD_CHECK(inferred < 0, "view: more than one -1 in ", shape_str(requested));
        inferred = static_cast<int64_t>(i);
        target[i] = 1;
    }
    const int64_t known = shape_numel(target);  // throws on a negative size or an overflow
    const bool fits = inferred >= 0 ? known > 0 && numel() % known == 0 : known == numel();
    RELGRAD_CHECK(fits, "view: cannot view a tensor of shape ", shape_str(shape()), " (", numel(), " elements) as ",
                  shape_str(requested));
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
    RELGRAD_CHECK(static_cast<int64_t>(dims.size()) == rank, "permute: ", dims.size(),
                  " dims given for a tensor of shape ", shape_str(shape()));
    Shape new_shape(rank), new_strides(rank);
    std::vector<int64_t> inverse(rank, -1);
    for (int64_t i = 0; i < rank; ++i) {
        const int64_t d = wrap_dim(dims[i], rank, "permute");
        RELGRAD_CHECK(inverse[d] == -1, "permute: dim ", d, " repeated");
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
    RELGRAD_CHECK(step > 0, "slice: step must be positive, got ", step);
    if (start < 0) start += n;
    if (end < 0) end += n;
    RELGRAD_CHECK(start >= 0 && end <= n && start <= end, "slice: range [", start, ", ", end, ") is outside dim ", d,
                  " of a tensor of shape ", shape_str(shape()));
    Shape new_shape = shape(), new_strides = strides();
    new_shape[d] = end == start ? 0 : (end - start - 1) / step + 1;
    new_strides[d] = new_shape[d] > 1 ? strides()[d] * step : strides()[d];
    Tensor out = make_view(*this, new_shape, new_strides, offset() + start * strides()[d]);
    const Shape input_shape = shape();
    // d(slice)/dx: the gradient placed into the sliced positions of a zero tensor
    return record(out, "slice", {*this}, [input_shape, d, start, end, step](const Tensor& g) {
        Tensor grad_input = zeros(input_shape, g.dtype(), g.device());
        Tensor window = grad_input.slice(d, start, end, step);
        backend_for(g.device()).copy(g, window);
        return std::vector<Tensor>{grad_input};
    });
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
    RELGRAD_CHECK(length >= 0 && start >= 0 && length <= size(d) - start, "narrow: start ", start, " and length ",
                  length, " do not fit dim ", d, " of shape ", shape_str(shape()));
    return slice(d, start, start + length, 1);
}

Tensor Tensor::expand(const Shape& target) const {
    const int64_t rank = dim();
    const int64_t new_rank = static_cast<int64_t>(target.size());
    auto check = [&](bool expandable) {
        RELGRAD_CHECK(expandable, "expand: cannot expand shape ", shape_str(shape()), " to ", shape_str(target));
    };
    check(new_rank >= rank);
    Shape new_shape = target, new_strides(new_rank, 0);
    for (int64_t i = 0; i < new_rank; ++i) {
        const int64_t j = i - (new_rank - rank);                   // the matching input dim, if any
        if (j >= 0 && target[i] == -1) new_shape[i] = shape()[j];  // -1 keeps the size
        check(new_shape[i] >= 0);
        if (j < 0) continue;  // a new leading dim: stride 0
        if (shape()[j] == new_shape[i]) {
            new_strides[i] = strides()[j];
        } else {
            check(shape()[j] == 1);
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
    RELGRAD_CHECK(shape()[d] == 1, "squeeze: dim ", d, " of shape ", shape_str(shape()), " has size ", shape()[d],
                  ", not 1");
    Shape s = shape();
    s.erase(s.begin() + d);
    return reshape(s);
}

// ---------------------------------------------------------------- values

double Tensor::item() const {
    RELGRAD_CHECK(numel() == 1, "item: the tensor has ", numel(), " elements (shape ", shape_str(shape()),
                  "), expected 1");
    return to_vector()[0];
}

// Packed as float64 on the tensor's own device, then one copy of the bytes to the host.
std::vector<double> Tensor::to_vector() const {
    Tensor packed = empty(shape(), DType::float64, device());
    backend_for(device()).copy(*this, packed);
    std::vector<double> values(packed.numel());
    backend_for(device()).copy_to_host(packed.storage()->data(), values.data(), values.size() * sizeof(double));
    return values;
}

// The copy kernel rejects a float without an int64 value (NaN, +-inf, beyond +-2^63).
Tensor Tensor::to(DType target) const {
    if (target == dtype()) return *this;
    const ProfileScope profiled("to");
    Tensor out = empty(shape(), target, device());
    backend_for(device()).copy(*this, out);
    const DType source = dtype();
    // d(to)/dx = identity, converted back to the source dtype
    return record(out, "to", {*this}, [source](const Tensor& g) { return std::vector<Tensor>{g.to(source)}; });
}

// Between devices, bytes travel through the host: the source packed on its device, copied to a
// host buffer, then to the target device.
static void copy_packed_between_devices(const Tensor& packed_src, const Tensor& packed_dst) {
    const std::size_t nbytes = packed_src.numel() * dtype_size(packed_src.dtype());
    const char* from =
        static_cast<const char*>(packed_src.storage()->data()) + packed_src.offset() * dtype_size(packed_src.dtype());
    char* to = static_cast<char*>(packed_dst.storage()->data()) + packed_dst.offset() * dtype_size(packed_dst.dtype());
    if (packed_src.device() == Device::cpu) {
        backend_for(packed_dst.device()).copy_from_host(from, to, nbytes);
    } else if (packed_dst.device() == Device::cpu) {
        backend_for(packed_src.device()).copy_to_host(from, to, nbytes);
    } else {
        std::vector<char> host(nbytes);
        backend_for(packed_src.device()).copy_to_host(from, host.data(), nbytes);
        backend_for(packed_dst.device()).copy_from_host(host.data(), to, nbytes);
    }
}

Tensor Tensor::to(Device target) const {
    if (target == device()) return *this;
    const ProfileScope profiled("to device");
    const Tensor packed = detach().contiguous();
    Tensor out = empty(shape(), dtype(), target);
    copy_packed_between_devices(packed, out);
    const Device source = device();
    // d(to)/dx = identity, moved back to the source device
    return record(out, "to_device", {*this}, [source](const Tensor& g) { return std::vector<Tensor>{g.to(source)}; });
}

Tensor& Tensor::copy_(const Tensor& src) {
    const ProfileScope profiled("copy_");
    RELGRAD_CHECK(src.shape() == shape(), "copy_: source shape ", shape_str(src.shape()),
                  " differs from destination shape ", shape_str(shape()));
    RELGRAD_CHECK(!(grad_mode_enabled() && requires_grad()),
                  "copy_: the tensor requires a gradient; copy into it under a NoGradGuard");
    for (int64_t d = 0; d < dim(); ++d) {
        RELGRAD_CHECK(strides()[d] != 0 || shape()[d] <= 1, "copy_: the destination ", shape_str(shape()),
                      " is an expanded view, whose elements share memory");
    }
    NoGradGuard no_grad;
    storage()->count_write();  // a graph that saved this memory refuses its backward now
    // a source that shares this tensor's memory is read from a copy of it, not while being written
    const Tensor source = src.storage() == storage() ? src.clone() : src;
    if (source.device() == device()) {
        backend_for(device()).copy(source, *this);
        return *this;
    }
    // across devices: converted and packed on the source's device, moved, then copied into place
    const Tensor packed = source.to(dtype()).contiguous();
    Tensor arrived = is_contiguous() ? *this : empty(shape(), dtype(), device());
    copy_packed_between_devices(packed, arrived);
    if (arrived.impl() != impl()) backend_for(device()).copy(arrived, *this);
    return *this;
}

Tensor Tensor::clone() const {
    const ProfileScope profiled("clone");
    Tensor out = empty(shape(), dtype(), device());
    backend_for(device()).copy(*this, out);
    return record(out, "clone", {*this}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

}  // namespace relgrad
