// relgrad: how a fused attention kernel learns which keys a query sees and Shaw's clipped
// relative terms, without an [Lq, Lk] tensor. Shared by the op (engine/ops/attention.cpp) and the
// backends' kernels, which do not include the ops.
#pragma once

#include <cstdint>

#include "engine/errors.hpp"
#include "engine/host_device.hpp"
#include "engine/tensor.hpp"

namespace relgrad {

// Which keys each query may see, for fused_attention, without an [Lq, Lk] tensor where the
// pattern has a rule: query i sits at position query_offset + i, key j at position j.
struct AttentionPattern {
    Tensor mask;               // bool, broadcastable to [B, H, Lq, Lk] (e.g. key padding [B, 1, 1, Lk]), or undefined
    bool causal = false;       // only keys j <= query_offset + i
    int64_t window = -1;       // if >= 0, only keys with |j - (query_offset + i)| <= window
    int64_t query_offset = 0;  // also shifts the relative distances
};
// The largest distance of a query's position (query_offset + i) from key 0, either way: distances
// and sums of positions stay far inside int64, and a position past it indexes no table a model
// can have. (A negative query_offset puts the queries before the first key.)
constexpr int64_t kMaxPosition = int64_t{1} << 40;

// Throws "<op>: query_offset ... must be in [-2^40, 2^40 - Lq] ..." for an offset that puts a
// query of `query_len` further than that from key 0.
inline void check_query_offset(int64_t query_offset, int64_t query_len, const char* op) {
    RELGRAD_CHECK(query_offset >= -kMaxPosition && query_offset <= kMaxPosition - query_len, op, ": query_offset ",
                  query_offset, " must be in [-2^40, 2^40 - Lq] = [", -kMaxPosition, ", ", kMaxPosition - query_len,
                  "] for Lq = ", query_len, " queries");
}

// Throws for what no pattern of `query_len` queries can have: "<op>: window -2 must be >= 0 (or -1
// for none)", or a query_offset check_query_offset refuses.
inline void check_pattern(const AttentionPattern& pattern, int64_t query_len, const char* op) {
    RELGRAD_CHECK(pattern.window >= -1, op, ": window ", pattern.window, " must be >= 0 (or -1 for none)");
    check_query_offset(pattern.query_offset, query_len, op);
}

// Whether the causal and window rules let a query see a key at `distance` = j - (query_offset + i)
// from it (the mask aside).
RELGRAD_HOST_DEVICE inline bool seen_by_rules(bool causal, int64_t window, int64_t distance) {
    return (!causal || distance <= 0) && (window < 0 || (distance <= window && -distance <= window));
}

// The largest clipping distance k_left or k_right: K = k_left + k_right + 1 buckets must fit an
// int64, and far smaller tables cannot be allocated anyway.
constexpr int64_t kMaxClippingDistance = int64_t{1} << 40;

// Position terms that depend on the distance d = j - (query_offset + i) alone, computed per pair,
// never stored per pair:
// - Shaw's tables, with the bucket r(i, j) = clip(d, -k_left, k_right) + k_left: tables
//   [H or 1, k_left + k_right + 1, Dh]. Undefined tables: none.
// - A score bias by distance b_h(d), added to the scaled scores (ALiBi's -m_h |d|, T5's learned
//   buckets): distance_bias [H or 1, Lq + Lk - 1], whose entry distance_entry(i, j, Lq) = j - i +
//   Lq - 1 serves every pair at one distance. Undefined: none.
struct ClippedRelativeTerms {
    Tensor table_k, table_v;
    int64_t k_left = 0, k_right = 0;
    Tensor distance_bias = Tensor();  // (a default: the forms without it need not name it)
};

// The entry of a distance_bias row that query i and key j read: the distances of Lq queries and
// Lk keys, j - i in [-(Lq - 1), Lk - 1], shifted to [0, Lq + Lk - 1). (query_offset moves every
// distance alike, so the row's entries mean other distances but the entry of a pair stays put.)
RELGRAD_HOST_DEVICE inline int64_t distance_entry(int64_t i, int64_t j, int64_t query_len) {
    return j - i + query_len - 1;
}

// The bucket r = clip(distance, -k_left, k_right) + k_left in [0, K) of a key `distance`
// positions from its query (j - (query_offset + i)): the op's index and every kernel family's
// computed buckets come from here.
RELGRAD_HOST_DEVICE inline int64_t clipped_bucket(int64_t distance, int64_t k_left, int64_t k_right) {
    return (distance < -k_left ? -k_left : (distance > k_right ? k_right : distance)) + k_left;
}

}  // namespace relgrad
