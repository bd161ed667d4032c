// docs/layers/attention.md's worked examples, number for number: plain attention, relative
// attention by hand and the memory arithmetic (doc_examples.hpp says how these tests are written).
#include "doc_examples.hpp"

using namespace relgrad;
using namespace relgrad::testing;

TEST_CASE("docs/layers/attention.md: two heads of plain attention") {
    Generator gen(10);
    MultiHeadAttention attention(2, 2, Init{gen, DType::float64});
    std::vector<Tensor> values;
    for (int i = 0; i < 4; ++i) {
        values.push_back(param({1, 0, 0, 1}, {2, 2}));
        values.push_back(param({0, 0}, {2}));
    }
    attention.assign_parameters(values);
    const Tensor x = param({1, 0, 0, 1}, {1, 2, 2});
    const Tensor y = attention.forward(x, x);
    const double s1 = sigmoid_of(1);  // softmax([1, 0]) = (sigmoid(1), sigmoid(-1))
    CHECK(s1 == doctest::Approx(0.731058578630).epsilon(1e-12));
    check_values(attention.last_weights, {s1, 1 - s1, 0.5, 0.5, 0.5, 0.5, 1 - s1, s1});
    check_values(y, {0.731058578630, 0.5, 0.5, 0.731058578630}, 1e-11);
    gradcheck_layer(attention, {random_input({2, 3, 2}, 8)},
                    [&](const auto& in) { return attention.forward(in[0], in[0]); });
}

TEST_CASE("docs/layers/attention.md: relative attention by hand, reference = bucketed") {
    RelativeOptions o;
    o.k_left = o.k_right = 1;
    for (AttentionImpl impl : {AttentionImpl::reference, AttentionImpl::bucketed}) {
        CAPTURE(static_cast<int>(impl));
        Generator gen(11);
        RelativeMultiHeadAttention attention(1, 1, o, impl, Init{gen, DType::float64});
        std::vector<Tensor> values = unit_projections();
        values.push_back(param({-1, 0, 1}, {3, 1}));  // E_K
        values.push_back(param({-1, 0, 1}, {3, 1}));  // E_V
        attention.assign_parameters(values);
        const Tensor x = param({1, 0, -1}, {1, 3, 1});
        const Tensor r = attention.rel_pos_emb_k.index(3, 3);
        check_values(r, {1, 2, 2, 0, 1, 2, 0, 0, 1});
        // bucketed: Q E_K^T [L, K], then gathered by r
        const Tensor q = x.detach().reshape({1, 1, 3, 1});
        const Tensor q_table = matmul(q, attention.rel_pos_emb_k.table().transpose(-1, -2));
        check_values(q_table, {-1, 0, 1, 0, 0, 0, 1, 0, -1});
        check_values(gather(q_table, -1, r.expand({1, 1, 3, 3})), {0, 1, 1, 0, 0, 0, 1, 1, 0});

        const Tensor y = attention.forward(x, x);
        const double e = std::exp(1.0), big = e / (2 * e + 1), small = 1 / (2 * e + 1);
        CHECK(big == doctest::Approx(0.422318798252).epsilon(1e-12));
        CHECK(small == doctest::Approx(0.155362403497).epsilon(1e-12));
        check_values(attention.last_weights, {big, big, small, 1.0 / 3, 1.0 / 3, 1.0 / 3, small, big, big});
        // bucket weights: the weights of each row summed per bucket [L, K]
        const Tensor buckets =
            scatter_add(zeros({1, 1, 3, 3}, DType::float64), -1, r.expand({1, 1, 3, 3}), attention.last_weights);
        check_values(buckets, {0, big, big + small, 1.0 / 3, 1.0 / 3, 1.0 / 3, big + small, big, 0});
        check_values(buckets,
                     {0, 0.422318798252, 0.577681201748, 1.0 / 3, 1.0 / 3, 1.0 / 3, 0.577681201748, 0.422318798252, 0},
                     1e-11);
        check_values(y, {0.844637596503, 0, -0.844637596503}, 1e-11);
        check_values(y, {(big - small) + (big + small), 0, -(big - small) - (big + small)});

        y.backward(f64({1, 0, 0}, {1, 3, 1}));
        check_values(attention.rel_pos_emb_v.weight.grad(), {0, 0.422318798252, 0.577681201748}, 1e-11);
        // ds_0j = a_0j (dp_0j - z_0) with dp_0 = v_j + E_V[r(0, j)] = (1, 1, 0)
        const double z0 = 2 * big;
        CHECK(big * (1 - z0) == doctest::Approx(0.065612463538).epsilon(1e-11));     // ds_00 = ds_01
        CHECK(small * (0 - z0) == doctest::Approx(-0.131224927077).epsilon(1e-11));  // ds_02
        check_values(attention.rel_pos_emb_k.weight.grad(), {0, big * (1 - z0), big * (1 - z0) + small * (0 - z0)});
        check_values(attention.rel_pos_emb_k.weight.grad(), {0, 0.065612463538, -0.065612463538}, 1e-11);
        gradcheck_layer(attention, {random_input({2, 3, 1}, 9)},
                        [&](const auto& in) { return attention.forward(in[0], in[0]); });
    }
}

TEST_CASE("docs/layers/attention.md: the memory arithmetic for B = 8, H = 8, L = 512, Dh = 32, k = 8") {
    const int64_t B = 8, H = 8, L = 512, Dh = 32, k = 8, K = 2 * k + 1;
    CHECK(K == 17);
    Generator gen(12);
    RelativeOptions o;
    o.k_left = o.k_right = k;
    RelativeMultiHeadAttention reference(H * Dh, H, o, AttentionImpl::reference, Init{gen, DType::float32});
    // reference: each table E[r(i, j)] is [1, L, L, Dh]
    const int64_t table = reference.rel_pos_emb_k.lookup(L, L).numel();
    CHECK(table == 8388608);
    CHECK(2 * table == 16777216);
    // its backward: one [L, Dh, Lk] gradient per table (Shaw's layout: [L, B*H, Dh] @ [L, Dh, L])
    CHECK(4 * table == 33554432);
    // bucketed: Q E_K^T and the bucket weights, each [B, H, L, K]
    const Tensor q = zeros({B, H, L, Dh});
    const int64_t bucketed = matmul(q, reference.rel_pos_emb_k.table().transpose(-1, -2)).numel();
    CHECK(bucketed == 557056);
    CHECK(2 * bucketed == 1114112);
    CHECK(4 * bucketed == 2228224);
    CHECK(double(2 * table) / double(2 * bucketed) == doctest::Approx(15.06).epsilon(1e-3));
    CHECK(double(L * Dh) / double(B * H * K) == doctest::Approx(15.06).epsilon(1e-3));
    CHECK(16777216 * 4 == 64 << 20);         // 64 MiB in float32
    CHECK(1114112 * 4 == 4.25 * (1 << 20));  // 4.25 MiB
    // the two forms agree (here at a size a gradient check can afford)
    Generator g1(13), g2(13);
    RelativeMultiHeadAttention ref(4, 2, o, AttentionImpl::reference, Init{g1, DType::float64});
    RelativeMultiHeadAttention buck(4, 2, o, AttentionImpl::bucketed, Init{g2, DType::float64});
    const Tensor x = random_input({2, 5, 4}, 10);
    CHECK(max_difference(ref.forward(x, x), buck.forward(x, x)) <= 1e-12);
    gradcheck_layer(buck, {x}, [&](const auto& in) { return buck.forward(in[0], in[0]); });
}
