// relgrad: the training configuration, one JSON document with seven sections. Every value has a
// default; every value given is checked (type, range, names), and unknown keys are errors.
// docs/training.md lists every key.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/optim.hpp"
#include "layers/transformer.hpp"
#include "train/tokenizer.hpp"

namespace relgrad {

struct ModelConfig {
    TransformerOptions transformer;   // layers, dim, heads, ff_dim, dropout, position, k, impl, ...
    Pooling pooling = Pooling::mean;  // classification
};

// The task decides the model: classification tasks train a SequenceClassifier, sequence-pair
// tasks an EncoderDecoder (or, with task.decoder_only, a CausalLanguageModel reading prompt and
// answer), language modelling a CausalLanguageModel. copy, reverse, dedupe, sort, addition,
// relative_order and symbol_at are generated from the seed (train/datasets.hpp); the others read
// the files of the data section.
enum class TaskKind {
    copy,
    reverse,
    dedupe,
    sort,
    addition,
    relative_order,
    symbol_at,
    classification,
    pairs,
    language_model
};
bool reads_files(TaskKind kind);
// a task of (source, target) pairs: copy, reverse, dedupe, sort, addition, pairs
bool is_pair_task(TaskKind kind);

// Limits that keep a valid config from asking for hours of work or more memory than there is
// (docs/training.md): sequences of at most 2^16 tokens (task.train_lengths, task.test_lengths,
// data.max_length), and a synthetic split of at most 2^27 tokens (examples x longest length).
constexpr int64_t kMostLength = int64_t{1} << 16;
constexpr int64_t kMostTokens = int64_t{1} << 27;
// The task kind a config document names: the default when it names none (or none that is a string,
// which Config::parse then reports); throws on an unknown name.
TaskKind parse_task_kind(const nlohmann::json& document);
struct TaskConfig {
    TaskKind kind = TaskKind::relative_order;
    int64_t vocab = 16;                         // synthetic symbols, reserved ids included
    std::vector<int64_t> train_lengths{8, 24};  // [min, max] sequence length for training
    std::vector<int64_t> test_lengths{8, 48};   // [min, max] for evaluation: longer probes generalization
    int64_t distance = 3;                       // relative_order: A stands this many positions before B
    int64_t symbol_position = 2;                // symbol_at: the label is the symbol here (from 0)
    int64_t train_examples = 4000;
    int64_t test_examples = 500;
    // pair tasks: one CausalLanguageModel reads source, a separator (bos) and the target, the loss
    // on the target and eos alone, instead of an EncoderDecoder
    bool decoder_only = false;
    bool reversed_sum = false;  // addition: the sum least significant digit first
};

// The positions the longest input of `task` takes when its texts (a synthetic task's lengths) have
// up to `longest` tokens: what learned positions need rows for.
int64_t longest_input(const TaskConfig& task, int64_t longest);

// Files for classification (TSV label<TAB>text or JSONL {"text", "label"}), pairs (TSV
// source<TAB>target or JSONL {"source", "target"}) and language_model (plain text).
struct DataConfig {
    std::string train;  // required for the file tasks
    std::string test;   // or, when empty, a held-out part of train
    double held_out = 0.1;
    Tokenizer::Kind tokenizer = Tokenizer::Kind::character;  // "char" | "word"
    int64_t min_frequency = 1;                               // rarer tokens (characters or words) become <unk>
    bool lowercase = false;                                  // the tokenizer's TextOptions (train/tokenizer.hpp)
    bool split_punctuation = false;                          // word tokenizer only
    int64_t max_length = 128;  // tokens kept per text (language_model: the context length)
    // classification and pairs: training examples whose text (source) has more tokens are left
    // out (0: keep all); for length generalization, or with test_max_tokens for short pairs only
    int64_t train_max_tokens = 0;
    int64_t test_max_tokens = 0;  // the same for the test examples
};

inline constexpr EnumName<DType> precision_names[] = {entry_of(dtype_names, DType::float32),
                                                      entry_of(dtype_names, DType::bfloat16),
                                                      entry_of(dtype_names, DType::float16)};

struct TrainingConfig {
    int64_t steps = 400;
    // > 0 instead of steps: as many steps as draw `epochs` times the training examples, i.e.
    // ceil(epochs * examples / batch_size) (batches are drawn at random, see docs/training.md)
    int64_t epochs = 0;
    int64_t batch_size = 32;
    double learning_rate = 1e-3;
    std::optional<int64_t> warmup_steps;  // nothing: min(40, steps / 10)
    // the steps of a run over `train_examples` examples, and its warmup
    int64_t total_steps(int64_t train_examples) const;
    int64_t warmup(int64_t total_steps) const { return warmup_steps.value_or(std::min<int64_t>(40, total_steps / 10)); }
    Schedule schedule = Schedule::cosine;
    AdamWOptions adamw{0.9, 0.98, 1e-8, 0.01};
    double clip_norm = 1.0;
    uint64_t seed = 1;
    int64_t threads = 2;
    // where the model and every batch live: cpu, cuda (an NVIDIA GPU), or guarded_cpu (the CPU
    // kernels as a device whose memory the host may not read; the same numbers, a check that
    // training is device-clean)
    Device device = Device::cpu;
    // what the model computes in (docs/precision.md): float32, or bfloat16 or float16 with float32
    // master weights, float32 loss and optimizer; float16 with dynamic loss scaling
    DType precision = DType::float32;
    int64_t log_every = 20;
    bool length_bucketing = false;  // draw each batch from examples of about the same length
    // S: each batch cut into S shards of consecutive examples, whose gradients are added in shard
    // order (docs/distributed.md); nothing: 1 in one process, the process count under mpirun
    std::optional<int64_t> shards;
};

// optimizer.groups: parameter groups, PyTorch's convention. A parameter joins the first group whose
// `match`, a glob (fnmatch: * any run of characters, ? one, [...] one of), matches its name
// (Module::named_parameters: "encoder.layers.0.self_attention.gate"); the parameters no group
// matches train at training.learning_rate and training.weight_decay. Left out, the groups are
// kDefaultGroups: no weight decay on biases, LayerNorm parameters and gates.
struct ParameterGroupConfig {
    std::string match;
    std::optional<double> lr;            // the group's peak learning rate, or
    std::optional<double> lr_scale;      // its ratio to training.learning_rate (neither: 1)
    std::optional<double> weight_decay;  // nothing: training.weight_decay
};
inline const std::vector<ParameterGroupConfig> kDefaultGroups{{"*bias", std::nullopt, std::nullopt, 0.0},
                                                              {"*norm*", std::nullopt, std::nullopt, 0.0},
                                                              {"*gate*", std::nullopt, std::nullopt, 0.0}};
struct OptimizerConfig {
    std::vector<ParameterGroupConfig> groups = kDefaultGroups;
};

struct EvaluationConfig {
    int64_t every = 100;  // steps between evaluations (and at the end)
    int64_t batch_size = 64;
    std::vector<int64_t> length_buckets{8, 16, 24, 32, 48};
};

struct OutputConfig {
    std::string dir = "runs/quickstart";
    int64_t checkpoint_every = 100;
};

struct Config {
    ModelConfig model;
    TaskConfig task;
    DataConfig data;
    TrainingConfig training;
    OptimizerConfig optimizer;
    EvaluationConfig evaluation;
    OutputConfig output;

    // Reads and checks a document; `file` names it in errors.
    static Config parse(const nlohmann::json& document, const std::string& file);
    // The configuration with every default filled in, as it would be written.
    nlohmann::json resolved() const;
};

// The optimizer's groups for `model` under `c`: one per optimizer.groups entry, in order, then one
// for the parameters none of them caught; `names` lists each group's parameters.
struct MatchedGroup {
    std::string match;  // "" for the rest
    ParameterGroup group;
    std::vector<std::string> names;
};
std::vector<MatchedGroup> parameter_groups(const Config& c, const Module& model);
std::vector<ParameterGroup> without_names(const std::vector<MatchedGroup>& groups);

// One key of a config as config_fields (config.cpp) describes it, for the docs: kind "integer",
// "number" (above_low: the range is (low, high]), "boolean", "string" (names: the allowed ones, if
// a list), "integers" (each in [low, high]) or "groups"; fallback null for a key without a default
// (one that may be left out).
struct ConfigKey {
    std::string section, key, kind;
    double low, high;
    bool above_low;
    std::vector<std::string> names;
    nlohmann::json fallback;
};
// Every key of every section, in the order a config is read.
std::vector<ConfigKey> config_keys();

// The quickstart: relative-order classification with relative positions, about ten seconds here.
nlohmann::json quickstart_config();
// Reads a config file (JSON errors with line and column); throws std::invalid_argument.
nlohmann::json read_config_file(const std::string& path);
// Throws "<what>: not valid UTF-8" unless text is valid UTF-8 (what a config may hold).
void require_utf8(const std::string& text, const std::string& what);

// Applies "--set a.b.c=value" overrides: the value is read as JSON when it parses (numbers,
// true/false, lists), else as a string. The key path must name a known section.
void apply_override(nlohmann::json& document, const std::string& assignment);

const char* task_kind_name(TaskKind kind);

}  // namespace relgrad
