// fuzz_data: the input is a data file of a file task (train/datasets.hpp), written out as both
// data.tsv and data.jsonl and read with read_classification and read_pairs (and read_text). The
// texts of every file accepted then build the four kinds of tokenizer a config can ask for
// (train/tokenizer.hpp: char, char lowercased, word, word lowercased with split punctuation), and
// each tokenizer must encode every text to ids inside its vocabulary, decode them, and come back
// from its own to_json() (what a run saves as tokenizer.json) encoding the same way; a held-out
// split is drawn too. Refusals are std::exceptions. What reading keeps of a text (first_tokens)
// must encode to the whole text's first ids, and counting a file's examples must match reading it.
// Seeds (corpus/data/): TSV and JSONL files of both kinds, with CRLF, blank lines, non-ASCII text
// and integer labels, and broken ones (no tab, two tabs, bad UTF-8, empty fields, not JSON, a
// JSON line that is not an object, a missing key, a label nested 100,000 levels deep).
#include <algorithm>
#include <exception>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "train/datasets.hpp"
#include "train/tokenizer.hpp"

using namespace relgrad_fuzz;
using relgrad::Tokenizer;

namespace {

// Every tokenizer of the texts; a tokenizer that refuses them must say so with a std::exception.
void tokenize(const std::vector<std::string>& texts) {
    struct Kind {
        Tokenizer::Kind kind;
        relgrad::TextOptions options;
    };
    const Kind kinds[] = {{Tokenizer::Kind::character, {false, false}},
                          {Tokenizer::Kind::character, {true, false}},
                          {Tokenizer::Kind::word, {false, false}},
                          {Tokenizer::Kind::word, {true, true}}};
    for (const Kind& kind : kinds) {
        for (int64_t min_frequency : {1, 2}) {
            std::optional<Tokenizer> built;
            try {
                built = Tokenizer::build(kind.kind, texts, min_frequency, kind.options);
            } catch (const std::exception&) {
                continue;
            }
            std::optional<Tokenizer> reloaded;
            try {
                reloaded = Tokenizer::from_json(built->to_json());
            } catch (const std::exception& e) {
                finding(std::string("a built tokenizer does not load from its own to_json(): ") + e.what());
            }
            if (reloaded->vocab_size() != built->vocab_size() || reloaded->to_json() != built->to_json()) {
                finding("a tokenizer reloaded from to_json() differs: " + built->to_json() + " became " +
                        reloaded->to_json());
            }
            for (const std::string& text : texts) {
                const std::vector<int64_t> ids = built->encode(text);
                for (int64_t id : ids) {
                    if (id < 0 || id >= built->vocab_size()) {
                        finding("encode() gave id " + std::to_string(id) + " outside the vocabulary of " +
                                std::to_string(built->vocab_size()));
                    }
                }
                if (reloaded->encode(text) != ids) finding("a reloaded tokenizer encodes differently");
                // what reading keeps of a text encodes to the first ids of the whole text
                for (const std::size_t n : {std::size_t{0}, std::size_t{1}, ids.size() / 2, ids.size()}) {
                    const std::string kept =
                        relgrad::first_tokens(kind.kind, kind.options, text, static_cast<int64_t>(n));
                    const auto first = ids.begin() + static_cast<std::ptrdiff_t>(std::min(n, ids.size()));
                    if (built->encode(kept) != std::vector<int64_t>(ids.begin(), first)) {
                        finding("first_tokens(" + std::to_string(n) + ") of " + nlohmann::json(text).dump() +
                                " encodes to other ids than the whole text's first " + std::to_string(n));
                    }
                }
                static_cast<void>(built->decode(ids));
                static_cast<void>(built->tokens(text));
            }
        }
    }
}

// A held-out split; the examples counted before reading (count_examples) and the training part
// known before reading (training_mask) must be those of the examples read.
template <class T>
void split(const std::vector<T>& examples, const fs::path& path) {
    if (relgrad::count_examples(path.string()) != examples.size()) finding("count_examples differs from reading");
    try {
        const auto parts = relgrad::split_held_out(examples, 0.25, 7);
        if (parts.first.size() + parts.second.size() != examples.size()) finding("split_held_out lost examples");
        const std::vector<bool> training = relgrad::training_mask(examples.size(), 0.25, 7);
        if (static_cast<std::size_t>(std::count(training.begin(), training.end(), true)) != parts.first.size())
            finding("training_mask and split_held_out disagree on the training part's size");
    } catch (const std::exception&) {
    }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    single_thread();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view bytes(reinterpret_cast<const char*>(data), size);
    for (const char* name : {"data.tsv", "data.jsonl"}) {
        const fs::path path = scratch_dir("data") / name;
        write_file(path, bytes);
        try {
            const std::vector<relgrad::LabeledText> examples = relgrad::read_classification(path.string());
            std::vector<std::string> texts;
            for (const auto& example : examples) texts.push_back(example.text);
            tokenize(texts);
            split(examples, path);
        } catch (const std::exception&) {
        }
        try {
            const std::vector<relgrad::TextPair> pairs = relgrad::read_pairs(path.string());
            std::vector<std::string> texts;
            for (const auto& pair : pairs) {
                texts.push_back(pair.source);
                texts.push_back(pair.target);
            }
            tokenize(texts);
            split(pairs, path);
        } catch (const std::exception&) {
        }
    }
    try {
        const std::string text = relgrad::read_text((scratch_dir("data") / "data.tsv").string());
        // byte for byte, a leading UTF-8 byte order mark aside (train/datasets.hpp)
        const std::string_view expected = bytes.substr(0, 3) == "\xEF\xBB\xBF" ? bytes.substr(3) : bytes;
        if (text != expected) finding("read_text did not return the file byte for byte");
    } catch (const std::exception&) {
    }
    return 0;
}
