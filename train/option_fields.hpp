// Options read from a JSON object, and written back, through their descriptions
// (layers/options.hpp): a config's sections (train/config.cpp) and a layer spec
// (commands/layer_command.cpp) are read with JsonFields, and their resolved forms written with
// JsonFieldsWriter. Errors are JsonReader's: the file, the JSON path, what was got and expected.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "layers/options.hpp"
#include "train/json_reader.hpp"

namespace relgrad {

class JsonFields {
public:
    explicit JsonFields(JsonReader& reader) : reader_(&reader) {}

    template <class Integer>
    void integer(const char* key, Integer& value, int64_t low, int64_t high, int64_t fallback, const char* = "") {
        value = static_cast<Integer>(reader_->integer(key, low, high, fallback));
    }
    void number(const char* key, double& value, double low, double high, bool above_low, double fallback,
                const char* = "") {
        value = reader_->number(key, low, high, fallback, above_low);
    }
    void flag(const char* key, bool& value, bool fallback, const char* = "") { value = reader_->flag(key, fallback); }
    template <class Enum, std::size_t N>
    void named(const char* key, Enum& value, const EnumName<Enum> (&names)[N], Enum fallback, const char* = "") {
        value = *value_named(names, reader_->text(key, std::string(name_of(names, fallback)), names_of(names)));
    }
    int64_t shorthand(const char* key, int64_t low, int64_t high, int64_t fallback, const char* = "") {
        return reader_->integer(key, low, high, fallback);
    }
    void check(bool ok, const char* key, const std::string& expected) {
        if (!ok) reader_->fail(key, expected);
    }

protected:
    JsonReader* reader_;
};

class JsonFieldsWriter {
public:
    explicit JsonFieldsWriter(nlohmann::json& object) : object_(&object) {}

    template <class Integer>
    void integer(const char* key, const Integer& value, int64_t, int64_t, int64_t, const char* = "") {
        (*object_)[key] = value;
    }
    void number(const char* key, double value, double, double, bool, double, const char* = "") {
        (*object_)[key] = value;
    }
    void flag(const char* key, bool value, bool, const char* = "") { (*object_)[key] = value; }
    template <class Enum, std::size_t N>
    void named(const char* key, Enum value, const EnumName<Enum> (&names)[N], Enum, const char* = "") {
        (*object_)[key] = name_of(names, value);
    }
    // a shorthand is never written: the keys it gave defaults to are
    int64_t shorthand(const char*, int64_t, int64_t, int64_t fallback, const char* = "") { return fallback; }
    void check(bool, const char*, const std::string&) {}

protected:
    nlohmann::json* object_;
};

}  // namespace relgrad
