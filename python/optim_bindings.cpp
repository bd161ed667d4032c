// relgrad's Python module: the optimizer (AdamW, engine/optim.hpp) and gradient clipping.
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include "engine/optim.hpp"
#include "python/bindings.hpp"

namespace relgrad::python {

namespace {

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

void bind_optim(py::module_& m) {
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
}

}  // namespace relgrad::python
