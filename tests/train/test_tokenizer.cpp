// no gradient check: tokenizers map text to integer ids, nothing here is differentiable.
#include <doctest/doctest.h>

#include <functional>
#include <stdexcept>

#include "train/tokenizer.hpp"

using namespace relgrad;

namespace {

using Ids = std::vector<int64_t>;
using Pieces = std::vector<std::string>;

std::string error_of(const std::function<void()>& run) {
    try {
        run();
    } catch (const std::exception& e) {
        return e.what();
    }
    return "no error";
}

}  // namespace

TEST_CASE("characters are code points: multi-byte UTF-8 round-trips") {
    // "ü" is C3 BC, "ß" C3 9F, "€" E2 82 AC, "𝄞" F0 9D 84 9E: one character each.
    CHECK(split_utf8("Grüße €𝄞") == Pieces{"G", "r", "ü", "ß", "e", " ", "€", "𝄞"});
    const std::vector<std::string> texts = {"Grüße aus Köln", "Äpfel und Öl", "Maß €𝄞"};
    const Tokenizer t = Tokenizer::build(Tokenizer::Kind::character, texts);
    CHECK(t.kind() == Tokenizer::Kind::character);
    for (const std::string& text : texts) {
        CAPTURE(text);
        const Ids ids = t.encode(text);
        CHECK(ids.size() == split_utf8(text).size());
        CHECK(t.decode(ids) == text);
        CHECK(t.tokens(text) == split_utf8(text));
    }
    CHECK(t.encode("ü") == Ids{t.encode("Grüße")[2]});  // one id for the two bytes
}

TEST_CASE("character ids: reserved 0..3, then by decreasing count, ties by bytes") {
    // counts: a 3, b 3, c 1, ä 1 (C3 A4 sorts after c, 63); a and b tie and go by bytes.
    const Tokenizer t = Tokenizer::build(Tokenizer::Kind::character, {"abba", "cab", "ä"});
    CHECK(t.vocab_size() == 8);
    CHECK(t.encode("abcä") == Ids{4, 5, 6, 7});
    CHECK(Tokenizer::build(Tokenizer::Kind::character, {"ä", "cab", "abba"}).encode("abcä") == Ids{4, 5, 6, 7});
    CHECK(Tokenizer::pad == 0);
    CHECK(Tokenizer::unk == 1);
    CHECK(Tokenizer::bos == 2);
    CHECK(Tokenizer::eos == 3);
    CHECK(t.encode("") == Ids{});
    CHECK(t.encode("axb") == Ids{4, Tokenizer::unk, 5});
    CHECK(t.decode({Tokenizer::bos, 4, Tokenizer::unk, 5, Tokenizer::eos, Tokenizer::pad}) == "a<unk>b");
    CHECK(t.decode({}) == "");
}

TEST_CASE("words: whitespace-separated, min_frequency and <unk>") {
    const std::vector<std::string> texts = {"der Hund  und die Katze", "die Katze\tund\nder Fuß", "der Fuß"};
    CHECK(Tokenizer::build(Tokenizer::Kind::word, texts).tokens(texts[1]) ==
          Pieces{"die", "Katze", "und", "der", "Fuß"});
    // counts: der 3; die 2, Fuß 2, Katze 2, und 2 (by bytes: "F" < "K" < "d" < "u"); Hund 1.
    const Tokenizer t = Tokenizer::build(Tokenizer::Kind::word, texts, 2);
    CHECK(t.kind() == Tokenizer::Kind::word);
    CHECK(t.vocab_size() == 9);
    CHECK(t.encode("der Fuß Katze die und Hund") == Ids{4, 5, 6, 7, 8, Tokenizer::unk});
    CHECK(t.encode("  \n ") == Ids{});
    CHECK(t.decode(t.encode(" die  Katze\tund der Hund ")) == "die Katze und der <unk>");
    CHECK(t.decode({Tokenizer::bos, 7, 6, Tokenizer::eos, Tokenizer::pad}) == "die Katze");

    const Tokenizer all = Tokenizer::build(Tokenizer::Kind::word, texts);
    CHECK(all.vocab_size() == 10);
    CHECK(all.decode(all.encode(texts[0])) == "der Hund und die Katze");

    // The reserved names are not words of the vocabulary: a literal "<pad>" in text is unknown.
    CHECK(t.encode("<pad> <unk>") == Ids{Tokenizer::unk, Tokenizer::unk});
}

TEST_CASE("text options: lower case, punctuation split off") {
    const TextOptions lower{true, false}, split{false, true}, both{true, true};
    // A-Z and the Latin-1 capitals (À-Þ, not ×) become small; ß, ẞ (U+1E9E) and the rest stay
    CHECK(Tokenizer::build(Tokenizer::Kind::word, {"x"}, 1, lower).tokens("Äpfel ÖL Über ÀÞ ×2 ß ẞ Ω") ==
          Pieces{"äpfel", "öl", "über", "àþ", "×2", "ß", "ẞ", "Ω"});
    CHECK(Tokenizer::build(Tokenizer::Kind::character, {"x"}, 1, lower).tokens("AbÉ") == Pieces{"a", "b", "é"});
    // every punctuation character is a word of its own: ASCII, Latin-1 (¿ « »), × ÷, General
    // Punctuation (’ „ “ — …); letters of any script and digits are not punctuation
    CHECK(Tokenizer::build(Tokenizer::Kind::word, {"x"}, 1, split).tokens("Hi, you! ¿Qué? «oui» 2×3 I’ve") ==
          Pieces{"Hi", ",", "you", "!", "¿", "Qué", "?", "«", "oui", "»", "2", "×", "3", "I", "’", "ve"});
    CHECK(Tokenizer::build(Tokenizer::Kind::word, {"x"}, 1, split).tokens("„Ja“—nein… ok.") ==
          Pieces{"„", "Ja", "“", "—", "nein", "…", "ok", "."});
    CHECK(Tokenizer::build(Tokenizer::Kind::word, {"x"}, 1, split).tokens("(...) ‰ ⁋ ÿ") ==
          Pieces{"(", ".", ".", ".", ")", "‰", "⁋", "ÿ"});  // U+2030 and U+204B in the block, ÿ a letter
    // with both, "Das" and "das." share one word; the vocabulary and encode see the same pieces
    const Tokenizer t = Tokenizer::build(Tokenizer::Kind::word, {"Das Haus.", "das haus!"}, 2, both);
    CHECK(t.vocab_size() == 6);  // das, haus
    CHECK(t.encode("DAS Haus?") == Ids{4, 5, Tokenizer::unk});
    CHECK(t.options().lowercase);
    CHECK(t.options().split_punctuation);
    CHECK_THROWS_WITH_AS(Tokenizer::build(Tokenizer::Kind::character, {"a"}, 1, split),
                         "TokenCounts: split_punctuation is for words (characters are split anyway)",
                         std::invalid_argument);
}

TEST_CASE("first_tokens cuts a text where its n-th token ends, for every kind and option") {
    const Tokenizer::Kind word = Tokenizer::Kind::word, character = Tokenizer::Kind::character;
    const TextOptions none{}, split{false, true}, both{true, true};
    CHECK(first_tokens(word, none, "  der Hund  und", 2) == "  der Hund");  // ends with the token, spaces stay
    CHECK(first_tokens(word, split, "Hi, you!", 2) == "Hi,");
    CHECK(first_tokens(word, both, "ÄPFEL, Öl", 1) == "ÄPFEL");  // lowercasing moves no byte: the text's own bytes
    CHECK(first_tokens(character, none, "Grüße", 3) == "Grü");   // ü is two bytes, one token
    CHECK(first_tokens(character, none, "Grüße", 5) == "Grüße");
    CHECK(first_tokens(word, none, "a b", 0).empty());
    CHECK_THROWS_WITH_AS(first_tokens(word, none, "a", -1), "first_tokens: max_tokens must be >= 0, got -1",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(first_tokens(character, none, "ok \x80", 1),
                         "invalid UTF-8 at byte offset 3: byte 0x80 cannot start a character", std::invalid_argument);

    // the promise: encoding the cut text gives the first n ids of encoding the whole text
    const std::vector<std::string> texts = {"Der Hund, die Katze – und „Äpfel“… ok.", "Grüße aus Köln!  (ja)",
                                            "\t x,y;z ×2 ¿Qué? I’ve"};
    for (const auto& [kind, options] : {std::pair{character, none},
                                        {character, TextOptions{true, false}},
                                        {word, none},
                                        {word, split},
                                        {word, both}}) {
        const Tokenizer t = Tokenizer::build(kind, {texts[0]}, 1, options);
        for (const std::string& text : texts) {
            const Ids all = t.encode(text);
            for (size_t n = 0; n <= all.size() + 1; ++n) {
                CAPTURE(text);
                CAPTURE(n);
                CHECK(t.encode(first_tokens(kind, options, text, static_cast<int64_t>(n))) ==
                      Ids(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(std::min(n, all.size()))));
            }
        }
    }
}

TEST_CASE("counts taken one text at a time build the vocabulary build() makes from the texts") {
    const std::vector<std::string> texts = {"Das Haus, das Haus.", "der Hund und die Katze", "das Ende!"};
    const TextOptions both{true, true};
    TokenCounts counts(Tokenizer::Kind::word, both);
    for (const std::string& text : texts) counts.add(text);
    CHECK(Tokenizer::build(counts, 2).to_json() == Tokenizer::build(Tokenizer::Kind::word, texts, 2, both).to_json());
    CHECK(Tokenizer::build(counts, 2).encode("DAS haus der") == Ids{4, 5, Tokenizer::unk});  // das 3, haus 2, der 1
}

TEST_CASE("bad arguments to build and decode") {
    CHECK_THROWS_WITH_AS(Tokenizer::build(Tokenizer::Kind::word, {"a"}, 0),
                         "Tokenizer::build: min_frequency must be >= 1, got 0", std::invalid_argument);
    CHECK_THROWS_WITH_AS(Tokenizer::build(Tokenizer::Kind::word, {"a b", "b"}, 3),
                         "Tokenizer::build: no word occurs at least 3 times in the 2 texts", std::invalid_argument);
    CHECK_THROWS_WITH_AS(Tokenizer::build(Tokenizer::Kind::character, {}),
                         "Tokenizer::build: no character occurs at least 1 times in the 0 texts",
                         std::invalid_argument);
    const Tokenizer t = Tokenizer::build(Tokenizer::Kind::character, {"ab"});
    CHECK_THROWS_WITH_AS(t.decode({4, 6}), "Tokenizer::decode: id 6 is out of range [0, 6)", std::invalid_argument);
    CHECK_THROWS_WITH_AS(t.decode({-1}), "Tokenizer::decode: id -1 is out of range [0, 6)", std::invalid_argument);
}

TEST_CASE("tokenizer kinds by name") {
    CHECK(parse_tokenizer_kind("char") == Tokenizer::Kind::character);
    CHECK(parse_tokenizer_kind("word") == Tokenizer::Kind::word);
    CHECK(tokenizer_kind_name(Tokenizer::Kind::character) == "char");
    CHECK(tokenizer_kind_name(Tokenizer::Kind::word) == "word");
    CHECK_THROWS_WITH_AS(parse_tokenizer_kind("bpe"), "unknown tokenizer kind 'bpe' (expected char or word)",
                         std::invalid_argument);
}

TEST_CASE("invalid UTF-8 is an error naming the byte offset") {
    const Tokenizer chars = Tokenizer::build(Tokenizer::Kind::character, {"ab"});
    const Tokenizer words = Tokenizer::build(Tokenizer::Kind::word, {"ab"});
    // Latin-1 "Grüß": "ü" is FC where UTF-8 needs C3 BC.
    CHECK_THROWS_WITH_AS(chars.encode("Gr\xFC\xDF"),
                         "invalid UTF-8 at byte offset 2: byte 0xFC cannot start a character", std::invalid_argument);
    CHECK_THROWS_WITH_AS(words.encode("ok \x80"), "invalid UTF-8 at byte offset 3: byte 0x80 cannot start a character",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(words.tokens("ab \xC3("),
                         "invalid UTF-8 at byte offset 3: 0xC3 starts a 2-byte character but byte 2 is 0x28",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(Tokenizer::build(Tokenizer::Kind::character, {"ok", "x\xE2\x82"}),
                         "invalid UTF-8 at byte offset 1: 0xE2 starts a 3-byte character but the text ends",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(split_utf8("\xC0\xAF"), "invalid UTF-8 at byte offset 0: byte 0xC0 cannot start a character",
                         std::invalid_argument);  // an overlong "/"
    CHECK_THROWS_WITH_AS(split_utf8("\xED\xA0\x80"),
                         "invalid UTF-8 at byte offset 0: 0xED starts a 3-byte character but byte 2 is 0xA0",
                         std::invalid_argument);  // the surrogate U+D800
    CHECK_THROWS_WITH_AS(split_utf8("\xF4\x90\x80\x80"),
                         "invalid UTF-8 at byte offset 0: 0xF4 starts a 4-byte character but byte 2 is 0x90",
                         std::invalid_argument);  // U+110000, past the last code point
    CHECK_THROWS_WITH_AS(split_utf8("\xF0\x9D\x84("),
                         "invalid UTF-8 at byte offset 0: 0xF0 starts a 4-byte character but byte 4 is 0x28",
                         std::invalid_argument);
    CHECK_FALSE(find_utf8_error("\x7F\xDF\xBF\xEF\xBF\xBF\xF4\x8F\xBF\xBF").has_value());  // the largest of each length
}

TEST_CASE("JSON round trip") {
    const std::vector<std::string> texts = {"Grüße aus Köln", "Straße"};
    for (const auto kind : {Tokenizer::Kind::character, Tokenizer::Kind::word}) {
        const Tokenizer t = Tokenizer::build(kind, texts);
        const Tokenizer back = Tokenizer::from_json(t.to_json());
        CHECK(back.kind() == kind);
        CHECK(back.vocab_size() == t.vocab_size());
        CHECK(back.to_json() == t.to_json());
        for (const std::string& text : {texts[0], texts[1], std::string("Köln unbekannt")}) {
            CHECK(back.encode(text) == t.encode(text));
        }
    }
    CHECK(
        Tokenizer::build(Tokenizer::Kind::word, {"b a b"}).to_json() ==
        R"({"kind":"word","lowercase":false,"split_punctuation":false,"tokens":["<pad>","<unk>","<bos>","<eos>","b","a"]})");
    // the text options travel with the vocabulary; documents without them (older runs) read as off
    const Tokenizer options = Tokenizer::build(Tokenizer::Kind::word, {"A, b"}, 1, TextOptions{true, true});
    const Tokenizer options_back = Tokenizer::from_json(options.to_json());
    CHECK(options_back.encode("B,A") == options.encode("b , a"));
    CHECK(options_back.encode("B,A") == Ids{6, 4, 5});  // "," < "a" < "b" by bytes
    const Tokenizer older = Tokenizer::from_json(R"({"kind":"word","tokens":["<pad>","<unk>","<bos>","<eos>","A,"]})");
    CHECK_FALSE(older.options().lowercase);
    CHECK_FALSE(older.options().split_punctuation);
    CHECK(older.encode("A, a,") == Ids{4, Tokenizer::unk});
}

TEST_CASE("a bad tokenizer document is a clear error") {
    const auto error = [](const std::string& json) { return error_of([&] { Tokenizer::from_json(json); }); };
    const std::string reserved = R"("<pad>", "<unk>", "<bos>", "<eos>")";
    CHECK(error("{\"kind\": \"char\"").find("tokenizer JSON: not valid JSON (") == 0);
    CHECK(error("[1]") == R"(tokenizer JSON: expected an object {"kind": ..., "tokens": [...]}, got [1])");
    CHECK(error(R"({"kind": "char", "kind": "word", "tokens": []})") ==
          "tokenizer JSON: /kind: the key is given twice");
    CHECK(error(R"({"tokens": []})") == "tokenizer JSON: 'kind' is required");
    CHECK(error(R"({"kind": "char"})") == "tokenizer JSON: 'tokens' is required");
    CHECK(error(R"({"kind": "char", "tokens": [], "size": 4})") ==
          "tokenizer JSON: unknown key 'size' (expected kind, lowercase, split_punctuation and tokens)");
    CHECK(error(R"({"kind": "word", "lowercase": 1, "tokens": []})") ==
          "tokenizer JSON: 'lowercase' must be true or false, got 1");
    CHECK(error(R"({"kind": "char", "split_punctuation": true, "tokens": []})") ==
          "tokenizer JSON: 'split_punctuation' is for words, not characters");
    CHECK(error(R"({"kind": "word", "lowercase": true, "tokens": [)" + reserved + R"(, "Ab"]})") ==
          R"(tokenizer JSON: tokens[4] must be a single word without whitespace, in lower case, got "Ab")");
    CHECK(
        error(R"({"kind": "word", "split_punctuation": true, "tokens": [)" + reserved + R"(, "a."]})") ==
        R"(tokenizer JSON: tokens[4] must be a single word without whitespace, not mixing punctuation and letters, got "a.")");
    CHECK(error(R"({"kind": "bpe", "tokens": []})") == R"(tokenizer JSON: 'kind' must be "char" or "word", got "bpe")");
    CHECK(error(R"({"kind": "char", "tokens": "abc"})") ==
          R"(tokenizer JSON: 'tokens' must be an array of strings, got "abc")");
    CHECK(
        error(R"({"kind": "char", "tokens": ["<pad>", "<unk>"]})") ==
        R"(tokenizer JSON: 'tokens' must start with the 4 reserved tokens "<pad>", "<unk>", "<bos>", "<eos>", got 2 tokens)");
    CHECK(error(R"({"kind": "char", "tokens": ["<pad>", "<bos>", "<unk>", "<eos>"]})") ==
          R"(tokenizer JSON: tokens[1] must be "<unk>" (reserved id 1), got "<bos>")");
    CHECK(error(R"({"kind": "char", "tokens": [)" + reserved + R"(, "a", 5]})") ==
          "tokenizer JSON: tokens[5] must be a string, got 5");
    CHECK(error(R"({"kind": "char", "tokens": [)" + reserved + R"(, "ab"]})") ==
          R"(tokenizer JSON: tokens[4] must be a single character, got "ab")");
    CHECK(error(R"({"kind": "word", "tokens": [)" + reserved + R"(, "a b"]})") ==
          R"(tokenizer JSON: tokens[4] must be a single word without whitespace, got "a b")");
    CHECK(error(R"({"kind": "word", "tokens": [)" + reserved + R"(, ""]})") ==
          R"(tokenizer JSON: tokens[4] must be a single word without whitespace, got "")");
    CHECK(error(R"({"kind": "word", "tokens": [)" + reserved + R"(, "ß", "a", "ß"]})") ==
          R"(tokenizer JSON: tokens[6] repeats tokens[4] "ß")");
    CHECK_THROWS_AS(Tokenizer::from_json("[1]"), std::runtime_error);
    CHECK(Tokenizer::from_json(R"({"kind": "word", "tokens": [)" + reserved + "]}").vocab_size() == 4);
}
