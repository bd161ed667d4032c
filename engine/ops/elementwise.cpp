// Elementwise ops. Each block: the forward (one backend kernel) and the backward, the local
// derivative times the incoming gradient g = dL/dy. Binary ops broadcast; their backward sums the
// gradient back to each input's own shape (sum_to).
#include <string>

#include "engine/autograd.hpp"
#include "engine/backend/backend.hpp"
#include "engine/errors.hpp"
#include "engine/ops.hpp"
#include "engine/ops/common.hpp"
#include "engine/profile.hpp"

namespace relgrad {

// ---------------------------------------------------------------- broadcasting

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
    const std::size_t rank = std::max(a.size(), b.size());
    Shape out(rank);
    for (std::size_t i = 0; i < rank; ++i) {
        // align from the right: a missing leading dim counts as size 1
        const int64_t da = i + a.size() >= rank ? a[i + a.size() - rank] : 1;
        const int64_t db = i + b.size() >= rank ? b[i + b.size() - rank] : 1;
        RELGRAD_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ", shape_str(b),
                      " cannot be broadcast together");
        out[i] = da == 1 ? db : da;
    }
    return out;
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
    if (g.shape() == shape) return g;
    const int64_t lead = g.dim() - static_cast<int64_t>(shape.size());
    std::vector<int64_t> dims;
    for (int64_t i = 0; i < g.dim(); ++i) {
        if (i < lead || (shape[i - lead] == 1 && g.shape()[i] != 1)) dims.push_back(i);
    }
    return sum(g, dims, /*keepdim=*/true).reshape(shape);
}

static void check_floating_pair(const Tensor& a, const Tensor& b, const char* op) {
    RELGRAD_CHECK(a.defined() && b.defined(), op, ": undefined tensor");
    RELGRAD_CHECK(a.dtype() == b.dtype(), op, ": dtype mismatch, ", dtype_name(a.dtype()), " ", shape_str(a.shape()),
                  " vs ", dtype_name(b.dtype()), " ", shape_str(b.shape()));
    require_floating(a, op);
    require_same_device({a, b}, op);
}

static Tensor binary_kernel(BinaryOp op, const Tensor& a, const Tensor& b, const char* name) {
    check_floating_pair(a, b, name);
    Tensor out = empty(broadcast_shapes(a.shape(), b.shape(), name), a.dtype(), a.device());
    backend_for(a.device()).binary(op, a, b, out);
    return out;
}

static Tensor unary_kernel(UnaryOp op, const Tensor& x, double p0 = 0, double p1 = 0) {
    Tensor out = empty(x.shape(), x.dtype(), x.device());
    backend_for(x.device()).unary(op, x, out, p0, p1);
    return out;
}

// ---------------------------------------------------------------- binary ops

// y = a + b          da = g, db = g
Tensor add(const Tensor& a, const Tensor& b) {
    const ProfileScope profiled("add");
    Tensor y = binary_kernel(BinaryOp::add, a, b, "add");
    return record(y, "add", {a, b}, [sa = a.shape(), sb = b.shape()](const Tensor& g) {
        return std::vector<Tensor>{sum_to(g, sa), sum_to(g, sb)};
    });
}

// y = a - b          da = g, db = -g
Tensor sub(const Tensor& a, const Tensor& b) {
    const ProfileScope profiled("sub");
    Tensor y = binary_kernel(BinaryOp::sub, a, b, "sub");
    return record(y, "sub", {a, b}, [sa = a.shape(), sb = b.shape()](const Tensor& g) {
        return std::vector<Tensor>{sum_to(g, sa), sum_to(neg(g), sb)};
    });
}

// y = a * b          da = g b, db = g a
Tensor mul(const Tensor& a, const Tensor& b) {
    const ProfileScope profiled("mul");
    Tensor y = binary_kernel(BinaryOp::mul, a, b, "mul");
    return record(y, "mul", {a, b}, {{"a", a}, {"b", b}}, [a = a.detach(), b = b.detach()](const Tensor& g) {
        return std::vector<Tensor>{sum_to(mul(g, b), a.shape()), sum_to(mul(g, a), b.shape())};
    });
}

// y = a / b          da = g / b, db = -g a / b^2 = -g y / b
Tensor div(const Tensor& a, const Tensor& b) {
    const ProfileScope profiled("div");
    Tensor y = binary_kernel(BinaryOp::div, a, b, "div");
    return record(y, "div", {a, b}, {{"b", b}, {"y", y}},
                  [sa = a.shape(), b = b.detach(), y = y.detach()](const Tensor& g) {
                      const Tensor g_over_b = div(g, b);
                      return std::vector<Tensor>{sum_to(g_over_b, sa), sum_to(neg(mul(g_over_b, y)), b.shape())};
                  });
}

// y = a^b            da = g b a^(b-1), db = g y log(a)
// (at b = 0, da = 0 even where a = 0; at a = 0, db = 0: the limits of the two formulas, not 0 * inf)
Tensor pow(const Tensor& a, const Tensor& b) {
    const ProfileScope profiled("pow");
    Tensor y = binary_kernel(BinaryOp::pow, a, b, "pow");
    const bool exponent_needs_grad = b.requires_grad();  // log(a) is only taken when it is
    return record(
        y, "pow", {a, b}, {{"a", a}, {"b", b}, {"y", y}},
        [a = a.detach(), b = b.detach(), y = y.detach(), exponent_needs_grad](const Tensor& g) {
            const Tensor zero = scalar_like(g, 0);
            const Tensor da = where(equals(b, 0), zero, mul(g, mul(b, pow(a, sub(b, scalar_like(b, 1))))));
            const Tensor db =
                exponent_needs_grad ? sum_to(where(equals(a, 0), zero, mul(g, mul(y, log(a)))), b.shape()) : Tensor();
            return std::vector<Tensor>{sum_to(da, a.shape()), db};
        });
}

// ---------------------------------------------------------------- unary ops

// y = x^p            dx = g p x^(p-1)   (0 for p = 0, even at x = 0)
Tensor pow(const Tensor& x, double p) {
    const ProfileScope profiled("pow_scalar");
    Tensor y = unary_kernel(UnaryOp::pow_scalar, x, p);
    return record(y, "pow_scalar", {x}, {{"x", x}}, [x = x.detach(), p](const Tensor& g) {
        if (p == 0) return std::vector<Tensor>{zeros_like(g)};
        return std::vector<Tensor>{mul(g, mul(scalar_like(x, p), pow(x, p - 1)))};
    });
}

// y = -x             dx = -g
Tensor neg(const Tensor& x) {
    const ProfileScope profiled("neg");
    Tensor y = unary_kernel(UnaryOp::neg, x);
    return record(y, "neg", {x}, [](const Tensor& g) { return std::vector<Tensor>{neg(g)}; });
}

// y = e^x            dx = g y
Tensor exp(const Tensor& x) {
    const ProfileScope profiled("exp");
    Tensor y = unary_kernel(UnaryOp::exp, x);
    return record(y, "exp", {x}, {{"y", y}},
                  [y = y.detach()](const Tensor& g) { return std::vector<Tensor>{mul(g, y)}; });
}

// y = ln x           dx = g / x
Tensor log(const Tensor& x) {
    const ProfileScope profiled("log");
    Tensor y = unary_kernel(UnaryOp::log, x);
    return record(y, "log", {x}, {{"x", x}},
                  [x = x.detach()](const Tensor& g) { return std::vector<Tensor>{div(g, x)}; });
}

// y = sqrt(x)        dx = g / (2 y)
Tensor sqrt(const Tensor& x) {
    const ProfileScope profiled("sqrt");
    Tensor y = unary_kernel(UnaryOp::sqrt, x);
    return record(y, "sqrt", {x}, {{"y", y}},
                  [y = y.detach()](const Tensor& g) { return std::vector<Tensor>{div(g, mul(scalar_like(y, 2), y))}; });
}

// y = tanh(x)        dx = g (1 - y^2)
Tensor tanh(const Tensor& x) {
    const ProfileScope profiled("tanh");
    Tensor y = unary_kernel(UnaryOp::tanh, x);
    return record(y, "tanh", {x}, {{"y", y}}, [y = y.detach()](const Tensor& g) {
        return std::vector<Tensor>{mul(g, sub(scalar_like(y, 1), mul(y, y)))};
    });
}

// y = 1 / (1 + e^-x)  dx = g y (1 - y)
Tensor sigmoid(const Tensor& x) {
    const ProfileScope profiled("sigmoid");
    Tensor y = unary_kernel(UnaryOp::sigmoid, x);
    return record(y, "sigmoid", {x}, {{"y", y}}, [y = y.detach()](const Tensor& g) {
        return std::vector<Tensor>{mul(g, mul(y, sub(scalar_like(y, 1), y)))};
    });
}

// y = max(x, 0)      dx = g [x > 0]
Tensor relu(const Tensor& x) {
    const ProfileScope profiled("relu");
    Tensor y = unary_kernel(UnaryOp::relu, x);
    return record(y, "relu", {x}, {{"x", x}}, [x = x.detach()](const Tensor& g) {
        return std::vector<Tensor>{mul(g, unary_kernel(UnaryOp::relu_grad, x))};
    });
}

// y = x Phi(x)       dx = g (Phi(x) + x phi(x)), Phi/phi the standard normal cdf/pdf
Tensor gelu(const Tensor& x) {
    const ProfileScope profiled("gelu");
    Tensor y = unary_kernel(UnaryOp::gelu, x);
    return record(y, "gelu", {x}, {{"x", x}}, [x = x.detach()](const Tensor& g) {
        return std::vector<Tensor>{mul(g, unary_kernel(UnaryOp::gelu_grad, x))};
    });
}

// y = min(max(x, low), high)   dx = g [low < x < high]
Tensor clamp(const Tensor& x, double low, double high) {
    const ProfileScope profiled("clamp");
    RELGRAD_CHECK(!(low > high), "clamp: low ", std::to_string(low), " is above high ", std::to_string(high));
    Tensor y = unary_kernel(UnaryOp::clamp, x, low, high);
    return record(y, "clamp", {x}, {{"x", x}}, [x = x.detach(), low, high](const Tensor& g) {
        return std::vector<Tensor>{mul(g, unary_kernel(UnaryOp::inside, x, low, high))};
    });
}

// ---------------------------------------------------------------- selection

// y = cond ? a : b   da = cond ? g : 0, db = cond ? 0 : g
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
    const ProfileScope profiled("where");
    check_floating_pair(a, b, "where");
    require_same_device({a, b, cond}, "where");
    const Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
    Tensor y = empty(shape, a.dtype(), a.device());
    backend_for(a.device()).where(cond, a, b, y);
    return record(y, "where", {a, b}, {{"cond", cond}},
                  [cond = cond.detach(), sa = a.shape(), sb = b.shape()](const Tensor& g) {
                      const Tensor zero = scalar_like(g, 0);
                      return std::vector<Tensor>{sum_to(where(cond, g, zero), sa), sum_to(where(cond, zero, g), sb)};
                  });
}

// y = mask ? value : x  (a where() whose result keeps x's shape)
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
    const ProfileScope profiled("masked_fill");
    RELGRAD_CHECK(broadcast_shapes(x.shape(), mask.shape(), "masked_fill") == x.shape(), "masked_fill: mask of shape ",
                  shape_str(mask.shape()), " does not broadcast to the input's shape ", shape_str(x.shape()));
    return where(mask, scalar_like(x, value), x);
}

// ---------------------------------------------------------------- operators

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator+(const Tensor& a, double b) { return add(a, scalar_like(a, b)); }
Tensor operator-(const Tensor& a, double b) { return sub(a, scalar_like(a, b)); }
Tensor operator*(const Tensor& a, double b) { return mul(a, scalar_like(a, b)); }
Tensor operator/(const Tensor& a, double b) { return div(a, scalar_like(a, b)); }
Tensor operator*(double a, const Tensor& b) { return mul(scalar_like(b, a), b); }
Tensor mul(const Tensor& a, double b) { return mul(a, scalar_like(a, b)); }
Tensor add(const Tensor& a, double b) { return add(a, scalar_like(a, b)); }

}  // namespace relgrad
