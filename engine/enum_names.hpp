// relgrad: the names by which configs and files give an enum's values, one table per enum:
//
//     const EnumName<Pooling> pooling_names[] = {{Pooling::mean, "mean"}, {Pooling::first, "first"}};
//     name_of(pooling_names, Pooling::first)  -> "first"
//     value_named(pooling_names, "mean")      -> Pooling::mean (nothing for a name not in the table)
//     names_of(pooling_names)                 -> {"mean", "first"}, for error messages
//     names_in_words(pooling_names)           -> "mean or first"
//     parse_named(pooling_names, "max", "pooling")
//         -> throws "unknown pooling 'max' (expected mean or first)"
#pragma once

#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace relgrad {

template <class Enum>
struct EnumName {
    Enum value;
    const char* name;
};

template <class Enum, std::size_t N>
const char* name_of(const EnumName<Enum> (&table)[N], Enum value) {
    for (const EnumName<Enum>& entry : table) {
        if (entry.value == value) return entry.name;
    }
    return "";
}

// A table of some of an enum's values takes their entries from the enum's table, so that each name
// is spelled once:
//     constexpr EnumName<DType> floating_dtype_names[] = {entry_of(dtype_names, DType::float32), ...};
// (a value missing from the table is a compile error where the result must be a constant)
template <class Enum, std::size_t N>
constexpr EnumName<Enum> entry_of(const EnumName<Enum> (&table)[N], Enum value) {
    for (const EnumName<Enum>& entry : table) {
        if (entry.value == value) return entry;
    }
    throw std::logic_error("entry_of: a value that is not in the table");
}

template <class Enum, std::size_t N>
std::optional<Enum> value_named(const EnumName<Enum> (&table)[N], const std::string& name) {
    for (const EnumName<Enum>& entry : table) {
        if (name == entry.name) return entry.value;
    }
    return std::nullopt;
}

template <class Enum, std::size_t N>
std::vector<std::string> names_of(const EnumName<Enum> (&table)[N]) {
    std::vector<std::string> names;
    for (const EnumName<Enum>& entry : table) names.push_back(entry.name);
    return names;
}

template <class Enum, std::size_t N>
std::string names_in_words(const EnumName<Enum> (&table)[N]) {
    std::string words;
    for (std::size_t i = 0; i < N; ++i) words += (i == 0 ? "" : i + 1 == N ? " or " : ", ") + std::string(table[i].name);
    return words;
}

template <class Enum, std::size_t N>
Enum parse_named(const EnumName<Enum> (&table)[N], const std::string& name, const char* what) {
    if (const std::optional<Enum> found = value_named(table, name)) return *found;
    throw std::invalid_argument("unknown " + std::string(what) + " '" + name + "' (expected " + names_in_words(table) +
                                ")");
}

}  // namespace relgrad
