// relgrad: the basic layers every Transformer is built from.
//   Linear       y = x W^T + b              W [out, in], b [out]
//   Embedding    y = weight[ids]            weight [V, D]
//   LayerNorm    over the last dim           weight, bias [D]
//   Dropout      seeded, only in training mode
//   FeedForward  fc2(dropout(gelu(fc1(x))))  D -> F -> D
#pragma once

#include "engine/ops.hpp"
#include "layers/module.hpp"

namespace relgrad {

class Linear : public Module {
public:
    Linear(int64_t in_features, int64_t out_features, const Init& init, bool bias = true);
    Tensor forward(const Tensor& x) const;  // [..., in] -> [..., out]

    int64_t in_features, out_features;
    Tensor weight, bias;  // bias undefined when built without one
};

class Embedding : public Module {
public:
    Embedding(int64_t num_embeddings, int64_t dim, const Init& init, double init_std = 0.02);
    Tensor forward(const Tensor& ids) const;  // int64 [S...] -> [S..., dim]

    int64_t num_embeddings, dim;
    Tensor weight;
};

class LayerNorm : public Module {
public:
    LayerNorm(int64_t dim, const Init& init, double eps = layer_norm_eps);
    Tensor forward(const Tensor& x) const;

    int64_t dim;
    double eps;
    Tensor weight, bias;
};

class Dropout : public Module {
public:
    Dropout(double p, uint64_t seed);
    Tensor forward(const Tensor& x);  // draws a new mask on every call in training mode
    // residual + forward(x), in one pass (a residual connection around a sublayer)
    Tensor add_to(const Tensor& residual, const Tensor& x);
    void reseed(uint64_t seed) override { gen_ = Generator(seed); }

    double p;

protected:
    void own_generators(std::vector<Generator*>& out) override { out.push_back(&gen_); }

private:
    Generator gen_;
};

class FeedForward : public Module {
public:
    FeedForward(int64_t dim, int64_t hidden_dim, double dropout, const Init& init);
    Tensor forward(const Tensor& x);

    Linear fc1, fc2;
    Dropout dropout;
};

}  // namespace relgrad
