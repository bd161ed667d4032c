// Neural-network ops: softmax family, layer norm, dropout, cross-entropy.
#include <limits>
#include <stdexcept>
#include <string>

#include "engine/autograd.hpp"
#include "engine/backend/backend.hpp"
#include "engine/errors.hpp"
#include "engine/ops.hpp"
#include "engine/ops/common.hpp"
#include "engine/profile.hpp"

namespace relgrad {

// The backend normalises over the last dim of a contiguous tensor: move `dim` there and back.
static Tensor softmax_kernel(const Tensor& x, int64_t dim, bool log, const char* name) {
    RELGRAD_CHECK(x.dim() > 0, name, ": needs a tensor of rank >= 1");
    require_floating(x, name);
    NoGradGuard views_only;
    const Tensor moved = x.transpose(dim, -1).contiguous();
    Tensor out = empty(moved.shape(), x.dtype(), x.device());
    backend_for(x.device()).softmax_last_dim(moved, log, out);
    return out.transpose(dim, -1);
}

// y_i = exp(x_i - m) / sum_j exp(x_j - m), m = max_j x_j (stable; an all -inf row gives 0)
// dx = y (g - sum_j g_j y_j)
// 16 bits: the kernel forms the sums in float32 and rounds y once; the backward widens y and g
// (the graph keeps only the 16-bit y)
Tensor softmax(const Tensor& x, int64_t dim) {
    const ProfileScope profiled("softmax");
    dim = wrap_dim(dim, x.dim(), "softmax");
    Tensor y = softmax_kernel(x, dim, false, "softmax");
    return record(y, "softmax", {x}, {{"y", y}}, [y = y.detach(), dim](const Tensor& g) {
        const DType c = statistics_dtype(g.dtype());
        const Tensor yc = y.to(c), gc = g.to(c);
        return std::vector<Tensor>{mul(yc, sub(gc, sum(mul(gc, yc), {dim}, true))).to(g.dtype())};
    });
}

// y_i = x_i - m - log sum_j exp(x_j - m)   (an all -inf row gives -inf)
// dx = g - softmax(x) sum_j g_j = g - exp(y) sum_j g_j, and 0 where y = -inf (a masked entry gets
// no gradient, as in softmax). 16 bits as in softmax.
Tensor log_softmax(const Tensor& x, int64_t dim) {
    const ProfileScope profiled("log_softmax");
    dim = wrap_dim(dim, x.dim(), "log_softmax");
    Tensor y = softmax_kernel(x, dim, true, "log_softmax");
    return record(y, "log_softmax", {x}, {{"y", y}}, [y = y.detach(), dim](const Tensor& g) {
        const DType c = statistics_dtype(g.dtype());
        const Tensor yc = y.to(c), gc = g.to(c);
        const Tensor dx = sub(gc, mul(exp(yc), sum(gc, {dim}, true)));
        return std::vector<Tensor>{
            where(equals(yc, -std::numeric_limits<double>::infinity()), scalar_like(gc, 0), dx).to(g.dtype())};
    });
}

// Over the last dim (D): xhat = (x - mean) * rstd, rstd = 1 / sqrt(var + eps), y = xhat w + b.
// Backward, with gh = g w (the gradient at xhat) and means over the last dim:
//   dx = rstd (gh - mean(gh) - xhat mean(gh xhat)),  dw = sum g xhat,  db = sum g
// (the two mean terms are the paths through the mean and through the variance).
// The graph keeps x (an input anyway) and the per-row mean and rstd; the backward recomputes
// xhat from them, with the forward's operations (so the same values). 16 bits: all of it in
// float32 (statistics_dtype), the results rounded once.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
    const ProfileScope profiled("layer_norm");
    RELGRAD_CHECK(x.dim() > 0, "layer_norm: needs a tensor of rank >= 1");
    const Shape param_shape{x.size(-1)};
    RELGRAD_CHECK(weight.shape() == param_shape && bias.shape() == param_shape, "layer_norm: weight ",
                  shape_str(weight.shape()), " and bias ", shape_str(bias.shape()), " must both be ",
                  shape_str(param_shape), " for an input of shape ", shape_str(x.shape()));
    RELGRAD_CHECK(eps > 0, "layer_norm: eps must be positive, got ", std::to_string(eps));
    RELGRAD_CHECK(weight.dtype() == x.dtype() && bias.dtype() == x.dtype(), "layer_norm: weight ",
                  dtype_name(weight.dtype()), " and bias ", dtype_name(bias.dtype()), " must have the input's dtype ",
                  dtype_name(x.dtype()));
    require_same_device({x, weight, bias}, "layer_norm");
    const DType c = statistics_dtype(x.dtype());
    Tensor mu, rstd, y;
    {
        NoGradGuard forward_only;
        const Tensor xc = x.to(c);
        mu = mean(xc, {-1}, true);
        const Tensor centered = sub(xc, mu);
        rstd = div(scalar(1, c, x.device()),
                   sqrt(add(mean(mul(centered, centered), {-1}, true), scalar(eps, c, x.device()))));
        y = add(mul(mul(centered, rstd), weight.to(c)), bias.to(c)).to(x.dtype());
    }
    return record(y, "layer_norm", {x, weight, bias}, {{"x", x}, {"weight", weight}},
                  [x = x.detach(), mu, rstd, weight = weight.detach(), c](const Tensor& g) {
                      const Tensor xhat = mul(sub(x.to(c), mu), rstd);
                      const Tensor gc = g.to(c);
                      const Tensor gh = mul(gc, weight.to(c));
                      const Tensor dx =
                          mul(rstd, sub(sub(gh, mean(gh, {-1}, true)), mul(xhat, mean(mul(gh, xhat), {-1}, true))));
                      return std::vector<Tensor>{dx.to(x.dtype()), sum_to(mul(gc, xhat), weight.shape()).to(x.dtype()),
                                                 sum_to(gc, weight.shape()).to(x.dtype())};
                  });
}

// y = residual + x * m / (1 - p), m_i ~ Bernoulli(1 - p): the mask is a pure function of Philox
// blocks that gen hands out (engine/random.hpp), drawn by the kernel on x's device. The backward
// draws the same mask again instead of keeping it: dx = g * m / (1 - p), d residual = g (itself
// this op, so a gradient of the gradient follows too).
static Tensor masked(const Tensor& residual, const Tensor& x, const DropoutMask& mask) {
    Tensor y = empty(x.shape(), x.dtype(), x.device());
    {
        NoGradGuard kernel_only;  // contiguous() copies belong to the kernel, not the graph
        backend_for(x.device()).dropout(x.contiguous(), residual.defined() ? residual.contiguous() : residual, mask, y);
    }
    if (!residual.defined()) {
        return record(y, "dropout", {x}, [mask](const Tensor& g) {
            return std::vector<Tensor>{masked(Tensor(), g, mask)};
        });
    }
    return record(y, "dropout", {residual, x}, [mask](const Tensor& g) {
        return std::vector<Tensor>{g, masked(Tensor(), g, mask)};
    });
}

Tensor dropout_add(const Tensor& residual, const Tensor& x, double p, bool training, Generator& gen) {
    const ProfileScope profiled("dropout");
    RELGRAD_CHECK(p >= 0 && p <= 1, "dropout: p must be in [0, 1], got ", std::to_string(p));
    require_floating(x, "dropout");
    if (residual.defined()) {
        RELGRAD_CHECK(residual.shape() == x.shape() && residual.dtype() == x.dtype(),
                      "dropout_add: the residual is ", dtype_name(residual.dtype()), " ", shape_str(residual.shape()),
                      ", x is ", dtype_name(x.dtype()), " ", shape_str(x.shape()));
        require_same_device({residual, x}, "dropout_add");
    }
    if (!training || p == 0) return residual.defined() ? add(residual, x) : x;
    return masked(residual, x, draw_dropout_mask(gen, p, x.numel()));
}

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
    return dropout_add(Tensor(), x, p, training, gen);
}

// loss = -(1/n) sum_{t_i != ignore} log_softmax(logits)[i, t_i],  n = number of targets kept
// (autograd through log_softmax, gather and where; an ignored row gets no gradient), or without
// the 1/n (Reduction::sum). All on the logits' device: the gather kernel checks the targets that
// are not ignored.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index, Reduction reduction) {
    const ProfileScope profiled("cross_entropy");
    RELGRAD_CHECK(logits.dim() == 2 && target.dim() == 1 && target.size(0) == logits.size(0),
                  "cross_entropy: expects logits [N, C] and target [N], got ", shape_str(logits.shape()), " and ",
                  shape_str(target.shape()));
    RELGRAD_CHECK(target.dtype() == DType::int64, "cross_entropy: target must be int64, got ",
                  dtype_name(target.dtype()));
    require_floating(logits, "cross_entropy");
    require_same_device({logits, target}, "cross_entropy");
    // see ops.hpp, 16 bits: the loss is a statistic, computed and returned in float32
    if (is_16_bit(logits.dtype())) return cross_entropy(logits.to(DType::float32), target, ignore_index, reduction);
    const int64_t N = logits.size(0), C = logits.size(1);
    const Tensor column = target.reshape({N, 1});
    // int64 1 where ignored; ignore_index made on the host, exact (a double cannot hold every int64)
    Tensor ignore = empty({}, DType::int64);
    *ignore.data<int64_t>() = ignore_index;
    Tensor ignored = empty_like(column);
    backend_for(column.device()).binary(BinaryOp::equal, column, ignore.to(column.device()), ignored);
    Tensor safe_target = empty_like(column);  // 0 where ignored (the where kernel: int64 has no autograd)
    backend_for(column.device()).where(ignored, scalar_like(column, 0), column, safe_target);
    Tensor picked;
    try {
        picked = gather(log_softmax(logits, 1), 1, safe_target);
    } catch (const std::invalid_argument& e) {
        throw std::invalid_argument("cross_entropy: a target is outside [0, " + std::to_string(C) +
                                    ") and is not ignore_index " + std::to_string(ignore_index) + " (" + e.what() +
                                    ")");
    }
    const Tensor kept_picked = where(ignored, scalar_like(logits, 0), picked);
    if (reduction == Reduction::sum) return mul(sum(kept_picked), scalar_like(logits, -1));
    // -1/n in float64 (n at least 1), then in the logits' dtype
    const Tensor count = sum(equals(ignored.to(DType::float64), 0));
    const Tensor factor =
        div(scalar(-1, DType::float64, logits.device()), clamp(count, 1, std::numeric_limits<double>::infinity()));
    return mul(sum(kept_picked), factor.to(logits.dtype()));
}

}  // namespace relgrad
