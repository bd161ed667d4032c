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
    const int64_t k =
        f.shorthand("k", 0, 4096, 8, "the clipping distance of both sides: the default of k_left and k_right");
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

// --- the relative family beside Shaw (docs/layers/rope.md, alibi.md, t5_bias.md): RoPE rotates q
// and k (engine/ops.hpp, rope); ALiBi and T5 add a score bias b_h(j - i) after the scale.

// ALiBi's slopes m_h, h = 1..H (Press et al. 2022): 2^(-8h/H) for H a power of two; otherwise,
// with n = 2^floor(log2 H), the n slopes of n heads and then every other slope of 2n heads, the
// first H - n of them (the paper's code)
std::vector<double> alibi_slopes(int64_t heads);

// T5's bucket of a distance r = j - i (Raffel et al. 2020; HF's _relative_position_bucket): exact
// for short distances, log-spaced up to max_distance, then the last bucket; bidirectional: half
// the buckets for keys after the query, causal: only keys before it (later ones share bucket 0).
// T5's own choice, the defaults of t5_buckets and t5_max_distance: 32 buckets, the last from 128 on.
inline constexpr int64_t t5_default_buckets = 32, t5_default_max_distance = 128;
int64_t t5_bucket(int64_t distance, bool bidirectional, int64_t num_buckets, int64_t max_distance);

// The family's options; relative_family_option_fields below gives each one's range and default.
struct RelativeFamilyOptions {
    RelativeFamilyOptions();  // every default of relative_family_option_fields
    double rope_base;         // RoPE: theta_t = base^(-2t/Dh)
    int64_t t5_buckets;       // T5: the bias table's rows
    int64_t t5_max_distance;  // T5: distances from here on share the last bucket
};
template <class Fields>
void rope_option_fields(Fields& f, RelativeFamilyOptions& o) {
    f.number("rope_base", o.rope_base, 0, 1e12, true, rope_default_base,
             "RoPE: the base of the angles theta_t = base^(-2t/Dh)");
}
template <class Fields>
void t5_option_fields(Fields& f, RelativeFamilyOptions& o) {
    f.integer("t5_buckets", o.t5_buckets, 4, 4096, t5_default_buckets,
              "T5 bias: the buckets of distances (half per side if bidirectional)");
    f.integer("t5_max_distance", o.t5_max_distance, 1, int64_t{1} << 30, t5_default_max_distance,
              "T5 bias: distances from here on share the last bucket");
    f.check(o.t5_max_distance > o.t5_buckets / 2, "t5_max_distance",
            "more than t5_buckets / 2 = " + std::to_string(o.t5_buckets / 2) + " (the exact buckets end there)");
}
template <class Fields>
void relative_family_option_fields(Fields& f, RelativeFamilyOptions& o) {
    rope_option_fields(f, o);
    t5_option_fields(f, o);
}
// A T5 layer's own choice (a model makes it from its causal rule)
template <class Fields>
void t5_direction_field(Fields& f, bool& bidirectional, bool fallback) {
    f.flag("bidirectional", bidirectional, fallback,
           "T5 bias: buckets for keys on both sides (false: causal buckets, later keys share bucket 0)");
}
inline RelativeFamilyOptions::RelativeFamilyOptions() {
    DefaultFields defaults;
    relative_family_option_fields(defaults, *this);
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
    // bucket r); initialised as an embedding table (truncated normal, std init_std of the
    // options). Low rank: weight is undefined and the table is weight_a [K, rank] times
    // weight_b [rank, Dh or H * Dh], both drawn so that their product has entries of std init_std too.
    Tensor weight, weight_a, weight_b;
    Tensor full_weight() const;  // weight, or weight_a weight_b
};

}  // namespace relgrad
