// Datasets: the generic text formats every task reads (any corpus is converted to one of them
// first), a held-out split, and the synthetic tasks that probe what a model knows about positions.
//
// File errors are std::runtime_error "path:line N: what was wrong, what was expected"; bad
// arguments are std::invalid_argument naming the argument, its value and the allowed range.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace relgrad {

// ---- files -------------------------------------------------------------------------------------
// Lines may end in \n or \r\n; blank lines (only spaces and tabs) are skipped; every other line
// must be one example of at most 1 MiB, valid UTF-8, with non-empty fields. A file without
// examples is an error. A UTF-8 byte order mark (EF BB BF) at the start of a file is skipped, here
// and in read_text. Files of examples are read one line at a time.

struct LabeledText {
    std::string text;
    std::string label;
};
struct TextPair {
    std::string source, target;
};

// What reading keeps of a text: keep(index, text) may change each text of example `index` (0, 1,
// ... in file order; a pair's source, then its target) as soon as its line is read, e.g. cut it.
using KeepText = std::function<void(size_t index, std::string& text)>;

// classification, by extension: .tsv lines "label<TAB>text" (exactly one tab), or .jsonl lines
// {"text": "...", "label": "..."} where the label may be an integer, kept as its decimal string
// (other keys are ignored). The label is no text: `keep` sees the text only.
std::vector<LabeledText> read_classification(const std::string& path, const KeepText& keep = {});
// sequence pairs: .tsv "source<TAB>target" or .jsonl {"source": "...", "target": "..."}
std::vector<TextPair> read_pairs(const std::string& path, const KeepText& keep = {});
// How many examples a file of examples has (its lines that are not blank), without parsing them;
// the same errors as reading it for a file of another extension or without examples.
size_t count_examples(const std::string& path);
// plain UTF-8 text for language modelling, returned byte for byte (a leading byte order mark aside)
std::string read_text(const std::string& path);

// ---- held-out split ----------------------------------------------------------------------------

// A permutation of 0..n-1 (Fisher-Yates driven by relgrad::Generator), the same on every machine.
std::vector<size_t> seeded_permutation(size_t n, uint64_t seed);
// round(fraction * n), checked: 0 < fraction < 1 and both parts non-empty, else std::invalid_argument.
size_t held_out_count(size_t n, double fraction);

// Which of n examples split_held_out(examples, fraction, seed) puts in the training part, by index.
std::vector<bool> training_mask(size_t n, double fraction, uint64_t seed);
// A seeded shuffle, then the last round(fraction * n) examples as held-out: {training, held-out}.
template <class T>
std::pair<std::vector<T>, std::vector<T>> split_held_out(std::vector<T> examples, double fraction, uint64_t seed) {
    const size_t n = examples.size(), training_count = n - held_out_count(n, fraction);
    const std::vector<size_t> order = seeded_permutation(n, seed);
    std::pair<std::vector<T>, std::vector<T>> parts;
    for (size_t i = 0; i < n; ++i) {
        (i < training_count ? parts.first : parts.second).push_back(std::move(examples[order[i]]));
    }
    return parts;
}

// ---- synthetic tasks ---------------------------------------------------------------------------
// Generated from a seed with relgrad::Generator, so the same seed gives the same data everywhere.
// Ids 0..3 are Tokenizer's reserved ids; symbols are 4 .. vocab-1; each length is uniform in
// [min_length, max_length].

struct TokenPair {
    std::vector<int64_t> source, target;
};
struct LabeledTokens {
    std::vector<int64_t> tokens;
    int64_t label;
};

// target = source (vocab >= 5)
std::vector<TokenPair> make_copy_task(int64_t count, int64_t min_length, int64_t max_length, int64_t vocab,
                                      uint64_t seed);
// target = the source reversed (vocab >= 5)
std::vector<TokenPair> make_reverse_task(int64_t count, int64_t min_length, int64_t max_length, int64_t vocab,
                                         uint64_t seed);

// Runs collapsed: the source is runs of 1-3 copies of a symbol (4 .. vocab-1, each run's other
// than the one before it, the last run cut at the length drawn), the target one symbol per run:
// 7 7 9 4 4 4 -> 7 9 4. Whether a token is kept depends only on its left neighbour (vocab >= 6).
std::vector<TokenPair> make_dedupe_task(int64_t count, int64_t min_length, int64_t max_length, int64_t vocab,
                                        uint64_t seed);

// Sorting: random symbols 4 .. vocab-1, the target the same symbols in ascending order (vocab >= 5)
std::vector<TokenPair> make_sort_task(int64_t count, int64_t min_length, int64_t max_length, int64_t vocab,
                                      uint64_t seed);

// Addition, most significant digit first: the source "a + b" for two numbers of `length` digits
// each (no leading zero but for 0 itself), the target the digits of a + b. Digit d is id 4 + d,
// '+' id 14 (vocab >= 15). The length drawn from [min_length, max_length] is that of the operands.
// reversed_sum: the sum's digits least significant first, so that each digit's carry comes from
// digits already written.
std::vector<TokenPair> make_addition_task(int64_t count, int64_t min_length, int64_t max_length, int64_t vocab,
                                          uint64_t seed, bool reversed_sum = false);
constexpr int64_t kAdditionVocab = 15;  // the reserved ids, ten digits and '+'

// Symbol at a position: random symbols from 6 .. vocab-1 (vocab >= 8); the label is the symbol at
// `position` (counting from 0), as a class 0 .. vocab-7. Only the absolute position says which
// symbol counts: min_length > position.
std::vector<LabeledTokens> make_symbol_at_task(int64_t count, int64_t min_length, int64_t max_length, int64_t vocab,
                                               int64_t position, uint64_t seed);

// Relative order: random symbols from 6 .. vocab-1 (vocab >= 7) plus exactly one marker A (id 4)
// and one marker B (id 5); label 1 when A stands exactly `distance` positions before B
// (pos(B) - pos(A) = distance), else 0. count / 2 examples are positive (the odd one out is
// negative), in shuffled order; negatives place A and B uniformly among all other position pairs.
// A positive needs length > distance, so positives draw their length from
// [max(min_length, distance + 1), max_length]: keep min_length > distance, or length alone gives
// some negatives away.
std::vector<LabeledTokens> make_relative_order_task(int64_t count, int64_t min_length, int64_t max_length,
                                                    int64_t vocab, int64_t distance, uint64_t seed);

// ---- the data cache ----------------------------------------------------------------------------

// Where `relgrad data fetch` puts the data sets (commands/fetch.hpp) and where "data:NAME/FILE" paths
// point: $RELGRAD_DATA if set, else $XDG_CACHE_HOME/relgrad, else ~/.cache/relgrad
// (std::runtime_error when none of RELGRAD_DATA, XDG_CACHE_HOME, HOME is set).
std::string default_data_dir();

}  // namespace relgrad
