// Helpers shared by the op files (not part of the public API).
#pragma once

#include <stdexcept>
#include <string>

#include "engine/backend/backend.hpp"
#include "engine/tensor.hpp"

namespace relgrad {

// Throws "<op>: needs a float32 or float64 tensor, got int64".
inline void require_floating(const Tensor& x, const char* op) {
    if (!is_floating(x.dtype())) {
        throw std::invalid_argument(std::string(op) + ": needs a float32 or float64 tensor, got " +
                                    dtype_name(x.dtype()));
    }
}

// A 0-d tensor of t's dtype.
inline Tensor like_scalar(double value, const Tensor& t) { return scalar(value, t.dtype()); }

// 1 where x == value, else 0, in x's dtype (no autograd: used inside backward functions).
inline Tensor equals(const Tensor& x, double value) {
    Tensor out = empty(x.shape(), x.dtype());
    backend_for(x.device()).binary(BinaryOp::equal, x, like_scalar(value, x), out);
    return out;
}

}  // namespace relgrad
