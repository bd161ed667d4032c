// docs/layers/fused_attention.md's worked examples, number for number: the online softmax over two
// key groups, its backward and the memory arithmetic (doc_examples.hpp says how these tests are
// written).
#include "doc_examples.hpp"

#include <algorithm>
#include <limits>

using namespace relgrad;
using namespace relgrad::testing;

namespace {

// One query row of the online softmax of docs/layers/fused_attention.md: the running max m, the
// running sum l, the output accumulator acc (Dh = 1) and the bucket sums W, for the example's
// x = (1, 0, -1), k = 1, E_K = E_V = (-1, 0, 1). add_keys visits a group of keys as one tile and
// returns its alpha.
struct OnlineRow {
    int i;
    double m = -std::numeric_limits<double>::infinity(), l = 0, acc = 0;
    std::vector<double> w = {0, 0, 0};

    static constexpr double x[3] = {1, 0, -1}, table[3] = {-1, 0, 1};
    static int r(int i, int j) { return std::clamp(j - i, -1, 1) + 1; }
    static double score(int i, int j) { return x[i] * x[j] + x[i] * table[r(i, j)]; }  // c = 1

    double add_keys(const std::vector<int>& keys) {
        double new_max = m;
        for (int j : keys) new_max = std::max(new_max, score(i, j));
        const double alpha = std::isinf(m) ? 0 : std::exp(m - new_max);
        l *= alpha;
        acc *= alpha;
        for (double& bucket : w) bucket *= alpha;
        for (int j : keys) {
            const double p = std::exp(score(i, j) - new_max);
            l += p;
            acc += p * x[j];
            w[r(i, j)] += p;
        }
        m = new_max;
        return alpha;
    }
    double z() const { return (acc + w[0] * table[0] + w[1] * table[1] + w[2] * table[2]) / l; }
    double lse() const { return m + std::log(l); }
};

}  // namespace

TEST_CASE("docs/layers/fused_attention.md: two key groups by hand, the backward and the memory arithmetic") {
    const double inv_e = std::exp(-1.0), e = std::exp(1.0);
    CHECK(inv_e == doctest::Approx(0.367879441171).epsilon(1e-11));
    const double z_printed[3] = {0.844637596503, 0, -0.844637596503};
    const double lse_printed[3] = {1.861994804058, 1.098612288668, 1.861994804058};
    CHECK(std::log(1 + 2 * e) == doctest::Approx(1.861994804058).epsilon(1e-12));
    CHECK(std::log(3.0) == doctest::Approx(1.098612288668).epsilon(1e-12));

    // the table: each row after key 0, m' and alpha of keys {1, 2}, and after them
    struct Expected {
        double m, l, acc;
        std::vector<double> w;
        double m2, alpha, l2, acc2;
        std::vector<double> w2;
    };
    const Expected table[3] = {
        {1, 1, 1, {0, 1, 0}, 1, 1, 2 + inv_e, 1 - inv_e, {0, 1, 1 + inv_e}},
        {0, 1, 1, {1, 0, 0}, 0, 1, 3, 0, {1, 1, 1}},
        {0, 1, 1, {1, 0, 0}, 1, inv_e, 2 + inv_e, inv_e - 1, {1 + inv_e, 1, 0}},
    };
    for (int i = 0; i < 3; ++i) {
        CAPTURE(i);
        const Expected& want = table[i];
        OnlineRow row{i};
        CHECK(row.add_keys({0}) == 0);  // the first visible tile: m was -inf
        CHECK(row.m == want.m);
        CHECK(row.l == doctest::Approx(want.l).epsilon(1e-14));
        CHECK(row.acc == doctest::Approx(want.acc).epsilon(1e-14));
        for (int r = 0; r < 3; ++r) CHECK(row.w[r] == doctest::Approx(want.w[r]).epsilon(1e-14));
        CHECK(row.add_keys({1, 2}) == doctest::Approx(want.alpha).epsilon(1e-14));
        CHECK(row.m == want.m2);
        CHECK(row.l == doctest::Approx(want.l2).epsilon(1e-14));
        CHECK(std::fabs(row.acc - want.acc2) <= 1e-14);
        for (int r = 0; r < 3; ++r) CHECK(row.w[r] == doctest::Approx(want.w2[r]).epsilon(1e-14));
        CHECK(std::fabs(row.z() - z_printed[i]) <= 1e-11);
        CHECK(std::fabs(row.lse() - lse_printed[i]) <= 1e-11);
        // the plain formula: z_i = sum_j a_ij (v_j + E_V[r]), lse_i = log sum_j exp(s_ij)
        double total = 0, weighted = 0;
        for (int j = 0; j < 3; ++j) total += std::exp(OnlineRow::score(i, j));
        for (int j = 0; j < 3; ++j)
            weighted +=
                std::exp(OnlineRow::score(i, j)) / total * (OnlineRow::x[j] + OnlineRow::table[OnlineRow::r(i, j)]);
        CHECK(std::fabs(row.z() - weighted) <= 1e-15);
        CHECK(std::fabs(row.lse() - std::log(total)) <= 1e-15);
    }
    // row 2 in words: 2 + 1/e, 1/e - 1, W . E_V = -(1 + 1/e); a_2 = (1, e, e) / (1 + 2e)
    CHECK(2 + inv_e == doctest::Approx(2.367879441171).epsilon(1e-12));
    CHECK(inv_e - 1 == doctest::Approx(-0.632120558829).epsilon(1e-12));
    CHECK(-(1 + inv_e) == doctest::Approx(-1.367879441171).epsilon(1e-12));
    CHECK(std::fabs(-2 / (2 + inv_e) - z_printed[2]) <= 1e-11);
    const double small = 1 / (1 + 2 * e), big = e / (1 + 2 * e);
    CHECK(std::fabs(small - 0.155362403497) <= 1e-12);
    CHECK(std::fabs(big - 0.422318798252) <= 1e-12);
    CHECK(std::fabs(inv_e / (inv_e + 2) - small) <= 1e-15);
    CHECK(std::fabs(small * (1 - 1) + big * (0 - 1) + big * (-1 + 0) - z_printed[2]) <= 1e-11);

    // the engine's op, forward and backward with dz = (1, 0, 0)
    const Tensor q = param({1, 0, -1}, {1, 1, 3, 1}), k = param({1, 0, -1}, {1, 1, 3, 1}),
                 v = param({1, 0, -1}, {1, 1, 3, 1});
    const Tensor e_k = param({-1, 0, 1}, {1, 3, 1}), e_v = param({-1, 0, 1}, {1, 3, 1});
    const Tensor z = fused_attention(q, k, v, AttentionPattern{}, 1.0, ClippedRelativeTerms{e_k, e_v, 1, 1});
    check_values(z, {z_printed[0], z_printed[1], z_printed[2]}, 1e-11);
    check_values(z, {2 * big, 0, -2 * big});
    z.backward(f64({1, 0, 0}, {1, 1, 3, 1}));
    // row 0 by the page's formulas: D_0 = z_0, dp_0 = (1, 1, 0), ds_0 = p_0 (dp_0 - D_0)
    const double D0 = 2 * big, p0[3] = {big, big, small}, dp0[3] = {1, 1, 0};
    CHECK(std::fabs(D0 - 0.844637596503) <= 1e-11);
    CHECK(std::fabs(p0[0] * dp0[0] + p0[1] * dp0[1] + p0[2] * dp0[2] - D0) <= 1e-15);
    const double ds0[3] = {p0[0] * (dp0[0] - D0), p0[1] * (dp0[1] - D0), p0[2] * (dp0[2] - D0)};
    CHECK(std::fabs(ds0[0] - 0.065612463538) <= 1e-11);
    CHECK(std::fabs(ds0[2] - -0.131224927077) <= 1e-11);
    CHECK(std::fabs(big + small - 0.577681201748) <= 1e-11);                            // P_0[2]
    CHECK(std::fabs(ds0[1] + ds0[2] - -0.065612463538) <= 1e-11);                       // S_0[2]
    CHECK(std::fabs(ds0[0] * 1 + ds0[1] * 0 + ds0[2] * -1 - 0.196837390615) <= 1e-11);  // ds_0 . k
    check_values(e_v.grad(), {0, 0.422318798252, 0.577681201748}, 1e-11);
    check_values(e_v.grad(), {0, big, big + small});
    check_values(e_k.grad(), {0, 0.065612463538, -0.065612463538}, 1e-11);
    check_values(e_k.grad(), {0, ds0[1], ds0[1] + ds0[2]});
    check_values(q.grad(), {0.131224927077, 0, 0}, 1e-11);
    check_values(q.grad(), {ds0[0] - ds0[2] + (ds0[1] + ds0[2]), 0, 0});
    check_values(k.grad(), {0.065612463538, 0.065612463538, -0.131224927077}, 1e-11);
    check_values(v.grad(), {0.422318798252, 0.422318798252, 0.155362403497}, 1e-11);

    // the layer in fused form: attention.md's y and table gradients, and no weights kept
    RelativeOptions o;
    o.k_left = o.k_right = 1;
    Generator gen(21);
    RelativeMultiHeadAttention attention(1, 1, o, AttentionImpl::fused, Init{gen, DType::float64});
    std::vector<Tensor> values = unit_projections();
    values.push_back(param({-1, 0, 1}, {3, 1}));  // E_K
    values.push_back(param({-1, 0, 1}, {3, 1}));  // E_V
    attention.assign_parameters(values);
    const Tensor x = param({1, 0, -1}, {1, 3, 1});
    const Tensor y = attention.forward(x, x);
    CHECK(!attention.last_weights.defined());
    check_values(y, {z_printed[0], z_printed[1], z_printed[2]}, 1e-11);
    y.backward(f64({1, 0, 0}, {1, 3, 1}));
    check_values(attention.rel_pos_emb_v.weight.grad(), {0, 0.422318798252, 0.577681201748}, 1e-11);
    check_values(attention.rel_pos_emb_k.weight.grad(), {0, 0.065612463538, -0.065612463538}, 1e-11);

    // the memory arithmetic, float32 and Dh = 32: B = 8, H = 8, L = 512 and B = 1, H = 8, L = 16384
    const int64_t Dh = 32, MiB = 1 << 20;
    {
        const int64_t B = 8, H = 8, L = 512;
        CHECK(2 * L * L * Dh == 16777216);  // reference: A_K and A_V
        CHECK(B * H * L * L == 16777216);   // bucketed: a
        CHECK(B * H * L == 32768);          // fused: lse
        CHECK(B * H * L * Dh == 1048576);   // z
        CHECK(16777216 * 4 == 64 * MiB);
        CHECK(32768 * 4 == 128 * 1024);
        CHECK(1048576 * 4 == 4 * MiB);
        CHECK(2 * Dh == B * H);
    }
    {
        const int64_t B = 1, H = 8, L = 16384;
        CHECK(2 * L * L * Dh == 17179869184);
        CHECK(B * H * L * L == 2147483648);
        CHECK(B * H * L == 131072);
        CHECK(B * H * L * Dh == 4194304);
        CHECK(17179869184 * 4 == 64 * (int64_t(1) << 30));
        CHECK(2147483648 * 4 == 8 * (int64_t(1) << 30));
        CHECK(131072 * 4 == 512 * 1024);
        CHECK(4194304 * 4 == 16 * MiB);
    }
    gradcheck_layer(attention, {random_input({2, 3, 1}, 14)},
                    [&](const auto& in) { return attention.forward(in[0], in[0]); });
}
