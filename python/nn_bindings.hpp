// relgrad.nn's bindings, in three files by family, and what they share:
//   nn_bindings.cpp            Module, the basic layers, positions, masks
//   nn_attention_bindings.cpp  multi-head attention, relative (Shaw) and gated
//   nn_model_bindings.cpp      the Transformer blocks and the models
// Every layer is built from its positional sizes and keyword options (nn_options.hpp), plus seed
// (its parameters are drawn from it) and dtype; calling a layer runs its forward. Child layers
// and parameters are attributes under the C++ names, which are also the names of
// named_parameters() and state_dict().
#pragma once

#include <optional>
#include <stdexcept>
#include <vector>

#include <pybind11/stl.h>

#include "layers/module.hpp"
#include "python/bindings.hpp"

namespace relgrad::python {

constexpr auto kChild = py::return_value_policy::reference_internal;

template <class Layer>
using LayerClass = py::class_<Layer, Module>;

// Child layer and tensor attributes, on a layer class of any base.
template <class Layer, class... Bases, class Child>
void child(py::class_<Layer, Bases...>& layer, const char* name, Child Layer::*member) {
    layer.def_property_readonly(
        name, [member](Layer& self) -> Child& { return self.*member; }, kChild);
}
template <class Layer, class... Bases>
void tensor_attribute(py::class_<Layer, Bases...>& layer, const char* name, Tensor Layer::*member) {
    layer.def_property_readonly(name, [member](const Layer& self) { return tensor_or_none(self.*member); });
}

void bind_attention(py::module_& nn);
void bind_models(py::module_& nn);

}  // namespace relgrad::python
