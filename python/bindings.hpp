// relgrad's Python module (relgrad._relgrad): what its files share. The module is thin: every
// function calls the C++ engine, layers or trainer, which stay the one implementation.
//
//   tensor_bindings.cpp   Tensor, the dtypes, NumPy in and out, the shapes Python passes
//   factory_bindings.cpp  zeros, ones, full, arange, randn, rand, zeros_like, ones_like
//   op_bindings.cpp       the ops (engine/ops.hpp), and the threads and memory they run with
//   autograd_bindings.cpp Node, no_grad, topological_order, gradcheck
//   optim_bindings.cpp    AdamW, LRScheduler and clip_grad_norm
//   nn_*.cpp              relgrad.nn: the layers, masks and models (nn_bindings.hpp), their
//                         keyword options (nn_options.hpp)
//   run_bindings.cpp      training from a config, and the commands on a trained run
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "engine/tensor.hpp"

namespace relgrad::python {

namespace py = pybind11;

// A relgrad dtype from a DType, a name ("float32", "float64", "int64", "bool") or a NumPy dtype.
DType dtype_from(const py::handle& value);
// A device from its name ("cpu", "guarded_cpu", "cuda").
Device device_from(const py::handle& value);
// A new CPU tensor with the values of a NumPy array, a (nested) list or a Python number. The
// dtype, when none is given, follows NumPy's (float16 becomes float32); a list or number of
// floats gives float32, as torch.tensor does.
Tensor tensor_from(const py::handle& data, const py::handle& dtype, bool requires_grad, const py::handle& device);
// The tensor's elements as a NumPy array over the same memory (no copy): the array holds the
// storage alive. Read-only when writing would go around autograd (the tensor requires a
// gradient) or write several elements at once (a broadcast view). CPU tensors only.
py::array to_numpy(const Tensor& tensor);
// An undefined tensor as None.
py::object tensor_or_none(const Tensor& tensor);
// A shape from an int or a sequence of ints.
Shape shape_from(const py::handle& value);
// A shape from a function's arguments: view(2, 3) and view((2, 3)) alike.
Shape shape_from_args(const py::args& args);
// The dims of a reduction: None (all of them), an int or a sequence of ints.
std::vector<int64_t> dims_from(const py::handle& value);

void bind_tensor(py::module_& module);
void bind_factories(py::module_& module);
void bind_ops(py::module_& module);
void bind_autograd(py::module_& module);
void bind_optim(py::module_& module);
void bind_nn(py::module_& module);
void bind_run(py::module_& module);

}  // namespace relgrad::python
