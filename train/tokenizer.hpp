// Tokenizers: text -> ids -> text, at the level of characters or of words.
//
// A character is one Unicode code point, i.e. one UTF-8 sequence of 1 to 4 bytes ("ß" is the two
// bytes C3 9F); a word is a maximal run of bytes that are not ASCII whitespace (space, \t, \n, \r,
// \f, \v). Ids 0..3 are reserved (pad, unk, bos, eos); the vocabulary learned from the training
// texts takes ids 4, 5, ... in a fixed order, so the same texts always give the same ids.
//
// Two options (both off by default) change the text before it is cut, so that fewer distinct
// tokens carry the same words (e.g. for translation with a word vocabulary):
//   lowercase          A-Z and the Latin-1 capitals À-Þ (not ×) become small letters ("Äpfel" ->
//                      "äpfel"); every other character stays as it is
//   split_punctuation  (words only) each punctuation character is a word of its own ("Hi, you!" ->
//                      "Hi" "," "you" "!"): ASCII punctuation, U+00A1-U+00BF (¡ « » ¿ ...), × and
//                      ÷, and General Punctuation U+2010-U+205E (– — ‘ ’ “ ” „ …)
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/enum_names.hpp"

namespace relgrad {

struct TextOptions {
    bool lowercase = false;
    bool split_punctuation = false;  // word tokenizers only
};

class TokenCounts;

class Tokenizer {
public:
    enum class Kind { character, word };
    static constexpr int64_t pad = 0, unk = 1, bos = 2, eos = 3;  // reserved ids, always present

    // Vocabulary from training texts: every character (character) or every word (word) seen at
    // least min_frequency times; ids 4.. by decreasing count, ties by the token's bytes.
    // std::invalid_argument for split_punctuation with characters.
    static Tokenizer build(Kind kind, const std::vector<std::string>& texts, int64_t min_frequency = 1,
                           TextOptions options = {});
    // The same from counts taken one text at a time (the texts need not be kept).
    static Tokenizer build(const TokenCounts& counts, int64_t min_frequency = 1);

    std::vector<int64_t> encode(const std::string& text) const;  // unknown tokens -> unk; no bos/eos added
    std::string decode(
        const std::vector<int64_t>& ids) const;  // skips pad/bos/eos; words joined by one space; unk -> "<unk>"
    std::vector<std::string> tokens(const std::string& text) const;  // the pieces encode() maps, for BLEU
    int64_t vocab_size() const { return static_cast<int64_t>(vocabulary_.size()); }
    Kind kind() const { return kind_; }
    TextOptions options() const { return options_; }

    // {"kind": "char", "lowercase": false, "split_punctuation": false, "tokens": ["<pad>", "<unk>",
    // "<bos>", "<eos>", "e", ...]}: token i has id i. The two options may be left out (false).
    std::string to_json() const;
    static Tokenizer from_json(const std::string& json);  // std::runtime_error "tokenizer JSON: ..." on a bad document

private:
    Tokenizer(Kind kind, TextOptions options, std::vector<std::string> vocabulary);

    Kind kind_;
    TextOptions options_;
    std::vector<std::string> vocabulary_;           // id -> token; ids 0..3 hold the reserved names
    std::unordered_map<std::string, int64_t> ids_;  // learned token -> id (the reserved names are not in it)
};

// How often each token occurs in some texts, counted one text at a time: the first half of
// Tokenizer::build, so that a text may be cut (first_tokens) as soon as it has been counted.
class TokenCounts {
public:
    TokenCounts(Tokenizer::Kind kind, TextOptions options);  // std::invalid_argument: split_punctuation with characters
    void add(const std::string& text);                       // std::invalid_argument on invalid UTF-8

private:
    friend class Tokenizer;
    Tokenizer::Kind kind_;
    TextOptions options_;
    std::map<std::string, int64_t, std::less<>> counts_;  // token -> count, in byte order
    int64_t texts_ = 0;
};

// The start of text that holds its first max_tokens tokens as a tokenizer of this kind and options
// reads them (all of text when it has no more): tokenizer.encode(first_tokens(...)) is
// tokenizer.encode(text) cut after max_tokens ids, for every tokenizer of that kind and options.
std::string first_tokens(Tokenizer::Kind kind, TextOptions options, const std::string& text, int64_t max_tokens);

inline constexpr EnumName<Tokenizer::Kind> tokenizer_kind_names[] = {{Tokenizer::Kind::character, "char"},
                                                                    {Tokenizer::Kind::word, "word"}};
Tokenizer::Kind parse_tokenizer_kind(const std::string& name);  // "char" | "word"
std::string tokenizer_kind_name(Tokenizer::Kind kind);          // the inverse: "char" | "word"

// UTF-8 (RFC 3629): a code point is 1 to 4 bytes, 0xxxxxxx | 110xxxxx 10xxxxxx | 1110xxxx 10xxxxxx
// 10xxxxxx | 11110xxx 10xxxxxx 10xxxxxx 10xxxxxx, in its shortest form, not a UTF-16 surrogate
// (U+D800..U+DFFF) and at most U+10FFFF.
struct Utf8Error {
    size_t offset;       // byte offset (from 0) where the bad sequence starts
    std::string reason;  // e.g. "0xC3 starts a 2-byte character but is followed by 0x28"
};
std::optional<Utf8Error> find_utf8_error(const std::string& text);  // nothing when all of text is valid
// The characters of text, each as its UTF-8 bytes; std::invalid_argument
// "invalid UTF-8 at byte offset N: reason" on bad input.
std::vector<std::string> split_utf8(const std::string& text);

// ASCII whitespace: space, \t, \n, \r, \f, \v.
bool is_ascii_space(char c);
// The words of text: its maximal runs of bytes that are not ASCII whitespace.
std::vector<std::string> split_words(std::string_view text);

}  // namespace relgrad
