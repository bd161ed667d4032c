// no gradient check: dataset files and synthetic tasks are inputs to training, nothing here is differentiable.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <set>
#include <stdexcept>

#include "train/datasets.hpp"

using namespace relgrad;
namespace fs = std::filesystem;

namespace {

using Ids = std::vector<int64_t>;

// A scratch directory for the files a test writes, removed afterwards.
struct Workspace {
    fs::path root = fs::temp_directory_path() / "relgrad_test_datasets";
    Workspace() {
        fs::remove_all(root);
        fs::create_directories(root);
    }
    ~Workspace() { fs::remove_all(root); }
    std::string write(const std::string& name, const std::string& content) {
        const fs::path path = root / name;
        std::ofstream(path, std::ios::binary) << content;
        return path.string();
    }
};

std::string error_of(const std::function<void()>& run) {
    try {
        run();
    } catch (const std::exception& e) {  // bad content: runtime_error; a missing file: invalid_argument
        return e.what();
    }
    return "no error";
}

std::string classification_error(const std::string& path) {
    return error_of([&] { read_classification(path); });
}
std::string pairs_error(const std::string& path) {
    return error_of([&] { read_pairs(path); });
}

int64_t index_of(const Ids& tokens, int64_t id) { return std::find(tokens.begin(), tokens.end(), id) - tokens.begin(); }

}  // namespace

TEST_CASE("classification from TSV: label<TAB>text, blank lines skipped, \\r\\n accepted") {
    Workspace w;
    const std::string path =
        w.write("reviews.tsv", "pos\tGroße Freude!\n\nneg\tschlecht, sehr schlecht\r\n  \t \n1\tFuß\n");
    const std::vector<LabeledText> examples = read_classification(path);
    REQUIRE(examples.size() == 3);
    CHECK(examples[0].label == "pos");
    CHECK(examples[0].text == "Große Freude!");
    CHECK(examples[1].label == "neg");
    CHECK(examples[1].text == "schlecht, sehr schlecht");
    CHECK(examples[2].label == "1");
    CHECK(examples[2].text == "Fuß");
}

TEST_CASE("classification from JSONL: string and integer labels, other keys ignored") {
    Workspace w;
    const std::string path = w.write("reviews.jsonl", R"({"text": "Schön", "label": "pos"}

{"label": 0, "text": "Öde \"Handlung\"", "id": 17}
{"text": "naja", "label": -2}
)");
    const std::vector<LabeledText> examples = read_classification(path);
    REQUIRE(examples.size() == 3);
    CHECK(examples[0].text == "Schön");
    CHECK(examples[0].label == "pos");
    CHECK(examples[1].text == "Öde \"Handlung\"");
    CHECK(examples[1].label == "0");
    CHECK(examples[2].label == "-2");
}

TEST_CASE("sequence pairs from TSV and JSONL") {
    Workspace w;
    const std::vector<TextPair> tsv =
        read_pairs(w.write("de-en.tsv", "Guten Morgen.\tGood morning.\n\nDie Straße.\tThe street.\n"));
    REQUIRE(tsv.size() == 2);
    CHECK(tsv[0].source == "Guten Morgen.");
    CHECK(tsv[0].target == "Good morning.");
    CHECK(tsv[1].source == "Die Straße.");
    CHECK(tsv[1].target == "The street.");

    const std::vector<TextPair> jsonl =
        read_pairs(w.write("de-en.jsonl", "{\"source\": \"Tschüss\", \"target\": \"Bye\"}\n"));
    REQUIRE(jsonl.size() == 1);
    CHECK(jsonl[0].source == "Tschüss");
    CHECK(jsonl[0].target == "Bye");
}

TEST_CASE("reading hands each text to keep as its line is read: texts only, in file order") {
    Workspace w;
    std::vector<std::pair<size_t, std::string>> seen;
    const KeepText keep = [&seen](size_t index, std::string& text) {
        seen.emplace_back(index, text);
        text.resize(std::min<size_t>(text.size(), 3));  // keep the first 3 bytes
    };
    const std::string reviews = w.write("reviews.tsv", "pos\tGroße Freude\n\nnegative\tschlecht\n");
    const std::vector<LabeledText> examples = read_classification(reviews, keep);
    CHECK(seen == std::vector<std::pair<size_t, std::string>>{{0, "Große Freude"}, {1, "schlecht"}});
    REQUIRE(examples.size() == 2);
    CHECK(examples[0].text == "Gro");
    CHECK(examples[1].text == "sch");
    CHECK(examples[1].label == "negative");  // a label is no text
    CHECK(count_examples(reviews) == 2);     // the blank line is no example

    seen.clear();
    const std::vector<TextPair> pairs = read_pairs(w.write("de-en.tsv", "Guten Morgen\tGood morning\nJa\tYes\n"), keep);
    CHECK(seen ==
          std::vector<std::pair<size_t, std::string>>{{0, "Guten Morgen"}, {0, "Good morning"}, {1, "Ja"}, {1, "Yes"}});
    REQUIRE(pairs.size() == 2);
    CHECK(pairs[0].source == "Gut");
    CHECK(pairs[0].target == "Goo");
    CHECK(pairs[1].target == "Yes");
}

TEST_CASE("malformed dataset lines are errors with path:line and what was expected") {
    Workspace w;
    std::string p = w.write("a.tsv", "pos\tgut\nkein Tab hier\n");
    CHECK(classification_error(p) == p + ":line 2: expected label<TAB>text with exactly one tab, found 0 tabs");
    p = w.write("b.tsv", "\nein\tzwei\tdrei\n");
    CHECK(pairs_error(p) == p + ":line 2: expected source<TAB>target with exactly one tab, found 2 tabs");
    p = w.write("c.tsv", "\tnur Text\n");
    CHECK(classification_error(p) == p + ":line 1: 'label' is empty");
    p = w.write("d.tsv", "Quelle\t\n");
    CHECK(pairs_error(p) == p + ":line 1: 'target' is empty");
    p = w.write("e.tsv", "pos\tgr\xFC\xDF\n");  // Latin-1, not UTF-8
    CHECK(classification_error(p) ==
          p + ":line 1: invalid UTF-8 at byte offset 6 of the line: byte 0xFC cannot start a character");

    p = w.write("f.jsonl", "{\"text\": \"a\", \"label\": 1}\n{\"text\": \"b\", \"label\": 1\n");
    CHECK(classification_error(p).find(p + ":line 2: not valid JSON (") == 0);
    p = w.write("g.jsonl", "[\"a\", 1]\n");
    CHECK(classification_error(p) ==
          p + ":line 1: expected a JSON object {\"label\": ..., \"text\": ...}, got [\"a\",1]");
    p = w.write("h.jsonl", "{\"text\": \"a\"}\n");
    CHECK(classification_error(p) == p + ":line 1: missing key 'label'");
    p = w.write("i.jsonl", "{\"text\": \"a\", \"label\": 1.5}\n");
    CHECK(classification_error(p) == p + ":line 1: 'label' must be a string or an integer, got 1.5");
    p = w.write("j.jsonl", "{\"text\": 3, \"label\": \"x\"}\n");
    CHECK(classification_error(p) == p + ":line 1: 'text' must be a string, got 3");
    p = w.write("k.jsonl", "{\"source\": \"a\", \"target\": null}\n");
    CHECK(pairs_error(p) == p + ":line 1: 'target' must be a string, got null");
    p = w.write("l.jsonl", "{\"source\": 1, \"target\": \"b\"}\n");
    CHECK(pairs_error(p) == p + ":line 1: 'source' must be a string, got 1");
    p = w.write("m.jsonl", "{\"text\": \"\", \"label\": \"x\"}\n");
    CHECK(classification_error(p) == p + ":line 1: 'text' is empty");
    p = w.write("n.jsonl",
                "{\"text\": \"a\", \"label\": \"x\"}\n{\"text\": \"a\", \"label\": \"x\", \"label\": \"y\"}\n");
    CHECK(classification_error(p) == p + ":line 2: /label: the key is given twice");
    // a line past 1 MiB, named once reading passes 1 MiB (the line is never held whole); one of 1 MiB is read
    p = w.write("long.tsv", "pos\tgut\nneg\t" + std::string((1 << 20) + 1 - 4, 'a') + "\n");
    CHECK(classification_error(p) == p + ":line 2: longer than the 1 MiB a line of a data file may hold");
    p = w.write("long_enough.tsv", "pos\tgut\nneg\t" + std::string((1 << 20) - 4, 'a') + "\n");
    CHECK(classification_error(p) == "no error");
    p = w.write("o.tsv", "pos\tgut\n");
    fs::remove(p);
    fs::create_directory(p);
    CHECK(classification_error(p) == p + ": is a directory, expected a data file");
}

TEST_CASE("a UTF-8 byte order mark at the start of a file is not part of its first example") {
    Workspace w;
    const std::string bom = "\xEF\xBB\xBF";
    const auto tsv = read_classification(w.write("bom.tsv", bom + "neg\tschlecht\npos\tgut\n"));
    REQUIRE(tsv.size() == 2);
    CHECK(tsv[0].label == "neg");  // not "\ufeffneg", a third class
    const auto jsonl = read_pairs(w.write("bom.jsonl", bom + "{\"source\": \"a\", \"target\": \"b\"}\n"));
    REQUIRE(jsonl.size() == 1);
    CHECK(jsonl[0].source == "a");
    CHECK(read_text(w.write("bom.txt", bom + "Text")) == "Text");
    // elsewhere it is a character like any other (U+FEFF, a zero-width no-break space)
    CHECK(read_classification(w.write("inner.tsv", "pos\t" + bom + "gut\n"))[0].text == bom + "gut");
}

TEST_CASE("bad dataset files: extension, missing, empty") {
    Workspace w;
    std::string p = w.write("data.csv", "pos,gut\n");
    CHECK(classification_error(p) == p + ": the extension must be .tsv or .jsonl, got '.csv'");
    p = w.write("data", "pos\tgut\n");
    CHECK(pairs_error(p) == p + ": the extension must be .tsv or .jsonl, got ''");
    p = (w.root / "missing.tsv").string();
    CHECK(classification_error(p) == p + ": missing, expected a data file");
    CHECK(error_of([&] { read_text(p); }) == p + ": missing, expected a data file");
    fs::create_directories(w.root / "folder.jsonl");
    p = (w.root / "folder.jsonl").string();
    CHECK(pairs_error(p) == p + ": is a directory, expected a data file");
    p = w.write("blank.tsv", "\n  \n\t\n");
    CHECK(classification_error(p) == p + ": no examples (the file is empty or only blank lines)");
    p = w.write("empty.jsonl", "");
    CHECK(pairs_error(p) == p + ": no examples (the file is empty or only blank lines)");
    // counting the examples (before reading a held-out split) gives the errors reading gives
    CHECK(error_of([&] { count_examples(p); }) == p + ": no examples (the file is empty or only blank lines)");
    p = (w.root / "data.csv").string();
    CHECK(error_of([&] { count_examples(p); }) == p + ": the extension must be .tsv or .jsonl, got '.csv'");
    p = (w.root / "missing.tsv").string();
    CHECK(error_of([&] { count_examples(p); }) == p + ": missing, expected a data file");
}

TEST_CASE("plain text is read byte for byte and checked as UTF-8") {
    Workspace w;
    const std::string text = "Heiße Grüße\r\naus Köln.\n\n";
    CHECK(read_text(w.write("ok.txt", text)) == text);
    std::string p = w.write("bad.txt", "erste Zeile\nzweite \xC3(\n");
    CHECK(error_of([&] { read_text(p); }) ==
          p + ":line 2: invalid UTF-8 at byte offset 7 of the line: 0xC3 starts a 2-byte character but byte 2 is 0x28");
    p = w.write("cut.txt", "ab\xE2\x82");
    CHECK(error_of([&] { read_text(p); }) ==
          p + ":line 1: invalid UTF-8 at byte offset 2 of the line: 0xE2 starts a 3-byte character but the text ends");
    p = w.write("empty.txt", "");
    CHECK(error_of([&] { read_text(p); }) == p + ": the file is empty, expected UTF-8 text");
}

TEST_CASE("held-out split: sizes, determinism, errors") {
    std::vector<int> examples(10);
    std::iota(examples.begin(), examples.end(), 0);
    const auto [train, held_out] = split_held_out(examples, 0.2, 7);
    CHECK(train.size() == 8);
    CHECK(held_out.size() == 2);
    std::vector<int> all = train;
    all.insert(all.end(), held_out.begin(), held_out.end());
    CHECK(all != examples);  // shuffled
    std::sort(all.begin(), all.end());
    CHECK(all == examples);  // every example exactly once

    CHECK(split_held_out(examples, 0.2, 7) == std::make_pair(train, held_out));
    // training_mask says which examples split_held_out puts in training, before they are read
    const std::vector<bool> training = training_mask(examples.size(), 0.2, 7);
    for (const int example : examples) {
        CAPTURE(example);
        CHECK(training[example] == (std::find(train.begin(), train.end(), example) != train.end()));
    }
    CHECK(split_held_out(examples, 0.2, 8) != std::make_pair(train, held_out));
    CHECK(split_held_out(examples, 0.25, 7).second.size() == 3);  // round(2.5) = 3
    CHECK(split_held_out(std::vector<int>{1, 2}, 0.5, 7).first.size() == 1);

    const std::vector<int> three = {1, 2, 3};
    CHECK_THROWS_WITH_AS(split_held_out(three, 0.1, 7),
                         "split_held_out: a fraction of 0.1 of 3 examples holds out 0; both the training and the "
                         "held-out part must be non-empty",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(split_held_out(three, 0.9, 7),
                         "split_held_out: a fraction of 0.9 of 3 examples holds out 3; both the training and the "
                         "held-out part must be non-empty",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(split_held_out(three, 0.0, 7), "split_held_out: fraction must be in (0, 1), got 0",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(split_held_out(three, 1.0, 7), "split_held_out: fraction must be in (0, 1), got 1",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(split_held_out(three, std::nan(""), 7), "split_held_out: fraction must be in (0, 1), got nan",
                         std::invalid_argument);
}

TEST_CASE("copy and reverse tasks: seeded, lengths in range, symbols 4 .. vocab-1") {
    const std::vector<TokenPair> copy = make_copy_task(300, 3, 6, 9, 11);
    REQUIRE(copy.size() == 300);
    std::set<size_t> lengths;
    std::set<int64_t> symbols;
    for (const TokenPair& pair : copy) {
        CHECK(pair.target == pair.source);
        lengths.insert(pair.source.size());
        symbols.insert(pair.source.begin(), pair.source.end());
    }
    CHECK(lengths == std::set<size_t>{3, 4, 5, 6});  // every length in [3, 6], nothing else
    CHECK(symbols == std::set<int64_t>{4, 5, 6, 7, 8});

    const auto sources = [](const std::vector<TokenPair>& task) {
        std::vector<Ids> result;
        for (const TokenPair& pair : task) result.push_back(pair.source);
        return result;
    };
    CHECK(sources(make_copy_task(300, 3, 6, 9, 11)) == sources(copy));
    CHECK(sources(make_copy_task(300, 3, 6, 9, 12)) != sources(copy));
    // Pinned, so that a change in how the data is drawn shows up here. Computed apart from relgrad
    // with Philox 4x32-10 written in Python from the paper (checked against Random123's known
    // answers): seed 11, one block for the length, then each symbol 4 + (words 0, 1 of a block) % 5.
    CHECK(make_copy_task(1, 5, 5, 9, 11)[0].source == Ids{7, 7, 8, 5, 5});

    const std::vector<TokenPair> reverse = make_reverse_task(50, 1, 4, 20, 3);
    CHECK(sources(reverse) == sources(make_copy_task(50, 1, 4, 20, 3)));  // the same draws, another target
    for (const TokenPair& pair : reverse) {
        CHECK(pair.target == Ids(pair.source.rbegin(), pair.source.rend()));
    }
    CHECK(make_reverse_task(1, 3, 3, 5, 0)[0].target == Ids{4, 4, 4});  // vocab 5: one symbol
}

TEST_CASE("copy and reverse tasks: argument errors") {
    CHECK_THROWS_WITH_AS(make_copy_task(0, 1, 4, 10, 0), "make_copy_task: count must be >= 1, got 0",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(make_copy_task(5, 0, 4, 10, 0), "make_copy_task: min_length must be >= 1, got 0",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(make_reverse_task(5, 5, 4, 10, 0),
                         "make_reverse_task: max_length must be >= min_length = 5, got 4", std::invalid_argument);
    CHECK_THROWS_WITH_AS(
        make_reverse_task(5, 1, 4, 4, 0),
        "make_reverse_task: vocab must be >= 5 (ids 0..3 are reserved, symbols are 4 .. vocab-1), got 4",
        std::invalid_argument);
}

TEST_CASE("relative order: labels match the marker positions, balanced classes") {
    const int64_t distance = 3;
    // min_length 2 <= distance: lengths 2 and 3 can only be negatives.
    const std::vector<LabeledTokens> task = make_relative_order_task(101, 2, 8, 12, distance, 5);
    REQUIRE(task.size() == 101);
    int64_t positives = 0, positives_in_first_half = 0;
    std::set<size_t> lengths;
    for (size_t i = 0; i < task.size(); ++i) {
        const Ids& tokens = task[i].tokens;
        CAPTURE(i);
        lengths.insert(tokens.size());
        CHECK(std::count(tokens.begin(), tokens.end(), 4) == 1);  // marker A
        CHECK(std::count(tokens.begin(), tokens.end(), 5) == 1);  // marker B
        for (const int64_t t : tokens) CHECK(((t >= 6 && t < 12) || t == 4 || t == 5));
        const bool a_before_b_by_distance = index_of(tokens, 5) - index_of(tokens, 4) == distance;
        CHECK(task[i].label == (a_before_b_by_distance ? 1 : 0));
        positives += task[i].label;
        if (i < 50) positives_in_first_half += task[i].label;
        if (task[i].label == 1) CHECK(tokens.size() > static_cast<size_t>(distance));
    }
    CHECK(positives == 50);               // count / 2; the odd one out is negative
    CHECK(positives_in_first_half > 10);  // shuffled, not all positives first
    CHECK(positives_in_first_half < 40);
    CHECK(lengths == std::set<size_t>{2, 3, 4, 5, 6, 7, 8});

    const auto labels_and_tokens = [](const std::vector<LabeledTokens>& t) {
        std::vector<std::pair<int64_t, Ids>> result;
        for (const LabeledTokens& example : t) result.emplace_back(example.label, example.tokens);
        return result;
    };
    CHECK(labels_and_tokens(make_relative_order_task(101, 2, 8, 12, distance, 5)) == labels_and_tokens(task));
    CHECK(labels_and_tokens(make_relative_order_task(101, 2, 8, 12, distance, 6)) != labels_and_tokens(task));

    // The smallest case: length 2, distance 1 -> positives are "A B", negatives "B A".
    for (const LabeledTokens& example : make_relative_order_task(10, 2, 2, 7, 1, 0)) {
        CHECK(example.tokens == (example.label == 1 ? Ids{4, 5} : Ids{5, 4}));
    }
}

TEST_CASE("relative order: argument errors") {
    const std::string task = "make_relative_order_task: ";
    CHECK_THROWS_WITH_AS(make_relative_order_task(0, 2, 8, 12, 3, 0), (task + "count must be >= 1, got 0").c_str(),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(make_relative_order_task(10, 1, 8, 12, 3, 0),
                         (task + "min_length must be >= 2 (room for both markers), got 1").c_str(),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(make_relative_order_task(10, 9, 8, 12, 3, 0),
                         (task + "max_length must be >= min_length = 9, got 8").c_str(), std::invalid_argument);
    CHECK_THROWS_WITH_AS(
        make_relative_order_task(10, 2, 8, 6, 3, 0),
        (task + "vocab must be >= 7 (ids 0..3 are reserved, 4 and 5 are the markers, symbols are 6 .. vocab-1), got 6")
            .c_str(),
        std::invalid_argument);
    CHECK_THROWS_WITH_AS(make_relative_order_task(10, 2, 8, 12, 0, 0), (task + "distance must be >= 1, got 0").c_str(),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(
        make_relative_order_task(10, 2, 3, 12, 3, 0),
        (task + "max_length must be >= distance + 1 = 4 (room for A distance positions before B), got 3").c_str(),
        std::invalid_argument);
}

TEST_CASE("dedupe: runs of 1-3 copies, the target one symbol per run, lengths in range") {
    const std::vector<TokenPair> task = make_dedupe_task(300, 4, 12, 9, 21);
    REQUIRE(task.size() == 300);
    std::set<size_t> lengths, runs;
    bool a_run_cut_short = false;
    for (const TokenPair& pair : task) {
        lengths.insert(pair.source.size());
        // the target, rebuilt by collapsing the source's runs, and the run lengths seen
        Ids collapsed;
        size_t run = 0;
        for (size_t i = 0; i < pair.source.size(); ++i) {
            CHECK((pair.source[i] >= 4 && pair.source[i] < 9));
            if (i > 0 && pair.source[i] == pair.source[i - 1]) {
                ++run;
                continue;
            }
            if (i > 0) runs.insert(run);
            collapsed.push_back(pair.source[i]);
            run = 1;
        }
        CHECK(pair.target == collapsed);
        if (run < 3 && pair.target.size() > 1) a_run_cut_short = true;  // the last run may be cut
    }
    CHECK(lengths == std::set<size_t>{4, 5, 6, 7, 8, 9, 10, 11, 12});
    CHECK(runs == std::set<size_t>{1, 2, 3});  // complete runs: every length, nothing longer
    CHECK(a_run_cut_short);
    CHECK(make_dedupe_task(50, 4, 12, 9, 21)[7].source == task[7].source);  // seeded
    CHECK(make_dedupe_task(50, 4, 12, 9, 22)[7].source != task[7].source);
    CHECK_THROWS_WITH_AS(make_dedupe_task(5, 1, 4, 5, 0),
                         "make_dedupe_task: vocab must be >= 6 (ids 0..3 are reserved, runs need two symbols), got 5",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(make_dedupe_task(5, 0, 4, 9, 0), "make_dedupe_task: min_length must be >= 1, got 0",
                         std::invalid_argument);
}

TEST_CASE("symbol at a position: the label is the symbol there, every class drawn") {
    const std::vector<LabeledTokens> task = make_symbol_at_task(400, 3, 10, 12, 2, 4);
    REQUIRE(task.size() == 400);
    std::set<int64_t> labels;
    std::set<size_t> lengths;
    for (const LabeledTokens& example : task) {
        lengths.insert(example.tokens.size());
        for (const int64_t t : example.tokens) CHECK((t >= 6 && t < 12));
        CHECK(example.label == example.tokens[2] - 6);
        labels.insert(example.label);
    }
    CHECK(labels == std::set<int64_t>{0, 1, 2, 3, 4, 5});  // vocab 12: the symbols 6 .. 11
    CHECK(lengths == std::set<size_t>{3, 4, 5, 6, 7, 8, 9, 10});
    CHECK(make_symbol_at_task(20, 3, 10, 12, 2, 4)[5].tokens == task[5].tokens);
    CHECK_THROWS_WITH_AS(make_symbol_at_task(5, 2, 10, 12, 2, 0),
                         "make_symbol_at_task: min_length must be >= position + 1 = 3 (every input has a symbol "
                         "there), got 2",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(make_symbol_at_task(5, 3, 10, 7, 2, 0),
                         "make_symbol_at_task: vocab must be >= 8 (ids 0..5 are reserved, two symbols at least), got 7",
                         std::invalid_argument);
}

TEST_CASE("sort and addition: the target is the sorted source, or the sum's digits") {
    const std::vector<TokenPair> sorted = make_sort_task(200, 2, 9, 8, 5);
    REQUIRE(sorted.size() == 200);
    for (const TokenPair& pair : sorted) {
        Ids expected = pair.source;
        std::sort(expected.begin(), expected.end());
        CHECK(pair.target == expected);
        CHECK((pair.source.size() >= 2 && pair.source.size() <= 9));
    }
    CHECK(make_sort_task(50, 2, 9, 8, 5)[3].source == sorted[3].source);  // seeded
    const std::vector<TokenPair> sums = make_addition_task(300, 1, 7, 15, 6);
    std::set<size_t> lengths;
    bool a_carry_out = false;
    for (const TokenPair& pair : sums) {
        // source: the digits of a, '+' (id 14), the digits of b, of one length, no leading zero
        const auto plus = std::find(pair.source.begin(), pair.source.end(), 14);
        REQUIRE(plus != pair.source.end());
        const Ids a(pair.source.begin(), plus), b(plus + 1, pair.source.end());
        REQUIRE(a.size() == b.size());
        lengths.insert(a.size());
        auto value = [](const Ids& digits) {
            int64_t v = 0;
            for (int64_t d : digits) {
                REQUIRE((d >= 4 && d <= 13));
                v = 10 * v + (d - 4);
            }
            return v;
        };
        if (a.size() > 1) CHECK((a[0] != 4 && b[0] != 4));
        CHECK(value(pair.target) == value(a) + value(b));
        CHECK((pair.target[0] != 4 || pair.target.size() == 1));
        a_carry_out = a_carry_out || pair.target.size() > a.size();
    }
    CHECK(lengths == std::set<size_t>{1, 2, 3, 4, 5, 6, 7});
    CHECK(a_carry_out);
    // the same sums, least significant digit first
    const std::vector<TokenPair> reversed = make_addition_task(300, 1, 7, 15, 6, true);
    for (size_t n = 0; n < sums.size(); ++n) {
        CHECK(reversed[n].source == sums[n].source);
        CHECK(reversed[n].target == Ids(sums[n].target.rbegin(), sums[n].target.rend()));
    }
    CHECK_THROWS_WITH_AS(make_addition_task(5, 1, 4, 14, 0),
                         "make_addition_task: vocab must be >= 15 (ids 0..3 are reserved, then ten digits and '+'), "
                         "got 14",
                         std::invalid_argument);
}
