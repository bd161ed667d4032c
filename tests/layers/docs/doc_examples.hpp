// What the tests of docs/layers/*.md share. Each page's worked examples are checked number for
// number by tests/layers/docs/test_<page>.cpp, one test program per page (ctest layers.docs_<page>).
// Each TEST_CASE is named after the page it checks, rebuilds the page's example with relgrad
// (float64, hand-picked parameters set with assign_parameters in named_parameters() order), checks
// every number the page prints and ends in a gradient check of the same layer.
#pragma once

#include <cmath>
#include <vector>

#include "../layer_check.hpp"
#include "layers/transformer.hpp"

namespace relgrad::testing {

// a hand-picked parameter: float64, a leaf that requires a gradient
inline Tensor param(const std::vector<double>& values, const Shape& shape) {
    return f64(values, shape).requires_grad_(true);
}

inline double sigmoid_of(double x) { return 1 / (1 + std::exp(-x)); }

// w = 1, b = 0 for the four projections of a D = 1, H = 1 attention layer (w_q, w_k, w_v, w_o)
inline std::vector<Tensor> unit_projections() {
    std::vector<Tensor> values;
    for (int i = 0; i < 4; ++i) {
        values.push_back(param({1}, {1, 1}));
        values.push_back(param({0}, {1}));
    }
    return values;
}

// The weights of the four projections: w_q (zero when zero_queries), w_k, w_v, w_o the identity
// [2, 2], every bias 0 (a D = 2 attention layer)
inline std::vector<Tensor> two_wide_projections(bool zero_queries = false) {
    std::vector<Tensor> values;
    for (int i = 0; i < 4; ++i) {
        values.push_back(i == 0 && zero_queries ? param({0, 0, 0, 0}, {2, 2}) : param({1, 0, 0, 1}, {2, 2}));
        values.push_back(param({0, 0}, {2}));
    }
    return values;
}

inline const AttentionImpl all_forms[] = {AttentionImpl::reference, AttentionImpl::bucketed, AttentionImpl::fused};

}  // namespace relgrad::testing
