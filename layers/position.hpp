// relgrad: position information.
//
// Absolute: a vector per position p added to the token embeddings.
//   SinusoidalPositionalEncoding   PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(same angle)
//   LearnedPositionalEmbedding     a trained table [max_len, D]
// Relative (Shaw et al. 2018): for query i and key j the distance j - i, clipped to
// [-k_left, k_right] and shifted, indexes a table of K = k_left + k_right + 1 vectors:
//   r(i, j) = clip(j - i, -k_left, k_right) + k_left  in [0, K)
//   RelativePositionEmbedding      the table E [K, Dh] (or one per head, or the rank-r product A B)
//                                  and the index r
#pragma once

#include "layers/basic.hpp"

namespace relgrad {

class SinusoidalPositionalEncoding : public Module {
public:
    explicit SinusoidalPositionalEncoding(int64_t dim);
    Tensor encoding(int64_t length, DType dtype, Device device = Device::cpu) const;  // [L, D], positions 0..L-1
    Tensor forward(const Tensor& x, int64_t offset = 0) const;  // x [B, L, D] + PE[offset : offset + L]

    int64_t dim;
};

class LearnedPositionalEmbedding : public Module {
public:
    LearnedPositionalEmbedding(int64_t max_len, int64_t dim, const Init& init);
    Tensor forward(const Tensor& x, int64_t offset = 0) const;  // x + weight[offset : offset + L], within max_len

    int64_t max_len, dim;
    Tensor weight;
};

struct RelativeOptions {
    int64_t k_left = 8;              // distances below -k_left share the table row 0
    int64_t k_right = 8;             // distances above k_right share the last row
    bool share_across_heads = true;  // one table for all heads, or one per head
    int64_t max_len = 512;           // the index is precomputed up to this length (any L works)
    int64_t rank = 0;                // > 0: each table is a product E = A B of rank `rank`
    bool values = true;              // attention: Shaw's value-side term too, or the key side alone
    double init_std = 0.02;          // the tables' entries start as truncated N(0, init_std^2)
};

class RelativePositionEmbedding : public Module {
public:
    RelativePositionEmbedding(int64_t head_dim, int64_t heads, const RelativeOptions& options, const Init& init);

    int64_t buckets() const { return k_left + k_right + 1; }  // K
    // r(i, j) for queries at positions query_offset + [0, Lq) and keys at [0, Lk): int64 [Lq, Lk]
    Tensor index(int64_t query_len, int64_t key_len, int64_t query_offset = 0) const;
    // The table per head: [H, K, Dh], or [1, K, Dh] when shared (broadcasts over heads)
    Tensor table() const;
    // The reference form E[r(i, j)]: [H or 1, Lq, Lk, Dh]
    Tensor lookup(int64_t query_len, int64_t key_len, int64_t query_offset = 0) const;

    int64_t head_dim, heads, k_left, k_right;
    bool shared;
    int64_t rank;  // 0: the table is `weight` itself; else weight_a weight_b
    // The table, [K, Dh] when shared, else [K, H * Dh] (row r holds every head's vector for
    // bucket r); initialised as an embedding table (truncated normal, std 0.02). Low rank: weight
    // is undefined and the table is weight_a [K, rank] times weight_b [rank, Dh or H * Dh], both
    // drawn so that their product has entries of std 0.02 too.
    Tensor weight, weight_a, weight_b;
    Tensor full_weight() const;  // weight, or weight_a weight_b

private:
    Tensor precomputed_;  // index(max_len, max_len); index(Lq, Lk) is its top-left corner
};

}  // namespace relgrad
