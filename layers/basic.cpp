#include "layers/basic.hpp"

#include <string>

#include "engine/errors.hpp"
#include "engine/ops.hpp"

namespace relgrad {

static void check_last_dim(const Tensor& x, int64_t expected, const char* layer) {
    RELGRAD_CHECK(x.dim() > 0 && x.size(-1) == expected, layer, ": input of shape ", shape_str(x.shape()),
                  " must end in dim ", expected);
}

Linear::Linear(int64_t in, int64_t out, const Init& init, bool with_bias) : in_features(in), out_features(out) {
    RELGRAD_CHECK(in > 0, "Linear: in_features must be positive, got ", in);
    RELGRAD_CHECK(out > 0, "Linear: out_features must be positive, got ", out);
    register_parameter("weight", weight, xavier_uniform({out, in}, init));
    if (with_bias) register_parameter("bias", bias, zeros({out}, init.dtype));
}

// y = x W^T + b   (the transpose is a view; BLAS reads it in place). Leading dims are flattened
// first, so that the backward's dW = g^T x is one product over all rows rather than one per batch
// entry summed afterwards.
Tensor Linear::forward(const Tensor& x) const {
    check_last_dim(x, in_features, "Linear");
    Shape out_shape = x.shape();
    out_shape.back() = out_features;
    Tensor y = matmul(x.reshape({-1, in_features}), weight.transpose(0, 1));
    if (bias.defined()) y = add(y, bias);
    return y.reshape(out_shape);
}

Embedding::Embedding(int64_t n, int64_t d, const Init& init, double init_std) : num_embeddings(n), dim(d) {
    RELGRAD_CHECK(n > 0, "Embedding: num_embeddings must be positive, got ", n);
    RELGRAD_CHECK(d > 0, "Embedding: dim must be positive, got ", d);
    register_parameter("weight", weight, truncated_normal({n, d}, init_std, init));
}

Tensor Embedding::forward(const Tensor& ids) const { return embedding(weight, ids); }

LayerNorm::LayerNorm(int64_t d, const Init& init, double eps_) : dim(d), eps(eps_) {
    RELGRAD_CHECK(d > 0, "LayerNorm: dim must be positive, got ", d);
    register_parameter("weight", weight, ones({d}, init.dtype));
    register_parameter("bias", bias, zeros({d}, init.dtype));
}

Tensor LayerNorm::forward(const Tensor& x) const {
    check_last_dim(x, dim, "LayerNorm");
    return layer_norm(x, weight, bias, eps);
}

Dropout::Dropout(double p_, uint64_t seed) : p(p_), gen_(seed) {
    RELGRAD_CHECK(p >= 0 && p < 1, "Dropout: p must be in [0, 1), got ", std::to_string(p));
}

Tensor Dropout::forward(const Tensor& x) { return dropout(x, p, is_training(), gen_); }
Tensor Dropout::add_to(const Tensor& residual, const Tensor& x) {
    return dropout_add(residual, x, p, is_training(), gen_);
}

FeedForward::FeedForward(int64_t d, int64_t hidden, double p, const Init& init)
    : fc1(d, hidden, init), fc2(hidden, d, init), dropout(p, init.gen.next_u64()) {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("dropout", dropout);
}

Tensor FeedForward::forward(const Tensor& x) { return fc2.forward(dropout.forward(gelu(fc1.forward(x)))); }

}  // namespace relgrad
