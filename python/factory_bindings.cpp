// relgrad's Python module: the factories (zeros, ones, full, arange, randn, rand, zeros_like,
// ones_like).
#include <string>

#include <pybind11/stl.h>

#include "engine/ops.hpp"
#include "python/bindings.hpp"

namespace relgrad::python {

void bind_factories(py::module_& m) {
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
}

}  // namespace relgrad::python
