// docs/layers/sinusoidal.md's worked examples, number for number: the sinusoidal table and learned
// positions (doc_examples.hpp says how these tests are written).
#include "doc_examples.hpp"

using namespace relgrad;
using namespace relgrad::testing;

TEST_CASE("docs/layers/sinusoidal.md: the sinusoidal table for D = 4, L = 3") {
    SinusoidalPositionalEncoding pe(4);
    const Tensor table = pe.encoding(3, DType::float64);
    check_values(table,
                 {0, 1, 0, 1,                                                      //
                  0.841470984808, 0.540302305868, 0.009999833334, 0.999950000417,  //
                  0.909297426826, -0.416146836547, 0.019998666693, 0.999800006667},
                 1e-11);
    // the dot product of two rows depends only on their distance: cos(1) + cos(0.01) for both pairs
    const auto row = [&](int64_t p) { return table.narrow(0, p, 1).reshape({4}); };
    const double d01 = sum(mul(row(0), row(1))).item(), d12 = sum(mul(row(1), row(2))).item();
    CHECK(d01 == doctest::Approx(1.540252306285).epsilon(1e-12));
    CHECK(std::fabs(d01 - d12) <= 1e-15);
    CHECK(sum(mul(row(0), row(2))).item() == doctest::Approx(std::cos(2.0) + std::cos(0.02)).epsilon(1e-14));
    // forward adds the table to every sequence of the batch; the gradient passes through unchanged
    const Tensor x = zeros({2, 3, 4}, DType::float64).requires_grad_(true);
    const Tensor y = pe.forward(x);
    check_values(y.narrow(0, 1, 1), table.to_vector());
    y.backward(ones_like(y));
    check_values(x.grad(), std::vector<double>(24, 1.0));
    CHECK(pe.parameter_count() == 0);
    // every row has norm sqrt(D/2); token embeddings (std 0.02) are about 40 times shorter unscaled,
    // about 40 / sqrt(D) = 5 times shorter once TokenEmbedding scales them by sqrt(D) (D = 64)
    CHECK(sum(mul(row(2), row(2))).item() == doctest::Approx(2.0).epsilon(1e-14));
    Generator gen(21);
    TransformerOptions o;
    o.dim = 64;
    o.dropout = 0;
    o.position = PositionMode::none;
    TokenEmbedding tokens(4000, o, Init{gen, DType::float64});
    std::vector<double> all_ids(4000);
    for (int i = 0; i < 4000; ++i) all_ids[i] = i;
    const Tensor scaled = tokens.forward(from_vector(all_ids, {1, 4000}, DType::int64));
    const double unscaled_ratio =
        std::sqrt(64.0 / 2) / std::sqrt(sum(mul(tokens.tokens.weight, tokens.tokens.weight)).item() / 4000);
    const double scaled_ratio = std::sqrt(64.0 / 2) / std::sqrt(sum(mul(scaled, scaled)).item() / 4000);
    CHECK(unscaled_ratio > 38);
    CHECK(unscaled_ratio < 42);
    CHECK(scaled_ratio == doctest::Approx(unscaled_ratio / 8).epsilon(1e-12));
    gradcheck_layer(pe, {random_input({2, 3, 4}, 5)}, [&](const auto& in) { return pe.forward(in[0]); });
}

TEST_CASE("docs/layers/sinusoidal.md: learned positions") {
    Generator gen(7);
    LearnedPositionalEmbedding learned(3, 2, Init{gen, DType::float64});
    learned.assign_parameters({param({1, 2, 3, 4, 5, 6}, {3, 2})});
    const Tensor x = zeros({2, 2, 2}, DType::float64).requires_grad_(true);
    const Tensor y = learned.forward(x);
    check_values(y, {1, 2, 3, 4, 1, 2, 3, 4});
    y.backward(ones_like(y));
    check_values(learned.weight.grad(), {2, 2, 2, 2, 0, 0});  // two sequences; position 2 unused
    check_values(x.grad(), std::vector<double>(8, 1.0));
    CHECK_THROWS_WITH_AS(
        learned.forward(zeros({1, 4, 2}, DType::float64)),
        "LearnedPositionalEmbedding: length 4 exceeds max_positions 3 (it has no vector for later positions)",
        std::invalid_argument);
    gradcheck_layer(learned, {random_input({2, 3, 2}, 6)}, [&](const auto& in) { return learned.forward(in[0]); });
}
