#include "train/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "engine/errors.hpp"

namespace relgrad {

namespace {

using NgramCounts = std::map<std::vector<std::string>, int64_t>;

// How often each n-gram (n consecutive tokens) occurs in a sentence.
NgramCounts count_ngrams(const std::vector<std::string>& sentence, size_t n) {
    NgramCounts counts;
    for (size_t start = 0; start + n <= sentence.size(); ++start) {
        ++counts[std::vector<std::string>(sentence.begin() + start, sentence.begin() + start + n)];
    }
    return counts;
}

}  // namespace

double accuracy(const std::vector<int64_t>& predicted, const std::vector<int64_t>& expected) {
    RELGRAD_CHECK(predicted.size() == expected.size(), "accuracy: ", predicted.size(), " predictions for ",
                  expected.size(), " expected labels");
    RELGRAD_CHECK(!predicted.empty(), "accuracy: no predictions");
    int64_t correct = 0;
    for (size_t i = 0; i < predicted.size(); ++i) correct += predicted[i] == expected[i];
    return static_cast<double>(correct) / static_cast<double>(predicted.size());
}

double corpus_bleu(const std::vector<std::vector<std::string>>& hypotheses,
                   const std::vector<std::vector<std::string>>& references) {
    RELGRAD_CHECK(hypotheses.size() == references.size(), "corpus_bleu: ", hypotheses.size(), " hypotheses for ",
                  references.size(), " references");
    RELGRAD_CHECK(!hypotheses.empty(), "corpus_bleu: no hypotheses");

    constexpr size_t max_order = 4;
    double log_precision_sum = 0;
    for (size_t n = 1; n <= max_order; ++n) {
        int64_t matches = 0, total = 0;
        for (size_t s = 0; s < hypotheses.size(); ++s) {
            const NgramCounts reference = count_ngrams(references[s], n);
            for (const auto& [ngram, count] : count_ngrams(hypotheses[s], n)) {
                const auto found = reference.find(ngram);
                matches += std::min(count, found == reference.end() ? int64_t{0} : found->second);  // clipped
                total += count;
            }
        }
        if (matches == 0) return 0;  // p_n = 0 (or no n-grams at all): the geometric mean is 0
        log_precision_sum += std::log(static_cast<double>(matches) / static_cast<double>(total));
    }

    double c = 0, r = 0;
    for (size_t s = 0; s < hypotheses.size(); ++s) {
        c += static_cast<double>(hypotheses[s].size());
        r += static_cast<double>(references[s].size());
    }
    const double brevity_penalty = c >= r ? 1.0 : std::exp(1.0 - r / c);  // c > 0: some 1-gram matched
    return brevity_penalty * std::exp(log_precision_sum / max_order);
}

SequenceScores sequence_scores(const std::vector<std::vector<int64_t>>& outputs,
                               const std::vector<std::vector<int64_t>>& targets, int64_t unknown) {
    RELGRAD_CHECK(outputs.size() == targets.size(), "sequence_scores: ", outputs.size(), " outputs for ",
                  targets.size(), " targets");
    RELGRAD_CHECK(!outputs.empty(), "sequence_scores: no outputs");
    int64_t exact = 0, token_hits = 0, target_tokens = 0;
    std::vector<std::vector<std::string>> hypotheses, references;
    for (size_t s = 0; s < outputs.size(); ++s) {
        const std::vector<int64_t>&output = outputs[s], &target = targets[s];
        RELGRAD_CHECK(!target.empty(), "sequence_scores: target ", s, " is empty");
        int64_t hits = 0;
        for (size_t j = 0; j < target.size(); ++j)
            hits += j < output.size() && output[j] == target[j] && target[j] != unknown;
        exact += hits == static_cast<int64_t>(target.size()) && output.size() == target.size();
        token_hits += hits;
        target_tokens += static_cast<int64_t>(target.size());
        // BLEU compares words: ids as text, a target <unk> as a word no output id can equal
        std::vector<std::string> hypothesis, reference;
        for (int64_t id : output) hypothesis.push_back(std::to_string(id));
        for (int64_t id : target) reference.push_back(id == unknown ? "<unk>" : std::to_string(id));
        hypotheses.push_back(std::move(hypothesis));
        references.push_back(std::move(reference));
    }
    const double n = static_cast<double>(outputs.size());
    return {static_cast<double>(exact) / n, static_cast<double>(token_hits) / static_cast<double>(target_tokens),
            corpus_bleu(hypotheses, references)};
}

double perplexity(double total_nll_nats, int64_t tokens) {
    RELGRAD_CHECK(std::isfinite(total_nll_nats) && total_nll_nats >= 0,
                  "perplexity: total_nll_nats must be a finite number >= 0, got ", total_nll_nats);
    RELGRAD_CHECK(tokens >= 1, "perplexity: tokens must be >= 1, got ", tokens);
    return std::exp(total_nll_nats / static_cast<double>(tokens));
}

double bits_per_char(double total_nll_nats, int64_t characters) {
    RELGRAD_CHECK(std::isfinite(total_nll_nats) && total_nll_nats >= 0,
                  "bits_per_char: total_nll_nats must be a finite number >= 0, got ", total_nll_nats);
    RELGRAD_CHECK(characters >= 1, "bits_per_char: characters must be >= 1, got ", characters);
    return total_nll_nats / (static_cast<double>(characters) * std::log(2.0));
}

LengthBuckets::LengthBuckets(std::vector<int64_t> upper_bounds) : upper_bounds_(std::move(upper_bounds)) {
    RELGRAD_CHECK(!upper_bounds_.empty(), "LengthBuckets: needs at least one upper bound");
    for (size_t i = 0; i < upper_bounds_.size(); ++i) {
        const int64_t low = i == 0 ? 1 : upper_bounds_[i - 1] + 1;  // positive, and above the bound before
        RELGRAD_CHECK(upper_bounds_[i] >= low, "LengthBuckets: upper bounds must be positive and increasing; bound ", i,
                      " is ", upper_bounds_[i], ", expected >= ", low);
    }
}

int64_t LengthBuckets::bucket_of(int64_t length) const {
    RELGRAD_CHECK(length >= 1, "LengthBuckets::bucket_of: length must be >= 1, got ", length);
    // The first bucket whose upper bound is >= length; past the last bound, the open bucket.
    return std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), length) - upper_bounds_.begin();
}

std::string LengthBuckets::name(int64_t bucket) const {
    RELGRAD_CHECK(bucket >= 0 && bucket < count(), "LengthBuckets::name: bucket ", bucket, " is out of range [0, ",
                  count(), ")");
    const auto b = static_cast<size_t>(bucket);
    if (b == upper_bounds_.size()) return ">" + std::to_string(upper_bounds_.back());
    const int64_t low = b == 0 ? 1 : upper_bounds_[b - 1] + 1, high = upper_bounds_[b];
    return low == high ? std::to_string(low) : std::to_string(low) + "-" + std::to_string(high);
}

}  // namespace relgrad
