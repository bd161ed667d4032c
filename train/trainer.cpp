#include "train/trainer.hpp"

#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <numeric>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "engine/autograd.hpp"
#include "engine/npy.hpp"
#include "engine/ops.hpp"
#include "train/datasets.hpp"
#include "train/fetch.hpp"
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
    // what a training example pads to: its tokens (for pairs, the longer side)
    virtual int64_t train_length(int64_t i) const = 0;
    // The mean loss over the examples `indices` of the training set; `tokens` receives how many
    // tokens the batch held.
    virtual Tensor loss(const std::vector<int64_t>& indices, int64_t& tokens) = 0;
    // Metrics on the test set: {"accuracy": ..., "by_length": {...}, ...}
    virtual json evaluate(int64_t batch_size, const LengthBuckets& buckets) = 0;
    virtual std::vector<std::vector<double>> gates() const = 0;
    virtual const char* metric() const = 0;  // the headline number of evaluate()
    // Greedy output for one prompt: a continuation (language model) or a target (pairs).
    virtual std::vector<int64_t> generate(const std::vector<int64_t>& prompt, int64_t max_tokens) {
        (void)prompt;
        (void)max_tokens;
        throw std::invalid_argument("generate: a classifier generates nothing; use relgrad eval");
    }
    // The self-attention weights of every layer of the (encoder) stack for one input: [H, L, L] each.
    virtual std::vector<Tensor> attention(const std::vector<int64_t>& tokens) = 0;
};

// One sequence as a batch of one.
Tensor single(const std::vector<int64_t>& tokens) {
    return from_vector(std::vector<double>(tokens.begin(), tokens.end()), {1, static_cast<int64_t>(tokens.size())},
                       DType::int64);
}

// The attention weights the last forward left in each layer of a stack.
std::vector<Tensor> weights_of(const Encoder& stack) {
    std::vector<Tensor> weights;
    for (const auto& layer : stack.layers) weights.push_back(layer->self_attention->last_weights.squeeze(0));
    return weights;
}

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

// relative_order and classification: a SequenceClassifier over the token sequence.
class ClassificationTask : public Task {
public:
    ClassificationTask(const Config& c, int64_t vocab, int64_t classes, std::vector<LabeledTokens> train,
                       std::vector<LabeledTokens> test, const Init& init)
        : model_(vocab, classes, c.model.transformer, c.model.pooling, init),
          train_(std::move(train)),
          test_(std::move(test)) {}

    const char* metric() const override { return "accuracy"; }
    Module& model() override { return model_; }
    std::vector<Tensor> attention(const std::vector<int64_t>& tokens) override {
        model_.forward(single(tokens), {static_cast<int64_t>(tokens.size())});
        return weights_of(model_.encoder);
    }
    int64_t train_size() const override { return static_cast<int64_t>(train_.size()); }
    int64_t train_length(int64_t i) const override { return static_cast<int64_t>(train_[i].tokens.size()); }
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
            for (std::size_t i = start; i < std::min(test_.size(), start + batch_size); ++i)
                rows.push_back(test_[i].tokens);
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

// copy, reverse and pairs: an EncoderDecoder; the decoder reads bos + target and predicts
// target + eos.
class SequencePairTask : public Task {
public:
    SequencePairTask(const Config& c, int64_t vocab, std::vector<TokenPair> train, std::vector<TokenPair> test,
                     const Init& init)
        : model_(vocab, vocab, c.model.transformer, init), train_(std::move(train)), test_(std::move(test)) {}

    const char* metric() const override { return "bleu"; }
    Module& model() override { return model_; }
    std::vector<Tensor> attention(const std::vector<int64_t>& tokens) override {  // the encoder's, on the source
        model_.encode(single(tokens), {static_cast<int64_t>(tokens.size())});
        return weights_of(model_.encoder);
    }
    int64_t train_size() const override { return static_cast<int64_t>(train_.size()); }
    int64_t train_length(int64_t i) const override {
        return static_cast<int64_t>(std::max(train_[i].source.size(), train_[i].target.size() + 1));
    }
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

    // exact match, token accuracy and BLEU (sequence_scores), over the test set and per
    // source-length bucket
    json evaluate(int64_t batch_size, const LengthBuckets& buckets) override {
        NoGradGuard no_grad;
        std::vector<std::vector<int64_t>> outputs, targets;
        std::vector<int64_t> bucket_of_example;
        for (std::size_t start = 0; start < test_.size(); start += batch_size) {
            const std::size_t end = std::min(test_.size(), start + batch_size);
            std::vector<std::vector<int64_t>> sources;
            int64_t longest = 0;
            for (std::size_t i = start; i < end; ++i) {
                sources.push_back(test_[i].source);
                longest = std::max<int64_t>(longest, static_cast<int64_t>(test_[i].target.size()));
                targets.push_back(test_[i].target);
                bucket_of_example.push_back(buckets.bucket_of(static_cast<int64_t>(test_[i].source.size())));
            }
            for (auto& output : greedy_decode(sources, longest + 1)) outputs.push_back(std::move(output));
        }
        auto scores = [](const std::vector<std::vector<int64_t>>& out, const std::vector<std::vector<int64_t>>& tgt) {
            const SequenceScores s = sequence_scores(out, tgt, Tokenizer::unk);
            return json{{"accuracy", s.accuracy}, {"token_accuracy", s.token_accuracy}, {"bleu", s.bleu}};
        };
        json result = scores(outputs, targets);
        result["by_length"] = json::object();
        for (int64_t b = 0; b < buckets.count(); ++b) {
            std::vector<std::vector<int64_t>> bucket_outputs, bucket_targets;
            for (std::size_t i = 0; i < outputs.size(); ++i) {
                if (bucket_of_example[i] != b) continue;
                bucket_outputs.push_back(outputs[i]);
                bucket_targets.push_back(targets[i]);
            }
            if (bucket_outputs.empty()) continue;
            result["by_length"][buckets.name(b)] = scores(bucket_outputs, bucket_targets);
            result["by_length"][buckets.name(b)]["examples"] = static_cast<int64_t>(bucket_outputs.size());
        }
        return result;
    }

private:
    static std::vector<int64_t> with_bos(std::vector<int64_t> t) {
        t.insert(t.begin(), Tokenizer::bos);
        return t;
    }
    static std::vector<int64_t> with_eos(std::vector<int64_t> t) {
        t.push_back(Tokenizer::eos);
        return t;
    }

public:
    // Greedy decoding: feed bos, append the most likely next token, until eos or max_steps. One
    // token at a time with a key/value cache; each new query gets its true position, so the
    // relative distances are those of a full pass (tests/layers/test_transformer.cpp checks it).
    std::vector<std::vector<int64_t>> greedy_decode(const std::vector<std::vector<int64_t>>& sources,
                                                    int64_t max_steps) {
        NoGradGuard no_grad;
        const Padded source = pad_rows(sources);
        const Tensor memory = model_.encode(source.ids, source.lengths);
        const std::size_t B = sources.size();
        std::vector<std::vector<int64_t>> out(B);
        std::vector<bool> done(B, false);
        std::vector<KVCache> caches;
        std::vector<double> last(B, static_cast<double>(Tokenizer::bos));
        for (int64_t step = 0; step < max_steps; ++step) {
            const Tensor input = from_vector(last, {static_cast<int64_t>(B), 1}, DType::int64);
            const std::vector<int64_t> next =
                argmax_rows(model_.decode_incremental(input, caches, memory, source.lengths));
            bool all_done = true;
            for (std::size_t b = 0; b < B; ++b) {
                if (!done[b] && next[b] == Tokenizer::eos) done[b] = true;
                if (!done[b]) out[b].push_back(next[b]);
                last[b] = static_cast<double>(next[b]);
                all_done = all_done && done[b];
            }
            if (all_done) break;
        }
        return out;
    }

    std::vector<int64_t> generate(const std::vector<int64_t>& prompt, int64_t max_tokens) override {
        return greedy_decode({prompt}, max_tokens)[0];
    }

private:
    EncoderDecoder model_;
    std::vector<TokenPair> train_, test_;
};

// language_model: a CausalLanguageModel over chunks of the token stream, each position
// predicting the next token.
class LanguageModelTask : public Task {
public:
    LanguageModelTask(const Config& c, int64_t vocab, std::vector<std::vector<int64_t>> train,
                      std::vector<std::vector<int64_t>> test, bool characters, const Init& init)
        : model_(vocab, c.model.transformer, init),
          train_(std::move(train)),
          test_(std::move(test)),
          characters_(characters) {}

    const char* metric() const override { return "perplexity"; }
    Module& model() override { return model_; }
    std::vector<Tensor> attention(const std::vector<int64_t>& tokens) override {
        model_.forward(single(tokens), {static_cast<int64_t>(tokens.size())});
        return weights_of(model_.decoder);
    }
    int64_t train_size() const override { return static_cast<int64_t>(train_.size()); }
    int64_t train_length(int64_t i) const override { return static_cast<int64_t>(train_[i].size()); }
    std::vector<std::vector<double>> gates() const override { return model_.gates(); }

    Tensor loss(const std::vector<int64_t>& indices, int64_t& tokens) override {
        std::vector<std::vector<int64_t>> chunks;
        for (int64_t i : indices) chunks.push_back(train_[i]);
        Tensor labels;
        const Tensor logits = forward(chunks, labels, tokens);
        return cross_entropy(logits.reshape({-1, logits.size(-1)}), labels.reshape({-1}), Tokenizer::pad);
    }

    // perplexity (and bits per character for a character tokenizer) over the test stream, and
    // per position bucket: how well a position predicts its next token, by how far in it is
    json evaluate(int64_t batch_size, const LengthBuckets& buckets) override {
        NoGradGuard no_grad;
        std::vector<double> nll(buckets.count());
        std::vector<int64_t> counts(buckets.count());
        double total = 0;
        int64_t total_tokens = 0;
        for (std::size_t start = 0; start < test_.size(); start += batch_size) {
            const std::vector<std::vector<int64_t>> chunks(test_.begin() + start,
                                                           test_.begin() + std::min(test_.size(), start + batch_size));
            Tensor labels;
            int64_t tokens = 0;
            const Tensor logits = forward(chunks, labels, tokens);
            // log p(label) at every position (padding is id 0, a valid index, skipped below)
            const std::vector<double> picked = gather(log_softmax(logits, -1), 2, labels.unsqueeze(-1)).to_vector();
            const std::vector<double> label_values = labels.to_vector();
            const int64_t L = labels.size(1);
            for (std::size_t n = 0; n < picked.size(); ++n) {
                if (label_values[n] == Tokenizer::pad) continue;
                const int64_t bucket = buckets.bucket_of(static_cast<int64_t>(n % L) + 1);
                nll[bucket] -= picked[n];
                counts[bucket] += 1;
                total -= picked[n];
                total_tokens += 1;
            }
        }
        json by_length = json::object();
        for (int64_t b = 0; b < buckets.count(); ++b) {
            if (counts[b] == 0) continue;
            json& bucket = by_length[buckets.name(b)];
            bucket = {{"perplexity", perplexity(nll[b], counts[b])}, {"tokens", counts[b]}};
            if (characters_) bucket["bits_per_char"] = bits_per_char(nll[b], counts[b]);
        }
        json result = {
            {"perplexity", perplexity(total, total_tokens)}, {"tokens", total_tokens}, {"by_length", by_length}};
        if (characters_) result["bits_per_char"] = bits_per_char(total, total_tokens);
        return result;
    }

    // the prompt, then one greedy token at a time with a key/value cache
    std::vector<int64_t> generate(const std::vector<int64_t>& prompt, int64_t max_tokens) override {
        NoGradGuard no_grad;
        if (prompt.empty()) throw std::invalid_argument("generate: the prompt is empty");
        std::vector<KVCache> caches;
        std::vector<double> input(prompt.begin(), prompt.end());
        std::vector<int64_t> out;
        for (int64_t step = 0; step < max_tokens; ++step) {
            const Tensor logits = model_.forward_incremental(
                from_vector(input, {1, static_cast<int64_t>(input.size())}, DType::int64), caches);
            const int64_t next = argmax_rows(logits.narrow(1, logits.size(1) - 1, 1))[0];
            if (next == Tokenizer::eos) break;
            out.push_back(next);
            input = {static_cast<double>(next)};
        }
        return out;
    }

private:
    // inputs chunk[:-1], labels chunk[1:] (pad beyond a chunk's end)
    Tensor forward(const std::vector<std::vector<int64_t>>& chunks, Tensor& labels, int64_t& tokens) {
        std::vector<std::vector<int64_t>> inputs, targets;
        tokens = 0;
        for (const auto& chunk : chunks) {
            inputs.emplace_back(chunk.begin(), chunk.end() - 1);
            targets.emplace_back(chunk.begin() + 1, chunk.end());
            tokens += static_cast<int64_t>(chunk.size()) - 1;
        }
        const Padded input = pad_rows(inputs);
        labels = pad_rows(targets).ids;
        return model_.forward(input.ids, input.lengths);
    }

    CausalLanguageModel model_;
    std::vector<std::vector<int64_t>> train_, test_;
    bool characters_;
};

// ---------------------------------------------------------------- data

std::vector<int64_t> truncated(std::vector<int64_t> ids, int64_t max_length) {
    if (static_cast<int64_t>(ids.size()) > max_length) ids.resize(max_length);
    if (ids.empty()) ids.push_back(Tokenizer::unk);  // an empty text still needs a position
    return ids;
}

// "data:NAME/FILE" names a file of a fetched data set in the data cache (relgrad data fetch).
std::string resolve_data_path(const std::string& path) {
    if (path.rfind("data:", 0) != 0) return path;
    const std::string resolved = default_data_dir() + "/" + path.substr(5);
    if (!fs::exists(resolved)) {
        const std::string name = path.substr(5, path.find('/', 5) - 5);
        throw std::invalid_argument(path + ": " + resolved + " does not exist; run 'relgrad data fetch " + name +
                                    "' first");
    }
    return resolved;
}

DataConfig with_data_paths_resolved(DataConfig d) {
    d.train = resolve_data_path(d.train);
    if (!d.test.empty()) d.test = resolve_data_path(d.test);
    return d;
}

// Training and test examples from the data section: the test file, or a held-out part of train.
template <class T, class Read>
std::pair<std::vector<T>, std::vector<T>> read_split(const DataConfig& d, uint64_t seed, Read read) {
    std::vector<T> train = read(d.train);
    if (!d.test.empty()) return {std::move(train), read(d.test)};
    return split_held_out(std::move(train), d.held_out, seed);
}

// data.train_max_tokens: the training examples whose text has at most that many tokens (all when
// it is 0); none left is an error that names the key.
template <class T, class Length>
std::vector<T> short_enough(std::vector<T> examples, const DataConfig& d, Length tokens) {
    if (d.train_max_tokens == 0) return examples;
    std::vector<T> kept;
    for (T& example : examples)
        if (tokens(example) <= d.train_max_tokens) kept.push_back(std::move(example));
    if (kept.empty()) {
        throw std::invalid_argument("data.train_max_tokens = " + std::to_string(d.train_max_tokens) +
                                    " leaves no training example of " + d.train);
    }
    return kept;
}

// The task and, for the file tasks, the tokenizer: the one given (a trained run's), or one built
// from the training texts.
std::unique_ptr<Task> make_task(const Config& c, const Init& init, std::optional<Tokenizer>& tokenizer) {
    const TaskConfig& t = c.task;
    const uint64_t seed = c.training.seed;
    switch (t.kind) {
        case TaskKind::relative_order:
            return std::make_unique<ClassificationTask>(
                c, t.vocab, 2,
                make_relative_order_task(t.train_examples, t.train_lengths[0], t.train_lengths[1], t.vocab, t.distance,
                                         seed),
                make_relative_order_task(t.test_examples, t.test_lengths[0], t.test_lengths[1], t.vocab, t.distance,
                                         seed + 1),
                init);
        case TaskKind::copy:
        case TaskKind::reverse: {
            const auto make = t.kind == TaskKind::copy ? make_copy_task : make_reverse_task;
            return std::make_unique<SequencePairTask>(
                c, t.vocab, make(t.train_examples, t.train_lengths[0], t.train_lengths[1], t.vocab, seed),
                make(t.test_examples, t.test_lengths[0], t.test_lengths[1], t.vocab, seed + 1), init);
        }
        default: break;
    }
    const DataConfig d = with_data_paths_resolved(c.data);
    const Tokenizer::Kind kind = parse_tokenizer_kind(d.tokenizer);
    const TextOptions text_options{d.lowercase, d.split_punctuation};
    if (t.kind == TaskKind::classification) {
        auto [train, test] = read_split<LabeledText>(d, seed, read_classification);
        std::vector<std::string> texts, labels;
        for (const auto& example : train) texts.push_back(example.text);
        for (const auto& example : train) labels.push_back(example.label);
        std::sort(labels.begin(), labels.end());
        labels.erase(std::unique(labels.begin(), labels.end()), labels.end());
        if (!tokenizer) tokenizer = Tokenizer::build(kind, texts, d.min_frequency, text_options);
        auto encode = [&](const std::vector<LabeledText>& examples, const std::string& where) {
            std::vector<LabeledTokens> out;
            for (const auto& example : examples) {
                const auto found = std::lower_bound(labels.begin(), labels.end(), example.label);
                if (found == labels.end() || *found != example.label) {
                    throw std::invalid_argument(where + ": label '" + example.label +
                                                "' does not occur in the training data");
                }
                out.push_back({truncated(tokenizer->encode(example.text), d.max_length), found - labels.begin()});
            }
            return out;
        };
        std::vector<LabeledTokens> train_examples = short_enough(
            encode(train, d.train), d, [](const LabeledTokens& e) { return static_cast<int64_t>(e.tokens.size()); });
        return std::make_unique<ClassificationTask>(
            c, tokenizer->vocab_size(), static_cast<int64_t>(labels.size()), std::move(train_examples),
            encode(test, d.test.empty() ? d.train + " (its held-out part; the rest has no such example)" : d.test),
            init);
    }
    if (t.kind == TaskKind::pairs) {
        auto [train, test] = read_split<TextPair>(d, seed, read_pairs);
        std::vector<std::string> texts;
        for (const auto& pair : train) {
            texts.push_back(pair.source);
            texts.push_back(pair.target);
        }
        if (!tokenizer) tokenizer = Tokenizer::build(kind, texts, d.min_frequency, text_options);
        auto encode = [&](const std::vector<TextPair>& pairs) {
            std::vector<TokenPair> out;
            for (const auto& pair : pairs) {
                out.push_back({truncated(tokenizer->encode(pair.source), d.max_length),
                               truncated(tokenizer->encode(pair.target), d.max_length)});
            }
            return out;
        };
        std::vector<TokenPair> train_pairs = short_enough(
            encode(train), d, [&](const TokenPair& pair) { return static_cast<int64_t>(pair.source.size()); });
        return std::make_unique<SequencePairTask>(c, tokenizer->vocab_size(), std::move(train_pairs), encode(test),
                                                  init);
    }
    // language_model: one token stream, the last held_out part (or the test file) for evaluation,
    // cut into chunks of max_length + 1 tokens that overlap by one (each token is a target once)
    std::string train_text = read_text(d.train), test_text;
    if (d.test.empty()) {
        const std::size_t cut =
            train_text.size() - static_cast<std::size_t>(d.held_out * static_cast<double>(train_text.size()));
        std::size_t boundary = cut;
        while (boundary < train_text.size() && (static_cast<unsigned char>(train_text[boundary]) & 0xC0) == 0x80)
            ++boundary;
        test_text = train_text.substr(boundary);  // cut at a UTF-8 character boundary
        train_text.resize(boundary);
    } else {
        test_text = read_text(d.test);
    }
    if (!tokenizer) tokenizer = Tokenizer::build(kind, {train_text}, d.min_frequency, text_options);
    auto chunks = [&](const std::string& text, const std::string& where) {
        const std::vector<int64_t> ids = tokenizer->encode(text);
        if (ids.size() < 2)
            throw std::invalid_argument(where + ": too little text for a language model (under 2 tokens)");
        std::vector<std::vector<int64_t>> out;
        for (std::size_t start = 0; start + 1 < ids.size(); start += d.max_length) {
            const std::size_t end = std::min(ids.size(), start + d.max_length + 1);
            out.emplace_back(ids.begin() + start, ids.begin() + end);
        }
        return out;
    };
    return std::make_unique<LanguageModelTask>(c, tokenizer->vocab_size(), chunks(train_text, d.train),
                                               chunks(test_text, d.test.empty() ? d.train + " (held out)" : d.test),
                                               kind == Tokenizer::Kind::character, init);
}

// ---------------------------------------------------------------- files

// A JSON file of a run; errors name the file.
json read_json_file(const fs::path& path) {
    std::ifstream in(path);
    if (!in) throw std::invalid_argument(path.string() + ": cannot open");
    try {
        return json::parse(in);
    } catch (const json::exception& e) {
        throw std::invalid_argument(path.string() + ": not valid JSON (" + e.what() + ")");
    }
}

std::optional<Tokenizer> saved_tokenizer(const fs::path& run) {
    if (!fs::exists(run / "tokenizer.json")) return std::nullopt;
    return Tokenizer::from_json(read_json_file(run / "tokenizer.json").dump());
}

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

double peak_rss_mib() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

void write_text(const fs::path& path, const std::string& text) {
    std::ofstream out(path);
    out << text;
    out.close();
    if (!out) throw std::runtime_error("could not write " + path.string());
}

void write_json(const fs::path& path, const json& value) {
    const fs::path partial = path.string() + ".partial";
    write_text(partial, value.dump(2) + "\n");
    fs::rename(partial, path);
}

// checkpoint/ = model/ + optimizer/ + state.json, written to checkpoint.partial/ and swapped in by
// two renames: checkpoint/ -> checkpoint.previous/, checkpoint.partial/ -> checkpoint/. Stopped at
// any point, one whole checkpoint remains: checkpoint/, or checkpoint.previous/ between the two
// renames, which recovered_checkpoint() renames back.
void save_checkpoint(const fs::path& dir, const Module& model, const AdamW& optimizer, int64_t step) {
    const fs::path partial = dir.string() + ".partial", previous = dir.string() + ".previous";
    fs::remove_all(partial);
    fs::create_directories(partial);
    model.save((partial / "model").string());
    optimizer.save((partial / "optimizer").string());
    write_text(partial / "state.json", json{{"step", step}}.dump() + "\n");
    fs::remove_all(previous);
    if (fs::exists(dir)) fs::rename(dir, previous);
    fs::rename(partial, dir);
    fs::remove_all(previous);
}

// Whether the run directory `out` holds a checkpoint; one left as checkpoint.previous/ by a run
// stopped between save_checkpoint's two renames is first renamed back to checkpoint/.
bool recovered_checkpoint(const fs::path& out) {
    const fs::path dir = out / "checkpoint", previous = out / "checkpoint.previous";
    if (!fs::exists(dir) && fs::exists(previous)) fs::rename(previous, dir);
    return fs::exists(dir);
}

int64_t load_checkpoint(const fs::path& dir, Module& model, AdamW& optimizer) {
    if (!fs::exists(dir / "state.json")) {
        throw std::invalid_argument("--resume: no checkpoint in " + dir.string());
    }
    model.load((dir / "model").string());
    optimizer.load((dir / "optimizer").string());
    const json state = read_json_file(dir / "state.json");
    if (!state.contains("step") || !state["step"].is_number_integer() || state["step"].get<int64_t>() < 0) {
        throw std::invalid_argument((dir / "state.json").string() + ": no step count");
    }
    return state["step"].get<int64_t>();
}

std::string duration(double seconds) {
    const auto s = static_cast<int64_t>(seconds + 0.5);
    char text[32];
    std::snprintf(text, sizeof text, "%lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
    return text;
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
    std::optional<Tokenizer> tokenizer;
    if (options.resume) {
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
        }
        const std::string differs = first_difference(wanted, saved);
        if (!differs.empty()) {
            throw std::invalid_argument("--resume: " + differs + " differs from the config " + out.string() +
                                        " was trained with");
        }
        tokenizer = saved_tokenizer(out);  // the ids the checkpoint was trained on
    } else if (recovered_checkpoint(out)) {
        throw std::invalid_argument(out.string() +
                                    " already holds a run; pass --resume to continue it or choose "
                                    "another --out");
    }
    omp_set_num_threads(static_cast<int>(config.training.threads));

    Generator init_gen(config.training.seed);
    std::unique_ptr<Task> task = make_task(config, Init{init_gen, DType::float32}, tokenizer);
    if (config.training.batch_size > task->train_size()) {
        throw std::invalid_argument("/training/batch_size " + std::to_string(config.training.batch_size) +
                                    " exceeds the " + std::to_string(task->train_size()) + " training examples");
    }
    Module& model = task->model();
    AdamW optimizer(model.parameters(), config.training.adamw);
    const LengthBuckets buckets(config.evaluation.length_buckets);
    const int64_t total_steps = config.training.total_steps(task->train_size());  // steps, or from epochs
    const int64_t warmup_steps = config.training.warmup(total_steps);

    fs::create_directories(out);
    int64_t step = 0;
    if (options.resume) {
        recovered_checkpoint(out);
        step = load_checkpoint(out / "checkpoint", model, optimizer);
        if (options.stop_after > 0 && options.stop_after <= step) {
            throw std::invalid_argument("--stop-after " + std::to_string(options.stop_after) +
                                        ": the checkpoint is already at step " + std::to_string(step));
        }
    } else {
        write_json(out / "config.json", resolved);
        if (tokenizer) write_json(out / "tokenizer.json", json::parse(tokenizer->to_json()));
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
    const int64_t batch = config.training.batch_size;
    // the sampler's seeds are kept apart from those of the weights and the synthetic data
    const uint64_t sampler_base = Generator(config.training.seed ^ 0x5851f42d4c957f2dULL).next_u64();
    // length bucketing: groups of 16 batches' worth of examples of about the same length
    std::vector<std::vector<int64_t>> groups;
    if (config.training.length_bucketing) {
        std::vector<int64_t> lengths;
        for (int64_t i = 0; i < task->train_size(); ++i) lengths.push_back(task->train_length(i));
        groups = length_groups(lengths, 16 * batch);
    }
    json last_eval;
    for (; step < total_steps; ++step) {
        // the batch and the dropout masks of a step depend on (seed, step) alone
        Generator sampler(sampler_base + static_cast<uint64_t>(step));
        std::vector<int64_t> indices;
        if (groups.empty()) {
            for (int64_t i = 0; i < batch; ++i)
                indices.push_back(static_cast<int64_t>(sampler.next_u64() % task->train_size()));
        } else {
            const std::vector<int64_t>& group = groups[sampler.next_u64() % groups.size()];
            for (int64_t i = 0; i < batch; ++i) indices.push_back(group[sampler.next_u64() % group.size()]);
        }
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
        if (!std::isfinite(grad_norm)) {
            throw TrainingDiverged("training diverged: the gradient norm is " + std::to_string(grad_norm) +
                                   " at step " + std::to_string(step + 1) + " (try a lower learning rate)");
        }
        const double lr =
            learning_rate(config.training.schedule, config.training.learning_rate, step, warmup_steps, total_steps);
        optimizer.step(lr);
        tokens_seen += tokens;
        ++steps_run;

        const int64_t done = step + 1;
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const double tokens_per_second = static_cast<double>(tokens_seen) / std::max(elapsed, 1e-9);
        if (done % config.training.log_every == 0 || done == total_steps) {
            metrics << json{{"step", done},           {"loss", loss_value}, {"learning_rate", lr},
                            {"grad_norm", grad_norm}, {"seconds", elapsed}, {"tokens_per_second", tokens_per_second}}
                           .dump()
                    << "\n"
                    << std::flush;
        }
        if (options.progress) {
            const double eta = elapsed / static_cast<double>(steps_run) * static_cast<double>(total_steps - done);
            std::fprintf(stderr, "\rstep %lld/%lld  loss %.4f  %.0f tok/s  ETA %s   ", static_cast<long long>(done),
                         static_cast<long long>(total_steps), loss_value, tokens_per_second, duration(eta).c_str());
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

    const double train_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    json summary = {{"task", task_kind_name(config.task.kind)},
                    {"metric", task->metric()},
                    {"position", position_mode_name(config.model.transformer.position)},
                    {"steps", total_steps},
                    {"parameters", model.parameter_count()},
                    {"train_examples", task->train_size()},
                    {"final", last_eval},
                    {"train_seconds", train_seconds},
                    {"tokens_per_second", static_cast<double>(tokens_seen) / std::max(train_seconds, 1e-9)},
                    {"peak_rss_mib", peak_rss_mib()},
                    {"peak_live_mib", static_cast<double>(memory_stats().peak_live_bytes) / 1048576.0}};
    if (!initial.is_null()) summary["initial"] = initial;
    if (config.model.transformer.position == PositionMode::gated) summary["gates"] = task->gates();
    write_json(out / "summary.json", summary);
    return summary;
}

// A trained run: its config, task (data re-read) and tokenizer, with the checkpoint's weights.
struct LoadedRun {
    Config config;
    std::optional<Tokenizer> tokenizer;
    std::unique_ptr<Task> task;
};

// Loads a trained run; `weights_kept` asks for an attention implementation that keeps the weights (the
// fused one keeps none; all three share the parameters, so a fused run is loaded as bucketed).
static LoadedRun load_run(const std::string& run_dir, const std::string& test_file, bool weights_kept = false) {
    const fs::path dir(run_dir);
    if (!fs::exists(dir / "config.json") || !fs::exists(dir / "checkpoint" / "state.json")) {
        throw std::invalid_argument(run_dir + ": not a trained run (needs config.json and checkpoint/)");
    }
    LoadedRun run;
    json document = read_json_file(dir / "config.json");
    if (!test_file.empty()) {
        if (!reads_files(parse_task_kind(document))) {
            throw std::invalid_argument("--data: a " + document["task"]["kind"].get<std::string>() +
                                        " run generates its own test data");
        }
        document["data"]["test"] = test_file;
    }
    run.config = Config::parse(document, (dir / "config.json").string());
    if (weights_kept && run.config.model.transformer.impl == AttentionImpl::fused) {
        run.config.model.transformer.impl = AttentionImpl::bucketed;
    }
    run.tokenizer = saved_tokenizer(dir);
    Generator gen(run.config.training.seed);
    run.task = make_task(run.config, Init{gen, DType::float32}, run.tokenizer);
    run.task->model().load((dir / "checkpoint" / "model").string());
    run.task->model().eval();
    return run;
}

json evaluate_run(const std::string& run_dir, const std::string& test_file) {
    LoadedRun run = load_run(run_dir, test_file);
    json result =
        run.task->evaluate(run.config.evaluation.batch_size, LengthBuckets(run.config.evaluation.length_buckets));
    result["metric"] = run.task->metric();
    return result;
}

// A prompt as token ids: the run's tokenizer, or for synthetic tasks space-separated symbol ids.
static std::vector<int64_t> prompt_ids(const LoadedRun& run, const std::string& prompt, const char* command) {
    if (run.tokenizer) return run.tokenizer->encode(prompt);
    std::vector<int64_t> ids;
    std::istringstream words(prompt);
    for (std::string word; words >> word;) {
        std::size_t used = 0;
        int64_t id = -1;
        try {
            id = std::stoll(word, &used);
        } catch (const std::exception&) {
        }
        if (used != word.size() || id < 4 || id >= run.config.task.vocab) {
            throw std::invalid_argument(std::string(command) + ": '" + word + "' is not a symbol id in [4, " +
                                        std::to_string(run.config.task.vocab) + ") of this synthetic task");
        }
        ids.push_back(id);
    }
    return ids;
}

std::string generate(const std::string& run_dir, const std::string& prompt, int64_t max_tokens) {
    if (max_tokens < 1) throw std::invalid_argument("generate: --max-tokens must be positive");
    LoadedRun run = load_run(run_dir, "");
    const std::vector<int64_t> output = run.task->generate(prompt_ids(run, prompt, "generate"), max_tokens);
    if (run.tokenizer) return run.tokenizer->decode(output);
    std::string out;
    for (int64_t id : output) out += (out.empty() ? "" : " ") + std::to_string(id);
    return out;
}

std::vector<std::string> write_attention(const std::string& run_dir, const std::string& prompt,
                                         const std::string& out_dir) {
    LoadedRun run = load_run(run_dir, "", /*weights_kept=*/true);
    const std::vector<int64_t> ids = prompt_ids(run, prompt, "attention");
    if (ids.empty()) throw std::invalid_argument("attention: the prompt is empty");
    NoGradGuard no_grad;
    const std::vector<Tensor> weights = run.task->attention(ids);
    fs::create_directories(out_dir);
    std::vector<std::string> written;
    for (std::size_t layer = 0; layer < weights.size(); ++layer) {
        written.push_back((fs::path(out_dir) / ("layer" + std::to_string(layer) + ".npy")).string());
        save_npy(weights[layer], written.back());
    }
    return written;
}

}  // namespace relgrad
