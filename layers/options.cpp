#include "layers/options.hpp"

#include <sstream>

namespace relgrad {

namespace {

std::string number_text(double x) {  // as a person writes it: 0.99, 1e-08, 4096
    std::ostringstream out;
    out << x;
    return out.str();
}

}  // namespace

std::string integer_range_text(int64_t low, int64_t high) {
    return "an integer in [" + std::to_string(low) + ", " + std::to_string(high) + "]";
}

std::string number_range_text(double low, double high, bool above_low) {
    return "a number in " + std::string(above_low ? "(" : "[") + number_text(low) + ", " + number_text(high) + "]";
}

std::string names_text(const std::vector<std::string>& names) {
    std::string text = "one of";
    for (std::size_t i = 0; i < names.size(); ++i) text += (i ? ", \"" : " \"") + names[i] + "\"";
    return text;
}

void OptionDocs::number(const char* name, double&, double low, double high, bool above_low, double fallback,
                        const char* doc) {
    add(name, number_range_text(low, high, above_low), number_text(fallback), doc);
}

void OptionDocs::add(const char* name, const std::string& range, const std::string& fallback, const char* doc) {
    lines.push_back(std::string(name) + ": " + range + " (default " + fallback + "): " + doc);
}

}  // namespace relgrad
