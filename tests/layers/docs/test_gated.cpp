// docs/layers/gated.md's worked examples, number for number: the gate between relative and absolute
// positions, and the token gate (doc_examples.hpp says how these tests are written).
#include "doc_examples.hpp"

using namespace relgrad;
using namespace relgrad::testing;

namespace {

// The gated layer of docs/layers/gated.md (D = H = Dh = 1, all projections 1, biases 0,
// E_K = E_V = (-1, 0, 1), k = 1) written out in plain loops: its output for x, and d lambda
// for the cotangent dy. gate_of(x_i) is g_i.
struct LoopResult {
    std::vector<double> y;
    double d_lambda;
};

template <class GateOf>
LoopResult gated_by_loops(const std::vector<double>& x, const std::vector<double>& dy, GateOf gate_of) {
    const int L = 3;
    const double table[3] = {-1, 0, 1};
    auto r = [](int i, int j) { return std::clamp(j - i, -1, 1) + 1; };
    LoopResult out{std::vector<double>(L), 0};
    for (int i = 0; i < L; ++i) {
        const double g = gate_of(x[i]);
        double e[3], a[3], rel[3], abs_term[3], total = 0;
        for (int j = 0; j < L; ++j) {
            rel[j] = x[i] * table[r(i, j)];
            abs_term[j] = std::sin(double(i)) * std::sin(double(j));  // P_i = sin(i) when D = 1
            e[j] = x[i] * x[j] + g * rel[j] + (1 - g) * abs_term[j];  // / sqrt(Dh) = 1
            total += std::exp(e[j]);
        }
        double R = 0, z = 0;
        for (int j = 0; j < L; ++j) {
            a[j] = std::exp(e[j]) / total;
            R += a[j] * table[r(i, j)];
            z += a[j] * x[j];
        }
        out.y[i] = z + g * R;
        // backward: da_ij = dz_i (v_j + g E_V[r]), ds = a (da - sum a da), dg = sum ds (rel - abs) + dz R
        double da[3], mean_da = 0, dg = dy[i] * R;
        for (int j = 0; j < L; ++j) {
            da[j] = dy[i] * (x[j] + g * table[r(i, j)]);
            mean_da += a[j] * da[j];
        }
        for (int j = 0; j < L; ++j) dg += a[j] * (da[j] - mean_da) * (rel[j] - abs_term[j]);
        out.d_lambda += g * (1 - g) * dg;
    }
    return out;
}

std::vector<Tensor> gated_example_parameters(double lambda) {
    std::vector<Tensor> values{param({lambda}, {1})};
    for (const Tensor& t : unit_projections()) values.push_back(t);
    values.push_back(param({-1, 0, 1}, {3, 1}));  // E_K
    values.push_back(param({-1, 0, 1}, {3, 1}));  // E_V
    for (int i = 0; i < 2; ++i) {                 // w_pq, w_pk
        values.push_back(param({1}, {1, 1}));
        values.push_back(param({0}, {1}));
    }
    return values;
}

}  // namespace

TEST_CASE("docs/layers/gated.md: the gate between relative and absolute, by hand") {
    RelativeOptions o;
    o.k_left = o.k_right = 1;
    Generator gen(14);
    GatedPositionAttention gated(1, 1, o, AttentionImpl::bucketed, false, Init{gen, DType::float64});
    std::vector<std::string> names;
    for (const auto& [name, p] : gated.named_parameters()) names.push_back(name);
    CHECK(names == std::vector<std::string>{"gate", "w_q.weight", "w_q.bias", "w_k.weight", "w_k.bias", "w_v.weight",
                                            "w_v.bias", "w_o.weight", "w_o.bias", "rel_pos_emb_k.weight",
                                            "rel_pos_emb_v.weight", "w_pq.weight", "w_pq.bias", "w_pk.weight",
                                            "w_pk.bias"});
    CHECK(gated.gate_values() == std::vector<double>{0.5});  // lambda starts at 0
    gated.assign_parameters(gated_example_parameters(0));
    check_values(gated.positions.encoding(3, DType::float64), {0, 0.841470984808, 0.909297426826}, 1e-11);

    const std::vector<double> xs{1, 0, -1}, dy{1, 1, 1};
    const Tensor x = param(xs, {1, 3, 1});
    const Tensor y = gated.forward(x, x);
    // the scores e_ij = q_i k_j + g rel_ij + (1 - g) abs_ij (sqrt(Dh) = 1), row by row; the weights
    // are their softmax
    const std::vector<double> scores{1,
                                     0.5,
                                     -0.5,  //
                                     0,
                                     0.354036709137,
                                     0.382573700617,  //
                                     -0.5,
                                     0.882573700617,
                                     1.413410905216};
    CHECK(std::sin(1.0) * std::sin(1.0) == doctest::Approx(0.708073418274).epsilon(1e-11));
    CHECK(std::sin(1.0) * std::sin(2.0) == doctest::Approx(0.765147401234).epsilon(1e-11));
    CHECK(std::sin(2.0) * std::sin(2.0) == doctest::Approx(0.826821810432).epsilon(1e-11));
    check_values(gated.last_weights, softmax(f64(scores, {3, 3}), -1).to_vector(), 1e-11);
    check_values(gated.last_weights,
                 {0.546549387266, 0.331498960424, 0.121951652310,  //
                  0.257012561503, 0.366193422389, 0.376794016108,  //
                  0.085024561976, 0.338835208912, 0.576140229112},
                 1e-11);
    check_values(y, {0.651323041323, -0.059890727303, -0.703045552580}, 1e-11);
    CHECK(0.257012561503 - 0.376794016108 == doctest::Approx(-0.119781454605).epsilon(1e-11));
    CHECK(0.5 * -0.119781454605 == doctest::Approx(-0.059890727303).epsilon(1e-10));
    const LoopResult loops = gated_by_loops(xs, dy, [](double) { return 0.5; });
    check_values(y, loops.y);
    y.backward(f64(dy, {1, 3, 1}));
    CHECK(gated.gate.grad().item() == doctest::Approx(loops.d_lambda).epsilon(1e-12));
    CHECK(gated.gate.grad().item() == doctest::Approx(0.082515896671).epsilon(1e-10));

    // lambda = +40: g = 1 (exactly, in float64), the relative example of attention.md
    gated.assign_parameters(gated_example_parameters(40));
    CHECK(gated.gate_values()[0] == 1.0);
    check_values(gated.forward(x, x), {0.844637596503, 0, -0.844637596503}, 1e-11);
    // lambda = -40: g = 4e-18, the tables no longer matter: untied absolute attention
    gated.assign_parameters(gated_example_parameters(-40));
    CHECK(gated.gate_values()[0] == doctest::Approx(4.25e-18).epsilon(1e-3));
    const Tensor absolute = gated.forward(x, x);
    check_values(absolute, gated_by_loops(xs, dy, [](double) { return 0.0; }).y, 1e-15);
    check_values(absolute, {0.575210382604, -0.221900978228, -0.669571394012}, 1e-11);

    gated.assign_parameters(gated_example_parameters(0.3));
    gradcheck_layer(gated, {random_input({2, 3, 1}, 11)}, [&](const auto& in) { return gated.forward(in[0], in[0]); });
}

TEST_CASE("docs/layers/gated.md: the token gate") {
    RelativeOptions o;
    o.k_left = o.k_right = 1;
    Generator gen(15);
    GatedPositionAttention gated(1, 1, o, AttentionImpl::bucketed, true, Init{gen, DType::float64});
    std::vector<Tensor> values = gated_example_parameters(0);
    CHECK(gated.w_gate->weight.to_vector() == std::vector<double>{0});  // token gates start at 0.5
    values.push_back(param({2}, {1, 1}));                               // w_gate.weight
    gated.assign_parameters(values);
    CHECK(sigmoid_of(2) == doctest::Approx(0.880797077978).epsilon(1e-12));
    CHECK(sigmoid_of(-2) == doctest::Approx(0.119202922022).epsilon(1e-11));
    const std::vector<double> xs{1, 0, -1}, dy{1, 1, 1};
    const Tensor x = param(xs, {1, 3, 1});
    const Tensor y = gated.forward(x, x);
    const LoopResult loops = gated_by_loops(xs, dy, [](double xi) { return sigmoid_of(2 * xi); });
    check_values(y, loops.y);
    check_values(y, {0.787155998722, -0.059890727303, -0.669758726462}, 1e-11);
    y.backward(f64(dy, {1, 3, 1}));
    CHECK(gated.gate.grad().item() == doctest::Approx(loops.d_lambda).epsilon(1e-12));
    CHECK(gated.gate_values() == std::vector<double>{0.5});  // the per-head part only
    gradcheck_layer(gated, {random_input({2, 3, 1}, 12)}, [&](const auto& in) { return gated.forward(in[0], in[0]); });
}
