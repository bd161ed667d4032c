// relgrad: position information.
//
// Absolute: a vector per position p added to the token embeddings.
//   SinusoidalPositionalEncoding   PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(same angle)
//   LearnedPositionalEmbedding     a trained table [max_positions, D]
// Relative (Shaw et al. 2018): for query i and key j the distance j - i, clipped to
// [-k_left, k_right] and shifted, indexes a table of K = k_left + k_right + 1 vectors:
//   r(i, j) = clip(j - i, -k_left, k_right) + k_left  in [0, K)
//   RelativePositionEmbedding      the table E [K, Dh] (or one per head, or the rank-r product A B)
//                                  and the index r
#pragma once

#include "layers/basic.hpp"
#include "layers/options.hpp"

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
    LearnedPositionalEmbedding(int64_t max_positions, int64_t dim, const Init& init);
    // x + weight[offset : offset + L], offset + L <= max_positions
    Tensor forward(const Tensor& x, int64_t offset = 0) const;

    int64_t max_positions, dim;
    Tensor weight;
};

// Shaw's options; relative_option_fields below gives each one's range and default.
struct RelativeOptions {
    RelativeOptions();        // every default of relative_option_fields
    int64_t k_left;           // distances below -k_left share the table row 0
    int64_t k_right;          // distances above k_right share the last row
    bool share_across_heads;  // one table for all heads, or one per head
    int64_t rank;             // > 0: each table is a product E = A B of rank `rank`
    bool values;              // attention: Shaw's value-side term too, or the key side alone
    double init_std;          // the tables' entries start as truncated N(0, init_std^2)
};

// The description of RelativeOptions (layers/options.hpp): the config's model section, a layer
// spec and Python's keyword arguments all read it.
template <class Fields>
void relative_option_fields(Fields& f, RelativeOptions& o) {
    const int64_t k = f.shorthand("k", 0, 4096, 8, "the clipping distance of both sides: the default of k_left and k_right");
    f.integer("k_left", o.k_left, 0, 4096, k, "distances below -k_left share the table's first row");
    f.integer("k_right", o.k_right, 0, 4096, k, "distances above k_right share the table's last row");
    f.flag("share_across_heads", o.share_across_heads, true, "one table for all heads (false: one per head)");
    f.integer("rank", o.rank, 0, 8192, 0, "> 0: each table is a product A B of this rank (0: full)");
    f.flag("relative_values", o.values, true, "Shaw's value-side term E_V too (false: the key side alone)");
    f.number("relative_init_std", o.init_std, 0, 10, true, 0.02, "the tables start as N(0, std^2) cut at 2 std");
}

inline RelativeOptions::RelativeOptions() {
    DefaultFields defaults;
    relative_option_fields(defaults, *this);
}

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
};

}  // namespace relgrad
