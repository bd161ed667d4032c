// Matrix products through BLAS.
#include "engine/autograd.hpp"
#include "engine/backend/backend.hpp"
#include "engine/errors.hpp"
#include "engine/ops.hpp"
#include "engine/ops/common.hpp"
#include "engine/profile.hpp"

namespace relgrad {

// Y = A B   ([..., M, K] @ [..., K, N] -> [..., M, N], batch dims broadcast)
// dA = G B^T, dB = A^T G, each summed over the batch dims that broadcasting stretched.
// The transposes are views: BLAS reads them in place with its transpose flag, nothing is copied.
Tensor matmul(const Tensor& a, const Tensor& b) {
    const ProfileScope profiled("matmul");
    RELGRAD_CHECK(a.defined() && b.defined(), "matmul: undefined tensor");
    require_same_device({a, b}, "matmul");
    RELGRAD_CHECK(a.dim() > 0 && b.dim() > 0, "matmul: needs tensors of rank >= 1, got shapes ", shape_str(a.shape()),
                  " and ", shape_str(b.shape()));
    // A vector is a one-row (left) or one-column (right) matrix whose extra dim is dropped.
    if (a.dim() == 1) return matmul(a.unsqueeze(0), b).squeeze(-2);
    if (b.dim() == 1) return matmul(a, b.unsqueeze(-1)).squeeze(-1);
    RELGRAD_CHECK(a.dtype() == b.dtype() && is_floating(a.dtype()),
                  "matmul: needs two float tensors of one dtype, got ", dtype_name(a.dtype()), " ",
                  shape_str(a.shape()), " and ", dtype_name(b.dtype()), " ", shape_str(b.shape()));
    const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
    RELGRAD_CHECK(b.size(-2) == K, "matmul: shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()),
                  " do not align (inner dims ", K, " and ", b.size(-2), ")");
    const Shape batch = broadcast_shapes(Shape(a.shape().begin(), a.shape().end() - 2),
                                         Shape(b.shape().begin(), b.shape().end() - 2), "matmul");
    auto with_matrix = [&batch](int64_t rows, int64_t cols) {
        Shape s = batch;
        s.push_back(rows);
        s.push_back(cols);
        return s;
    };
    Tensor y = empty(with_matrix(M, N), a.dtype(), a.device());
    {
        NoGradGuard views_only;  // the expands below are internal views, not graph nodes
        backend_for(a.device()).batched_gemm(a.expand(with_matrix(M, K)), b.expand(with_matrix(K, N)), y);
    }
    return record(y, "matmul", {a, b}, {{"a", a}, {"b", b}}, [a = a.detach(), b = b.detach()](const Tensor& g) {
        return std::vector<Tensor>{sum_to(matmul(g, b.transpose(-1, -2)), a.shape()),
                                   sum_to(matmul(a.transpose(-1, -2), g), b.shape())};
    });
}

}  // namespace relgrad
