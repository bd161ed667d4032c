// The trainer (trainer.hpp). One file: train() and the parts only it calls (a step, a batch in
// shards, what a run reports, several processes), each a section below, in the order train() uses them.
#include "train/trainer.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>

#include "engine/autograd.hpp"
#include "engine/backend/backend.hpp"
#include "engine/errors.hpp"
#include "engine/system.hpp"
#include "train/json_reader.hpp"
#include "train/make_task.hpp"
#include "train/processes.hpp"
#include "train/run_directory.hpp"

namespace relgrad {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// ---------------------------------------------------------------- the output directory

// The run directory as rank 0 holds it: the one writer's lock (train/run_directory.hpp), and on
// --resume the run's tokenizer, the ids its checkpoint was trained on.
struct OutputDirectory {
    RunWriter writer;
    std::optional<Tokenizer> tokenizer;
};

// A fresh run needs an output directory without a run in it, --resume an unfinished run there
// trained with the same config (what run_identity leaves out aside); each checked once this
// process is the run's one writer, so no other can start or end a run there meanwhile.
OutputDirectory checked_output_directory(const fs::path& out, const json& resolved, const TrainOptions& options) {
    std::error_code error;
    RELGRAD_CHECK(!fs::exists(out, error) || fs::is_directory(out, error), out.string(),
                  ": not a directory, expected the run's directory (output.dir)");
    RELGRAD_CHECK(!options.resume || fs::exists(out / "config.json", error), "--resume: no run in ", out.string());
    RunWriter writer(out);
    if (!options.resume) {
        const bool holds_a_run = recovered_checkpoint(out);
        RELGRAD_CHECK(!holds_a_run, out.string(),
                      " already holds a run; pass --resume to continue it or choose another --out");
        return {std::move(writer), std::nullopt};
    }
    RELGRAD_CHECK(!fs::exists(out / "summary.json"), "--resume: the run in ", out.string(),
                  " is finished (it has summary.json)");
    // read back through the parser, so that a key added to relgrad since has its default
    const json saved = Config::parse(read_json_file(out / "config.json"), (out / "config.json").string()).resolved();
    const std::string differs = first_difference(run_identity(resolved), run_identity(saved));
    RELGRAD_CHECK(differs.empty(), "--resume: ", differs, " differs from the config ", out.string(),
                  " was trained with");
    return {std::move(writer), saved_tokenizer(out, parse_task_kind(saved))};
}

// metrics.jsonl of a run resumed at `step` must hold exactly the lines the run wrote up to that
// step: the evaluation at step 0, then in step order a log line at every multiple of log_every and
// an evaluation at every multiple of evaluation.every, both at the last step too. Lines after the
// checkpoint's step (the run went on before it stopped, and the resumed run writes them again) and
// a last line cut short are dropped; anything else means the metrics are not this checkpoint's.
// Returns the evaluations kept, in order.
std::vector<json> keep_metrics_up_to(const fs::path& path, int64_t step, const Config& config, int64_t total_steps,
                                     int64_t skipped_steps) {
    const std::string text = read_file(path, "the run's metrics (metrics.jsonl)");
    const int64_t log_every = config.training.log_every, eval_every = config.evaluation.every;
    auto expect = [&](bool condition, int64_t line, const std::string& what) {
        RELGRAD_CHECK(condition, path.string(), ":line ", line, ": ", what,
                      " (the metrics do not belong to the checkpoint at step ", step, ")");
    };
    std::string kept;
    std::vector<json> evaluations;
    int64_t line_number = 0, previous_step = -1, lines_kept = 0, skips = 0, skips_off_schedule = 0;
    bool previous_was_eval = true;
    for (std::size_t start = 0, end; (end = text.find('\n', start)) != std::string::npos; start = end + 1) {
        const std::string line = text.substr(start, end - start);
        ++line_number;
        const json entry = parse_json(line, path.string() + ":line " + std::to_string(line_number));
        expect(entry.is_object() && entry.contains("step") && is_int64(entry["step"]), line_number,
               "expected an object with an integer \"step\"");
        const int64_t at = entry["step"].get<int64_t>();
        if (at > step) break;
        const bool eval = entry.contains("eval"), last = at == total_steps, skipped = entry.contains("skipped");
        const bool on_schedule = at % log_every == 0 || last;
        expect(eval ? at == 0 || at % eval_every == 0 || last : at > 0 && (on_schedule || skipped), line_number,
               "step " + std::to_string(at) + " is not one at which the run " + (eval ? "evaluates" : "logs"));
        skips += skipped;
        skips_off_schedule += skipped && !on_schedule;
        // in order: each step's log line before its evaluation, and no step twice
        expect(at > previous_step || (at == previous_step && eval && !previous_was_eval), line_number,
               "step " + std::to_string(at) + " out of order");
        previous_step = at;
        previous_was_eval = eval;
        kept += line + "\n";
        ++lines_kept;
        if (eval) evaluations.push_back(entry["eval"]);
    }
    const bool at_end = step == total_steps;
    const int64_t expected = 1 + step / log_every + step / eval_every + (at_end && total_steps % log_every != 0) +
                             (at_end && total_steps % eval_every != 0) + skips_off_schedule;
    expect(skips == skipped_steps, line_number,
           std::to_string(skips) + " skipped steps logged up to step " + std::to_string(step) +
               ", the checkpoint counts " + std::to_string(skipped_steps));
    expect(lines_kept == expected, line_number,
           std::to_string(lines_kept) + " lines up to step " + std::to_string(step) + ", expected " +
               std::to_string(expected));
    if (kept.size() != text.size()) write_file(path, kept);
    return evaluations;
}

// Where a run starts: at step 0, with config.json, tokenizer.json and an empty metrics.jsonl
// written, or for --resume at the checkpoint's step (which --stop-after must lie beyond), with the
// evaluations metrics.jsonl holds up to there. A process that does not write the run's files
// (`writes` false: ranks other than 0) only reads the checkpoint.
struct Start {
    int64_t step = 0;
    std::vector<json> evaluations;
};

Start first_step(const fs::path& out, const Config& config, const json& resolved,
                 const std::optional<Tokenizer>& tokenizer, const TrainOptions& options, int64_t total_steps,
                 Module& model, AdamW& optimizer, LossScaler* scaler, bool writes) {
    if (!options.resume) {
        if (!writes) return {};
        write_json_file(out / "config.json", resolved);
        if (tokenizer) write_json_file(out / "tokenizer.json", json::parse(tokenizer->to_json()));
        write_file(out / "metrics.jsonl", "");
        return {};
    }
    // a checkpoint cut short was put back by train(), on rank 0, before any process reads it
    const int64_t step = load_checkpoint(out / "checkpoint", model, optimizer, scaler, run_identity(resolved));
    RELGRAD_CHECK(step <= total_steps, (out / "checkpoint" / "state.json").string(), ": step ", step,
                  " is past the run's ", total_steps, " steps");
    RELGRAD_CHECK(options.stop_after <= 0 || options.stop_after > step, "--stop-after ", options.stop_after,
                  ": the checkpoint is already at step ", step);
    if (!writes) return {step, {}};
    return {step,
            keep_metrics_up_to(out / "metrics.jsonl", step, config, total_steps, scaler ? scaler->skipped_steps() : 0)};
}

// ---------------------------------------------------------------- a step

// The batch of each step and the seed of its dropout masks, drawn from (seed, step) alone.
class Sampler {
public:
    struct Draw {
        std::vector<int64_t> indices;  // of training examples
        uint64_t dropout_seed;
    };

    Sampler(const TrainingConfig& training, const Task& task)
        // kept apart from the seeds of the weights and of the synthetic data
        : base_(Generator(training.seed ^ 0x5851f42d4c957f2dULL).next_u64()),
          batch_size_(training.batch_size),
          train_size_(task.train_size()) {
        // length bucketing: groups of 16 batches' worth of examples of about the same length
        if (training.length_bucketing) {
            std::vector<int64_t> lengths;
            for (int64_t i = 0; i < train_size_; ++i) lengths.push_back(task.train_length(i));
            groups_ = length_groups(lengths, 16 * batch_size_);
        }
    }

    Draw draw(int64_t step) const {
        Generator sampler(base_ + static_cast<uint64_t>(step));
        Draw draw;
        if (groups_.empty()) {
            for (int64_t i = 0; i < batch_size_; ++i)
                draw.indices.push_back(static_cast<int64_t>(sampler.next_u64() % train_size_));
        } else {
            const std::vector<int64_t>& group = groups_[sampler.next_u64() % groups_.size()];
            for (int64_t i = 0; i < batch_size_; ++i) draw.indices.push_back(group[sampler.next_u64() % group.size()]);
        }
        draw.dropout_seed = sampler.next_u64();
        return draw;
    }

private:
    uint64_t base_;
    int64_t batch_size_, train_size_;
    std::vector<std::vector<int64_t>> groups_;
};

struct StepResult {
    Tensor loss;  // the batch's mean loss, a scalar
    double grad_norm = 0, learning_rate = 0;
    int64_t tokens = 0;
    bool skipped = false;  // float16: a gradient overflowed at the loss scale, so no update
};

TrainingDiverged diverged(const std::string& what, double value, int64_t step) {
    return TrainingDiverged("training diverged: " + what + " is " + std::to_string(value) + " at step " +
                            std::to_string(step + 1) + " (try a lower learning rate)");
}

// ---------------------------------------------------------------- a batch in shards
//
// With training.shards = S > 1 a batch of B examples is cut into S shards of consecutive
// examples, shard s the examples [s B / S, (s + 1) B / S). Each shard's loss is the sum over its
// targets (not the mean) and its gradient is taken on its own, from zero, with dropout masks drawn
// from (the step's seed, the shard's first example). The batch's gradient is then
//     g = (g_0 + g_1 + ... + g_{S-1}) / N,      N = the targets of all S shards,
// added left to right in float32 and divided once: the gradient of the batch's mean loss, in an
// order that depends on S alone, never on who computed which shard (docs/distributed.md).

// Each shard's results, a row each: its gradient of every parameter flattened in parameter order
// (zeros where the shard gave a parameter none) and its numbers: the loss summed over its
// targets, its tokens, its targets, and for each parameter 1 if the shard gave it a gradient.
// This process's rows; the sum of every process's gradient rows (Processes::add_rows) and all
// their numbers side by side. Kept from step to step, so that their memory is reused (an exchange
// into memory MPI has not seen yet is ten times slower here, docs/distributed.md).
struct ShardRows {
    explicit ShardRows(const std::vector<Tensor>& parameters) : parameter_count(parameters.size()) {
        for (const Tensor& p : parameters) gradient_width += p.numel();
    }
    int64_t parameter_count = 0, gradient_width = 0;
    int64_t number_width() const { return 3 + parameter_count; }
    std::vector<float> gradients, gradient_sum;
    std::vector<double> numbers, all_numbers;
    Processes::RowScratch scratch;
};

// float16's loss scale on a summed loss: a shard's summed loss has gradients as large as the
// mean's times the shard's examples, which at the scaler's scale would overflow float16 where the
// mean's do not. So a shard's sum is scaled by scale / 2^k, 2^k the largest power of two no more
// than a shard's examples, and the sum of the shards multiplied back by 2^k: powers of two, exact.
int64_t shard_step_down(int64_t batch_size, int64_t shards) {
    int64_t power = 1;
    while (power * 2 <= batch_size / shards) power *= 2;
    return power;
}

// Runs shard `shard` of `shards` of the batch forward and backward, and appends its row.
void run_shard(Task& task, LossScaler* scaler, DType precision, const Sampler::Draw& batch, int64_t shard,
               int64_t shards, int64_t step, ShardRows& rows) {
    Module& model = task.model();
    const int64_t B = static_cast<int64_t>(batch.indices.size());
    const int64_t begin = shard * B / shards, end = (shard + 1) * B / shards;
    const std::vector<int64_t> examples(batch.indices.begin() + begin, batch.indices.begin() + end);
    model.reseed(Generator(batch.dropout_seed + static_cast<uint64_t>(begin)).next_u64());
    model.zero_grad();
    LossCounts counts;
    double loss_sum = 0;
    {
        const ComputeIn compute(model, precision);
        const Tensor loss = task.loss(examples, counts, Reduction::sum);
        loss_sum = loss.item();
        if (!std::isfinite(loss_sum)) throw diverged("the loss", loss_sum, step);
        (scaler ? mul(loss, scaler->scale() / static_cast<double>(shard_step_down(B, shards))) : loss).backward();
    }
    rows.numbers.insert(rows.numbers.end(),
                        {loss_sum, static_cast<double>(counts.tokens), static_cast<double>(counts.targets)});
    for (const Tensor& p : model.parameters()) {
        const Tensor g = p.grad();
        rows.numbers.push_back(g.defined() ? 1.0 : 0.0);
        if (!g.defined()) {
            rows.gradients.insert(rows.gradients.end(), static_cast<std::size_t>(p.numel()), 0.0f);
            continue;
        }
        const Tensor host = g.to(Device::cpu).contiguous();  // float32, as the master weights
        const float* values = host.data<float>();
        rows.gradients.insert(rows.gradients.end(), values, values + host.numel());
    }
}

struct BatchSums {
    double loss;  // the batch's mean loss
    int64_t tokens;
};

// Sets every parameter's gradient to the sum of the shards' rows (added in shard order) times
// `step_up` (float16's 2^k above, else 1) divided by the batch's target count (none where no
// shard gave the parameter one); returns the batch's loss.
BatchSums add_shards(ShardRows& rows, const std::vector<Tensor>& parameters, float step_up) {
    const int64_t shards = static_cast<int64_t>(rows.all_numbers.size()) / rows.number_width();
    std::vector<float>& total = rows.gradient_sum;
    double loss_sum = 0, targets = 0, tokens = 0;
    std::vector<bool> defined(static_cast<std::size_t>(rows.parameter_count), false);
    for (int64_t shard = 0; shard < shards; ++shard) {
        const double* numbers = rows.all_numbers.data() + shard * rows.number_width();
        loss_sum += numbers[0];
        tokens += numbers[1];
        targets += numbers[2];
        for (int64_t p = 0; p < rows.parameter_count; ++p) defined[p] = defined[p] || numbers[3 + p] != 0;
    }
    const float count = static_cast<float>(std::max(targets, 1.0));  // exact below 2^24 targets
    for (float& e : total) e = e * step_up / count;
    std::size_t offset = 0;
    for (std::size_t p = 0; p < parameters.size(); ++p) {
        const Tensor& parameter = parameters[p];
        const std::size_t n = static_cast<std::size_t>(parameter.numel());
        if (defined[p]) {
            Tensor g = empty(parameter.shape(), DType::float32);
            std::copy(total.begin() + offset, total.begin() + offset + n, g.data<float>());
            parameter.impl()->grad = g.to(parameter.device());
        }
        offset += n;
    }
    return {loss_sum / std::max(targets, 1.0), static_cast<int64_t>(tokens)};
}

// One AdamW step on the batch: the loss, its gradients, clipped. With shards (`rows`, else null)
// each process computes its share of them and every process adds all of them, the same sum on
// each. The forward and backward run in training.precision (the float32 parameters cast, the
// loss float32); with a loss scaler (float16) the loss is scaled before the backward and the step
// skipped when a gradient overflows. A NaN or infinite loss or gradient norm ends the run.
StepResult train_step(Task& task, AdamW& optimizer, LossScaler* scaler, const TrainingConfig& training,
                      const Processes& processes, ShardRows* rows, const Sampler::Draw& batch, int64_t step,
                      int64_t warmup_steps, int64_t total_steps) {
    Module& model = task.model();
    StepResult result;
    result.learning_rate = learning_rate(training.schedule, training.learning_rate, step, warmup_steps, total_steps);
    const int64_t shards = training.shards.value_or(1);
    if (!rows) {
        model.reseed(batch.dropout_seed);
        model.zero_grad();
        const ComputeIn compute(model, training.precision);
        LossCounts counts;
        result.loss = task.loss(batch.indices, counts, Reduction::mean);
        result.tokens = counts.tokens;
        const double loss = result.loss.item();
        if (!std::isfinite(loss)) throw diverged("the loss", loss, step);
        (scaler ? mul(result.loss, scaler->scale()) : result.loss).backward();
    } else {
        // this process's shards, consecutive ones; then every process's rows, in shard order
        rows->gradients.clear();
        rows->numbers.clear();
        const int64_t mine = shards / processes.count(), first = processes.rank() * mine;
        for (int64_t shard = first; shard < first + mine; ++shard) {
            run_shard(task, scaler, training.precision, batch, shard, shards, step, *rows);
        }
        if (processes.count() > 1) {  // the time the slowest shard keeps the others waiting, apart
            const ProfileScope profiled("(waiting for every process)", Phase::update);
            std::vector<double> everyone;
            processes.gather(std::vector<double>{0.0}, everyone);
        }
        {  // the gradients added in shard order, whoever holds them
            const ProfileScope profiled("(exchanging and adding shards)", Phase::update);
            processes.add_rows(rows->gradients, static_cast<std::size_t>(rows->gradient_width), rows->gradient_sum,
                               rows->scratch);
            processes.gather(rows->numbers, rows->all_numbers);
        }
        const ProfileScope profiled("(setting the gradients)", Phase::update);
        const int64_t B = static_cast<int64_t>(batch.indices.size());
        const BatchSums sums =
            add_shards(*rows, model.parameters(), scaler ? static_cast<float>(shard_step_down(B, shards)) : 1.0f);
        result.loss = scalar(sums.loss, DType::float32);
        result.tokens = sums.tokens;
    }
    if (scaler && !scaler->unscale(model.parameters())) {
        result.skipped = true;
        return result;
    }
    result.grad_norm = clip_grad_norm(model.parameters(), training.clip_norm);
    if (!std::isfinite(result.grad_norm)) throw diverged("the gradient norm", result.grad_norm, step);
    optimizer.step(result.learning_rate);
    return result;
}

// ---------------------------------------------------------------- what a run reports

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

std::string duration(double seconds) {
    const auto s = static_cast<int64_t>(seconds + 0.5);
    char text[32];
    std::snprintf(text, sizeof text, "%lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
    return text;
}

// metrics.jsonl, a line appended and flushed per entry; a failed write is an error, not lost metrics.
class MetricsFile {
public:
    explicit MetricsFile(fs::path path) : path_(std::move(path)), out_(path_, std::ios::app) {
        RELGRAD_CHECK_RUNTIME(out_, path_.string(), ": cannot open for writing");
    }
    void append(const json& entry) {
        out_ << entry.dump() << "\n" << std::flush;
        RELGRAD_CHECK_RUNTIME(out_, path_.string(), ": write failed");
    }

private:
    fs::path path_;
    std::ofstream out_;
};

// A line of metrics.jsonl for a logged step, or a skipped one (float16: no grad_norm, as the
// gradients overflowed; loss_scale is the scale the next step uses).
void log_step(MetricsFile& metrics, int64_t done, const StepResult& result, const LossScaler* scaler, double seconds,
              double tokens_per_second) {
    json line{{"step", done}, {"loss", result.loss.item()}, {"learning_rate", result.learning_rate}};
    if (result.skipped) {
        line["skipped"] = true;
    } else {
        line["grad_norm"] = result.grad_norm;
    }
    if (scaler) line["loss_scale"] = scaler->scale();
    line["seconds"] = seconds;
    line["tokens_per_second"] = tokens_per_second;
    metrics.append(line);
}

// The progress line on stderr, rewritten in place at every step.
void show_progress(int64_t done, int64_t total_steps, double loss, double tokens_per_second, double eta_seconds) {
    std::fprintf(stderr, "\rstep %lld/%lld  loss %.4f  %.0f tok/s  ETA %s   ", static_cast<long long>(done),
                 static_cast<long long>(total_steps), loss, tokens_per_second, duration(eta_seconds).c_str());
}

json summary_of(const Config& config, Task& task, int64_t total_steps, const json& initial, const json& final,
                double train_seconds, int64_t tokens_seen) {
    json summary = {
        {"task", task_kind_name(config.task.kind)},
        {"precision", dtype_name(config.training.precision)},
        {"metric", task.metric()},
        {"position", position_mode_name(config.model.transformer.position)},
        {"steps", total_steps},
        {"parameters", task.model().parameter_count()},
        {"train_examples", task.train_size()},
        {"final", final},
        {"train_seconds", train_seconds},
        {"tokens_per_second", static_cast<double>(tokens_seen) / std::max(train_seconds, 1e-9)},
        {"peak_rss_mib", peak_rss_mib()},
        {"peak_live_mib", static_cast<double>(memory_stats(config.training.device).peak_live_bytes) / 1048576.0}};
    if (!initial.is_null()) summary["initial"] = initial;
    if (config.model.transformer.position == PositionMode::gated) summary["gates"] = task.gates();
    return summary;
}

// ---------------------------------------------------------------- several processes

// The config with training.shards filled in where it is left out: the shards a resumed run was
// trained with, else the process count (1 in one process, where it stays left out, as before).
// Refuses a count that the processes cannot share evenly, or that the batch cannot fill.
Config with_shards(Config config, const Processes& processes, const TrainOptions& options) {
    const fs::path saved_config = fs::path(config.output.dir) / "config.json";
    if (!config.training.shards && options.resume && fs::exists(saved_config)) {
        const json saved = read_json_file(saved_config);
        if (saved.contains("training") && saved["training"].contains("shards") &&
            saved["training"]["shards"].is_number_integer()) {
            config.training.shards = saved["training"]["shards"].get<int64_t>();
        }
    }
    if (!config.training.shards && processes.count() > 1) config.training.shards = processes.count();
    const int64_t shards = config.training.shards.value_or(1), count = processes.count();
    RELGRAD_CHECK(shards % count == 0, "/training/shards ", shards, " cannot be shared by ", count,
                  " processes (each takes as many shards): run on a number of processes that divides it");
    RELGRAD_CHECK(shards <= config.training.batch_size, "/training/shards ", shards,
                  " (one per process) exceeds training.batch_size ", config.training.batch_size,
                  ": a shard holds one example or more");
    return config;
}

// With training.device cuda on several processes, each process of a machine takes a GPU of its
// own: the one its local rank (its number among the processes on its machine, which only a
// launcher sets) names, through CUDA_VISIBLE_DEVICES, set before CUDA starts; unless that is set
// already (by the user, or a scheduler that hands out GPUs). The gradients go through host memory
// for the exchange.
void use_own_gpu() {
    if (std::getenv("CUDA_VISIBLE_DEVICES")) return;
    for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"}) {
        if (const char* local_rank = std::getenv(name)) {
            setenv("CUDA_VISIBLE_DEVICES", local_rank, 1);
            return;
        }
    }
}

std::string file_fingerprint(const fs::path& path) {
    const std::string bytes = read_file(path, "a file the run reads");
    return std::to_string(fingerprint(bytes.data(), bytes.size()));
}

// What the processes of a run must share, checked before it trains: the run (its config less what
// changes none of its numbers), the contents of its data files, the program and the device. Each
// process that differs from rank 0 is named, with what differs first.
void check_processes_agree(const Processes& processes, const Config& config, const json& identity) {
    if (processes.count() == 1) return;
    json mine{{"config", identity},
              {"data", json::object()},
              {"program", file_fingerprint("/proc/self/exe")},
              {"device", device_name(config.training.device)}};
    for (const std::string& file : {config.data.train, config.data.test}) {
        if (!file.empty()) mine["data"][file] = file_fingerprint(file);
    }
    const std::vector<std::string> all = processes.gather(mine.dump());
    const json first = json::parse(all[0]);
    for (int rank = 1; rank < processes.count(); ++rank) {
        const json other = json::parse(all[static_cast<std::size_t>(rank)]);
        std::string data_file;  // the first file whose contents differ
        for (const auto& [file, hash] : other["data"].items()) {
            if (data_file.empty() && (!first["data"].contains(file) || first["data"][file] != hash)) data_file = file;
        }
        const std::pair<const char*, std::string> parts[] = {
            {"config", "another config (" + first_difference(other["config"], first["config"]) + ")"},
            {"data", "another " + data_file},
            {"program", "another program"},
            {"device", "another device"}};
        for (const auto& [part, what] : parts) {
            RELGRAD_CHECK(other[part] == first[part], "rank ", rank, " of ", processes.count(), " has ", what,
                          " than rank 0: the processes of a run need the same config, data files, program and device");
        }
    }
}

}  // namespace

std::vector<std::vector<int64_t>> length_groups(const std::vector<int64_t>& lengths, int64_t group_size) {
    RELGRAD_CHECK(group_size > 0, "length_groups: group_size must be positive");
    std::vector<int64_t> order(lengths.size());
    std::iota(order.begin(), order.end(), int64_t{0});
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return lengths[a] < lengths[b]; });
    std::vector<std::vector<int64_t>> groups;
    for (std::size_t start = 0; start < order.size(); start += static_cast<std::size_t>(group_size)) {
        const std::size_t end = std::min(order.size(), start + static_cast<std::size_t>(group_size));
        if (!groups.empty() && end - start < static_cast<std::size_t>(group_size)) {
            groups.back().insert(groups.back().end(), order.begin() + start, order.begin() + end);  // the rest
        } else {
            groups.emplace_back(order.begin() + start, order.begin() + end);
        }
    }
    return groups;
}

json train(const Config& requested, const TrainOptions& requested_options) {
    // before MPI starts (a CUDA-aware MPI may start CUDA)
    if (requested.training.device == Device::cuda) use_own_gpu();
    // on several processes rank 0 alone writes the run's files and reports
    const Processes& processes = Processes::world();
    backend_for(requested.training.device);  // an unusable device (no GPU) is refused before anything is written
    const Config config = with_shards(requested, processes, requested_options);
    TrainOptions options = requested_options;
    options.progress = options.progress && processes.leader();
    const fs::path out(config.output.dir);
    const json resolved = config.resolved(), identity = run_identity(resolved);
    std::optional<Tokenizer> tokenizer;
    std::optional<OutputDirectory> output;  // rank 0's, its lock held until the run ends
    if (processes.leader()) {
        output.emplace(checked_output_directory(out, resolved, options));
        tokenizer = output->tokenizer;
        if (options.resume) recovered_checkpoint(out);  // a checkpoint cut short, put back before anyone reads
    }
    check_processes_agree(processes, config, identity);  // and the others wait for rank 0's checks
    if (!processes.leader() && options.resume) tokenizer = saved_tokenizer(out, config.task.kind);
    set_thread_count(config.training.threads, "/training/threads");

    Generator init_gen(config.training.seed);
    std::unique_ptr<Task> task = make_task(config, Init{init_gen, DType::float32}, tokenizer);
    RELGRAD_CHECK(config.training.batch_size <= task->train_size(), "/training/batch_size ", config.training.batch_size,
                  " exceeds the ", task->train_size(), " training examples");
    if (options.progress) {
        task->on_evaluation_batch = [](int64_t done, int64_t total) {
            std::fprintf(stderr, "\revaluating: batch %lld/%lld   ", static_cast<long long>(done),
                         static_cast<long long>(total));
        };
    }
    Module& model = task->model();
    model.to(config.training.device);  // before the optimizer, whose state follows the parameters
    AdamW optimizer(without_names(parameter_groups(config, model)), config.training.adamw);
    std::optional<LossScaler> scaler;  // float16's; bfloat16 has float32's range and needs none
    if (config.training.precision == DType::float16) scaler.emplace();
    const LengthBuckets buckets(config.evaluation.length_buckets);
    const int64_t total_steps = config.training.total_steps(task->train_size());  // steps, or from epochs
    const int64_t warmup_steps = config.training.warmup(total_steps);

    LossScaler* const loss_scaler = scaler ? &*scaler : nullptr;
    const bool leader = processes.leader();
    const Start start_at =
        first_step(out, config, resolved, tokenizer, options, total_steps, model, optimizer, loss_scaler, leader);
    const int64_t resumed_at = start_at.step;
    if (processes.count() > 1) {  // each read the checkpoint: the same one, or the steps would not meet
        std::vector<double> steps;
        processes.gather(std::vector<double>{static_cast<double>(resumed_at)}, steps);
        for (std::size_t rank = 1; rank < steps.size(); ++rank) {
            RELGRAD_CHECK(steps[rank] == steps[0], "rank ", rank, " resumes at step ",
                          static_cast<int64_t>(steps[rank]), ", rank 0 at step ", static_cast<int64_t>(steps[0]),
                          ": the processes of a run must read one run directory (output.dir)");
        }
    }
    std::optional<MetricsFile> metrics;
    if (leader) metrics.emplace(out / "metrics.jsonl");
    // on rank 0 alone (the others go on to the next step's gather)
    auto evaluate = [&](int64_t at_step) {
        model.eval();
        json result;
        {
            const ComputeIn compute(model, config.training.precision);
            result = task->evaluate(config.evaluation.batch_size, buckets);
        }
        model.train();
        json line{{"step", at_step}, {"eval", result}};
        // a gated model's gates with every evaluation: their course over training
        if (config.model.transformer.position == PositionMode::gated) line["gates"] = task->gates();
        metrics->append(line);
        return result;
    };
    // the evaluation at step 0, and at the end already for a run resumed there
    json initial, last_eval;
    if (leader) {
        initial = resumed_at == 0 ? evaluate(0) : start_at.evaluations.front();
        if (resumed_at == total_steps) last_eval = start_at.evaluations.back();
    }

    const auto start = Clock::now();
    const Sampler sampler(config.training, *task);
    std::optional<ShardRows> shard_rows;  // with shards: each step's rows, their memory kept
    if (config.training.shards.value_or(1) > 1) shard_rows.emplace(model.parameters());
    int64_t tokens_seen = 0;
    for (int64_t step = resumed_at; step < total_steps; ++step) {
        StepResult result;
        {
            const ProfileInto profiled(step > resumed_at ? options.profile : nullptr);  // after a warm-up step
            result =
                train_step(*task, optimizer, loss_scaler, config.training, processes,
                           shard_rows ? &*shard_rows : nullptr, sampler.draw(step), step, warmup_steps, total_steps);
        }
        tokens_seen += result.tokens;

        const int64_t done = step + 1;
        const double elapsed = seconds_since(start);
        const double tokens_per_second = static_cast<double>(tokens_seen) / std::max(elapsed, 1e-9);
        if (leader && (done % config.training.log_every == 0 || done == total_steps || result.skipped)) {
            log_step(*metrics, done, result, loss_scaler, elapsed, tokens_per_second);
        }
        if (options.progress) {
            const double eta =
                elapsed / static_cast<double>(done - resumed_at) * static_cast<double>(total_steps - done);
            show_progress(done, total_steps, result.loss.item(), tokens_per_second, eta);
        }
        if (leader && (done % config.evaluation.every == 0 || done == total_steps)) {
            last_eval = evaluate(done);
            if (options.progress) std::fprintf(stderr, "\n");
            std::printf("step %lld: test %s %.4g\n", static_cast<long long>(done), task->metric(),
                        last_eval[task->metric()].get<double>());
            std::fflush(stdout);
        }
        bool stop_here =
            done < total_steps && (done == options.stop_after || (options.interrupted && options.interrupted()));
        if (processes.count() > 1) {  // all stop where any one is told to (Ctrl-C reaches each at its own time)
            std::vector<double> told;
            processes.gather(std::vector<double>{stop_here ? 1.0 : 0.0}, told);
            stop_here = std::find(told.begin(), told.end(), 1.0) != told.end();
        }
        if (leader && (done % config.output.checkpoint_every == 0 || done == total_steps || stop_here)) {
            save_checkpoint(out / "checkpoint", model, optimizer, loss_scaler, done, identity);
        }
        if (stop_here) {
            if (options.progress) std::fprintf(stderr, "\n");
            if (!leader) return json{{"rank", processes.rank()}, {"stopped_at", done}};
            return json{{"stopped_at", done}};
        }
    }

    if (!leader) return json{{"rank", processes.rank()}};
    const json summary = summary_of(config, *task, total_steps, initial, last_eval, seconds_since(start), tokens_seen);
    write_json_file(out / "summary.json", summary);
    return summary;
}

}  // namespace relgrad
