#include "train/datasets.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <numeric>
#include <stdexcept>
#include <string_view>

#include "engine/errors.hpp"
#include "engine/tensor.hpp"
#include "train/tokenizer.hpp"
#include "train/json_reader.hpp"
#include "engine/system.hpp"

namespace relgrad {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// ---- files -------------------------------------------------------------------------------------

// A UTF-8 byte order mark, which some editors write at the start of a file: not part of the text.
constexpr std::string_view kByteOrderMark = "\xEF\xBB\xBF";

void skip_byte_order_mark(std::string& text) {
    if (text.compare(0, kByteOrderMark.size(), kByteOrderMark) == 0) text.erase(0, kByteOrderMark.size());
}

// One line of a file, for reading it and for naming it in an error.
struct Line {
    const std::string& path;
    int64_t number;  // from 1
    std::string text;

    std::string where() const { return path + ":line " + std::to_string(number); }
};

void check_utf8(const Line& line) {
    const auto error = find_utf8_error(line.text);
    RELGRAD_CHECK_RUNTIME(!error, line.where(), ": invalid UTF-8 at byte offset ", error->offset,
                          " of the line: ", error->reason);
}

// The most bytes a line of a data file may hold: one example, whose tokens past data.max_length
// are cut off anyway; a longer line is an error that names it, and is never read whole.
constexpr std::size_t kMaxLineBytes = std::size_t{1} << 20;

// Calls each(line) for every line of a data file that is not blank, one line in memory at a time:
// without its \n or \r\n, at most kMaxLineBytes long, checked to be UTF-8.
template <class Each>
void for_each_line(const std::string& path, Each each) {
    std::ifstream in = open_file(path, "a data file");
    std::streambuf& bytes = *in.rdbuf();
    Line line{path, 0, ""};
    for (bool more = true; more;) {
        ++line.number;
        line.text.clear();
        std::char_traits<char>::int_type byte;
        try {
            while ((byte = bytes.sbumpc()) != '\n' && byte != std::char_traits<char>::eof()) {
                RELGRAD_CHECK_RUNTIME(line.text.size() < kMaxLineBytes, line.where(),
                                      ": longer than the 1 MiB a line of a data file may hold");
                line.text.push_back(static_cast<char>(byte));
            }
        } catch (const std::ios_base::failure&) {
            read_failed(line.where(), "a data file");
        }
        more = byte == '\n';
        if (line.number == 1) skip_byte_order_mark(line.text);
        if (!line.text.empty() && line.text.back() == '\r') line.text.pop_back();
        if (line.text.find_first_not_of(" \t") == std::string::npos) continue;
        check_utf8(line);
        each(line);
    }
}

enum class Format { tsv, jsonl };

Format format_of(const std::string& path) {
    const std::string extension = fs::path(path).extension().string();
    if (extension == ".tsv") return Format::tsv;
    if (extension == ".jsonl") return Format::jsonl;
    RELGRAD_CHECK_RUNTIME(false, path, ": the extension must be .tsv or .jsonl, got '", extension, "'");
}

// A field of an example: a text, or a classification label (which may also be a JSON integer).
struct Field {
    std::string name;
    bool is_label;
};

// The two fields of one example: TSV columns "first<TAB>second", or the JSON object's keys.
std::array<std::string, 2> parse_example(Format format, const Line& line, const std::array<Field, 2>& fields) {
    std::array<std::string, 2> values;
    if (format == Format::tsv) {
        const auto tabs = std::count(line.text.begin(), line.text.end(), '\t');
        RELGRAD_CHECK_RUNTIME(tabs == 1, line.where(), ": expected ", fields[0].name, "<TAB>", fields[1].name,
                              " with exactly one tab, found ", tabs, " tabs");
        const size_t tab = line.text.find('\t');
        values = {line.text.substr(0, tab), line.text.substr(tab + 1)};
    } else {
        json object;
        try {
            object = parse_json(line.text, line.where());
        } catch (const std::invalid_argument& e) {  // a file error, as every other of this file
            throw std::runtime_error(e.what());
        }
        RELGRAD_CHECK_RUNTIME(object.is_object(), line.where(), ": expected a JSON object {\"", fields[0].name,
                              "\": ..., \"", fields[1].name, "\": ...}, got ", json_excerpt(object));
        for (size_t i = 0; i < 2; ++i) {
            const Field& field = fields[i];
            RELGRAD_CHECK_RUNTIME(object.contains(field.name), line.where(), ": missing key '", field.name, "'");
            const json& value = object[field.name];
            RELGRAD_CHECK_RUNTIME(value.is_string() || (field.is_label && value.is_number_integer()), line.where(),
                                  ": '", field.name, "' must be a string", field.is_label ? " or an integer" : "",
                                  ", got ", json_excerpt(value));
            values[i] = value.is_string() ? value.get<std::string>() : value.dump();  // 7 -> "7"
        }
    }
    for (size_t i = 0; i < 2; ++i) {
        RELGRAD_CHECK_RUNTIME(!values[i].empty(), line.where(), ": '", fields[i].name, "' is empty");
    }
    return values;
}

// ---- randomness --------------------------------------------------------------------------------

// A uniform integer in [low, high]. (next_u64() % span is biased by at most span / 2^64: negligible.)
int64_t uniform_int(Generator& gen, int64_t low, int64_t high) {
    const uint64_t span = static_cast<uint64_t>(high - low) + 1;
    return low + static_cast<int64_t>(gen.next_u64() % span);
}

// Fisher-Yates: for i from the end, swap item i with a uniform pick among items 0..i.
template <class T>
void shuffle(std::vector<T>& items, Generator& gen) {
    for (size_t i = items.size(); i > 1; --i) {
        std::swap(items[i - 1], items[uniform_int(gen, 0, static_cast<int64_t>(i) - 1)]);
    }
}

// ---- synthetic tasks ---------------------------------------------------------------------------

constexpr int64_t first_symbol = Tokenizer::eos + 1;                     // 4: ids below are reserved
constexpr int64_t marker_a = first_symbol, marker_b = first_symbol + 1;  // the relative-order markers
constexpr int64_t first_filler = marker_b + 1;                           // 6

// "task: name must be >= bound, got value", where bound spells out low and why.
void require_at_least(const std::string& task, const std::string& name, int64_t value, int64_t low,
                      const std::string& bound) {
    RELGRAD_CHECK(value >= low, task, ": ", name, " must be >= ", bound, ", got ", value);
}

// count >= 1 and shortest <= min_length <= max_length.
void check_sizes(const std::string& task, int64_t count, int64_t min_length, int64_t max_length, int64_t shortest,
                 const std::string& shortest_bound) {
    require_at_least(task, "count", count, 1, "1");
    require_at_least(task, "min_length", min_length, shortest, shortest_bound);
    require_at_least(task, "max_length", max_length, min_length, "min_length = " + std::to_string(min_length));
}

std::vector<int64_t> random_symbols(Generator& gen, int64_t length, int64_t first, int64_t vocab) {
    std::vector<int64_t> symbols(length);
    for (int64_t& s : symbols) s = uniform_int(gen, first, vocab - 1);
    return symbols;
}

// count examples, each made by make(gen) in turn from one generator seeded with seed
template <class Example, class Make>
std::vector<Example> draw_examples(int64_t count, uint64_t seed, Make&& make) {
    Generator gen(seed);
    std::vector<Example> examples;
    for (int64_t i = 0; i < count; ++i) examples.push_back(make(gen));
    return examples;
}

std::vector<TokenPair> make_sequence_task(const std::string& task, int64_t count, int64_t min_length,
                                          int64_t max_length, int64_t vocab, uint64_t seed, bool reversed) {
    check_sizes(task, count, min_length, max_length, 1, "1");
    require_at_least(task, "vocab", vocab, first_symbol + 1, "5 (ids 0..3 are reserved, symbols are 4 .. vocab-1)");
    return draw_examples<TokenPair>(count, seed, [&](Generator& gen) {
        TokenPair pair;
        pair.source = random_symbols(gen, uniform_int(gen, min_length, max_length), first_symbol, vocab);
        pair.target = pair.source;
        if (reversed) std::reverse(pair.target.begin(), pair.target.end());
        return pair;
    });
}

// The format of a file of examples, from its extension (after the checks every data file gets).
Format examples_format(const std::string& path) {
    require_regular_file(path, "a data file");  // before its name: /dev/zero is no data file, whatever its name
    return format_of(path);
}

// The two fields of every example of the file, in the order of `fields`, each text handed to
// keep(index, text) as its line is read.
std::vector<std::array<std::string, 2>> read_examples(const std::string& path, const std::array<Field, 2>& fields,
                                                      const KeepText& keep) {
    const Format format = examples_format(path);
    std::vector<std::array<std::string, 2>> examples;
    for_each_line(path, [&](const Line& line) {
        std::array<std::string, 2> example = parse_example(format, line, fields);
        for (size_t i = 0; i < 2; ++i) {
            if (keep && !fields[i].is_label) keep(examples.size(), example[i]);
        }
        examples.push_back(std::move(example));
    });
    RELGRAD_CHECK_RUNTIME(!examples.empty(), path, ": no examples (the file is empty or only blank lines)");
    return examples;
}

}  // namespace

// ---- files -------------------------------------------------------------------------------------

std::vector<LabeledText> read_classification(const std::string& path, const KeepText& keep) {
    std::vector<LabeledText> examples;
    for (auto& [label, text] : read_examples(path, {Field{"label", true}, Field{"text", false}}, keep))
        examples.push_back({std::move(text), std::move(label)});
    return examples;
}

std::vector<TextPair> read_pairs(const std::string& path, const KeepText& keep) {
    std::vector<TextPair> examples;
    for (auto& [source, target] : read_examples(path, {Field{"source", false}, Field{"target", false}}, keep))
        examples.push_back({std::move(source), std::move(target)});
    return examples;
}

size_t count_examples(const std::string& path) {
    examples_format(path);
    size_t count = 0;
    for_each_line(path, [&count](const Line&) { ++count; });
    RELGRAD_CHECK_RUNTIME(count > 0, path, ": no examples (the file is empty or only blank lines)");
    return count;
}

std::string read_text(const std::string& path) {
    std::string text = read_file(path, "a data file");
    skip_byte_order_mark(text);
    RELGRAD_CHECK_RUNTIME(!text.empty(), path, ": the file is empty, expected UTF-8 text");
    if (const auto error = find_utf8_error(text)) {
        // Name the line as an editor would: lines counted from 1, bytes from the line's start.
        const size_t previous_newline = text.rfind('\n', error->offset);
        const size_t line_start = previous_newline == std::string::npos ? 0 : previous_newline + 1;
        const auto number =
            1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(error->offset), '\n');
        RELGRAD_CHECK_RUNTIME(false, Line{path, number, ""}.where(), ": invalid UTF-8 at byte offset ",
                              error->offset - line_start, " of the line: ", error->reason);
    }
    return text;
}

// ---- held-out split ----------------------------------------------------------------------------

std::vector<size_t> seeded_permutation(size_t n, uint64_t seed) {
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), size_t{0});
    Generator gen(seed);
    shuffle(order, gen);
    return order;
}

size_t held_out_count(size_t n, double fraction) {
    // a NaN fraction fails both comparisons, so it is refused too
    RELGRAD_CHECK(fraction > 0 && fraction < 1, "split_held_out: fraction must be in (0, 1), got ", fraction);
    const auto held_out = static_cast<size_t>(std::llround(fraction * static_cast<double>(n)));
    RELGRAD_CHECK(held_out > 0 && held_out < n, "split_held_out: a fraction of ", fraction, " of ", n,
                  " examples holds out ", held_out, "; both the training and the held-out part must be non-empty");
    return held_out;
}

std::vector<bool> training_mask(size_t n, double fraction, uint64_t seed) {
    const size_t training_count = n - held_out_count(n, fraction);
    const std::vector<size_t> order = seeded_permutation(n, seed);
    std::vector<bool> training(n, false);
    for (size_t i = 0; i < training_count; ++i) training[order[i]] = true;
    return training;
}

// ---- synthetic tasks ---------------------------------------------------------------------------

std::vector<TokenPair> make_copy_task(int64_t count, int64_t min_length, int64_t max_length, int64_t vocab,
                                      uint64_t seed) {
    return make_sequence_task("make_copy_task", count, min_length, max_length, vocab, seed, false);
}

std::vector<TokenPair> make_reverse_task(int64_t count, int64_t min_length, int64_t max_length, int64_t vocab,
                                         uint64_t seed) {
    return make_sequence_task("make_reverse_task", count, min_length, max_length, vocab, seed, true);
}

std::vector<TokenPair> make_sort_task(int64_t count, int64_t min_length, int64_t max_length, int64_t vocab,
                                      uint64_t seed) {
    std::vector<TokenPair> pairs =
        make_sequence_task("make_sort_task", count, min_length, max_length, vocab, seed, false);
    for (TokenPair& pair : pairs) std::sort(pair.target.begin(), pair.target.end());
    return pairs;
}

std::vector<TokenPair> make_addition_task(int64_t count, int64_t min_length, int64_t max_length, int64_t vocab,
                                          uint64_t seed, bool reversed_sum) {
    const std::string task = "make_addition_task";
    check_sizes(task, count, min_length, max_length, 1, "1");
    require_at_least(task, "vocab", vocab, kAdditionVocab, "15 (ids 0..3 are reserved, then ten digits and '+')");
    const int64_t plus = first_symbol + 10;
    return draw_examples<TokenPair>(count, seed, [&](Generator& gen) {
        const int64_t length = uniform_int(gen, min_length, max_length);
        // the digits of a and b, most significant first, the first not 0 unless the number is 0
        auto number = [&] {
            std::vector<int64_t> digits(length);
            for (int64_t d = 0; d < length; ++d) digits[d] = uniform_int(gen, d == 0 && length > 1 ? 1 : 0, 9);
            return digits;
        };
        const std::vector<int64_t> a = number(), b = number();
        std::vector<int64_t> sum;  // least significant first while adding
        int64_t carry = 0;
        for (int64_t d = length - 1; d >= 0; --d) {
            const int64_t total = a[d] + b[d] + carry;
            sum.push_back(total % 10);
            carry = total / 10;
        }
        if (carry) sum.push_back(carry);
        TokenPair pair;
        for (int64_t digit : a) pair.source.push_back(first_symbol + digit);
        pair.source.push_back(plus);
        for (int64_t digit : b) pair.source.push_back(first_symbol + digit);
        for (int64_t digit : sum) pair.target.push_back(first_symbol + digit);
        if (!reversed_sum) std::reverse(pair.target.begin(), pair.target.end());
        return pair;
    });
}

std::vector<TokenPair> make_dedupe_task(int64_t count, int64_t min_length, int64_t max_length, int64_t vocab,
                                        uint64_t seed) {
    const std::string task = "make_dedupe_task";
    check_sizes(task, count, min_length, max_length, 1, "1");
    require_at_least(task, "vocab", vocab, first_symbol + 2, "6 (ids 0..3 are reserved, runs need two symbols)");
    return draw_examples<TokenPair>(count, seed, [&](Generator& gen) {
        TokenPair pair;
        const auto length = static_cast<std::size_t>(uniform_int(gen, min_length, max_length));
        while (pair.source.size() < length) {
            // a run of 1-3 copies of a symbol other than the previous run's
            int64_t symbol = 0;
            do {
                symbol = uniform_int(gen, first_symbol, vocab - 1);
            } while (!pair.target.empty() && symbol == pair.target.back());
            pair.target.push_back(symbol);
            const auto run = static_cast<std::size_t>(uniform_int(gen, 1, 3));
            pair.source.insert(pair.source.end(), std::min(run, length - pair.source.size()), symbol);
        }
        return pair;
    });
}

std::vector<LabeledTokens> make_symbol_at_task(int64_t count, int64_t min_length, int64_t max_length, int64_t vocab,
                                               int64_t position, uint64_t seed) {
    const std::string task = "make_symbol_at_task";
    check_sizes(task, count, min_length, max_length, 1, "1");
    require_at_least(task, "vocab", vocab, first_filler + 2, "8 (ids 0..5 are reserved, two symbols at least)");
    require_at_least(task, "position", position, 0, "0");
    require_at_least(task, "min_length", min_length, position + 1,
                     "position + 1 = " + std::to_string(position + 1) + " (every input has a symbol there)");
    return draw_examples<LabeledTokens>(count, seed, [&](Generator& gen) {
        std::vector<int64_t> tokens =
            random_symbols(gen, uniform_int(gen, min_length, max_length), first_filler, vocab);
        const int64_t label = tokens[static_cast<std::size_t>(position)] - first_filler;
        return LabeledTokens{std::move(tokens), label};
    });
}

std::vector<LabeledTokens> make_relative_order_task(int64_t count, int64_t min_length, int64_t max_length,
                                                    int64_t vocab, int64_t distance, uint64_t seed) {
    const std::string task = "make_relative_order_task";
    check_sizes(task, count, min_length, max_length, 2, "2 (room for both markers)");
    require_at_least(task, "vocab", vocab, first_filler + 1,
                     "7 (ids 0..3 are reserved, 4 and 5 are the markers, symbols are 6 .. vocab-1)");
    require_at_least(task, "distance", distance, 1, "1");
    require_at_least(task, "max_length", max_length, distance + 1,
                     "distance + 1 = " + std::to_string(distance + 1) + " (room for A distance positions before B)");

    Generator gen(seed);
    std::vector<int64_t> labels(count, 0);
    std::fill(labels.begin(), labels.begin() + count / 2, 1);
    shuffle(labels, gen);

    std::vector<LabeledTokens> examples;
    for (const int64_t label : labels) {
        int64_t length = 0, a = 0, b = 0;  // a, b: the positions of the markers
        if (label == 1) {
            length = uniform_int(gen, std::max(min_length, distance + 1), max_length);
            a = uniform_int(gen, 0, length - 1 - distance);
            b = a + distance;
        } else {
            // Uniform over all ordered pairs of distinct positions except the positive ones; a
            // negative always exists (B before A), so this ends.
            length = uniform_int(gen, min_length, max_length);
            do {
                a = uniform_int(gen, 0, length - 1);
                b = uniform_int(gen, 0, length - 1);
            } while (a == b || b - a == distance);
        }
        std::vector<int64_t> tokens = random_symbols(gen, length, first_filler, vocab);
        tokens[a] = marker_a;
        tokens[b] = marker_b;
        examples.push_back({std::move(tokens), label});
    }
    return examples;
}

std::string default_data_dir() {
    const auto variable = [](const char* name) {
        const char* value = std::getenv(name);
        return std::string(value ? value : "");
    };
    if (const std::string data = variable("RELGRAD_DATA"); !data.empty()) return data;
    if (const std::string cache = variable("XDG_CACHE_HOME"); !cache.empty())
        return (fs::path(cache) / "relgrad").string();
    if (const std::string home = variable("HOME"); !home.empty())
        return (fs::path(home) / ".cache" / "relgrad").string();
    RELGRAD_CHECK_RUNTIME(false, "no data directory: set RELGRAD_DATA (or XDG_CACHE_HOME or HOME)");
}

}  // namespace relgrad
