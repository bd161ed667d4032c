// fused_attention: equal to the bucketed attention op (itself checked against its composition from
// ops in test_nn.cpp) to 1e-12 in float64, outputs and all five gradients, for every mask rule,
// sizes that span several tiles, head widths 32 to 128, offsets, asymmetric and per-head tables;
// independent of the thread count; the same on the guarded CPU device, and the bucketed fallback
// of a device without fused kernels; the CUDA kernels (on the test build's cuda device) to 1e-12
// and deterministic; bfloat16 on the CPU within the 16-bit kernels' error; gradient-checked; bad
// input rejected. One file: the fused_attention op on every device, one test program per engine family.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <tuple>

#include "test_helpers.hpp"
#include "engine/half.hpp"
#include "engine/backend/cpu/cpu_backend.hpp"
#ifdef RELGRAD_TEST_CUDA
#include "engine/backend/cuda/cuda_backend.hpp"
#endif

using namespace relgrad;
using namespace relgrad::testing;

namespace {

struct Case {
    int64_t B = 2, H = 2, Lq = 5, Lk = 5, Dh = 4;
    int64_t k_left = 2, k_right = 2;
    bool relative = true, per_head = false;
    bool distance_bias = false;  // a bias per distance (per head with per_head), fused runs only
    AttentionPattern pattern;
    Tensor padding;  // bool [B, Lk], true = a real key, or undefined
};

// r(i, j) as an [Lq, Lk] tensor, and the pattern's rules as a dense [B, 1, Lq, Lk] mask
Tensor bucket_index(const Case& c) {
    std::vector<double> r;
    for (int64_t i = 0; i < c.Lq; ++i)
        for (int64_t j = 0; j < c.Lk; ++j)
            r.push_back(std::clamp(j - (c.pattern.query_offset + i), -c.k_left, c.k_right) + c.k_left);
    return from_vector(r, {c.Lq, c.Lk}, DType::int64);
}

Tensor dense_mask(const Case& c) {
    const std::vector<double> padding = c.padding.defined() ? c.padding.to_vector() : std::vector<double>();
    std::vector<double> keep;
    for (int64_t b = 0; b < c.B; ++b)
        for (int64_t i = 0; i < c.Lq; ++i)
            for (int64_t j = 0; j < c.Lk; ++j) {
                const int64_t position = c.pattern.query_offset + i;
                bool visible = !c.pattern.causal || j <= position;
                if (c.pattern.window >= 0) visible = visible && std::abs(j - position) <= c.pattern.window;
                if (!padding.empty()) visible = visible && padding[b * c.Lk + j] != 0;
                keep.push_back(visible);
            }
    return from_vector(keep, {c.B, 1, c.Lq, c.Lk}, DType::boolean);
}

struct Result {
    Tensor z;
    std::vector<Tensor> grads;  // q, k, v, [table_k, table_v], [distance bias]
};

// Runs one form forward and backward with the cotangent w; the inputs come from the seed, their
// values rounded to `values` (a 16-bit run's values, in float64 for its reference).
Result run(const Case& c, bool fused, DType dtype = DType::float64, uint64_t seed = 11, Device device = Device::cpu,
           DType values = DType::float64) {
    Generator gen(seed);
    const auto random = [&](const Shape& shape) { return randn(shape, gen, values, device).to(dtype); };
    std::vector<Tensor> inputs = {random({c.B, c.H, c.Lq, c.Dh}), random({c.B, c.H, c.Lk, c.Dh}),
                                  random({c.B, c.H, c.Lk, c.Dh})};
    const int64_t tables = c.per_head ? c.H : 1, K = c.k_left + c.k_right + 1;
    if (c.relative) {
        inputs.push_back(random({tables, K, c.Dh}));
        inputs.push_back(random({tables, K, c.Dh}));
    }
    if (c.distance_bias) inputs.push_back(random({tables, c.Lq + c.Lk - 1}));
    const Tensor w = random({c.B, c.H, c.Lq, c.Dh});
    for (Tensor& t : inputs) t.requires_grad_(true);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.Dh));
    Tensor z;
    if (fused) {
        AttentionPattern pattern = c.pattern;
        if (c.padding.defined()) pattern.mask = c.padding.reshape({c.B, 1, 1, c.Lk}).to(device);
        ClippedRelativeTerms rel =
            c.relative ? ClippedRelativeTerms{inputs[3], inputs[4], c.k_left, c.k_right} : ClippedRelativeTerms{};
        if (c.distance_bias) rel.distance_bias = inputs.back();
        z = fused_attention(inputs[0], inputs[1], inputs[2], pattern, scale, rel);
    } else {
        REQUIRE_FALSE(c.distance_bias);
        const RelativeTerms rel =
            c.relative ? RelativeTerms{inputs[3], inputs[4], bucket_index(c).to(device)} : RelativeTerms{};
        z = attention(inputs[0], inputs[1], inputs[2], dense_mask(c).to(device), scale, rel);
    }
    sum(mul(z, w)).backward();
    Result result{z.detach(), {}};
    for (const Tensor& t : inputs) result.grads.push_back(t.grad());
    return result;
}

// as check_same, within tol (1 + |expected value|): for 16-bit results, whose rounding grows with
// their size
void check_close(const Result& on_cuda, const Result& expected, double tol) {
    check_same_values(on_cuda.z.to_vector(), expected.z.to_vector(), Device::cuda, "z", tol);
    REQUIRE(on_cuda.grads.size() == expected.grads.size());
    for (std::size_t n = 0; n < expected.grads.size(); ++n) {
        check_same_values(on_cuda.grads[n].to_vector(), expected.grads[n].to_vector(), Device::cuda,
                          "gradient of input " + std::to_string(n), tol);
    }
}

void check_same(const Result& fused, const Result& expected, double tol) {
    check_values(fused.z, expected.z.to_vector(), tol);
    REQUIRE(fused.grads.size() == expected.grads.size());
    for (std::size_t n = 0; n < fused.grads.size(); ++n) {
        INFO("gradient of input " << n);
        check_values(fused.grads[n], expected.grads[n].to_vector(), tol);
    }
}

// Fused against bucketed on the CPU; then on the guarded CPU device, whose fused kernels must give
// the CPU's results exactly, and which, with its fused kernels switched off, must fall back to the
// bucketed op (the same results as the bucketed op on the CPU); and on the test build's cuda
// device, whose fused kernels (the CUDA ones, tiled otherwise) must agree to 1e-12, the same bits
// run after run.
void check_equals_bucketed(const Case& c) {
    const Result fused = run(c, true), bucketed = run(c, false);
    check_same(fused, bucketed, 1e-12);
#ifdef RELGRAD_TEST_CUDA
    {
        INFO("on cuda");
        const Result on_cuda = run(c, true, DType::float64, 11, Device::cuda);
        REQUIRE(on_cuda.z.device() == Device::cuda);
        check_same(on_cuda, bucketed, 1e-12);
        check_same(run(c, true, DType::float64, 11, Device::cuda), on_cuda, 0);
    }
#endif
    check_same(run(c, true, DType::float64, 11, Device::guarded_cpu), fused, 0);
    const Result fallback = [&] {
        const NoFusedAttentionGuard bucketed_only(guarded_cpu_backend());
        return run(c, true, DType::float64, 11, Device::guarded_cpu);
    }();
    check_same(fallback, bucketed, 0);
}

}  // namespace

TEST_CASE("pattern_mask writes the pattern's rules, on the device it is asked for") {
    Case c;
    c.B = 1;
    c.Lq = 4;
    c.Lk = 7;
    const std::vector<std::tuple<bool, int64_t, int64_t>> patterns = {
        // causal, window, query_offset
        {true, -1, 0}, {true, -1, 3}, {false, 0, 0}, {false, 2, 2}, {true, 1, 3}, {true, 2, -3}, {false, 1, 9}};
    for (const auto& [causal, window, offset] : patterns) {
        c.pattern.causal = causal;
        c.pattern.window = window;
        c.pattern.query_offset = offset;
        const std::vector<double> expected = dense_mask(c).to_vector();
        for (Device device : std::vector<Device>{Device::cpu, Device::guarded_cpu, other_devices().back()}) {
            const Tensor mask = pattern_mask(c.pattern, c.Lq, c.Lk, device);
            CHECK(mask.device() == device);
            CHECK(mask.dtype() == DType::boolean);
            CHECK(mask.shape() == Shape{c.Lq, c.Lk});
            CHECK_MESSAGE(mask.to(Device::cpu).to_vector() == expected, "causal " << causal << ", window " << window
                                                                                  << ", offset " << offset << " on "
                                                                                  << device_name(device));
        }
    }
}

TEST_CASE("fused attention equals the bucketed op, outputs and gradients, with each mask rule") {
    Case c;
    SUBCASE("no mask") { check_equals_bucketed(c); }
    SUBCASE("causal") {
        c.pattern.causal = true;
        check_equals_bucketed(c);
    }
    SUBCASE("local window") {
        c.pattern.window = 1;
        check_equals_bucketed(c);
    }
    SUBCASE("key padding, one sequence padded to a single key") {
        c.padding = from_vector({1, 1, 1, 1, 1, 1, 0, 0, 0, 0}, {2, 5}, DType::boolean);
        check_equals_bucketed(c);
    }
    SUBCASE("causal, window and padding together; some queries see no key") {
        c.pattern.causal = true;
        c.pattern.window = 1;
        c.padding = from_vector({0, 1, 1, 1, 1, 0, 0, 1, 1, 1}, {2, 5}, DType::boolean);
        check_equals_bucketed(c);
    }
    SUBCASE("without relative terms") {
        c.relative = false;
        c.pattern.causal = true;
        check_equals_bucketed(c);
    }
    SUBCASE("per-head, asymmetric tables") {
        c.per_head = true;
        c.k_left = 3;
        c.k_right = 1;
        check_equals_bucketed(c);
    }
    SUBCASE("k >= L and L = 1") {
        c.k_left = c.k_right = 7;
        check_equals_bucketed(c);
        c.Lq = c.Lk = 1;
        check_equals_bucketed(c);
    }
    SUBCASE("k = 0: one bucket") {
        c.k_left = c.k_right = 0;
        check_equals_bucketed(c);
    }
    SUBCASE("edge cases: no keys, no queries, offsets outside the keys, a window of 0") {
        c.Lk = 0;
        check_equals_bucketed(c);  // every query sees nothing: z = 0
        c.Lk = 5;
        c.Lq = 0;
        check_equals_bucketed(c);
        c.Lq = 4;
        c.pattern.query_offset = -3;
        c.pattern.causal = true;
        check_equals_bucketed(c);
        c.pattern.query_offset = 9;  // beyond the last key
        c.pattern.window = 6;
        check_equals_bucketed(c);
        c.pattern = {};
        c.pattern.window = 0;
        c.padding = from_vector({1, 0, 1, 1, 1, 1, 1, 1, 0, 1}, {2, 5}, DType::boolean);
        check_equals_bucketed(c);
    }
    SUBCASE("queries at an offset, as in incremental decoding") {
        c.Lq = 2;
        c.Lk = 7;
        c.pattern.query_offset = 5;
        c.pattern.causal = true;
        check_equals_bucketed(c);
    }
}

TEST_CASE("fused attention over several tiles: the online softmax rescales across key tiles") {
    // tiles are 64 queries x 256 keys: 3 query tiles and 2 key tiles, the last ones partial
    Case c;
    c.B = 1;
    c.Lq = 150;
    c.Lk = 300;
    c.Dh = 3;
    c.k_left = c.k_right = 8;
    SUBCASE("dense") { check_equals_bucketed(c); }
    SUBCASE("causal with padding, so tiles are skipped and rows cut") {
        c.H = 1;
        c.pattern.causal = true;
        c.pattern.query_offset = 100;
        std::vector<double> keep(300, 1.0);
        std::fill(keep.begin() + 290, keep.end(), 0.0);
        c.padding = from_vector(keep, {1, 300}, DType::boolean);
        check_equals_bucketed(c);
    }
    SUBCASE("clipping windows wider than a tile: the diagonal keys cross tile edges") {
        c.k_left = 100;
        c.k_right = 290;
        c.pattern.query_offset = 40;
        check_equals_bucketed(c);
    }
    SUBCASE("a local window narrower than a tile") {
        c.pattern.window = 20;
        check_equals_bucketed(c);
    }
}

TEST_CASE("fused attention at the head widths models use (32, 64, 128), an odd length, every mask") {
    // the kernels' per-row arrays and shared tiles at real widths (the cases above use 3 and 4),
    // with L odd so that no tile is whole
    for (int64_t Dh : {32, 64, 128}) {
        CAPTURE(Dh);
        Case c;
        c.H = 1;
        c.Lq = c.Lk = 37;
        c.Dh = Dh;
        c.k_left = 4;
        c.k_right = 3;
        check_equals_bucketed(c);  // no mask
        Case causal = c;           // 19 queries after 18 earlier positions
        causal.Lq = 19;
        causal.pattern.causal = true;
        causal.pattern.query_offset = 18;
        check_equals_bucketed(causal);
        Case windowed = c;  // a window, and the second sequence padded after 30 keys
        windowed.pattern.window = 5;
        std::vector<double> keep(2 * 37, 1.0);
        std::fill(keep.begin() + 37 + 30, keep.end(), 0.0);
        windowed.padding = from_vector(keep, {2, 37}, DType::boolean);
        check_equals_bucketed(windowed);
    }
}

#ifdef RELGRAD_TEST_CUDA
namespace {

// The cases the tensor-core kernels are held to at head width Dh: one block of 64 queries, partly
// filled, over three tiles of 32 keys, the last partly; with no mask, causal with a row that sees
// no key (query 0 at position -1), and a window with the second sequence padded after 50 keys.
std::vector<Case> tensor_core_cases(int64_t Dh) {
    Case c;
    c.Lq = 45;
    c.Lk = 70;
    c.Dh = Dh;
    c.k_left = 4;
    c.k_right = 3;
    Case causal = c;
    causal.pattern.causal = true;
    causal.pattern.query_offset = -1;
    Case windowed = c;
    windowed.pattern.window = 9;
    std::vector<double> keep(2 * 70, 1.0);
    std::fill(keep.begin() + 70 + 50, keep.end(), 0.0);
    windowed.padding = from_vector(keep, {2, 70}, DType::boolean);
    // a distance bias (ALiBi's or T5's) instead of Shaw's terms: one row for both heads, or a row a head
    Case causal_biased = causal, window_biased = windowed;
    causal_biased.relative = window_biased.relative = false;
    causal_biased.distance_bias = window_biased.distance_bias = window_biased.per_head = true;
    causal_biased.Lq = 100;  // past 64 rows: every warp of a bias gradient block takes rows, twice
    causal_biased.Lk = 90;
    return {c, causal, windowed, causal_biased, window_biased};
}

}  // namespace

TEST_CASE("on cuda, float32 at head widths 32, 64 and 128 runs forward on tensor cores, within tf32's error") {
    // tf32 keeps 10 of float32's 23 mantissa bits: q, k, P and V are each rounded by at most 2^-11
    // of themselves before their products, which are then exact, summed in float32. A score
    // c q.k then errs by at most 2^-10 c sum_d |q_d k_d|, about 1.5e-3 per unit of c sum |q_d k_d|
    // (some 7 for these N(0, 1) rows at Dh = 128, so under 1e-2, and far less on average); a
    // softmax weight by about as much relatively, and z, a weighted mean of V rows of size ~1,
    // by that plus V's own 2^-11. Outputs and gradients (the backward recomputes from this lse)
    // are held to 1e-2 of float64 on the CPU; a fragment element in a wrong
    // place errs by the size of a value, ~1.
    const double tf32_tolerance = 1e-2;
    for (int64_t Dh : {32, 64, 128}) {
        CAPTURE(Dh);
        std::vector<Case> cases = tensor_core_cases(Dh);
        const Case causal = cases[1];
        Case plain = cases[0];
        plain.relative = false;
        Case edges_only = cases[0];  // K = 2: the two edge buckets and no interior one
        edges_only.k_left = 1;
        edges_only.k_right = 0;
        cases.push_back(plain);
        cases.push_back(edges_only);
        for (const Case& each : cases) {
            const Result on_cuda = run(each, true, DType::float32, 11, Device::cuda),
                         expected = run(each, true, DType::float64);
            // a distance bias's gradient sums dS over every pair at its distance (up to B x Lq of
            // them, both heads' for a shared row): it reaches ~20 here, with errors that grow with
            // it (2e-4 to 6e-4 of it measured, as for dq, with inputs exact in tf32), so those cases
            // are held to tf32_tolerance x (1 + |value|)
            if (each.distance_bias) {
                check_close(on_cuda, expected, tf32_tolerance);
            } else {
                check_same(on_cuda, expected, tf32_tolerance);
            }
        }
        // the forward alone: its last kernel is the tensor cores' (the scalar kernel would also pass
        // the check above; on the emulated device, whose launches the test sees), and a distance
        // bias (ALiBi's or T5's) is added per pair
        Generator gen(4);
        const Tensor q = randn({2, 2, 45, Dh}, gen, DType::float64), k = randn({2, 2, 70, Dh}, gen, DType::float64),
                     v = randn({2, 2, 70, Dh}, gen, DType::float64),
                     bias = randn({2, 45 + 70 - 1}, gen, DType::float64);
        const ClippedRelativeTerms terms{Tensor(), Tensor(), 0, 0, bias};
        const Tensor expected = fused_attention(q, k, v, causal.pattern, 0.125, terms);
        const ClippedRelativeTerms on_cuda{Tensor(), Tensor(), 0, 0, bias.to(DType::float32).to(Device::cuda)};
        const Tensor z = fused_attention(q.to(DType::float32).to(Device::cuda), k.to(DType::float32).to(Device::cuda),
                                         v.to(DType::float32).to(Device::cuda), causal.pattern, 0.125, on_cuda);
        const bool emulated = &backend_for(Device::cuda) == &cuda_emulated::cuda_backend();  // (not a GPU's)
        if (emulated) {
            CHECK(std::string(cuda_emulated::last_kernel_launched().load()) == "fused_attention (tensor cores, tf32)");
        }
        check_values(z.to(Device::cpu), expected.to_vector(), tf32_tolerance);
        // the distance bias's gradient is the tensor cores' too: the last launch of a backward
        // without Shaw's terms
        if (emulated) {
            const Tensor q32 = q.to(DType::float32).to(Device::cuda), k32 = k.to(DType::float32).to(Device::cuda),
                         v32 = v.to(DType::float32).to(Device::cuda);
            Tensor z32 = empty({2, 2, 45, Dh}, DType::float32, Device::cuda),
                   lse = empty({2, 2, 45}, DType::float32, Device::cuda);
            Backend& cuda = backend_for(Device::cuda);
            cuda.fused_attention(q32, k32, v32, causal.pattern, 0.125, on_cuda, z32, lse);
            Tensor dq = empty(q32.shape(), DType::float32, Device::cuda),
                   dk = empty(k32.shape(), DType::float32, Device::cuda),
                   dv = empty(v32.shape(), DType::float32, Device::cuda), no_table_k, no_table_v,
                   d_bias = empty({2, 2, 45 + 70 - 1}, DType::float32, Device::cuda);
            cuda.fused_attention_backward(q32, k32, v32, z32, lse,
                                          randn(z32.shape(), gen, DType::float32, Device::cuda), causal.pattern, 0.125,
                                          on_cuda, dq, dk, dv, no_table_k, no_table_v, d_bias);
            CHECK(std::string(cuda_emulated::last_kernel_launched().load()) ==
                  "fused_attention_backward (distance bias, tensor cores, tf32)");
        }
    }
}

namespace {

// The cases where a GPU bug of the tensor-core kernels would show that tensor_core_cases do not
// reach (one or two query blocks of 64 rows and at most three key tiles of 32 there), at head
// width Dh:
std::vector<std::pair<std::string, Case>> tensor_core_edge_cases(int64_t Dh) {
    Case base;
    base.Dh = Dh;
    base.k_left = 4;
    base.k_right = 3;
    std::vector<std::pair<std::string, Case>> cases;
    Case many_tiles = base;  // 7 key tiles: each cp.async buffer refilled more than once
    many_tiles.Lq = 70;
    many_tiles.Lk = 200;
    cases.emplace_back("7 key tiles", many_tiles);
    Case blocks = base;  // Shaw's terms over two query blocks, a table per head (a distance bias
    blocks.Lq = 100;     // over two blocks is among tensor_core_cases; the op takes one or the other)
    blocks.Lk = 90;
    blocks.per_head = true;
    blocks.pattern.causal = true;
    cases.emplace_back("Shaw's per-head terms over two query blocks", blocks);
    Case wide = base;  // clipping distances past a key tile
    wide.Lq = 70;
    wide.Lk = 100;
    wide.k_left = 40;
    wide.k_right = 35;
    cases.emplace_back("k_left 40, k_right 35", wide);
    Case plain = base;  // no relative terms at all
    plain.Lq = 45;
    plain.Lk = 70;
    plain.relative = false;
    cases.emplace_back("no relative terms", plain);
    Case decoding = base;  // incremental decoding: 20 new queries after 50 positions
    decoding.Lq = 20;
    decoding.Lk = 70;
    decoding.pattern.causal = true;
    decoding.pattern.query_offset = 50;
    cases.emplace_back("query offset 50, causal", decoding);
    Case narrow = base;  // a window narrower than a query block cuts the key kernel's query range
    narrow.Lq = narrow.Lk = 100;
    narrow.pattern.window = 5;
    cases.emplace_back("window 5 over 100", narrow);
    for (int64_t offset : {0, 21}) {  // the block of distances a bias reads starts at the diagonal
        Case diagonal = base;
        diagonal.Lq = 49;
        diagonal.Lk = 70;
        diagonal.relative = false;
        diagonal.distance_bias = true;
        diagonal.pattern.causal = true;
        diagonal.pattern.query_offset = offset;
        cases.emplace_back("a causal distance bias, Lq 49, Lk 70, offset " + std::to_string(offset), diagonal);
    }
    Case sliding = base;  // a sliding window over 200 positions
    sliding.Lq = sliding.Lk = 200;
    sliding.pattern.window = 16;
    cases.emplace_back("window 16 over 200", sliding);
    return cases;
}

// Case c's inputs on the cuda device in `dtype`, drawn from gen: q, k, v, then the tables and the
// distance bias the case has (a table pair and a bias row a head with per_head, else one).
struct CudaInputs {
    Tensor q, k, v;
    ClippedRelativeTerms terms;
};
CudaInputs cuda_inputs(const Case& c, DType dtype, Generator& gen) {
    const auto random = [&](const Shape& shape) { return randn(shape, gen, dtype, Device::cuda); };
    CudaInputs in{random({c.B, c.H, c.Lq, c.Dh}), random({c.B, c.H, c.Lk, c.Dh}), random({c.B, c.H, c.Lk, c.Dh}), {}};
    const int64_t tables = c.per_head ? c.H : 1, K = c.k_left + c.k_right + 1;
    if (c.relative) in.terms = {random({tables, K, c.Dh}), random({tables, K, c.Dh}), c.k_left, c.k_right};
    if (c.distance_bias) in.terms.distance_bias = random({tables, c.Lq + c.Lk - 1});
    return in;
}

// The kernel the cuda backend's forward of case c in `dtype` launches last: its own, into float32
// outputs (the op's 16-bit output is a copy made after it).
std::string forward_kernel(const Case& c, DType dtype) {
    Generator gen(3);
    const CudaInputs in = cuda_inputs(c, dtype, gen);
    AttentionPattern pattern = c.pattern;
    if (c.padding.defined()) pattern.mask = c.padding.reshape({c.B, 1, 1, c.Lk}).to(Device::cuda);
    Tensor z = empty(in.q.shape(), DType::float32, Device::cuda),
           lse = empty({c.B, c.H, c.Lq}, DType::float32, Device::cuda);
    backend_for(Device::cuda).fused_attention(in.q, in.k, in.v, pattern, 0.125, in.terms, z, lse);
    return cuda_emulated::last_kernel_launched().load();
}

}  // namespace

TEST_CASE("on cuda, the tensor cores at many key tiles, two query blocks, wide clipping, offsets and windows") {
    // In float32 (tf32) against float64 on the CPU: 1e-2, as in the case below (and x (1 + |value|)
    // where a distance bias's gradient sums many pairs). A fragment element in a wrong place errs
    // by ~1. The forward runs on the tensor cores (the last kernel the backend's forward launched).
    // The same cases in bfloat16 and float16 are held to a reference that rounds where the 16-bit
    // kernels do, in the test after this one.
    const bool emulated = &backend_for(Device::cuda) == &cuda_emulated::cuda_backend();
    for (int64_t Dh : {32, 64}) {
        CAPTURE(Dh);
        for (const auto& [name, each] : tensor_core_edge_cases(Dh)) {
            CAPTURE(name);
            const Result on_cuda = run(each, true, DType::float32, 11, Device::cuda),
                         expected = run(each, true, DType::float64);
            if (emulated) CHECK(forward_kernel(each, DType::float32) == "fused_attention (tensor cores, tf32)");
            if (each.distance_bias) {
                check_close(on_cuda, expected, 1e-2);
            } else {
                check_same(on_cuda, expected, 1e-2);
            }
        }
    }
}

namespace {

// Attention as the 16-bit tensor-core kernels compute it, rounding where they round, in double
// otherwise: the forward walks each query block's keys (64 rows a block, from the block's first
// visible key) in tiles of 32 with an online softmax and rounds P, exp(s - the running maximum),
// to `dtype` for P V; the backward rounds P = exp(s - lse) for dV = P^T dZ and c dS for
// dQ = c dS K and dK = c dS^T Q. Shaw's terms (one table pair shared by the heads, or one a head)
// go through float32 as the backend's products take them: QE = Q E_K^T in the scores, the bucket
// sums of P (unrounded) times E_V added to z, G = dZ E_V^T in dS, and the bucket sums of P and dS
// for the tables' gradients and dQ; a distance bias (shared, or a row a head) is added to the
// scores and its gradient sums dS by distance.
struct Rounded {
    std::vector<double> z, dq, dk, dv, d_table_k, d_table_v, d_bias;  // d_bias: [B, H, Lq + Lk - 1]
    // the sums of the terms' magnitudes (for dS, before dP + G - D cancels)
    std::vector<double> z_size, dq_size, dk_size, dv_size, d_table_k_size, d_table_v_size, d_bias_size;
};
// A case's inputs and what its forward kept, on the host as doubles (16-bit values): q, k, v, dz
// and z16 (z rounded to 16 bits) [B, H, L, Dh], lse [B, H, Lq]; the tables [tables, K, Dh] and
// the bias [tables, Lq + Lk - 1] where the case has them (tables: H per head, else 1).
struct HostValues {
    std::vector<double> q, k, v, dz, z16, lse, table_k, table_v, bias;
};
Rounded rounded_at_the_kernels_points(const Case& c, const HostValues& x, double scale, DType dtype) {
    REQUIRE_FALSE(c.padding.defined());
    const int64_t Lq = c.Lq, Lk = c.Lk, Dh = c.Dh, K = c.relative ? c.k_left + c.k_right + 1 : 0;
    const AttentionPattern& pattern = c.pattern;
    const auto to16 = [dtype](double value) {  // the float32 value rounded to the 16-bit type, as pack_16_bit does
        const float f = static_cast<float>(value);
        return static_cast<double>(dtype == DType::bfloat16 ? half_bits::float_of_bfloat16(half_bits::bfloat16_of(f))
                                                            : half_bits::float_of_float16(half_bits::float16_of(f)));
    };
    const auto f32 = [](double value) { return static_cast<double>(static_cast<float>(value)); };
    const auto visible = [&](int64_t i, int64_t j) {
        const int64_t distance = j - (pattern.query_offset + i);
        return !(pattern.causal && distance > 0) && !(pattern.window >= 0 && std::abs(distance) > pattern.window);
    };
    const auto keys_begin = [&](int64_t i0) {
        return pattern.window >= 0 ? std::max<int64_t>(0, pattern.query_offset + i0 - pattern.window) : 0;
    };
    const auto keys_end = [&](int64_t i1) {
        int64_t end = Lk;
        if (pattern.causal) end = std::min(end, pattern.query_offset + i1);
        if (pattern.window >= 0) end = std::min(end, pattern.query_offset + i1 + pattern.window);
        return std::max<int64_t>(end, 0);
    };
    const auto bucket = [&](int64_t i, int64_t j) {
        return clipped_bucket(j - (pattern.query_offset + i), c.k_left, c.k_right);
    };
    const int64_t BH = c.B * c.H, entries = Lq + Lk - 1, tables = c.per_head ? c.H : 1;
    Rounded r;
    r.z.assign(BH * Lq * Dh, 0);
    r.z_size = r.dq = r.dq_size = r.z;
    r.dk.assign(BH * Lk * Dh, 0);
    r.dk_size = r.dv = r.dv_size = r.dk;
    r.d_table_k.assign(tables * K * Dh, 0);
    r.d_table_k_size = r.d_table_v = r.d_table_v_size = r.d_table_k;
    if (c.distance_bias) r.d_bias.assign(BH * entries, 0), r.d_bias_size = r.d_bias;
    for (int64_t bh = 0; bh < BH; ++bh) {
        const int64_t table = c.per_head ? bh % c.H : 0;  // the head's tables and bias row
        const auto at = [&](const std::vector<double>& values, int64_t rows, int64_t row, int64_t d) {
            return values[(bh * rows + row) * Dh + d];
        };
        const auto table_at = [&](const std::vector<double>& values, int64_t b, int64_t d) {
            return values[(table * K + b) * Dh + d];
        };
        // a row's product with each table row, in float32: QE (of q) and G (of dz)
        const auto with_table = [&](const std::vector<double>& rows, const std::vector<double>& values, int64_t i) {
            std::vector<double> out(K);
            for (int64_t b = 0; b < K; ++b) {
                double dot = 0;
                for (int64_t d = 0; d < Dh; ++d) dot += at(rows, Lq, i, d) * table_at(values, b, d);
                out[b] = f32(dot);
            }
            return out;
        };
        const auto bias = [&](int64_t i, int64_t j) {
            return c.distance_bias ? x.bias[table * entries + j - i + Lq - 1] : 0.0;
        };
        const auto score = [&](int64_t i, int64_t j, const std::vector<double>& qe) {
            double dot = 0;
            for (int64_t d = 0; d < Dh; ++d) dot += at(x.q, Lq, i, d) * at(x.k, Lk, j, d);
            return f32(f32(scale * f32(f32(dot) + (K ? qe[bucket(i, j)] : 0.0))) + bias(i, j));
        };
        for (int64_t i = 0; i < Lq; ++i) {
            const int64_t i0 = i / 64 * 64, begin = keys_begin(i0), end = keys_end(std::min(i0 + 64, Lq));
            const std::vector<double> qe = with_table(x.q, x.table_k, i), g = with_table(x.dz, x.table_v, i);
            double m = -INFINITY, l = 0;
            std::vector<double> o(Dh, 0), size(Dh, 0), bucket_p(K, 0);
            for (int64_t j0 = begin; j0 < end; j0 += 32) {
                double tile_max = -INFINITY;
                for (int64_t j = j0; j < std::min(j0 + 32, end); ++j) {
                    if (visible(i, j)) tile_max = std::max(tile_max, score(i, j, qe));
                }
                const double new_max = std::max(m, tile_max), shift = new_max == -INFINITY ? 0 : new_max;
                const double alpha = f32(std::exp(m - shift));
                m = new_max;
                l *= alpha;
                for (int64_t d = 0; d < Dh; ++d) o[d] *= alpha, size[d] *= alpha;
                for (double& w : bucket_p) w *= alpha;
                for (int64_t j = j0; j < std::min(j0 + 32, end); ++j) {
                    if (!visible(i, j)) continue;
                    const double p = f32(std::exp(score(i, j, qe) - shift)), p16 = to16(p);
                    l += p;
                    if (K) bucket_p[bucket(i, j)] += p;
                    for (int64_t d = 0; d < Dh; ++d) {
                        o[d] += p16 * at(x.v, Lk, j, d);
                        size[d] += std::fabs(p16 * at(x.v, Lk, j, d));
                    }
                }
            }
            for (int64_t d = 0; d < Dh; ++d) {
                double shaw_z = 0, shaw_size = 0;  // the value table's term, sum_r w_r E_V[r]
                for (int64_t b = 0; b < K && l > 0; ++b) {
                    shaw_z += f32(bucket_p[b] / l) * table_at(x.table_v, b, d);
                    shaw_size += std::fabs(bucket_p[b] / l * table_at(x.table_v, b, d));
                }
                r.z[(bh * Lq + i) * Dh + d] = l > 0 ? o[d] / l + shaw_z : 0;
                r.z_size[(bh * Lq + i) * Dh + d] = l > 0 ? size[d] / l + shaw_size : 0;
            }
            // the backward's pairs of row i
            double D = 0;
            for (int64_t d = 0; d < Dh; ++d) D += at(x.dz, Lq, i, d) * at(x.z16, Lq, i, d);
            D = f32(D);
            const double row_lse = x.lse[bh * Lq + i];
            std::vector<double> p_sums(K, 0), s_sums(K, 0), s_sizes(K, 0);
            for (int64_t j = 0; j < Lk; ++j) {
                if (!visible(i, j) || row_lse == -INFINITY) continue;
                const double p = f32(std::exp(score(i, j, qe) - row_lse));
                double dp = 0;
                for (int64_t d = 0; d < Dh; ++d) dp += at(x.dz, Lq, i, d) * at(x.v, Lk, j, d);
                const double G = K ? g[bucket(i, j)] : 0.0, ds = f32(p * f32(f32(dp) + G - D));
                const double cds = to16(f32(scale * ds)), p16 = to16(p);
                // dS's size before dP + G - D cancels (a row that sees one key has dS near 0, its
                // rounding set by the sizes of dP, G and D)
                const double cds_size = scale * p * (std::fabs(dp) + std::fabs(G) + std::fabs(D));
                if (K) {
                    p_sums[bucket(i, j)] += p;
                    s_sums[bucket(i, j)] += ds;
                    s_sizes[bucket(i, j)] += cds_size / scale;
                }
                if (c.distance_bias) {
                    r.d_bias[bh * entries + j - i + Lq - 1] += ds;
                    r.d_bias_size[bh * entries + j - i + Lq - 1] += cds_size / scale;
                }
                for (int64_t d = 0; d < Dh; ++d) {
                    const double dq_term = cds * at(x.k, Lk, j, d), dk_term = cds * at(x.q, Lq, i, d),
                                 dv_term = p16 * at(x.dz, Lq, i, d);
                    r.dq[(bh * Lq + i) * Dh + d] += dq_term;
                    r.dq_size[(bh * Lq + i) * Dh + d] += cds_size * std::fabs(at(x.k, Lk, j, d));
                    r.dk[(bh * Lk + j) * Dh + d] += dk_term;
                    r.dk_size[(bh * Lk + j) * Dh + d] += cds_size * std::fabs(at(x.q, Lq, i, d));
                    r.dv[(bh * Lk + j) * Dh + d] += dv_term;
                    r.dv_size[(bh * Lk + j) * Dh + d] += std::fabs(dv_term);
                }
            }
            // the tables' terms: dQ += c S_sums E_K, dE_K += c S_sums^T Q, dE_V += P_sums^T dZ
            for (int64_t b = 0; b < K; ++b) {
                const int64_t t = (table * K + b) * Dh;
                for (int64_t d = 0; d < Dh; ++d) {
                    r.dq[(bh * Lq + i) * Dh + d] += scale * f32(s_sums[b]) * x.table_k[t + d];
                    r.dq_size[(bh * Lq + i) * Dh + d] += scale * s_sizes[b] * std::fabs(x.table_k[t + d]);
                    r.d_table_k[t + d] += scale * f32(s_sums[b]) * at(x.q, Lq, i, d);
                    r.d_table_k_size[t + d] += scale * s_sizes[b] * std::fabs(at(x.q, Lq, i, d));
                    r.d_table_v[t + d] += f32(p_sums[b]) * at(x.dz, Lq, i, d);
                    r.d_table_v_size[t + d] += std::fabs(p_sums[b] * at(x.dz, Lq, i, d));
                }
            }
        }
    }
    return r;
}

// Runs case c's 16-bit inputs (drawn from the seed) through the cuda backend's tensor-core
// kernels, forward and backward, and holds each output element to rounded_at_the_kernels_points:
// within 1e-5 of the size of its terms, except in at most 5% of an output's rows (runs of Dh
// elements, or a head's distances for a bias; 20% on a GPU, below), and there within a 16-bit step of that size.
// RELGRAD_PRINT_PRECISION set: prints how many rows missed and the worst error, per output.
void check_against_rounded_reference(const Case& c, DType dtype, uint64_t seed) {
    const double step = dtype == DType::bfloat16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.Dh));
    Generator gen(seed);
    const auto [q, k, v, terms] = cuda_inputs(c, dtype, gen);
    const Tensor dz = randn(q.shape(), gen, dtype, Device::cuda);
    Backend& cuda = backend_for(Device::cuda);
    const bool emulated = &cuda == &cuda_emulated::cuda_backend();
    Tensor z = empty(q.shape(), DType::float32, Device::cuda),
           lse = empty({c.B, c.H, c.Lq}, DType::float32, Device::cuda);
    cuda.fused_attention(q, k, v, c.pattern, scale, terms, z, lse);
    if (emulated) {  // the backend's last launch is the kernel's own
        CHECK(std::string(cuda_emulated::last_kernel_launched().load()) ==
              std::string("fused_attention (tensor cores, ") + dtype_name(dtype) + ")");
    }
    const Tensor z16 = z.to(dtype);
    const auto gradient_of = [](const Tensor& t) {
        return t.defined() ? empty(t.shape(), DType::float32, Device::cuda) : Tensor();
    };
    Tensor dq = gradient_of(q), dk = gradient_of(k), dv = gradient_of(v), d_table_k = gradient_of(terms.table_k),
           d_table_v = gradient_of(terms.table_v),
           d_bias = c.distance_bias ? empty({c.B, c.H, c.Lq + c.Lk - 1}, DType::float32, Device::cuda) : Tensor();
    cuda.fused_attention_backward(q, k, v, z16, lse, dz, c.pattern, scale, terms, dq, dk, dv, d_table_k, d_table_v,
                                  d_bias);
    const auto host = [](const Tensor& t) {
        return t.defined() ? t.to(Device::cpu).to_vector() : std::vector<double>();
    };
    const Rounded expected =
        rounded_at_the_kernels_points(c,
                                      {host(q), host(k), host(v), host(dz), host(z16), host(lse), host(terms.table_k),
                                       host(terms.table_v), host(terms.distance_bias)},
                                      scale, dtype);
    std::vector<std::tuple<std::string, std::vector<double>, const std::vector<double>&, const std::vector<double>&>>
        outputs = {{"z", host(z), expected.z, expected.z_size},
                   {"dq", host(dq), expected.dq, expected.dq_size},
                   {"dk", host(dk), expected.dk, expected.dk_size},
                   {"dv", host(dv), expected.dv, expected.dv_size}};
    if (c.relative) {
        outputs.emplace_back("d_table_k", host(d_table_k), expected.d_table_k, expected.d_table_k_size);
        outputs.emplace_back("d_table_v", host(d_table_v), expected.d_table_v, expected.d_table_v_size);
    }
    if (c.distance_bias) outputs.emplace_back("d_bias", host(d_bias), expected.d_bias, expected.d_bias_size);
    for (const auto& [name, got, want, size] : outputs) {
        CAPTURE(name);
        REQUIRE(got.size() == want.size());
        const std::size_t row_length = name == "d_bias" ? c.Lq + c.Lk - 1 : c.Dh;  // d_bias: a head's distances
        const std::size_t rows = want.size() / row_length;
        REQUIRE(rows * row_length == want.size());
        std::size_t rows_missed = 0;
        double worst = 0;  // in 16-bit steps of the terms' size (NaN, an element never written: infinite)
        for (std::size_t first = 0; first < want.size(); first += row_length) {
            bool missed = false;
            for (std::size_t e = first; e < first + row_length; ++e) {
                const double error = std::fabs(got[e] - want[e]);
                missed = missed || !(error <= 1e-5 * size[e] + 1e-30);
                worst = std::isnan(error) ? INFINITY : std::max(worst, error / (step * size[e] + 1e-30));
            }
            rows_missed += missed;
        }
        CAPTURE(rows_missed);
        CAPTURE(rows);
        CAPTURE(worst);
        // The emulator sums a tile product in double and rounds once, as the reference does; a
        // GPU's tensor cores sum in another order, and its exp is within 2 ulps, so its P differ
        // from the reference's by ulps and more of them fall on the other side of a 16-bit tie.
        // With the reference's P scaled by 1 + u k 2^-24 (u uniform in [-1, 1]), at most 6.7% of
        // an output's rows missed for k = 16 and 13.9% for k = 64 (float16; bfloat16 1.8% and
        // 5.4%), by at most 0.5 and 0.9 of a step. On a GPU 20% may miss; a rounding point moved
        // misses nearly every row.
        const std::size_t percent_that_may_miss = emulated ? 5 : 20;
        CHECK(rows_missed * 100 <= percent_that_may_miss * rows);
        CHECK(worst <= 1.0);
        if (std::getenv("RELGRAD_PRINT_PRECISION")) {
            std::printf(
                "%-8s Lq %3lld Lk %3lld Dh %2lld seed %2llu %-9s %3zu of %4zu rows missed, worst %.3g of a step\n",
                dtype_name(dtype), static_cast<long long>(c.Lq), static_cast<long long>(c.Lk),
                static_cast<long long>(c.Dh), static_cast<unsigned long long>(seed), name.c_str(), rows_missed, rows,
                worst);
        }
    }
}

}  // namespace

TEST_CASE("on cuda, 16-bit tensor cores equal a reference that rounds P and c dS where they do") {
    // The kernels' results against rounded_at_the_kernels_points (check_against_rounded_reference):
    // on three seeds, causal and windowed, with no relative terms, Shaw's terms or a distance bias
    // per head, over two query blocks and three key tiles; and the edge cases of the test above
    // (7 key tiles, Shaw's per-head terms over two blocks, clipping past a key tile, a query
    // offset, windows narrower than a block, a bias at the diagonal) at Dh 32 and 64. What still
    // differs is float32's rounding of the sums and of exp (the reference sums in double), 2^-24
    // of each term's size, and now and then a P or c dS within a float32 ulp of a 16-bit
    // rounding tie, which the two round apart: one term off by a 16-bit step, in one row of dV
    // (or of dQ and dK). Hence the rule: 1e-5 of the terms' size, at most 5% of an output's rows
    // missing it (20% on a GPU, whose P differ from the reference's by ulps: see
    // check_against_rounded_reference), none by more than a step.
    // Measured (RELGRAD_PRINT_PRECISION=1 prints it), the most rows missed and the worst miss in
    // steps, bfloat16 | float16: z 0.7% 0.01 | 1.5% 0.24; dQ 1.0% 0.07 | 1.5% 0.30;
    // dK 1.1% 0.12 | 1.7% 0.27; dV 0.6% 0.19 | 2.8% (5 of 180) 0.39. The tables' and the bias's
    // gradients, sums of unrounded P and dS, never miss (4e-4 of a step at most).
    // A rounding point moved fails every row: c dS rounded to bfloat16 in a float16 run (dQ, which
    // the other 16-bit tests also catch), or the value table's bucket sums taken from P rounded to
    // 16 bits (z, which only this test catches: 198 to 200 of 200 rows). The kernels' bugs of the
    // edge cases fail it too: a query block's bucket rows taken without the block's offset (z, over
    // two blocks), or the key kernel's query range started a row late (dK and dV, every edge case).
    for (const DType dtype : {DType::bfloat16, DType::float16}) {
        INFO(std::string(dtype_name(dtype)));
        Case base;
        base.B = 1;
        base.Lq = 100;
        base.Lk = 90;
        base.Dh = 32;
        base.k_left = 5;
        base.k_right = 3;
        for (const bool causal : {true, false}) {
            for (const char* relative : {"none", "shaw", "bias"}) {
                Case each = base;
                each.pattern.causal = causal;
                if (!causal) each.pattern.window = 20;
                each.relative = std::string(relative) == "shaw";
                each.distance_bias = each.per_head = std::string(relative) == "bias";
                for (uint64_t seed : {1, 2, 3}) {
                    CAPTURE(seed);
                    CAPTURE(causal);
                    CAPTURE(std::string(relative));
                    check_against_rounded_reference(each, dtype, seed);
                }
            }
        }
        for (int64_t Dh : {32, 64}) {
            CAPTURE(Dh);
            for (const auto& [name, each] : tensor_core_edge_cases(Dh)) {
                CAPTURE(name);
                check_against_rounded_reference(each, dtype, 11);
            }
        }
    }
}

TEST_CASE("on cuda, bfloat16 and float16 at head widths 32, 64 and 128 run on 16-bit tensor cores") {
    // 16-bit q, k, v and dz are exact as mma inputs; what the kernels round is P (for P V) and dS
    // (for dS K, dS^T Q), each by at most half an epsilon of itself (epsilon 2^-7 for bfloat16,
    // 2^-10 for float16), with float32 sums. Against float64 on the CPU with the same 16-bit
    // values, outputs and gradients are held to 6 epsilons x (1 + |value|). Most of that is the
    // graph around the op, in 16 bits too (the cotangent, mul, sum; every result rounded): the
    // CPU's own 16-bit run of these cases, float32 inside with no rounded P, errs by up to 3.9
    // (bfloat16) and 4.5 (float16) epsilons, these kernels by up to 3.5 and 4.6. A fragment
    // element in a wrong place, or a k-step of 8 where the 16-bit mma takes 16, errs by ~1.
    for (const DType dtype : {DType::bfloat16, DType::float16}) {
        INFO(std::string(dtype_name(dtype)));
        const double tolerance = 6 * (dtype == DType::bfloat16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10));
        for (int64_t Dh : {32, 64, 128}) {
            CAPTURE(Dh);
            for (const Case& each : tensor_core_cases(Dh)) {
                check_close(run(each, true, dtype, 11, Device::cuda, dtype),
                            run(each, true, DType::float64, 11, Device::cpu, dtype), tolerance);
            }
        }
        // the kernel that ran is the one for 16-bit inputs (the tf32 one would also pass above):
        // the backend's forward into float32 outputs, whose last launch is the kernel's own; and it
        // read q, k and v in 16 bits: the backend allocated no float32 copy of them (the forward
        // allocates nothing here, the backward only D, [1, 2, 45] floats)
        Generator gen(5);
        const Tensor q = randn({1, 2, 45, 64}, gen, dtype, Device::cuda),
                     k = randn({1, 2, 70, 64}, gen, dtype, Device::cuda),
                     v = randn({1, 2, 70, 64}, gen, dtype, Device::cuda);
        Tensor z = empty({1, 2, 45, 64}, DType::float32, Device::cuda),
               lse = empty({1, 2, 45}, DType::float32, Device::cuda);
        const int64_t float32_copy_of_q = q.numel() * 4;
        Backend& cuda = backend_for(Device::cuda);
        reset_peak_memory(Device::cuda);
        int64_t live = memory_stats(Device::cuda).live_bytes;
        cuda.fused_attention(q, k, v, AttentionPattern{}, 0.125, ClippedRelativeTerms{}, z, lse);
        CHECK(memory_stats(Device::cuda).peak_live_bytes - live < float32_copy_of_q);
        if (&cuda == &cuda_emulated::cuda_backend()) {
            CHECK(std::string(cuda_emulated::last_kernel_launched().load()) ==
                  std::string("fused_attention (tensor cores, ") + dtype_name(dtype) + ")");
        }
        const Tensor z16 = z.to(dtype), dz = randn(z.shape(), gen, dtype, Device::cuda);
        Tensor dq = empty(q.shape(), DType::float32, Device::cuda), dk = empty(k.shape(), DType::float32, Device::cuda),
               dv = empty(v.shape(), DType::float32, Device::cuda), no_table_k, no_table_v, no_bias;
        reset_peak_memory(Device::cuda);
        live = memory_stats(Device::cuda).live_bytes;
        cuda.fused_attention_backward(q, k, v, z16, lse, dz, AttentionPattern{}, 0.125, ClippedRelativeTerms{}, dq, dk,
                                      dv, no_table_k, no_table_v, no_bias);
        CHECK(memory_stats(Device::cuda).peak_live_bytes - live < float32_copy_of_q);
    }
}

TEST_CASE("on cuda, operands that do not start at a 16-byte boundary are not read by cp.async") {
    // cp.async copies 16 bytes from a 16-byte boundary (a GPU faults on another, the emulator
    // refuses it). Keys and values that are a contiguous view 1 element into their storage: in
    // float32 the scalar kernels read them, to float32's error; in bfloat16 the tensor cores read
    // float32 copies (which start where allocations do), as tf32 inputs, to tf32's error (see the
    // float32 test above).
    Generator gen(6);
    for (const DType dtype : {DType::float32, DType::bfloat16}) {
        INFO(std::string(dtype_name(dtype)));
        const Tensor q = randn({1, 2, 45, 32}, gen, dtype, Device::cuda);
        const int64_t n = 2 * 70 * 32;
        const Tensor flat = randn({1 + 2 * n}, gen, dtype, Device::cuda);
        const Tensor k = flat.narrow(0, 1, n).view({1, 2, 70, 32}), v = flat.narrow(0, 1 + n, n).view({1, 2, 70, 32});
        REQUIRE(k.is_contiguous());
        AttentionPattern causal;
        causal.causal = true;
        // the backend's forward into float32 outputs, whose last launch is the kernel's own
        Tensor z = empty({1, 2, 45, 32}, DType::float32, Device::cuda),
               lse = empty({1, 2, 45}, DType::float32, Device::cuda);
        backend_for(Device::cuda).fused_attention(q, k, v, causal, 0.125, ClippedRelativeTerms{}, z, lse);
        if (&backend_for(Device::cuda) == &cuda_emulated::cuda_backend()) {
            CHECK(std::string(cuda_emulated::last_kernel_launched().load()) ==
                  (dtype == DType::float32 ? "fused_attention" : "fused_attention (tensor cores, tf32)"));
        }
        const Tensor expected =
            fused_attention(q.to(DType::float64).to(Device::cpu), k.to(DType::float64).to(Device::cpu),
                            v.to(DType::float64).to(Device::cpu), causal, 0.125);
        check_values(z.to(Device::cpu), expected.to_vector(), dtype == DType::float32 ? 1e-5 : 1e-2);
    }
}
#endif

TEST_CASE("fused attention in float32 agrees with float64, and does not depend on the thread count") {
    Case c;
    c.Lq = c.Lk = 70;
    c.pattern.causal = true;
    const Result f32 = run(c, true, DType::float32), f64_result = run(c, true, DType::float64);
    check_same(f32, f64_result, 1e-4);
#ifdef RELGRAD_TEST_CUDA
    {
        // the CUDA kernels sum in another order than the CPU's (whose products are oneDNN's): each
        // is held to float64 by the same float32 tolerance
        INFO("float32 on cuda");
        check_same(run(c, true, DType::float32, 11, Device::cuda), f64_result, 1e-4);
    }
#endif
    // and one sequence with one head over 3 key tiles: its backward is cut into 3 key groups
    Case single = c;
    single.B = single.H = 1;
    single.Lq = 100;
    single.Lk = 600;
    for (const Case& each : {c, single}) {
        const int threads = omp_get_max_threads();
        omp_set_num_threads(1);
        const Result one = run(each, true);
        omp_set_num_threads(3);
        const Result three = run(each, true);
        omp_set_num_threads(threads);
        check_same(one, three, 0.0);
    }
    check_equals_bucketed(single);
}

namespace {

// the largest |a - b| / (1 + |b|) over z and every gradient, a = got, b = expected (infinite where one is NaN)
double worst_error(const Result& got, const Result& expected) {
    double worst = 0;
    const auto compare = [&](const Tensor& a_tensor, const Tensor& b_tensor) {
        const std::vector<double> a = a_tensor.to_vector(), b = b_tensor.to_vector();
        REQUIRE(a.size() == b.size());
        for (std::size_t i = 0; i < a.size(); ++i) {
            const double error = std::fabs(a[i] - b[i]) / (1 + std::fabs(b[i]));
            worst = std::isnan(error) ? INFINITY : std::max(worst, error);  // a NaN is the worst error
        }
    };
    compare(got.z, expected.z);
    REQUIRE(got.grads.size() == expected.grads.size());
    for (std::size_t n = 0; n < got.grads.size(); ++n) compare(got.grads[n], expected.grads[n]);
    return worst;
}

}  // namespace

TEST_CASE("on the CPU, bfloat16 fused attention reads q, k and v as they are, within the 16-bit kernels' error") {
    // Where this CPU multiplies bfloat16 at speed, the tile products read the 16-bit operands with
    // float32 sums, and P and dS are rounded to bfloat16 before the products that read them, as on
    // cuda (see the tensor-core test there); the tables' products, the softmax and the bucket sums
    // stay float32. Against float64 on the same 16-bit values, held to the tolerance of the CUDA
    // kernels, 6 epsilons x (1 + |value|); they err by up to 3.9 here. A key tile's P V that
    // replaced the sum so far instead of adding to it would err by 89-162.
    const double epsilon = std::ldexp(1.0, -7), tolerance = 6 * epsilon;
    Case several_tiles;  // 2 query tiles, 2 key tiles, relative tables per head
    several_tiles.Lq = 100;
    several_tiles.Lk = 300;
    several_tiles.Dh = 32;
    several_tiles.k_left = 4;
    several_tiles.k_right = 3;
    several_tiles.per_head = true;
    Case causal = several_tiles;  // query 0 at position -1 sees no key
    causal.pattern.causal = true;
    causal.pattern.query_offset = -1;
    Case windowed = several_tiles;  // a window, the second sequence padded after 250 keys
    windowed.pattern.window = 9;
    std::vector<double> keep(2 * 300, 1.0);
    std::fill(keep.begin() + 300 + 250, keep.end(), 0.0);
    windowed.padding = from_vector(keep, {2, 300}, DType::boolean);
    Case biased = causal;  // a distance bias instead of Shaw's tables
    biased.relative = false;
    biased.distance_bias = true;
    Case grouped = several_tiles;  // one sequence and head over 3 key tiles: the backward in key groups
    grouped.B = grouped.H = 1;
    grouped.Lk = 600;
    for (const Case& each : {several_tiles, causal, windowed, biased, grouped}) {
        const double worst = worst_error(run(each, true, DType::bfloat16, 11, Device::cpu, DType::bfloat16),
                                         run(each, true, DType::float64, 11, Device::cpu, DType::bfloat16));
        CHECK_MESSAGE(worst <= tolerance, "errs by " << worst / epsilon << " epsilons");
    }
    // the threads cut the work by the shapes alone, in 16 bits too
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    const Result one = run(grouped, true, DType::bfloat16);
    omp_set_num_threads(3);
    const Result three = run(grouped, true, DType::bfloat16);
    omp_set_num_threads(threads);
    check_same(one, three, 0.0);
    // and it read q, k and v in 16 bits: the backend allocated no float32 copy of them
    Backend& cpu = backend_for(Device::cpu);
    if (!cpu.supports(OptionalKernel::fused_attention_16_bit)) {
        MESSAGE("this CPU has no fast bfloat16 products: its fused attention runs on float32 copies");
        return;
    }
    Generator gen(5);
    const Tensor q = randn({1, 2, 45, 64}, gen, DType::bfloat16), k = randn({1, 2, 70, 64}, gen, DType::bfloat16),
                 v = randn({1, 2, 70, 64}, gen, DType::bfloat16);
    Tensor z = empty({1, 2, 45, 64}, DType::float32), lse = empty({1, 2, 45}, DType::float32);
    const int64_t float32_copy_of_q = q.numel() * 4;
    reset_peak_memory(Device::cpu);
    int64_t live = memory_stats(Device::cpu).live_bytes;
    cpu.fused_attention(q, k, v, AttentionPattern{}, 0.125, ClippedRelativeTerms{}, z, lse);
    CHECK(memory_stats(Device::cpu).peak_live_bytes - live < float32_copy_of_q);
    const Tensor z16 = z.to(DType::bfloat16), dz = randn(z.shape(), gen, DType::bfloat16);
    Tensor dq = empty(q.shape(), DType::float32), dk = empty(k.shape(), DType::float32),
           dv = empty(v.shape(), DType::float32), no_table_k, no_table_v, no_bias;
    reset_peak_memory(Device::cpu);
    live = memory_stats(Device::cpu).live_bytes;
    cpu.fused_attention_backward(q, k, v, z16, lse, dz, AttentionPattern{}, 0.125, ClippedRelativeTerms{}, dq, dk, dv,
                                 no_table_k, no_table_v, no_bias);
    CHECK(memory_stats(Device::cpu).peak_live_bytes - live < float32_copy_of_q);
}

TEST_CASE("fused attention rejects bad input with a clear message") {
    Generator gen(1);
    const Tensor q = randn({1, 2, 3, 4}, gen, DType::float64), k = randn({1, 2, 5, 4}, gen, DType::float64);
    const Tensor table = randn({1, 5, 4}, gen, DType::float64);
    CHECK_THROWS_WITH_AS(fused_attention(q, k, k, {}, 0.5, {table, table, 2, 1}),
                         doctest::Contains("must both be [1 or H, k_left + k_right + 1, Dh] = [1 or 2, 4, 4]"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(fused_attention(q, k, k, {}, 0.5, {table, table, -1, 5}),
                         doctest::Contains("with k_left, k_right >= 0 (got -1, 5)"), std::invalid_argument);
    const int64_t huge = std::numeric_limits<int64_t>::max();  // k_left + k_right + 1 would overflow
    CHECK_THROWS_WITH_AS(fused_attention(q, k, k, {}, 0.5, {table, table, huge, huge}),
                         "fused_attention: clipping distances k_left 9223372036854775807 and k_right "
                         "9223372036854775807 must be at most 2^40",
                         std::invalid_argument);
    AttentionPattern pattern;
    pattern.window = -2;
    CHECK_THROWS_WITH_AS(fused_attention(q, k, k, pattern, 0.5),
                         "fused_attention: window -2 must be >= 0 (or -1 for none)", std::invalid_argument);
    pattern = {};
    pattern.mask = from_vector({1, 0, 1}, {3}, DType::boolean);
    CHECK_THROWS_WITH_AS(fused_attention(q, k, k, pattern, 0.5), doctest::Contains("shapes [3] and [1, 2, 3, 5]"),
                         std::invalid_argument);
    pattern.mask = from_vector({1, 0}, {2, 1, 1, 1}, DType::boolean);
    CHECK_THROWS_WITH_AS(
        fused_attention(q, k, k, pattern, 0.5),
        doctest::Contains("mask of shape [2, 1, 1, 1] does not broadcast to [B, H, Lq, Lk] = [1, 2, 3, 5]"),
        std::invalid_argument);
    CHECK_THROWS_AS(fused_attention(q, k.narrow(2, 0, 4), k, {}, 0.5), std::invalid_argument);
}

TEST_CASE("fused attention passes the gradient check") { gradcheck_op("fused_attention"); }

#ifdef RELGRAD_TEST_CUDA
TEST_CASE("on cuda, the scalar kernels pass a gradient check over several query blocks and key tiles") {
    // The registry's cases (the test above, and `relgrad gradcheck --device cuda`) are at Dh = 4 and
    // L <= 5: on cuda, one block of the scalar kernels' 32 query rows and one tile of keys. Here
    // 70 queries (three blocks) over 90 keys (three tiles of 32 at Dh = 4), in float64, which
    // takes the scalar kernels on every device: a missing barrier between key tiles, or a block's
    // rows misplaced, gives a forward whose differences disagree with the backward. Fast mode
    // checks one random direction per input (three seeds), not every element.
    AttentionPattern causal, window;
    causal.causal = true;
    causal.query_offset = 15;
    window.window = 7;
    for (const auto& [name, pattern] : {std::pair{"causal, offset 15", causal}, {"window 7", window}}) {
        for (const bool biased : {false, true}) {
            CAPTURE(name);
            CAPTURE(biased);
            Generator gen(21);
            std::vector<Tensor> inputs = {randn({1, 2, 70, 4}, gen, DType::float64, Device::cuda),
                                          randn({1, 2, 90, 4}, gen, DType::float64, Device::cuda),
                                          randn({1, 2, 90, 4}, gen, DType::float64, Device::cuda)};
            if (biased) {
                inputs.push_back(randn({2, 70 + 90 - 1}, gen, DType::float64, Device::cuda));
            } else {
                inputs.push_back(randn({2, 9, 4}, gen, DType::float64, Device::cuda));  // k_left 5, k_right 3
                inputs.push_back(randn({2, 9, 4}, gen, DType::float64, Device::cuda));
            }
            for (Tensor& t : inputs) t.requires_grad_(true);
            const AttentionPattern rule = pattern;
            const auto f = [rule, biased](const std::vector<Tensor>& x) {
                ClippedRelativeTerms terms;
                if (biased) {
                    terms.distance_bias = x[3];
                } else {
                    terms = ClippedRelativeTerms{x[3], x[4], 5, 3};
                }
                return fused_attention(x[0], x[1], x[2], rule, 0.5, terms);
            };
            for (uint64_t seed : {1, 2, 3}) {
                GradcheckOptions options;
                options.fast = true;
                options.seed = seed;
                const GradcheckResult result = gradcheck(f, inputs, options);
                CHECK_MESSAGE(result.passed, result.report);
            }
        }
    }
}
#endif
