#include "engine/op_gradchecks.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/ops.hpp"

namespace relgrad {

namespace {

// Inputs are drawn from N(0, 1) and then moved away from the points where an op is not
// differentiable (relu at 0, clamp at its bounds, log and sqrt below 0).
struct Values {
    std::vector<double> kinks;  // keep every value at least 0.05 away from these
    bool positive = false;      // |x| + 0.5
};

Tensor make_input(const Shape& shape, const Values& values, Generator& gen, Device device) {
    std::vector<double> data(shape_numel(shape));
    for (double& v : data) {
        v = gen.next_normal();
        if (values.positive) v = std::fabs(v) + 0.5;
        for (double kink : values.kinks) {
            if (std::fabs(v - kink) < 0.05) v = kink + 0.1;
        }
    }
    return from_vector(data, shape, DType::float64, device).requires_grad_(true);
}

Tensor index_tensor(const std::vector<double>& values, const Shape& shape) {
    return from_vector(values, shape, DType::int64);
}

// A case's constant (an index, a mask), made once on the CPU, on the device of its inputs x.
Tensor on(const Tensor& constant, const std::vector<Tensor>& x) { return constant.to(x[0].device()); }
AttentionPattern on(AttentionPattern pattern, const std::vector<Tensor>& x) {
    if (pattern.mask.defined()) pattern.mask = on(pattern.mask, x);
    return pattern;
}

// max |a - reference| / max |reference| (0 for an all-zero reference that a matches; infinite
// where one holds a NaN and the other does not)
double scaled_error(const Tensor& a, const Tensor& reference) {
    const std::vector<double> x = a.to_vector(), r = reference.to_vector();
    double largest = 0, worst = 0;
    for (std::size_t i = 0; i < r.size(); ++i) {
        largest = std::max(largest, std::fabs(r[i]));
        if (std::isnan(x[i]) != std::isnan(r[i])) return std::numeric_limits<double>::infinity();
        worst = std::max(worst, x[i] == r[i] || std::isnan(r[i]) ? 0.0 : std::fabs(x[i] - r[i]));  // inf == inf
    }
    return worst == 0 ? 0 : largest == 0 ? std::numeric_limits<double>::infinity() : worst / largest;
}

PrecisionResult in_precision(const Function& f, const std::vector<Tensor>& drawn, DType dtype, uint64_t seed) {
    std::vector<Tensor> narrow, wide;
    for (const Tensor& x : drawn) {
        narrow.push_back(x.detach().to(dtype).requires_grad_(true));
        wide.push_back(narrow.back().detach().to(DType::float64).requires_grad_(true));
    }
    const Tensor y_narrow = f(narrow), y_wide = f(wide);
    Generator gen(seed + 1000);
    // rounded to dtype, in the output's own dtype (a loss is float32)
    const Tensor cotangent = randn(y_wide.shape(), gen, dtype, y_wide.device()).to(y_narrow.dtype());
    y_narrow.backward(cotangent);
    y_wide.backward(cotangent.to(DType::float64));
    PrecisionResult result;
    result.output_error = scaled_error(y_narrow, y_wide);
    for (std::size_t i = 0; i < wide.size(); ++i) {
        if (!wide[i].grad().defined()) continue;
        result.gradient_error = std::max(result.gradient_error, scaled_error(narrow[i].grad(), wide[i].grad()));
    }
    return result;
}

class Registry {
public:
    void add(const std::string& name, std::vector<Shape> shapes, Function f, Values values = {}) {
        const uint64_t seed = checks_.size() + 1;
        auto inputs_on = [shapes = std::move(shapes), values, seed](Device device) {
            Generator gen(seed);
            std::vector<Tensor> inputs;
            for (const Shape& s : shapes) inputs.push_back(make_input(s, values, gen, device));
            return inputs;
        };
        checks_.push_back({name,
                           [inputs_on, f, seed](Device device) {
                               GradcheckOptions options;
                               options.seed = seed;
                               return gradcheck(f, inputs_on(device), options);
                           },
                           [inputs_on, f, seed](DType dtype, Device device) {
                               return in_precision(f, inputs_on(device), dtype, seed);
                           }});
    }

    // The usual four cases of an elementwise binary op.
    void binary(const std::string& name, Tensor (*op)(const Tensor&, const Tensor&), Values values = {}) {
        add(
            name + "/same", {{3, 4}, {3, 4}}, [op](const auto& x) { return op(x[0], x[1]); }, values);
        add(
            name + "/broadcast", {{2, 3, 4}, {3, 1}}, [op](const auto& x) { return op(x[0], x[1]); }, values);
        add(
            name + "/noncontiguous", {{4, 3}, {3, 4}}, [op](const auto& x) { return op(x[0].transpose(0, 1), x[1]); },
            values);
        add(
            name + "/single", {{}, {1}}, [op](const auto& x) { return op(x[0], x[1]); }, values);
    }

    // Four cases of an elementwise unary op.
    void unary(const std::string& name, std::function<Tensor(const Tensor&)> op, Values values = {}) {
        add(
            name, {{3, 5}}, [op](const auto& x) { return op(x[0]); }, values);
        add(
            name + "/noncontiguous", {{5, 3}}, [op](const auto& x) { return op(x[0].transpose(0, 1)); }, values);
        add(
            name + "/broadcast", {{3, 1}},
            [op](const auto& x) {
                return op(x[0].expand({3, 4}));
            },
            values);
        add(
            name + "/single", {{1}}, [op](const auto& x) { return op(x[0]); }, values);
    }

    std::vector<OpCheck> take() { return std::move(checks_); }

private:
    std::vector<OpCheck> checks_;
};

std::vector<OpCheck> build() {
    Registry r;
    const Values positive{{}, true};
    const double inf = std::numeric_limits<double>::infinity();

    // --- elementwise
    r.binary("add", &add);
    r.binary("sub", &sub);
    r.binary("mul", &mul);
    r.binary("div", &div, positive);
    r.binary("pow", static_cast<Tensor (*)(const Tensor&, const Tensor&)>(&pow), positive);
    r.unary(
        "pow_scalar", [](const Tensor& x) { return pow(x, 2.5); }, positive);
    r.unary("neg", [](const Tensor& x) { return neg(x); });
    r.unary("exp", [](const Tensor& x) { return exp(x); });
    r.unary(
        "log", [](const Tensor& x) { return log(x); }, positive);
    r.unary(
        "sqrt", [](const Tensor& x) { return sqrt(x); }, positive);
    r.unary("tanh", [](const Tensor& x) { return tanh(x); });
    r.unary("sigmoid", [](const Tensor& x) { return sigmoid(x); });
    r.unary(
        "relu", [](const Tensor& x) { return relu(x); }, Values{{0.0}});
    r.unary("gelu", [](const Tensor& x) { return gelu(x); });
    r.unary(
        "clamp", [](const Tensor& x) { return clamp(x, -0.5, 0.7); }, Values{{-0.5, 0.7}});
    const Tensor cond = from_vector({1, 0, 0, 1, 1, 0, 1, 0, 0, 1, 1, 1}, {3, 4}, DType::boolean);
    r.add("where", {{3, 4}, {3, 4}}, [cond](const auto& x) { return where(on(cond, x), x[0], x[1]); });
    r.add("where/broadcast", {{4}, {3, 4}}, [cond](const auto& x) {
        return where(on(cond, x).narrow(1, 0, 1), x[0], x[1].transpose(0, 1).transpose(0, 1));
    });
    r.add("masked_fill", {{2, 3, 4}}, [cond](const auto& x) { return masked_fill(x[0], on(cond, x), 2.5); });

    // --- reductions
    for (const std::string name : {"sum", "mean", "max"}) {
        auto op = name == "sum" ? &sum : name == "mean" ? &mean : &max;
        r.add(name + "/all", {{3, 4}}, [op](const auto& x) { return op(x[0], {}, false); });
        r.add(name + "/dims", {{2, 3, 4}}, [op](const auto& x) { return op(x[0], {0, 2}, false); });
        r.add(name + "/keepdim", {{2, 3, 4}}, [op](const auto& x) { return op(x[0], {-1}, true); });
        r.add(name + "/noncontiguous", {{4, 3}}, [op](const auto& x) { return op(x[0].transpose(0, 1), {1}, false); });
        r.add(name + "/single", {{1, 1}}, [op](const auto& x) { return op(x[0], {0}, false); });
        r.add(name + "/broadcast", {{3, 1}}, [op](const auto& x) { return op(x[0].expand({2, 3, 4}), {0, 2}, false); });
    }

    // --- matmul
    r.add("matmul", {{3, 4}, {4, 5}}, [](const auto& x) { return matmul(x[0], x[1]); });
    r.add("matmul/transposed", {{4, 3}, {5, 4}},
          [](const auto& x) { return matmul(x[0].transpose(0, 1), x[1].transpose(0, 1)); });
    r.add("matmul/batched", {{2, 3, 4}, {2, 4, 5}}, [](const auto& x) { return matmul(x[0], x[1]); });
    r.add("matmul/broadcast", {{2, 1, 3, 4}, {3, 4, 2}}, [](const auto& x) { return matmul(x[0], x[1]); });
    r.add("matmul/expanded", {{1, 4}, {4, 3}}, [](const auto& x) { return matmul(x[0].expand({3, 4}), x[1]); });
    r.add("matmul/vector", {{4}, {4, 5}, {3, 4}}, [](const auto& x) {
        return concat({matmul(x[0], x[1]), matmul(x[2], x[0])}, 0);
    });
    r.add("matmul/single", {{1, 1}, {1, 1}}, [](const auto& x) { return matmul(x[0], x[1]); });

    // --- views and assembly
    r.add("transpose", {{2, 3, 4}}, [](const auto& x) { return x[0].transpose(0, 2); });
    r.add("permute", {{2, 3, 4}}, [](const auto& x) { return x[0].permute({1, 2, 0}); });
    r.add("reshape", {{2, 3, 4}}, [](const auto& x) { return x[0].reshape({4, -1}); });
    r.add("reshape/noncontiguous", {{2, 3, 4}}, [](const auto& x) { return x[0].transpose(0, 1).reshape({6, 4}); });
    r.add("slice", {{5, 4}}, [](const auto& x) { return x[0].slice(0, 1, 5, 2); });
    r.add("narrow", {{3, 6}}, [](const auto& x) { return x[0].narrow(-1, 2, 3); });
    r.add("expand", {{3, 1}}, [](const auto& x) { return x[0].expand({2, 3, 4}); });
    r.add("squeeze", {{3, 1, 2}}, [](const auto& x) { return x[0].squeeze(1).unsqueeze(0); });
    r.add("concat", {{2, 3}, {2, 1}, {4, 2}}, [](const auto& x) {
        return concat({x[0], x[1], x[2].transpose(0, 1)}, 1);
    });
    r.add("concat/single", {{1}, {1}}, [](const auto& x) { return concat({x[0], x[1]}, 0); });
    r.add("stack", {{2, 3}, {3, 2}}, [](const auto& x) { return stack({x[0], x[1].transpose(0, 1)}, 1); });

    // --- indexing (repeated indices make the backward accumulate)
    const Tensor rows = index_tensor({0, 4, 4, 1, 2, 2, 0, 3, 1, 1, 1, 4}, {3, 4});
    r.add("gather", {{3, 5}}, [rows](const auto& x) { return gather(x[0], 1, on(rows, x)); });
    r.add("gather/dim0", {{5, 4}}, [rows](const auto& x) { return gather(x[0], 0, on(rows, x)); });
    r.add("gather/noncontiguous", {{5, 3}},
          [rows](const auto& x) { return gather(x[0].transpose(0, 1), 1, on(rows, x)); });
    r.add("scatter_add", {{3, 5}, {3, 4}}, [rows](const auto& x) { return scatter_add(x[0], 1, on(rows, x), x[1]); });
    const Tensor picks = index_tensor({2, 0, 2, 4}, {4});
    r.add("index_select", {{5, 3}}, [picks](const auto& x) { return index_select(x[0], 0, on(picks, x)); });
    r.add("index_select/noncontiguous", {{5, 3}},
          [picks](const auto& x) { return index_select(x[0].transpose(0, 1), 1, on(picks, x)); });
    const Tensor ids = index_tensor({1, 5, 1, 0, 3, 3}, {2, 3});
    r.add("embedding", {{6, 4}}, [ids](const auto& x) { return embedding(x[0], on(ids, x)); });
    r.add("embedding/single", {{1, 1}}, [](const auto& x) { return embedding(x[0], on(index_tensor({0}, {1}), x)); });

    // --- softmax family (a masked row gets zero weights and zero gradient)
    const Tensor mask = from_vector({0, 1, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0}, {3, 5}, DType::boolean);
    for (const std::string name : {"softmax", "log_softmax"}) {
        auto op = name == "softmax" ? &softmax : &log_softmax;
        r.add(name, {{3, 5}}, [op](const auto& x) { return op(x[0], -1); });
        r.add(name + "/dim0", {{3, 5}}, [op](const auto& x) { return op(x[0], 0); });
        r.add(name + "/noncontiguous", {{5, 3}}, [op](const auto& x) { return op(x[0].transpose(0, 1), 1); });
        r.add(name + "/single", {{1}}, [op](const auto& x) { return op(x[0], 0); });
        // -inf entries of log_softmax are kept out of the checked output (inf - inf is NaN)
        r.add(name + "/masked", {{3, 5}}, [op, mask, inf](const auto& x) {
            return masked_fill(op(masked_fill(x[0], on(mask, x), -inf), -1), on(mask, x), 0.0);
        });
    }

    // --- layers of the nn family
    r.add("layer_norm", {{2, 3, 5}, {5}, {5}}, [](const auto& x) { return layer_norm(x[0], x[1], x[2]); });
    r.add("layer_norm/noncontiguous", {{5, 3}, {5}, {5}},
          [](const auto& x) { return layer_norm(x[0].transpose(0, 1), x[1], x[2]); });
    r.add("layer_norm/single", {{1, 1}, {1}, {1}}, [](const auto& x) { return layer_norm(x[0], x[1], x[2]); });
    r.add("dropout", {{4, 5}}, [](const auto& x) {
        Generator gen(7);  // the same mask on every evaluation
        return dropout(x[0], 0.3, true, gen);
    });
    const Tensor targets = index_tensor({1, 0, -100, 3, 3}, {5});
    r.add("cross_entropy", {{5, 4}}, [targets](const auto& x) { return cross_entropy(x[0], on(targets, x)); });
    r.add("cross_entropy/noncontiguous", {{4, 5}},
          [targets](const auto& x) { return cross_entropy(x[0].transpose(0, 1), on(targets, x)); });
    r.add("cross_entropy/single", {{1, 1}},
          [](const auto& x) { return cross_entropy(x[0], on(index_tensor({0}, {1}), x)); });

    // --- attention as one op (the bucketed relative form); row 1 of the mask sees no key
    const Tensor buckets = index_tensor({1, 2, 3, 3, 4, 0, 1, 2, 2, 3, 0, 0, 1, 1, 2}, {3, 5});
    const Tensor keys_seen = from_vector({1, 1, 0, 1, 1, 0, 0, 0, 0, 0, 1, 0, 1, 1, 1}, {3, 5}, DType::boolean);
    r.add("attention", {{2, 2, 3, 4}, {2, 2, 5, 4}, {2, 2, 5, 4}},
          [](const auto& x) { return attention(x[0], x[1], x[2], Tensor(), 0.5); });
    r.add("attention/relative", {{2, 2, 3, 4}, {2, 2, 5, 4}, {2, 2, 5, 4}, {1, 5, 4}, {1, 5, 4}},
          [buckets](const auto& x) {
              return attention(x[0], x[1], x[2], Tensor(), 0.5, {x[3], x[4], on(buckets, x)});
          });
    r.add("attention/per_head", {{2, 2, 3, 4}, {2, 2, 5, 4}, {2, 2, 5, 4}, {2, 5, 4}, {2, 5, 4}},
          [buckets, keys_seen](const auto& x) {
              return attention(x[0], x[1], x[2], on(keys_seen, x), 0.5, {x[3], x[4], on(buckets, x)});
          });
    r.add("attention/noncontiguous", {{2, 3, 2, 4}, {2, 5, 2, 4}, {2, 2, 5, 4}}, [keys_seen](const auto& x) {
        return attention(x[0].transpose(1, 2), x[1].transpose(1, 2), x[2], on(keys_seen, x), 0.5);
    });
    r.add("attention/single", {{1, 1, 1, 1}, {1, 1, 1, 1}, {1, 1, 1, 1}, {1, 1, 1}, {1, 1, 1}}, [](const auto& x) {
        return attention(x[0], x[1], x[2], Tensor(), 1.0, {x[3], x[4], on(index_tensor({0}, {1, 1}), x)});
    });

    // --- fused attention (tiled, online softmax); query 0 of batch 1 sees no key in the masked cases.
    // At Dh = 4 and L <= 5 these run, on cuda, the scalar kernels in one block of queries and one
    // tile of keys (float64 never takes the tensor cores); tests/engine/test_fused_attention.cpp
    // checks the scalar kernels' gradients over several blocks and tiles, and the tensor cores'.
    AttentionPattern causal;
    causal.causal = true;
    r.add("fused_attention", {{2, 2, 3, 4}, {2, 2, 5, 4}, {2, 2, 5, 4}},
          [causal](const auto& x) { return fused_attention(x[0], x[1], x[2], causal, 0.5); });
    AttentionPattern padded;
    padded.mask = from_vector({1, 1, 1, 0, 1, 0, 0, 1, 1, 1}, {2, 1, 1, 5}, DType::boolean);
    padded.causal = true;
    r.add("fused_attention/relative", {{2, 2, 3, 4}, {2, 2, 5, 4}, {2, 2, 5, 4}, {1, 5, 4}, {1, 5, 4}},
          [padded](const auto& x) {
              return fused_attention(x[0], x[1], x[2], on(padded, x), 0.5, {x[3], x[4], 2, 2});
          });
    AttentionPattern window;
    window.window = 1;
    window.query_offset = 2;
    r.add("fused_attention/per_head", {{2, 2, 3, 4}, {2, 2, 5, 4}, {2, 2, 5, 4}, {2, 4, 4}, {2, 4, 4}},
          [window](const auto& x) {
              return fused_attention(x[0], x[1], x[2], window, 0.5, {x[3], x[4], 1, 2});
          });
    r.add("fused_attention/noncontiguous", {{2, 3, 2, 4}, {2, 5, 2, 4}, {2, 2, 5, 4}, {1, 3, 4}, {1, 3, 4}},
          [padded](const auto& x) {
              return fused_attention(x[0].transpose(1, 2), x[1].transpose(1, 2), x[2], on(padded, x), 0.5,
                                     {x[3], x[4], 1, 1});
          });
    r.add("fused_attention/single", {{1, 1, 1, 1}, {1, 1, 1, 1}, {1, 1, 1, 1}, {1, 1, 1}, {1, 1, 1}},
          [](const auto& x) {
              return fused_attention(x[0], x[1], x[2], {}, 1.0, {x[3], x[4], 0, 0});
          });
    // --- position terms added later (appended, so that the cases above keep their seeds)
    // a score bias per bucket (ALiBi's and T5's form), alone and beside the tables
    r.add("attention/bias", {{2, 2, 3, 4}, {2, 2, 5, 4}, {2, 2, 5, 4}, {2, 5}}, [buckets, keys_seen](const auto& x) {
        return attention(x[0], x[1], x[2], on(keys_seen, x), 0.5, {Tensor(), Tensor(), on(buckets, x), x[3]});
    });
    r.add("attention/bias_and_tables", {{2, 2, 3, 4}, {2, 2, 5, 4}, {2, 2, 5, 4}, {1, 5, 4}, {1, 5, 4}, {1, 5}},
          [buckets](const auto& x) {
              return attention(x[0], x[1], x[2], Tensor(), 0.5, {x[3], x[4], on(buckets, x), x[5]});
          });
    // a bias by distance, [H or 1, Lq + Lk - 1]: per head under padding and the causal rule, and
    // shared under a window with a query offset
    r.add("fused_attention/bias", {{2, 2, 3, 4}, {2, 2, 5, 4}, {2, 2, 5, 4}, {2, 7}}, [padded](const auto& x) {
        ClippedRelativeTerms terms;
        terms.distance_bias = x[3];
        return fused_attention(x[0], x[1], x[2], on(padded, x), 0.5, terms);
    });
    r.add("fused_attention/shared_bias", {{2, 2, 3, 4}, {2, 2, 5, 4}, {2, 2, 5, 4}, {1, 7}}, [window](const auto& x) {
        ClippedRelativeTerms terms;
        terms.distance_bias = x[3];
        return fused_attention(x[0], x[1], x[2], window, 0.5, terms);
    });

    // --- RoPE (the rotation of pairs)
    r.add("rope", {{2, 3, 4, 6}}, [](const auto& x) { return rope(x[0], 0); });
    r.add("rope/offset", {{3, 4}}, [](const auto& x) { return rope(x[0], 5, 100.0); });
    r.add("rope/noncontiguous", {{4, 2, 3}}, [](const auto& x) { return rope(x[0].transpose(0, 2), 2); });
    r.add("rope/single", {{1, 2}}, [](const auto& x) { return rope(x[0], 1); });
    // --- cross_entropy summed (a shard's loss), appended as the position terms above
    r.add("cross_entropy/sum", {{5, 4}},
          [targets](const auto& x) { return cross_entropy(x[0], on(targets, x), -100, Reduction::sum); });
    // (last: a case's inputs are drawn from its place in the list, and those of the cases above are
    // what their 16-bit tolerances were measured on)
    r.add("dropout_add", {{4, 5}, {5, 4}}, [](const auto& x) {
        Generator gen(7);  // added to a residual, with an x that is not contiguous
        return dropout_add(x[0], x[1].transpose(0, 1), 0.5, true, gen);
    });
    return r.take();
}

}  // namespace

const std::vector<OpCheck>& registered_op_checks() {
    static const std::vector<OpCheck> checks = build();
    return checks;
}

std::vector<OpCheck> op_checks_for(const std::string& op) {
    std::vector<OpCheck> selected;
    for (const OpCheck& check : registered_op_checks()) {
        if (op.empty() || check.name.substr(0, check.name.find('/')) == op) selected.push_back(check);
    }
    return selected;
}

}  // namespace relgrad
