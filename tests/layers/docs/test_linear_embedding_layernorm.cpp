// docs/layers/linear_embedding_layernorm.md's worked examples, number for number: Linear,
// Embedding, LayerNorm, Dropout, FeedForward and the Module base (doc_examples.hpp says how these
// tests are written).
#include "doc_examples.hpp"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/npy.hpp"

using namespace relgrad;
using namespace relgrad::testing;

TEST_CASE("docs/layers/linear_embedding_layernorm.md: Linear") {
    Generator gen(1);
    Linear linear(2, 2, Init{gen, DType::float64});
    linear.assign_parameters({param({1, 0, 2, -1}, {2, 2}), param({0.5, -1}, {2})});
    const Tensor x = param({1, 2}, {2});
    const Tensor y = linear.forward(x);
    check_values(y, {1.5, -1});
    y.backward(f64({1, 2}, {2}));
    check_values(x.grad(), {5, -2});
    check_values(linear.weight.grad(), {1, 2, 2, 4});
    check_values(linear.bias.grad(), {1, 2});
    gradcheck_layer(linear, {random_input({3, 2}, 1)}, [&](const auto& in) { return linear.forward(in[0]); });
}

TEST_CASE("docs/layers/linear_embedding_layernorm.md: Embedding") {
    Generator gen(2);
    Embedding table(3, 2, Init{gen, DType::float64});
    table.assign_parameters({param({1, 2, 3, 4, 5, 6}, {3, 2})});
    const Tensor ids = from_vector({2, 0, 2}, {3}, DType::int64);
    const Tensor y = table.forward(ids);
    check_values(y, {5, 6, 1, 2, 5, 6});
    y.backward(f64({1, 2, 3, 4, 5, 6}, {3, 2}));
    check_values(table.weight.grad(), {3, 4, 0, 0, 6, 8});             // row 2 used twice: (1, 2) + (5, 6)
    CHECK_THROWS(table.forward(from_vector({3}, {1}, DType::int64)));  // no row 3
    gradcheck_layer(table, {}, [&](const auto&) { return table.forward(ids.to(table.device())); });
}

TEST_CASE("docs/layers/linear_embedding_layernorm.md: LayerNorm") {
    Generator gen(3);
    LayerNorm norm(4, Init{gen, DType::float64});
    norm.assign_parameters({param({1, 1, 2, 2}, {4}), param({0, 0, 0, 1}, {4})});
    const Tensor x = param({1, 1, 3, 3}, {4});
    const double rstd = 1 / std::sqrt(1 + 1e-5);  // mean 2, variance 1
    CHECK(rstd == doctest::Approx(0.999995000037).epsilon(1e-12));
    const Tensor y = norm.forward(x);
    check_values(y, {-0.999995000037, -0.999995000037, 1.999990000075, 2.999990000075}, 1e-11);
    y.backward(f64({1, 0, 0, 0}, {4}));
    check_values(x.grad(), {0.499999999981, -0.499995000056, -0.000002499963, -0.000002499963}, 1e-11);
    // dx = rstd (gh - mean(gh) - xhat mean(gh xhat)) with gh = (1, 0, 0, 0), mean(gh xhat) = -rstd/4
    check_values(x.grad(), {rstd * (0.75 - rstd * rstd / 4), rstd * (-0.25 - rstd * rstd / 4),
                            rstd * (-0.25 + rstd * rstd / 4), rstd * (-0.25 + rstd * rstd / 4)});
    check_values(norm.weight.grad(), {-rstd, 0, 0, 0});
    check_values(norm.bias.grad(), {1, 0, 0, 0});
    gradcheck_layer(norm, {random_input({3, 4}, 2)}, [&](const auto& in) { return norm.forward(in[0]); });
}

TEST_CASE("docs/layers/linear_embedding_layernorm.md: Dropout and FeedForward") {
    Dropout drop(0.5, 7);
    const Tensor ones8 = ones({8}, DType::float64).requires_grad_(true);
    const Tensor dropped = drop.forward(ones8);
    int kept = 0;
    for (double v : dropped.to_vector()) {
        CHECK((v == 0 || v == 2));  // zeroed, or kept and scaled by 1 / (1 - p) = 2
        kept += v == 2;
    }
    CHECK(kept > 0);
    CHECK(kept < 8);
    dropped.backward(ones_like(dropped));
    CHECK(ones8.grad().to_vector() == dropped.to_vector());  // the same mask scales the gradient
    drop.eval();
    CHECK(drop.forward(ones8).to_vector() == std::vector<double>(8, 1.0));  // identity in eval mode

    Generator gen(4);
    FeedForward ff(2, 2, 0.0, Init{gen, DType::float64});
    std::vector<std::string> names;
    for (const auto& [name, p] : ff.named_parameters()) names.push_back(name);
    CHECK(names == std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"});
    ff.assign_parameters(
        {param({1, 0, 0, 1}, {2, 2}), param({0, 0}, {2}), param({1, 0, 0, 1}, {2, 2}), param({0, 0}, {2})});
    const Tensor x = param({1, -1}, {2});
    const Tensor y = ff.forward(x);
    check_values(y, {0.841344746069, -0.158655253931}, 1e-11);  // gelu(1), gelu(-1)
    y.backward(f64({1, 1}, {2}));
    check_values(x.grad(), {1.083315470588, -0.083315470588}, 1e-11);  // Phi(x) + x phi(x)
    const double phi1 = std::exp(-0.5) / std::sqrt(2 * M_PI), Phi1 = 0.5 * std::erfc(-1 / std::sqrt(2.0));
    CHECK(Phi1 == doctest::Approx(0.841344746069).epsilon(1e-11));
    CHECK(phi1 == doctest::Approx(0.241970724519).epsilon(1e-11));
    check_values(x.grad(), {Phi1 + phi1, (1 - Phi1) - phi1});
    gradcheck_layer(ff, {random_input({3, 2}, 3)}, [&](const auto& in) { return ff.forward(in[0]); });
}

TEST_CASE("docs/layers/linear_embedding_layernorm.md: the Module base, state directory and initialisation") {
    namespace fs = std::filesystem;
    Generator gen(5);
    Linear linear(2, 2, Init{gen, DType::float64});
    CHECK(linear.parameter_count() == 6);
    const double bound = std::sqrt(6.0 / (2 + 2));  // Xavier uniform
    CHECK(bound == doctest::Approx(1.224744871).epsilon(1e-9));
    for (double w : linear.weight.to_vector()) CHECK(std::fabs(w) <= bound);
    CHECK(linear.bias.to_vector() == std::vector<double>{0, 0});
    Embedding table(50, 4, Init{gen, DType::float64});
    for (double w : table.weight.to_vector()) CHECK(std::fabs(w) <= 0.04);  // truncated at 2 std
    LayerNorm norm(3, Init{gen, DType::float64});
    CHECK(norm.weight.to_vector() == std::vector<double>{1, 1, 1});
    CHECK(norm.bias.to_vector() == std::vector<double>{0, 0, 0});

    linear.assign_parameters({param({1, 0, 2, -1}, {2, 2}), param({0.5, -1}, {2})});
    const fs::path dir = fs::temp_directory_path() / "relgrad_test_docs_module_state";
    fs::remove_all(dir);
    linear.save(dir.string());
    std::ifstream manifest_file(dir / "manifest.json");
    const nlohmann::json manifest = nlohmann::json::parse(manifest_file);
    const nlohmann::json expected = nlohmann::json::parse(R"({
      "format": "relgrad-state",
      "parameters": [
        {"dtype": "float64", "file": "weight.npy", "name": "weight", "shape": [2, 2]},
        {"dtype": "float64", "file": "bias.npy", "name": "bias", "shape": [2]}
      ],
      "version": 1
    })");
    CHECK(manifest == expected);
    check_values(load_npy((dir / "weight.npy").string()), {1, 0, 2, -1});
    Generator other(6);
    Linear restored(2, 2, Init{other, DType::float64});
    restored.load(dir.string());
    check_values(restored.forward(f64({1, 2}, {2})), {1.5, -1});
    fs::remove_all(dir);

    linear.train();
    CHECK(linear.is_training());
    linear.eval();
    CHECK_FALSE(linear.is_training());
    gradcheck_layer(restored, {random_input({2, 2}, 4)}, [&](const auto& in) { return restored.forward(in[0]); });
}
