#include "train/config.hpp"

#include <fnmatch.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <tuple>

#include "engine/errors.hpp"
#include "engine/enum_names.hpp"
#include "engine/system.hpp"
#include "train/datasets.hpp"
#include "train/quickstart.hpp"
#include "train/json_reader.hpp"
#include "train/option_fields.hpp"

namespace relgrad {

namespace {

const EnumName<TaskKind> task_kinds[] = {
    {TaskKind::copy, "copy"},           {TaskKind::reverse, "reverse"},
    {TaskKind::dedupe, "dedupe"},       {TaskKind::sort, "sort"},
    {TaskKind::addition, "addition"},   {TaskKind::relative_order, "relative_order"},
    {TaskKind::symbol_at, "symbol_at"}, {TaskKind::classification, "classification"},
    {TaskKind::pairs, "pairs"},         {TaskKind::language_model, "language_model"}};

TaskKind task_kind_from_name(const std::string& kind) {
    const auto found = value_named(task_kinds, kind);
    RELGRAD_CHECK(found, "unknown task kind '", kind, "'");
    return *found;
}

// parse(): each field read from its section of the document and checked; the first bad value is
// the one reported. The options of layers/ (integer, number, flag, named, shorthand, check) are
// JsonFields'; the kinds below are the config's own.
class FieldReader : public JsonFields {
public:
    FieldReader(const nlohmann::json& document, const std::string& file)
        : JsonFields(root_), root_(document, "", file) {}

    void section(const char* name) {
        if (section_) section_->finish();
        section_.emplace(root_.section(name));
        reader_ = &*section_;
    }
    void finish() {
        section_->finish();
        root_.finish();
    }

    // a field that may be left out: read only when present (epochs: 0, warmup_steps: nothing when absent)
    void optional_integer(const char* key, int64_t& value, int64_t low, int64_t high) {
        if (section_->has(key)) value = section_->integer(key, low, high);
    }
    void optional_integer(const char* key, std::optional<int64_t>& value, int64_t low, int64_t high) {
        if (section_->has(key)) value = section_->integer(key, low, high);
    }
    void text(const char* key, std::string& value, const std::string& fallback) {
        value = section_->text(key, fallback);
    }
    // count: exactly that many values, 0 any number
    void integers(const char* key, std::vector<int64_t>& value, int64_t low, int64_t high, std::size_t count,
                  const std::vector<int64_t>& fallback) {
        value = section_->integers(key, low, high, count, fallback);
    }
    void groups(const char* key, std::vector<ParameterGroupConfig>& value,
                const std::vector<ParameterGroupConfig>& fallback) {
        value = fallback;
        const auto readers = section_->objects(key);
        if (!readers) return;
        value.clear();
        for (JsonReader group : *readers) {
            ParameterGroupConfig g;
            g.match = group.text("match");
            if (g.match.empty()) group.fail("match", "a name pattern (a glob such as \"*bias\")");
            if (group.has("lr") && group.has("lr_scale")) group.fail("lr_scale", "either lr or lr_scale, not both");
            if (group.has("lr")) g.lr = group.number("lr", 0, 10, std::nullopt, true);
            if (group.has("lr_scale")) g.lr_scale = group.number("lr_scale", 0, 1e6, std::nullopt, true);
            if (group.has("weight_decay")) g.weight_decay = group.number("weight_decay", 0, 10);
            group.finish();
            value.push_back(std::move(g));
        }
    }
    void not_both(const char* key, const char* other) {
        if (section_->has(key) && section_->has(other)) {
            section_->fail(other,
                           "either " + section_->path_of(key) + " or " + section_->path_of(other) + ", not both");
        }
    }

private:
    JsonReader root_;
    std::optional<JsonReader> section_;
};

// resolved(): each field written back, checks skipped.
class FieldWriter : public JsonFieldsWriter {
public:
    FieldWriter() : JsonFieldsWriter(document) {}

    void section(const char* name) { object_ = &document[name]; }

    void optional_integer(const char* key, int64_t value, int64_t, int64_t) {
        if (value != 0) (*object_)[key] = value;
    }
    void optional_integer(const char* key, const std::optional<int64_t>& value, int64_t, int64_t) {
        if (value) (*object_)[key] = *value;
    }
    void text(const char* key, const std::string& value, const std::string&) { (*object_)[key] = value; }
    void integers(const char* key, const std::vector<int64_t>& value, int64_t, int64_t, std::size_t,
                  const std::vector<int64_t>&) {
        (*object_)[key] = value;
    }
    void groups(const char* key, const std::vector<ParameterGroupConfig>& value,
                const std::vector<ParameterGroupConfig>&) {
        nlohmann::json list = nlohmann::json::array();
        for (const ParameterGroupConfig& g : value) {
            nlohmann::json group{{"match", g.match}};
            if (g.lr) group["lr"] = *g.lr;
            if (g.lr_scale) group["lr_scale"] = *g.lr_scale;
            if (g.weight_decay) group["weight_decay"] = *g.weight_decay;
            list.push_back(std::move(group));
        }
        (*object_)[key] = std::move(list);
    }
    void not_both(const char*, const char*) {}

    nlohmann::json document = nlohmann::json::object();
};

// config_keys(): each key's row, checks skipped.
class KeyLister {
public:
    void section(const char* name) { section_ = name; }
    template <class Integer>
    void integer(const char* key, Integer&, int64_t low, int64_t high, int64_t fallback, const char* = "") {
        add(key, "integer", low, high, fallback);
    }
    void number(const char* key, double&, double low, double high, bool above_low, double fallback, const char* = "") {
        add(key, "number", low, high, fallback).above_low = above_low;
    }
    void flag(const char* key, bool&, bool fallback, const char* = "") { add(key, "boolean", 0, 0, fallback); }
    template <class Enum, std::size_t N>
    void named(const char* key, Enum&, const EnumName<Enum> (&names)[N], Enum fallback, const char* = "") {
        add(key, "string", 0, 0, name_of(names, fallback)).names = names_of(names);
    }
    int64_t shorthand(const char* key, int64_t low, int64_t high, int64_t fallback, const char* = "") {
        add(key, "integer", low, high, fallback);
        return fallback;
    }
    void check(bool, const char*, const std::string&) {}
    template <class Value>
    void optional_integer(const char* key, Value&, int64_t low, int64_t high) {
        add(key, "integer", low, high, nullptr);
    }
    void text(const char* key, std::string&, const std::string& fallback) { add(key, "string", 0, 0, fallback); }
    void integers(const char* key, std::vector<int64_t>&, int64_t low, int64_t high, std::size_t,
                  const std::vector<int64_t>& fallback) {
        add(key, "integers", low, high, fallback);
    }
    void groups(const char* key, std::vector<ParameterGroupConfig>&, const std::vector<ParameterGroupConfig>&) {
        add(key, "groups", 0, 0, nullptr);
    }
    void not_both(const char*, const char*) {}

    std::vector<ConfigKey> keys;

private:
    ConfigKey& add(const char* key, const char* kind, double low, double high, const nlohmann::json& fallback) {
        keys.push_back({section_, key, kind, low, high, false, {}, fallback});
        return keys.back();
    }
    std::string section_;
};

// Every key of a config: its section, range and default (the member's initializer in config.hpp,
// read from `defaults`), the member it sets and the checks that involve it, in the order they are
// read. parse() walks it with a FieldReader, resolved() with a FieldWriter, config_keys() with a
// KeyLister (the rows docs/training.md's tables must show: a test compares them).
template <class Fields>
void config_fields(Fields& f, Config& c) {
    const Config defaults;  // the section structs' initializers: each default once, there
    f.section("model");
    TransformerOptions& t = c.model.transformer;
    transformer_option_fields(f, t);  // layers/transformer.hpp: one row per option
    f.named("pooling", c.model.pooling, pooling_names, defaults.model.pooling, "classification: mean or first token");

    f.section("task");
    f.named("kind", c.task.kind, task_kinds, defaults.task.kind);
    f.integer("vocab", c.task.vocab, 7, 1 << 20, defaults.task.vocab);
    f.integers("train_lengths", c.task.train_lengths, 1, kMostLength, 2, defaults.task.train_lengths);
    f.integers("test_lengths", c.task.test_lengths, 1, kMostLength, 2, defaults.task.test_lengths);
    f.integer("distance", c.task.distance, 1, 1 << 20, defaults.task.distance);
    f.integer("symbol_position", c.task.symbol_position, 0, 1 << 20, defaults.task.symbol_position);
    f.check(c.task.kind != TaskKind::symbol_at || c.task.vocab >= 8, "vocab",
            "at least 8 for symbol_at (ids 0..5 are reserved, two symbols at least)");
    f.check(c.task.kind != TaskKind::addition || c.task.vocab >= kAdditionVocab, "vocab",
            "at least 15 for addition (ids 0..3 are reserved, then ten digits and '+')");
    const std::pair<const char*, const std::vector<int64_t>*> ranges[] = {{"train_lengths", &c.task.train_lengths},
                                                                          {"test_lengths", &c.task.test_lengths}};
    for (const auto& [key, range] : ranges) f.check((*range)[0] <= (*range)[1], key, "[min, max] with min <= max");
    for (const auto& [key, range] : ranges) {
        // relative_order: shorter sequences could only be negatives, their length giving the label away
        f.check(c.task.kind != TaskKind::relative_order || (*range)[0] > c.task.distance, key,
                "lengths above /task/distance = " + std::to_string(c.task.distance));
        f.check(c.task.kind != TaskKind::symbol_at || (*range)[0] > c.task.symbol_position, key,
                "lengths above /task/symbol_position = " + std::to_string(c.task.symbol_position));
    }
    f.integer("train_examples", c.task.train_examples, 1, 1 << 30, defaults.task.train_examples);
    f.integer("test_examples", c.task.test_examples, 1, 1 << 30, defaults.task.test_examples);
    f.flag("decoder_only", c.task.decoder_only, defaults.task.decoder_only);
    f.flag("reversed_sum", c.task.reversed_sum, defaults.task.reversed_sum);
    f.check(!c.task.reversed_sum || c.task.kind == TaskKind::addition, "reversed_sum",
            "false for a task other than addition");
    f.check(!c.task.decoder_only || is_pair_task(c.task.kind), "decoder_only",
            "false for a task that is not one of pairs (copy, reverse, dedupe, sort, addition, pairs)");
    // a synthetic data set is held in memory whole: at most kMostTokens tokens per split
    const std::tuple<const char*, int64_t, const char*, int64_t> splits[] = {
        {"train_examples", c.task.train_examples, "train_lengths", c.task.train_lengths[1]},
        {"test_examples", c.task.test_examples, "test_lengths", c.task.test_lengths[1]}};
    // addition: operands of `length` digits, about 4 length tokens with the sum
    const int64_t tokens_per_length = c.task.kind == TaskKind::addition ? 4 : 1;
    for (auto [key, examples, lengths, longest] : splits) {
        longest *= tokens_per_length;
        f.check(reads_files(c.task.kind) || examples <= kMostTokens / longest, key,
                "at most " + std::to_string(kMostTokens / longest) + " examples of up to " + std::to_string(longest) +
                    " tokens (/task/" + lengths + "): a synthetic split holds at most 2^27 tokens");
    }

    f.section("data");
    DataConfig& d = c.data;
    f.text("train", d.train, defaults.data.train);
    f.check(!reads_files(c.task.kind) || !d.train.empty(), "train",
            std::string("the training file of a ") + task_kind_name(c.task.kind) + " task");
    f.text("test", d.test, defaults.data.test);
    f.number("held_out", d.held_out, 0, 0.9, true, defaults.data.held_out);
    f.named("tokenizer", d.tokenizer, tokenizer_kind_names, defaults.data.tokenizer);
    f.integer("min_frequency", d.min_frequency, 1, 1 << 30, defaults.data.min_frequency);
    f.flag("lowercase", d.lowercase, defaults.data.lowercase);
    f.flag("split_punctuation", d.split_punctuation, defaults.data.split_punctuation);
    f.check(!d.split_punctuation || d.tokenizer == Tokenizer::Kind::word, "split_punctuation",
            "false with the char tokenizer (set data.tokenizer = \"word\")");
    f.integer("max_length", d.max_length, 1, kMostLength, defaults.data.max_length);
    f.integer("train_max_tokens", d.train_max_tokens, 0, 1 << 20, defaults.data.train_max_tokens);
    f.integer("test_max_tokens", d.test_max_tokens, 0, 1 << 20, defaults.data.test_max_tokens);

    f.section("training");
    TrainingConfig& tr = c.training;
    f.not_both("steps", "epochs");
    f.integer("steps", tr.steps, 1, int64_t{1} << 40, defaults.training.steps);
    f.optional_integer("epochs", tr.epochs, 1, 1 << 20);
    f.integer("batch_size", tr.batch_size, 1, 1 << 20, defaults.training.batch_size);
    f.number("learning_rate", tr.learning_rate, 0, 10, true, defaults.training.learning_rate);
    f.optional_integer("warmup_steps", tr.warmup_steps, 0, int64_t{1} << 40);
    f.named("schedule", tr.schedule, schedule_names, defaults.training.schedule);
    f.number("beta1", tr.adamw.beta1, 0, 0.999999, false, defaults.training.adamw.beta1);
    f.number("beta2", tr.adamw.beta2, 0, 0.999999, false, defaults.training.adamw.beta2);
    f.number("eps", tr.adamw.eps, 0, 1, true, defaults.training.adamw.eps);
    f.number("weight_decay", tr.adamw.weight_decay, 0, 10, false, defaults.training.adamw.weight_decay);
    f.number("clip_norm", tr.clip_norm, 0, 1e9, true, defaults.training.clip_norm);
    f.integer("seed", tr.seed, 0, int64_t{1} << 53, defaults.training.seed);
    f.integer("threads", tr.threads, 1, 1024, defaults.training.threads);
    f.named("device", tr.device, device_names, defaults.training.device);
    f.named("precision", tr.precision, precision_names, defaults.training.precision);
    gradient_checkpointing_field(f, t);
    f.flag("length_bucketing", tr.length_bucketing, defaults.training.length_bucketing);
    f.integer("log_every", tr.log_every, 1, int64_t{1} << 40, defaults.training.log_every);
    f.optional_integer("shards", tr.shards, 1, 1 << 20);
    f.check(!tr.shards || *tr.shards <= tr.batch_size, "shards",
            "at most training.batch_size " + std::to_string(tr.batch_size) + " (a shard holds one example or more)");

    f.section("optimizer");
    f.groups("groups", c.optimizer.groups, defaults.optimizer.groups);

    f.section("evaluation");
    f.integer("every", c.evaluation.every, 1, int64_t{1} << 40, defaults.evaluation.every);
    f.integer("batch_size", c.evaluation.batch_size, 1, 1 << 20, defaults.evaluation.batch_size);
    f.integers("length_buckets", c.evaluation.length_buckets, 1, 1 << 20, 0, defaults.evaluation.length_buckets);
    const std::vector<int64_t>& bounds = c.evaluation.length_buckets;
    f.check(std::adjacent_find(bounds.begin(), bounds.end(), std::greater_equal<int64_t>()) == bounds.end(),
            "length_buckets", "increasing bounds");

    f.section("output");
    f.text("dir", c.output.dir, defaults.output.dir);
    f.check(!c.output.dir.empty(), "dir", "a directory name");
    f.integer("checkpoint_every", c.output.checkpoint_every, 1, int64_t{1} << 40, defaults.output.checkpoint_every);
}

}  // namespace

const char* task_kind_name(TaskKind kind) { return name_of(task_kinds, kind); }

TaskKind parse_task_kind(const nlohmann::json& document) {
    // looked up in place: document.value() would copy "task", recursing once per level of nesting
    if (!document.is_object() || !document.contains("task") || !document["task"].is_object()) {
        return TaskKind::relative_order;  // the default; Config::parse reports a "task" that is not an object
    }
    const nlohmann::json& task = document["task"];
    if (!task.contains("kind") || !task["kind"].is_string()) return TaskKind::relative_order;  // likewise
    return task_kind_from_name(task["kind"].get<std::string>());
}

bool reads_files(TaskKind kind) {
    return kind == TaskKind::classification || kind == TaskKind::pairs || kind == TaskKind::language_model;
}

int64_t longest_input(const TaskConfig& task, int64_t longest) {
    // a source or target of `longest` tokens (+2: bos/eos); addition's source holds two numbers and
    // '+', its sum one digit more than a number; decoder-only, source, bos and target are one
    // input, read while decoding up to one token past the target
    const bool addition = task.kind == TaskKind::addition;
    const int64_t source = addition ? 2 * longest + 1 : longest, target = addition ? longest + 1 : longest;
    return task.decoder_only ? source + target + 2 : std::max(source, target) + 2;
}

bool is_pair_task(TaskKind kind) {
    return kind == TaskKind::copy || kind == TaskKind::reverse || kind == TaskKind::dedupe || kind == TaskKind::sort ||
           kind == TaskKind::addition || kind == TaskKind::pairs;
}

Config Config::parse(const nlohmann::json& document, const std::string& file) {
    Config c;
    FieldReader reader(document, file);
    config_fields(reader, c);
    reader.finish();
    // learned positions need a vector for the longest input
    c.model.transformer.max_positions =
        longest_input(c.task, reads_files(c.task.kind) ? c.data.max_length
                                                       : std::max(c.task.train_lengths[1], c.task.test_lengths[1]));
    // a run by steps gets its default warmup now; a run by epochs, from its data in train()
    if (c.training.epochs == 0) c.training.warmup_steps = c.training.warmup(c.training.steps);
    return c;
}

std::vector<ConfigKey> config_keys() {
    Config c;
    KeyLister lister;
    config_fields(lister, c);
    return lister.keys;
}

nlohmann::json Config::resolved() const {
    Config copy = *this;
    FieldWriter writer;
    config_fields(writer, copy);
    // a run by epochs gets its step count (and a default warmup) from its data: resolved by train()
    if (training.epochs > 0) writer.document["training"].erase("steps");
    return writer.document;
}

std::vector<MatchedGroup> parameter_groups(const Config& c, const Module& model) {
    std::vector<MatchedGroup> groups;
    for (const ParameterGroupConfig& g : c.optimizer.groups) {
        const double lr_scale = g.lr ? *g.lr / c.training.learning_rate : g.lr_scale.value_or(1.0);
        groups.push_back({g.match, {{}, lr_scale, g.weight_decay.value_or(c.training.adamw.weight_decay)}, {}});
    }
    groups.push_back({"", {{}, 1.0, c.training.adamw.weight_decay}, {}});  // the rest
    for (const auto& named : model.named_parameters()) {
        const std::string& name = named.first;  // not a structured binding: a lambda captures it
        auto group = std::find_if(groups.begin(), groups.end() - 1, [&name](const MatchedGroup& g) {
            return fnmatch(g.match.c_str(), name.c_str(), 0) == 0;
        });
        group->group.parameters.push_back(named.second);
        group->names.push_back(name);
    }
    return groups;
}

std::vector<ParameterGroup> without_names(const std::vector<MatchedGroup>& groups) {
    std::vector<ParameterGroup> out;
    for (const MatchedGroup& g : groups) out.push_back(g.group);
    return out;
}

// configs/quickstart.json, embedded at build time: the one copy of the quickstart
nlohmann::json quickstart_config() { return parse_json(embedded::quickstart_json, "configs/quickstart.json"); }

nlohmann::json read_config_file(const std::string& path) {
    return parse_json(read_file(path, "a config file"), path);  // errors: syntax, duplicate keys, numbers beyond double
}

void require_utf8(const std::string& text, const std::string& what) {
    try {
        static_cast<void>(nlohmann::json(text).dump());  // a JSON string holds only valid UTF-8
    } catch (const nlohmann::json::exception&) {
        throw std::invalid_argument(what + ": not valid UTF-8");
    }
}

void apply_override(nlohmann::json& document, const std::string& assignment) {
    const std::size_t equals = assignment.find('=');
    RELGRAD_CHECK(equals != std::string::npos && equals != 0, "--set ", assignment, ": expected path.to.key=value");
    const std::string path = assignment.substr(0, equals), text = assignment.substr(equals + 1);
    // JSON (duplicate keys refused), or else a plain string such as reverse or runs/x
    nlohmann::json value = nlohmann::json::accept(text) ? parse_json(text, "--set " + path) : nlohmann::json(text);
    require_utf8(text, "--set " + path);
    RELGRAD_CHECK(document.is_object(), "--set ", assignment, ": the config is not a JSON object {...}");
    nlohmann::json* node = &document;
    std::size_t start = 0;
    while (true) {
        const std::size_t dot = path.find('.', start);
        const std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
        RELGRAD_CHECK(!key.empty(), "--set ", assignment, ": empty key in '", path, "'");
        if (dot == std::string::npos) {
            if (value.is_null()) {
                node->erase(key);  // back to the default
            } else {
                (*node)[key] = std::move(value);  // moved: a copy would recurse once per level of nesting
            }
            return;
        }
        if (!node->contains(key)) (*node)[key] = nlohmann::json::object();
        node = &(*node)[key];
        RELGRAD_CHECK(node->is_object(), "--set ", assignment, ": '", key, "' is not a section");
        start = dot + 1;
    }
}

int64_t TrainingConfig::total_steps(int64_t train_examples) const {
    if (epochs == 0) return steps;
    return (epochs * train_examples + batch_size - 1) / batch_size;
}

}  // namespace relgrad
