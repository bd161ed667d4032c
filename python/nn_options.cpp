#include "python/nn_options.hpp"

#include <memory>
#include <vector>

namespace relgrad::python {

namespace {

// Python's bool is an int: True is no integer (nor number) here, as it is none in JSON
bool is_integer(const py::handle& value) {
    return py::isinstance<py::int_>(value) && !py::isinstance<py::bool_>(value);
}

}  // namespace

py::object KwargsFields::take(const char* key) {
    read_.insert(key);
    return kwargs_.contains(key) ? py::reinterpret_borrow<py::object>(kwargs_[key]) : py::none();
}

void KwargsFields::integer(const char* key, int64_t& value, int64_t low, int64_t high, int64_t fallback, const char*) {
    const std::string expected = integer_range_text(low, high);
    value = fallback;
    const py::object given = take(key);
    if (given.is_none()) return;
    if (!is_integer(given)) fail<py::type_error>(key, expected);
    // compared as Python ints: a value beyond int64 is out of range, not wrapped
    if (given < py::int_(low) || given > py::int_(high)) fail<py::value_error>(key, expected);
    value = given.cast<int64_t>();
}

void KwargsFields::number(const char* key, double& value, double low, double high, bool above_low, double fallback,
                          const char*) {
    const std::string expected = number_range_text(low, high, above_low);
    value = fallback;
    const py::object given = take(key);
    if (given.is_none()) return;
    if (!is_integer(given) && !py::isinstance<py::float_>(given)) fail<py::type_error>(key, expected);
    const double x = given.cast<double>();
    if (!(above_low ? x > low : x >= low) || !(x <= high)) fail<py::value_error>(key, expected);
    value = x;
}

void KwargsFields::flag(const char* key, bool& value, bool fallback, const char*) {
    value = fallback;
    const py::object given = take(key);
    if (given.is_none()) return;
    if (!py::isinstance<py::bool_>(given)) fail<py::type_error>(key, "true or false");
    value = given.cast<bool>();
}

void KwargsFields::finish() const {
    for (const auto& [key, value] : kwargs_) {
        const std::string name = py::str(key).cast<std::string>();
        if (read_.count(name)) continue;
        std::string known;
        for (const std::string& k : read_) known += (known.empty() ? "" : ", ") + k;
        throw py::type_error("unexpected keyword argument '" + name + "' (expected one of: " + known + ")");
    }
}

const char* options_doc(const std::string& summary, const std::function<void(OptionDocs&)>& describe) {
    OptionDocs docs;
    describe(docs);
    std::string text = summary + "\n\nKeyword options (as a config's model section names them), and seed and dtype:";
    for (const std::string& line : docs.lines) text += "\n  " + line;
    static std::vector<std::unique_ptr<std::string>> kept;  // one per class, made once at import
    kept.push_back(std::make_unique<std::string>(std::move(text)));
    return kept.back()->c_str();
}

LayerKwargs::LayerKwargs(const py::kwargs& kwargs) : fields(kwargs) {
    if (const py::object seed = fields.take("seed"); !seed.is_none()) gen = Generator(seed.cast<uint64_t>());
    if (const py::object given = fields.take("dtype"); !given.is_none()) dtype = dtype_from(given);
}

LayerKwargs seed_and_dtype(const py::kwargs& kwargs) {
    LayerKwargs b(kwargs);
    b.fields.finish();
    return b;
}

}  // namespace relgrad::python
