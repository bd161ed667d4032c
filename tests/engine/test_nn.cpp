// softmax, log_softmax, layer_norm, dropout, cross_entropy.
#include "test_helpers.hpp"

#include "engine/backend/backend.hpp"

#include <cmath>
#include <limits>

#include <omp.h>

using namespace relgrad;
using namespace relgrad::testing;

namespace {
const double inf = std::numeric_limits<double>::infinity();
}

TEST_CASE("softmax is stable and sums to one") {
    const Tensor x = f64({1, 2, 3, 1000, 1001, 1002}, {2, 3});
    const double z = std::exp(-2.0) + std::exp(-1.0) + 1;
    const std::vector<double> p = {std::exp(-2.0) / z, std::exp(-1.0) / z, 1 / z};
    check_values(softmax(x, -1), {p[0], p[1], p[2], p[0], p[1], p[2]}, 1e-15);
    check_values(log_softmax(x, 1),
                 {std::log(p[0]), std::log(p[1]), std::log(p[2]), std::log(p[0]), std::log(p[1]), std::log(p[2])},
                 1e-12);
    check_values(sum(softmax(x, 0), {0}), {1, 1, 1});
    check_values(softmax(x.transpose(0, 1), 0), {p[0], p[0], p[1], p[1], p[2], p[2]}, 1e-15);
}

TEST_CASE("a fully masked row gives zero weights and zero gradient, never NaN") {
    Tensor x = f64({1, 2, 3, 4, 5, 6}, {2, 3}).requires_grad_(true);
    const Tensor mask = from_vector({0, 0, 1, 1, 1, 1}, {2, 3}, DType::boolean);
    const Tensor p = softmax(masked_fill(x, mask, -inf), -1);
    const double z = std::exp(-1.0) + 1;
    check_values(p, {std::exp(-1.0) / z, 1 / z, 0, 0, 0, 0});
    check_values(log_softmax(masked_fill(x, mask, -inf), -1).narrow(0, 1, 1), {-inf, -inf, -inf});
    sum(p * f64({1, 2, 3, 4, 5, 6}, {2, 3})).backward();
    for (double g : x.grad().to_vector()) CHECK(std::isfinite(g));
    check_values(x.grad().narrow(0, 1, 1), {0, 0, 0});
}

TEST_CASE("layer_norm normalises the last dim") {
    Generator gen(2);
    const Tensor x = randn({4, 6}, gen, DType::float64) * 3.0 + 5.0;
    const Tensor y = layer_norm(x, ones({6}, DType::float64), zeros({6}, DType::float64), 1e-12);
    for (double m : mean(y, {1}).to_vector()) CHECK(std::fabs(m) < 1e-12);
    for (double v : mean(y * y, {1}).to_vector()) CHECK(v == doctest::Approx(1.0).epsilon(1e-9));
    const Tensor affine = layer_norm(x, full({6}, 2.0, DType::float64), full({6}, -1.0, DType::float64));
    check_values(affine,
                 ((layer_norm(x, ones({6}, DType::float64), zeros({6}, DType::float64)) * 2.0) - 1.0).to_vector());
    CHECK_THROWS_WITH_AS(layer_norm(x, ones({5}, DType::float64), zeros({6}, DType::float64)),
                         "layer_norm: weight [5] and bias [6] must both be [6] for an input of shape [4, 6]",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(layer_norm(x, ones({6}, DType::float32), zeros({6}, DType::float64)),
                         "layer_norm: weight float32 and bias float64 must have the input's dtype float64",
                         std::invalid_argument);
}

// The graph keeps x itself and two numbers per row, not a normalised copy of x (nor, in 16 bits,
// float32 copies): what a forward leaves alive is the output and the per-row statistics.
TEST_CASE("layer_norm keeps only per-row statistics for its backward") {
    for (DType dtype : {DType::float32, DType::bfloat16}) {
        CAPTURE(dtype_name(dtype));
        Generator gen(3);
        const Tensor x = randn({64, 256}, gen, DType::float32).to(dtype).detach().requires_grad_(true);
        const Tensor weight = ones({256}, dtype).requires_grad_(true), bias = zeros({256}, dtype).requires_grad_(true);
        const int64_t before = memory_stats(Device::cpu).live_bytes;
        Tensor y = layer_norm(x, weight, bias);
        const int64_t kept = memory_stats(Device::cpu).live_bytes - before;
        const int64_t output = y.numel() * static_cast<int64_t>(dtype_size(dtype)), statistics = 2 * 64 * 4;
        CHECK(kept <= output + statistics);
        sum(y).backward();
        CHECK(x.grad().defined());
    }
}

TEST_CASE("dropout is seeded, scales kept values and is the identity in eval mode") {
    const Tensor x = ones({100, 100}, DType::float64);
    Generator a(9), b(9);
    const Tensor ya = dropout(x, 0.25, true, a), yb = dropout(x, 0.25, true, b);
    CHECK(ya.to_vector() == yb.to_vector());
    int64_t dropped = 0;
    for (double v : ya.to_vector()) {
        CHECK((v == 0 || v == doctest::Approx(1 / 0.75)));
        dropped += v == 0;
    }
    CHECK(dropped > 2200);
    CHECK(dropped < 2800);
    CHECK((dropout(x, 0.25, false, a).storage() == x.storage()));
    CHECK_THROWS_AS(dropout(x, 1.5, true, a), std::invalid_argument);
}

TEST_CASE("dropout's mask is Philox's: element i keeps iff word i % 4 of block i / 4 is >= p 2^32") {
    const int64_t n = 1 << 16;  // past the size at which the kernels split work between threads
    const double p = 0.3;
    Generator gen(21);
    gen.take_blocks(3);  // the mask starts at the generator's offset
    const Tensor x = ones({n}, DType::float64);
    const std::vector<double> y = dropout(x, p, true, gen).to_vector();
    CHECK(gen.offset() == 3 + n / 4);
    const uint64_t threshold = static_cast<uint64_t>(std::ceil(p * 4294967296.0));
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) {
        const PhiloxBlock block = philox_block(21, 3 + static_cast<uint64_t>(i / 4));
        wrong += y[i] != (block.word[i % 4] >= threshold ? 1 / (1 - p) : 0.0);
    }
    CHECK(wrong == 0);
    // the same mask on every device and thread count, in every floating dtype
    const int threads_before = omp_get_max_threads();
    for (int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        for (Device device : other_devices()) {
            Generator again(21);
            again.take_blocks(3);
            CHECK(dropout(x.to(device), p, true, again).to_vector() == y);
        }
        Generator in_float32(21);
        in_float32.take_blocks(3);
        const std::vector<double> narrow = dropout(x.to(DType::float32), p, true, in_float32).to_vector();
        for (int64_t i = 0; i < n; ++i) wrong += narrow[i] != static_cast<double>(static_cast<float>(y[i]));
        CHECK(wrong == 0);
    }
    omp_set_num_threads(threads_before);
    // blocks whose index crosses 2^32 (the counter's second word)
    Generator far(6);
    far.take_blocks((uint64_t{1} << 32) - 3);
    const uint64_t start = far.offset();
    const std::vector<double> across = dropout(ones({64}, DType::float32), 0.5, true, far).to_vector();
    for (int64_t i = 0; i < 64; ++i) {
        const PhiloxBlock block = philox_block(6, start + static_cast<uint64_t>(i / 4));
        wrong += across[i] != (block.word[i % 4] >= (uint64_t{1} << 31) ? 2.0 : 0.0);
    }
    CHECK(wrong == 0);
    // a length that is not a multiple of 4 takes a whole last block; p = 1 drops everything
    Generator odd(4);
    CHECK(sum(dropout(ones({7}, DType::float64), 1.0, true, odd)).item() == 0);
    CHECK(odd.offset() == 2);
}

TEST_CASE("dropout_add is residual + dropout(x) in one pass, and its backward keeps no mask") {
    Generator gen(5), same(5);
    const Tensor residual = randn({64, 48}, gen, DType::float64).requires_grad_(true);
    const Tensor x = randn({48, 64}, gen, DType::float64).requires_grad_(true);
    Generator draw = gen, separately = gen;
    const int64_t before = memory_stats(Device::cpu).live_bytes;
    const Tensor fused = dropout_add(residual, x.transpose(0, 1), 0.4, true, draw);
    CHECK(memory_stats(Device::cpu).live_bytes - before == fused.numel() * 8);  // the output alone
    const Tensor dropped = dropout(x.transpose(0, 1), 0.4, true, separately), apart = add(residual, dropped);
    // r + x m / (1 - p): the kernels round it once, in one fused multiply-add (`once`);
    // add(residual, dropout(x)) rounds twice, and lands on the same value or next to it
    const std::vector<double> f = fused.to_vector(), a = apart.to_vector(), d = dropped.to_vector(),
                              xs = x.transpose(0, 1).contiguous().to_vector(), rs = residual.detach().to_vector();
    for (std::size_t i = 0; i < f.size(); ++i) {
        const double once = d[i] == 0 ? rs[i] : std::fma(xs[i], 1 / 0.6, rs[i]);
        CHECK((f[i] == a[i] || f[i] == once));
    }
    CHECK(draw.offset() == separately.offset());
    // backward: d residual = g, dx = g m / (1 - p), the mask drawn again
    const Tensor g = randn({64, 48}, same, DType::float64);
    fused.backward(g);
    CHECK(residual.grad().to_vector() == g.to_vector());
    const std::vector<double> dx = x.grad().transpose(0, 1).contiguous().to_vector(), y = apart.to_vector(),
                              r = residual.detach().to_vector(), gv = g.to_vector();
    for (std::size_t i = 0; i < dx.size(); ++i) {
        const bool kept = y[i] != r[i];  // a dropped element leaves the residual as it was
        CHECK(dx[i] == (kept ? gv[i] * (1 / 0.6) : 0.0));
    }
    // eval mode: residual + x; bad input named
    CHECK(dropout_add(residual, x.transpose(0, 1), 0.4, false, draw).to_vector() ==
          add(residual, x.transpose(0, 1)).to_vector());
    CHECK_THROWS_WITH_AS(dropout_add(residual, x, 0.4, true, draw),
                         "dropout_add: the residual is float64 [64, 48], x is float64 [48, 64]", std::invalid_argument);
}

TEST_CASE("cross_entropy averages (or sums) over targets that are not ignored") {
    const Tensor logits = f64({2, 0, 0, 0, 3, 0}, {2, 3});
    const double l0 = -std::log(std::exp(2.0) / (std::exp(2.0) + 2));
    const double l1 = -std::log(1 / (std::exp(3.0) + 2));
    check_values(cross_entropy(logits, from_vector({0, 2}, {2}, DType::int64)), {(l0 + l1) / 2});
    check_values(cross_entropy(logits, from_vector({0, -100}, {2}, DType::int64)), {l0});
    check_values(cross_entropy(logits, from_vector({7, 7}, {2}, DType::int64), 7), {0});  // all ignored
    // Reduction::sum: the same terms without the 1/n
    const Tensor both = from_vector({0, 2}, {2}, DType::int64), first = from_vector({0, -100}, {2}, DType::int64);
    check_values(cross_entropy(logits, both, -100, Reduction::sum), {l0 + l1});
    check_values(cross_entropy(logits, first, -100, Reduction::sum), {l0});
    CHECK_THROWS_WITH_AS(cross_entropy(logits, from_vector({0, 3}, {2}, DType::int64)),
                         "cross_entropy: a target is outside [0, 3) and is not ignore_index -100 (gather: index 3 is "
                         "out of range for dim 1 of size 3)",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(cross_entropy(logits, from_vector({0}, {1}, DType::int64)),
                         "cross_entropy: expects logits [N, C] and target [N], got [2, 3] and [1]",
                         std::invalid_argument);
}

TEST_CASE("nn gradients") {
    for (const char* op : {"softmax", "log_softmax", "layer_norm", "dropout", "cross_entropy"}) gradcheck_op(op);
}

TEST_CASE("log_softmax gives masked entries no gradient; large target ids stay exact") {
    Tensor x = f64({1, 2, 3, 4}, {2, 2}).requires_grad_(true);
    const Tensor mask = from_vector({0, 1, 1, 1}, {2, 2}, DType::boolean);
    const Tensor y = log_softmax(masked_fill(x, mask, -inf), -1);
    sum(masked_fill(y, mask, 0.0)).backward();
    check_values(x.grad(), {0, 0, 0, 0});        // row 0 has one entry (gradient 1 - 1), row 1 none
    const int64_t big = (int64_t{1} << 53) + 1;  // not a double
    const Tensor target = from_vector({0, 0}, {2}, DType::int64);
    target.data<int64_t>()[1] = big;
    check_values(cross_entropy(f64({0, 0, 5, 1}, {2, 2}), target, big), {std::log(2.0)});
}

TEST_CASE("the attention op equals its composition from ops, and rejects bad inputs") {
    Generator gen(3);
    const Tensor q = randn({2, 2, 3, 4}, gen, DType::float64), k = randn({2, 2, 5, 4}, gen, DType::float64),
                 v = randn({2, 2, 5, 4}, gen, DType::float64);
    const Tensor table_k = randn({2, 4, 4}, gen, DType::float64), table_v = randn({2, 4, 4}, gen, DType::float64);
    const Tensor r = from_vector({0, 1, 2, 3, 3, 0, 0, 1, 2, 3, 0, 0, 0, 1, 2}, {3, 5}, DType::int64);
    const Tensor mask = from_vector({1, 1, 0, 1, 1, 0, 0, 0, 0, 0, 1, 0, 1, 1, 1}, {3, 5}, DType::boolean);
    Tensor weights;
    const Tensor z = attention(q, k, v, mask, 0.5, {table_k, table_v, r}, &weights);
    // the same math, op by op
    const Tensor relative = gather(matmul(q, table_k.transpose(-1, -2)), -1, r.expand({2, 2, 3, 5}));
    const Tensor scores = mul(add(matmul(q, k.transpose(-1, -2)), relative), scalar(0.5, DType::float64));
    const Tensor a = softmax(where(mask, scores, scalar(-inf, DType::float64)), -1);
    const Tensor bucket_weights = scatter_add(zeros({2, 2, 3, 4}, DType::float64), -1, r.expand({2, 2, 3, 5}), a);
    const Tensor expected = add(matmul(a, v), matmul(bucket_weights, table_v));
    check_values(z, expected.to_vector(), 1e-14);
    check_values(weights, a.to_vector(), 1e-15);
    check_values(z.narrow(2, 1, 1), std::vector<double>(16, 0.0));  // query 1 sees no key
    CHECK_THROWS_WITH_AS(attention(q, k, v, Tensor(), 0.5, {table_k, table_v, r.to(DType::float64)}),
                         doctest::Contains("must be [1 or H, K, Dh] and the index"), std::invalid_argument);
    const Tensor bad_r = from_vector(std::vector<double>(15, 4), {3, 5}, DType::int64);
    CHECK_THROWS_WITH_AS(attention(q, k, v, Tensor(), 0.5, {table_k, table_v, bad_r}),
                         "attention: bucket 4 in the relative index is outside [0, 4)", std::invalid_argument);
    CHECK_THROWS_AS(attention(q, v.narrow(2, 0, 4), v, Tensor(), 0.5), std::invalid_argument);
    // no keys at all: zero output and zero gradients, the bucket sums included
    Tensor q_leaf = q.detach().requires_grad_(true), table_leaf = table_k.detach().requires_grad_(true);
    const Tensor no_keys = k.narrow(2, 0, 0);
    const Tensor empty_index = from_vector({}, {3, 0}, DType::int64);
    const Tensor z_none = attention(q_leaf, no_keys, no_keys, Tensor(), 0.5, {table_leaf, table_v, empty_index});
    check_values(z_none, std::vector<double>(z_none.numel(), 0.0), 0.0);
    sum(mul(z_none, q)).backward();
    check_values(q_leaf.grad(), std::vector<double>(q.numel(), 0.0), 0.0);
    check_values(table_leaf.grad(), std::vector<double>(table_k.numel(), 0.0), 0.0);
    gradcheck_op("attention");
}

TEST_CASE("rope: the rotation of pairs passes the gradient check on every device, its inverse undoes it") {
    gradcheck_op("rope");
    Generator gen(3);
    const Tensor x = randn({2, 5, 6}, gen, DType::float64);
    const RopeTables t = rope_tables(5, 6, 4, 100, DType::float64);
    // the kernel's inverse rotation (the backward's) brings rope(x) back to x
    Tensor back = empty(x.shape(), DType::float64);
    backend_for(Device::cpu).rotate_pairs(rope(x, 4, 100).contiguous(), t.cos, neg(t.sin), back);
    check_values(back, x.to_vector(), 1e-14);
    CHECK_THROWS_WITH_AS(rope_tables(3, 5, 0, 10000, DType::float64),
                         "rope: length 3 and head dim 5 must be >= 0, the head dim even", std::invalid_argument);
    CHECK_THROWS_AS(rope(from_vector({1, 2}, {2}, DType::int64), 0), std::invalid_argument);
}
