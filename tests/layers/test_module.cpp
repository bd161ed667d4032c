// The Module base and the basic layers: names, modes, state files, initialisation, gradients.
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "engine/npy.hpp"
#include "layer_check.hpp"
#include "layers/attention.hpp"

using namespace relgrad;
using namespace relgrad::testing;
namespace fs = std::filesystem;

static RelativeOptions relative_options(int64_t k) {  // clipped at k on both sides
    RelativeOptions o;
    o.k_left = o.k_right = k;
    return o;
}

TEST_CASE("parameters have PyTorch-style dotted names") {
    Generator gen(1);
    RelativeMultiHeadAttention attention(8, 2, RelativeOptions{}, AttentionImpl::bucketed, Init{gen});
    std::vector<std::string> names;
    for (const auto& [name, p] : attention.named_parameters()) names.push_back(name);
    CHECK(names == std::vector<std::string>{"w_q.weight", "w_q.bias", "w_k.weight", "w_k.bias", "w_v.weight",
                                            "w_v.bias", "w_o.weight", "w_o.bias", "rel_pos_emb_k.weight",
                                            "rel_pos_emb_v.weight"});
    CHECK(attention.parameter_count() == 4 * (64 + 8) + 2 * 17 * 4);
    for (const Tensor& p : attention.parameters()) CHECK(p.requires_grad());
}

TEST_CASE("train and eval reach every child; zero_grad clears every gradient") {
    Generator gen(1);
    FeedForward ff(4, 6, 0.5, Init{gen});
    CHECK(ff.dropout.is_training());
    ff.eval();
    CHECK_FALSE(ff.is_training());
    CHECK_FALSE(ff.dropout.is_training());
    const Tensor x = random_input({3, 4}, 2).to(DType::float32);
    CHECK(ff.forward(x).to_vector() == ff.forward(x).to_vector());  // no dropout in eval mode
    sum(ff.forward(x)).backward();
    CHECK(ff.fc1.weight.grad().defined());
    ff.zero_grad();
    for (const Tensor& p : ff.parameters()) CHECK_FALSE(p.grad().defined());
}

TEST_CASE("state saves as .npy files plus a manifest and loads back") {
    const fs::path dir = fs::temp_directory_path() / "relgrad_test_state";
    fs::remove_all(dir);
    Generator g1(1), g2(2);
    Linear saved(3, 2, Init{g1}), restored(3, 2, Init{g2});
    CHECK(saved.weight.to_vector() != restored.weight.to_vector());
    saved.save(dir.string());
    CHECK(load_npy((dir / "weight.npy").string()).to_vector() == saved.weight.to_vector());  // plain NumPy files
    std::ifstream manifest_file(dir / "manifest.json");
    const nlohmann::json manifest = nlohmann::json::parse(manifest_file);
    CHECK(manifest["parameters"][0]["name"] == "weight");
    CHECK(manifest["parameters"][0]["shape"] == nlohmann::json::array({2, 3}));
    restored.load(dir.string());
    CHECK(restored.weight.to_vector() == saved.weight.to_vector());
    CHECK(restored.bias.to_vector() == saved.bias.to_vector());
    saved.save(dir.string());  // saving over an existing state replaces it
    CHECK_FALSE(fs::exists(dir.string() + ".partial"));

    Linear wrong_shape(4, 2, Init{g2});
    const std::vector<double> before = wrong_shape.weight.to_vector();
    const std::string manifest_path = (dir / "manifest.json").string();
    CHECK_THROWS_WITH_AS(wrong_shape.load(dir.string()),
                         (manifest_path + ": parameter 'weight' has shape [2, 3], the model's is [2, 4]").c_str(),
                         std::invalid_argument);
    CHECK(wrong_shape.weight.to_vector() == before);  // a failed load changes nothing
    Linear no_bias(3, 2, Init{g2}, false);
    CHECK_THROWS_WITH_AS(no_bias.load(dir.string()),
                         (manifest_path + ": saved parameter 'bias' is not in the model").c_str(),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(
        saved.load((dir / "nowhere").string()),
        ((dir / "nowhere" / "manifest.json").string() + ": missing, expected a saved state's manifest.json (is " +
         (dir / "nowhere").string() + " a directory Module.save wrote?)")
            .c_str(),
        std::invalid_argument);
    fs::remove(dir / "bias.npy");
    CHECK_THROWS_WITH_AS(restored.load(dir.string()),
                         ((dir / "bias.npy").string() + ": missing, expected a .npy file").c_str(),
                         std::invalid_argument);
    fs::remove_all(dir);
}

TEST_CASE("a manifest is checked field by field before anything changes: format, version, file, shape, dtype") {
    const fs::path dir = fs::temp_directory_path() / "relgrad_test_state_fields";
    fs::remove_all(dir);
    Generator g1(1), g2(2);
    Linear saved(3, 2, Init{g1}), restored(3, 2, Init{g2});
    saved.save(dir.string());
    std::ifstream manifest_file(dir / "manifest.json");
    const nlohmann::json manifest = nlohmann::json::parse(manifest_file);
    manifest_file.close();
    const std::string where = (dir / "manifest.json").string();
    const std::vector<double> before = restored.weight.to_vector();
    SUBCASE("format, version, and each parameter's file and dtype, the file against its entry") {
        const auto refusal = [&](const std::function<void(nlohmann::json&)>& change) -> std::string {
            nlohmann::json damaged = manifest;
            change(damaged);
            std::ofstream(dir / "manifest.json") << damaged.dump();
            try {
                restored.load(dir.string());
            } catch (const std::invalid_argument& e) {
                return e.what();
            }
            return "loaded";
        };
        CHECK(refusal([](nlohmann::json& m) { m["version"] = 99; }) ==
              where + ": version 99, this relgrad reads version 1");
        CHECK(refusal([](nlohmann::json& m) { m["format"] = "other"; }) ==
              where + ": expected {\"format\": \"relgrad-state\", \"version\": 1, \"parameters\": [...]}");
        CHECK(refusal([](nlohmann::json& m) { m["parameters"][0]["file"] = "../../../../../etc/passwd"; }) ==
              where + ": parameter 'weight': file must be 'weight.npy'");
        CHECK(refusal([](nlohmann::json& m) { m["parameters"][0]["dtype"] = "int64"; }) ==
              where +
                  ": parameter 'weight': dtype must be one of float32, float64, bfloat16 or float16, got \"int64\"");
        CHECK(refusal([](nlohmann::json& m) {
                  m["parameters"][0].erase("dtype");
              }).rfind(where + ": a parameter is {\"name\", \"file\", \"shape\", \"dtype\"}, got ", 0) == 0);
        // the file's dtype and shape are the manifest's: float16 weights where float32 was written
        std::ofstream(dir / "manifest.json") << manifest.dump();
        save_npy(saved.weight.to(DType::float16), (dir / "weight.npy").string());
        CHECK_THROWS_WITH_AS(
            restored.load(dir.string()),
            ((dir / "weight.npy").string() + ": holds [2, 3] float16, " + where + " lists [2, 3] float32").c_str(),
            std::invalid_argument);
        CHECK(restored.weight.to_vector() == before);
        save_npy(saved.weight.reshape({3, 2}), (dir / "weight.npy").string());
        CHECK_THROWS_WITH_AS(
            restored.load(dir.string()),
            ((dir / "weight.npy").string() + ": holds [3, 2] float32, " + where + " lists [2, 3] float32").c_str(),
            std::invalid_argument);
        save_npy(saved.weight, (dir / "weight.npy").string());  // as saved: loads
        restored.load(dir.string());
        CHECK(restored.weight.to_vector() == saved.weight.to_vector());
    }
    SUBCASE("shapes that are not lists of sizes") {
        // 1e30 and 2^64 + 1 (parsed as a float) as sizes were undefined behaviour when converted
        for (const std::string size :
             {"1e30", "18446744073709551617", "9223372036854775808", "-2", "2.5", "\"2\"", "[2]"}) {
            nlohmann::json damaged = manifest;
            damaged["parameters"][0]["shape"][0] = nlohmann::json::parse(size);
            std::ofstream(dir / "manifest.json") << damaged.dump();
            CAPTURE(size);
            CHECK_THROWS_WITH_AS(
                restored.load(dir.string()),
                (where + ": parameter 'weight': shape must be a list of sizes (whole numbers >= 0)").c_str(),
                std::invalid_argument);
            CHECK(restored.weight.to_vector() == before);
        }
        nlohmann::json not_a_list = manifest;
        not_a_list["parameters"][0]["shape"] = 6;
        std::ofstream(dir / "manifest.json") << not_a_list.dump();
        CHECK_THROWS_AS(restored.load(dir.string()), std::invalid_argument);
        std::ofstream(dir / "manifest.json") << manifest.dump();  // the sizes as saved load
        restored.load(dir.string());
        CHECK(restored.weight.to_vector() == saved.weight.to_vector());
    }
    fs::remove_all(dir);
}

TEST_CASE("to(device) moves the parameters; state files cross devices") {
    Generator gen(5);
    RelativeMultiHeadAttention layer(4, 2, relative_options(2), AttentionImpl::bucketed,
                                     Init{gen, DType::float64});
    const Tensor x = random_input({2, 3, 4}, 6);
    const Tensor on_cpu = layer.forward(x, x);
    const TensorImpl* weight_before = layer.w_q.weight.impl();
    layer.to(Device::guarded_cpu);
    CHECK(layer.device() == Device::guarded_cpu);
    CHECK(layer.w_q.weight.impl() == weight_before);  // the same leaf: whoever holds it follows the move
    for (const auto& [name, p] : layer.named_parameters()) {
        CAPTURE(name);
        CHECK(p.device() == Device::guarded_cpu);
        CHECK(p.is_leaf());
        CHECK(p.requires_grad());
    }
    // the same numbers on the device (the precomputed relative index, a buffer, moved too)
    const Tensor on_device = layer.forward(x.to(Device::guarded_cpu), x.to(Device::guarded_cpu));
    CHECK(on_device.device() == Device::guarded_cpu);
    CHECK(on_device.to_vector() == on_cpu.to_vector());
    CHECK_THROWS_AS(layer.forward(x, x), std::invalid_argument);  // inputs left on the CPU
    // saved from the device, loaded into a CPU model: the same numbers
    const auto dir = std::filesystem::temp_directory_path() / "relgrad_test_module_device";
    layer.save(dir.string());
    Generator other_gen(99);
    RelativeMultiHeadAttention restored(4, 2, relative_options(2), AttentionImpl::bucketed,
                                        Init{other_gen, DType::float64});
    restored.load(dir.string());
    CHECK(restored.forward(x, x).to_vector() == on_cpu.to_vector());
    // and loaded into a model on the device
    restored.to(Device::guarded_cpu);
    restored.load(dir.string());
    CHECK(restored.w_q.weight.device() == Device::guarded_cpu);
    CHECK(restored.w_q.weight.to_vector() == layer.w_q.weight.to_vector());
    std::filesystem::remove_all(dir);
}

TEST_CASE("initialisation: truncated normal and Xavier, seeded") {
    Generator gen(3);
    const std::vector<double> t = truncated_normal({10000}, 0.02, Init{gen, DType::float64}).to_vector();
    double sum_sq = 0;
    for (double v : t) {
        CHECK(std::fabs(v) <= 0.04);
        sum_sq += v * v;
    }
    CHECK(std::sqrt(sum_sq / t.size()) == doctest::Approx(0.02 * 0.88).epsilon(0.03));  // std of N(0,1) cut at +-2
    const double bound = std::sqrt(6.0 / (30 + 20));
    double largest = 0;
    for (double v : xavier_uniform({30, 20}, Init{gen, DType::float64}).to_vector())
        largest = std::max(largest, std::fabs(v));
    CHECK(largest <= bound);
    CHECK(largest > 0.9 * bound);
    Generator a(5), b(5);
    CHECK(Linear(3, 3, Init{a}).weight.to_vector() == Linear(3, 3, Init{b}).weight.to_vector());
}

TEST_CASE("basic layers compute what they say") {
    Generator gen(4);
    const Init init{gen, DType::float64};
    Linear linear(3, 2, init);
    const Tensor x = random_input({4, 3}, 5);
    CHECK(max_difference(linear.forward(x), add(matmul(x, linear.weight.transpose(0, 1)), linear.bias)) == 0);
    CHECK_THROWS_WITH_AS(linear.forward(random_input({4, 2}, 1)), "Linear: input of shape [4, 2] must end in dim 3",
                         std::invalid_argument);
    Embedding table(5, 3, init);
    const Tensor looked_up = table.forward(from_vector({4, 0}, {2}, DType::int64));
    check_values(looked_up.narrow(0, 0, 1), table.weight.narrow(0, 4, 1).to_vector());
    Dropout drop(0.5, 1);
    CHECK(drop.forward(x).to_vector() != drop.forward(x).to_vector());  // a new mask each call
    CHECK_THROWS_AS(Dropout(1.0, 1), std::invalid_argument);
    CHECK_THROWS_AS(Linear(0, 2, init), std::invalid_argument);
}

TEST_CASE("basic layers pass their gradient checks") {
    Generator gen(6);
    const Init init{gen, DType::float64};
    Linear linear(3, 5, init);
    gradcheck_layer(linear, {random_input({2, 4, 3}, 1)}, [&](const auto& in) { return linear.forward(in[0]); });
    Linear no_bias(3, 1, init, false);
    gradcheck_layer(no_bias, {random_input({1, 3}, 2)}, [&](const auto& in) { return no_bias.forward(in[0]); });
    Embedding table(7, 3, init);
    const Tensor ids = from_vector({6, 0, 6, 2, 3}, {5}, DType::int64);
    gradcheck_layer(table, {}, [&](const auto&) { return table.forward(ids.to(table.device())); });
    LayerNorm norm(5, init);
    gradcheck_layer(norm, {random_input({3, 5}, 3)}, [&](const auto& in) { return norm.forward(in[0]); });
    FeedForward ff(3, 7, 0.2, init);
    gradcheck_layer(ff, {random_input({2, 3}, 4)}, [&](const auto& in) { return ff.forward(in[0]); });
}
