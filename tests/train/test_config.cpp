// Configs: every kind of bad value reported with its JSON path, optimizer groups, config files,
// overrides. (The trainer around them is tests/train/test_trainer.cpp.)
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "train/config.hpp"
#include "train/make_task.hpp"
#include "train/trainer.hpp"
#include "trainer_check.hpp"

using namespace relgrad;
using namespace relgrad::testing;
namespace fs = std::filesystem;

TEST_CASE("the quickstart and its resolved form are valid configs") {
    const Config c = Config::parse(quickstart_config(), "quickstart");
    CHECK(c.task.kind == TaskKind::relative_order);
    CHECK(c.model.transformer.position == PositionMode::relative);
    const Config again = Config::parse(c.resolved(), "resolved");
    CHECK(again.resolved() == c.resolved());
}

TEST_CASE("learned positions get a vector for the longest input a task feeds its model") {
    auto positions = [](const nlohmann::json& task) {
        nlohmann::json c = {{"task", task}};
        return Config::parse(c, "c.json").model.transformer.max_positions;
    };
    const nlohmann::json copy = {{"kind", "copy"}, {"train_lengths", {2, 8}}, {"test_lengths", {2, 12}}};
    CHECK(positions(copy) == 12 + 2);  // bos + target, or the source
    nlohmann::json decoder_only = copy;
    decoder_only["decoder_only"] = true;
    CHECK(positions(decoder_only) == 12 + 12 + 2);  // source, bos, target and one token past it
    nlohmann::json addition = copy;
    addition["kind"] = "addition";
    CHECK(positions(addition) == 2 * 12 + 1 + 2);  // two numbers and '+'
    addition["decoder_only"] = true;
    CHECK(positions(addition) == (2 * 12 + 1) + (12 + 1) + 2);
}

TEST_CASE("every kind of bad value is reported with its JSON path, what came and what was expected") {
    CHECK(error_of({{"training", {{"lr", 0.1}}}}).find("c.json: /training/lr: unknown key (expected one of:") == 0);
    CHECK(error_of({{"trainin", {{"steps", 1}}}}).find("c.json: /trainin: unknown key") == 0);
    CHECK(error_of({{"training", {{"steps", "ten"}}}}) ==
          "c.json: /training/steps: got \"ten\", expected an integer in [1, 1099511627776]");
    // a value nested 100,000 deep is named, not printed (printing it recursed once per level)
    nlohmann::json deep = nlohmann::json::array();
    for (int level = 0; level < 100000; ++level) deep = nlohmann::json::array({std::move(deep)});
    nlohmann::json deep_config = {{"training", nlohmann::json::object()}};
    deep_config["training"]["steps"] = std::move(deep);  // moved: a copy would recurse once per level
    CHECK(error_of(deep_config) ==
          "c.json: /training/steps: got an array nested more than 32 levels deep, expected an integer in [1, "
          "1099511627776]");
    CHECK(error_of({{"training", {{"steps", std::string(500, 'x')}}}}) ==
          "c.json: /training/steps: got \"" + std::string(119, 'x') + "..., expected an integer in [1, 1099511627776]");
    CHECK(error_of({{"training", {{"learning_rate", -1}}}}) ==
          "c.json: /training/learning_rate: got -1, expected a number in (0, 10]");
    CHECK(error_of({{"training", {{"learning_rate", 0}}}}) ==
          "c.json: /training/learning_rate: got 0, expected a number in (0, 10]");
    CHECK(error_of({{"model", {{"position", "kerple"}}}}) ==
          "c.json: /model/position: got \"kerple\", expected one of \"none\", \"sinusoidal\", \"learned\", "
          "\"relative\", \"gated\", \"rope\", \"alibi\", \"t5\"");
    CHECK(error_of({{"model", {{"dim", 10}, {"heads", 4}}}}) ==
          "c.json: /model/heads: got 4, expected a divisor of dim = 10");
    CHECK(error_of({{"model", {{"token_gate", 1}}}}) == "c.json: /model/token_gate: got 1, expected true or false");
    CHECK(error_of({{"model", 3}}) == "c.json: /model: got 3, expected an object");
    CHECK(error_of({{"task", {{"train_lengths", {9, 4}}}}}) ==
          "c.json: /task/train_lengths: got [9,4], expected [min, max] with min <= max");
    CHECK(error_of({{"task", {{"train_lengths", {4}}}}}) ==
          "c.json: /task/train_lengths: got [4], expected a list of 2 integers in [1, 65536]");
    CHECK(error_of({{"task", {{"distance", 8}}}}) ==
          "c.json: /task/train_lengths: got nothing, expected lengths above /task/distance = 8");
    CHECK(error_of({{"task", {{"distance", 3}, {"test_lengths", {2, 9}}}}}) ==
          "c.json: /task/test_lengths: got [2,9], expected lengths above /task/distance = 3");
    CHECK(error_of({{"task", {{"kind", "symbol_at"}, {"symbol_position", 8}}}}) ==
          "c.json: /task/train_lengths: got nothing, expected lengths above /task/symbol_position = 8");
    CHECK(
        error_of({{"task", {{"kind", "symbol_at"}, {"vocab", 7}}}}) ==
        "c.json: /task/vocab: got 7, expected at least 8 for symbol_at (ids 0..5 are reserved, two symbols at least)");
    CHECK(error_of({{"evaluation", {{"length_buckets", {8, 8}}}}}) ==
          "c.json: /evaluation/length_buckets: got [8,8], expected increasing bounds");
    CHECK(error_of({{"training", {{"steps", 10}, {"epochs", 2}}}}) ==
          "c.json: /training/epochs: got 2, expected either /training/steps or /training/epochs, not both");
    CHECK(error_of({{"training", {{"epochs", 0}}}}) ==
          "c.json: /training/epochs: got 0, expected an integer in [1, 1048576]");
    CHECK(error_of({{"data", {{"lowercase", "yes"}}}}) ==
          "c.json: /data/lowercase: got \"yes\", expected true or false");
    CHECK(error_of({{"data", {{"split_punctuation", true}}}}) ==
          "c.json: /data/split_punctuation: got true, expected false with the char tokenizer (set data.tokenizer = "
          "\"word\")");
    CHECK(error_of(nlohmann::json::array()) == "c.json: /: got [], expected an object");
    // limits that keep a valid config from asking for absurd work (docs/training.md)
    CHECK(error_of({{"task", {{"kind", "copy"}, {"train_examples", 1 << 30}}}}) ==
          "c.json: /task/train_examples: got 1073741824, expected at most 5592405 examples of up to 24 tokens "
          "(/task/train_lengths): a synthetic split holds at most 2^27 tokens");
    CHECK(error_of({{"task", {{"test_lengths", {8, 1 << 20}}}}}) ==
          "c.json: /task/test_lengths: got [8,1048576], expected a list of 2 integers in [1, 65536]");
}

TEST_CASE("optimizer groups: read, checked, written back, and matched against the parameter names") {
    using json = nlohmann::json;
    CHECK(error_of({{"optimizer", {{"groups", {{{"lr_scale", 2}}}}}}}) ==
          "c.json: /optimizer/groups/0/match: got nothing, expected a string");
    CHECK(error_of({{"optimizer", {{"groups", {{{"match", ""}}}}}}}) ==
          "c.json: /optimizer/groups/0/match: got \"\", expected a name pattern (a glob such as \"*bias\")");
    CHECK(error_of({{"optimizer", {{"groups", {{{"match", "*"}, {"lr", 0.1}, {"lr_scale", 2}}}}}}}) ==
          "c.json: /optimizer/groups/0/lr_scale: got 2, expected either lr or lr_scale, not both");
    CHECK(error_of({{"optimizer", {{"groups", {{{"match", "*"}, {"lr_scale", 0}}}}}}}) ==
          "c.json: /optimizer/groups/0/lr_scale: got 0, expected a number in (0, 1e+06]");
    CHECK(error_of({{"optimizer", {{"groups", {{{"match", "*"}, {"weight_decay", -1}}}}}}}) ==
          "c.json: /optimizer/groups/0/weight_decay: got -1, expected a number in [0, 10]");
    CHECK(error_of({{"optimizer", {{"groups", {{{"match", "*"}, {"momentum", 0.9}}}}}}})
              .find("c.json: /optimizer/groups/0/momentum: unknown key") == 0);
    CHECK(error_of({{"optimizer", {{"groups", {{"match", "*"}}}}}}) ==
          "c.json: /optimizer/groups: got {\"match\":\"*\"}, expected a list of objects");
    CHECK(error_of({{"optimizer", {{"groups", json::array({3})}}}}) ==
          "c.json: /optimizer/groups/0: got 3, expected an object");

    // the defaults: no weight decay on biases, norms and gates, written out in the resolved config
    json document = quickstart_config();
    document["model"]["position"] = "gated";
    const Config defaults = Config::parse(document, "c.json");
    REQUIRE(defaults.optimizer.groups.size() == 3);
    CHECK(defaults.resolved()["optimizer"]["groups"] ==
          json::parse(R"([{"match": "*bias", "weight_decay": 0.0}, {"match": "*norm*", "weight_decay": 0.0},
                          {"match": "*gate*", "weight_decay": 0.0}])"));
    Generator gen(1);
    std::optional<Tokenizer> no_tokenizer;
    const auto task = make_task(defaults, Init{gen}, no_tokenizer);
    const std::vector<MatchedGroup> matched = parameter_groups(defaults, task->model());
    REQUIRE(matched.size() == 4);
    for (const std::string& name : matched[2].names) CHECK(name.find("gate") != std::string::npos);
    CHECK(matched[2].names.size() == 2);  // one lambda per layer
    CHECK(matched[3].match.empty());
    CHECK(matched[3].group.weight_decay == 0.01);
    std::size_t caught = 0;
    for (const MatchedGroup& g : matched) {
        caught += g.names.size();
        CHECK(g.names.size() == g.group.parameters.size());
    }
    CHECK(caught == task->model().named_parameters().size());

    // given groups replace the defaults; first match wins; lr becomes a scale of the peak rate
    document["optimizer"]["groups"] = json::parse(R"([{"match": "*.gate", "lr": 0.05},
        {"match": "encoder.layers.?.*", "lr_scale": 0.5, "weight_decay": 0.2}, {"match": "nothing*"}])");
    const Config given = Config::parse(document, "c.json");
    CHECK(Config::parse(given.resolved(), "resolved").resolved() == given.resolved());
    const std::vector<MatchedGroup> regrouped = parameter_groups(given, task->model());
    REQUIRE(regrouped.size() == 4);
    CHECK(regrouped[0].names ==
          std::vector<std::string>{"encoder.layers.0.self_attention.gate", "encoder.layers.1.self_attention.gate"});
    CHECK(regrouped[0].group.lr_scale == doctest::Approx(0.05 / 2e-3));
    CHECK(regrouped[0].group.weight_decay == 0.01);  // training.weight_decay
    CHECK(regrouped[1].group.lr_scale == 0.5);
    CHECK(regrouped[1].group.weight_decay == 0.2);
    for (const std::string& name : regrouped[1].names) CHECK(name.rfind("encoder.layers.", 0) == 0);
    CHECK(regrouped[2].names.empty());  // a group may catch nothing (validate shows it)
    for (const std::string& name : regrouped[3].names) CHECK(name.rfind("encoder.layers.", 0) != 0);
}

TEST_CASE("a config file is read whole and checked: JSON, no key twice, a file and not a directory") {
    TempDir dir("relgrad_test_config_file");
    fs::create_directories(dir.path / "a_directory.json");
    const std::string directory = (dir.path / "a_directory.json").string();
    CHECK_THROWS_WITH_AS(read_config_file(directory), (directory + ": is a directory, expected a config file").c_str(),
                         std::invalid_argument);
    const std::string twice = (dir.path / "twice.json").string();
    std::ofstream(twice) << R"({"training": {"steps": 10, "batch_size": 4, "steps": 20}})";
    CHECK_THROWS_WITH_AS(read_config_file(twice), (twice + ": /training/steps: the key is given twice").c_str(),
                         std::invalid_argument);
    const std::string nested = (dir.path / "nested.json").string();
    std::ofstream(nested) << R"({"model": {"layers": 1}, "task": [{"a": 1}, {"b": 2, "b": 3}]})";
    CHECK_THROWS_WITH_AS(read_config_file(nested), (nested + ": /task/1/b: the key is given twice").c_str(),
                         std::invalid_argument);
    nlohmann::json c = quickstart_config();
    CHECK_THROWS_WITH_AS(apply_override(c, R"(model={"dim": 8, "dim": 16})"),
                         "--set model: /dim: the key is given twice", std::invalid_argument);
    // a "task" nested 100,000 levels deep: looked at in place, never copied (a copy recursed per level)
    const std::string deep = (dir.path / "deep.json").string();
    std::ofstream(deep) << "{\"task\": " << std::string(100000, '[') << std::string(100000, ']') << "}";
    const nlohmann::json deep_task = read_config_file(deep);
    CHECK(parse_task_kind(deep_task) == TaskKind::relative_order);
    nlohmann::json deep_set = quickstart_config();  // and a --set value as deep: moved into place, not copied
    apply_override(deep_set, "training.steps=" + std::string(100000, '[') + std::string(100000, ']'));
    CHECK_THROWS_WITH_AS(Config::parse(deep_set, "c"),
                         "c: /training/steps: got an array nested more than 32 levels deep, expected an integer in [1, "
                         "1099511627776]",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(Config::parse(deep_task, deep),
                         (deep + ": /task: got an array nested more than 32 levels deep, expected an object").c_str(),
                         std::invalid_argument);
}

TEST_CASE("overrides set values by path, read as JSON when they parse") {
    nlohmann::json c = quickstart_config();
    apply_override(c, "training.steps=7");
    apply_override(c, "task.kind=reverse");
    apply_override(c, "task.test_lengths=[3,9]");
    apply_override(c, "model.token_gate=true");
    const Config parsed = Config::parse(c, "c");
    CHECK(parsed.training.steps == 7);
    CHECK(parsed.task.kind == TaskKind::reverse);
    CHECK(parsed.task.test_lengths == std::vector<int64_t>{3, 9});
    CHECK(parsed.model.transformer.token_gate);
    CHECK_THROWS_WITH_AS(apply_override(c, "steps"), "--set steps: expected path.to.key=value", std::invalid_argument);
    CHECK_THROWS_AS(apply_override(c, "training.steps.x=1"), std::invalid_argument);
    // null removes a key: from steps to epochs
    apply_override(c, "training.steps=null");
    apply_override(c, "training.epochs=3");
    CHECK_FALSE(c["training"].contains("steps"));
    CHECK(Config::parse(c, "c").training.epochs == 3);
}

namespace {

// A table row of docs/training.md: | `key` | type | allowed | default | meaning |
struct DocsRow {
    std::string type, allowed, fallback;
};

// The rows of the first table under each "### section" heading of docs/training.md's "## The config".
std::map<std::string, std::map<std::string, DocsRow>> training_docs_tables() {
    std::ifstream in(std::string(RELGRAD_SOURCE_DIR) + "/docs/training.md");
    REQUIRE(in.good());
    std::map<std::string, std::map<std::string, DocsRow>> tables;
    std::string line, section;
    bool in_config = false, in_table = false, table_done = false;
    auto cells_of = [](const std::string& row) {
        std::vector<std::string> cells;
        std::size_t start = 1;
        for (std::size_t bar; (bar = row.find(" |", start)) != std::string::npos; start = bar + 2) {
            std::string cell = row.substr(start, bar - start);
            cell.erase(0, cell.find_first_not_of(' '));
            cells.push_back(cell);
        }
        return cells;
    };
    while (std::getline(in, line)) {
        if (line.rfind("## ", 0) == 0) {
            in_config = line == "## The config";
            section.clear();
        }
        if (in_config && line.rfind("### ", 0) == 0) {
            section = line.substr(4);
            in_table = table_done = false;
            continue;
        }
        if (section.empty() || table_done) continue;
        if (line.rfind("| `", 0) == 0) {
            in_table = true;
            const std::vector<std::string> cells = cells_of(line);
            REQUIRE(cells.size() == 5);
            const std::string key = cells[0].substr(1, cells[0].size() - 2);  // inside the backticks
            tables[section][key] = {cells[1], cells[2], cells[3]};
        } else if (in_table && line.rfind("|", 0) != 0) {
            table_done = true;
        }
    }
    return tables;
}

// "1048576", "2^40", "1e-8", "0.99": a number as the docs write it, or nothing
std::optional<double> docs_number(std::string text) {
    while (!text.empty() && (text.back() == ']' || text.back() == ')' || text.back() == ',')) text.pop_back();
    while (!text.empty() && (text.front() == '(' || text.front() == '[')) text.erase(0, 1);
    if (const auto power = text.find('^'); power != std::string::npos) {
        const auto base = docs_number(text.substr(0, power)), exponent = docs_number(text.substr(power + 1));
        if (!base || !exponent) return std::nullopt;
        return std::pow(*base, *exponent);
    }
    std::size_t used = 0;
    try {
        const double value = std::stod(text, &used);
        if (used == text.size()) return value;
    } catch (const std::exception&) {
    }
    return std::nullopt;
}

// The default cell as a value of the key's kind, or null when it states a rule in words
// ("4 × `dim`", "min(40, steps / 10)"): those are read, not compared.
nlohmann::json docs_default(const ConfigKey& key, const std::string& cell) {
    if (key.kind == "integer" || key.kind == "number") {
        if (const auto value = docs_number(cell)) return *value;
    } else if (key.kind == "boolean" && (cell == "true" || cell == "false")) {
        return cell == "true";
    } else if (key.kind == "string" && cell == "\"\"") {
        return "";
    } else if (key.kind == "string" && cell.size() > 2 && cell.front() == '`' && cell.back() == '`') {
        return cell.substr(1, cell.size() - 2);
    } else if (key.kind == "integers" && cell.size() > 2 && cell.front() == '[') {
        nlohmann::json values = nlohmann::json::array();
        std::istringstream parts(cell.substr(1, cell.size() - 2));
        for (std::string part; std::getline(parts, part, ',');) values.push_back(std::stoll(part));
        return values;
    }
    return nullptr;
}

}  // namespace

TEST_CASE("docs/training.md's key tables show every key of a config with its kind, range and default") {
    auto tables = training_docs_tables();
    int compared_defaults = 0;
    for (const ConfigKey& key : config_keys()) {
        CAPTURE(key.section);
        CAPTURE(key.key);
        REQUIRE(tables[key.section].count(key.key) == 1);
        const DocsRow row = tables[key.section][key.key];
        tables[key.section].erase(key.key);
        // the kind
        const std::map<std::string, std::string> words = {{"integer", "integer"},   {"number", "number"},
                                                          {"boolean", "boolean"},   {"string", "string"},
                                                          {"integers", "integers"}, {"groups", "list of objects"}};
        CHECK(row.type.find(words.at(key.kind)) != std::string::npos);
        // the range: "low - high" or "(low, high]", after "each " for a list; a bound in words
        // ("1 - `batch_size`") is read, not compared
        if (key.kind == "integer" || key.kind == "number" || key.kind == "integers") {
            std::string allowed = row.allowed;
            if (allowed.rfind("each ", 0) == 0) allowed.erase(0, 5);
            std::istringstream words_of(allowed);
            std::string low, separator, high;
            words_of >> low >> separator >> high;
            if (separator != "-") {  // "(0, 10]": "(0," then "10]"
                high = separator;
                CHECK(low.front() == '(');
                CHECK(key.above_low);
            } else {
                CHECK_FALSE(key.above_low);
            }
            REQUIRE(docs_number(low).has_value());
            CHECK(*docs_number(low) == key.low);
            if (docs_number(high)) CHECK(*docs_number(high) == key.high);
        }
        for (const std::string& name : key.names) CHECK(row.allowed.find("`" + name + "`") != std::string::npos);
        // the default
        const nlohmann::json documented = docs_default(key, row.fallback);
        if (!documented.is_null() && !key.fallback.is_null()) {
            CHECK(documented == key.fallback);
            ++compared_defaults;
        }
    }
    for (const auto& [section, rows] : tables) {
        for (const auto& [key, row] : rows)
            FAIL_CHECK("docs/training.md's " << section << " table has " << key << ", no key of a config");
    }
    CHECK(compared_defaults >= 50);  // every default written as a value: the rules in words are the few others
}
