// relgrad: the tasks a run trains. What differs between tasks is the model, the loss on a batch of
// training examples and the evaluation on the test set:
//
//   ClassificationTask  relative_order, symbol_at, classification  a SequenceClassifier   metric accuracy
//   SequencePairTask    copy, reverse, dedupe, pairs               an EncoderDecoder      metric bleu
//   PromptAnswerTask    the pair tasks with task.decoder_only      a CausalLanguageModel  metric accuracy
//   LanguageModelTask   language_model                             a CausalLanguageModel  metric perplexity
//
// The examples are token ids; train/make_task.hpp builds a task from a config and its data.
#pragma once

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "train/config.hpp"
#include "train/datasets.hpp"
#include "train/metrics.hpp"

namespace relgrad {

// What a loss was taken over: the tokens of its examples (what throughput counts) and the targets
// that count in it (its mean's denominator).
struct LossCounts {
    int64_t tokens = 0, targets = 0;
};

// What a run's first training step holds in memory, in bytes, estimated before the model is
// allocated:
//   weights      the parameters (counted exactly: the model built with Init::shapes_only) in
//                float32, and in bfloat16 and float16 also their 16-bit copy
//   gradients    float32, one per parameter
//   moments      AdamW's m and v, float32
//   activations  what the forward keeps for the backward, for one shard of training.batch_size
//                examples of the longest training input: per token and layer about 16 D + 4 F
//                values, plus 4 H L attention weights (reference, bucketed) or 4 H (fused), the
//                embeddings and the output's logits, 4 bytes each (3 in 16 bits: a mean of the
//                16-bit values and the float32 ones); with gradient checkpointing, each block's
//                input and one block's
// The activations are an estimate; tests/train/test_trainer.cpp holds the total within a factor of
// two of what the first step of runs of each kind held (peak_live_mib).
struct MemoryEstimate {
    int64_t parameters = 0;
    double weights = 0, gradients = 0, moments = 0, activations = 0;
    double total() const { return weights + gradients + moments + activations; }
    // "about 1.2 GiB: 10,000,000 parameters (weights 38.1 MiB, ...), activations 1.1 GiB"
    std::string describe() const;
};
class Task {
public:
    virtual ~Task() = default;
    virtual Module& model() = 0;
    virtual int64_t train_size() const = 0;
    // what a training example pads to: its tokens (for pairs, the longer side)
    virtual int64_t train_length(int64_t i) const = 0;
    // The loss over the examples `indices` of the training set: the mean over their targets, or
    // their sum (Reduction::sum: a shard of a batch, divided by the batch's count once the shards
    // are added, docs/distributed.md); `counts` receives the tokens the batch held and the targets
    // the loss counts.
    virtual Tensor loss(const std::vector<int64_t>& indices, LossCounts& counts, Reduction reduction) = 0;
    // Metrics on the test set: {"accuracy": ..., "by_length": {...}, ...}
    virtual nlohmann::json evaluate(int64_t batch_size, const LengthBuckets& buckets) = 0;
    virtual std::vector<std::vector<double>> gates() const = 0;
    virtual const char* metric() const = 0;  // the headline number of evaluate()
    // Greedy output for one prompt: a continuation (language model) or a target (pairs);
    // `progress` is told each token made.
    virtual std::vector<int64_t> generate(const std::vector<int64_t>& prompt, int64_t max_tokens,
                                          const DecodeProgress& progress = {});
    // The self-attention weights of every layer of the (encoder) stack for one input: [H, L, L] each.
    virtual std::vector<Tensor> attention(const std::vector<int64_t>& tokens) = 0;
    // The self-attention layers attention() reads, in order (their last_score_parts after it when
    // keep_score_parts is set).
    virtual std::vector<MultiHeadAttention*> attention_layers() = 0;
    // A classifier's probability of each class for one input; the other tasks answer with generate().
    virtual std::vector<double> class_probabilities(const std::vector<int64_t>& tokens);

    // What its first training step holds in memory, as make_task estimated it.
    MemoryEstimate memory_estimate;

    // When set, evaluate() calls it after every batch with (batches done, batches in all), so that
    // a long evaluation can show its progress.
    std::function<void(int64_t done, int64_t total)> on_evaluation_batch;

protected:
    // For evaluate(): the batch starting at example `start` of `examples` is done.
    void evaluation_batch_done(std::size_t start, int64_t batch_size, std::size_t examples) const {
        if (!on_evaluation_batch) return;
        const auto size = static_cast<std::size_t>(batch_size);
        on_evaluation_batch(static_cast<int64_t>(start / size + 1), static_cast<int64_t>((examples + size - 1) / size));
    }
};

// A SequenceClassifier over the token sequence.
class ClassificationTask : public Task {
public:
    ClassificationTask(const ModelConfig& model, int64_t vocab, int64_t classes, std::vector<LabeledTokens> train,
                       std::vector<LabeledTokens> test, const Init& init);
    Module& model() override { return model_; }
    int64_t train_size() const override { return static_cast<int64_t>(train_.size()); }
    int64_t train_length(int64_t i) const override { return static_cast<int64_t>(train_[i].tokens.size()); }
    Tensor loss(const std::vector<int64_t>& indices, LossCounts& counts, Reduction reduction) override;
    nlohmann::json evaluate(int64_t batch_size, const LengthBuckets& buckets) override;
    std::vector<std::vector<double>> gates() const override { return model_.gates(); }
    const char* metric() const override { return "accuracy"; }
    std::vector<Tensor> attention(const std::vector<int64_t>& tokens) override;
    std::vector<MultiHeadAttention*> attention_layers() override;
    std::vector<double> class_probabilities(const std::vector<int64_t>& tokens) override;

private:
    SequenceClassifier model_;
    std::vector<LabeledTokens> train_, test_;
};

// An EncoderDecoder; the decoder reads bos + target and predicts target + eos.
class SequencePairTask : public Task {
public:
    SequencePairTask(const ModelConfig& model, int64_t vocab, std::vector<TokenPair> train, std::vector<TokenPair> test,
                     const Init& init);
    Module& model() override { return model_; }
    int64_t train_size() const override { return static_cast<int64_t>(train_.size()); }
    int64_t train_length(int64_t i) const override {
        return static_cast<int64_t>(std::max(train_[i].source.size(), train_[i].target.size() + 1));
    }
    Tensor loss(const std::vector<int64_t>& indices, LossCounts& counts, Reduction reduction) override;
    // exact match, token accuracy and BLEU (sequence_scores), over the test set and per
    // source-length bucket
    nlohmann::json evaluate(int64_t batch_size, const LengthBuckets& buckets) override;
    std::vector<std::vector<double>> gates() const override { return model_.gates(); }
    const char* metric() const override { return "bleu"; }
    std::vector<int64_t> generate(const std::vector<int64_t>& prompt, int64_t max_tokens,
                                  const DecodeProgress& progress = {}) override;
    std::vector<Tensor> attention(const std::vector<int64_t>& tokens) override;  // the encoder's, on the source
    std::vector<MultiHeadAttention*> attention_layers() override;

private:
    std::vector<std::vector<int64_t>> greedy_decode(const std::vector<std::vector<int64_t>>& sources, int64_t max_steps,
                                                    const DecodeProgress& progress = {});

    EncoderDecoder model_;
    std::vector<TokenPair> train_, test_;
};

// The pair tasks decoder-only (as Kazemnejad et al. 2023 train them): one CausalLanguageModel reads
// source, bos (the separator) and target, and predicts target + eos after the separator; the loss
// counts those predictions alone. Evaluation decodes greedily after source + bos.
class PromptAnswerTask : public Task {
public:
    PromptAnswerTask(const ModelConfig& model, int64_t vocab, std::vector<TokenPair> train, std::vector<TokenPair> test,
                     const Init& init);
    Module& model() override { return model_; }
    int64_t train_size() const override { return static_cast<int64_t>(train_.size()); }
    int64_t train_length(int64_t i) const override {
        return static_cast<int64_t>(train_[i].source.size() + train_[i].target.size() + 1);
    }
    Tensor loss(const std::vector<int64_t>& indices, LossCounts& counts, Reduction reduction) override;
    // exact match (accuracy), token accuracy and BLEU of the answers, over the test set and per
    // source-length bucket
    nlohmann::json evaluate(int64_t batch_size, const LengthBuckets& buckets) override;
    std::vector<std::vector<double>> gates() const override { return model_.gates(); }
    const char* metric() const override { return "accuracy"; }
    std::vector<int64_t> generate(const std::vector<int64_t>& prompt, int64_t max_tokens,
                                  const DecodeProgress& progress = {}) override;
    std::vector<Tensor> attention(const std::vector<int64_t>& tokens) override;
    std::vector<MultiHeadAttention*> attention_layers() override;

private:
    // the answers after prompts of one length, greedily, at most max_steps tokens each
    std::vector<std::vector<int64_t>> answers(const std::vector<std::vector<int64_t>>& sources, int64_t max_steps,
                                              const DecodeProgress& progress = {});

    CausalLanguageModel model_;
    std::vector<TokenPair> train_, test_;
};

// A CausalLanguageModel over chunks of the token stream, each position predicting the next token.
class LanguageModelTask : public Task {
public:
    // characters: the tokens are characters, so the evaluation also gives bits per character
    LanguageModelTask(const ModelConfig& model, int64_t vocab, std::vector<std::vector<int64_t>> train,
                      std::vector<std::vector<int64_t>> test, bool characters, const Init& init);
    Module& model() override { return model_; }
    int64_t train_size() const override { return static_cast<int64_t>(train_.size()); }
    int64_t train_length(int64_t i) const override { return static_cast<int64_t>(train_[i].size()); }
    Tensor loss(const std::vector<int64_t>& indices, LossCounts& counts, Reduction reduction) override;
    // perplexity (and bits per character for a character tokenizer) over the test stream, and
    // per position bucket: how well a position predicts its next token, by how far in it is
    nlohmann::json evaluate(int64_t batch_size, const LengthBuckets& buckets) override;
    std::vector<std::vector<double>> gates() const override { return model_.gates(); }
    const char* metric() const override { return "perplexity"; }
    std::vector<int64_t> generate(const std::vector<int64_t>& prompt, int64_t max_tokens,
                                  const DecodeProgress& progress = {}) override;
    std::vector<Tensor> attention(const std::vector<int64_t>& tokens) override;
    std::vector<MultiHeadAttention*> attention_layers() override;

private:
    // inputs chunk[:-1], labels chunk[1:] (pad beyond a chunk's end)
    Tensor forward(const std::vector<std::vector<int64_t>>& chunks, Tensor& labels, int64_t& tokens);

    CausalLanguageModel model_;
    std::vector<std::vector<int64_t>> train_, test_;
    bool characters_;
};

}  // namespace relgrad
