// Metrics for evaluation: accuracy, corpus BLEU, perplexity, bits per character, length buckets.
// Bad arguments are std::invalid_argument naming the function and the value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace relgrad {

// The fraction of positions where predicted == expected; sizes must match and be non-empty.
double accuracy(const std::vector<int64_t>& predicted, const std::vector<int64_t>& expected);

// Corpus BLEU-4 (Papineni et al. 2002), one reference per hypothesis, in [0, 1] (not x100):
//   p_n  = sum over sentences of clipped n-gram matches / sum of hypothesis n-grams, n = 1..4,
//          where an n-gram matches at most as often as it occurs in the reference ("clipping")
//   BP   = 1 if c >= r, else exp(1 - r / c)    (c, r: total hypothesis / reference lengths)
//   BLEU = BP * exp((log p_1 + log p_2 + log p_3 + log p_4) / 4)
// No smoothing: 0 when some p_n is 0, or when the hypotheses hold no n-grams of some order.
double corpus_bleu(const std::vector<std::vector<std::string>>& hypotheses,
                   const std::vector<std::vector<std::string>>& references);

// The scores of output sequences against their targets (token ids), for sequence pairs:
//   accuracy        the fraction of outputs equal to their target (exact match)
//   token_accuracy  the fraction of target positions where the output has the target's token
//   bleu            corpus_bleu over the token ids
// A target token `unknown` (<unk>: a word the vocabulary left out) never matches, not even an
// output <unk>: the real word is not known, and a model must not score by predicting <unk>.
// Sizes must match and be non-empty; targets must not be empty.
struct SequenceScores {
    double accuracy, token_accuracy, bleu;
};
SequenceScores sequence_scores(const std::vector<std::vector<int64_t>>& outputs,
                               const std::vector<std::vector<int64_t>>& targets, int64_t unknown);

// exp(nll / tokens): the model is as unsure as a uniform choice among this many tokens.
double perplexity(double total_nll_nats, int64_t tokens);
// nll / (characters ln 2): the average code length in bits per character.
double bits_per_char(double total_nll_nats, int64_t characters);

// Length buckets for metrics by length: upper bounds {8, 16, 32} give the buckets
// "1-8", "9-16", "17-32", ">32" (a bucket of one length is named by it alone: "5").
class LengthBuckets {
public:
    explicit LengthBuckets(std::vector<int64_t> upper_bounds);  // non-empty, positive, strictly increasing
    int64_t bucket_of(int64_t length) const;                    // length >= 1
    std::string name(int64_t bucket) const;                     // bucket in [0, count())
    int64_t count() const { return static_cast<int64_t>(upper_bounds_.size()) + 1; }

private:
    std::vector<int64_t> upper_bounds_;
};

}  // namespace relgrad
