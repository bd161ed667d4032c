// Ops that assemble new tensors from several (the views themselves live on Tensor).
#include "engine/autograd.hpp"
#include "engine/backend/backend.hpp"
#include "engine/errors.hpp"
#include "engine/ops.hpp"
#include "engine/ops/common.hpp"
#include "engine/profile.hpp"

namespace relgrad {

// y = [x_0; x_1; ...] along dim      dx_i = the slice of g that x_i filled
Tensor concat(const std::vector<Tensor>& tensors, int64_t dim) {
    const ProfileScope profiled("concat");
    RELGRAD_CHECK(!tensors.empty(), "concat: no tensors given");
    const Tensor& first = tensors[0];
    dim = wrap_dim(dim, first.dim(), "concat");
    require_same_device(tensors, "concat");
    Shape out_shape = first.shape();
    out_shape[dim] = 0;
    for (const Tensor& t : tensors) {
        Shape expected = first.shape();
        expected[dim] = t.dim() == first.dim() ? t.shape()[dim] : -1;
        RELGRAD_CHECK(t.shape() == expected && t.dtype() == first.dtype(), "concat: tensor ", shape_str(t.shape()),
                      " (", dtype_name(t.dtype()), ") does not match ", shape_str(first.shape()), " (",
                      dtype_name(first.dtype()), ") outside dim ", dim);
        out_shape[dim] += t.shape()[dim];
    }
    Tensor y = empty(out_shape, first.dtype(), first.device());
    std::vector<int64_t> starts;
    {
        NoGradGuard views_only;
        int64_t start = 0;
        for (const Tensor& t : tensors) {
            Tensor window = y.narrow(dim, start, t.shape()[dim]);
            backend_for(t.device()).copy(t, window);
            starts.push_back(start);
            start += t.shape()[dim];
        }
    }
    std::vector<int64_t> lengths;
    for (const Tensor& t : tensors) lengths.push_back(t.shape()[dim]);
    return record(y, "concat", tensors, [dim, starts, lengths](const Tensor& g) {
        std::vector<Tensor> grads;
        for (std::size_t i = 0; i < starts.size(); ++i) grads.push_back(g.narrow(dim, starts[i], lengths[i]));
        return grads;
    });
}

// y = concat of the x_i each given a new size-1 dim at `dim` (autograd through unsqueeze/concat)
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
    const ProfileScope profiled("stack");
    RELGRAD_CHECK(!tensors.empty(), "stack: no tensors given");
    std::vector<Tensor> unsqueezed;
    for (const Tensor& t : tensors) {
        RELGRAD_CHECK(t.shape() == tensors[0].shape(), "stack: shapes ", shape_str(tensors[0].shape()), " and ",
                      shape_str(t.shape()), " differ");
        unsqueezed.push_back(t.unsqueeze(wrap_dim(dim, t.dim() + 1, "stack")));
    }
    return concat(unsqueezed, dim);
}

}  // namespace relgrad
