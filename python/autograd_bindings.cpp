// relgrad's Python module: autograd (Node, no_grad, is_grad_enabled, topological_order) and
// gradcheck.
#include <optional>
#include <string>
#include <vector>

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include "engine/autograd.hpp"
#include "engine/errors.hpp"
#include "engine/gradcheck.hpp"
#include "python/bindings.hpp"

namespace relgrad::python {

namespace {

struct NoGradContext {
    std::optional<NoGradGuard> guard;
};

}  // namespace

void bind_autograd(py::module_& m) {
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
                RELGRAD_CHECK(!n.released, "Node.backward: a backward pass already freed this node");
                RELGRAD_CHECK(grad_output.shape() == n.output_shape && grad_output.dtype() == n.output_dtype &&
                                  grad_output.device() == n.output_device,
                              "Node.backward: ", n.op_name, " made a tensor of shape ", shape_str(n.output_shape), " (",
                              dtype_name(n.output_dtype), ", ", device_name(n.output_device), "); grad_output is ",
                              shape_str(grad_output.shape()), " (", dtype_name(grad_output.dtype()), ", ",
                              device_name(grad_output.device()), ")");
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
}

}  // namespace relgrad::python
