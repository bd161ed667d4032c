// relgrad.nn's keyword arguments: a layer's options read through their descriptions
// (layers/options.hpp), so that relgrad.nn.EncoderLayer(dim=128) resolves every option as a
// config's model section with "dim": 128 does: the same names, defaults, ranges and wording.
//   relgrad.nn.EncoderLayer(dim=0)     ValueError: keyword argument 'dim': got 0, expected an integer in [1, 8192]
//   relgrad.nn.EncoderLayer(dimm=64)   TypeError: unexpected keyword argument 'dimm' (expected one of: ...)
#pragma once

#include <functional>
#include <set>
#include <string>

#include "engine/optim.hpp"
#include "layers/module.hpp"
#include "layers/options.hpp"
#include "python/bindings.hpp"

namespace relgrad::python {

// Reads keyword arguments as a description visits its options; each keyword at most once.
class KwargsFields {
public:
    explicit KwargsFields(const py::kwargs& kwargs) : kwargs_(kwargs) {}

    void integer(const char* key, int64_t& value, int64_t low, int64_t high, int64_t fallback, const char* = "");
    void number(const char* key, double& value, double low, double high, bool above_low, double fallback,
                const char* = "");
    void flag(const char* key, bool& value, bool fallback, const char* = "");
    template <class Enum, std::size_t N>
    void named(const char* key, Enum& value, const EnumName<Enum> (&names)[N], Enum fallback, const char* = "") {
        const std::string expected = names_text(names_of(names));
        value = fallback;
        if (const py::object given = take(key); !given.is_none()) {
            if (!py::isinstance<py::str>(given)) fail<py::type_error>(key, expected);
            const auto found = value_named(names, given.cast<std::string>());
            if (!found) fail<py::value_error>(key, expected);
            value = *found;
        }
    }
    int64_t shorthand(const char* key, int64_t low, int64_t high, int64_t fallback, const char* doc = "") {
        int64_t value = fallback;
        integer(key, value, low, high, fallback, doc);
        return value;
    }
    void check(bool ok, const char* key, const std::string& expected) {
        if (!ok) fail<py::value_error>(key, expected);
    }

    // the keyword's value, None when it was not given; marks it read
    py::object take(const char* key);
    // every keyword must have been read: TypeError naming the first that was not
    void finish() const;

private:
    template <class Error>
    [[noreturn]] void fail(const char* key, const std::string& expected) const {
        const std::string got = kwargs_.contains(key) ? py::repr(kwargs_[key]).cast<std::string>() : "nothing";
        throw Error("keyword argument '" + std::string(key) + "': got " + got + ", expected " + expected);
    }

    const py::kwargs& kwargs_;
    std::set<std::string> read_;
};

// seed (the layer's parameters are drawn from it) and dtype, the keywords every layer takes
struct LayerKwargs {
    explicit LayerKwargs(const py::kwargs& kwargs);
    Init init() { return Init{gen, dtype}; }

    KwargsFields fields;
    Generator gen{0};
    DType dtype = DType::float32;
};

// The keywords of a layer that takes no others than seed and dtype (any other is a TypeError), for
// use within one expression, as its Init refers to the generator: Linear(..., seed_and_dtype(kwargs).init())
LayerKwargs seed_and_dtype(const py::kwargs& kwargs);

// A description's rows as a docstring, kept for the life of the module (pybind11 keeps the pointer):
//     options_doc("summary", [](OptionDocs& d) { RelativeOptions o; relative_option_fields(d, o); })
//     -> "summary\n\nKeyword options ...:\n  k: an integer in [0, 4096] (default 8): ..."
const char* options_doc(const std::string& summary, const std::function<void(OptionDocs&)>& describe);

// The same for a whole options struct, and the struct read from keywords (any keyword left over a
// TypeError), where describe(fields, options) visits its options for any kind of fields, as the
// descriptions in layers/ do: a generic lambda, or a struct with a template operator().
template <class Options, class Describe>
const char* options_doc(const std::string& summary, const Describe& describe) {
    return options_doc(summary, [describe](OptionDocs& docs) {
        Options options;
        describe(docs, options);
    });
}
template <class Options, class Describe>
Options read_options(KwargsFields& fields, const Describe& describe) {
    Options options;
    describe(fields, options);
    fields.finish();
    return options;
}

// Writes options as a dict, as a description visits them (the layer's .options).
class DictFields {
public:
    template <class Integer>
    void integer(const char* key, const Integer& value, int64_t, int64_t, int64_t, const char* = "") {
        dict[key] = value;
    }
    void number(const char* key, double value, double, double, bool, double, const char* = "") { dict[key] = value; }
    void flag(const char* key, bool value, bool, const char* = "") { dict[key] = value; }
    template <class Enum, std::size_t N>
    void named(const char* key, Enum value, const EnumName<Enum> (&names)[N], Enum, const char* = "") {
        dict[key] = name_of(names, value);
    }
    int64_t shorthand(const char*, int64_t, int64_t, int64_t fallback, const char* = "") { return fallback; }
    void check(bool, const char*, const std::string&) {}

    py::dict dict;
};

}  // namespace relgrad::python
