// The commands on a trained run: eval, generate (translate) and attention, on the runs the trainer
// writes.
#include <filesystem>

#include "../train/trainer_check.hpp"
#include "commands/run_commands.hpp"
#include "engine/npy.hpp"
#include "train/config.hpp"
#include "train/trainer.hpp"

using namespace relgrad;
using namespace relgrad::testing;
namespace fs = std::filesystem;

TEST_CASE("a trained run evaluates again to its summary and generates") {
    TempDir dir("relgrad_test_train_eval");
    const nlohmann::json summary = train(Config::parse(tiny_run(dir.path / "cls"), "tiny"), TrainOptions{});
    const nlohmann::json again = evaluate_run((dir.path / "cls").string());
    CHECK(again["accuracy"] == summary["final"]["accuracy"]);
    CHECK(again["by_length"] == summary["final"]["by_length"]);
    CHECK_THROWS_WITH_AS(generate((dir.path / "cls").string(), "4 5", 3),
                         "generate: a classifier generates nothing; use relgrad eval", std::invalid_argument);
    CHECK_THROWS_WITH_AS(evaluate_run((dir.path / "cls").string(), "other.tsv"),
                         "--data: a relative_order run generates its own test data", std::invalid_argument);
    CHECK_THROWS_WITH_AS(
        evaluate_run((dir.path / "nothing").string()),
        ((dir.path / "nothing").string() + ": not a trained run (needs config.json and checkpoint/)").c_str(),
        std::invalid_argument);
    // a checkpoint left as checkpoint.previous/ (a run stopped between two renames) is read there
    fs::rename(dir.path / "cls" / "checkpoint", dir.path / "cls" / "checkpoint.previous");
    CHECK(evaluate_run((dir.path / "cls").string())["accuracy"] == summary["final"]["accuracy"]);
    CHECK_FALSE(fs::exists(dir.path / "cls" / "checkpoint"));  // reading changes nothing

    fs::create_directories(dir.path);
    std::ofstream(dir.path / "text.txt") << std::string(2000, 'a');
    nlohmann::json c = tiny_run(dir.path / "lm");
    c["task"] = {{"kind", "language_model"}};
    c["data"] = {{"train", (dir.path / "text.txt").string()}, {"max_length", 16}};
    c["training"] = {{"steps", 30}, {"batch_size", 8}, {"learning_rate", 1e-2}};
    c["evaluation"] = {{"every", 30}, {"length_buckets", {8, 16}}};
    train(Config::parse(c, "lm"), TrainOptions{});
    CHECK(generate((dir.path / "lm").string(), "aaa", 5) == "aaaaa");  // a text of a's continues with a's
    // progress: told every token, in order, out of the most asked for
    std::vector<std::pair<int64_t, int64_t>> told;
    const DecodeProgress progress = [&](int64_t done, int64_t most) { told.push_back({done, most}); };
    CHECK(generate((dir.path / "lm").string(), "aaa", 5, Device::cpu, progress) == "aaaaa");
    CHECK(told == std::vector<std::pair<int64_t, int64_t>>{{1, 5}, {2, 5}, {3, 5}, {4, 5}, {5, 5}});
    CHECK_THROWS_WITH_AS(generate((dir.path / "lm").string(), "   ", 5), "generate: the prompt is empty",
                         std::invalid_argument);  // only spaces: nothing to continue
}

TEST_CASE("a sequence-pair run evaluates on another file and translates; a gated run reports its gates") {
    TempDir dir("relgrad_test_train_pairs_eval");
    fs::create_directories(dir.path);
    {
        std::ofstream train_file(dir.path / "train.tsv"), other(dir.path / "other.tsv");
        for (int i = 0; i < 40; ++i) train_file << (i % 2 ? "Ja, gut.\tyes, good.\n" : "Nein!\tno!\n");
        other << "Nein!\tno!\nja , gut .\tyes , good .\nJa Nein\tyes no\n";
    }
    nlohmann::json c = tiny_run(dir.path / "pairs");
    c["model"]["position"] = "gated";
    c["task"] = {{"kind", "pairs"}};
    c["data"] = {{"train", (dir.path / "train.tsv").string()},
                 {"held_out", 0.25},
                 {"tokenizer", "word"},
                 {"lowercase", true},
                 {"split_punctuation", true}};
    c["training"] = {{"steps", 60}, {"batch_size", 8}, {"learning_rate", 1e-2}, {"warmup_steps", 4}};
    c["evaluation"] = {{"every", 60}, {"length_buckets", {2, 8}}};
    const nlohmann::json summary = train(Config::parse(c, "pairs"), TrainOptions{});
    // the gate g = sigmoid(lambda) of each self-attention and head: the encoder layer's, the decoder layer's
    REQUIRE(summary["gates"].size() == 2);
    for (const auto& layer : summary["gates"]) {
        REQUIRE(layer.size() == 2);
        for (const auto& gate : layer) {
            CHECK(gate.get<double>() > 0);
            CHECK(gate.get<double>() < 1);
            CHECK(gate.get<double>() != 0.5);  // trained away from its start, lambda = 0
        }
    }
    // another test file, tokenized with the run's options: "ja , gut ." is "Ja, gut." again
    const nlohmann::json other = evaluate_run((dir.path / "pairs").string(), (dir.path / "other.tsv").string());
    CHECK(summary["final"]["accuracy"] == 1.0);         // two pairs to learn in 60 steps
    CHECK(other["by_length"]["3-8"]["examples"] == 1);  // ja , gut .
    CHECK(other["by_length"]["3-8"]["accuracy"] == 1.0);
    CHECK(other["by_length"]["1-2"]["examples"] == 2);  // nein !, and ja nein, which it never saw
    CHECK(other["by_length"]["1-2"]["accuracy"] == 0.5);
    CHECK(generate((dir.path / "pairs").string(), "JA, GUT.", 10) == "yes , good .");
    CHECK_THROWS_WITH_AS(generate((dir.path / "pairs").string(), "", 10), "generate: the prompt is empty",
                         std::invalid_argument);
    // the ids of the checkpoint are the saved tokenizer's: without it the run cannot be read
    fs::remove(dir.path / "pairs" / "tokenizer.json");
    const std::string missing =
        (dir.path / "pairs" / "tokenizer.json").string() + ": missing (a run on text files keeps its vocabulary there)";
    CHECK_THROWS_WITH_AS(evaluate_run((dir.path / "pairs").string()), missing.c_str(), std::invalid_argument);
}

TEST_CASE("the attention weights of a trained run, per layer") {
    TempDir dir("relgrad_test_train_attention");
    train(Config::parse(tiny_run(dir.path / "run"), "tiny"), TrainOptions{});
    const std::vector<std::string> files =
        write_attention((dir.path / "run").string(), "6 7 4 8 9 5 10", (dir.path / "att").string());
    REQUIRE(files.size() == 1);  // one layer
    const Tensor weights = load_npy(files[0]);
    CHECK(weights.shape() == Shape{2, 7, 7});  // [H, L, L]
    for (double row_sum : sum(weights, {-1}).to_vector()) CHECK(row_sum == doctest::Approx(1.0).epsilon(1e-5));
    CHECK_THROWS_WITH_AS(write_attention((dir.path / "run").string(), "6 99", (dir.path / "att").string()),
                         "attention: '99' is not a symbol id in [4, 16) of this synthetic task", std::invalid_argument);
}
