#include "train/trainer.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>

#include "engine/autograd.hpp"
#include "engine/system.hpp"
#include "train/make_task.hpp"
#include "train/run_directory.hpp"

namespace relgrad {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// ---------------------------------------------------------------- the output directory

// The first value that differs between two resolved configs, as "/section/key", or "" if none.
std::string first_difference(const json& a, const json& b) {
    for (const auto& [section, values] : a.items()) {
        for (const auto& [key, value] : values.items()) {
            if (!b.contains(section) || !b[section].contains(key) || b[section][key] != value)
                return "/" + section + "/" + key;
        }
    }
    return a == b ? "" : "(a section)";
}

// A fresh run needs an output directory without a run in it. --resume needs an unfinished run
// there, trained with the same config (the directory's name and the thread count aside), and
// returns that run's tokenizer: the ids its checkpoint was trained on.
std::optional<Tokenizer> checked_output_directory(const fs::path& out, const json& resolved,
                                                  const TrainOptions& options) {
    if (!options.resume) {
        if (recovered_checkpoint(out)) {
            throw std::invalid_argument(out.string() +
                                        " already holds a run; pass --resume to continue it or choose "
                                        "another --out");
        }
        return std::nullopt;
    }
    if (!fs::exists(out / "config.json")) throw std::invalid_argument("--resume: no run in " + out.string());
    if (fs::exists(out / "summary.json")) {
        throw std::invalid_argument("--resume: the run in " + out.string() + " is finished (it has summary.json)");
    }
    // read back through the parser, so that a key added to relgrad since has its default
    json saved = Config::parse(read_json_file(out / "config.json"), (out / "config.json").string()).resolved();
    json wanted = resolved;
    for (json* document : {&saved, &wanted}) {
        (*document)["output"].erase("dir");        // the same run, reached by another path
        (*document)["training"].erase("threads");  // changes no number of the run
        (*document)["training"].erase("device");   // nor does the device
    }
    const std::string differs = first_difference(wanted, saved);
    if (!differs.empty()) {
        throw std::invalid_argument("--resume: " + differs + " differs from the config " + out.string() +
                                    " was trained with");
    }
    return saved_tokenizer(out);
}

// The step a run continues from: the checkpoint's for --resume (whose --stop-after must lie
// ahead), else 0, with config.json, tokenizer.json and an empty metrics.jsonl written.
int64_t first_step(const fs::path& out, const json& resolved, const std::optional<Tokenizer>& tokenizer,
                   const TrainOptions& options, Module& model, AdamW& optimizer) {
    fs::create_directories(out);
    if (!options.resume) {
        write_json_file(out / "config.json", resolved);
        if (tokenizer) write_json_file(out / "tokenizer.json", json::parse(tokenizer->to_json()));
        std::ofstream(out / "metrics.jsonl", std::ios::trunc);
        return 0;
    }
    recovered_checkpoint(out);
    const int64_t step = load_checkpoint(out / "checkpoint", model, optimizer);
    if (options.stop_after > 0 && options.stop_after <= step) {
        throw std::invalid_argument("--stop-after " + std::to_string(options.stop_after) +
                                    ": the checkpoint is already at step " + std::to_string(step));
    }
    return step;
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
};

TrainingDiverged diverged(const std::string& what, double value, int64_t step) {
    return TrainingDiverged("training diverged: " + what + " is " + std::to_string(value) + " at step " +
                            std::to_string(step + 1) + " (try a lower learning rate)");
}

// One AdamW step on the batch: the loss, its gradients, clipped. A NaN or infinite loss or
// gradient norm ends the run.
StepResult train_step(Task& task, AdamW& optimizer, const TrainingConfig& training, const Sampler::Draw& batch,
                      int64_t step, int64_t warmup_steps, int64_t total_steps) {
    Module& model = task.model();
    model.reseed(batch.dropout_seed);
    model.zero_grad();
    StepResult result;
    result.loss = task.loss(batch.indices, result.tokens);
    const double loss = result.loss.item();
    if (!std::isfinite(loss)) throw diverged("the loss", loss, step);
    result.loss.backward();
    result.grad_norm = clip_grad_norm(model.parameters(), training.clip_norm);
    if (!std::isfinite(result.grad_norm)) throw diverged("the gradient norm", result.grad_norm, step);
    result.learning_rate = learning_rate(training.schedule, training.learning_rate, step, warmup_steps, total_steps);
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

// A line of metrics.jsonl for a logged step.
void log_step(std::ostream& metrics, int64_t done, const StepResult& result, double seconds, double tokens_per_second) {
    metrics << json{{"step", done},
                    {"loss", result.loss.item()},
                    {"learning_rate", result.learning_rate},
                    {"grad_norm", result.grad_norm},
                    {"seconds", seconds},
                    {"tokens_per_second", tokens_per_second}}
                   .dump()
            << "\n"
            << std::flush;
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

}  // namespace

std::vector<std::vector<int64_t>> length_groups(const std::vector<int64_t>& lengths, int64_t group_size) {
    if (group_size <= 0) throw std::invalid_argument("length_groups: group_size must be positive");
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

json train(const Config& config, const TrainOptions& options) {
    const fs::path out(config.output.dir);
    const json resolved = config.resolved();
    std::optional<Tokenizer> tokenizer = checked_output_directory(out, resolved, options);
    omp_set_num_threads(static_cast<int>(config.training.threads));

    Generator init_gen(config.training.seed);
    std::unique_ptr<Task> task = make_task(config, Init{init_gen, DType::float32}, tokenizer);
    if (config.training.batch_size > task->train_size()) {
        throw std::invalid_argument("/training/batch_size " + std::to_string(config.training.batch_size) +
                                    " exceeds the " + std::to_string(task->train_size()) + " training examples");
    }
    Module& model = task->model();
    model.to(config.training.device);  // before the optimizer, whose state follows the parameters
    AdamW optimizer(model.parameters(), config.training.adamw);
    const LengthBuckets buckets(config.evaluation.length_buckets);
    const int64_t total_steps = config.training.total_steps(task->train_size());  // steps, or from epochs
    const int64_t warmup_steps = config.training.warmup(total_steps);

    const int64_t resumed_at = first_step(out, resolved, tokenizer, options, model, optimizer);
    std::ofstream metrics(out / "metrics.jsonl", std::ios::app);
    auto evaluate = [&](int64_t at_step) {
        model.eval();
        json result = task->evaluate(config.evaluation.batch_size, buckets);
        model.train();
        metrics << json{{"step", at_step}, {"eval", result}}.dump() << "\n" << std::flush;
        return result;
    };
    const json initial = resumed_at == 0 ? evaluate(0) : json();

    const auto start = Clock::now();
    const Sampler sampler(config.training, *task);
    int64_t tokens_seen = 0, step = resumed_at;
    json last_eval;
    for (; step < total_steps; ++step) {
        const StepResult result =
            train_step(*task, optimizer, config.training, sampler.draw(step), step, warmup_steps, total_steps);
        tokens_seen += result.tokens;

        const int64_t done = step + 1;
        const double elapsed = seconds_since(start);
        const double tokens_per_second = static_cast<double>(tokens_seen) / std::max(elapsed, 1e-9);
        if (done % config.training.log_every == 0 || done == total_steps) {
            log_step(metrics, done, result, elapsed, tokens_per_second);
        }
        if (options.progress) {
            const double eta =
                elapsed / static_cast<double>(done - resumed_at) * static_cast<double>(total_steps - done);
            show_progress(done, total_steps, result.loss.item(), tokens_per_second, eta);
        }
        if (done % config.evaluation.every == 0 || done == total_steps) {
            last_eval = evaluate(done);
            if (options.progress) std::fprintf(stderr, "\n");
            std::printf("step %lld: test %s %.4g\n", static_cast<long long>(done), task->metric(),
                        last_eval[task->metric()].get<double>());
            std::fflush(stdout);
        }
        if (done % config.output.checkpoint_every == 0 || done == total_steps || done == options.stop_after) {
            save_checkpoint(out / "checkpoint", model, optimizer, done);
        }
        if (done == options.stop_after && done < total_steps) {
            if (options.progress) std::fprintf(stderr, "\n");
            return json{{"stopped_at", done}};
        }
    }
    if (last_eval.is_null()) last_eval = evaluate(step);  // resumed at the end already

    const json summary = summary_of(config, *task, total_steps, initial, last_eval, seconds_since(start), tokens_seen);
    write_json_file(out / "summary.json", summary);
    return summary;
}

}  // namespace relgrad
