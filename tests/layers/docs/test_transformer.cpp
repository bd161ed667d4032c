// docs/layers/transformer.md's worked examples, number for number: a pre-LN encoder layer by hand
// and what each position mode adds (doc_examples.hpp says how these tests are written).
#include "doc_examples.hpp"

using namespace relgrad;
using namespace relgrad::testing;

namespace {

TransformerOptions two_wide(PositionMode mode) {
    TransformerOptions o;
    o.dim = 2;
    o.heads = 1;
    o.ff_dim = 2;
    o.layers = 1;
    o.dropout = 0;
    o.position = mode;
    return o;
}

// identity weights, LayerNorm weights 1, every bias 0 (zero_outputs: w_o and fc2 weights 0 too)
std::vector<Tensor> identity_parameters(const Module& layer, bool zero_outputs = false) {
    std::vector<Tensor> values;
    for (const auto& [name, p] : layer.named_parameters()) {
        const bool is_weight = name.size() >= 6 && name.compare(name.size() - 6, 6, "weight") == 0;
        const bool is_norm = name.rfind("norm", 0) == 0;
        const bool is_output = name.find("w_o.") != std::string::npos || name.find("fc2.") != std::string::npos;
        if (!is_weight || (zero_outputs && is_output) || name.find("rel_pos_emb") != std::string::npos) {
            values.push_back(zeros(p.shape(), DType::float64).requires_grad_(true));
        } else {
            values.push_back(is_norm ? param({1, 1}, {2}) : param({1, 0, 0, 1}, {2, 2}));
        }
    }
    return values;
}

}  // namespace

TEST_CASE("docs/layers/transformer.md: a pre-LN encoder layer by hand") {
    Generator gen(16);
    EncoderLayer layer(two_wide(PositionMode::none), Init{gen, DType::float64});
    layer.assign_parameters(identity_parameters(layer));
    const Tensor x = param({3, 1, 0, 2}, {1, 2, 2});
    const Tensor y = layer.forward(x, Tensor());
    check_values(y, {4.729721366055, -0.047033509696, -1.047033509696, 3.729721366055}, 1e-11);
    // the same by hand: norm1(x) = +-c (1, -1), z_0 = c tanh(c^2 sqrt 2) (1, -1), then norm2 and GELU
    const double c = 1 / std::sqrt(1 + 1e-5), t = c * std::tanh(c * c * std::sqrt(2.0));
    CHECK(c == doctest::Approx(0.999995000037).epsilon(1e-12));
    CHECK(c * c * std::sqrt(2.0) == doctest::Approx(1.414199420379).epsilon(1e-12));
    check_values(layer.self_attention->last_weights, {0.944191290412, 0.055808709588, 0.055808709588, 0.944191290412},
                 1e-11);
    CHECK(sigmoid_of(2 * c * c * std::sqrt(2.0)) == doctest::Approx(0.944191290412).epsilon(1e-11));
    CHECK(std::tanh(c * c * std::sqrt(2.0)) == doctest::Approx(0.888382580825).epsilon(1e-11));
    CHECK(t == doctest::Approx(0.888378138945).epsilon(1e-11));
    CHECK(3 + t == doctest::Approx(3.888378138945).epsilon(1e-12));
    CHECK(1 - t == doctest::Approx(0.111621861055).epsilon(1e-10));
    const double spread = 1 + t, c2 = spread / std::sqrt(spread * spread + 1e-5);
    auto gelu_of = [](double v) { return v * 0.5 * std::erfc(-v / std::sqrt(2.0)); };
    CHECK(c2 == doctest::Approx(0.999998597861).epsilon(1e-11));
    CHECK(gelu_of(c2) == doctest::Approx(0.841343227110).epsilon(1e-11));
    CHECK(gelu_of(-c2) == doctest::Approx(-0.158655370751).epsilon(1e-11));
    check_values(y.narrow(1, 0, 1), {3 + t + gelu_of(c2), 1 - t + gelu_of(-c2)});
    y.backward(f64({1, 0, 0, 0}, {1, 2, 2}));
    check_values(x.grad(), {1.000007760833, -0.000007760833, -0.000000466150, 0.000000466150}, 1e-11);

    // with w_o = 0 and fc2 = 0 (and their biases) the layer is the identity, and so is its gradient
    Generator gen2(17);
    EncoderLayer silent(two_wide(PositionMode::relative), Init{gen2, DType::float64});
    silent.assign_parameters(identity_parameters(silent, true));
    const Tensor x2 = param({3, 1, 0, 2}, {1, 2, 2});
    const Tensor y2 = silent.forward(x2, Tensor());
    check_values(y2, {3, 1, 0, 2});
    y2.backward(f64({1, 2, 3, 4}, {1, 2, 2}));
    check_values(x2.grad(), {1, 2, 3, 4});

    Generator gen3(18);
    TransformerOptions o = two_wide(PositionMode::gated);
    o.dim = 4;
    o.heads = 2;
    o.relative.k_left = o.relative.k_right = 1;
    EncoderLayer gated(o, Init{gen3, DType::float64});
    gradcheck_layer(gated, {random_input({2, 3, 4}, 13)},
                    [&](const auto& in) { return gated.forward(in[0], causal_mask(3, 3, 0, gated.device())); });
}

TEST_CASE("docs/layers/transformer.md: what each position mode adds, in parameters") {
    const int64_t expected[] = {225, 225, 257, 245, 287, 225, 225, 289};
    int n = 0;
    for (PositionMode mode :
         {PositionMode::none, PositionMode::sinusoidal, PositionMode::learned, PositionMode::relative,
          PositionMode::gated, PositionMode::rope, PositionMode::alibi, PositionMode::t5}) {
        CAPTURE(position_mode_name(mode));
        TransformerOptions o;
        o.dim = 4;
        o.heads = 2;
        o.ff_dim = 8;
        o.layers = 1;
        o.position = mode;
        o.relative.k_left = o.relative.k_right = 2;
        o.max_positions = 8;
        Generator gen(19);
        CausalLanguageModel lm(5, o, Init{gen, DType::float64});
        CHECK(lm.parameter_count() == expected[n++]);
        if (mode == PositionMode::relative) {
            o.relative.share_across_heads = false;
            CausalLanguageModel per_head(5, o, Init{gen, DType::float64});
            CHECK(per_head.parameter_count() == 265);
        }
        if (mode == PositionMode::gated) {
            CHECK(lm.gates() == std::vector<std::vector<double>>{{0.5, 0.5}});
            o.token_gate = true;
            CausalLanguageModel token(5, o, Init{gen, DType::float64});
            CHECK(token.parameter_count() == 295);
            o.token_gate = false;
            o.relative.share_across_heads = false;
            CausalLanguageModel per_head(5, o, Init{gen, DType::float64});
            CHECK(per_head.parameter_count() == 307);
        }
    }
    // counted by hand: tokens 5*4, layer 2*4 + 4*(16+4) + 2*4 + (4*8+8 + 8*4+4), final norm 2*4, head 4*5+5
    CHECK(20 + (8 + 80 + 8 + 76) + 8 + 25 == 225);
    CHECK(225 + 32 * 2 == 289);  // t5: one [t5_buckets, H] table in the one layer
    TransformerOptions o;
    o.dim = 4;
    o.heads = 2;
    o.ff_dim = 8;
    o.layers = 1;
    o.dropout = 0.1;
    o.position = PositionMode::gated;
    o.relative.k_left = o.relative.k_right = 1;
    Generator gen(20);
    SequenceClassifier classifier(5, 2, o, Pooling::mean, Init{gen, DType::float64});
    const Tensor ids = from_vector({1, 2, 3, 4, 0, 0}, {2, 3}, DType::int64);
    gradcheck_layer(
        classifier, {},
        [&](const auto&) {
            return classifier.forward(ids.to(classifier.device()), {3, 1});
        },
        true);
}
