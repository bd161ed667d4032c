#include "engine/gradcheck.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "engine/autograd.hpp"
#include "engine/errors.hpp"
#include "engine/ops.hpp"

namespace relgrad {

namespace {

// Writes value into element `flat` of a packed leaf, on whatever device it lives (an explicit copy
// of one element from the host).
void set_element(const Tensor& leaf, int64_t flat, double value) {
    NoGradGuard no_grad;
    leaf.detach().view({-1}).narrow(0, flat, 1).copy_(scalar(value, DType::float64).view({1}));
}

std::string multi_index(int64_t flat, const Shape& shape) {
    Shape index(shape.size());
    for (std::size_t d = shape.size(); d-- > 0;) {
        index[d] = flat % shape[d];
        flat /= shape[d];
    }
    return shape_str(index);
}

// v . f(inputs) without recording a graph
double project(const Function& f, const std::vector<Tensor>& inputs, const Tensor& cotangent) {
    NoGradGuard no_grad;
    return sum(mul(f(inputs), cotangent)).item();
}

// The gradients of v . f at the leaves (zeros where a leaf got none).
std::vector<Tensor> analytic_gradients(const Function& f, const std::vector<Tensor>& leaves,
                                       const std::vector<bool>& checked, const Tensor& cotangent) {
    for (std::size_t i = 0; i < leaves.size(); ++i) {
        if (checked[i]) Tensor(leaves[i]).zero_grad();
    }
    const Tensor y = f(leaves);
    RELGRAD_CHECK(y.requires_grad(), "gradcheck: the output does not depend on any checked input");
    y.backward(cotangent);
    std::vector<Tensor> grads;
    for (std::size_t i = 0; i < leaves.size(); ++i) {
        if (!checked[i])
            grads.emplace_back();
        else
            grads.push_back(leaves[i].grad().defined() ? leaves[i].grad().contiguous() : zeros_like(leaves[i]));
    }
    return grads;
}

class Comparison {
public:
    explicit Comparison(const GradcheckOptions& options) : options_(options) {}

    // `errors`: the input's own maxima, or none (fast mode's projection of all of them)
    void compare(double analytic, double numeric, const std::string& where, GradcheckErrors* errors = nullptr) {
        const double abs_error = std::fabs(analytic - numeric);
        const bool ok = std::isfinite(analytic) && abs_error <= options_.atol + options_.rtol * std::fabs(numeric);
        for (GradcheckErrors* maxima : {static_cast<GradcheckErrors*>(&result_), errors}) {
            if (!maxima) continue;
            maxima->max_abs_error = std::max(maxima->max_abs_error, std::isnan(abs_error) ? INFINITY : abs_error);
            if (std::fabs(numeric) > options_.atol) {
                maxima->max_rel_error = std::max(maxima->max_rel_error, abs_error / std::fabs(numeric));
            }
        }
        if (ok) return;
        if (result_.passed) report_ << "gradient mismatch (analytic vs numeric):\n";
        result_.passed = false;
        if (mismatches_++ < options_.max_reported) {
            report_.precision(10);
            report_ << "  " << where << ": analytic " << analytic << "  numeric " << numeric << "  |diff| " << abs_error
                    << "\n";
        }
    }

    void fail(const std::string& message) {
        result_.passed = false;
        report_ << message << "\n";
    }

    GradcheckResult& result() { return result_; }

    GradcheckResult finish() {
        if (mismatches_ > options_.max_reported) {
            report_ << "  ... " << mismatches_ - options_.max_reported << " more mismatches\n";
        }
        result_.report = report_.str();
        return result_;
    }

private:
    const GradcheckOptions& options_;
    GradcheckResult result_;
    std::ostringstream report_;
    int mismatches_ = 0;
};

}  // namespace

GradcheckResult gradcheck(const Function& f, const std::vector<Tensor>& inputs, const GradcheckOptions& options) {
    // a step of 0 divides 0 by 0; the tolerances are distances
    RELGRAD_CHECK(options.eps > 0 && std::isfinite(options.eps), "gradcheck: eps ", options.eps,
                  ", expected a finite step > 0");
    RELGRAD_CHECK(options.atol >= 0 && options.rtol >= 0 && std::isfinite(options.atol) && std::isfinite(options.rtol),
                  "gradcheck: atol ", options.atol, " and rtol ", options.rtol, ", expected finite numbers >= 0");
    std::vector<Tensor> leaves;
    std::vector<bool> checked;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        const bool wants_grad = inputs[i].requires_grad();
        RELGRAD_CHECK(!wants_grad || inputs[i].dtype() == DType::float64, "gradcheck: input ", i, " is ",
                      dtype_name(inputs[i].dtype()), "; gradient checks need float64");
        checked.push_back(wants_grad);
        if (!wants_grad) {
            leaves.push_back(inputs[i]);
            continue;
        }
        Tensor leaf;
        {
            NoGradGuard no_grad;
            leaf = inputs[i].detach().clone();
        }
        leaves.push_back(leaf.requires_grad_(true));
    }

    Generator gen(options.seed);
    Tensor cotangent;
    Comparison comparison(options);
    {
        NoGradGuard no_grad;
        const Tensor y = f(leaves);
        cotangent = randn(y.shape(), gen, DType::float64, y.device());
        comparison.result().output = y.to_vector();
    }

    const std::vector<Tensor> analytic = analytic_gradients(f, leaves, checked, cotangent);
    for (std::size_t i = 0; i < leaves.size(); ++i) {
        comparison.result().gradients.push_back(checked[i] ? analytic[i].to_vector() : std::vector<double>());
    }

    // reentrancy: a second forward + backward gives the same gradients, bit for bit
    const std::vector<Tensor> again = analytic_gradients(f, leaves, checked, cotangent);
    for (std::size_t i = 0; i < leaves.size(); ++i) {
        if (checked[i] && analytic[i].to_vector() != again[i].to_vector()) {
            comparison.fail("input " + std::to_string(i) + ": two backward passes gave different gradients");
        }
    }
    // a zero cotangent gives zero gradients
    const std::vector<Tensor> from_zero = analytic_gradients(f, leaves, checked, zeros_like(cotangent));
    for (std::size_t i = 0; i < leaves.size(); ++i) {
        if (!checked[i]) continue;
        for (double v : from_zero[i].to_vector()) {
            if (v != 0) {
                comparison.fail("input " + std::to_string(i) + ": a zero cotangent gave a non-zero gradient");
                break;
            }
        }
    }
    for (std::size_t i = 0; i < leaves.size(); ++i) {
        if (checked[i]) Tensor(leaves[i]).zero_grad();
    }

    const double eps = options.eps;
    if (!options.fast) {
        std::vector<GradcheckErrors> per_input(leaves.size());
        for (std::size_t i = 0; i < leaves.size(); ++i) {
            if (!checked[i]) continue;
            const std::vector<double> x = leaves[i].to_vector();
            const std::vector<double> a = analytic[i].to_vector();
            for (int64_t k = 0; k < leaves[i].numel(); ++k) {
                set_element(leaves[i], k, x[k] + eps);
                const double plus = project(f, leaves, cotangent);
                set_element(leaves[i], k, x[k] - eps);
                const double minus = project(f, leaves, cotangent);
                set_element(leaves[i], k, x[k]);
                comparison.compare(a[k], (plus - minus) / (2 * eps),
                                   "input " + std::to_string(i) + " element " + multi_index(k, leaves[i].shape()),
                                   &per_input[i]);
            }
        }
        comparison.result().per_input = per_input;
        return comparison.finish();
    }

    // fast mode: one random direction u_i per input; compare sum_i <analytic_i, u_i> with v^T J u
    std::vector<std::vector<double>> directions(leaves.size()), saved(leaves.size());
    double analytic_projection = 0;
    for (std::size_t i = 0; i < leaves.size(); ++i) {
        if (!checked[i]) continue;
        const std::vector<double> a = analytic[i].to_vector();
        saved[i] = leaves[i].to_vector();
        for (int64_t k = 0; k < leaves[i].numel(); ++k) {
            directions[i].push_back(gen.next_normal());
            analytic_projection += a[k] * directions[i][k];
        }
    }
    auto shift = [&](double step) {
        for (std::size_t i = 0; i < leaves.size(); ++i) {
            if (!checked[i]) continue;
            std::vector<double> x(saved[i].size());
            for (std::size_t k = 0; k < x.size(); ++k) x[k] = saved[i][k] + step * directions[i][k];
            NoGradGuard no_grad;
            leaves[i].detach().copy_(from_vector(x, leaves[i].shape(), DType::float64));
        }
    };
    shift(eps);
    const double plus = project(f, leaves, cotangent);
    shift(-eps);
    const double minus = project(f, leaves, cotangent);
    shift(0);
    comparison.compare(analytic_projection, (plus - minus) / (2 * eps), "random projection v^T J u");
    return comparison.finish();
}

}  // namespace relgrad
