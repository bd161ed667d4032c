// relgrad's Python module: Tensor, NumPy in and out, the ops, autograd and gradcheck.
#include <cmath>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <omp.h>

#include "engine/autograd.hpp"
#include "engine/gradcheck.hpp"
#include "engine/ops.hpp"
#include "engine/optim.hpp"
#include "python/bindings.hpp"

namespace relgrad::python {

namespace {

// The relgrad dtype a NumPy dtype's values go to when none is asked for.
DType dtype_of_numpy(const py::dtype& dtype, bool from_python_values) {
    switch (dtype.kind()) {
        case 'f': return dtype.itemsize() == 8 && !from_python_values ? DType::float64 : DType::float32;
        case 'i':
        case 'u': return DType::int64;
        case 'b': return DType::boolean;
        default:
            throw std::invalid_argument("relgrad.tensor: NumPy dtype " + dtype.attr("name").cast<std::string>() +
                                        " has no relgrad dtype (float32, float64, int64 or bool)");
    }
}

Shape shape_from(const py::handle& value) {
    if (py::isinstance<py::int_>(value)) return {value.cast<int64_t>()};
    return value.cast<Shape>();
}

// view(2, 3) and view((2, 3)) alike
Shape shape_from_args(const py::args& args) {
    if (args.size() == 1 && !py::isinstance<py::int_>(args[0])) return shape_from(args[0]);
    return args.cast<Shape>();
}

std::vector<int64_t> dims_from(const py::handle& value) {
    if (value.is_none()) return {};
    return shape_from(value);
}

// A Python number as a 0-d tensor of t's dtype and device, for t + 2 and the like: scalar_like,
// refusing a number with a fraction for an integer tensor.
Tensor checked_scalar_like(const Tensor& t, double value) {
    if (!is_floating(t.dtype()) && value != static_cast<double>(static_cast<int64_t>(value))) {
        throw std::invalid_argument(std::string("a ") + dtype_name(t.dtype()) + " tensor and the number " +
                                    py::repr(py::float_(value)).cast<std::string>() +
                                    ": convert the tensor with .to('float32') first");
    }
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
            if (step <= 0) throw std::invalid_argument("slicing with a negative step is not supported");
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

py::array numpy_copy(const Tensor& t) { return to_numpy(t.detach().to(Device::cpu).clone()); }

struct NoGradContext {
    std::optional<NoGradGuard> guard;
};

// A list (or other iterable) of tensors is wanted; one tensor alone is refused, as PyTorch refuses
// it: taken as a sequence, it would give its rows, views that never get a gradient.
void require_list(const py::handle& items, const std::string& what) {
    if (py::isinstance<Tensor>(items) || !py::isinstance<py::iterable>(items)) {
        throw py::type_error(what + " must be a list of tensors, got " + std::string(py::str(py::type::of(items))));
    }
}

std::vector<Tensor> tensor_list(const py::handle& items, const std::string& what) {
    require_list(items, what);
    std::vector<Tensor> tensors;
    for (const py::handle item : items) {
        if (!py::isinstance<Tensor>(item)) {
            throw py::type_error(what + " must be a list of tensors, got an item of " +
                                 std::string(py::str(py::type::of(item))));
        }
        tensors.push_back(item.cast<Tensor>());
    }
    return tensors;
}

// AdamW's parameters, as PyTorch takes them: a list of tensors (one group), or a list of groups
// {"params": [...], "lr_scale": 5, "weight_decay": 0}; a group's lr_scale defaults to 1, its
// weight_decay to the constructor's.
std::vector<ParameterGroup> parameter_groups(const py::handle& parameters, double weight_decay) {
    require_list(parameters, "AdamW: parameters");
    const py::list items(py::reinterpret_borrow<py::object>(parameters));  // from a generator too
    if (items.empty() || !py::isinstance<py::dict>(items[0])) {
        return {{tensor_list(items, "AdamW: parameters"), 1.0, weight_decay}};
    }
    std::vector<ParameterGroup> built;
    for (const py::handle item : items) {
        const std::string name = "AdamW: group " + std::to_string(built.size());
        if (!py::isinstance<py::dict>(item)) throw py::type_error(name + " is not a dict");
        ParameterGroup group{{}, 1.0, weight_decay};
        bool has_params = false;
        for (const auto& [key_handle, value] : item.cast<py::dict>()) {
            const std::string key = py::str(key_handle);
            if (key == "params") {
                // one tensor alone is a group of one here, as in PyTorch
                group.parameters = py::isinstance<Tensor>(value) ? std::vector<Tensor>{value.cast<Tensor>()}
                                                                 : tensor_list(value, name + "'s params");
                has_params = true;
            } else if (key == "lr_scale") {
                group.lr_scale = value.cast<double>();
            } else if (key == "weight_decay") {
                group.weight_decay = value.cast<double>();
            } else {
                throw std::invalid_argument(name + " has an unknown key '" + key +
                                            "' (params, lr_scale, weight_decay)");
            }
        }
        if (!has_params) throw std::invalid_argument(name + " has no 'params'");
        built.push_back(std::move(group));
    }
    return built;
}

}  // namespace

DType dtype_from(const py::handle& value) {
    if (py::isinstance<DType>(value)) return value.cast<DType>();
    std::string name;
    if (py::isinstance<py::str>(value)) {
        name = value.cast<std::string>();
    } else if (py::isinstance<py::dtype>(value) || py::hasattr(value, "dtype") || py::isinstance<py::type>(value)) {
        name = py::dtype::from_args(py::reinterpret_borrow<py::object>(value)).attr("name").cast<std::string>();
    } else {
        throw std::invalid_argument("a dtype is one of relgrad.float32, float64, int64, bool (or its name), not " +
                                    py::repr(value).cast<std::string>());
    }
    for (DType dtype : {DType::float32, DType::float64, DType::int64, DType::boolean}) {
        if (name == dtype_name(dtype)) return dtype;
    }
    throw std::invalid_argument("unknown dtype '" + name + "': relgrad has float32, float64, int64 and bool");
}

Device device_from(const py::handle& value) {
    if (!py::isinstance<py::str>(value)) {
        throw std::invalid_argument("a device is named by a string: 'cpu', 'guarded_cpu' or 'cuda'");
    }
    return parse_device(value.cast<std::string>());
}

Tensor tensor_from(const py::handle& data, const py::handle& dtype, bool requires_grad, const py::handle& device) {
    if (py::isinstance<Tensor>(data)) {
        throw std::invalid_argument("relgrad.tensor: the data is a Tensor already; use .clone() or .detach()");
    }
    const bool from_python_values = !py::isinstance<py::array>(data);
    py::module_ numpy = py::module_::import("numpy");
    py::array values = numpy.attr("asarray")(data);
    // throws, naming the dtype, for values relgrad cannot hold (complex, strings, objects)
    const DType natural = dtype_of_numpy(values.dtype(), from_python_values);
    const DType target = dtype.is_none() ? natural : dtype_from(dtype);
    if (!is_floating(target) && values.dtype().kind() == 'f') {
        const bool whole = numpy.attr("all")(numpy.attr("equal")(numpy.attr("floor")(values), values)).cast<bool>();
        if (!whole) {
            throw std::invalid_argument(std::string("relgrad.tensor: values with a fractional part cannot become ") +
                                        dtype_name(target));
        }
    }
    py::array packed = numpy.attr("asarray")(values, py::arg("dtype") = dtype_name(target), py::arg("order") = "C");
    Shape shape(packed.shape(), packed.shape() + packed.ndim());
    Tensor tensor = empty(shape, target);
    if (tensor.numel() > 0) std::memcpy(tensor.storage()->data(), packed.data(), tensor.numel() * dtype_size(target));
    if (!device.is_none()) tensor = tensor.to(device_from(device));
    if (requires_grad) tensor.requires_grad_(true);
    return tensor;
}

py::array to_numpy(const Tensor& t) {
    if (!host_can_read(t.device())) {
        throw std::invalid_argument(std::string("numpy(): the tensor is on the ") + device_name(t.device()) +
                                    " device, which the host cannot read; copy it with .to('cpu') first");
    }
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
    if (t.requires_grad() || broadcast) {
        py::detail::array_proxy(array.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
    }
    return array;
}

py::object tensor_or_none(const Tensor& tensor) { return tensor.defined() ? py::cast(tensor) : py::none(); }

void bind_tensor(py::module_& m) {
    py::enum_<DType> dtype_enum(m, "dtype",
                                "An element type: float32 (training), float64 (gradient checks), int64, bool");
    dtype_enum.value("float32", DType::float32)
        .value("float64", DType::float64)
        .value("int64", DType::int64)
        .value("bool", DType::boolean)
        .export_values();
    // print(t.dtype) says float32, as NumPy and torch do (replacing the enum's own methods)
    dtype_enum.attr("__str__") =
        py::cpp_function([](DType d) { return std::string(dtype_name(d)); }, py::is_method(dtype_enum));
    dtype_enum.attr("__repr__") =
        py::cpp_function([](DType d) { return std::string("relgrad.") + dtype_name(d); }, py::is_method(dtype_enum));

    py::class_<Node, std::shared_ptr<Node>>(m, "Node",
                                            "The op that produced a tensor: its name, its inputs, and the backward "
                                            "function that maps the output's gradient to theirs")
        .def_property_readonly("name", [](const Node& n) { return n.op_name; })
        .def_property_readonly(
            "inputs",
            [](const Node& n) {
                py::list inputs;
                for (const Tensor& input : n.inputs) inputs.append(tensor_or_none(input));
                return inputs;
            },
            "The tensors the op read (empty once a backward pass has freed the graph)")
        .def_property_readonly("released", [](const Node& n) { return n.released; })
        .def(
            "backward",
            [](const Node& n, const Tensor& grad_output) {
                if (n.released) throw std::invalid_argument("Node.backward: a backward pass already freed this node");
                if (grad_output.shape() != n.output_shape || grad_output.dtype() != n.output_dtype ||
                    grad_output.device() != n.output_device) {
                    throw std::invalid_argument(
                        "Node.backward: " + n.op_name + " made a tensor of shape " + shape_str(n.output_shape) + " (" +
                        dtype_name(n.output_dtype) + ", " + device_name(n.output_device) + "); grad_output is " +
                        shape_str(grad_output.shape()) + " (" + dtype_name(grad_output.dtype()) + ", " +
                        device_name(grad_output.device()) + ")");
                }
                NoGradGuard no_grad;  // as in backward(): the gradient computation is not recorded
                py::list grads;
                for (const Tensor& g : n.backward(grad_output)) grads.append(tensor_or_none(g));
                return grads;
            },
            py::arg("grad_output"),
            "One step of the chain rule by hand: dL/d(output) -> [dL/d(input) per input] (None: no gradient)")
        .def_property_readonly("output_shape", [](const Node& n) { return py::tuple(py::cast(n.output_shape)); })
        .def_property_readonly("_id", [](const Node& n) { return reinterpret_cast<uintptr_t>(&n); })
        .def("__repr__", [](const Node& n) { return "<Node " + n.op_name + ">"; });

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
                 if (t.numel() != 1) {
                     throw std::invalid_argument("the truth value of a tensor of " + std::to_string(t.numel()) +
                                                 " elements is ambiguous");
                 }
                 return t.item() != 0;
             })
        .def("tolist", [](const Tensor& t) { return numpy_copy(t).attr("tolist")(); })
        .def(
            "to",
            [](const Tensor& t, const py::object& where) {
                if (py::isinstance<py::str>(where)) {
                    const std::string name = where.cast<std::string>();
                    for (DType dtype : {DType::float32, DType::float64, DType::int64, DType::boolean}) {
                        if (name == dtype_name(dtype)) return t.to(dtype);
                    }
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
        .def_property_readonly(
            "T",
            [](const Tensor& t) {
                if (t.dim() != 2) throw std::invalid_argument(".T: a 2-d tensor's transpose; use transpose(d0, d1)");
                return t.transpose(0, 1);
            })
        .def("narrow", &Tensor::narrow, py::arg("dim"), py::arg("start"), py::arg("length"))
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
          "A new tensor with a copy of data (a NumPy array, a list or a number). dtype: float32, float64, int64 "
          "or bool; by default NumPy's (float16 as float32), and float32 for Python floats");

    // factories; requires_grad makes the new tensor a leaf that requires a gradient
    auto leaf = [](Tensor t, bool requires_grad) { return requires_grad ? t.requires_grad_(true) : t; };
    auto factory = [&m, leaf](const char* name, Tensor (*make)(const Shape&, DType, Device)) {
        m.def(
            name,
            [make, leaf](const py::args& shape, const py::object& dtype, const std::string& device,
                         bool requires_grad) {
                return leaf(make(shape_from_args(shape), dtype_from(dtype), parse_device(device)), requires_grad);
            },
            py::arg("dtype") = "float32", py::arg("device") = "cpu", py::arg("requires_grad") = false);
    };
    factory("zeros", &zeros);
    factory("ones", &ones);
    m.def(
        "full",
        [leaf](const py::object& shape, double value, const py::object& dtype, const std::string& device,
               bool requires_grad) {
            return leaf(full(shape_from(shape), value, dtype_from(dtype), parse_device(device)), requires_grad);
        },
        py::arg("shape"), py::arg("value"), py::arg("dtype") = "float32", py::arg("device") = "cpu",
        py::arg("requires_grad") = false);
    m.def(
        "arange",
        [](int64_t n, const py::object& dtype, const std::string& device) {
            return arange(n, dtype_from(dtype), parse_device(device));
        },
        py::arg("n"), py::arg("dtype") = "float32", py::arg("device") = "cpu");
    auto random_factory = [&m, leaf](const char* name, Tensor (*draw)(const Shape&, Generator&, DType, Device),
                                     const char* doc) {
        m.def(
            name,
            [draw, leaf](const py::args& shape, uint64_t seed, const py::object& dtype, const std::string& device,
                         bool requires_grad) {
                Generator gen(seed);
                return leaf(draw(shape_from_args(shape), gen, dtype_from(dtype), parse_device(device)), requires_grad);
            },
            py::arg("seed") = 0, py::arg("dtype") = "float32", py::arg("device") = "cpu",
            py::arg("requires_grad") = false, doc);
    };
    random_factory("randn", &randn, "Standard normal values drawn from the seed: the same on every machine");
    random_factory("rand", &rand, "Uniform values in [0, 1) drawn from the seed");
    m.def("zeros_like", &zeros_like);
    m.def("ones_like", &ones_like);

    // the ops (engine/ops.hpp)
    m.def("add", [](const Tensor& a, const Tensor& b) { return add(a, b); });
    m.def("sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); });
    m.def("mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); });
    m.def("div", [](const Tensor& a, const Tensor& b) { return div(a, b); });
    m.def("pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); });
    m.def("pow", [](const Tensor& a, double exponent) { return pow(a, exponent); });
    m.def("neg", [](const Tensor& x) { return neg(x); });
    m.def("exp", [](const Tensor& x) { return exp(x); });
    m.def("log", [](const Tensor& x) { return log(x); });
    m.def("sqrt", [](const Tensor& x) { return sqrt(x); });
    m.def("tanh", [](const Tensor& x) { return tanh(x); });
    m.def("sigmoid", [](const Tensor& x) { return sigmoid(x); });
    m.def("relu", [](const Tensor& x) { return relu(x); });
    m.def("gelu", [](const Tensor& x) { return gelu(x); });
    m.def(
        "clamp", [](const Tensor& x, double low, double high) { return clamp(x, low, high); }, py::arg("x"),
        py::arg("low"), py::arg("high"));
    m.def("where", [](const Tensor& c, const Tensor& a, const Tensor& b) { return where(c, a, b); });
    m.def("masked_fill", [](const Tensor& x, const Tensor& mask, double value) { return masked_fill(x, mask, value); });
    m.def("sum_to", &sum_to, py::arg("gradient"), py::arg("shape"),
          "Sums a gradient over the dims that broadcasting added or stretched: the backward of a broadcast");
    m.def(
        "sum", [](const Tensor& t, const py::object& dim, bool keepdim) { return sum(t, dims_from(dim), keepdim); },
        py::arg("x"), py::arg("dim") = py::none(), py::arg("keepdim") = false);
    m.def(
        "mean", [](const Tensor& t, const py::object& dim, bool keepdim) { return mean(t, dims_from(dim), keepdim); },
        py::arg("x"), py::arg("dim") = py::none(), py::arg("keepdim") = false);
    m.def(
        "max", [](const Tensor& t, const py::object& dim, bool keepdim) { return max(t, dims_from(dim), keepdim); },
        py::arg("x"), py::arg("dim") = py::none(), py::arg("keepdim") = false);
    m.def("matmul", [](const Tensor& a, const Tensor& b) { return matmul(a, b); });
    m.def("concat", &concat, py::arg("tensors"), py::arg("dim"));
    m.def("stack", &stack, py::arg("tensors"), py::arg("dim"));
    m.def("gather", &gather, py::arg("x"), py::arg("dim"), py::arg("index"));
    m.def("scatter_add", &scatter_add, py::arg("x"), py::arg("dim"), py::arg("index"), py::arg("src"));
    m.def("index_select", &index_select, py::arg("x"), py::arg("dim"), py::arg("index"));
    m.def("embedding", &embedding, py::arg("weight"), py::arg("ids"));
    m.def("softmax", &softmax, py::arg("x"), py::arg("dim"));
    m.def("log_softmax", &log_softmax, py::arg("x"), py::arg("dim"));
    m.def("layer_norm", &layer_norm, py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("eps") = 1e-5);
    m.def(
        "dropout",
        [](const Tensor& x, double p, bool training, uint64_t seed) {
            Generator gen(seed);
            return dropout(x, p, training, gen);
        },
        py::arg("x"), py::arg("p"), py::arg("training") = true, py::arg("seed") = 0);
    m.def("cross_entropy", &cross_entropy, py::arg("logits"), py::arg("target"), py::arg("ignore_index") = -100);
    m.def(
        "attention",
        [](const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& mask,
           const std::optional<double>& scale, const std::optional<Tensor>& table_k,
           const std::optional<Tensor>& table_v, const std::optional<Tensor>& index) {
            py::gil_scoped_release release;
            const double s = scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
            return attention(
                q, k, v, mask.value_or(Tensor()), s,
                RelativeTerms{table_k.value_or(Tensor()), table_v.value_or(Tensor()), index.value_or(Tensor())});
        },
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("mask") = py::none(), py::arg("scale") = py::none(),
        py::arg("table_k") = py::none(), py::arg("table_v") = py::none(), py::arg("index") = py::none(),
        "Scaled dot-product attention with Shaw's relative terms in the bucketed form, one op (engine/ops.hpp)");
    m.def(
        "fused_attention",
        [](const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& mask, bool causal,
           int64_t window, int64_t query_offset, const std::optional<double>& scale,
           const std::optional<Tensor>& table_k, const std::optional<Tensor>& table_v, int64_t k_left,
           int64_t k_right) {
            py::gil_scoped_release release;
            const double s = scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
            return fused_attention(
                q, k, v, AttentionPattern{mask.value_or(Tensor()), causal, window, query_offset}, s,
                ClippedRelativeTerms{table_k.value_or(Tensor()), table_v.value_or(Tensor()), k_left, k_right});
        },
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("mask") = py::none(), py::arg("causal") = false,
        py::arg("window") = -1, py::arg("query_offset") = 0, py::arg("scale") = py::none(),
        py::arg("table_k") = py::none(), py::arg("table_v") = py::none(), py::arg("k_left") = 0, py::arg("k_right") = 0,
        "The same attention in memory linear in L: no [Lq, Lk] tensor is ever made");

    // autograd
    py::class_<NoGradContext>(m, "no_grad", "with relgrad.no_grad(): ops inside build no graph")
        .def(py::init<>())
        .def("__enter__", [](NoGradContext& context) { context.guard.emplace(); })
        .def("__exit__", [](NoGradContext& context, const py::args&) { context.guard.reset(); });
    m.def("is_grad_enabled", &grad_mode_enabled);
    m.def("topological_order", &topological_order, py::arg("root"),
          "The tensors backward() visits, each after every tensor it depends on (root last); backward walks the "
          "list from the end");

    py::class_<GradcheckErrors>(m, "GradcheckErrors")
        .def_readonly("max_abs_error", &GradcheckErrors::max_abs_error)
        .def_readonly("max_rel_error", &GradcheckErrors::max_rel_error)
        .def("__repr__", [](const GradcheckErrors& e) {
            return "GradcheckErrors(max_abs_error=" + py::repr(py::float_(e.max_abs_error)).cast<std::string>() +
                   ", max_rel_error=" + py::repr(py::float_(e.max_rel_error)).cast<std::string>() + ")";
        });
    py::class_<GradcheckResult, GradcheckErrors>(m, "GradcheckResult")
        .def_readonly("passed", &GradcheckResult::passed)
        .def_readonly("per_input", &GradcheckResult::per_input)
        .def_readonly("report", &GradcheckResult::report)
        .def("__bool__", [](const GradcheckResult& r) { return r.passed; })
        .def("__repr__", [](const GradcheckResult& r) {
            return std::string("GradcheckResult(passed=") + (r.passed ? "True" : "False") +
                   ", max_abs_error=" + py::repr(py::float_(r.max_abs_error)).cast<std::string>() +
                   ", max_rel_error=" + py::repr(py::float_(r.max_rel_error)).cast<std::string>() + ")";
        });
    m.def(
        "gradcheck",
        [](const py::function& fn, const std::vector<Tensor>& inputs, double eps, double atol, double rtol,
           uint64_t seed, bool fast) {
            const Function f = [&fn](const std::vector<Tensor>& xs) {
                py::object out = fn(*py::cast(xs));
                if (!py::isinstance<Tensor>(out)) {
                    throw py::type_error("gradcheck: fn returned " + py::repr(out.get_type()).cast<std::string>() +
                                         ", not a relgrad.Tensor");
                }
                return out.cast<Tensor>();
            };
            GradcheckOptions options;
            options.eps = eps;
            options.atol = atol;
            options.rtol = rtol;
            options.seed = seed;
            options.fast = fast;
            return gradcheck(f, inputs, options);
        },
        py::arg("fn"), py::arg("inputs"), py::arg("eps") = 1e-6, py::arg("atol") = 1e-5, py::arg("rtol") = 1e-3,
        py::arg("seed") = 0, py::arg("fast") = false,
        "Compares fn's analytic gradients (backward) with central differences, for every input that requires a "
        "gradient (float64); fn(*inputs) returns a Tensor");

    // optimization
    py::class_<AdamW>(m, "AdamW", "AdamW with decoupled weight decay (engine/optim.hpp)")
        .def(py::init([](const py::object& parameters, double beta1, double beta2, double eps, double weight_decay) {
                 return std::make_unique<AdamW>(parameter_groups(parameters, weight_decay),
                                                AdamWOptions{beta1, beta2, eps, weight_decay});
             }),
             py::arg("parameters"), py::arg("beta1") = 0.9, py::arg("beta2") = 0.999, py::arg("eps") = 1e-8,
             py::arg("weight_decay") = 0.01,
             "parameters: a list of tensors, or of groups {'params': [...], 'lr_scale': x, 'weight_decay': y}")
        .def_property_readonly(
            "groups",
            [](const AdamW& adamw) {
                py::list groups;
                for (const ParameterGroup& g : adamw.groups()) {
                    py::dict group;
                    group["params"] = g.parameters;
                    group["lr_scale"] = g.lr_scale;
                    group["weight_decay"] = g.weight_decay;
                    groups.append(group);
                }
                return groups;
            },
            "the groups as dicts: params, lr_scale, weight_decay")
        .def(
            "step",
            [](AdamW& adamw, double lr) {
                py::gil_scoped_release release;
                adamw.step(lr);
            },
            py::arg("lr"))
        .def_property_readonly("steps", &AdamW::steps);
    m.def(
        "clip_grad_norm",
        [](const py::object& parameters, double max_norm) {
            // one tensor alone is a list of one, as in PyTorch's clip_grad_norm_ (taken as a sequence
            // it would give its rows, whose gradients are not the tensor's)
            return clip_grad_norm(py::isinstance<Tensor>(parameters)
                                      ? std::vector<Tensor>{parameters.cast<Tensor>()}
                                      : tensor_list(parameters, "clip_grad_norm: parameters"),
                                  max_norm);
        },
        py::arg("parameters"), py::arg("max_norm"));

    m.def(
        "set_threads",
        [](int threads) {
            if (threads < 1 || threads > 1024) {  // the bounds of training.threads
                throw std::invalid_argument("set_threads: the thread count must be in [1, 1024], got " +
                                            std::to_string(threads));
            }
            omp_set_num_threads(threads);
        },
        py::arg("threads"), "The threads the ops use from now on, as --threads (training sets training.threads)");
    m.def(
        "threads", [] { return omp_get_max_threads(); }, "The threads the ops use");
    m.def(
        "memory_stats",
        [](const std::string& device) {
            const MemoryStats stats = memory_stats(parse_device(device));
            py::dict result;
            result["live_bytes"] = stats.live_bytes;
            result["peak_live_bytes"] = stats.peak_live_bytes;
            result["cached_bytes"] = stats.cached_bytes;
            return result;
        },
        py::arg("device") = "cpu", "Bytes of tensor storage alive now and at most since reset_peak_memory()");
    m.def(
        "reset_peak_memory", [](const std::string& device) { reset_peak_memory(parse_device(device)); },
        py::arg("device") = "cpu");
}

}  // namespace relgrad::python
