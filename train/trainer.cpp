#include "train/trainer.hpp"

#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "engine/autograd.hpp"
#include "engine/ops.hpp"
#include "train/datasets.hpp"
#include "train/metrics.hpp"
#include "train/tokenizer.hpp"

namespace relgrad {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// ---------------------------------------------------------------- batches

// Rows padded with Tokenizer::pad to the longest: int64 [B, L] and the true lengths.
struct Padded {
    Tensor ids;
    std::vector<int64_t> lengths;
};

Padded pad_rows(const std::vector<std::vector<int64_t>>& rows) {
    int64_t longest = 1;
    for (const auto& row : rows) longest = std::max<int64_t>(longest, static_cast<int64_t>(row.size()));
    std::vector<double> ids(rows.size() * longest, static_cast<double>(Tokenizer::pad));
    std::vector<int64_t> lengths;
    for (std::size_t b = 0; b < rows.size(); ++b) {
        for (std::size_t j = 0; j < rows[b].size(); ++j) ids[b * longest + j] = static_cast<double>(rows[b][j]);
        lengths.push_back(static_cast<int64_t>(rows[b].size()));
    }
    return {from_vector(ids, {static_cast<int64_t>(rows.size()), longest}, DType::int64), lengths};
}

// The argmax over the last dim of a [..., C] tensor, one per row.
std::vector<int64_t> argmax_rows(const Tensor& logits) {
    const std::vector<double> values = logits.to_vector();
    const int64_t C = logits.size(-1);
    std::vector<int64_t> best;
    for (std::size_t row = 0; row * C < values.size(); ++row) {
        const auto start = values.begin() + static_cast<std::ptrdiff_t>(row * C);
        best.push_back(std::max_element(start, start + C) - start);
    }
    return best;
}

// ---------------------------------------------------------------- tasks

// What differs between tasks: the model, the loss on a batch, the evaluation.
class Task {
public:
    virtual ~Task() = default;
    virtual Module& model() = 0;
    virtual int64_t train_size() const = 0;
    // The mean loss over the examples `indices` of the training set; `tokens` receives how many
    // tokens the batch held.
    virtual Tensor loss(const std::vector<int64_t>& indices, int64_t& tokens) = 0;
    // Metrics on the test set: {"accuracy": ..., "by_length": {...}, ...}
    virtual json evaluate(int64_t batch_size, const LengthBuckets& buckets) = 0;
    virtual std::vector<std::vector<double>> gates() const = 0;
};

json by_length(const LengthBuckets& buckets, const std::vector<int64_t>& hits, const std::vector<int64_t>& counts) {
    json out = json::object();
    for (int64_t b = 0; b < buckets.count(); ++b) {
        if (counts[b] > 0) {
            out[buckets.name(b)] = {{"accuracy", static_cast<double>(hits[b]) / static_cast<double>(counts[b])},
                                    {"examples", counts[b]}};
        }
    }
    return out;
}

// relative_order: a SequenceClassifier over the token sequence, two classes.
class ClassificationTask : public Task {
public:
    ClassificationTask(const Config& c, const Init& init)
        : model_(c.task.vocab, 2, c.model.transformer, c.model.pooling, init),
          train_(make_relative_order_task(c.task.train_examples, c.task.train_lengths[0], c.task.train_lengths[1],
                                          c.task.vocab, c.task.distance, c.training.seed)),
          test_(make_relative_order_task(c.task.test_examples, c.task.test_lengths[0], c.task.test_lengths[1],
                                         c.task.vocab, c.task.distance, c.training.seed + 1)) {}

    Module& model() override { return model_; }
    int64_t train_size() const override { return static_cast<int64_t>(train_.size()); }
    std::vector<std::vector<double>> gates() const override { return model_.gates(); }

    Tensor loss(const std::vector<int64_t>& indices, int64_t& tokens) override {
        std::vector<std::vector<int64_t>> rows;
        std::vector<double> labels;
        for (int64_t i : indices) {
            rows.push_back(train_[i].tokens);
            labels.push_back(static_cast<double>(train_[i].label));
        }
        const Padded batch = pad_rows(rows);
        tokens = 0;
        for (int64_t n : batch.lengths) tokens += n;
        const Tensor logits = model_.forward(batch.ids, batch.lengths);
        return cross_entropy(logits, from_vector(labels, {static_cast<int64_t>(labels.size())}, DType::int64));
    }

    json evaluate(int64_t batch_size, const LengthBuckets& buckets) override {
        NoGradGuard no_grad;
        std::vector<int64_t> hits(buckets.count()), counts(buckets.count());
        int64_t correct = 0;
        for (std::size_t start = 0; start < test_.size(); start += batch_size) {
            std::vector<std::vector<int64_t>> rows;
            for (std::size_t i = start; i < std::min(test_.size(), start + batch_size); ++i) rows.push_back(test_[i].tokens);
            const Padded batch = pad_rows(rows);
            const std::vector<int64_t> predicted = argmax_rows(model_.forward(batch.ids, batch.lengths));
            for (std::size_t r = 0; r < rows.size(); ++r) {
                const bool hit = predicted[r] == test_[start + r].label;
                const int64_t bucket = buckets.bucket_of(static_cast<int64_t>(rows[r].size()));
                correct += hit;
                hits[bucket] += hit;
                counts[bucket] += 1;
            }
        }
        return {{"accuracy", static_cast<double>(correct) / static_cast<double>(test_.size())},
                {"by_length", by_length(buckets, hits, counts)}};
    }

private:
    SequenceClassifier model_;
    std::vector<LabeledTokens> train_, test_;
};

// copy and reverse: an EncoderDecoder; the decoder reads bos + target and predicts target + eos.
class SequencePairTask : public Task {
public:
    SequencePairTask(const Config& c, const Init& init)
        : model_(c.task.vocab, c.task.vocab, c.model.transformer, init),
          train_(make(c, c.task.train_examples, c.task.train_lengths, c.training.seed)),
          test_(make(c, c.task.test_examples, c.task.test_lengths, c.training.seed + 1)) {}

    Module& model() override { return model_; }
    int64_t train_size() const override { return static_cast<int64_t>(train_.size()); }
    std::vector<std::vector<double>> gates() const override { return model_.gates(); }

    Tensor loss(const std::vector<int64_t>& indices, int64_t& tokens) override {
        std::vector<std::vector<int64_t>> sources, inputs, outputs;
        for (int64_t i : indices) {
            sources.push_back(train_[i].source);
            inputs.push_back(with_bos(train_[i].target));
            outputs.push_back(with_eos(train_[i].target));
        }
        const Padded source = pad_rows(sources), input = pad_rows(inputs), output = pad_rows(outputs);
        tokens = 0;
        for (std::size_t b = 0; b < sources.size(); ++b) tokens += source.lengths[b] + input.lengths[b];
        const Tensor logits = model_.forward(source.ids, source.lengths, input.ids, input.lengths);
        const int64_t V = logits.size(-1);
        return cross_entropy(logits.reshape({-1, V}), output.ids.reshape({-1}), Tokenizer::pad);
    }

    json evaluate(int64_t batch_size, const LengthBuckets& buckets) override {
        NoGradGuard no_grad;
        std::vector<int64_t> hits(buckets.count()), counts(buckets.count());
        std::vector<std::vector<std::string>> hypotheses, references;
        int64_t exact = 0, token_hits = 0, token_count = 0;
        for (std::size_t start = 0; start < test_.size(); start += batch_size) {
            const std::size_t end = std::min(test_.size(), start + batch_size);
            std::vector<std::vector<int64_t>> sources;
            int64_t longest = 0;
            for (std::size_t i = start; i < end; ++i) {
                sources.push_back(test_[i].source);
                longest = std::max<int64_t>(longest, static_cast<int64_t>(test_[i].target.size()));
            }
            const std::vector<std::vector<int64_t>> predicted = greedy_decode(sources, longest + 1);
            for (std::size_t r = 0; r < sources.size(); ++r) {
                const std::vector<int64_t>& target = test_[start + r].target;
                const bool hit = predicted[r] == target;
                const int64_t bucket = buckets.bucket_of(static_cast<int64_t>(sources[r].size()));
                exact += hit;
                hits[bucket] += hit;
                counts[bucket] += 1;
                for (std::size_t j = 0; j < target.size(); ++j) {
                    token_hits += j < predicted[r].size() && predicted[r][j] == target[j];
                }
                token_count += static_cast<int64_t>(target.size());
                hypotheses.push_back(as_words(predicted[r]));
                references.push_back(as_words(target));
            }
        }
        return {{"accuracy", static_cast<double>(exact) / static_cast<double>(test_.size())},
                {"token_accuracy", static_cast<double>(token_hits) / static_cast<double>(token_count)},
                {"bleu", corpus_bleu(hypotheses, references)},
                {"by_length", by_length(buckets, hits, counts)}};
    }

private:
    static std::vector<TokenPair> make(const Config& c, int64_t count, const std::vector<int64_t>& lengths, uint64_t seed) {
        return c.task.kind == TaskKind::copy ? make_copy_task(count, lengths[0], lengths[1], c.task.vocab, seed)
                                             : make_reverse_task(count, lengths[0], lengths[1], c.task.vocab, seed);
    }
    static std::vector<int64_t> with_bos(std::vector<int64_t> t) {
        t.insert(t.begin(), Tokenizer::bos);
        return t;
    }
    static std::vector<int64_t> with_eos(std::vector<int64_t> t) {
        t.push_back(Tokenizer::eos);
        return t;
    }
    static std::vector<std::string> as_words(const std::vector<int64_t>& ids) {
        std::vector<std::string> words;
        for (int64_t id : ids) words.push_back(std::to_string(id));
        return words;
    }

    // Greedy decoding: feed bos, append the most likely next token, until eos or max_steps. The
    // decoder is run on the whole prefix each step (no cache), so every position sees exactly the
    // relative distances it saw in training.
    std::vector<std::vector<int64_t>> greedy_decode(const std::vector<std::vector<int64_t>>& sources, int64_t max_steps) {
        const Padded source = pad_rows(sources);
        const Tensor memory = model_.encode(source.ids, source.lengths);
        const std::size_t B = sources.size();
        std::vector<std::vector<int64_t>> prefixes(B, std::vector<int64_t>{Tokenizer::bos});
        std::vector<bool> done(B, false);
        for (int64_t step = 0; step < max_steps; ++step) {
            const Padded input = pad_rows(prefixes);
            const Tensor logits = model_.decode(input.ids, input.lengths, memory, source.lengths);
            const std::vector<int64_t> next = argmax_rows(logits.narrow(1, step, 1));
            bool all_done = true;
            for (std::size_t b = 0; b < B; ++b) {
                if (!done[b] && next[b] == Tokenizer::eos) done[b] = true;
                prefixes[b].push_back(done[b] ? Tokenizer::pad : next[b]);
                all_done = all_done && done[b];
            }
            if (all_done) break;
        }
        std::vector<std::vector<int64_t>> out;
        for (const auto& prefix : prefixes) {
            std::vector<int64_t> tokens;
            for (std::size_t j = 1; j < prefix.size() && prefix[j] != Tokenizer::pad; ++j) tokens.push_back(prefix[j]);
            out.push_back(tokens);
        }
        return out;
    }

    EncoderDecoder model_;
    std::vector<TokenPair> train_, test_;
};

std::unique_ptr<Task> make_task(const Config& c, const Init& init) {
    if (c.task.kind == TaskKind::relative_order) return std::make_unique<ClassificationTask>(c, init);
    return std::make_unique<SequencePairTask>(c, init);
}

// ---------------------------------------------------------------- files

double peak_rss_mib() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

void write_json(const fs::path& path, const json& value) {
    const fs::path partial = path.string() + ".partial";
    std::ofstream(partial) << value.dump(2) << "\n";
    fs::rename(partial, path);
}

// checkpoint/ = model/ + optimizer/ + state.json, written beside it and swapped in whole.
void save_checkpoint(const fs::path& dir, const Module& model, const AdamW& optimizer, int64_t step) {
    const fs::path partial = dir.string() + ".partial", previous = dir.string() + ".previous";
    fs::remove_all(partial);
    fs::create_directories(partial);
    model.save((partial / "model").string());
    optimizer.save((partial / "optimizer").string());
    std::ofstream(partial / "state.json") << json{{"step", step}}.dump() << "\n";
    fs::remove_all(previous);
    if (fs::exists(dir)) fs::rename(dir, previous);
    fs::rename(partial, dir);
    fs::remove_all(previous);
}

int64_t load_checkpoint(const fs::path& dir, Module& model, AdamW& optimizer) {
    if (!fs::exists(dir / "state.json")) {
        throw std::invalid_argument("--resume: no checkpoint in " + dir.string());
    }
    model.load((dir / "model").string());
    optimizer.load((dir / "optimizer").string());
    std::ifstream in(dir / "state.json");
    return json::parse(in).at("step").get<int64_t>();
}

std::string duration(double seconds) {
    const auto s = static_cast<int64_t>(seconds + 0.5);
    char text[32];
    std::snprintf(text, sizeof text, "%lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
    return text;
}

}  // namespace

json train(const Config& config, const TrainOptions& options) {
    const fs::path out(config.output.dir);
    const json resolved = config.resolved();
    if (options.resume) {
        if (!fs::exists(out / "config.json")) throw std::invalid_argument("--resume: no run in " + out.string());
        std::ifstream in(out / "config.json");
        if (json::parse(in) != resolved) {
            throw std::invalid_argument("--resume: the config differs from the one " + out.string() + " was trained with");
        }
    } else if (fs::exists(out / "checkpoint")) {
        throw std::invalid_argument(out.string() + " already holds a run; pass --resume to continue it or choose "
                                    "another --out");
    }
    omp_set_num_threads(static_cast<int>(config.training.threads));

    Generator init_gen(config.training.seed);
    std::unique_ptr<Task> task = make_task(config, Init{init_gen, DType::float32});
    Module& model = task->model();
    AdamW optimizer(model.parameters(), config.training.adamw);
    const LengthBuckets buckets(config.evaluation.length_buckets);

    fs::create_directories(out);
    int64_t step = 0;
    if (options.resume) {
        step = load_checkpoint(out / "checkpoint", model, optimizer);
    } else {
        write_json(out / "config.json", resolved);
        std::ofstream(out / "metrics.jsonl", std::ios::trunc);
    }
    std::ofstream metrics(out / "metrics.jsonl", std::ios::app);

    auto evaluate = [&](int64_t at_step) {
        model.eval();
        json result = task->evaluate(config.evaluation.batch_size, buckets);
        model.train();
        metrics << json{{"step", at_step}, {"eval", result}}.dump() << "\n" << std::flush;
        return result;
    };
    const json initial = step == 0 ? evaluate(0) : json();

    const auto start = std::chrono::steady_clock::now();
    int64_t tokens_seen = 0, steps_run = 0;
    const int64_t batch = std::min(config.training.batch_size, task->train_size());
    json last_eval;
    for (; step < config.training.steps; ++step) {
        // the batch and the dropout masks of a step depend on (seed, step) alone
        Generator sampler(config.training.seed * 1000003 + static_cast<uint64_t>(step));
        std::vector<int64_t> indices;
        for (int64_t i = 0; i < batch; ++i) indices.push_back(static_cast<int64_t>(sampler.next_u64() % task->train_size()));
        model.reseed(sampler.next_u64());

        model.zero_grad();
        int64_t tokens = 0;
        const Tensor loss = task->loss(indices, tokens);
        const double loss_value = loss.item();
        if (!std::isfinite(loss_value)) {
            throw TrainingDiverged("training diverged: the loss is " + std::to_string(loss_value) + " at step " +
                                     std::to_string(step + 1) + " (try a lower learning rate)");
        }
        loss.backward();
        const double grad_norm = clip_grad_norm(model.parameters(), config.training.clip_norm);
        const double lr = learning_rate(config.training.schedule, config.training.learning_rate, step,
                                        config.training.warmup_steps, config.training.steps);
        optimizer.step(lr);
        tokens_seen += tokens;
        ++steps_run;

        const int64_t done = step + 1;
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const double tokens_per_second = static_cast<double>(tokens_seen) / std::max(elapsed, 1e-9);
        if (done % config.training.log_every == 0 || done == config.training.steps) {
            metrics << json{{"step", done}, {"loss", loss_value}, {"learning_rate", lr}, {"grad_norm", grad_norm},
                            {"tokens_per_second", tokens_per_second}}.dump()
                    << "\n" << std::flush;
        }
        if (options.progress) {
            const double eta = elapsed / static_cast<double>(steps_run) * static_cast<double>(config.training.steps - done);
            std::fprintf(stderr, "\rstep %lld/%lld  loss %.4f  %.0f tok/s  ETA %s   ", static_cast<long long>(done),
                         static_cast<long long>(config.training.steps), loss_value, tokens_per_second, duration(eta).c_str());
        }
        if (done % config.evaluation.every == 0 || done == config.training.steps) {
            last_eval = evaluate(done);
            if (options.progress) std::fprintf(stderr, "\n");
            std::printf("step %lld: test accuracy %.3f\n", static_cast<long long>(done), last_eval["accuracy"].get<double>());
            std::fflush(stdout);
        }
        if (done % config.output.checkpoint_every == 0 || done == config.training.steps || done == options.stop_after) {
            save_checkpoint(out / "checkpoint", model, optimizer, done);
        }
        if (done == options.stop_after && done < config.training.steps) {
            if (options.progress) std::fprintf(stderr, "\n");
            return json{{"stopped_at", done}};
        }
    }
    if (last_eval.is_null()) last_eval = evaluate(step);  // resumed at the end already

    const double train_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    json summary = {{"task", task_kind_name(config.task.kind)},
                    {"position", position_mode_name(config.model.transformer.position)},
                    {"steps", config.training.steps},
                    {"parameters", model.parameter_count()},
                    {"final", last_eval},
                    {"train_seconds", train_seconds},
                    {"tokens_per_second", static_cast<double>(tokens_seen) / std::max(train_seconds, 1e-9)},
                    {"peak_rss_mib", peak_rss_mib()}};
    if (!initial.is_null()) summary["initial"] = initial;
    if (config.model.transformer.position == PositionMode::gated) summary["gates"] = task->gates();
    write_json(out / "summary.json", summary);
    return summary;
}

}  // namespace relgrad
