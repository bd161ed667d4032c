// Reductions over dims. The kernel always keeps the reduced dims (size 1), so the backward can
// broadcast g straight back over them; keepdim = false is a view that drops them.
#include <algorithm>

#include "engine/autograd.hpp"
#include "engine/backend/backend.hpp"
#include "engine/errors.hpp"
#include "engine/ops.hpp"
#include "engine/ops/common.hpp"
#include "engine/profile.hpp"

namespace relgrad {

// Sorted, de-duplicated, non-negative dims; {} means every dim.
static std::vector<int64_t> normalize_dims(const Tensor& x, std::vector<int64_t> dims, const char* op) {
    if (dims.empty()) {
        for (int64_t d = 0; d < x.dim(); ++d) dims.push_back(d);
        return dims;
    }
    for (int64_t& d : dims) d = wrap_dim(d, x.dim(), op);
    std::sort(dims.begin(), dims.end());
    RELGRAD_CHECK(std::adjacent_find(dims.begin(), dims.end()) == dims.end(), op, ": a dim is repeated");
    return dims;
}

static Shape kept_shape(const Shape& shape, const std::vector<int64_t>& dims) {
    Shape kept = shape;
    for (int64_t d : dims) kept[d] = 1;
    return kept;
}

static Shape dropped_shape(const Shape& shape, const std::vector<int64_t>& dims) {
    Shape dropped;
    for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
        if (!std::binary_search(dims.begin(), dims.end(), d)) dropped.push_back(shape[d]);
    }
    return dropped;
}

static Tensor reduce_kernel(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, const char* name) {
    require_floating(x, name);
    Tensor out = empty(kept_shape(x.shape(), dims), x.dtype(), x.device());
    backend_for(x.device()).reduce(op, x, dims, out);
    return out;
}

// y = sum_{dims} x            dx = g broadcast back over the reduced dims
Tensor sum(const Tensor& x, std::vector<int64_t> dims_in, bool keepdim) {
    const ProfileScope profiled("sum");
    const std::vector<int64_t> dims = normalize_dims(x, std::move(dims_in), "sum");
    Tensor y = reduce_kernel(ReduceOp::sum, x, dims, "sum");
    const Shape kept = y.shape();
    y = record(y, "sum", {x}, [kept, shape = x.shape()](const Tensor& g) {
        return std::vector<Tensor>{g.reshape(kept).expand(shape)};
    });
    return keepdim ? y : y.reshape(dropped_shape(x.shape(), dims));
}

// y = sum_{dims} x / n        (n = number of elements reduced; autograd goes through sum and mul)
Tensor mean(const Tensor& x, std::vector<int64_t> dims_in, bool keepdim) {
    const ProfileScope profiled("mean");
    const std::vector<int64_t> dims = normalize_dims(x, std::move(dims_in), "mean");
    // 16 bits: the sum and the division in float32, the mean rounded once (1 / count itself has no
    // 16-bit value for most counts)
    if (is_16_bit(x.dtype())) return mean(x.to(DType::float32), dims, keepdim).to(x.dtype());
    int64_t count = 1;
    for (int64_t d : dims) count *= x.shape()[d];
    return mul(sum(x, dims, keepdim), scalar(1.0 / static_cast<double>(count), x.dtype(), x.device()));
}

// y = max_{dims} x            dx = g [x == y] / (number of tied maxima)
Tensor max(const Tensor& x, std::vector<int64_t> dims_in, bool keepdim) {
    const ProfileScope profiled("max");
    const std::vector<int64_t> dims = normalize_dims(x, std::move(dims_in), "max");
    for (int64_t d : dims) {
        RELGRAD_CHECK(x.shape()[d] != 0, "max: cannot reduce over the empty dim ", d, " of shape ",
                      shape_str(x.shape()));
    }
    Tensor y = reduce_kernel(ReduceOp::max, x, dims, "max");
    y = record(y, "max", {x}, {{"x", x}, {"y", y}}, [x = x.detach(), y = y.detach(), dims](const Tensor& g) {
        Tensor is_max = empty(x.shape(), x.dtype(), x.device());
        backend_for(x.device()).binary(BinaryOp::equal, x, y, is_max);
        const Tensor ties = sum(is_max, dims, /*keepdim=*/true);
        return std::vector<Tensor>{div(mul(g.reshape(y.shape()), is_max), ties)};
    });
    return keepdim ? y : y.reshape(dropped_shape(x.shape(), dims));
}

}  // namespace relgrad
