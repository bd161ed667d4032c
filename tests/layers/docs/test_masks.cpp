// docs/layers/masks.md's worked examples, number for number: the masks and a fully masked row
// (doc_examples.hpp says how these tests are written).
#include "doc_examples.hpp"

using namespace relgrad;
using namespace relgrad::testing;

TEST_CASE("docs/layers/masks.md: masks and a fully masked row") {
    check_values(key_padding_mask({2, 3}, 3), {1, 1, 0, 1, 1, 1});
    CHECK(key_padding_mask({2, 3}, 3).shape() == Shape{2, 1, 1, 3});
    check_values(causal_mask(3, 3), {1, 0, 0, 1, 1, 0, 1, 1, 1});
    check_values(local_window_mask(3, 3, 1), {1, 1, 0, 1, 1, 1, 0, 1, 1});
    check_values(combine_masks(causal_mask(3, 3), local_window_mask(3, 3, 1)), {1, 0, 0, 1, 1, 0, 0, 1, 1});
    const Tensor all =
        combine_masks(combine_masks(causal_mask(3, 3), local_window_mask(3, 3, 1)), key_padding_mask({2, 3}, 3));
    CHECK(all.shape() == Shape{2, 1, 3, 3});
    check_values(all, {1, 0, 0, 1, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 0, 0, 1, 1});
    check_values(causal_mask(1, 4, 3), {1, 1, 1, 1});
    check_values(local_window_mask(1, 4, 1, 3), {0, 0, 1, 1});

    // the attention example: D = 1, H = 1, all weights 1, biases 0 but b_o = 0.5
    Generator gen(9);
    MultiHeadAttention attention(1, 1, Init{gen, DType::float64});
    std::vector<Tensor> values = unit_projections();
    values[7] = param({0.5}, {1});
    attention.assign_parameters(values);
    const Tensor x = param({0, 1, 2, 0, 1, 2}, {2, 3, 1});
    const Tensor mask = combine_masks(causal_mask(3, 3), key_padding_mask({3, 0}, 3));
    const Tensor y = attention.forward(x, x, mask);
    check_values(attention.last_weights,
                 {1, 0, 0,                                         //
                  0.268941421370, 0.731058578630, 0,               //
                  0.015876239976, 0.117310427826, 0.866813332197,  //
                  0, 0, 0, 0, 0, 0, 0, 0, 0},
                 1e-11);
    check_values(y, {0.5, 1.231058578630, 2.350937092221, 0.5, 0.5, 0.5}, 1e-11);
    CHECK(0.117310427826 + 2 * 0.866813332197 == doctest::Approx(1.850937092221).epsilon(1e-11));  // z_2
    y.backward(ones_like(y));
    check_values(x.grad().narrow(0, 1, 1), {0, 0, 0});  // the fully masked sequence gets no gradient
    for (const Tensor& p : attention.parameters()) {
        for (double g : p.grad().to_vector()) CHECK(std::isfinite(g));
    }
    check_values(attention.w_o.bias.grad(), {6});  // dy = 1 on all six outputs
    gradcheck_layer(attention, {random_input({2, 3, 1}, 7)},
                    [&](const auto& in) { return attention.forward(in[0], in[0], mask.to(attention.device())); });
}
