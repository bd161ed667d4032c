// docs/layers/rope.md's worked examples, number for number: a rotation by hand, scores by distance
// and the backward (doc_examples.hpp says how these tests are written).
#include "doc_examples.hpp"

using namespace relgrad;
using namespace relgrad::testing;

TEST_CASE("docs/layers/rope.md: a rotation by hand, scores by distance and the inverse rotation in the backward") {
    const double c1 = std::cos(1.0), s1 = std::sin(1.0), c2 = std::cos(2.0), s2 = std::sin(2.0);
    CHECK(std::fabs(c1 - 0.540302305868) <= 1e-12);
    CHECK(std::fabs(s1 - 0.841470984808) <= 1e-12);
    CHECK(std::fabs(c2 - -0.416146836547) <= 1e-12);
    CHECK(std::fabs(s2 - 0.909297426826) <= 1e-12);

    // the angles p theta_t for Dh = 4, base 10000: theta = (1, 1/100), sinusoidal.md's frequencies
    const RopeTables tables = rope_tables(3, 4, 0, 10000, DType::float64);
    check_values(tables.cos, {1, 1, c1, 0.999950000417, c2, 0.999800006667}, 1e-11);
    check_values(tables.sin, {0, 0, s1, 0.009999833334, s2, 0.019998666693}, 1e-11);
    check_values(tables.cos, {1, 1, c1, std::cos(0.01), c2, std::cos(0.02)});

    // the op: x_p rotated by the angle p (Dh = 2); from position 1 on, the same last two rows
    const Tensor x_heads = param({1, 0, 1, 0, 0, 1}, {1, 1, 3, 2});
    const Tensor rotated = rope(x_heads, 0);
    check_values(rotated, {1, 0, c1, s1, -s2, c2});
    check_values(rotated, {1, 0, 0.540302305868, 0.841470984808, -0.909297426826, -0.416146836547}, 1e-11);
    check_values(rope(x_heads.detach().narrow(2, 1, 2), 1), {c1, s1, -s2, c2});
    // its backward rotates by -p: the page's dk' into dk
    rotated.backward(f64({0.046673974553, 0, 0.033721356559, 0, -0.080395331112, 0}, {1, 1, 3, 2}));
    check_values(x_heads.grad(), {0.046673974553, 0, 0.018219726706, -0.028375543113, 0.033456262715, 0.073103267709},
                 1e-11);
    check_values(x_heads.grad().narrow(2, 1, 1), {0.033721356559 * c1, -0.033721356559 * s1}, 1e-12);

    // the layer: D = 2, H = 1 (Dh = 2, c = 1/sqrt 2), identity projections, x = (1, 0), (1, 0), (0, 1)
    const double c = 1 / std::sqrt(2.0);
    const std::vector<double> dots{1, c1, -s2, c1, 1, -s1, -s2, -s1, 1};  // q'_i . k'_j
    std::vector<double> scores;
    for (double d : dots) scores.push_back(c * d);
    check_values(f64(scores, {3, 3}),
                 {0.707106781187, 0.382051424370, -0.642970376624, 0.382051424370, 0.707106781187, -0.595009839529,
                  -0.642970376624, -0.595009839529, 0.707106781187},
                 1e-11);
    const std::vector<double> weights{0.504615308258, 0.364578180837, 0.130806510905,  //
                                      0.362250206638, 0.501393142260, 0.136356651102,  //
                                      0.169294901576, 0.177612233596, 0.653092864828};
    check_values(softmax(f64(scores, {3, 3}), -1), weights, 1e-11);
    for (AttentionImpl impl : all_forms) {
        CAPTURE(attention_impl_name(impl));
        Generator gen(22);
        RotaryMultiHeadAttention attention(2, 1, 10000, impl, Init{gen, DType::float64});
        CHECK(attention.parameter_count() == 24);  // the projections alone
        attention.assign_parameters(two_wide_projections());
        const Tensor x = param({1, 0, 1, 0, 0, 1}, {1, 3, 2});
        const Tensor y = attention.forward(x, x);
        if (impl == AttentionImpl::fused) {
            CHECK(!attention.last_weights.defined());
        } else {
            check_values(attention.last_weights, weights, 1e-11);
        }
        check_values(
            y, {0.869193489095, 0.130806510905, 0.863643348898, 0.136356651102, 0.346907135172, 0.653092864828}, 1e-11);
        check_values(y.narrow(1, 0, 1), {weights[0] + weights[1], weights[2]}, 1e-11);

        y.backward(f64({1, 0, 0, 0, 0, 0}, {1, 3, 2}));
        // dq = dq'_0 at position 0 (no rotation); dk_j = Rot(-j) dk'_j; W_q, W_k = I so dW = dq^T x, dk^T x
        check_values(attention.w_q.weight.grad(), {0.137996968968, 0, 0.061831805828, 0}, 1e-11);
        check_values(attention.w_k.weight.grad(),
                     {0.046673974553 + 0.018219726706, 0.033456262715, -0.028375543113, 0.073103267709}, 1e-11);
        check_values(attention.w_k.bias.grad(),
                     {0.046673974553 + 0.018219726706 + 0.033456262715, -0.028375543113 + 0.073103267709}, 1e-11);
        check_values(x.grad(),
                     {0.689286251779, 0.061831805828, 0.382797907543, -0.028375543113, 0.164262773621, 0.073103267709},
                     1e-11);
        gradcheck_layer(attention, {random_input({2, 3, 2}, 15)},
                        [&](const auto& in) { return attention.forward(in[0], in[0]); });
    }
    // ds_0 = a_0 (da_0 - y_00) with da_0 = (1, 1, 0), and dq'_0 = c sum_j ds_0j k'_j
    const double y00 = weights[0] + weights[1];
    const double ds0[3] = {weights[0] * (1 - y00), weights[1] * (1 - y00), weights[2] * (0 - y00)};
    CHECK(std::fabs(ds0[0] - 0.066006967823) <= 1e-11);
    CHECK(std::fabs(ds0[1] - 0.047689199787) <= 1e-11);
    CHECK(std::fabs(ds0[2] - -0.113696167610) <= 1e-11);
    CHECK(std::fabs(c * (ds0[0] + ds0[1] * c1 - ds0[2] * s2) - 0.137996968968) <= 1e-11);
    CHECK(std::fabs(c * (ds0[1] * s1 + ds0[2] * c2) - 0.061831805828) <= 1e-11);
    CHECK(std::fabs(c * ds0[0] - 0.046673974553) <= 1e-11);  // dk'_j = c ds_0j q'_0, q'_0 = (1, 0)
    CHECK(std::fabs(c * ds0[1] - 0.033721356559) <= 1e-11);
    CHECK(std::fabs(c * ds0[2] - -0.080395331112) <= 1e-11);
    // float32 numbers near 10^5 are 2^-7 apart (the angles of "Where relgrad differs")
    CHECK(std::nextafter(1e5f, 2e5f) - 1e5f == 0.0078125f);
}
