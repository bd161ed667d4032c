// relgrad's Python module, relgrad._relgrad; python/relgrad/__init__.py re-exports it as relgrad.
//
// An engine error raises a Python exception carrying the engine's message: bad input
// (std::invalid_argument) a ValueError, an index out of range an IndexError, anything else a
// RuntimeError (a file system error as "PATH: the reason", not in libstdc++'s words); the long calls (backward, the
// models' forward, training, evaluation) release the GIL.
#include <filesystem>

#include "engine/system.hpp"
#include "python/bindings.hpp"

PYBIND11_MODULE(_relgrad, module) {
    module.doc() = "relgrad: a reverse-mode autograd engine and Transformer layers with relative positions";
    pybind11::register_exception_translator([](std::exception_ptr error) {
        try {
            if (error) std::rethrow_exception(error);
        } catch (const std::filesystem::filesystem_error& e) {
            PyErr_SetString(PyExc_RuntimeError, relgrad::filesystem_error_line(e).c_str());
        }
    });
    relgrad::python::bind_tensor(module);
    relgrad::python::bind_factories(module);
    relgrad::python::bind_ops(module);
    relgrad::python::bind_autograd(module);
    relgrad::python::bind_optim(module);
    relgrad::python::bind_nn(module);
    relgrad::python::bind_run(module);
}
