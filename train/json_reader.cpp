#include "train/json_reader.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <utility>
#include <vector>

#include "engine/errors.hpp"
#include "layers/options.hpp"

namespace relgrad {

bool nested_at_most(const nlohmann::json& value, int levels) {
    std::vector<std::pair<const nlohmann::json*, int>> pending{{&value, 1}};  // (value, its level)
    while (!pending.empty()) {
        const auto [next, level] = pending.back();
        pending.pop_back();
        if (level > levels) return false;
        if (next->is_structured()) {
            for (const nlohmann::json& child : *next) pending.push_back({&child, level + 1});
        }
    }
    return true;
}

std::string json_excerpt(const nlohmann::json& value) {
    constexpr int kMostLevels = 32;
    constexpr std::size_t kMostCharacters = 120;
    if (!nested_at_most(value, kMostLevels)) {
        return std::string(value.is_array() ? "an array" : "an object") + " nested more than " +
               std::to_string(kMostLevels) + " levels deep";
    }
    std::string text = value.dump();
    if (text.size() > kMostCharacters) text = text.substr(0, kMostCharacters) + "...";
    return text;
}

bool is_int64(const nlohmann::json& value) {
    return value.is_number_integer() &&
           (!value.is_number_unsigned() ||
            value.get<std::uint64_t>() <= static_cast<std::uint64_t>(std::numeric_limits<int64_t>::max()));
}

namespace {

// Follows the parser through the document (one frame per open object or array, no recursion) to
// name the path of a key given twice.
class DuplicateKeyCheck {
public:
    explicit DuplicateKeyCheck(const std::string& where) : where_(where) {}

    bool operator()(int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        using Event = nlohmann::json::parse_event_t;
        switch (event) {
            case Event::object_start: frames_.push_back({true, {}, {}, 0}); break;
            case Event::array_start: frames_.push_back({false, {}, {}, 0}); break;
            case Event::key: {
                frames_.back().key = parsed.get<std::string>();
                const bool first_time = frames_.back().keys.insert(frames_.back().key).second;
                RELGRAD_CHECK(first_time, where_, ": ", path(), ": the key is given twice");
                break;
            }
            case Event::object_end:
            case Event::array_end:
                frames_.pop_back();
                element_done();
                break;
            case Event::value: element_done(); break;
        }
        return true;  // keep everything
    }

private:
    struct Frame {
        bool object;
        std::set<std::string> keys;  // an object's keys so far
        std::string key;             // the key being read
        int64_t index;               // an array's element being read
    };

    void element_done() {
        if (!frames_.empty() && !frames_.back().object) ++frames_.back().index;
    }
    std::string path() const {
        std::string out;
        for (const Frame& frame : frames_) out += "/" + (frame.object ? frame.key : std::to_string(frame.index));
        return out;
    }

    const std::string& where_;
    std::vector<Frame> frames_;
};

}  // namespace

nlohmann::json parse_json(const std::string& text, const std::string& where) {
    try {
        return nlohmann::json::parse(text, DuplicateKeyCheck(where));
    } catch (const nlohmann::json::exception& e) {
        throw std::invalid_argument(where + ": not valid JSON (" + e.what() + ")");
    }
}

const nlohmann::json JsonReader::empty_object_ = nlohmann::json::object();

JsonReader::JsonReader(const nlohmann::json& object, std::string path, std::string file)
    : object_(object), path_(std::move(path)), file_(std::move(file)) {
    RELGRAD_CHECK(object_.is_object(), file_, ": ", path_.empty() ? "/" : path_, ": got ", json_excerpt(object_),
                  ", expected an object");
}

void JsonReader::fail(const std::string& key, const std::string& expected) const {
    const std::string got = object_.contains(key) ? json_excerpt(object_.at(key)) : "nothing";
    RELGRAD_CHECK(false, file_, ": ", path_of(key), ": got ", got, ", expected ", expected);
}

const nlohmann::json* JsonReader::value(const std::string& key) {
    read_.insert(key);
    return object_.contains(key) ? &object_.at(key) : nullptr;
}

std::string JsonReader::text(const std::string& key, const std::optional<std::string>& fallback,
                             const std::vector<std::string>& allowed) {
    const std::string expected = allowed.empty() ? "a string" : names_text(allowed);
    const nlohmann::json* v = value(key);
    if (!v) {
        if (!fallback) fail(key, expected);
        return took(key, *fallback);
    }
    if (!v->is_string()) fail(key, expected);
    const std::string s = v->get<std::string>();
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), s) == allowed.end()) fail(key, expected);
    return took(key, s);
}

int64_t JsonReader::integer(const std::string& key, int64_t low, int64_t high, std::optional<int64_t> fallback) {
    const std::string expected = integer_range_text(low, high);
    const nlohmann::json* v = value(key);
    if (!v) {
        if (!fallback) fail(key, expected);
        return took(key, *fallback);
    }
    if (!is_int64(*v)) fail(key, expected);
    const int64_t x = v->get<int64_t>();
    if (x < low || x > high) fail(key, expected);
    return took(key, x);
}

double JsonReader::number(const std::string& key, double low, double high, std::optional<double> fallback,
                          bool above_low) {
    const std::string expected = number_range_text(low, high, above_low);
    const nlohmann::json* v = value(key);
    if (!v) {
        if (!fallback) fail(key, expected);
        return took(key, *fallback);
    }
    if (!v->is_number()) fail(key, expected);
    const double x = v->get<double>();
    if (!(above_low ? x > low : x >= low) || !(x <= high)) fail(key, expected);
    return took(key, x);
}

bool JsonReader::flag(const std::string& key, std::optional<bool> fallback) {
    const nlohmann::json* v = value(key);
    if (!v) {
        if (!fallback) fail(key, "true or false");
        return took(key, *fallback);
    }
    if (!v->is_boolean()) fail(key, "true or false");
    return took(key, v->get<bool>());
}

std::vector<int64_t> JsonReader::integers(const std::string& key, int64_t low, int64_t high, std::size_t count,
                                          const std::optional<std::vector<int64_t>>& fallback) {
    const std::string expected =
        (count > 0 ? "a list of " + std::to_string(count) + " integers" : "a list of integers") + " in [" +
        std::to_string(low) + ", " + std::to_string(high) + "]";
    const nlohmann::json* v = value(key);
    if (!v) {
        if (!fallback) fail(key, expected);
        return took(key, *fallback);
    }
    if (!v->is_array() || (count > 0 && v->size() != count) || v->empty()) fail(key, expected);
    std::vector<int64_t> out;
    for (const auto& item : *v) {
        if (!is_int64(item) || item.get<int64_t>() < low || item.get<int64_t>() > high) fail(key, expected);
        out.push_back(item.get<int64_t>());
    }
    return took(key, out);
}

JsonReader JsonReader::section(const std::string& key) {
    const nlohmann::json* v = value(key);
    if (v && !v->is_object()) fail(key, "an object");
    return JsonReader(v ? *v : empty_object_, path_of(key), file_);
}

std::optional<std::vector<JsonReader>> JsonReader::objects(const std::string& key) {
    const nlohmann::json* v = value(key);
    if (!v) return std::nullopt;
    if (!v->is_array()) fail(key, "a list of objects");
    std::vector<JsonReader> readers;
    for (std::size_t i = 0; i < v->size(); ++i)
        readers.emplace_back((*v)[i], path_of(key) + "/" + std::to_string(i), file_);
    return readers;
}

void JsonReader::finish() const {
    std::string known;
    for (const std::string& key : read_) known += (known.empty() ? "" : ", ") + key;
    for (const auto& item : object_.items()) {
        RELGRAD_CHECK(read_.count(item.key()), file_, ": ", path_of(item.key()),
                      ": unknown key (expected one of: ", known, ")");
    }
}

}  // namespace relgrad
