// no gradient check: metrics score predictions after training, nothing here is differentiable.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "train/metrics.hpp"

using namespace relgrad;

namespace {

using Sentence = std::vector<std::string>;

Sentence words(const std::string& text) {
    std::istringstream in(text);
    Sentence result;
    for (std::string word; in >> word;) result.push_back(word);
    return result;
}

double sentence_bleu(const std::string& hypothesis, const std::string& reference) {
    return corpus_bleu({words(hypothesis)}, {words(reference)});
}

}  // namespace

TEST_CASE("accuracy") {
    CHECK(accuracy({1, 2, 3, 4}, {1, 2, 0, 4}) == 0.75);
    CHECK(accuracy({7}, {7}) == 1.0);
    CHECK(accuracy({0, 0}, {1, 1}) == 0.0);
    CHECK_THROWS_WITH_AS(accuracy({1, 2}, {1}), "accuracy: 2 predictions for 1 expected labels", std::invalid_argument);
    CHECK_THROWS_WITH_AS(accuracy({}, {}), "accuracy: no predictions", std::invalid_argument);
}

TEST_CASE("BLEU: a perfect match is 1") {
    CHECK(sentence_bleu("the cat sat on the mat", "the cat sat on the mat") == doctest::Approx(1.0).epsilon(1e-15));
}

TEST_CASE("BLEU: no matching 4-gram gives 0 (no smoothing)") {
    // hypothesis a b c d e, reference a b c x d e:
    //   1-grams a b c d e: all 5 in the reference                      p1 = 5/5
    //   2-grams ab bc cd de vs ab bc cx xd de: ab bc de                 p2 = 3/4
    //   3-grams abc bcd cde vs abc bcx cxd xde: abc                     p3 = 1/3
    //   4-grams abcd bcde vs abcx bcxd cxde: none                       p4 = 0/2 -> BLEU 0
    CHECK(sentence_bleu("a b c d e", "a b c x d e") == 0.0);
    // Fewer than 4 tokens in every hypothesis: no 4-grams at all, also 0.
    CHECK(sentence_bleu("a b c", "a b c") == 0.0);
    CHECK(sentence_bleu("", "a b c d") == 0.0);
}

TEST_CASE("BLEU: a short hypothesis pays the brevity penalty") {
    // hypothesis "the cat sat on the" (c = 5), reference "the cat sat on the mat" (r = 6):
    //   1-grams the x2, cat, sat, on: the reference has the x2 too  p1 = 5/5
    //   2-grams the-cat cat-sat sat-on on-the: all in the reference  p2 = 4/4
    //   3-grams: 3/3, 4-grams: 2/2; all precisions 1
    //   BP = exp(1 - r/c) = exp(1 - 6/5) = exp(-0.2) = 0.818730753...
    CHECK(sentence_bleu("the cat sat on the", "the cat sat on the mat") ==
          doctest::Approx(std::exp(-0.2)).epsilon(1e-12));
    CHECK(std::exp(-0.2) == doctest::Approx(0.8187307531).epsilon(1e-10));
    // A longer hypothesis has no penalty (c = 7 >= r = 6); the extra "mat" costs precision:
    //   1-grams 6 of 7 (one "mat" in the reference), 2-grams 5 of 6 (not mat-mat),
    //   3-grams 4 of 5 (not the-mat-mat), 4-grams 3 of 4 (not on-the-mat-mat)
    CHECK(sentence_bleu("the cat sat on the mat mat", "the cat sat on the mat") ==
          doctest::Approx(std::pow(6.0 / 7 * 5.0 / 6 * 4.0 / 5 * 3.0 / 4, 0.25)).epsilon(1e-12));
}

TEST_CASE("BLEU: matches are clipped by the reference counts") {
    // hypothesis a a b c d, reference a b c d e (c = r = 5, BP = 1):
    //   1-grams a x2, b, c, d: the reference has one a, so a counts once   p1 = 4/5
    //   2-grams aa ab bc cd vs ab bc cd de                                  p2 = 3/4
    //   3-grams aab abc bcd vs abc bcd cde                                  p3 = 2/3
    //   4-grams aabc abcd vs abcd bcde                                      p4 = 1/2
    //   BLEU = (4/5 * 3/4 * 2/3 * 1/2)^(1/4) = 0.2^(1/4) = 0.668740305...  (0.25^(1/4) unclipped)
    CHECK(sentence_bleu("a a b c d", "a b c d e") == doctest::Approx(std::pow(0.2, 0.25)).epsilon(1e-12));
    CHECK(std::pow(0.2, 0.25) == doctest::Approx(0.6687403050).epsilon(1e-10));
    // the the the the vs the cat: p1 = 1/4, but no 2-gram matches -> 0
    CHECK(sentence_bleu("the the the the", "the cat") == 0.0);
}

TEST_CASE("BLEU over a corpus sums the counts first: not the average of sentence BLEUs") {
    // sentence 1: a b c d vs a b c d: p = 4/4, 3/3, 2/2, 1/1; sentence BLEU 1
    // sentence 2: a b c d e f vs a b c d x f:
    //   1-grams a b c d e f vs a b c d x f: 5 of 6         p1 = 5/6
    //   2-grams ab bc cd de ef vs ab bc cd dx xf: 3 of 5    p2 = 3/5
    //   3-grams abc bcd cde def vs abc bcd cdx dxf: 2 of 4  p3 = 2/4
    //   4-grams abcd bcde cdef vs abcd bcdx cdxf: 1 of 3    p4 = 1/3
    //   sentence BLEU = (5/6 * 3/5 * 2/4 * 1/3)^(1/4) = (1/12)^(1/4) = 0.537284965...
    // average of the sentence BLEUs = (1 + 0.537285) / 2 = 0.768642...
    // corpus: p1 = (4+5)/(4+6) = 9/10, p2 = (3+3)/(3+5) = 6/8, p3 = (2+2)/(2+4) = 4/6,
    //   p4 = (1+1)/(1+3) = 2/4; c = r = 10, BP = 1
    //   BLEU = (9/10 * 6/8 * 4/6 * 2/4)^(1/4) = 0.225^(1/4) = 0.688724...
    const std::vector<Sentence> hypotheses = {words("a b c d"), words("a b c d e f")};
    const std::vector<Sentence> references = {words("a b c d"), words("a b c d x f")};
    CHECK(sentence_bleu("a b c d e f", "a b c d x f") == doctest::Approx(std::pow(1.0 / 12, 0.25)).epsilon(1e-12));
    const double average = (1.0 + std::pow(1.0 / 12, 0.25)) / 2;
    CHECK(average == doctest::Approx(0.768642).epsilon(1e-6));
    CHECK(corpus_bleu(hypotheses, references) == doctest::Approx(std::pow(0.225, 0.25)).epsilon(1e-12));
    CHECK(corpus_bleu(hypotheses, references) == doctest::Approx(0.688725).epsilon(1e-6));
}

TEST_CASE("BLEU: the brevity penalty uses the corpus lengths") {
    // sentence 1 long, sentence 2 short: c = 7 + 3 = 10 = r = 6 + 4, so no penalty overall
    // (sentence 2 alone would pay exp(1 - 4/3), and score 0 with no 4-gram at all).
    // 1-grams: 6 of 7 ("x" extra) + 3 of 3 = 9/10; 2-grams: 5 of 6 + 2 of 2 = 7/8;
    // 3-grams: 4 of 5 + 1 of 1 = 5/6; 4-grams: 3 of 4 + 0 of 0 = 3/4
    const std::vector<Sentence> hypotheses = {words("a b c d e f x"), words("p q r")};
    const std::vector<Sentence> references = {words("a b c d e f"), words("p q r s")};
    CHECK(corpus_bleu(hypotheses, references) ==
          doctest::Approx(std::pow(9.0 / 10 * 7.0 / 8 * 5.0 / 6 * 3.0 / 4, 0.25)).epsilon(1e-12));
}

TEST_CASE("BLEU: bad arguments") {
    CHECK_THROWS_WITH_AS(corpus_bleu({words("a")}, {}), "corpus_bleu: 1 hypotheses for 0 references",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(corpus_bleu({}, {}), "corpus_bleu: no hypotheses", std::invalid_argument);
}

TEST_CASE("perplexity and bits per character") {
    // 10 tokens, each with probability 1/4: nll = 10 ln 4, perplexity 4
    CHECK(perplexity(10 * std::log(4.0), 10) == doctest::Approx(4.0).epsilon(1e-14));
    CHECK(perplexity(0, 5) == 1.0);
    // 3 characters at 2 bits each: nll = 3 * 2 ln 2 nats
    CHECK(bits_per_char(6 * std::log(2.0), 3) == doctest::Approx(2.0).epsilon(1e-14));
    CHECK(bits_per_char(std::log(2.0) * 7, 7) == doctest::Approx(1.0).epsilon(1e-14));
    CHECK_THROWS_WITH_AS(perplexity(1.0, 0), "perplexity: tokens must be >= 1, got 0", std::invalid_argument);
    CHECK_THROWS_WITH_AS(perplexity(-1.0, 3), "perplexity: total_nll_nats must be a finite number >= 0, got -1",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(bits_per_char(std::numeric_limits<double>::quiet_NaN(), 3),
                         "bits_per_char: total_nll_nats must be a finite number >= 0, got nan", std::invalid_argument);
    CHECK_THROWS_WITH_AS(bits_per_char(1.0, -2), "bits_per_char: characters must be >= 1, got -2",
                         std::invalid_argument);
}

TEST_CASE("length buckets: edges and names") {
    const LengthBuckets buckets({8, 16, 32});
    CHECK(buckets.count() == 4);
    CHECK(buckets.bucket_of(1) == 0);
    CHECK(buckets.bucket_of(8) == 0);
    CHECK(buckets.bucket_of(9) == 1);
    CHECK(buckets.bucket_of(16) == 1);
    CHECK(buckets.bucket_of(17) == 2);
    CHECK(buckets.bucket_of(32) == 2);
    CHECK(buckets.bucket_of(33) == 3);
    CHECK(buckets.bucket_of(1000) == 3);
    CHECK(buckets.name(buckets.bucket_of(8)) == "1-8");
    CHECK(buckets.name(buckets.bucket_of(9)) == "9-16");
    CHECK(buckets.name(2) == "17-32");
    CHECK(buckets.name(buckets.bucket_of(33)) == ">32");

    const LengthBuckets single({1, 2, 5});
    CHECK(single.name(0) == "1");
    CHECK(single.name(1) == "2");
    CHECK(single.name(2) == "3-5");
    CHECK(single.name(3) == ">5");

    CHECK_THROWS_WITH_AS(buckets.bucket_of(0), "LengthBuckets::bucket_of: length must be >= 1, got 0",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(buckets.name(4), "LengthBuckets::name: bucket 4 is out of range [0, 4)",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(buckets.name(-1), "LengthBuckets::name: bucket -1 is out of range [0, 4)",
                         std::invalid_argument);
}

TEST_CASE("length buckets: bad bounds") {
    CHECK_THROWS_WITH_AS(LengthBuckets({}), "LengthBuckets: needs at least one upper bound", std::invalid_argument);
    CHECK_THROWS_WITH_AS(LengthBuckets({0, 8}),
                         "LengthBuckets: upper bounds must be positive and increasing; bound 0 is 0, expected >= 1",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(LengthBuckets({8, 16, 16}),
                         "LengthBuckets: upper bounds must be positive and increasing; bound 2 is 16, expected >= 17",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(LengthBuckets({8, 4}),
                         "LengthBuckets: upper bounds must be positive and increasing; bound 1 is 4, expected >= 9",
                         std::invalid_argument);
}

TEST_CASE("sequence scores: exact match, token accuracy, BLEU; a target <unk> never matches") {
    constexpr int64_t unk = 1;
    // output 5 6 7 8 against target 5 6 7 8: all match; output 9 1 against target 9 1: the <unk>
    // in the target does not, so that pair is no exact match and 1 of its 2 tokens counts
    const SequenceScores scores = sequence_scores({{5, 6, 7, 8}, {9, 1}}, {{5, 6, 7, 8}, {9, 1}}, unk);
    CHECK(scores.accuracy == 0.5);
    CHECK(scores.token_accuracy == 5.0 / 6.0);
    // BLEU as corpus_bleu with the target's <unk> a word no output has:
    //   p1 = (4 + 1)/6, p2 = 3/4 (the 2-gram 9 1 does not match), p3 = 2/2, p4 = 1/1; c = r = 6
    CHECK(scores.bleu == doctest::Approx(std::pow(5.0 / 6.0 * 3.0 / 4.0, 0.25)).epsilon(1e-14));
    CHECK(scores.bleu == corpus_bleu({{"5", "6", "7", "8"}, {"9", "1"}}, {{"5", "6", "7", "8"}, {"9", "<unk>"}}));
    // a shorter output: positions past its end do not match, and it is no exact match
    const SequenceScores short_output = sequence_scores({{5, 6}}, {{5, 6, 7}}, unk);
    CHECK(short_output.accuracy == 0.0);
    CHECK(short_output.token_accuracy == 2.0 / 3.0);
    // a longer output that starts with the target is no exact match either
    CHECK(sequence_scores({{5, 6, 7}}, {{5, 6}}, unk).accuracy == 0.0);
    CHECK(sequence_scores({{5, 6}}, {{5, 6}}, unk).accuracy == 1.0);

    CHECK_THROWS_WITH_AS(sequence_scores({{5}}, {}, unk), "sequence_scores: 1 outputs for 0 targets",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(sequence_scores({}, {}, unk), "sequence_scores: no outputs", std::invalid_argument);
    CHECK_THROWS_WITH_AS(sequence_scores({{5}, {}}, {{5}, {}}, unk), "sequence_scores: target 1 is empty",
                         std::invalid_argument);
}
