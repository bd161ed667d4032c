// Reading JSON objects with every value checked: type, range, allowed names, unknown keys. Each
// error names the file, the JSON path of the value, what it got and what was expected:
//     quick.json: /training/learning_rate: got -1, expected a number > 0
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace relgrad {

// A JSON value as an error message shows it: as written, cut after 120 characters, or, nested more
// than 32 levels deep, only named as such. Its depth is measured without recursion, so a value
// nested 100,000 levels deep is described, not printed (printing recurses once per level).
std::string json_excerpt(const nlohmann::json& value);
// Whether a JSON value is nested at most `levels` deep (a number or string: 1), measured without
// recursion: what may be dumped or compared safely.
bool nested_at_most(const nlohmann::json& value, int levels);

// Whether a JSON value is an integer that int64_t holds: nlohmann calls 2^63 and above an integer
// too (an unsigned one) and get<int64_t>() would wrap it to a negative number.
bool is_int64(const nlohmann::json& value);

// Parses JSON text, refusing what nlohmann would accept silently: a key given twice in one object
// (which would keep the last value). Errors (std::invalid_argument) start with `where`:
//     quick.json: not valid JSON (...)
//     quick.json: /training/steps: the key is given twice
nlohmann::json parse_json(const std::string& text, const std::string& where);

class JsonReader {
public:
    // object: the JSON object to read; path: its JSON path ("" for the document, "/training")
    JsonReader(const nlohmann::json& object, std::string path, std::string file);

    // A missing key takes the fallback; without one, the key is required.
    std::string text(const std::string& key, const std::optional<std::string>& fallback = std::nullopt,
                     const std::vector<std::string>& allowed = {});
    int64_t integer(const std::string& key, int64_t low, int64_t high, std::optional<int64_t> fallback = std::nullopt);
    double number(const std::string& key, double low, double high, std::optional<double> fallback = std::nullopt,
                  bool above_low = false);  // above_low: low itself is not allowed
    bool flag(const std::string& key, std::optional<bool> fallback = std::nullopt);
    // A list of integers in [low, high]; `count` (if > 0) is the exact length required.
    std::vector<int64_t> integers(const std::string& key, int64_t low, int64_t high, std::size_t count,
                                  const std::optional<std::vector<int64_t>>& fallback = std::nullopt);
    bool has(const std::string& key) const { return object_.contains(key); }
    // A nested object (an empty one when missing); read it with its own reader.
    JsonReader section(const std::string& key);
    // A list of objects, a reader each (paths ".../key/0", ".../key/1", ...); nothing when missing.
    std::optional<std::vector<JsonReader>> objects(const std::string& key);
    // Every key of the object must have been read.
    void finish() const;

    [[noreturn]] void fail(const std::string& key, const std::string& expected) const;
    // Every key read so far (not sections) with the value it took, its default when it was missing.
    const nlohmann::json& resolved() const { return resolved_; }
    std::string path_of(const std::string& key) const { return path_ + "/" + key; }

private:
    const nlohmann::json* value(const std::string& key);
    template <class T>
    T took(const std::string& key, T value) {  // a value read: recorded for resolved()
        resolved_[key] = value;
        return value;
    }

    const nlohmann::json& object_;
    std::string path_, file_;
    std::set<std::string> read_;
    nlohmann::json resolved_ = nlohmann::json::object();
    static const nlohmann::json empty_object_;
};

}  // namespace relgrad
