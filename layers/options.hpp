// relgrad: a layer's options, described once and read three ways.
//
// Each options struct (RelativeOptions in position.hpp, TransformerOptions in transformer.hpp)
// has one description beside it: a function template that visits every option in order, with
// its name, range, default and a doc line, and states the checks between options:
//
//     template <class Fields>
//     void relative_option_fields(Fields& f, RelativeOptions& o) {
//         f.integer("rank", o.rank, 0, 8192, 0, "> 0: each table is a product A B of this rank");
//         ...
//     }
//
// A Fields class decides what a visit does:
//   DefaultFields (below)        sets every default: the struct's constructor, so C++ code that
//                                writes `TransformerOptions o;` gets the same defaults as the rest
//   OptionDocs (below)           lists the rows, for docs and error messages
//   train/option_fields.hpp      reads a JSON object (a config's model section, a layer spec) and
//                                writes the resolved options back
//   python/nn_options.cpp        reads Python keyword arguments
// so the config, `relgrad layer` and relgrad.nn share names, defaults, ranges and error wording,
// and a new option is one row in its description plus the layer's code.
//
// The Fields interface (every reader implements each call):
//   integer(name, int64_t& value, low, high, fallback, doc)          an integer in [low, high]
//   number(name, double& value, low, high, above_low, fallback, doc)  a number in [low, high]
//                                                                     (above_low: (low, high])
//   flag(name, bool& value, fallback, doc)                           true or false
//   named(name, Enum& value, names, fallback, doc)                   one of an enum's names
//   shorthand(name, low, high, fallback, doc) -> int64_t             a key that only gives other
//                                                                     keys their default (k)
//   check(ok, name, expected)                                        reported at `name` when !ok
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/enum_names.hpp"

namespace relgrad {

// What a value must be, worded the same by every reader:
//   "an integer in [1, 8192]", "a number in (0, 10]", "one of \"mean\", \"first\""
std::string integer_range_text(int64_t low, int64_t high);
std::string number_range_text(double low, double high, bool above_low);
std::string names_text(const std::vector<std::string>& names);

// Sets each option to its default (and checks nothing).
struct DefaultFields {
    void integer(const char*, int64_t& value, int64_t, int64_t, int64_t fallback, const char*) { value = fallback; }
    void number(const char*, double& value, double, double, bool, double fallback, const char*) { value = fallback; }
    void flag(const char*, bool& value, bool fallback, const char*) { value = fallback; }
    template <class Enum, std::size_t N>
    void named(const char*, Enum& value, const EnumName<Enum> (&)[N], Enum fallback, const char*) {
        value = fallback;
    }
    int64_t shorthand(const char*, int64_t, int64_t, int64_t fallback, const char*) { return fallback; }
    void check(bool, const char*, const std::string&) {}
};

// One line per option: "name: what it may be (default ...): doc", as docs and help show them.
class OptionDocs {
public:
    template <class Integer>
    void integer(const char* name, Integer&, int64_t low, int64_t high, int64_t fallback, const char* doc) {
        add(name, integer_range_text(low, high), std::to_string(fallback), doc);
    }
    void number(const char* name, double&, double low, double high, bool above_low, double fallback, const char* doc);
    void flag(const char* name, bool&, bool fallback, const char* doc) {
        add(name, "true or false", fallback ? "true" : "false", doc);
    }
    template <class Enum, std::size_t N>
    void named(const char* name, Enum&, const EnumName<Enum> (&names)[N], Enum fallback, const char* doc) {
        add(name, names_text(names_of(names)), std::string("\"") + name_of(names, fallback) + "\"", doc);
    }
    int64_t shorthand(const char* name, int64_t low, int64_t high, int64_t fallback, const char* doc) {
        add(name, integer_range_text(low, high), std::to_string(fallback), doc);
        return fallback;
    }
    void check(bool, const char*, const std::string&) {}

    std::vector<std::string> lines;

private:
    void add(const char* name, const std::string& range, const std::string& fallback, const char* doc);
};

}  // namespace relgrad
