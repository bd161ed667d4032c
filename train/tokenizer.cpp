#include "train/tokenizer.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "engine/errors.hpp"
#include "engine/enum_names.hpp"
#include "train/json_reader.hpp"

namespace relgrad {

using nlohmann::json;

namespace {

const std::vector<std::string> reserved_names = {"<pad>", "<unk>", "<bos>", "<eos>"};  // ids 0..3

std::string hex(unsigned char byte) {
    char text[5];
    std::snprintf(text, sizeof text, "0x%02X", byte);
    return text;
}

// What a lead byte says: how many bytes its character has (0 when it cannot start one), and the
// range its second byte must lie in. The narrowed ranges rule out the overlong forms (E0 80..9F,
// F0 80..8F), the UTF-16 surrogates (ED A0..BF) and code points above U+10FFFF (F4 90..BF).
struct LeadByte {
    size_t length;
    unsigned char second_low, second_high;
};

LeadByte lead_byte(unsigned char b) {
    if (b <= 0x7F) return {1, 0, 0};
    if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
    if (b == 0xE0) return {3, 0xA0, 0xBF};
    if (b == 0xED) return {3, 0x80, 0x9F};
    if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
    if (b == 0xF0) return {4, 0x90, 0xBF};
    if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
    if (b == 0xF4) return {4, 0x80, 0x8F};
    return {0, 0, 0};  // 80..BF (a continuation byte), C0 C1 (overlong), F5..FF (beyond U+10FFFF)
}

void require_utf8(const std::string& text) {
    const auto error = find_utf8_error(text);
    RELGRAD_CHECK(!error, "invalid UTF-8 at byte offset ", error->offset, ": ", error->reason);
}

// One character (its UTF-8 bytes) as TextOptions::split_punctuation sees it.
bool is_punctuation(std::string_view character) {
    const auto byte = [&](size_t k) { return static_cast<unsigned char>(character[k]); };
    if (character.size() == 1) return std::ispunct(byte(0)) != 0;  // ASCII: !"#$%&'()*+,-./:;<=>?@[\]^_`{|}~
    if (character.size() == 2 && byte(0) == 0xC2) return byte(1) >= 0xA1 && byte(1) <= 0xBF;  // U+00A1-U+00BF
    if (character.size() == 2 && byte(0) == 0xC3) return byte(1) == 0x97 || byte(1) == 0xB7;  // × ÷
    if (character.size() == 3 && byte(0) == 0xE2) {                                           // U+2010-U+205E
        const unsigned code = (byte(1) & 0x3Fu) << 6 | (byte(2) & 0x3Fu);                     // low 12 bits
        return code >= 0x010 && code <= 0x05E;
    }
    return false;
}

// A-Z -> a-z and U+00C0-U+00DE (not U+00D7 ×) -> U+00E0-U+00FE, in UTF-8: C3 80..9E -> C3 A0..BE.
// Every character keeps its byte count, so a token's bytes lie at the same offsets before and after.
std::string lowercased(std::string text) {
    for (size_t i = 0; i < text.size(); ++i) {
        const auto b = static_cast<unsigned char>(text[i]);
        if (b >= 'A' && b <= 'Z') {
            text[i] = static_cast<char>(b + 0x20);
        } else if (b == 0xC3 && i + 1 < text.size()) {
            const auto next = static_cast<unsigned char>(text[i + 1]);
            if (next >= 0x80 && next <= 0x9E && next != 0x97) text[i + 1] = static_cast<char>(next + 0x20);
            ++i;
        }
    }
    return text;
}

// The one place that says where tokens are: each token of `text` (valid UTF-8, options already
// applied) as its bytes, handed to `take` in order until take returns false. Characters are code
// points; words are runs of non-whitespace, and with split_punctuation each punctuation
// character of a word is a token of its own, the runs between it stay whole.
template <class Take>
void for_each_piece(Tokenizer::Kind kind, bool split_punctuation, std::string_view text, Take take) {
    const auto character_length = [&](size_t i) { return lead_byte(static_cast<unsigned char>(text[i])).length; };
    size_t i = 0;
    while (i < text.size()) {
        if (kind == Tokenizer::Kind::character) {
            const size_t length = character_length(i);
            if (!take(text.substr(i, length))) return;
            i += length;
            continue;
        }
        if (is_ascii_space(text[i])) {
            ++i;
            continue;
        }
        size_t end = i;  // the word is text[i, end)
        while (end < text.size() && !is_ascii_space(text[end])) ++end;
        if (!split_punctuation) {
            if (!take(text.substr(i, end - i))) return;
            i = end;
            continue;
        }
        size_t run = i;  // the letters since the last punctuation character
        for (size_t c = i; c < end; c += character_length(c)) {
            const std::string_view character = text.substr(c, character_length(c));
            if (!is_punctuation(character)) continue;
            if (c > run && !take(text.substr(run, c - run))) return;
            if (!take(character)) return;
            run = c + character.size();
        }
        if (end > run && !take(text.substr(run, end - run))) return;
        i = end;
    }
}

// text as the tokenizer reads it: checked to be UTF-8, lowercased when asked for
std::string normalized(TextOptions options, const std::string& text) {
    require_utf8(text);
    return options.lowercase ? lowercased(text) : text;
}

std::vector<std::string> pieces(Tokenizer::Kind kind, TextOptions options, const std::string& text) {
    std::vector<std::string> out;
    for_each_piece(kind, options.split_punctuation, normalized(options, text), [&out](std::string_view piece) {
        out.emplace_back(piece);
        return true;
    });
    return out;
}

}  // namespace

std::optional<Utf8Error> find_utf8_error(const std::string& text) {
    size_t i = 0;
    while (i < text.size()) {
        const auto first = static_cast<unsigned char>(text[i]);
        const LeadByte lead = lead_byte(first);
        if (lead.length == 0) return Utf8Error{i, "byte " + hex(first) + " cannot start a character"};
        const auto starts = [&] { return hex(first) + " starts a " + std::to_string(lead.length) + "-byte character"; };
        for (size_t k = 1; k < lead.length; ++k) {
            if (i + k == text.size()) return Utf8Error{i, starts() + " but the text ends"};
            const auto next = static_cast<unsigned char>(text[i + k]);
            const unsigned char low = k == 1 ? lead.second_low : 0x80, high = k == 1 ? lead.second_high : 0xBF;
            if (next < low || next > high) {
                return Utf8Error{i, starts() + " but byte " + std::to_string(k + 1) + " is " + hex(next)};
            }
        }
        i += lead.length;
    }
    return std::nullopt;
}

std::vector<std::string> split_utf8(const std::string& text) { return pieces(Tokenizer::Kind::character, {}, text); }

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::vector<std::string> split_words(std::string_view text) {
    std::vector<std::string> words;
    size_t i = 0;
    while (i < text.size()) {
        while (i < text.size() && is_ascii_space(text[i])) ++i;
        const size_t start = i;
        while (i < text.size() && !is_ascii_space(text[i])) ++i;
        if (i > start) words.emplace_back(text.substr(start, i - start));
    }
    return words;
}

Tokenizer::Kind parse_tokenizer_kind(const std::string& name) {
    return parse_named(tokenizer_kind_names, name, "tokenizer kind");
}

std::string tokenizer_kind_name(Tokenizer::Kind kind) { return name_of(tokenizer_kind_names, kind); }

Tokenizer::Tokenizer(Kind kind, TextOptions options, std::vector<std::string> vocabulary)
    : kind_(kind), options_(options), vocabulary_(std::move(vocabulary)) {
    for (size_t id = reserved_names.size(); id < vocabulary_.size(); ++id) {
        ids_.emplace(vocabulary_[id], static_cast<int64_t>(id));
    }
}

TokenCounts::TokenCounts(Tokenizer::Kind kind, TextOptions options) : kind_(kind), options_(options) {
    RELGRAD_CHECK(kind != Tokenizer::Kind::character || !options.split_punctuation,
                  "TokenCounts: split_punctuation is for words (characters are split anyway)");
}

void TokenCounts::add(const std::string& text) {
    for_each_piece(kind_, options_.split_punctuation, normalized(options_, text), [this](std::string_view piece) {
        const auto found = counts_.find(piece);
        if (found == counts_.end()) {
            counts_.emplace(piece, 1);
        } else {
            ++found->second;
        }
        return true;
    });
    ++texts_;
}

std::string first_tokens(Tokenizer::Kind kind, TextOptions options, const std::string& text, int64_t max_tokens) {
    RELGRAD_CHECK(max_tokens >= 0, "first_tokens: max_tokens must be >= 0, got ", max_tokens);
    const std::string read = normalized(options, text);
    size_t end = 0;  // where the last token kept ends: lowercasing moved no byte, so also in text
    int64_t kept = 0;
    for_each_piece(kind, options.split_punctuation, read, [&](std::string_view piece) {
        if (kept == max_tokens) return false;
        ++kept;
        end = static_cast<size_t>(piece.data() + piece.size() - read.data());
        return true;
    });
    return kept < max_tokens ? text : text.substr(0, end);
}

Tokenizer Tokenizer::build(Kind kind, const std::vector<std::string>& texts, int64_t min_frequency,
                           TextOptions options) {
    TokenCounts counts(kind, options);
    for (const std::string& text : texts) counts.add(text);
    return build(counts, min_frequency);
}

Tokenizer Tokenizer::build(const TokenCounts& counts, int64_t min_frequency) {
    RELGRAD_CHECK(min_frequency >= 1, "Tokenizer::build: min_frequency must be >= 1, got ", min_frequency);
    std::vector<std::pair<std::string, int64_t>> kept;
    for (const auto& [piece, count] : counts.counts_) {
        if (count >= min_frequency) kept.emplace_back(piece, count);
    }
    RELGRAD_CHECK(!kept.empty(), "Tokenizer::build: no ", counts.kind_ == Kind::character ? "character" : "word",
                  " occurs at least ", min_frequency, " times in the ", counts.texts_, " texts");
    // Most frequent first; equal counts in byte order (std::string compares bytes as unsigned char).
    std::stable_sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    std::vector<std::string> vocabulary = reserved_names;
    for (const auto& entry : kept) vocabulary.push_back(entry.first);
    return Tokenizer(counts.kind_, counts.options_, std::move(vocabulary));
}

std::vector<std::string> Tokenizer::tokens(const std::string& text) const { return pieces(kind_, options_, text); }

std::vector<int64_t> Tokenizer::encode(const std::string& text) const {
    std::vector<int64_t> ids;
    for (const std::string& piece : pieces(kind_, options_, text)) {
        const auto found = ids_.find(piece);
        ids.push_back(found == ids_.end() ? unk : found->second);
    }
    return ids;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids) const {
    std::string text;
    bool first = true;
    for (const int64_t id : ids) {
        RELGRAD_CHECK(id >= 0 && id < vocab_size(), "Tokenizer::decode: id ", id, " is out of range [0, ", vocab_size(),
                      ")");
        if (id == pad || id == bos || id == eos) continue;
        if (kind_ == Kind::word && !first) text += ' ';
        text += vocabulary_[id];  // unk's entry is "<unk>"
        first = false;
    }
    return text;
}

std::string Tokenizer::to_json() const {
    return json{{"kind", tokenizer_kind_name(kind_)},
                {"lowercase", options_.lowercase},
                {"split_punctuation", options_.split_punctuation},
                {"tokens", vocabulary_}}
        .dump();
}

Tokenizer Tokenizer::from_json(const std::string& text) {
    json document;
    try {
        document = parse_json(text, "tokenizer JSON");
    } catch (const std::invalid_argument& e) {
        throw std::runtime_error(e.what());
    }
    RELGRAD_CHECK_RUNTIME(document.is_object(),
                          "tokenizer JSON: expected an object {\"kind\": ..., \"tokens\": [...]}, got ",
                          json_excerpt(document));
    for (const auto& item : document.items()) {
        RELGRAD_CHECK_RUNTIME(item.key() == "kind" || item.key() == "tokens" || item.key() == "lowercase" ||
                                  item.key() == "split_punctuation",
                              "tokenizer JSON: unknown key '", item.key(),
                              "' (expected kind, lowercase, split_punctuation and tokens)");
    }
    RELGRAD_CHECK_RUNTIME(document.contains("kind"), "tokenizer JSON: 'kind' is required");
    RELGRAD_CHECK_RUNTIME(document.contains("tokens"), "tokenizer JSON: 'tokens' is required");
    const json& kind_value = document["kind"];
    RELGRAD_CHECK_RUNTIME(kind_value == "char" || kind_value == "word",
                          "tokenizer JSON: 'kind' must be \"char\" or \"word\", got ", json_excerpt(kind_value));
    const Kind kind = parse_tokenizer_kind(kind_value.get<std::string>());
    TextOptions options;
    for (auto [key, value] :
         {std::pair{"lowercase", &options.lowercase}, {"split_punctuation", &options.split_punctuation}}) {
        if (!document.contains(key)) continue;
        RELGRAD_CHECK_RUNTIME(document[key].is_boolean(), "tokenizer JSON: '", key, "' must be true or false, got ",
                              json_excerpt(document[key]));
        *value = document[key].get<bool>();
    }
    RELGRAD_CHECK_RUNTIME(kind != Kind::character || !options.split_punctuation,
                          "tokenizer JSON: 'split_punctuation' is for words, not characters");

    const json& token_list = document["tokens"];
    RELGRAD_CHECK_RUNTIME(token_list.is_array(), "tokenizer JSON: 'tokens' must be an array of strings, got ",
                          json_excerpt(token_list));
    std::vector<std::string> vocabulary;
    std::map<std::string, size_t> seen;
    for (size_t id = 0; id < token_list.size(); ++id) {
        const json& token = token_list[id];
        const std::string where = "tokens[" + std::to_string(id) + "]";
        RELGRAD_CHECK_RUNTIME(token.is_string(), "tokenizer JSON: ", where, " must be a string, got ",
                              json_excerpt(token));
        const std::string piece = token.get<std::string>();
        if (id < reserved_names.size()) {
            RELGRAD_CHECK_RUNTIME(piece == reserved_names[id], "tokenizer JSON: ", where, " must be \"",
                                  reserved_names[id], "\" (reserved id ", id, "), got ", token.dump());
        } else {
            // A learned token must be exactly one piece of its kind, or encode() could never produce it.
            const std::vector<std::string> split = pieces(kind, options, piece);
            RELGRAD_CHECK_RUNTIME(
                split.size() == 1 && split[0] == piece, "tokenizer JSON: ", where, " must be a single ",
                kind == Kind::character ? "character" : "word without whitespace",
                options.lowercase ? ", in lower case" : "",
                options.split_punctuation ? ", not mixing punctuation and letters" : "", ", got ", token.dump());
            const auto earlier = seen.find(piece);
            RELGRAD_CHECK_RUNTIME(earlier == seen.end(), "tokenizer JSON: ", where, " repeats tokens[", earlier->second,
                                  "] ", token.dump());
            seen.emplace(piece, id);
        }
        vocabulary.push_back(piece);
    }
    RELGRAD_CHECK_RUNTIME(vocabulary.size() >= reserved_names.size(),
                          "tokenizer JSON: 'tokens' must start with the 4 reserved tokens \"<pad>\", \"<unk>\", "
                          "\"<bos>\", \"<eos>\", got ",
                          vocabulary.size(), " tokens");
    return Tokenizer(kind, options, std::move(vocabulary));
}

}  // namespace relgrad
