#include "train/task.hpp"

#include "engine/autograd.hpp"
#include "engine/errors.hpp"
#include "engine/ops.hpp"
#include "train/tokenizer.hpp"

namespace relgrad {

using nlohmann::json;

namespace {

// Rows padded with Tokenizer::pad to the longest: int64 [B, L] on `device` (the model's) and the
// true lengths.
struct Padded {
    Tensor ids;
    std::vector<int64_t> lengths;
};

Padded pad_rows(const std::vector<std::vector<int64_t>>& rows, Device device) {
    int64_t longest = 1;
    for (const auto& row : rows) longest = std::max<int64_t>(longest, static_cast<int64_t>(row.size()));
    std::vector<double> ids(rows.size() * longest, static_cast<double>(Tokenizer::pad));
    std::vector<int64_t> lengths;
    for (std::size_t b = 0; b < rows.size(); ++b) {
        for (std::size_t j = 0; j < rows[b].size(); ++j) ids[b * longest + j] = static_cast<double>(rows[b][j]);
        lengths.push_back(static_cast<int64_t>(rows[b].size()));
    }
    return {from_vector(ids, {static_cast<int64_t>(rows.size()), longest}, DType::int64, device), lengths};
}

// One sequence as a batch of one, on `device`.
Tensor single(const std::vector<int64_t>& tokens, Device device) {
    return from_vector(std::vector<double>(tokens.begin(), tokens.end()), {1, static_cast<int64_t>(tokens.size())},
                       DType::int64, device);
}

// The attention weights the last forward left in each layer of a stack.
std::vector<Tensor> weights_of(const Encoder& stack) {
    std::vector<Tensor> weights;
    for (const auto& layer : stack.layers) weights.push_back(layer->self_attention->last_weights.squeeze(0));
    return weights;
}

std::vector<MultiHeadAttention*> self_attentions(const Encoder& stack) {
    std::vector<MultiHeadAttention*> layers;
    for (const auto& layer : stack.layers) layers.push_back(layer->self_attention.get());
    return layers;
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

// Exact match (accuracy), token accuracy and BLEU of the outputs against the targets, over all
// and per length bucket (bucket_of_example[i] the bucket of example i).
json scored_by_length(const std::vector<std::vector<int64_t>>& outputs,
                      const std::vector<std::vector<int64_t>>& targets, const std::vector<int64_t>& bucket_of_example,
                      const LengthBuckets& buckets) {
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

std::vector<int64_t> with_bos(std::vector<int64_t> t) {
    t.insert(t.begin(), Tokenizer::bos);
    return t;
}

std::vector<int64_t> with_eos(std::vector<int64_t> t) {
    t.push_back(Tokenizer::eos);
    return t;
}

// cross_entropy(logits, target, ignore, reduction), with the targets that count (not `ignore`)
// into counts.targets
Tensor counted_cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore, Reduction reduction,
                             LossCounts& counts) {
    counts.targets = 0;
    for (double t : target.to_vector()) counts.targets += static_cast<int64_t>(t) != ignore;
    return cross_entropy(logits, target, ignore, reduction);
}

}  // namespace

std::vector<double> Task::class_probabilities(const std::vector<int64_t>& /*tokens*/) {
    RELGRAD_CHECK(false, "a model that is not a classifier has no classes; it answers with generate");
}

std::vector<int64_t> Task::generate(const std::vector<int64_t>& /*prompt*/, int64_t /*max_tokens*/,
                                    const DecodeProgress& /*progress*/) {
    RELGRAD_CHECK(false, "generate: a classifier generates nothing; use relgrad eval");
}

// ---------------------------------------------------------------- classification

ClassificationTask::ClassificationTask(const ModelConfig& model, int64_t vocab, int64_t classes,
                                       std::vector<LabeledTokens> train, std::vector<LabeledTokens> test,
                                       const Init& init)
    : model_(vocab, classes, model.transformer, model.pooling, init),
      train_(std::move(train)),
      test_(std::move(test)) {}

std::vector<Tensor> ClassificationTask::attention(const std::vector<int64_t>& tokens) {
    model_.forward(single(tokens, model_.device()), {static_cast<int64_t>(tokens.size())});
    return weights_of(model_.encoder);
}

std::vector<MultiHeadAttention*> ClassificationTask::attention_layers() { return self_attentions(model_.encoder); }

std::vector<double> ClassificationTask::class_probabilities(const std::vector<int64_t>& tokens) {
    NoGradGuard no_grad;
    const Tensor logits = model_.forward(single(tokens, model_.device()), {static_cast<int64_t>(tokens.size())});
    return softmax(logits.to(DType::float64), -1).to_vector();
}

Tensor ClassificationTask::loss(const std::vector<int64_t>& indices, LossCounts& counts, Reduction reduction) {
    std::vector<std::vector<int64_t>> rows;
    std::vector<double> labels;
    for (int64_t i : indices) {
        rows.push_back(train_[i].tokens);
        labels.push_back(static_cast<double>(train_[i].label));
    }
    const Padded batch = pad_rows(rows, model_.device());
    counts.tokens = 0;
    for (int64_t n : batch.lengths) counts.tokens += n;
    const Tensor logits = model_.forward(batch.ids, batch.lengths);
    return counted_cross_entropy(
        logits, from_vector(labels, {static_cast<int64_t>(labels.size())}, DType::int64, model_.device()), -100,
        reduction, counts);
}

json ClassificationTask::evaluate(int64_t batch_size, const LengthBuckets& buckets) {
    NoGradGuard no_grad;
    std::vector<int64_t> hits(buckets.count()), counts(buckets.count());
    int64_t correct = 0;
    for (std::size_t start = 0; start < test_.size(); start += batch_size) {
        std::vector<std::vector<int64_t>> rows;
        for (std::size_t i = start; i < std::min(test_.size(), start + batch_size); ++i)
            rows.push_back(test_[i].tokens);
        const Padded batch = pad_rows(rows, model_.device());
        const std::vector<int64_t> predicted = argmax_rows(model_.forward(batch.ids, batch.lengths));
        for (std::size_t r = 0; r < rows.size(); ++r) {
            const bool hit = predicted[r] == test_[start + r].label;
            const int64_t bucket = buckets.bucket_of(static_cast<int64_t>(rows[r].size()));
            correct += hit;
            hits[bucket] += hit;
            counts[bucket] += 1;
        }
        evaluation_batch_done(start, batch_size, test_.size());
    }
    return {{"accuracy", static_cast<double>(correct) / static_cast<double>(test_.size())},
            {"by_length", by_length(buckets, hits, counts)}};
}

// ---------------------------------------------------------------- sequence pairs

SequencePairTask::SequencePairTask(const ModelConfig& model, int64_t vocab, std::vector<TokenPair> train,
                                   std::vector<TokenPair> test, const Init& init)
    : model_(vocab, vocab, model.transformer, init), train_(std::move(train)), test_(std::move(test)) {}

std::vector<Tensor> SequencePairTask::attention(const std::vector<int64_t>& tokens) {
    model_.encode(single(tokens, model_.device()), {static_cast<int64_t>(tokens.size())});
    return weights_of(model_.encoder);
}

std::vector<MultiHeadAttention*> SequencePairTask::attention_layers() { return self_attentions(model_.encoder); }

Tensor SequencePairTask::loss(const std::vector<int64_t>& indices, LossCounts& counts, Reduction reduction) {
    std::vector<std::vector<int64_t>> sources, inputs, outputs;
    for (int64_t i : indices) {
        sources.push_back(train_[i].source);
        inputs.push_back(with_bos(train_[i].target));
        outputs.push_back(with_eos(train_[i].target));
    }
    const Padded source = pad_rows(sources, model_.device()), input = pad_rows(inputs, model_.device()),
                 output = pad_rows(outputs, model_.device());
    counts.tokens = 0;
    for (std::size_t b = 0; b < sources.size(); ++b) counts.tokens += source.lengths[b] + input.lengths[b];
    const Tensor logits = model_.forward(source.ids, source.lengths, input.ids, input.lengths);
    const int64_t V = logits.size(-1);
    return counted_cross_entropy(logits.reshape({-1, V}), output.ids.reshape({-1}), Tokenizer::pad, reduction, counts);
}

json SequencePairTask::evaluate(int64_t batch_size, const LengthBuckets& buckets) {
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
        evaluation_batch_done(start, batch_size, test_.size());
    }
    return scored_by_length(outputs, targets, bucket_of_example, buckets);
}

std::vector<std::vector<int64_t>> SequencePairTask::greedy_decode(const std::vector<std::vector<int64_t>>& sources,
                                                                  int64_t max_steps, const DecodeProgress& progress) {
    const Padded source = pad_rows(sources, model_.device());
    return model_.greedy_decode(source.ids, source.lengths, Tokenizer::bos, Tokenizer::eos, max_steps, progress);
}

std::vector<int64_t> SequencePairTask::generate(const std::vector<int64_t>& prompt, int64_t max_tokens,
                                                const DecodeProgress& progress) {
    RELGRAD_CHECK(!prompt.empty(), "generate: the prompt is empty");
    return greedy_decode({prompt}, max_tokens, progress)[0];
}

// ---------------------------------------------------------------- prompt and answer, decoder-only

PromptAnswerTask::PromptAnswerTask(const ModelConfig& model, int64_t vocab, std::vector<TokenPair> train,
                                   std::vector<TokenPair> test, const Init& init)
    : model_(vocab, model.transformer, init), train_(std::move(train)), test_(std::move(test)) {}

std::vector<Tensor> PromptAnswerTask::attention(const std::vector<int64_t>& tokens) {
    model_.forward(single(tokens, model_.device()), {static_cast<int64_t>(tokens.size())});
    return weights_of(model_.decoder);
}

std::vector<MultiHeadAttention*> PromptAnswerTask::attention_layers() { return self_attentions(model_.decoder); }

// inputs source bos target, labels pad... target eos: position |source| (the separator) predicts
// the first answer token, and the source's own positions predict nothing
Tensor PromptAnswerTask::loss(const std::vector<int64_t>& indices, LossCounts& counts, Reduction reduction) {
    std::vector<std::vector<int64_t>> inputs, labels;
    counts.tokens = 0;
    for (int64_t i : indices) {
        const TokenPair& pair = train_[i];
        std::vector<int64_t> input = pair.source;
        input.push_back(Tokenizer::bos);
        input.insert(input.end(), pair.target.begin(), pair.target.end());
        std::vector<int64_t> label(pair.source.size(), Tokenizer::pad);
        label.insert(label.end(), pair.target.begin(), pair.target.end());
        label.push_back(Tokenizer::eos);
        counts.tokens += static_cast<int64_t>(input.size());
        inputs.push_back(std::move(input));
        labels.push_back(std::move(label));
    }
    const Padded input = pad_rows(inputs, model_.device()), label = pad_rows(labels, model_.device());
    const Tensor logits = model_.forward(input.ids, input.lengths);
    return counted_cross_entropy(logits.reshape({-1, logits.size(-1)}), label.ids.reshape({-1}), Tokenizer::pad,
                                 reduction, counts);
}

std::vector<std::vector<int64_t>> PromptAnswerTask::answers(const std::vector<std::vector<int64_t>>& sources,
                                                            int64_t max_steps, const DecodeProgress& progress) {
    const int64_t B = static_cast<int64_t>(sources.size());
    std::vector<std::vector<int64_t>> prompts = sources, out(B);
    for (auto& prompt : prompts) prompt.push_back(Tokenizer::bos);
    std::vector<bool> done(B, false);
    std::vector<KVCache> caches;
    Tensor ids = pad_rows(prompts, model_.device()).ids;  // one length: no padding
    for (int64_t step = 0; step < max_steps; ++step) {
        const Tensor logits = model_.forward_incremental(ids, caches);
        const std::vector<int64_t> next = argmax_rows(logits.narrow(1, logits.size(1) - 1, 1));
        std::vector<double> fed(B);
        bool all_done = true;
        for (int64_t b = 0; b < B; ++b) {
            if (next[b] == Tokenizer::eos) done[b] = true;
            if (!done[b]) out[b].push_back(next[b]);
            all_done = all_done && done[b];
            fed[b] = static_cast<double>(next[b]);
        }
        if (progress) progress(step + 1, max_steps);
        if (all_done) break;
        ids = from_vector(fed, {B, 1}, DType::int64, model_.device());
    }
    return out;
}

// Prompts of one length decode together: the test set in order of source length, batch by batch
json PromptAnswerTask::evaluate(int64_t batch_size, const LengthBuckets& buckets) {
    NoGradGuard no_grad;
    std::vector<std::size_t> order(test_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return test_[a].source.size() < test_[b].source.size(); });
    std::vector<std::vector<int64_t>> outputs(test_.size()), targets;
    std::vector<int64_t> bucket_of_example;
    for (const TokenPair& pair : test_) {
        targets.push_back(pair.target);
        bucket_of_example.push_back(buckets.bucket_of(static_cast<int64_t>(pair.source.size())));
    }
    // the batches: runs of at most batch_size prompts of one length, [begin, end) of `order`
    std::vector<std::pair<std::size_t, std::size_t>> batches;
    for (std::size_t begin = 0, end = 0; begin < order.size(); begin = end) {
        while (end < order.size() && static_cast<int64_t>(end - begin) < batch_size &&
               test_[order[end]].source.size() == test_[order[begin]].source.size())
            ++end;
        batches.emplace_back(begin, end);
    }
    for (std::size_t n = 0; n < batches.size(); ++n) {
        const auto [begin, end] = batches[n];
        std::vector<std::vector<int64_t>> sources;
        int64_t longest = 0;
        for (std::size_t i = begin; i < end; ++i) {
            sources.push_back(test_[order[i]].source);
            longest = std::max<int64_t>(longest, static_cast<int64_t>(test_[order[i]].target.size()));
        }
        std::vector<std::vector<int64_t>> got = answers(sources, longest + 1);
        for (std::size_t i = begin; i < end; ++i) outputs[order[i]] = std::move(got[i - begin]);
        if (on_evaluation_batch) on_evaluation_batch(static_cast<int64_t>(n + 1), static_cast<int64_t>(batches.size()));
    }
    return scored_by_length(outputs, targets, bucket_of_example, buckets);
}

std::vector<int64_t> PromptAnswerTask::generate(const std::vector<int64_t>& prompt, int64_t max_tokens,
                                                const DecodeProgress& progress) {
    RELGRAD_CHECK(!prompt.empty(), "generate: the prompt is empty");
    return answers({prompt}, max_tokens, progress)[0];
}

// ---------------------------------------------------------------- language model

LanguageModelTask::LanguageModelTask(const ModelConfig& model, int64_t vocab, std::vector<std::vector<int64_t>> train,
                                     std::vector<std::vector<int64_t>> test, bool characters, const Init& init)
    : model_(vocab, model.transformer, init),
      train_(std::move(train)),
      test_(std::move(test)),
      characters_(characters) {}

std::vector<Tensor> LanguageModelTask::attention(const std::vector<int64_t>& tokens) {
    model_.forward(single(tokens, model_.device()), {static_cast<int64_t>(tokens.size())});
    return weights_of(model_.decoder);
}

std::vector<MultiHeadAttention*> LanguageModelTask::attention_layers() { return self_attentions(model_.decoder); }

Tensor LanguageModelTask::loss(const std::vector<int64_t>& indices, LossCounts& counts, Reduction reduction) {
    std::vector<std::vector<int64_t>> chunks;
    for (int64_t i : indices) chunks.push_back(train_[i]);
    Tensor labels;
    const Tensor logits = forward(chunks, labels, counts.tokens);
    return counted_cross_entropy(logits.reshape({-1, logits.size(-1)}), labels.reshape({-1}), Tokenizer::pad, reduction,
                                 counts);
}

json LanguageModelTask::evaluate(int64_t batch_size, const LengthBuckets& buckets) {
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
        evaluation_batch_done(start, batch_size, test_.size());
    }
    json by_length = json::object();
    for (int64_t b = 0; b < buckets.count(); ++b) {
        if (counts[b] == 0) continue;
        json& bucket = by_length[buckets.name(b)];
        bucket = {{"perplexity", perplexity(nll[b], counts[b])}, {"tokens", counts[b]}};
        if (characters_) bucket["bits_per_char"] = bits_per_char(nll[b], counts[b]);
    }
    json result = {{"perplexity", perplexity(total, total_tokens)}, {"tokens", total_tokens}, {"by_length", by_length}};
    if (characters_) result["bits_per_char"] = bits_per_char(total, total_tokens);
    return result;
}

std::vector<int64_t> LanguageModelTask::generate(const std::vector<int64_t>& prompt, int64_t max_tokens,
                                                 const DecodeProgress& progress) {
    RELGRAD_CHECK(!prompt.empty(), "generate: the prompt is empty");
    return model_.greedy_decode(prompt, Tokenizer::eos, max_tokens, progress);
}

Tensor LanguageModelTask::forward(const std::vector<std::vector<int64_t>>& chunks, Tensor& labels, int64_t& tokens) {
    std::vector<std::vector<int64_t>> inputs, targets;
    tokens = 0;
    for (const auto& chunk : chunks) {
        inputs.emplace_back(chunk.begin(), chunk.end() - 1);
        targets.emplace_back(chunk.begin() + 1, chunk.end());
        tokens += static_cast<int64_t>(chunk.size()) - 1;
    }
    const Padded input = pad_rows(inputs, model_.device());
    labels = pad_rows(targets, model_.device()).ids;
    return model_.forward(input.ids, input.lengths);
}

}  // namespace relgrad
