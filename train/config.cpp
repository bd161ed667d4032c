#include "train/config.hpp"

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "train/json_reader.hpp"

namespace relgrad {

const char* task_kind_name(TaskKind kind) {
    switch (kind) {
        case TaskKind::copy: return "copy";
        case TaskKind::reverse: return "reverse";
        case TaskKind::relative_order: return "relative_order";
        case TaskKind::classification: return "classification";
        case TaskKind::pairs: return "pairs";
        case TaskKind::language_model: return "language_model";
    }
    return "";
}

static const TaskKind kTaskKinds[] = {TaskKind::copy,           TaskKind::reverse, TaskKind::relative_order,
                                      TaskKind::classification, TaskKind::pairs,   TaskKind::language_model};

static TaskKind task_kind_from_name(const std::string& kind) {
    for (TaskKind k : kTaskKinds) {
        if (kind == task_kind_name(k)) return k;
    }
    throw std::invalid_argument("unknown task kind '" + kind + "'");
}

TaskKind parse_task_kind(const nlohmann::json& document) {
    return task_kind_from_name(document.value("task", nlohmann::json::object()).value("kind", "relative_order"));
}

bool reads_files(TaskKind kind) {
    return kind == TaskKind::classification || kind == TaskKind::pairs || kind == TaskKind::language_model;
}

static const char* schedule_name(Schedule s) {
    return s == Schedule::constant ? "constant" : s == Schedule::linear ? "linear" : "cosine";
}

Config Config::parse(const nlohmann::json& document, const std::string& file) {
    Config c;
    JsonReader root(document, "", file);

    JsonReader model = root.section("model");
    TransformerOptions& t = c.model.transformer;
    t.layers = model.integer("layers", 1, 64, 2);
    t.dim = model.integer("dim", 1, 8192, 64);
    t.heads = model.integer("heads", 1, 256, 4);
    if (t.dim % t.heads != 0) model.fail("heads", "a divisor of /model/dim = " + std::to_string(t.dim));
    t.ff_dim = model.integer("ff_dim", 1, 65536, 4 * t.dim);
    t.dropout = model.number("dropout", 0, 0.99, 0.1);
    t.position =
        parse_position_mode(model.text("position", "relative", {"none", "sinusoidal", "learned", "relative", "gated"}));
    const int64_t k = model.integer("k", 0, 4096, 8);
    t.relative.k_left = model.integer("k_left", 0, 4096, k);
    t.relative.k_right = model.integer("k_right", 0, 4096, k);
    t.relative.share_across_heads = model.flag("share_across_heads", true);
    t.relative.rank = model.integer("rank", 0, 8192, 0);
    t.impl = parse_attention_impl(model.text("attention", "bucketed", {"reference", "bucketed", "fused"}));
    t.token_gate = model.flag("token_gate", false);
    c.model.pooling = model.text("pooling", "mean", {"mean", "first"}) == "mean" ? Pooling::mean : Pooling::first;
    model.finish();

    JsonReader task = root.section("task");
    std::vector<std::string> kind_names;
    for (TaskKind k : kTaskKinds) kind_names.push_back(task_kind_name(k));
    const std::string kind = task.text("kind", "relative_order", kind_names);
    c.task.kind = task_kind_from_name(kind);
    c.task.vocab = task.integer("vocab", 7, 1 << 20, 16);
    c.task.train_lengths = task.integers("train_lengths", 1, 1 << 20, 2, c.task.train_lengths);
    c.task.test_lengths = task.integers("test_lengths", 1, 1 << 20, 2, c.task.test_lengths);
    c.task.distance = task.integer("distance", 1, 1 << 20, 3);
    const std::pair<const char*, const std::vector<int64_t>*> ranges[] = {{"train_lengths", &c.task.train_lengths},
                                                                          {"test_lengths", &c.task.test_lengths}};
    for (const auto& [key, range] : ranges) {
        if ((*range)[0] > (*range)[1]) task.fail(key, "[min, max] with min <= max");
    }
    for (const auto& [key, range] : ranges) {
        // relative_order: shorter sequences could only be negatives, their length giving the label away
        if (c.task.kind == TaskKind::relative_order && (*range)[0] <= c.task.distance) {
            task.fail(key, "lengths above /task/distance = " + std::to_string(c.task.distance));
        }
    }
    c.task.train_examples = task.integer("train_examples", 1, 1 << 30, 4000);
    c.task.test_examples = task.integer("test_examples", 1, 1 << 30, 500);
    task.finish();

    JsonReader data = root.section("data");
    c.data.train = data.text("train", "");
    if (reads_files(c.task.kind) && c.data.train.empty()) {
        data.fail("train", "the training file of a " + kind + " task");
    }
    c.data.test = data.text("test", "");
    c.data.held_out = data.number("held_out", 0, 0.9, 0.1, true);
    c.data.tokenizer = data.text("tokenizer", "char", {"char", "word"});
    c.data.min_frequency = data.integer("min_frequency", 1, 1 << 30, 1);
    c.data.lowercase = data.flag("lowercase", false);
    c.data.split_punctuation = data.flag("split_punctuation", false);
    if (c.data.split_punctuation && c.data.tokenizer != "word") {
        data.fail("split_punctuation", "false with the char tokenizer (set data.tokenizer = \"word\")");
    }
    c.data.max_length = data.integer("max_length", 1, 1 << 20, 128);
    c.data.train_max_tokens = data.integer("train_max_tokens", 0, 1 << 20, 0);
    data.finish();

    // learned positions need a vector for the longest input (+2: bos/eos)
    t.max_len = reads_files(c.task.kind) ? c.data.max_length + 2
                                         : std::max(c.task.train_lengths[1], c.task.test_lengths[1]) + 2;

    JsonReader training = root.section("training");
    TrainingConfig& tr = c.training;
    if (training.has("steps") && training.has("epochs")) {
        training.fail("epochs", "either /training/steps or /training/epochs, not both");
    }
    tr.steps = training.integer("steps", 1, int64_t{1} << 40, 400);
    tr.epochs = training.has("epochs") ? training.integer("epochs", 1, 1 << 20) : 0;
    tr.batch_size = training.integer("batch_size", 1, 1 << 20, 32);
    tr.learning_rate = training.number("learning_rate", 0, 10, 1e-3, true);
    if (training.has("warmup_steps")) tr.warmup_steps = training.integer("warmup_steps", 0, int64_t{1} << 40);
    if (tr.epochs == 0) tr.warmup_steps = tr.warmup(tr.steps);  // resolved now: steps are known
    tr.schedule = parse_schedule(training.text("schedule", "cosine", {"constant", "linear", "cosine"}));
    tr.adamw.beta1 = training.number("beta1", 0, 0.999999, 0.9);
    tr.adamw.beta2 = training.number("beta2", 0, 0.999999, 0.98);
    tr.adamw.eps = training.number("eps", 0, 1, 1e-8, true);
    tr.adamw.weight_decay = training.number("weight_decay", 0, 10, 0.01);
    tr.clip_norm = training.number("clip_norm", 0, 1e9, 1.0, true);
    tr.seed = static_cast<uint64_t>(training.integer("seed", 0, int64_t{1} << 53, 1));
    tr.threads = training.integer("threads", 1, 1024, 2);
    t.checkpoint = training.flag("gradient_checkpointing", false);
    tr.length_bucketing = training.flag("length_bucketing", false);
    tr.log_every = training.integer("log_every", 1, int64_t{1} << 40, 20);
    training.finish();

    JsonReader evaluation = root.section("evaluation");
    c.evaluation.every = evaluation.integer("every", 1, int64_t{1} << 40, 100);
    c.evaluation.batch_size = evaluation.integer("batch_size", 1, 1 << 20, 64);
    c.evaluation.length_buckets = evaluation.integers("length_buckets", 1, 1 << 20, 0, c.evaluation.length_buckets);
    for (std::size_t i = 1; i < c.evaluation.length_buckets.size(); ++i) {
        if (c.evaluation.length_buckets[i] <= c.evaluation.length_buckets[i - 1]) {
            evaluation.fail("length_buckets", "increasing bounds");
        }
    }
    evaluation.finish();

    JsonReader output = root.section("output");
    c.output.dir = output.text("dir", "runs/quickstart");
    if (c.output.dir.empty()) output.fail("dir", "a directory name");
    c.output.checkpoint_every = output.integer("checkpoint_every", 1, int64_t{1} << 40, 100);
    output.finish();
    root.finish();
    return c;
}

nlohmann::json Config::resolved() const {
    const TransformerOptions& t = model.transformer;
    nlohmann::json document = {
        {"model",
         {{"layers", t.layers},
          {"dim", t.dim},
          {"heads", t.heads},
          {"ff_dim", t.ff_dim},
          {"dropout", t.dropout},
          {"position", position_mode_name(t.position)},
          {"k_left", t.relative.k_left},
          {"k_right", t.relative.k_right},
          {"share_across_heads", t.relative.share_across_heads},
          {"rank", t.relative.rank},
          {"attention", attention_impl_name(t.impl)},
          {"token_gate", t.token_gate},
          {"pooling", model.pooling == Pooling::mean ? "mean" : "first"}}},
        {"task",
         {{"kind", task_kind_name(task.kind)},
          {"vocab", task.vocab},
          {"train_lengths", task.train_lengths},
          {"test_lengths", task.test_lengths},
          {"distance", task.distance},
          {"train_examples", task.train_examples},
          {"test_examples", task.test_examples}}},
        {"data",
         {{"train", data.train},
          {"test", data.test},
          {"held_out", data.held_out},
          {"tokenizer", data.tokenizer},
          {"min_frequency", data.min_frequency},
          {"lowercase", data.lowercase},
          {"split_punctuation", data.split_punctuation},
          {"train_max_tokens", data.train_max_tokens},
          {"max_length", data.max_length}}},
        {"training",
         {{"steps", training.steps},
          {"batch_size", training.batch_size},
          {"learning_rate", training.learning_rate},
          {"warmup_steps", training.warmup_steps.value_or(0)},
          {"schedule", schedule_name(training.schedule)},
          {"beta1", training.adamw.beta1},
          {"beta2", training.adamw.beta2},
          {"eps", training.adamw.eps},
          {"weight_decay", training.adamw.weight_decay},
          {"clip_norm", training.clip_norm},
          {"seed", training.seed},
          {"threads", training.threads},
          {"gradient_checkpointing", model.transformer.checkpoint},
          {"length_bucketing", training.length_bucketing},
          {"log_every", training.log_every}}},
        {"evaluation",
         {{"every", evaluation.every},
          {"batch_size", evaluation.batch_size},
          {"length_buckets", evaluation.length_buckets}}},
        {"output", {{"dir", output.dir}, {"checkpoint_every", output.checkpoint_every}}},
    };
    // a run by epochs gets its step count (and a default warmup) from its data: resolved by train()
    if (training.epochs > 0) {
        document["training"].erase("steps");
        document["training"]["epochs"] = training.epochs;
    }
    if (!training.warmup_steps) document["training"].erase("warmup_steps");
    return document;
}

nlohmann::json quickstart_config() {
    return {
        {"model",
         {{"layers", 2},
          {"dim", 64},
          {"heads", 4},
          {"ff_dim", 128},
          {"dropout", 0.0},
          {"position", "relative"},
          {"k", 8}}},
        {"task",
         {{"kind", "relative_order"},
          {"vocab", 16},
          {"train_lengths", {8, 24}},
          {"test_lengths", {8, 48}},
          {"distance", 3},
          {"train_examples", 4000},
          {"test_examples", 500}}},
        {"training", {{"steps", 400}, {"batch_size", 32}, {"learning_rate", 2e-3}, {"warmup_steps", 40}, {"seed", 1}}},
        {"evaluation", {{"every", 100}, {"length_buckets", {8, 16, 24, 32, 48}}}},
        {"output", {{"dir", "runs/quickstart"}}},
    };
}

nlohmann::json read_config_file(const std::string& path) {
    if (std::filesystem::is_directory(path)) throw std::invalid_argument(path + ": a directory, not a config file");
    std::ifstream in(path);
    if (!in) throw std::invalid_argument(path + ": cannot open the config");
    try {
        return nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {  // syntax errors, and numbers beyond double
        throw std::invalid_argument(path + ": not valid JSON (" + e.what() + ")");
    }
}

void apply_override(nlohmann::json& document, const std::string& assignment) {
    const std::size_t equals = assignment.find('=');
    if (equals == std::string::npos || equals == 0) {
        throw std::invalid_argument("--set " + assignment + ": expected path.to.key=value");
    }
    const std::string path = assignment.substr(0, equals), text = assignment.substr(equals + 1);
    nlohmann::json value;
    try {
        value = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception&) {
        value = text;  // not JSON: a plain string such as reverse or runs/x
    }
    nlohmann::json* node = &document;
    std::size_t start = 0;
    while (true) {
        const std::size_t dot = path.find('.', start);
        const std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
        if (key.empty()) throw std::invalid_argument("--set " + assignment + ": empty key in '" + path + "'");
        if (dot == std::string::npos) {
            if (value.is_null()) {
                node->erase(key);  // back to the default
            } else {
                (*node)[key] = value;
            }
            return;
        }
        if (!node->contains(key)) (*node)[key] = nlohmann::json::object();
        node = &(*node)[key];
        if (!node->is_object()) throw std::invalid_argument("--set " + assignment + ": '" + key + "' is not a section");
        start = dot + 1;
    }
}

int64_t TrainingConfig::total_steps(int64_t train_examples) const {
    if (epochs == 0) return steps;
    return (epochs * train_examples + batch_size - 1) / batch_size;
}

}  // namespace relgrad
