#include "layers/position.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/attention_pattern.hpp"
#include "engine/errors.hpp"
#include "engine/ops.hpp"

namespace relgrad {

static void check_sequence(const Tensor& x, int64_t dim, const char* layer) {
    RELGRAD_CHECK(x.dim() == 3 && x.size(2) == dim, layer, ": input of shape ", shape_str(x.shape()),
                  " must be [B, L, D] with D = ", dim);
}

SinusoidalPositionalEncoding::SinusoidalPositionalEncoding(int64_t d) : dim(d) {
    RELGRAD_CHECK(d > 0, "SinusoidalPositionalEncoding: dim must be positive");
}

Tensor SinusoidalPositionalEncoding::encoding(int64_t length, DType dtype, Device device) const {
    RELGRAD_CHECK(length >= 0, "SinusoidalPositionalEncoding: length must be >= 0, got ", length);
    std::vector<double> values(length * dim);
    for (int64_t p = 0; p < length; ++p) {
        for (int64_t c = 0; c < dim; ++c) {
            const int64_t pair = c / 2;  // columns 2i and 2i+1 share the angle p / 10000^(2i/D)
            const double angle = static_cast<double>(p) / std::pow(10000.0, 2.0 * pair / static_cast<double>(dim));
            values[p * dim + c] = c % 2 == 0 ? std::sin(angle) : std::cos(angle);  // odd D ends on a sin column
        }
    }
    return from_vector(values, {length, dim}, dtype, device);
}

Tensor SinusoidalPositionalEncoding::forward(const Tensor& x, int64_t offset) const {
    check_sequence(x, dim, "SinusoidalPositionalEncoding");
    RELGRAD_CHECK(offset >= 0, "SinusoidalPositionalEncoding: negative offset");
    return add(x, encoding(offset + x.size(1), x.dtype(), x.device()).narrow(0, offset, x.size(1)));
}

LearnedPositionalEmbedding::LearnedPositionalEmbedding(int64_t max_positions_, int64_t d, const Init& init)
    : max_positions(max_positions_), dim(d) {
    RELGRAD_CHECK(max_positions > 0 && d > 0, "LearnedPositionalEmbedding: max_positions and dim must be positive");
    register_parameter("weight", weight, truncated_normal({max_positions, dim}, 0.02, init));
}

Tensor LearnedPositionalEmbedding::forward(const Tensor& x, int64_t offset) const {
    check_sequence(x, dim, "LearnedPositionalEmbedding");
    RELGRAD_CHECK(offset >= 0 && offset + x.size(1) <= max_positions, "LearnedPositionalEmbedding: length ",
                  offset + x.size(1), " exceeds max_positions ", max_positions,
                  " (it has no vector for later positions)");
    return add(x, weight.narrow(0, offset, x.size(1)));
}

static RelativeOptions checked(const RelativeOptions& o) {
    RELGRAD_CHECK(
        o.k_left >= 0 && o.k_right >= 0 && o.k_left <= kMaxClippingDistance && o.k_right <= kMaxClippingDistance,
        "RelativePositionEmbedding: clipping distances must be in [0, 2^40], got k_left ", o.k_left, " and k_right ",
        o.k_right);
    RELGRAD_CHECK(o.rank >= 0, "RelativePositionEmbedding: rank must be >= 0 (0: full rank)");
    RELGRAD_CHECK(o.init_std > 0 && std::isfinite(o.init_std),
                  "RelativePositionEmbedding: init_std must be finite and > 0");
    return o;
}

RelativePositionEmbedding::RelativePositionEmbedding(int64_t head_dim_, int64_t heads_, const RelativeOptions& options,
                                                     const Init& init)
    : head_dim(head_dim_),
      heads(heads_),
      k_left(checked(options).k_left),
      k_right(options.k_right),
      shared(options.share_across_heads),
      rank(options.rank) {
    RELGRAD_CHECK(head_dim > 0 && heads > 0, "RelativePositionEmbedding: head_dim and heads must be positive");
    const int64_t width = shared ? head_dim : head_dim * heads;
    if (rank == 0) {
        register_parameter("weight", weight, truncated_normal({buckets(), width}, options.init_std, init));
    } else {
        // (A B)_rd = sum over rank terms of a_rt b_td has std sqrt(rank) s^2 for factors of std s:
        // s is set for init_std (the cut at 2 s makes both this and a full table's spread a little less)
        const double factor_std = std::sqrt(options.init_std / std::sqrt(static_cast<double>(rank)));
        register_parameter("weight_a", weight_a, truncated_normal({buckets(), rank}, factor_std, init));
        register_parameter("weight_b", weight_b, truncated_normal({rank, width}, factor_std, init));
    }
}

Tensor RelativePositionEmbedding::index(int64_t query_len, int64_t key_len, int64_t query_offset) const {
    check_query_offset(query_offset, query_len, "RelativePositionEmbedding");
    std::vector<double> r(query_len * key_len);
    for (int64_t i = 0; i < query_len; ++i) {
        for (int64_t j = 0; j < key_len; ++j) {
            r[i * key_len + j] = static_cast<double>(clipped_bucket(j - (i + query_offset), k_left, k_right));
        }
    }
    return from_vector(r, {query_len, key_len}, DType::int64, (rank == 0 ? weight : weight_a).device());
}

Tensor RelativePositionEmbedding::full_weight() const { return rank == 0 ? weight : matmul(weight_a, weight_b); }

Tensor RelativePositionEmbedding::table() const {
    const int64_t K = buckets();
    const Tensor w = full_weight();
    if (shared) return w.unsqueeze(0);                          // [1, K, Dh]
    return w.reshape({K, heads, head_dim}).permute({1, 0, 2});  // [H, K, Dh]
}

Tensor RelativePositionEmbedding::lookup(int64_t query_len, int64_t key_len, int64_t query_offset) const {
    const Tensor r = index(query_len, key_len, query_offset);
    const Tensor rows = embedding(full_weight(), r);  // [Lq, Lk, Dh] or [Lq, Lk, H * Dh]
    if (shared) return rows.unsqueeze(0);
    return rows.reshape({query_len, key_len, heads, head_dim}).permute({2, 0, 1, 3});  // [H, Lq, Lk, Dh]
}

// ---------------------------------------------------------------- the relative family

std::vector<double> alibi_slopes(int64_t heads) {
    RELGRAD_CHECK(heads > 0, "alibi_slopes: heads must be positive, got ", heads);
    // the n slopes of n heads, a power of two: 2^(-8h/n), h = 1..n
    auto power_of_two_slopes = [](int64_t n) {
        std::vector<double> slopes(n);
        for (int64_t h = 1; h <= n; ++h)
            slopes[h - 1] = std::exp2(-8.0 * static_cast<double>(h) / static_cast<double>(n));
        return slopes;
    };
    int64_t n = 1;
    while (n * 2 <= heads) n *= 2;
    std::vector<double> slopes = power_of_two_slopes(n);
    const std::vector<double> finer = power_of_two_slopes(2 * n);
    for (int64_t e = 0; static_cast<int64_t>(slopes.size()) < heads; e += 2) slopes.push_back(finer[e]);
    return slopes;
}

int64_t t5_bucket(int64_t distance, bool bidirectional, int64_t num_buckets, int64_t max_distance) {
    int64_t bucket = 0, n = 0;
    if (bidirectional) {
        num_buckets /= 2;
        bucket = distance > 0 ? num_buckets : 0;
        n = distance < 0 ? -distance : distance;
    } else {
        n = distance < 0 ? -distance : 0;  // keys after the query share bucket 0
    }
    const int64_t max_exact = num_buckets / 2;
    if (n < max_exact) return bucket + n;
    // log-spaced from max_exact to max_distance, in float64 as T5 computes it
    const int64_t large = max_exact + static_cast<int64_t>(std::log(static_cast<double>(n) / max_exact) /
                                                           std::log(static_cast<double>(max_distance) / max_exact) *
                                                           static_cast<double>(num_buckets - max_exact));
    return bucket + std::min(large, num_buckets - 1);
}

}  // namespace relgrad
