// Helpers shared by the op files (not part of the public API).
#pragma once

#include <vector>

#include "engine/backend/backend.hpp"
#include "engine/errors.hpp"
#include "engine/tensor.hpp"

namespace relgrad {

// Throws "<op>: needs a floating tensor (float32, float64, bfloat16 or float16), got int64".
inline void require_floating(const Tensor& x, const char* op) {
    RELGRAD_CHECK(is_floating(x.dtype()), op, ": needs a floating tensor (", names_in_words(floating_dtype_names),
                  "), got ", dtype_name(x.dtype()));
}

// Every op computes on its inputs' device: throws "<op>: operands on different devices: cpu [2, 3]
// and guarded_cpu [3]" unless every defined tensor is on the first one's device.
inline void require_same_device(const std::vector<Tensor>& tensors, const char* op) {
    const Tensor* first = nullptr;
    for (const Tensor& t : tensors) {
        if (!t.defined()) continue;
        if (!first) {
            first = &t;
            continue;
        }
        RELGRAD_CHECK(t.device() == first->device(), op,
                      ": operands on different devices: ", device_name(first->device()), " ", shape_str(first->shape()),
                      " and ", device_name(t.device()), " ", shape_str(t.shape()));
    }
}

// 1 where x == value, else 0, in x's dtype (no autograd: used inside backward functions).
inline Tensor equals(const Tensor& x, double value) {
    Tensor out = empty(x.shape(), x.dtype(), x.device());
    backend_for(x.device()).binary(BinaryOp::equal, x, scalar_like(x, value), out);
    return out;
}

}  // namespace relgrad
