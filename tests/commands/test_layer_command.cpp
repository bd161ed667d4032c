// `relgrad layer`: a layer run on .npy files, and the errors for bad specs and bad files.
// (It runs layers whose gradients are checked elsewhere; here the files must carry exactly what
// the layer computes, which the last case confirms with a gradient check of the same layer.)
#include <filesystem>
#include <fstream>
#include <functional>

#include "../layers/layer_check.hpp"
#include "engine/npy.hpp"
#include "layers/attention.hpp"
#include "commands/layer_command.hpp"

using namespace relgrad;
using namespace relgrad::testing;
namespace fs = std::filesystem;

namespace {

struct Workspace {
    fs::path root = fs::temp_directory_path() / "relgrad_test_layer_command";
    fs::path in = root / "in", out = root / "out", spec = root / "spec.json";
    Workspace() {
        fs::remove_all(root);
        fs::create_directories(in);
    }
    ~Workspace() { fs::remove_all(root); }
    void write_spec(const std::string& json) { std::ofstream(spec) << json; }
    void save(const std::string& name, const Tensor& t) { save_npy(t, (in / name).string()); }
    std::string error() {
        try {
            run_layer_command(spec.string(), in.string(), out.string());
        } catch (const std::exception& e) {
            return e.what();
        }
        return "no error";
    }
};

// A relative attention layer's parameters and inputs written as relgrad layer reads them.
void write_relative_attention(Workspace& w, MultiHeadAttention& layer, const Tensor& x, const Tensor& dy) {
    w.save("x.npy", x);
    w.save("dy.npy", dy);
    for (const auto& [name, p] : layer.named_parameters()) w.save(name + ".npy", p);
}

}  // namespace

TEST_CASE("relgrad layer computes what the layer computes") {
    Workspace w;
    w.write_spec(R"({"type": "relative_attention", "dim": 6, "heads": 2, "k": 2, "attention": "reference",
                     "causal": true, "dtype": "float64", "share_across_heads": false})");
    Generator gen(3);
    RelativeOptions o;
    o.k_left = o.k_right = 2;
    o.share_across_heads = false;
    RelativeMultiHeadAttention layer(6, 2, o, AttentionImpl::reference, Init{gen, DType::float64});
    const Tensor x = random_input({2, 4, 6}, 1), dy = random_input({2, 4, 6}, 2).detach();
    write_relative_attention(w, layer, x.detach(), dy);
    w.save("mask.npy", from_vector({1, 1, 1, 0, 1, 1, 0, 0}, {2, 4}, DType::float32));  // key padding
    REQUIRE(w.error() == "no error");

    const Tensor mask = combine_masks(key_padding_mask({3, 2}, 4), causal_mask(4, 4));
    const Tensor y = layer.forward(x, x, mask);
    y.backward(dy);
    CHECK(max_difference(load_npy((w.out / "y.npy").string()), y) == 0);
    CHECK(max_difference(load_npy((w.out / "dx.npy").string()), x.grad()) == 0);
    for (const auto& [name, p] : layer.named_parameters()) {
        CAPTURE(name);
        CHECK(max_difference(load_npy((w.out / ("grad." + name + ".npy")).string()), p.grad()) == 0);
    }
    gradcheck_layer(layer, {random_input({2, 4, 6}, 5)},
                    [&](const auto& in) { return layer.forward(in[0], in[0], mask.to(in[0].device())); });
}

TEST_CASE("relgrad layer runs the fused form and low-rank tables: the files match the reference form") {
    Workspace w;
    w.write_spec(R"({"type": "relative_attention", "dim": 6, "heads": 3, "k_left": 1, "k_right": 3, "rank": 2,
                     "attention": "fused", "causal": true, "dtype": "float64"})");
    Generator gen(4);
    RelativeOptions o;
    o.k_left = 1;
    o.k_right = 3;
    o.rank = 2;
    RelativeMultiHeadAttention reference(6, 3, o, AttentionImpl::reference, Init{gen, DType::float64});
    const Tensor x = random_input({2, 5, 6}, 6), dy = random_input({2, 5, 6}, 7).detach();
    write_relative_attention(w, reference, x.detach(), dy);
    REQUIRE(w.error() == "no error");
    const Tensor y = reference.forward(x, x, causal_mask(5, 5));
    y.backward(dy);
    CHECK(max_difference(load_npy((w.out / "y.npy").string()), y) <= 1e-12);
    CHECK(max_difference(load_npy((w.out / "dx.npy").string()), x.grad()) <= 1e-12);
    for (const auto& [name, p] : reference.named_parameters()) {
        CAPTURE(name);
        CHECK(max_difference(load_npy((w.out / ("grad." + name + ".npy")).string()), p.grad()) <= 1e-12);
    }
}

TEST_CASE("relgrad layer runs RoPE, ALiBi and T5's bias in the fused form: the files match the reference form") {
    RelativeFamilyOptions o;
    o.rope_base = 50;
    o.t5_buckets = 8;
    o.t5_max_distance = 6;
    struct Case {
        std::string spec;
        std::function<std::unique_ptr<MultiHeadAttention>(const Init&)> reference;
    };
    const std::vector<Case> cases = {
        {R"({"type": "rope_attention", "dim": 8, "heads": 2, "rope_base": 50)",
         [&](const Init& init) {
             return std::make_unique<RotaryMultiHeadAttention>(8, 2, 50, AttentionImpl::reference, init);
         }},
        {R"({"type": "alibi_attention", "dim": 8, "heads": 2)",
         [&](const Init& init) { return std::make_unique<AlibiAttention>(8, 2, AttentionImpl::reference, init); }},
        // causal, so T5's causal buckets unless told otherwise
        {R"({"type": "t5_attention", "dim": 8, "heads": 2, "t5_buckets": 8, "t5_max_distance": 6)",
         [&](const Init& init) {
             return std::make_unique<T5BiasAttention>(8, 2, o, false, AttentionImpl::reference, init);
         }},
        {R"({"type": "t5_attention", "dim": 8, "heads": 2, "t5_buckets": 8, "t5_max_distance": 6, "bidirectional": true)",
         [&](const Init& init) {
             return std::make_unique<T5BiasAttention>(8, 2, o, true, AttentionImpl::reference, init);
         }},
    };
    for (const Case& c : cases) {
        CAPTURE(c.spec);
        Workspace w;
        w.write_spec(c.spec + R"(, "attention": "fused", "causal": true, "dtype": "float64"})");
        Generator gen(4);
        std::unique_ptr<MultiHeadAttention> reference = c.reference(Init{gen, DType::float64});
        const Tensor x = random_input({2, 5, 8}, 6), dy = random_input({2, 5, 8}, 7).detach();
        write_relative_attention(w, *reference, x.detach(), dy);
        REQUIRE(w.error() == "no error");
        const Tensor y = reference->forward(x, x, causal_mask(5, 5));
        y.backward(dy);
        CHECK(max_difference(load_npy((w.out / "y.npy").string()), y) <= 1e-12);
        CHECK(max_difference(load_npy((w.out / "dx.npy").string()), x.grad()) <= 1e-12);
        for (const auto& [name, p] : reference->named_parameters()) {
            CAPTURE(name);
            CHECK(max_difference(load_npy((w.out / ("grad." + name + ".npy")).string()), p.grad()) <= 1e-12);
        }
    }
    Workspace w;
    w.write_spec(R"({"type": "rope_attention", "dim": 6, "heads": 2})");
    CHECK(w.error() == w.spec.string() +
                           ": /heads: got 2, expected such that the head dim dim / heads is even (RoPE rotates pairs)");
    w.write_spec(R"({"type": "alibi_attention", "dim": 6, "heads": 2, "rope_base": 100})");
    CHECK(w.error().find("rope_base") != std::string::npos);
}

TEST_CASE("bad specs and files are reported with the file and what was expected") {
    Workspace w;
    Generator gen(4);
    RelativeOptions o;
    o.k_left = o.k_right = 8;
    RelativeMultiHeadAttention layer(4, 2, o, AttentionImpl::bucketed, Init{gen});
    write_relative_attention(w, layer, randn({1, 3, 4}, gen), randn({1, 3, 4}, gen));
    const std::string spec = w.spec.string(), in = w.in.string();

    w.write_spec(R"({"type": "relative_attention", "dim": 4, "heads": 2})");
    CHECK(w.error() == "no error");
    CHECK(fs::exists(w.out / "grad.rel_pos_emb_v.weight.npy"));
    fs::remove_all(w.out);

    w.write_spec(R"({"type": "relative_attention", "dim": 4, "heads": 2, "n_heads": 2})");
    CHECK(w.error().find(spec + ": /n_heads: unknown key (expected one of: attention, causal, dim, dtype, heads, k,") ==
          0);
    w.write_spec(R"({"type": "attention", "dim": 3, "heads": 2})");  // the file and both keys, not the class's words
    CHECK(w.error() == spec + ": /heads: got 2, expected a divisor of dim = 3");
    w.write_spec(R"({"type": "relative_attention", "dim": 4, "heads": -2})");
    CHECK(w.error() == spec + ": /heads: got -2, expected an integer in [1, 256]");
    w.write_spec(R"({"type": "relative_attention", "dim": 4, "heads": 2, "attention": "fast"})");
    CHECK(w.error() == spec + ": /attention: got \"fast\", expected one of \"reference\", \"bucketed\", \"fused\"");
    w.write_spec(R"({"type": "gated_attention", "dim": 4, "heads": 2, "attention": "fused"})");
    CHECK(w.error() ==
          spec + ": /attention: got \"fused\", expected reference or bucketed (the gated layer has no fused form)");
    w.write_spec(R"({"type": "rotary", "dim": 4})");
    CHECK(w.error().find(
              spec + ": /type: got \"rotary\", expected a layer type: one of \"attention\", \"relative_attention\",") ==
          0);
    w.write_spec(R"({"dim": 4})");
    CHECK(w.error() == spec + ": /type: got nothing, expected a string");
    w.write_spec(R"({"type": "relative_attention", "dim": 4, "heads": 2, "dtype": "float8"})");
    CHECK(w.error() ==
          spec + ": /dtype: got \"float8\", expected one of \"float32\", \"float64\", \"bfloat16\", \"float16\"");
    w.write_spec("{not json");
    CHECK(w.error().find(spec + ": not valid JSON") == 0);
    w.write_spec(R"({"type": "relative_attention", "dim": 4, "heads": 2, "heads": 4})");
    CHECK(w.error() == spec + ": /heads: the key is given twice");
    // sizes: each at most 2^20, or what the options description allows, named when too large
    w.write_spec(R"({"type": "linear", "in_features": 4, "out_features": 100000000000})");
    CHECK(w.error() == spec + ": /out_features: got 100000000000, expected an integer in [1, 1048576]");
    w.write_spec(R"({"type": "relative_attention", "dim": 4, "heads": 2, "k": 1000000000})");
    CHECK(w.error() == spec + ": /k: got 1000000000, expected an integer in [0, 4096]");
    w.write_spec(R"({"type": "linear", "in_features": 1048576, "out_features": 1048576})");  // 4 TiB
    CHECK(w.error() == spec +
                           ": /out_features: got 1048576, expected a size that keeps each parameter within 2^28 "
                           "elements: [out_features, in_features] = [1048576, 1048576] would have 1099511627776");
    w.write_spec(R"({"type": "relative_attention", "dim": 32768, "heads": 2})");
    CHECK(w.error() == spec + ": /dim: got 32768, expected an integer in [1, 8192]");  // the model's range
    w.write_spec(R"({"type": "encoder_layer", "dim": 8192, "heads": 2, "ff_dim": 65536})");
    CHECK(w.error() == spec +
                           ": /ff_dim: got 65536, expected a size that keeps each parameter within 2^28 elements: "
                           "[ff_dim, dim] = [65536, 8192] would have 536870912");
    w.write_spec(R"({"type": "encoder_layer", "dim": 4, "heads": 2, "position": "learned"})");
    CHECK(w.error().find(spec + ": /position: got \"learned\", expected none, relative, gated, rope, alibi or t5") ==
          0);
    w.write_spec(R"({"type": "layer_norm", "dim": 4, "eps": 0})");
    CHECK(w.error() == spec + ": /eps: got 0, expected a number in (0, 1]");
    // a directory where the spec goes
    fs::remove(w.spec);
    fs::create_directory(w.spec);
    CHECK(w.error() == spec + ": is a directory, expected a layer spec (JSON)");
    fs::remove(w.spec);

    w.write_spec(R"({"type": "relative_attention", "dim": 4, "heads": 2})");
    w.save("w_q.weight.npy", zeros({4, 3}));
    CHECK(w.error() == in + "/w_q.weight.npy: expected shape [4, 4] for the parameter w_q.weight, got [4, 3]");
    fs::remove(w.in / "w_q.weight.npy");
    CHECK(w.error() == in + "/w_q.weight.npy: missing (the parameter w_q.weight, shape [4, 4])");
    w.save("w_q.weight.npy", zeros({4, 4}));
    w.save("x.npy", zeros({1, 3, 5}));
    CHECK(w.error() == in + "/x.npy: expected shape [B, L, 4], got [1, 3, 5]");
    w.save("x.npy", zeros({3, 3, 4}));
    w.save("mask.npy", zeros({3, 3}));
    CHECK(w.error().find("could be key padding [B, L] or an attention mask [L, L]") != std::string::npos);
    w.save("mask.npy", zeros({2, 3}));
    CHECK(w.error() == in + "/mask.npy: expected shape [B, L] = [3, 3] (key padding), [L, L] = [3, 3] or [B, L, L] = "
                            "[3, 3, 3] (attention), got [2, 3]");
    // a [B, L] mask said to be an attention mask: the message names only what "mask_type" allows
    w.save("x.npy", zeros({2, 3, 4}));
    w.save("dy.npy", zeros({2, 3, 4}));
    w.write_spec(R"({"type": "relative_attention", "dim": 4, "heads": 2, "mask_type": "attention"})");
    CHECK(w.error() == in + "/mask.npy: expected shape [L, L] = [3, 3] or [B, L, L] = [2, 3, 3] (attention), as "
                            "\"mask_type\" is \"attention\", got [2, 3]");
    w.write_spec(R"({"type": "relative_attention", "dim": 4, "heads": 2})");
    w.save("x.npy", zeros({3, 3, 4}));
    w.save("dy.npy", zeros({1, 3, 4}));
    fs::remove(w.in / "mask.npy");
    CHECK(w.error() == in + "/dy.npy: expected the output's shape [3, 3, 4], got [1, 3, 4]");
    CHECK_FALSE(fs::exists(w.out));  // nothing written on any error
}

TEST_CASE("a spec's attention and feed-forward sizes default as a config's model section does") {
    Workspace w;
    w.save("x.npy", random_input({1, 3, 5}, 1).detach());
    w.write_spec(R"({"type": "relative_attention"})");  // dim 64, heads 4
    CHECK(w.error() == (w.in / "x.npy").string() + ": expected shape [B, L, 64], got [1, 3, 5]");
    w.write_spec(R"({"type": "attention", "dim": 8})");  // heads 4 divides 8
    CHECK(w.error() == (w.in / "x.npy").string() + ": expected shape [B, L, 8], got [1, 3, 5]");
    w.write_spec(R"({"type": "attention", "dim": 6})");  // but not 6
    CHECK(w.error() == w.spec.string() + ": /heads: got nothing, expected a divisor of dim = 6");
    w.save("x.npy", random_input({2, 5}, 1).detach());
    w.write_spec(R"({"type": "feed_forward", "dim": 5})");  // ff_dim = 4 dim
    CHECK(w.error() == (w.in / "fc1.weight.npy").string() + ": missing (the parameter fc1.weight, shape [20, 5])");
}

TEST_CASE("a missing --in directory is named as missing, a file as no directory") {
    Workspace w;
    w.write_spec(R"({"type": "linear", "in_features": 2, "out_features": 2})");
    const std::string missing = (w.root / "nowhere").string(), file = w.spec.string();
    CHECK_THROWS_WITH_AS(run_layer_command(w.spec.string(), missing, w.out.string()),
                         (missing + ": does not exist (--in, the directory of x.npy and the parameters)").c_str(),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(run_layer_command(w.spec.string(), file, w.out.string()),
                         (file + ": not a directory (--in, the directory of x.npy and the parameters)").c_str(),
                         std::invalid_argument);
}
