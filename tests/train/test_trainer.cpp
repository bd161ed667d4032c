// The trainer: a short run whose loss falls, determinism over threads and devices, resume,
// interruption, corrupt checkpoints, divergence, the file tasks. (No gradient check: the models
// trained here are gradient-checked in tests/layers/; this file checks the training loop around them.)
// One file: the trainer's test program (train.trainer), every test a run of train().
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>

#include "../engine/test_helpers.hpp"
#include "commands/run_commands.hpp"
#include "engine/npy.hpp"
#include "engine/system.hpp"
#include "layers/transformer.hpp"
#include "train/config.hpp"
#include "train/datasets.hpp"
#include "train/make_task.hpp"
#include "train/run_directory.hpp"
#include "train/trainer.hpp"
#include "trainer_check.hpp"

using namespace relgrad;
using namespace relgrad::testing;
namespace fs = std::filesystem;

TEST_CASE("a gate group with a learning rate of its own moves the gates further, and resumes with it") {
    TempDir dir("relgrad_test_gate_group");
    nlohmann::json c = tiny_run(dir.path / "default");
    c["model"]["position"] = "gated";
    c["task"]["kind"] = "symbol_at";  // the label is the symbol at position 2
    c["training"]["steps"] = 30;
    c["evaluation"]["every"] = 15;
    const nlohmann::json default_summary = train(Config::parse(c, "c.json"), {});
    // every evaluation line carries the gates, the last one the summary's
    std::vector<nlohmann::json> gates_seen;
    for (const auto& line : read_lines(dir.path / "default" / "metrics.jsonl")) {
        if (line.contains("eval")) gates_seen.push_back(line["gates"]);
    }
    REQUIRE(gates_seen.size() == 3);  // steps 0, 15 and 30
    CHECK(gates_seen.front() == nlohmann::json::parse("[[0.5, 0.5]]"));
    CHECK(gates_seen.back() == default_summary["gates"]);
    c["optimizer"]["groups"] = nlohmann::json::parse(R"([{"match": "*gate*", "lr_scale": 30, "weight_decay": 0}])");
    c["output"]["dir"] = (dir.path / "fast").string();
    const nlohmann::json fast_summary = train(Config::parse(c, "c.json"), {});
    double moved_default = 0, moved_fast = 0;
    for (const auto& layer : default_summary["gates"])
        for (double g : layer) moved_default = std::max(moved_default, std::fabs(g - 0.5));
    for (const auto& layer : fast_summary["gates"])
        for (double g : layer) moved_fast = std::max(moved_fast, std::fabs(g - 0.5));
    CHECK(moved_fast > 5 * moved_default);

    // interrupted and resumed with the groups, the same result
    c["output"]["dir"] = (dir.path / "resumed").string();
    TrainOptions stop;
    stop.stop_after = 13;
    train(Config::parse(c, "c.json"), stop);
    std::ifstream groups(dir.path / "resumed" / "checkpoint" / "optimizer" / "groups.txt");
    std::string first_line;
    std::getline(groups, first_line);
    CHECK(first_line == "30 0 1");  // the gate group: lr x30, no decay, the one layer's lambda
    TrainOptions resume;
    resume.resume = true;
    const nlohmann::json resumed = train(Config::parse(c, "c.json"), resume);
    CHECK(resumed["gates"] == fast_summary["gates"]);
    CHECK(resumed["final"] == fast_summary["final"]);
}

TEST_CASE("a short run: the loss falls, outputs are written, the same seed gives the same run") {
    TempDir a("relgrad_test_train_a"), b("relgrad_test_train_b");
    const Config config = Config::parse(tiny_run(a.path), "tiny");
    const nlohmann::json summary = train(config, TrainOptions{});
    for (const char* file : {"config.json", "metrics.jsonl", "summary.json", "checkpoint/state.json",
                             "checkpoint/model/manifest.json", "checkpoint/optimizer/step.txt"}) {
        CHECK_MESSAGE(fs::exists(a.path / file), file);
    }
    CHECK(summary["task"] == "relative_order");
    CHECK(summary["position"] == "relative");
    CHECK(summary["metric"] == "accuracy");
    CHECK(summary["steps"] == 12);
    CHECK(summary["train_examples"] == 400);
    Generator gen(1);
    const SequenceClassifier model(16, 2, config.model.transformer, config.model.pooling, Init{gen, DType::float32});
    CHECK(summary["parameters"] == model.parameter_count());
    // live at once, at the least: the parameters, their gradients and AdamW's two moments, in float32
    CHECK(summary["peak_live_mib"].get<double>() >=
          4.0 * 4.0 * static_cast<double>(model.parameter_count()) / 1048576.0);
    CHECK(summary["peak_rss_mib"].get<double>() > 0);

    const std::vector<nlohmann::json> lines = read_lines(a.path / "metrics.jsonl");
    REQUIRE(lines.size() == 12 + 3);  // 12 steps, 3 evaluations (0, 6, 12)
    CHECK(lines.front() == nlohmann::json{{"step", 0}, {"eval", summary["initial"]}});
    CHECK(lines.back() == nlohmann::json{{"step", 12}, {"eval", summary["final"]}});
    // every test example counted once, in the bucket of its length
    int64_t examples = 0;
    for (const auto& bucket : summary["final"]["by_length"]) examples += bucket["examples"].get<int64_t>();
    CHECK(examples == 64);
    // tokens per second times seconds: the tokens trained on, the same whole number in the summary
    // and on the last logged step (the summary's seconds also hold the final evaluation)
    const nlohmann::json& last_step = lines[lines.size() - 2];
    const double tokens = summary["tokens_per_second"].get<double>() * summary["train_seconds"].get<double>();
    CHECK(tokens == doctest::Approx(last_step["tokens_per_second"].get<double>() * last_step["seconds"].get<double>()));
    CHECK(tokens == doctest::Approx(std::round(tokens)));
    CHECK(summary["train_seconds"].get<double>() >= last_step["seconds"].get<double>());

    train(Config::parse(tiny_run(b.path), "tiny"), TrainOptions{});
    CHECK(metrics_without_timing(a.path) == metrics_without_timing(b.path));
    CHECK_THROWS_WITH_AS(train(Config::parse(tiny_run(a.path), "tiny"), TrainOptions{}),
                         doctest::Contains("already holds a run; pass --resume"), std::invalid_argument);
}

TEST_CASE("the same run with any thread count, fused attention or not, checkpointed or not") {
    // wide enough that the kernels split their work (gemms by rows, elementwise ops in chunks)
    auto run = [](const fs::path& out, int64_t threads, const std::string& attention, bool checkpointing) {
        nlohmann::json c = tiny_run(out);
        c["model"]["dim"] = 32;
        c["model"]["ff_dim"] = 128;
        c["model"]["attention"] = attention;
        c["training"]["steps"] = 4;
        c["training"]["batch_size"] = 64;
        c["training"]["threads"] = threads;
        c["training"]["gradient_checkpointing"] = checkpointing;
        c["evaluation"]["every"] = 4;
        train(Config::parse(c, "threads"), TrainOptions{});
        return metrics_without_timing(out);
    };
    TempDir a("relgrad_test_threads_a"), b("relgrad_test_threads_b"), c("relgrad_test_threads_c"),
        d("relgrad_test_threads_d");
    const auto one_thread = run(a.path, 1, "fused", true);
    CHECK(run(b.path, 3, "fused", true) == one_thread);
    // bucketed and fused agree up to rounding; checkpointing changes nothing
    const auto bucketed = run(c.path, 2, "bucketed", false), bucketed_checkpointed = run(d.path, 2, "bucketed", true);
    CHECK(bucketed_checkpointed == bucketed);
    REQUIRE(bucketed.size() == one_thread.size());
    for (std::size_t n = 0; n < bucketed.size(); ++n) {
        if (bucketed[n].contains("loss"))
            CHECK(bucketed[n]["loss"].get<double>() ==
                  doctest::Approx(one_thread[n]["loss"].get<double>()).epsilon(1e-4));
    }
}

TEST_CASE("the same run on the guarded CPU device, whose memory the host may not read, and on cuda") {
    // every batch, mask and index is made on the model's device and every number read back by an
    // explicit copy; a run that reads device memory from the host or mixes devices fails here
    auto run = [](const fs::path& out, const std::string& device, const std::string& kind,
                  const std::string& position) {
        nlohmann::json c = tiny_run(out);
        c["task"]["kind"] = kind;
        c["model"]["position"] = position;
        c["model"]["attention"] = position == "gated" ? "bucketed" : "fused";  // gated has no fused form
        c["training"]["device"] = device;
        train(Config::parse(c, "device"), TrainOptions{});
        nlohmann::json summary = read_json_file(out / "summary.json");
        // besides the timing, the peak of live memory differs: on the guarded device the host-side
        // staging of each batch (float64 values before their conversion) is not on the device
        for (const char* key : {"train_seconds", "tokens_per_second", "peak_rss_mib", "peak_live_mib"})
            summary.erase(key);
        return std::make_pair(metrics_without_timing(out), summary);
    };
    for (const auto& [kind, position] : {std::pair<std::string, std::string>{"relative_order", "gated"},
                                         std::pair<std::string, std::string>{"copy", "relative"}}) {
        CAPTURE(kind);
        TempDir cpu("relgrad_test_device_cpu"), guarded("relgrad_test_device_guarded");
        const auto on_cpu = run(cpu.path, "cpu", kind, position);
        const auto on_guarded = run(guarded.path, "guarded_cpu", kind, position);
        CHECK(on_guarded.first == on_cpu.first);
        CHECK(on_guarded.second == on_cpu.second);
        CHECK(on_cpu.second["steps"] == 12);
#ifdef RELGRAD_TEST_CUDA
        // on the test build's cuda device (the CUDA kernels, emulated): the same run up to the
        // order of float32 sums
        TempDir cuda("relgrad_test_device_cuda");
        const auto on_cuda = run(cuda.path, "cuda", kind, position);
        REQUIRE(on_cuda.first.size() == on_cpu.first.size());
        for (std::size_t n = 0; n < on_cpu.first.size(); ++n) {
            check_json_close(on_cuda.first[n], on_cpu.first[n], 1e-3, "metrics line " + std::to_string(n));
        }
        check_json_close(on_cuda.second, on_cpu.second, 1e-3, "summary");
        // a checkpoint written from cuda tensors loads on the cpu, and one written on the cpu
        // loads on cuda: each run evaluates there as it did where it was trained
        nlohmann::json trained_on_cuda = evaluate_run(cuda.path.string(), "", Device::cpu);
        nlohmann::json trained_on_cpu = evaluate_run(cpu.path.string(), "", Device::cuda);
        trained_on_cuda.erase("metric");
        trained_on_cpu.erase("metric");
        check_json_close(trained_on_cuda, on_cuda.second["final"], 1e-3, "cuda run evaluated on the cpu");
        check_json_close(trained_on_cpu, on_cpu.second["final"], 1e-3, "cpu run evaluated on cuda");
#endif
    }
    CHECK(error_of({{"training", {{"device", "tpu"}}}}) ==
          "c.json: /training/device: got \"tpu\", expected one of \"cpu\", \"guarded_cpu\", \"cuda\"");
}

TEST_CASE("training.shards: a batch in shards, each summed alone, gives the whole batch's loss and gradient") {
    // Without dropout a shard's gradient is the gradient of its summed loss, and the shards' sum
    // divided by the batch's count is the gradient of the batch's mean loss: the first step's loss
    // and gradient norm (before any update) agree with the unsharded run's to float32's rounding.
    // Dividing the gradient by a shard's count instead of the batch's makes its norm 4x as large.
    auto run = [](const fs::path& out, std::optional<int64_t> shards, double dropout) {
        nlohmann::json c = tiny_run(out);
        c["model"]["dropout"] = dropout;
        c["training"]["steps"] = 4;
        c["evaluation"]["every"] = 4;
        if (shards) c["training"]["shards"] = *shards;
        train(Config::parse(c, "shards"), TrainOptions{});
        return metrics_without_timing(out);
    };
    TempDir a("relgrad_test_shards_a"), b("relgrad_test_shards_b"), c("relgrad_test_shards_c"),
        d("relgrad_test_shards_d"), e("relgrad_test_shards_e");
    const auto whole = run(a.path, std::nullopt, 0.0), in_four = run(b.path, 4, 0.0);
    REQUIRE(whole[1].contains("loss"));
    REQUIRE(in_four[1].contains("loss"));
    CHECK(in_four[1]["loss"].get<double>() == doctest::Approx(whole[1]["loss"].get<double>()).epsilon(1e-6));
    CHECK(in_four[1]["grad_norm"].get<double>() == doctest::Approx(whole[1]["grad_norm"].get<double>()).epsilon(1e-5));
    // batch_size 16 in 3 shards of 5, 5 and 6 examples; and with dropout, whose masks a shard draws
    // from (seed, step, its first example): the same bits run after run, and the run records S
    const auto uneven = run(c.path, 3, 0.0);
    CHECK(uneven[1]["loss"].get<double>() == doctest::Approx(whole[1]["loss"].get<double>()).epsilon(1e-6));
    CHECK(run(d.path, 4, 0.1) == run(e.path, 4, 0.1));
    CHECK(read_json_file(d.path / "config.json")["training"]["shards"] == 4);
    CHECK_FALSE(read_json_file(a.path / "config.json")["training"].contains("shards"));  // as before
    // a shard holds one example or more
    nlohmann::json too_many = tiny_run(a.path / "refused");
    too_many["training"]["shards"] = 17;
    CHECK(error_of(too_many) ==
          "c.json: /training/shards: got 17, expected at most training.batch_size 16 (a shard "
          "holds one example or more)");
}

TEST_CASE("length bucketing: groups of neighbours by length, and a run that uses them") {
    const std::vector<int64_t> lengths = {5, 1, 3, 1, 9, 3, 2};
    const auto groups = length_groups(lengths, 3);
    REQUIRE(groups.size() == 2);
    CHECK(groups[0] == std::vector<int64_t>{1, 3, 6});     // lengths 1, 1, 2 (ties by index)
    CHECK(groups[1] == std::vector<int64_t>{2, 5, 0, 4});  // 3, 3, 5 and the rest, 9
    CHECK(length_groups(lengths, 10) == std::vector<std::vector<int64_t>>{{1, 3, 6, 2, 5, 0, 4}});
    CHECK(length_groups({}, 4).empty());
    CHECK_THROWS_AS(length_groups(lengths, 0), std::invalid_argument);

    TempDir a("relgrad_test_bucketing_a"), b("relgrad_test_bucketing_b");
    auto run = [](const fs::path& out) {
        nlohmann::json c = tiny_run(out);
        c["task"]["kind"] = "copy";
        c["task"]["vocab"] = 10;
        c["task"]["train_lengths"] = {2, 12};
        c["task"]["test_lengths"] = {2, 12};
        c["training"]["length_bucketing"] = true;
        c["training"]["batch_size"] = 8;
        train(Config::parse(c, "bucketing"), TrainOptions{});
        return metrics_without_timing(out);
    };
    const auto first = run(a.path);
    CHECK(first.size() == 12 + 3);
    CHECK(run(b.path) == first);  // batches still come from (seed, step) alone
}

TEST_CASE("the loss falls: collapsing runs (dedupe)") {
    TempDir out("relgrad_test_train_dedupe");
    nlohmann::json c = tiny_run(out.path);
    c["task"] = {{"kind", "dedupe"},       {"vocab", 10},           {"train_lengths", {3, 8}},
                 {"test_lengths", {3, 8}}, {"train_examples", 400}, {"test_examples", 32}};
    c["training"] = {{"steps", 40}, {"batch_size", 16}, {"learning_rate", 5e-3}, {"warmup_steps", 4}, {"log_every", 1}};
    c["evaluation"] = {{"every", 40}, {"length_buckets", {4, 8}}};
    const nlohmann::json summary = train(Config::parse(c, "dedupe"), TrainOptions{});
    std::vector<double> losses;
    for (const auto& line : read_lines(out.path / "metrics.jsonl")) {
        if (line.contains("loss")) losses.push_back(line["loss"].get<double>());
    }
    REQUIRE(losses.size() == 40);
    CHECK((losses[37] + losses[38] + losses[39]) < 0.8 * (losses[0] + losses[1] + losses[2]));
    CHECK(summary["final"]["token_accuracy"].get<double>() > summary["initial"]["token_accuracy"].get<double>());
}

TEST_CASE("the loss falls: copying short sequences") {
    TempDir out("relgrad_test_train_copy");
    nlohmann::json c = tiny_run(out.path);
    c["task"] = {{"kind", "copy"},         {"vocab", 10},           {"train_lengths", {3, 6}},
                 {"test_lengths", {3, 6}}, {"train_examples", 400}, {"test_examples", 32}};
    c["training"] = {{"steps", 40}, {"batch_size", 16}, {"learning_rate", 5e-3}, {"warmup_steps", 4}, {"log_every", 1}};
    c["evaluation"] = {{"every", 40}, {"length_buckets", {4, 6}}};
    const nlohmann::json summary = train(Config::parse(c, "copy"), TrainOptions{});
    std::vector<double> losses, seconds;
    for (const auto& line : read_lines(out.path / "metrics.jsonl")) {
        if (!line.contains("loss")) continue;
        losses.push_back(line["loss"].get<double>());
        seconds.push_back(line["seconds"].get<double>());
    }
    CHECK(std::is_sorted(seconds.begin(), seconds.end()));
    CHECK(seconds.front() > 0);
    REQUIRE(losses.size() == 40);
    const double first = (losses[0] + losses[1] + losses[2]) / 3, last = (losses[37] + losses[38] + losses[39]) / 3;
    CHECK(last < 0.8 * first);
    // every metric also per source-length bucket; the buckets' exact matches add up to the whole,
    // and the whole's token accuracy is a mean of the buckets' (weighted by their target tokens)
    const nlohmann::json& buckets = summary["final"]["by_length"];
    REQUIRE(buckets.size() == 2);
    int64_t examples = 0;
    double exact = 0;
    std::vector<double> token_accuracies;
    for (const auto& bucket : buckets) {
        examples += bucket["examples"].get<int64_t>();
        exact += bucket["accuracy"].get<double>() * bucket["examples"].get<double>();
        token_accuracies.push_back(bucket["token_accuracy"].get<double>());
    }
    CHECK(examples == 32);
    CHECK(exact / 32 == doctest::Approx(summary["final"]["accuracy"].get<double>()).epsilon(1e-12));
    std::sort(token_accuracies.begin(), token_accuracies.end());
    CHECK(summary["final"]["token_accuracy"].get<double>() >= token_accuracies.front());
    CHECK(summary["final"]["token_accuracy"].get<double>() <= token_accuracies.back());
    // by epochs: 2 passes over 400 examples in batches of 16 are 50 steps
    {
        nlohmann::json by_epochs = c;
        by_epochs["output"]["dir"] = (out.path / "epochs").string();
        by_epochs["training"].erase("steps");
        by_epochs["training"]["epochs"] = 2;
        by_epochs["training"].erase("warmup_steps");
        by_epochs["evaluation"]["every"] = 1000;
        const Config parsed = Config::parse(by_epochs, "epochs");
        CHECK(parsed.training.total_steps(400) == 50);
        CHECK(parsed.training.total_steps(401) == 51);  // a last, partial pass still counts
        CHECK(parsed.training.warmup(50) == 5);         // min(40, steps / 10)
        CHECK(Config::parse(parsed.resolved(), "again").resolved() == parsed.resolved());
        CHECK_FALSE(parsed.resolved()["training"].contains("steps"));
        const nlohmann::json summary_by_epochs = train(parsed, TrainOptions{});
        CHECK(summary_by_epochs["steps"] == 50);
        CHECK(read_lines(out.path / "epochs" / "metrics.jsonl").size() == 2 + 50);  // 2 evaluations, 50 steps
    }
    // with one bucket for every length, the bucket's metrics are the whole test set's
    c["output"]["dir"] = (out.path / "one_bucket").string();
    c["training"]["steps"] = 4;
    c["evaluation"] = {{"every", 4}, {"length_buckets", {8}}};
    const nlohmann::json one = train(Config::parse(c, "copy"), TrainOptions{})["final"];
    REQUIRE(one["by_length"].size() == 1);
    for (const char* key : {"accuracy", "token_accuracy", "bleu"}) CHECK(one["by_length"]["1-8"][key] == one[key]);
    CHECK(one["token_accuracy"].get<double>() > 0);  // so that the equality compares something
    CHECK_THROWS_WITH_AS(generate((out.path / "one_bucket").string(), " ", 5), "generate: the prompt is empty",
                         std::invalid_argument);
    CHECK(!generate((out.path / "one_bucket").string(), "4 5", 5).empty());
}

TEST_CASE("decoder-only pairs: the loss counts the answer alone, and the answers are decoded after the prompt") {
    TempDir out("relgrad_test_train_prompt_answer");
    nlohmann::json c = tiny_run(out.path);
    c["model"]["position"] = "alibi";
    c["task"] = {{"kind", "reverse"},     {"vocab", 9},          {"train_lengths", {2, 4}}, {"test_lengths", {2, 6}},
                 {"train_examples", 300}, {"test_examples", 40}, {"decoder_only", true}};
    c["training"] = {{"steps", 60}, {"batch_size", 16}, {"learning_rate", 5e-3}, {"warmup_steps", 4}, {"log_every", 1}};
    c["evaluation"] = {{"every", 60}, {"length_buckets", {4, 6}}};
    const Config config = Config::parse(c, "reverse");
    Generator gen(1);
    std::optional<Tokenizer> no_tokenizer;
    std::unique_ptr<Task> task = make_task(config, Init{gen}, no_tokenizer);
    CHECK(std::string(task->metric()) == "accuracy");
    REQUIRE(dynamic_cast<PromptAnswerTask*>(task.get()) != nullptr);
    // one example: source s, then bos and target t; only |t| + 1 positions are predicted, so the
    // loss is the mean over those, as a cross entropy over exactly those positions computes it
    task->model().eval();  // no dropout: the two forwards below see one model
    LossCounts counts;
    const Tensor loss = task->loss({0}, counts, Reduction::mean);
    // the training set's first example
    const TokenPair first = make_reverse_task(300, 2, 4, 9, config.training.seed)[0];
    CHECK(counts.tokens == static_cast<int64_t>(first.source.size() + 1 + first.target.size()));
    CHECK(counts.targets == static_cast<int64_t>(first.target.size() + 1));
    auto& model = dynamic_cast<CausalLanguageModel&>(task->model());
    std::vector<int64_t> input = first.source;
    input.push_back(2);  // bos
    input.insert(input.end(), first.target.begin(), first.target.end());
    const Tensor ids =
        from_vector(std::vector<double>(input.begin(), input.end()), {1, (int64_t)input.size()}, DType::int64);
    const Tensor logits = model.forward(ids, {(int64_t)input.size()});
    const int64_t answer_from = static_cast<int64_t>(first.source.size());
    std::vector<int64_t> labels = first.target;
    labels.push_back(3);  // eos
    const Tensor expected = cross_entropy(
        logits.squeeze(0).narrow(0, answer_from, (int64_t)labels.size()),
        from_vector(std::vector<double>(labels.begin(), labels.end()), {(int64_t)labels.size()}, DType::int64));
    CHECK(std::fabs(loss.item() - expected.item()) <= 1e-6);
    task->model().train();
    // a run: the loss falls, and every test example is scored per source-length bucket
    const nlohmann::json summary = train(config, TrainOptions{});
    std::vector<double> losses;
    for (const auto& line : read_lines(out.path / "metrics.jsonl"))
        if (line.contains("loss")) losses.push_back(line["loss"].get<double>());
    REQUIRE(losses.size() == 60);
    CHECK((losses[57] + losses[58] + losses[59]) < 0.8 * (losses[0] + losses[1] + losses[2]));
    int64_t examples = 0;
    for (const auto& bucket : summary["final"]["by_length"]) examples += bucket["examples"].get<int64_t>();
    CHECK(examples == 40);
    CHECK(!generate(out.path.string(), "4 5 6", 5).empty());
    // only the pair tasks go decoder-only
    c["task"] = {{"kind", "relative_order"}, {"decoder_only", true}};
    CHECK_THROWS_WITH_AS(Config::parse(c, "c.json"),
                         "c.json: /task/decoder_only: got true, expected false for a task that is not one of pairs "
                         "(copy, reverse, dedupe, sort, addition, pairs)",
                         std::invalid_argument);
}

TEST_CASE("an interrupted run resumed reaches the uninterrupted result") {
    TempDir whole("relgrad_test_train_whole"), parts("relgrad_test_train_parts");
    train(Config::parse(tiny_run(whole.path), "tiny"), TrainOptions{});
    TrainOptions first_half;
    first_half.stop_after = 5;  // between two checkpoints of checkpoint_every = 4: resumes from 5
    CHECK(train(Config::parse(tiny_run(parts.path), "tiny"), first_half)["stopped_at"] == 5);
    // stopped between save_checkpoint's two renames: only checkpoint.previous/ is left, whole
    fs::rename(parts.path / "checkpoint", parts.path / "checkpoint.previous");
    CHECK_THROWS_WITH_AS(
        train(Config::parse(tiny_run(parts.path), "tiny"), TrainOptions{}),
        (parts.path.string() + " already holds a run; pass --resume to continue it or choose another --out").c_str(),
        std::invalid_argument);
    TrainOptions resume;
    resume.resume = true;
    train(Config::parse(tiny_run(parts.path), "tiny"), resume);
    CHECK_FALSE(fs::exists(parts.path / "checkpoint.previous"));
    // the same weights and optimizer moments, byte for byte, and the same logged numbers
    auto bytes = [](const fs::path& file) {
        std::ifstream in(file, std::ios::binary);
        return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    };
    int64_t files = 0;
    for (const auto& entry : fs::recursive_directory_iterator(whole.path / "checkpoint")) {
        if (!entry.is_regular_file()) continue;
        const fs::path relative = fs::relative(entry.path(), whole.path);
        CHECK_MESSAGE(bytes(entry.path()) == bytes(parts.path / relative), relative.string());
        ++files;
    }
    CHECK(files > 10);
    CHECK(metrics_without_timing(whole.path) == metrics_without_timing(parts.path));
    std::ifstream sa(whole.path / "summary.json"), sb(parts.path / "summary.json");
    const nlohmann::json a = nlohmann::json::parse(sa), b = nlohmann::json::parse(sb);
    CHECK(a["final"] == b["final"]);
    CHECK_THROWS_WITH_AS(train(Config::parse(tiny_run(parts.path), "tiny"), resume),
                         ("--resume: the run in " + parts.path.string() + " is finished (it has summary.json)").c_str(),
                         std::invalid_argument);

    TempDir again("relgrad_test_train_again");
    TrainOptions early;
    early.stop_after = 8;
    train(Config::parse(tiny_run(again.path), "tiny"), early);
    nlohmann::json changed = tiny_run(again.path);
    changed["training"]["steps"] = 13;
    CHECK_THROWS_WITH_AS(
        train(Config::parse(changed, "tiny"), resume),
        ("--resume: /training/steps differs from the config " + again.path.string() + " was trained with").c_str(),
        std::invalid_argument);
    resume.stop_after = 4;
    CHECK_THROWS_WITH_AS(train(Config::parse(tiny_run(again.path), "tiny"), resume),
                         "--stop-after 4: the checkpoint is already at step 8", std::invalid_argument);
    // a run's config.json from before a key existed resumes with the key's default; another
    // thread count changes no number, so it may differ
    resume.stop_after = 10;
    {
        std::ifstream in(again.path / "config.json");
        nlohmann::json older = nlohmann::json::parse(in);
        older["model"].erase("rank");
        older["training"].erase("gradient_checkpointing");
        std::ofstream(again.path / "config.json") << older.dump(2);
    }
    nlohmann::json more_threads = tiny_run(again.path);
    more_threads["training"]["threads"] = 3;
    CHECK(train(Config::parse(more_threads, "tiny"), resume)["stopped_at"] == 10);
    nlohmann::json big_batch = tiny_run(dir_for_batch(again.path));
    big_batch["training"]["batch_size"] = 1000;
    CHECK_THROWS_WITH_AS(train(Config::parse(big_batch, "tiny"), TrainOptions{}),
                         "/training/batch_size 1000 exceeds the 400 training examples", std::invalid_argument);
}

TEST_CASE("interrupted is asked after every step but the last; true ends the run there, checkpoint written") {
    TempDir whole("relgrad_test_train_uninterrupted"), parts("relgrad_test_train_interrupted");
    const nlohmann::json uninterrupted = train(Config::parse(tiny_run(whole.path), "tiny"), TrainOptions{});
    int64_t asked = 0;
    TrainOptions interrupt;
    interrupt.interrupted = [&asked] { return ++asked == 7; };  // step 7: after the last checkpoint (4)
    CHECK(train(Config::parse(tiny_run(parts.path), "tiny"), interrupt)["stopped_at"] == 7);
    CHECK(asked == 7);
    CHECK_FALSE(fs::exists(parts.path / "summary.json"));
    TrainOptions resume;
    resume.resume = true;
    resume.interrupted = [&asked] { return ++asked > 100; };
    const nlohmann::json resumed = train(Config::parse(tiny_run(parts.path), "tiny"), resume);
    CHECK(asked == 7 + 4);  // after steps 8 to 11 of 12: resumed from 7, not from the checkpoint at 4
    CHECK(resumed["final"] == uninterrupted["final"]);
    CHECK(metrics_without_timing(whole.path) == metrics_without_timing(parts.path));
}

TEST_CASE("a corrupt or inconsistent checkpoint is refused, naming the file and what is wrong") {
    TempDir base("relgrad_test_train_corrupt");
    const fs::path stopped = base.path / "stopped";
    TrainOptions stop;
    stop.stop_after = 8;  // a checkpoint at step 8 of 12, metrics.jsonl up to step 8
    train(Config::parse(tiny_run(stopped), "tiny"), stop);
    TrainOptions resume;
    resume.resume = true;
    int copies = 0;
    auto write = [](const fs::path& file, const std::string& text) { std::ofstream(file) << text; };
    // state.json's fingerprints of the two halves and its seal brought up to date, as an edit that
    // updates them too would: what the checks behind them see (a state.json without them is left
    // alone)
    auto refresh_fingerprints = [&](const fs::path& checkpoint) {
        if (!fs::is_regular_file(checkpoint / "state.json")) return;
        std::ifstream in(checkpoint / "state.json");
        nlohmann::json state = nlohmann::json::parse(in, nullptr, false);
        if (!state.is_object() || !state.contains("files")) return;
        for (const char* half : {"model", "optimizer"}) state["files"][half] = directory_fingerprint(checkpoint / half);
        if (state.contains("seal")) state["seal"] = checkpoint_seal(state);
        write(checkpoint / "state.json", state.dump());
    };
    // the stopped run copied, changed by `corrupt` (its fingerprints refreshed unless told not to),
    // then resumed with `config` (tiny_run's by default): the error, or "resumed"
    auto resume_error = [&](const std::function<void(const fs::path&)>& corrupt, bool refresh = true,
                            const std::function<void(nlohmann::json&)>& config = {}) -> std::string {
        const fs::path run = base.path / ("copy" + std::to_string(copies++));
        fs::copy(stopped, run, fs::copy_options::recursive);
        corrupt(run);
        if (refresh) refresh_fingerprints(run / "checkpoint");
        nlohmann::json c = tiny_run(run);
        if (config) config(c);
        try {
            train(Config::parse(c, "tiny"), resume);
        } catch (const std::exception& e) {
            return e.what();
        }
        return "resumed";
    };
    // state.json as saved, changed by `change`
    auto edit_state = [&](const fs::path& run, const std::function<void(nlohmann::json&)>& change) {
        std::ifstream in(run / "checkpoint" / "state.json");
        nlohmann::json state = nlohmann::json::parse(in);
        change(state);
        write(run / "checkpoint" / "state.json", state.dump());
    };
    const fs::path checkpoint = base.path / "copyN" / "checkpoint";  // as named in the messages below
    auto named = [&](const fs::path& file) {                         // the file in the copy about to be made
        return (base.path / ("copy" + std::to_string(copies)) / fs::relative(file, base.path / "copyN")).string();
    };

    CHECK(resume_error([&](const fs::path& run) {
              edit_state(run, [](nlohmann::json& state) { state["step"] = 1000000000; });
          }) == named(checkpoint / "state.json") + ": step 1000000000, but " +
                    named(checkpoint / "optimizer" / "step.txt") + " counts 8 (a corrupt checkpoint)");
    CHECK(resume_error([&](const fs::path& run) {
              edit_state(run, [](nlohmann::json& state) { state["step"] = 13; });
              write(run / "checkpoint" / "optimizer" / "step.txt", "13\n");
          }) == named(checkpoint / "state.json") + ": step 13 is past the run's 12 steps");
    CHECK(resume_error([&](const fs::path& run) {
              write(run / "checkpoint" / "state.json", "{\"step\": 8, \"step\": 9}");
          }) == named(checkpoint / "state.json") + ": /step: the key is given twice");
    const std::string expected_state =
        ": expected {\"step\": a whole number, \"run\": the run's config, \"files\": {\"model\": a fingerprint, "
        "\"optimizer\": a fingerprint}, \"seal\": a fingerprint}, got ";
    CHECK(resume_error([&](const fs::path& run) {
              write(run / "checkpoint" / "state.json", "{\"step\": 8, \"loss\": 1}");
          }) == named(checkpoint / "state.json") + expected_state + "{\"loss\":1,\"step\":8}");
    const std::string without_run = named(checkpoint / "state.json") + expected_state + "{\"files\":";
    CHECK(resume_error([&](const fs::path& run) {  // a checkpoint that does not say which run it is of
              edit_state(run, [](nlohmann::json& state) { state.erase("run"); });
          })
              .rfind(without_run, 0) == 0);

    // the seal: an edit of state.json that keeps its shape and fingerprints is found, however small
    const std::string edited = named(checkpoint / "state.json") + ": edited since it was written (its seal ";
    CHECK(resume_error([&](const fs::path& run) { edit_state(run, [](nlohmann::json& state) { state["step"] = 7; }); },
                       false)
              .rfind(edited, 0) == 0);
    // a checkpoint of an earlier relgrad has no seal: it resumes (a warning says so)
    CHECK(
        resume_error([&](const fs::path& run) { edit_state(run, [](nlohmann::json& state) { state.erase("seal"); }); },
                     false) == "resumed");

    // the run it belongs to: the same config (seed, steps, dropout...), and its own two halves
    const fs::path other = base.path / "other_seed";
    nlohmann::json other_config = tiny_run(other);
    other_config["training"]["seed"] = 2;
    train(Config::parse(other_config, "tiny"), stop);
    auto another_run = [&] { return named(checkpoint / "state.json") + ": the checkpoint is of another run: "; };
    CHECK(resume_error([&](const fs::path& run) {
              fs::remove_all(run / "checkpoint");
              fs::copy(other / "checkpoint", run / "checkpoint", fs::copy_options::recursive);
          }) == another_run() +
                    "/training/seed is 2 there and 1 in this run's config (a run resumes only with the "
                    "config it was trained with)");
    CHECK(resume_error(  // config.json and the config both edited: the checkpoint knows its steps
              [&](const fs::path& run) {
                  nlohmann::json edited = tiny_run(run);
                  edited["training"]["steps"] = 16;
                  write(run / "config.json", Config::parse(edited, "tiny").resolved().dump());
              },
              true, [](nlohmann::json& c) { c["training"]["steps"] = 16; }) ==
          another_run() +
              "/training/steps is 12 there and 16 in this run's config (a run resumes only with the config "
              "it was trained with)");
    CHECK(resume_error(
              [&](const fs::path& run) {
                  fs::remove_all(run / "checkpoint" / "optimizer");
                  fs::copy(other / "checkpoint" / "optimizer", run / "checkpoint" / "optimizer");
              },
              false) == named(checkpoint / "optimizer") + ": not the optimizer state saved with " +
                            named(checkpoint / "state.json") +
                            " (its files differ: a half of another checkpoint, or edited)");
    CHECK(resume_error([&](const fs::path& run) { write(run / "checkpoint" / "model" / "notes.txt", ""); }, false) ==
          named(checkpoint / "model") + ": not the model state saved with " + named(checkpoint / "state.json") +
              " (its files differ: a half of another checkpoint, or edited)");
    CHECK(resume_error([&](const fs::path& run) {
              write(run / "checkpoint" / "optimizer" / "step.txt", "8 steps\n");
          }) == named(checkpoint / "optimizer" / "step.txt") + ": missing or not a step count");
    CHECK(resume_error([&](const fs::path& run) {
              fs::remove(run / "checkpoint" / "state.json");
              fs::create_directory(run / "checkpoint" / "state.json");
          }) == named(checkpoint / "state.json") + ": is a directory, expected a JSON file");

    // the optimizer's groups: present (a checkpoint from before groups had one), and these groups
    CHECK(resume_error([&](const fs::path& run) { fs::remove(run / "checkpoint" / "optimizer" / "groups.txt"); }) ==
          named(checkpoint / "optimizer") +
              "/groups.txt is missing: the state of an optimizer with one parameter group, this one has 4");
    CHECK(resume_error([&](const fs::path& run) {
              write(run / "checkpoint" / "optimizer" / "groups.txt", "1 0 30\n");
          }) == named(checkpoint / "optimizer" / "groups.txt") + ": 1 parameter groups, the optimizer has 4");

    // the tensors: floating, finite, no negative second moment
    const std::string weight = "encoder.layers.0.feed_forward.fc1.weight.npy";
    REQUIRE(fs::exists(stopped / "checkpoint" / "model" / weight));
    CHECK(resume_error([&](const fs::path& run) {
              save_npy(zeros({32, 16}, DType::int64), (run / "checkpoint" / "model" / weight).string());
          }) == named(checkpoint / "model" / weight) +
                    ": a corrupt state: int64 values, expected float16, float32 or float64");
    CHECK(resume_error([&](const fs::path& run) {
              save_npy(zeros({32, 16}, DType::boolean), (run / "checkpoint" / "optimizer" / "m.0.npy").string());
          }).find(": a corrupt state: bool values, expected float16, float32 or float64") != std::string::npos);
    CHECK(resume_error([&](const fs::path& run) {
              const fs::path file = run / "checkpoint" / "model" / weight;
              std::vector<double> values = load_npy(file.string()).to_vector();
              values[5] = std::nan("");
              save_npy(from_vector(values, {32, 16}), file.string());
          }) == named(checkpoint / "model" / weight) + ": a corrupt state: it holds nan");
    // m and v swapped: v, a running mean of g^2, is never negative; m of a trained weight is
    auto has_negative = [&](int64_t i) {
        const std::vector<double> m =
            load_npy((stopped / "checkpoint" / "optimizer" / ("m." + std::to_string(i) + ".npy")).string()).to_vector();
        return std::any_of(m.begin(), m.end(), [](double x) { return x < 0; });
    };
    int64_t moment = 0;
    while (!has_negative(moment)) ++moment;
    const std::string m_file = "m." + std::to_string(moment) + ".npy", v_file = "v." + std::to_string(moment) + ".npy";
    CHECK(resume_error([&](const fs::path& run) {
              const fs::path optimizer = run / "checkpoint" / "optimizer";
              fs::rename(optimizer / m_file, optimizer / "swap");
              fs::rename(optimizer / v_file, optimizer / m_file);
              fs::rename(optimizer / "swap", optimizer / v_file);
          }) == named(checkpoint / "optimizer" / v_file) + ": a second moment is negative (a corrupt checkpoint)");

    // metrics.jsonl: every line up to the checkpoint's step, in order; a directory is no file
    const fs::path metrics = base.path / "copyN" / "metrics.jsonl";
    CHECK(resume_error([&](const fs::path& run) {
              fs::remove(run / "metrics.jsonl");
              fs::create_directory(run / "metrics.jsonl");
          }) == named(metrics) + ": is a directory, expected the run's metrics (metrics.jsonl)");
    const std::vector<nlohmann::json> lines = read_lines(stopped / "metrics.jsonl");
    REQUIRE(lines.size() == 1 + 8 + 1);  // the evaluations at steps 0 and 6, a log line per step
    auto with_lines = [&](const std::vector<nlohmann::json>& kept) {
        return [kept](const fs::path& run) {
            std::ofstream out(run / "metrics.jsonl");
            for (const auto& line : kept) out << line.dump() << "\n";
        };
    };
    std::vector<nlohmann::json> missing = lines;
    missing.erase(missing.begin() + 3);
    CHECK(resume_error(with_lines(missing)) ==
          named(metrics) +
              ":line 9: 9 lines up to step 8, expected 10 (the metrics do not belong to the checkpoint "
              "at step 8)");
    std::vector<nlohmann::json> swapped = lines;
    std::swap(swapped[2], swapped[3]);
    CHECK(resume_error(with_lines(swapped)) ==
          named(metrics) + ":line 4: step 2 out of order (the metrics do not belong to the checkpoint at step 8)");
    // lines after the checkpoint's step, and a last line cut short, are the run's going on before
    // it stopped: dropped, then written again by the resumed run
    std::vector<nlohmann::json> ahead = lines;
    ahead.push_back({{"step", 9}, {"loss", 1.0}});
    CHECK(resume_error([&](const fs::path& run) {
              with_lines(ahead)(run);
              std::ofstream(run / "metrics.jsonl", std::ios::app) << "{\"step\": 10, \"lo";
          }) == "resumed");
    TempDir whole("relgrad_test_train_corrupt_whole");
    train(Config::parse(tiny_run(whole.path), "tiny"), TrainOptions{});
    CHECK(metrics_without_timing(whole.path) ==
          metrics_without_timing(base.path / ("copy" + std::to_string(copies - 1))));
}

TEST_CASE("a long evaluation reports every batch it has done") {
    TempDir dir("relgrad_test_train_progress");
    const Config config = Config::parse(tiny_run(dir.path), "tiny");  // 64 test examples
    Generator gen(config.training.seed);
    std::optional<Tokenizer> no_tokenizer;
    std::unique_ptr<Task> task = make_task(config, Init{gen, DType::float32}, no_tokenizer);
    std::vector<std::pair<int64_t, int64_t>> reported;
    task->on_evaluation_batch = [&](int64_t done, int64_t total) { reported.emplace_back(done, total); };
    task->evaluate(24, LengthBuckets({8, 16}));  // batches of 24, 24 and 16
    CHECK(reported == std::vector<std::pair<int64_t, int64_t>>{{1, 3}, {2, 3}, {3, 3}});
}

TEST_CASE("a diverging run stops with the step it diverged at") {
    TempDir out("relgrad_test_train_nan");
    nlohmann::json c = tiny_run(out.path);
    c["training"] = {{"steps", 60},       {"batch_size", 8},       {"learning_rate", 10}, {"weight_decay", 10},
                     {"warmup_steps", 0}, {"schedule", "constant"}};  // every step multiplies the weights by 1 - 100
    std::string message;
    try {
        train(Config::parse(c, "nan"), TrainOptions{});
    } catch (const TrainingDiverged& e) {
        message = e.what();
    }
    CHECK(message.find("training diverged: the loss is") == 0);
    CHECK(message.find(" at step ") != std::string::npos);
}

TEST_CASE(
    "file tasks: texts are cut at data.max_length as they are read, the vocabulary counts the whole training texts") {
    using Ids = std::vector<int64_t>;
    TempDir dir("relgrad_test_train_cut");
    fs::create_directories(dir.path);
    constexpr int examples = 12;
    {
        // example k: two common words, then "onlyK" past max_length = 2 words
        std::ofstream tsv(dir.path / "reviews.tsv");
        for (int k = 0; k < examples; ++k) tsv << (k % 2 ? "pos\tgut gut only" : "neg\tschlecht gut only") << k << "\n";
        std::ofstream(dir.path / "test.tsv") << "pos\tgut unseen\n";
    }
    const auto task_of = [&](const nlohmann::json& data, std::optional<Tokenizer>& tokenizer) {
        nlohmann::json c = tiny_run(dir.path / "run");
        c["task"] = {{"kind", "classification"}};
        c["data"] = data;
        c["training"]["seed"] = 5;
        const Config config = Config::parse(c, "cut");
        Generator gen(config.training.seed);
        return make_task(config, Init{gen}, tokenizer);
    };
    const std::string train_file = (dir.path / "reviews.tsv").string();
    // a held-out part: a training text's words past the cut are in the vocabulary, a held-out one's not
    std::optional<Tokenizer> tokenizer;
    nlohmann::json data = {{"train", train_file}, {"held_out", 0.25}, {"max_length", 2}, {"tokenizer", "word"}};
    const std::unique_ptr<Task> task = task_of(data, tokenizer);
    const std::vector<bool> training = training_mask(examples, 0.25, 5);
    REQUIRE(task->train_size() == 9);
    for (int64_t i = 0; i < task->train_size(); ++i) CHECK(task->train_length(i) == 2);
    for (int k = 0; k < examples; ++k) {
        CAPTURE(k);
        CHECK((tokenizer->encode("only" + std::to_string(k)) != Ids{Tokenizer::unk}) == training[k]);
    }
    CHECK(std::count(training.begin(), training.end(), false) == 3);  // so that both sides were seen
    // a test file: not counted
    std::optional<Tokenizer> with_test;
    data.erase("held_out");
    data["test"] = (dir.path / "test.tsv").string();
    task_of(data, with_test);
    CHECK(with_test->encode("only0 unseen") == Ids{with_test->encode("only0")[0], Tokenizer::unk});
    CHECK(with_test->encode("only0")[0] != Tokenizer::unk);
}

TEST_CASE("file tasks: classification, sequence pairs and language modelling train from the user's files") {
    TempDir dir("relgrad_test_train_files");
    fs::create_directories(dir.path);
    {
        std::ofstream tsv(dir.path / "reviews.tsv");
        for (int i = 0; i < 60; ++i) tsv << (i % 2 ? "pos\tgut und schön\n" : "neg\tschlecht, gar nicht gut\n");
        std::ofstream pairs(dir.path / "pairs.jsonl");
        for (int i = 0; i < 40; ++i)
            pairs << R"({"source": "abc d", "target": "d cba"})"
                  << "\n";
        std::ofstream text(dir.path / "text.txt");
        for (int i = 0; i < 80; ++i) text << "the cat sat on the mat. ";
        std::ofstream other(dir.path / "other.tsv");
        other << "maybe\tgut\n";
    }
    auto run = [&](const std::string& kind, const std::string& file, const std::string& name) {
        nlohmann::json c = tiny_run(dir.path / name);
        c["task"] = {{"kind", kind}};
        c["data"] = {{"train", (dir.path / file).string()}, {"held_out", 0.25}, {"max_length", 24}};
        c["training"] = {{"steps", 6}, {"batch_size", 8}, {"log_every", 3}};
        c["evaluation"] = {{"every", 6}, {"length_buckets", {8, 16}}};
        return train(Config::parse(c, kind), TrainOptions{});
    };
    const nlohmann::json classification = run("classification", "reviews.tsv", "cls");
    CHECK(classification["metric"] == "accuracy");
    CHECK(classification["train_examples"] == 45);  // 60 reviews, a quarter held out
    // two texts with few characters in common: told apart after a step or two
    CHECK(classification["final"]["accuracy"] == 1.0);
    // the 15 held out by length in characters: "gut und schön" (13) and "schlecht, gar nicht gut" (23)
    const nlohmann::json& by_length = classification["final"]["by_length"];
    CHECK(by_length.size() == 2);
    CHECK(by_length["9-16"]["examples"] > 0);
    CHECK(by_length[">16"]["examples"] > 0);
    CHECK(by_length["9-16"]["examples"].get<int64_t>() + by_length[">16"]["examples"].get<int64_t>() == 15);
    CHECK(fs::exists(dir.path / "cls" / "tokenizer.json"));
    const nlohmann::json pairs = run("pairs", "pairs.jsonl", "pairs");
    CHECK(pairs["metric"] == "bleu");
    CHECK(pairs["train_examples"] == 30);  // 40 pairs, a quarter held out
    // the 10 held out, all of one source length: the bucket's scores are the whole test set's
    const nlohmann::json& pairs_bucket = pairs["final"]["by_length"]["1-8"];
    CHECK(pairs_bucket["examples"] == 10);
    for (const char* key : {"accuracy", "token_accuracy", "bleu"}) CHECK(pairs_bucket[key] == pairs["final"][key]);
    {
        // length generalization: train on the short pairs only, test on every length
        std::ofstream mixed(dir.path / "mixed.tsv");
        for (int i = 0; i < 40; ++i) mixed << (i % 4 ? "a b\tb a\n" : "a b c d e\te d c b a\n");
    }
    nlohmann::json short_only = tiny_run(dir.path / "short");
    short_only["task"] = {{"kind", "pairs"}};
    short_only["data"] = {{"train", (dir.path / "mixed.tsv").string()},
                          {"test", (dir.path / "mixed.tsv").string()},
                          {"tokenizer", "word"},
                          {"lowercase", true},
                          {"split_punctuation", true},
                          {"train_max_tokens", 3}};
    short_only["training"] = {{"steps", 2}, {"batch_size", 8}};
    short_only["evaluation"] = {{"every", 2}, {"length_buckets", {3, 8}}};
    const nlohmann::json short_summary = train(Config::parse(short_only, "short"), TrainOptions{});
    CHECK(short_summary["train_examples"] == 30);                         // the 10 long pairs left out
    CHECK(short_summary["final"]["by_length"]["4-8"]["examples"] == 10);  // but tested
    {
        std::ifstream saved(dir.path / "short" / "tokenizer.json");  // the text options reach the tokenizer
        const nlohmann::json tokenizer = nlohmann::json::parse(saved);
        CHECK(tokenizer["lowercase"] == true);
        CHECK(tokenizer["split_punctuation"] == true);
    }
    // short pairs only, in training and in the test: data.test_max_tokens
    short_only["data"]["test_max_tokens"] = 3;
    short_only["output"]["dir"] = (dir.path / "short-test").string();
    const nlohmann::json short_test = train(Config::parse(short_only, "short"), TrainOptions{});
    CHECK(short_test["final"]["by_length"]["1-3"]["examples"] == 30);
    CHECK_FALSE(short_test["final"]["by_length"].contains("4-8"));  // the 10 long pairs left out
    short_only["data"]["test_max_tokens"] = 1;
    short_only["output"]["dir"] = (dir.path / "no-test").string();
    CHECK_THROWS_WITH_AS(train(Config::parse(short_only, "short"), TrainOptions{}),
                         doctest::Contains("data.test_max_tokens = 1 leaves no example of"), std::invalid_argument);
    short_only["data"]["train_max_tokens"] = 1;
    short_only["output"]["dir"] = (dir.path / "none").string();
    CHECK_THROWS_WITH_AS(train(Config::parse(short_only, "short"), TrainOptions{}),
                         doctest::Contains("data.train_max_tokens = 1 leaves no example of"), std::invalid_argument);
    const nlohmann::json lm = run("language_model", "text.txt", "lm");
    CHECK(lm["metric"] == "perplexity");
    CHECK(lm["final"]["perplexity"].get<double>() > 1);
    CHECK(lm["final"]["bits_per_char"].get<double>() ==
          doctest::Approx(std::log2(lm["final"]["perplexity"].get<double>()))
              .epsilon(1e-9));  // char tokens: bpc = log2 ppl
    // the last quarter of 1,920 characters, 480, in chunks of 25 that overlap by one: 19 chunks
    // predict 24 characters, the last 23; positions 1-8 and 9-16 are 20 x 8 of them
    CHECK(lm["final"]["tokens"] == 479);
    CHECK(lm["final"]["by_length"]["1-8"]["tokens"] == 160);
    CHECK(lm["final"]["by_length"]["9-16"]["tokens"] == 160);
    CHECK(lm["final"]["by_length"][">16"]["tokens"] == 159);
    for (const auto& bucket : lm["final"]["by_length"]) {  // per bucket too
        CHECK(bucket["bits_per_char"].get<double>() ==
              doctest::Approx(std::log2(bucket["perplexity"].get<double>())).epsilon(1e-9));
    }

    nlohmann::json c = tiny_run(dir.path / "bad");
    c["task"] = {{"kind", "classification"}};
    c["data"] = {{"train", (dir.path / "reviews.tsv").string()}, {"test", (dir.path / "other.tsv").string()}};
    CHECK_THROWS_WITH_AS(
        train(Config::parse(c, "c"), TrainOptions{}),
        ((dir.path / "other.tsv").string() + ": label 'maybe' does not occur in the training data").c_str(),
        std::invalid_argument);
    c["data"] = nlohmann::json::object();
    CHECK_THROWS_WITH_AS(Config::parse(c, "c"),
                         "c: /data/train: got nothing, expected the training file of a classification task",
                         std::invalid_argument);
}

TEST_CASE("the memory estimate counts every parameter, holds the first step within 2x, and allocates nothing big") {
    TempDir dir("relgrad_test_train_memory");
    // exact: the model built without memory has the real one's parameters, for every model kind
    // and the options that add parameters
    const std::vector<std::vector<std::pair<std::string, nlohmann::json>>> variants = {
        {},
        {{"/model/position", "none"}},
        {{"/model/position", "learned"}},
        {{"/model/position", "gated"}, {"/model/token_gate", true}},
        {{"/model/share_across_heads", false}, {"/model/rank", 3}, {"/model/k_left", 2}},
        {{"/model/relative_values", false}},
        {{"/model/position", "rope"}},
        {{"/model/position", "t5"}, {"/model/t5_share_layers", true}},
        {{"/model/position", "alibi"}, {"/model/pooling", "first"}},
        {{"/task/kind", "symbol_at"}, {"/task/vocab", 12}, {"/task/symbol_position", 1}},
        {{"/task/kind", "copy"}, {"/model/layers", 2}},
        {{"/task/kind", "copy"}, {"/model/position", "t5"}},
        {{"/task/kind", "addition"}, {"/task/vocab", 15}, {"/task/decoder_only", true}, {"/model/position", "learned"}},
    };
    for (const auto& variant : variants) {
        nlohmann::json c = tiny_run(dir.path);
        for (const auto& [pointer, value] : variant) c[nlohmann::json::json_pointer(pointer)] = value;
        CAPTURE(c.dump());
        const Config config = Config::parse(c, "c.json");
        Generator gen(1);
        std::optional<Tokenizer> no_tokenizer;
        const std::unique_ptr<Task> task = make_task(config, Init{gen}, no_tokenizer);
        int64_t count = 0;
        for (const Tensor& p : task->model().parameters()) count += p.numel();
        CHECK(task->memory_estimate.parameters == count);
        CHECK(task->memory_estimate.gradients == 4.0 * static_cast<double>(count));
        CHECK(task->memory_estimate.moments == 8.0 * static_cast<double>(count));
    }

    // the whole first step, against what it held (peak_live_mib): a classifier, an encoder-decoder,
    // fused attention, gradient checkpointing and bfloat16
    const std::vector<std::vector<std::pair<std::string, nlohmann::json>>> runs = {
        {{"/model/dim", 64}, {"/model/ff_dim", 256}, {"/task/train_lengths", {32, 64}}},
        {{"/model/dim", 64}, {"/model/ff_dim", 256}, {"/task/kind", "copy"}, {"/task/train_lengths", {16, 32}}},
        {{"/model/dim", 64}, {"/model/ff_dim", 256}, {"/task/train_lengths", {32, 64}}, {"/model/attention", "fused"}},
        {{"/model/dim", 64}, {"/model/layers", 3}, {"/training/gradient_checkpointing", true}},
        {{"/model/dim", 64}, {"/training/precision", "bfloat16"}, {"/task/train_lengths", {32, 64}}},
    };
    int index = 0;
    for (const auto& variant : runs) {
        nlohmann::json c = tiny_run(dir.path / ("run" + std::to_string(index++)));
        c["training"]["steps"] = 1;
        c["training"]["batch_size"] = 32;
        for (const auto& [pointer, value] : variant) c[nlohmann::json::json_pointer(pointer)] = value;
        CAPTURE(c.dump());
        const Config config = Config::parse(c, "c.json");
        Generator gen(1);
        std::optional<Tokenizer> no_tokenizer;
        const double estimate = make_task(config, Init{gen}, no_tokenizer)->memory_estimate.total() / 1048576.0;
        reset_peak_memory();  // the peak of this run alone
        const double held = train(config, {})["peak_live_mib"].get<double>();
        CAPTURE(estimate);
        CAPTURE(held);
        CHECK(estimate >= held / 2);
        CHECK(estimate <= held * 2);
    }

    // the estimate of a model of 800 GiB is made with a few MiB: its weights have no memory
    nlohmann::json huge = tiny_run(dir.path / "huge");
    huge["model"] = {{"layers", 64}, {"dim", 8192}, {"heads", 8}, {"ff_dim", 32768}};
    reset_peak_memory();
    const double live_before = static_cast<double>(memory_stats().live_bytes);
    const MemoryEstimate estimate = estimate_memory(Config::parse(huge, "c.json"), 16, 2);
    CHECK(estimate.parameters > 64 * 12 * int64_t{8192} * 8192);
    CHECK(static_cast<double>(memory_stats().peak_live_bytes) - live_before < 64.0 * 1048576);
    CHECK_THROWS_WITH_AS(train(Config::parse(huge, "c.json"), {}),
                         doctest::Contains("the run does not fit in memory: its first step needs about"),
                         std::invalid_argument);
    CHECK_FALSE(fs::exists(dir.path / "huge"));
}
