#include "commands/converters.hpp"

#include <array>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

#include "engine/errors.hpp"
#include "train/tokenizer.hpp"
#include "train/json_reader.hpp"

namespace relgrad {

namespace {

// ---- sentiment ---------------------------------------------------------------------------------

// Windows-1252 text read as Latin-1 turns its punctuation into C1 controls U+0080..U+009F; this is
// what those bytes mean in Windows-1252 (empty: undefined there, dropped).
const std::array<const char*, 32> windows_1252_c1 = {"€", "",  "‚", "ƒ", "„", "…", "†", "‡", "ˆ", "‰", "Š",
                                                     "‹", "Œ", "",  "Ž", "",  "",  "‘", "’", "“", "”", "•",
                                                     "–", "—", "˜", "™", "š", "›", "œ", "",  "ž", "Ÿ"};

// Trimmed, one line (tabs and line breaks would break a TSV line), C1 controls repaired.
std::string clean_sentiment_text(const std::string& text) {
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
        const unsigned char c = static_cast<unsigned char>(text[i]);
        // U+0080..U+009F is 0xC2 0x80..0x9F in UTF-8.
        if (c == 0xC2 && i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xE0) == 0x80) {
            out += windows_1252_c1[static_cast<unsigned char>(text[i + 1]) - 0x80];
            ++i;
        } else {
            out += is_ascii_space(text[i]) ? ' ' : text[i];
        }
    }
    const size_t first = out.find_first_not_of(' '), last = out.find_last_not_of(' ');
    return first == std::string::npos ? "" : out.substr(first, last - first + 1);
}

// ---- de-en (Ding) ------------------------------------------------------------------------------

// Splits at `separator` where it is outside (...), {...} and [...]: "; " inside "(Druck; Vakuum)" or
// "{prp; +Dat.}" is not an alternative.
std::vector<std::string> split_top_level(std::string_view text, std::string_view separator) {
    std::vector<std::string> parts;
    int depth = 0;
    size_t start = 0;
    for (size_t i = 0; i < text.size();) {
        const char c = text[i];
        if (c == '(' || c == '{' || c == '[') ++depth;
        if ((c == ')' || c == '}' || c == ']') && depth > 0) --depth;
        if (depth == 0 && text.substr(i, separator.size()) == separator) {
            parts.emplace_back(text.substr(start, i - start));
            i += separator.size();
            start = i;
        } else {
            ++i;
        }
    }
    parts.emplace_back(text.substr(start));
    return parts;
}

// Removes {...} (grammar: {m}, {vt}, {adj}, ...) and [...] (usage: [Br.], [coll.], ...) together
// with the spaces before them, so "vigour [Br.]/vigor [Am.])." becomes "vigour/vigor).".
std::string remove_annotations(std::string_view text) {
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (c == '{' || c == '[') {
            const size_t end = text.find(c == '{' ? '}' : ']', i);
            while (!out.empty() && is_ascii_space(out.back())) out.pop_back();
            if (end == std::string_view::npos) break;  // unclosed: the rest is annotation
            i = end;
        } else {
            out += c;
        }
    }
    return out;
}

// A full sentence: at least 4 words, ending in . ? or !, and not in a pronoun abbreviation (etw., sb.)
// ("die Anstellung bei jdm." / "the employ of sb." are phrases, not sentences).
bool is_full_sentence(const std::string& text) {
    static const std::set<std::string> pronoun_abbreviations = {"etw.", "jd.",  "jdm.", "jdn.",
                                                                "jds.", "sth.", "sb.",  "sb's."};
    const std::vector<std::string> words = split_words(text);
    if (words.size() < 4) return false;
    const char end = text.back();
    if (end != '.' && end != '?' && end != '!') return false;
    const std::string& last = words.back();
    const size_t slash = last.rfind('/');  // "sb./sth."
    return pronoun_abbreviations.count(slash == std::string::npos ? last : last.substr(slash + 1)) == 0;
}

// One side of a sub-entry: annotations removed, its first alternative, single spaces.
std::string ding_first_alternative(const std::string& side) {
    return collapse_spaces(split_top_level(remove_annotations(side), "; ").front());
}

// ---- brown -------------------------------------------------------------------------------------

std::string brown_word(const std::string& token) {
    const size_t slash = token.rfind('/');  // the word may hold '/' itself: "1/2/cd", "//in"
    RELGRAD_CHECK_RUNTIME(slash != std::string::npos && slash > 0 && slash + 1 < token.size(), "Brown token '", token,
                          "' is not word/tag");
    const std::string word = token.substr(0, slash);
    return word == "``" || word == "''" ? "\"" : word;
}

}  // namespace

std::string collapse_spaces(std::string_view text) {
    std::string out;
    bool pending_space = false;
    for (char c : text) {
        if (is_ascii_space(c)) {
            pending_space = !out.empty();
        } else {
            if (pending_space) out += ' ';
            pending_space = false;
            out += c;
        }
    }
    return out;
}

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
    std::string out;
    for (size_t i = 0; i < parts.size(); ++i) out += (i ? separator : "") + parts[i];
    return out;
}

std::vector<std::pair<int, std::string>> convert_sentiment_json(const std::string& json_text, const std::string& source,
                                                                SentimentCounts* counts) {
    nlohmann::json document;
    try {
        document = parse_json(json_text, source);
    } catch (const std::invalid_argument& e) {
        throw std::runtime_error(e.what());
    }
    RELGRAD_CHECK_RUNTIME(document.is_array(), source, ": expected a JSON list of {\"text\", \"class\"}");
    std::vector<std::pair<int, std::string>> examples;
    std::set<std::pair<int, std::string>> seen;
    size_t duplicates = 0;
    for (size_t i = 0; i < document.size(); ++i) {
        const nlohmann::json& item = document[i];
        const std::string where = source + ": item " + std::to_string(i) + ": ";
        RELGRAD_CHECK_RUNTIME(item.is_object() && item.contains("text") && item["text"].is_string(), where,
                              "expected an object with a string \"text\"");
        const std::string text = clean_sentiment_text(item["text"].get<std::string>());
        const bool last = i + 1 == document.size();
        if (text.empty() && last) continue;  // the file's empty last item, {"text":"","class":null}
        RELGRAD_CHECK_RUNTIME(!text.empty(), where, "empty text (only the last item may be empty)");
        const nlohmann::json& label = item.contains("class") ? item["class"] : nlohmann::json();
        RELGRAD_CHECK_RUNTIME(is_int64(label) && (label.get<int64_t>() == 0 || label.get<int64_t>() == 1), where,
                              "\"class\" must be 0 or 1, got ", json_excerpt(label));
        std::pair<int, std::string> example{static_cast<int>(label.get<int64_t>()), text};
        if (seen.insert(example).second) {
            examples.push_back(std::move(example));
        } else {
            ++duplicates;
        }
    }
    if (counts) *counts = {document.size(), duplicates};
    return examples;
}

std::vector<std::pair<std::string, std::string>> convert_ding_line(const std::string& raw_line) {
    std::string line = raw_line;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#' || collapse_spaces(line).empty()) return {};
    const size_t separator = line.find(" :: ");
    RELGRAD_CHECK_RUNTIME(separator != std::string::npos && line.find(" :: ", separator + 4) == std::string::npos,
                          "expected 'German :: English' with one ' :: ', got '", line.substr(0, 120), "'");
    const std::vector<std::string> german = split_top_level(std::string_view(line).substr(0, separator), " | ");
    const std::vector<std::string> english = split_top_level(std::string_view(line).substr(separator + 4), " | ");
    if (german.size() != english.size()) return {};  // sub-entries that do not align
    std::vector<std::pair<std::string, std::string>> pairs;
    for (size_t i = 0; i < german.size(); ++i) {
        std::string source = ding_first_alternative(german[i]), target = ding_first_alternative(english[i]);
        if (is_full_sentence(source) && is_full_sentence(target))
            pairs.emplace_back(std::move(source), std::move(target));
    }
    return pairs;
}

std::vector<std::string> convert_brown_file(const std::string& text) {
    std::vector<std::string> sentences;
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
        std::vector<std::string> words = split_words(line);
        if (words.empty()) continue;
        for (std::string& word : words) word = brown_word(word);
        sentences.push_back(join(words, " "));
    }
    return sentences;
}

}  // namespace relgrad
