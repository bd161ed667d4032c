// Indexing ops: reads at integer positions and their adjoints, the adds at the same positions.
// gather <-> scatter_add and index_select <-> index_add are each other's backward.
#include "engine/autograd.hpp"
#include "engine/backend/backend.hpp"
#include "engine/errors.hpp"
#include "engine/ops.hpp"
#include "engine/ops/common.hpp"
#include "engine/profile.hpp"

namespace relgrad {

static void check_index(const Tensor& x, const Tensor& index, const char* op) {
    RELGRAD_CHECK(index.dtype() == DType::int64, op, ": the index must be int64, got ", dtype_name(index.dtype()));
    require_same_device({x, index}, op);
}

// index has x's rank and fits inside x on every dim but `dim`
static void check_gather_shapes(const Tensor& x, int64_t dim, const Tensor& index, const char* op) {
    bool fits = index.dim() == x.dim();
    for (int64_t d = 0; fits && d < x.dim(); ++d) fits = d == dim || index.shape()[d] <= x.shape()[d];
    RELGRAD_CHECK(fits, op, ": index of shape ", shape_str(index.shape()), " does not fit the input of shape ",
                  shape_str(x.shape()), " outside dim ", dim);
}

// y[i][j] = x[i][index[i][j]]             (dim = 1)
// dx[i][index[i][j]] += g[i][j]           (a scatter_add of g into zeros)
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
    const ProfileScope profiled("gather");
    check_index(x, index, "gather");
    require_floating(x, "gather");
    dim = wrap_dim(dim, x.dim(), "gather");
    check_gather_shapes(x, dim, index, "gather");
    Tensor y = empty(index.shape(), x.dtype(), x.device());
    backend_for(x.device()).gather(x, dim, index, y);
    return record(y, "gather", {x}, {{"index", index}}, [shape = x.shape(), dim, index](const Tensor& g) {
        Tensor dx = zeros(shape, g.dtype(), g.device());
        backend_for(g.device()).scatter_add(dx, dim, index, g);
        return std::vector<Tensor>{dx};
    });
}

// y = x; y[i][index[i][j]] += src[i][j]   (dim = 1)
// dx = g, dsrc[i][j] = g[i][index[i][j]]  (a gather of g)
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
    const ProfileScope profiled("scatter_add");
    check_index(x, index, "scatter_add");
    require_floating(x, "scatter_add");
    dim = wrap_dim(dim, x.dim(), "scatter_add");
    check_gather_shapes(x, dim, index, "scatter_add");
    require_same_device({x, src}, "scatter_add");
    RELGRAD_CHECK(src.shape() == index.shape() && src.dtype() == x.dtype(), "scatter_add: src ", shape_str(src.shape()),
                  " (", dtype_name(src.dtype()), ") must have the index's shape ", shape_str(index.shape()),
                  " and the input's dtype ", dtype_name(x.dtype()));
    Tensor y = empty(x.shape(), x.dtype(), x.device());
    backend_for(x.device()).copy(x, y);
    backend_for(x.device()).scatter_add(y, dim, index, src);
    return record(y, "scatter_add", {x, src}, {{"index", index}}, [dim, index](const Tensor& g) {
        Tensor dsrc = empty(index.shape(), g.dtype(), g.device());
        backend_for(g.device()).gather(g, dim, index, dsrc);
        return std::vector<Tensor>{g, dsrc};
    });
}

// y = x[..., index[n], ...] along dim    dx[..., index[n], ...] += g[..., n, ...]
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
    const ProfileScope profiled("index_select");
    check_index(x, index, "index_select");
    require_floating(x, "index_select");
    RELGRAD_CHECK(index.dim() == 1, "index_select: the index must be 1-d, got shape ", shape_str(index.shape()));
    dim = wrap_dim(dim, x.dim(), "index_select");
    Shape shape = x.shape();
    shape[dim] = index.numel();
    Tensor y = empty(shape, x.dtype(), x.device());
    backend_for(x.device()).index_select(x, dim, index, y);
    return record(y, "index_select", {x}, {{"index", index}}, [shape = x.shape(), dim, index](const Tensor& g) {
        Tensor dx = zeros(shape, g.dtype(), g.device());
        backend_for(g.device()).index_add(dx, dim, index, g);
        return std::vector<Tensor>{dx};
    });
}

// y[s..., :] = weight[ids[s...], :]  (an index_select of rows; its backward adds g's rows back)
Tensor embedding(const Tensor& weight, const Tensor& ids) {
    const ProfileScope profiled("embedding");
    RELGRAD_CHECK(weight.dim() == 2, "embedding: the weight must be [V, D], got shape ", shape_str(weight.shape()));
    check_index(weight, ids, "embedding");
    Shape out_shape = ids.shape();
    out_shape.push_back(weight.size(1));
    return index_select(weight, 0, ids.reshape({-1})).reshape(out_shape);
}

}  // namespace relgrad
