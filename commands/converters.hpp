// relgrad: the converters of `relgrad data fetch` (commands/fetch.hpp): each turns the text of one
// downloaded file into the examples of a data set. Pure functions of their input, testable without
// any network.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace relgrad {

// What convert_sentiment_json found, for SOURCE.txt.
struct SentimentCounts {
    size_t items = 0;       // in the file, the empty last one included
    size_t duplicates = 0;  // dropped
};

// One fixture of npm sentiment: a JSON list of {"text": ..., "class": 0 | 1}. The last item is
// empty ({"text": "", "class": null}) and is dropped; exact duplicates (same label and text) are
// dropped, keeping the first. Texts are trimmed, tabs and line breaks become spaces, and the
// Windows-1252 characters mis-read as C1 controls (U+0085, U+0096, U+0097 in the IMDB file) are
// repaired to the characters meant (…, –, —). Anything else malformed -> std::runtime_error naming
// `source_name` and the item. `counts`, when given, receives the counts.
std::vector<std::pair<int, std::string>> convert_sentiment_json(const std::string& json_text,
                                                                const std::string& source_name,
                                                                SentimentCounts* counts = nullptr);

// One line of the Ding dictionary (trans-de-en): "German :: English", " | " between aligned
// sub-entries, "; " between alternatives, {...} and [...] annotations. Returns the German -> English
// full-sentence pairs of the line: annotations removed, the first alternative taken, both sides at
// least 4 words and ending in . ? or ! (but not in a pronoun abbreviation such as "etw." or "sb./sth.").
// Comment lines ('#') and blank lines give none, and so do sub-entries that do not align (a different
// count of " | " on each side). A line without exactly one " :: " -> std::runtime_error.
std::vector<std::pair<std::string, std::string>> convert_ding_line(const std::string& line);

// One Brown corpus file (Form C): a sentence a line (a leading tab starts a paragraph, blank lines
// between), tokens "word/tag" split at the last '/'. Returns the sentences as words joined by single
// spaces; the quote tokens `` and '' become ". A token without a word or a tag -> std::runtime_error.
std::vector<std::string> convert_brown_file(const std::string& text);

// ---- text helpers the converters share with fetch ----------------------------------------------

// Runs of ASCII whitespace become one space; none at either end.
std::string collapse_spaces(std::string_view text);
// The parts with `separator` between each two.
std::string join(const std::vector<std::string>& parts, const std::string& separator);

}  // namespace relgrad
