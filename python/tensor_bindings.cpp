// relgrad's Python module: the Tensor class (metadata, values, autograd, views, operators), the
// dtypes, NumPy in and out (relgrad.tensor, Tensor.numpy) and the shapes Python passes.
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "engine/autograd.hpp"
#include "engine/errors.hpp"
#include "engine/ops.hpp"
#include "python/bindings.hpp"

namespace relgrad::python {

namespace {

// The relgrad dtype a NumPy dtype's values go to when none is asked for.
DType dtype_of_numpy(const py::dtype& dtype, bool from_python_values) {
    switch (dtype.kind()) {
        case 'f':
            if (from_python_values) return DType::float32;
            return dtype.itemsize() == 8 ? DType::float64 : dtype.itemsize() == 2 ? DType::float16 : DType::float32;
        case 'i':
        case 'u': return DType::int64;
        case 'b': return DType::boolean;
        default:
            RELGRAD_CHECK(false, "relgrad.tensor: NumPy dtype ", dtype.attr("name").cast<std::string>(),
                          " has no relgrad dtype (", names_in_words(dtype_names), ")");
    }
}

// A Python number as a 0-d tensor of t's dtype and device, for t + 2 and the like: scalar_like,
// refusing a number with a fraction for an integer tensor.
Tensor checked_scalar_like(const Tensor& t, double value) {
    RELGRAD_CHECK(is_floating(t.dtype()) || value == static_cast<double>(static_cast<int64_t>(value)), "a ",
                  dtype_name(t.dtype()), " tensor and the number ", py::repr(py::float_(value)).cast<std::string>(),
                  ": convert the tensor with .to('float32') first");
    return scalar_like(t, value);
}

// t[...]: ints, slices with a positive step, None and one Ellipsis, all as views.
Tensor index_tensor(const Tensor& t, const py::object& key) {
    py::tuple items = py::isinstance<py::tuple>(key) ? key.cast<py::tuple>() : py::make_tuple(key);
    int64_t consumed = 0;
    bool ellipsis = false;
    for (const py::handle& item : items) {
        if (py::isinstance<py::bool_>(item)) {  // True is an int to Python, a mask to NumPy: neither here
            throw py::index_error("relgrad does not index with True or False (boolean masks: relgrad.where)");
        }
        if (py::isinstance<py::int_>(item) || py::isinstance<py::slice>(item)) {
            ++consumed;
        } else if (item.is(py::ellipsis())) {
            if (ellipsis) throw py::index_error("an index can only have a single ellipsis ('...')");
            ellipsis = true;
        } else if (!item.is_none()) {
            throw py::index_error(
                "relgrad indexes with ints, slices, None and '...'; for indices held in a tensor "
                "use relgrad.index_select or relgrad.gather");
        }
    }
    if (consumed > t.dim()) {
        throw py::index_error("too many indices: " + std::to_string(consumed) + " for a tensor of shape " +
                              shape_str(t.shape()));
    }
    // d: the dim of `result` the next item applies to. An int removes that dim, a slice keeps it,
    // None inserts one, and the ellipsis passes over the dims no other item names.
    const int64_t ellipsis_dims = t.dim() - consumed;
    Tensor result = t;
    int64_t d = 0;
    for (const py::handle& item : items) {
        if (py::isinstance<py::int_>(item)) {
            const int64_t size = result.size(d);
            int64_t i = item.cast<int64_t>();
            if (i < -size || i >= size) {
                throw py::index_error("index " + std::to_string(i) + " is out of range for a dim of size " +
                                      std::to_string(size));
            }
            if (i < 0) i += size;
            result = result.narrow(d, i, 1).squeeze(d);
        } else if (py::isinstance<py::slice>(item)) {
            py::ssize_t start = 0, stop = 0, step = 0, length = 0;
            if (!item.cast<py::slice>().compute(result.size(d), &start, &stop, &step, &length)) {
                throw py::error_already_set();
            }
            RELGRAD_CHECK(step > 0, "slicing with a negative step is not supported");
            result = result.slice(d, start, length == 0 ? start : start + (length - 1) * step + 1, step);
            ++d;
        } else if (item.is_none()) {
            result = result.unsqueeze(d);
            ++d;
        } else {
            d += ellipsis_dims;
        }
    }
    return result;
}

// A copy on the host; bfloat16 as float32, which holds its values exactly (NumPy has no bfloat16).
py::array numpy_copy(const Tensor& t) {
    const Tensor host = t.detach().to(Device::cpu);
    return to_numpy(host.dtype() == DType::bfloat16 ? host.to(DType::float32) : host.clone());
}

}  // namespace

// A size or dim: a Python int that int64 holds (2**64 is refused by name, not by a failed cast)
int64_t size_from(const py::handle& item) {
    if (!py::isinstance<py::int_>(item)) {
        try {
            return item.cast<int64_t>();  // NumPy's integers, through __index__
        } catch (const py::cast_error&) {
            throw py::type_error("a size is an int, got " +
                                 py::str(py::type::of(item).attr("__name__")).cast<std::string>());
        }
    }
    int overflow = 0;
    const long long value = PyLong_AsLongLongAndOverflow(item.ptr(), &overflow);
    RELGRAD_CHECK(overflow == 0, "size ", py::str(item).cast<std::string>(),
                  " does not fit int64 (sizes are at most 2^63 - 1)");
    return value;
}

Shape shape_from(const py::handle& value) {
    if (py::isinstance<py::int_>(value)) return {size_from(value)};
    if (!py::isinstance<py::sequence>(value) || py::isinstance<py::str>(value)) {
        throw py::type_error("a shape is an int or a sequence of ints, got " +
                             py::str(py::type::of(value).attr("__name__")).cast<std::string>());
    }
    Shape shape;
    for (const py::handle item : value) shape.push_back(size_from(item));
    return shape;
}

// view(2, 3) and view((2, 3)) alike
Shape shape_from_args(const py::args& args) {
    if (args.size() == 1 && !py::isinstance<py::int_>(args[0])) return shape_from(args[0]);
    return shape_from(args);
}

std::vector<int64_t> dims_from(const py::handle& value) {
    if (value.is_none()) return {};
    return shape_from(value);
}

DType dtype_from(const py::handle& value) {
    if (py::isinstance<DType>(value)) return value.cast<DType>();
    std::string name;
    if (py::isinstance<py::str>(value)) {
        name = value.cast<std::string>();
    } else if (py::isinstance<py::dtype>(value) || py::hasattr(value, "dtype") || py::isinstance<py::type>(value)) {
        name = py::dtype::from_args(py::reinterpret_borrow<py::object>(value)).attr("name").cast<std::string>();
    } else {
        RELGRAD_CHECK(false, "a dtype is a relgrad.dtype or its name (", names_in_words(dtype_names), "), not ",
                      py::repr(value).cast<std::string>());
    }
    return parse_named(dtype_names, name, "dtype");
}

Device device_from(const py::handle& value) {
    RELGRAD_CHECK(py::isinstance<py::str>(value), "a device is named by a string: ", names_in_words(device_names));
    return parse_device(value.cast<std::string>());
}

Tensor tensor_from(const py::handle& data, const py::handle& dtype, bool requires_grad, const py::handle& device) {
    RELGRAD_CHECK(!py::isinstance<Tensor>(data),
                  "relgrad.tensor: the data is a Tensor already; use .clone() or .detach()");
    const bool from_python_values = !py::isinstance<py::array>(data);
    py::module_ numpy = py::module_::import("numpy");
    py::array values = numpy.attr("asarray")(data);
    // throws, naming the dtype, for values relgrad cannot hold (complex, strings, objects)
    const DType natural = dtype_of_numpy(values.dtype(), from_python_values);
    const DType target = dtype.is_none() ? natural : dtype_from(dtype);
    if (!is_floating(target) && values.dtype().kind() == 'f') {
        const bool whole = numpy.attr("all")(numpy.attr("equal")(numpy.attr("floor")(values), values)).cast<bool>();
        RELGRAD_CHECK(whole, "relgrad.tensor: values with a fractional part cannot become ", dtype_name(target));
    }
    // uint64 values past int64's range would wrap around (2^64 - 1 to -1) in the conversion below
    if (target == DType::int64 && values.dtype().kind() == 'u' && values.dtype().itemsize() == 8 && values.size() > 0) {
        const py::object largest = numpy.attr("max")(values);
        RELGRAD_CHECK(largest.cast<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                      "relgrad.tensor: ", py::str(largest).cast<std::string>(),
                      " does not fit int64, relgrad's integer dtype (at most 2^63 - 1)");
    }
    // NumPy has no bfloat16: its values come as float64 and are rounded by relgrad (engine/half.hpp)
    const DType packed_dtype = target == DType::bfloat16 ? DType::float64 : target;
    py::array packed =
        numpy.attr("asarray")(values, py::arg("dtype") = dtype_name(packed_dtype), py::arg("order") = "C");
    Shape shape(packed.shape(), packed.shape() + packed.ndim());
    Tensor tensor = empty(shape, packed_dtype);
    if (tensor.numel() > 0) {
        std::memcpy(tensor.storage()->data(), packed.data(), tensor.numel() * dtype_size(packed_dtype));
    }
    tensor = tensor.to(target);
    if (!device.is_none()) tensor = tensor.to(device_from(device));
    if (requires_grad) tensor.requires_grad_(true);
    return tensor;
}

py::array to_numpy(const Tensor& t) {
    RELGRAD_CHECK(host_can_read(t.device()), "numpy(): the tensor is on the ", device_name(t.device()),
                  " device, which the host cannot read; copy it with .to('cpu') first");
    RELGRAD_CHECK(t.dtype() != DType::bfloat16,
                  "numpy(): NumPy has no bfloat16, so no array can share a bfloat16 tensor's memory; "
                  ".to('float32').numpy() is a float32 copy that holds its values exactly");
    const auto itemsize = static_cast<py::ssize_t>(dtype_size(t.dtype()));
    std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end()), strides;
    bool broadcast = false;
    for (int64_t i = 0; i < t.dim(); ++i) {
        strides.push_back(t.strides()[i] * itemsize);
        broadcast |= t.strides()[i] == 0 && t.shape()[i] > 1;
    }
    // The array's base object: a capsule holding a reference to the storage.
    auto* owner = new std::shared_ptr<Storage>(t.storage());
    py::capsule base(owner, [](void* p) { delete static_cast<std::shared_ptr<Storage>*>(p); });
    char* first = static_cast<char*>(t.storage()->data()) + t.offset() * itemsize;
    py::array array(py::dtype(dtype_name(t.dtype())), shape, strides, first, base);  // relgrad names dtypes as NumPy
    // read-only: a parameter's values (an optimizer writes them), a broadcast view (whose elements
    // share memory), and memory a live graph saved for its backward (autograd.hpp), whose gradient
    // would otherwise be of values written after the forward
    if (t.requires_grad() || broadcast || t.storage()->saved_by_graphs > 0) {
        py::detail::array_proxy(array.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
    } else {
        t.storage()->note_numpy_can_write();  // a graph that saves it later keeps a fingerprint of it
    }
    return array;
}

// relgrad.from_numpy: a CPU tensor over the array's own memory, as torch.from_numpy makes one;
// writes through either show in the other, and the tensor keeps the array alive.
Tensor tensor_over_numpy(const py::array& array) {
    const std::string numpy_name = array.dtype().attr("name").cast<std::string>();
    const std::string byte_order = py::str(array.dtype().attr("byteorder")).cast<std::string>();
    // relgrad names its dtypes as NumPy does; NumPy has no bfloat16
    const std::optional<DType> same_bytes = value_named(dtype_names, numpy_name);
    RELGRAD_CHECK(same_bytes && *same_bytes != DType::bfloat16, "from_numpy: NumPy dtype ", numpy_name,
                  " has no relgrad dtype of the same bytes (float32, float64, float16, int64 or bool); "
                  "relgrad.tensor(a) converts it into a copy");
    const DType dtype = *same_bytes;
    RELGRAD_CHECK(byte_order != ">", "from_numpy: the array is big-endian; relgrad.tensor(a) converts it into a copy");
    RELGRAD_CHECK(array.writeable(),
                  "from_numpy: the array is read-only, and relgrad writes into a tensor's memory in place (an "
                  "optimizer's step, load_state_dict); relgrad.tensor(a) makes a copy");
    const auto itemsize = static_cast<py::ssize_t>(dtype_size(dtype));
    RELGRAD_CHECK(reinterpret_cast<std::uintptr_t>(array.data()) % static_cast<std::uintptr_t>(itemsize) == 0,
                  "from_numpy: the array's elements are not aligned to their size; "
                  "relgrad.tensor(a) makes an aligned copy");
    Shape shape, strides;
    std::size_t span = array.size() == 0 ? 0 : static_cast<std::size_t>(itemsize);  // bytes from the first element
    for (py::ssize_t d = 0; d < array.ndim(); ++d) {
        const py::ssize_t stride = array.strides(d);
        // an empty array shares no element: any strides will do (NumPy gives its dims stride 0)
        RELGRAD_CHECK(array.shape(d) <= 1 || array.size() == 0 || (stride > 0 && stride % itemsize == 0),
                      "from_numpy: dim ", d, " has a stride of ", stride,
                      " bytes; relgrad shares arrays whose strides are positive multiples of the element size (",
                      itemsize, "), so a reversed or broadcast array needs relgrad.tensor(a), a copy");
        shape.push_back(array.shape(d));
        strides.push_back(stride / itemsize);  // a size-1 dim's stride is never used: set below
        if (array.size() > 0) span += static_cast<std::size_t>((array.shape(d) - 1) * stride);
    }
    const Shape packed = contiguous_strides(shape);
    for (std::size_t d = 0; d < shape.size(); ++d) {
        if (shape[d] <= 1 || array.size() == 0) strides[d] = packed[d];
    }
    // The owner holds the array (so that it lives as long as the tensor) and a weak reference to it
    // and to every array below it whose memory it views (its .base chain): NumPy refuses to resize
    // an array that has weak references ("referenced by another array"), even with
    // refcheck=False, so the memory cannot be freed under the tensor. Both are dropped with the GIL
    // held, whichever thread frees the storage.
    auto* held = new std::vector<py::object>{array};
    const py::object weak_reference = py::module_::import("weakref").attr("ref");
    for (py::object part = array; py::isinstance<py::array>(part); part = part.attr("base")) {
        held->push_back(weak_reference(part));
    }
    std::shared_ptr<void> owner(held, [](void* objects) {
        py::gil_scoped_acquire gil;
        delete static_cast<std::vector<py::object>*>(objects);
    });
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = std::make_shared<Storage>(const_cast<void*>(array.data()), span, std::move(owner));
    impl->storage->note_numpy_can_write();
    impl->shape = std::move(shape);
    impl->strides = std::move(strides);
    impl->dtype = dtype;
    return Tensor(impl);
}

py::object tensor_or_none(const Tensor& tensor) { return tensor.defined() ? py::cast(tensor) : py::none(); }

void bind_tensor(py::module_& m) {
    py::enum_<DType> dtype_enum(m, "dtype",
                                "An element type: float32 (training), float64 (gradient checks), int64, bool");
    for (const EnumName<DType>& entry : dtype_names) dtype_enum.value(entry.name, entry.value);
    dtype_enum.export_values();
    // print(t.dtype) says float32, as NumPy and torch do (replacing the enum's own methods)
    dtype_enum.attr("__str__") =
        py::cpp_function([](DType d) { return std::string(dtype_name(d)); }, py::is_method(dtype_enum));
    dtype_enum.attr("__repr__") =
        py::cpp_function([](DType d) { return std::string("relgrad.") + dtype_name(d); }, py::is_method(dtype_enum));

    py::class_<Tensor> tensor(m, "Tensor", "A strided view of a storage, with its autograd history");
    tensor
        .def(py::init([](const py::object& data) { return tensor_from(data, py::none(), false, py::none()); }),
             py::arg("data"))
        // metadata
        .def_property_readonly("shape", [](const Tensor& t) { return py::tuple(py::cast(t.shape())); })
        .def_property_readonly(
            "strides", [](const Tensor& t) { return py::tuple(py::cast(t.strides())); }, "In elements, not bytes")
        .def_property_readonly("offset", &Tensor::offset)
        .def_property_readonly("ndim", &Tensor::dim)
        .def_property_readonly("dtype", &Tensor::dtype)
        .def_property_readonly("device", [](const Tensor& t) { return std::string(device_name(t.device())); })
        .def("numel", &Tensor::numel)
        .def(
            "size",
            [](const Tensor& t, const py::object& d) -> py::object {
                if (d.is_none()) return py::tuple(py::cast(t.shape()));
                return py::int_(t.size(d.cast<int64_t>()));
            },
            py::arg("dim") = py::none())
        .def("__len__",
             [](const Tensor& t) {
                 if (t.dim() == 0) throw py::type_error("len() of a 0-d tensor");
                 return t.size(0);
             })
        .def("is_contiguous", &Tensor::is_contiguous)
        .def_property_readonly(
            "_id", [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.impl()); },
            "Identifies the tensor (not its Python wrapper): equal for two handles of one tensor")
        // values
        .def("numpy", &to_numpy, "The elements as a NumPy array over the same memory (no copy)")
        .def(
            "__array__",
            [](const Tensor& t, const py::object& dtype) {
                py::array array = numpy_copy(t);
                return dtype.is_none() ? array : py::array(array.attr("astype")(dtype));
            },
            py::arg("dtype") = py::none())
        .def("item", &Tensor::item)
        .def("__float__", &Tensor::item)
        .def("__bool__",
             [](const Tensor& t) {
                 RELGRAD_CHECK(t.numel() == 1, "the truth value of a tensor of ", t.numel(), " elements is ambiguous");
                 return t.item() != 0;
             })
        .def("tolist", [](const Tensor& t) { return numpy_copy(t).attr("tolist")(); })
        .def(
            "to",
            [](const Tensor& t, const py::object& where) {
                if (py::isinstance<py::str>(where)) {
                    const std::string name = where.cast<std::string>();
                    if (const auto dtype = value_named(dtype_names, name)) return t.to(*dtype);
                    return t.to(parse_device(name));
                }
                return t.to(dtype_from(where));
            },
            py::arg("dtype_or_device"), "A copy in another dtype ('float64') or on another device ('cpu')")
        .def("contiguous", &Tensor::contiguous)
        .def("clone", &Tensor::clone)
        .def("__repr__",
             [](const Tensor& t) {
                 std::string text = "tensor(";
                 if (host_can_read(t.device())) {
                     py::module_ numpy = py::module_::import("numpy");
                     text += numpy
                                 .attr("array2string")(numpy_copy(t), py::arg("separator") = ", ",
                                                       py::arg("prefix") = "tensor(")
                                 .cast<std::string>();
                 } else {
                     text += "shape=" + shape_str(t.shape()) + ", device='" + device_name(t.device()) + "'";
                 }
                 text += std::string(", dtype=") + dtype_name(t.dtype());
                 if (t.grad_fn())
                     text += ", grad_fn=<" + t.grad_fn()->op_name + ">";
                 else if (t.requires_grad())
                     text += ", requires_grad=True";
                 return text + ")";
             })
        // autograd
        .def_property("requires_grad", &Tensor::requires_grad, [](Tensor& t, bool value) { t.requires_grad_(value); })
        .def(
            "requires_grad_", [](Tensor& t, bool value) { return t.requires_grad_(value); }, py::arg("value") = true)
        .def_property_readonly("is_leaf", &Tensor::is_leaf)
        .def_property_readonly(
            "grad", [](const Tensor& t) { return tensor_or_none(t.grad()); },
            "The gradient summed by backward passes (None until one reaches this tensor)")
        .def_property_readonly(
            "grad_fn", [](const Tensor& t) -> py::object { return t.grad_fn() ? py::cast(t.grad_fn()) : py::none(); },
            "The Node that produced this tensor; None for a leaf")
        .def("zero_grad", &Tensor::zero_grad)
        .def("retain_grad", &Tensor::retain_grad)
        .def(
            "backward",
            [](const Tensor& t, const std::optional<Tensor>& gradient, bool retain_graph) {
                py::gil_scoped_release release;
                t.backward(gradient.value_or(Tensor()), retain_graph);
            },
            py::arg("gradient") = py::none(), py::arg("retain_graph") = false)
        .def("detach", &Tensor::detach)
        // views
        .def("view", [](const Tensor& t, const py::args& shape) { return t.view(shape_from_args(shape)); })
        .def("reshape", [](const Tensor& t, const py::args& shape) { return t.reshape(shape_from_args(shape)); })
        .def("expand", [](const Tensor& t, const py::args& shape) { return t.expand(shape_from_args(shape)); })
        .def("permute", [](const Tensor& t, const py::args& dims) { return t.permute(shape_from_args(dims)); })
        .def("transpose", &Tensor::transpose, py::arg("dim0"), py::arg("dim1"))
        .def_property_readonly("T",
                               [](const Tensor& t) {
                                   RELGRAD_CHECK(t.dim() == 2, ".T: a 2-d tensor's transpose; use transpose(d0, d1)");
                                   return t.transpose(0, 1);
                               })
        .def("narrow", &Tensor::narrow, py::arg("dim"), py::arg("start"), py::arg("length"))
        .def("slice", &Tensor::slice, py::arg("dim"), py::arg("start"), py::arg("end"), py::arg("step") = 1,
             "the view of elements start, start + step, ... before end along dim, as t[..., start:end:step]")
        .def("unsqueeze", &Tensor::unsqueeze, py::arg("dim"))
        .def("squeeze", &Tensor::squeeze, py::arg("dim"))
        .def("__getitem__", &index_tensor)
        // math as methods
        .def(
            "sum", [](const Tensor& t, const py::object& dim, bool keepdim) { return sum(t, dims_from(dim), keepdim); },
            py::arg("dim") = py::none(), py::arg("keepdim") = false)
        .def(
            "mean",
            [](const Tensor& t, const py::object& dim, bool keepdim) { return mean(t, dims_from(dim), keepdim); },
            py::arg("dim") = py::none(), py::arg("keepdim") = false)
        .def(
            "max", [](const Tensor& t, const py::object& dim, bool keepdim) { return max(t, dims_from(dim), keepdim); },
            py::arg("dim") = py::none(), py::arg("keepdim") = false)
        .def("exp", [](const Tensor& t) { return exp(t); })
        .def("log", [](const Tensor& t) { return log(t); })
        .def("sqrt", [](const Tensor& t) { return sqrt(t); })
        .def("tanh", [](const Tensor& t) { return tanh(t); })
        .def("sigmoid", [](const Tensor& t) { return sigmoid(t); })
        .def("relu", [](const Tensor& t) { return relu(t); })
        .def(
            "softmax", [](const Tensor& t, int64_t dim) { return softmax(t, dim); }, py::arg("dim"))
        .def(
            "log_softmax", [](const Tensor& t, int64_t dim) { return log_softmax(t, dim); }, py::arg("dim"))
        .def("matmul", [](const Tensor& a, const Tensor& b) { return matmul(a, b); })
        // operators: with a tensor, or with a Python number taken in the tensor's dtype
        .def(
            "__add__", [](const Tensor& a, const Tensor& b) { return a + b; }, py::is_operator())
        .def(
            "__add__", [](const Tensor& a, double b) { return a + checked_scalar_like(a, b); }, py::is_operator())
        .def(
            "__radd__", [](const Tensor& a, double b) { return checked_scalar_like(a, b) + a; }, py::is_operator())
        .def(
            "__sub__", [](const Tensor& a, const Tensor& b) { return a - b; }, py::is_operator())
        .def(
            "__sub__", [](const Tensor& a, double b) { return a - checked_scalar_like(a, b); }, py::is_operator())
        .def(
            "__rsub__", [](const Tensor& a, double b) { return checked_scalar_like(a, b) - a; }, py::is_operator())
        .def(
            "__mul__", [](const Tensor& a, const Tensor& b) { return a * b; }, py::is_operator())
        .def(
            "__mul__", [](const Tensor& a, double b) { return a * checked_scalar_like(a, b); }, py::is_operator())
        .def(
            "__rmul__", [](const Tensor& a, double b) { return checked_scalar_like(a, b) * a; }, py::is_operator())
        .def(
            "__truediv__", [](const Tensor& a, const Tensor& b) { return a / b; }, py::is_operator())
        .def(
            "__truediv__", [](const Tensor& a, double b) { return a / checked_scalar_like(a, b); }, py::is_operator())
        .def(
            "__rtruediv__", [](const Tensor& a, double b) { return checked_scalar_like(a, b) / a; }, py::is_operator())
        .def(
            "__pow__", [](const Tensor& a, const Tensor& b) { return pow(a, b); }, py::is_operator())
        .def(
            "__pow__", [](const Tensor& a, double b) { return pow(a, b); }, py::is_operator())
        .def(
            "__rpow__", [](const Tensor& a, double b) { return pow(checked_scalar_like(a, b), a); }, py::is_operator())
        .def(
            "__matmul__", [](const Tensor& a, const Tensor& b) { return matmul(a, b); }, py::is_operator())
        .def("__neg__", [](const Tensor& a) { return -a; });
    // A NumPy array (or list) passed where a Tensor is expected becomes one, as relgrad.tensor makes it.
    py::implicitly_convertible<py::array, Tensor>();

    m.def("tensor", &tensor_from, py::arg("data"), py::arg("dtype") = py::none(), py::arg("requires_grad") = false,
          py::arg("device") = py::none(),
          "A new tensor with a copy of data (a NumPy array, a list or a number). dtype: float32, float64, bfloat16, "
          "float16, int64 or bool; by default NumPy's, and float32 for Python floats");
    m.def("from_numpy", &tensor_over_numpy, py::arg("array"),
          "A CPU tensor that shares the NumPy array's memory (float32, float64, float16, int64 or bool; no copy): "
          "writes through either show in the other, and the tensor keeps the array alive");
}

}  // namespace relgrad::python
