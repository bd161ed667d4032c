// The checklist of adding an op, enforced. Every op that engine/ops.hpp declares, and every view
// of Tensor that has a gradient check, must have:
//   - a registered gradient check (engine/op_gradchecks.cpp), a case named "op" or "op/variant"; the
//     16-bit run of each case then needs a stated tolerance, which tests/engine/test_precision.cpp
//     requires (it fails on a case without one);
//   - a Python binding: def("op", ...) in one of python/*.cpp;
//   - a row in docs/engine.md's table of ops, whose file column names where it is defined.
// The declarations of engine/ops.hpp that are not ops of their own are named below, with why.
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "engine/op_gradchecks.hpp"
#include <doctest/doctest.h>

using namespace relgrad;
namespace fs = std::filesystem;

namespace {

const fs::path source_dir = RELGRAD_SOURCE_DIR;

std::string read_text(const fs::path& path) {
    std::ifstream in(path);
    REQUIRE_MESSAGE(in.good(), "cannot read " << path.string());
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
}

// The names of the functions a header declares returning Tensor: "Tensor name(" at a line's start
// (ops.hpp), or after indentation (Tensor's methods in tensor.hpp).
std::set<std::string> tensor_functions(const std::string& header, bool members) {
    const std::regex declaration(members ? R"(^    Tensor (\w+)\()" : R"(^Tensor (\w+)\()");
    std::set<std::string> names;
    std::istringstream lines(header);
    for (std::string line; std::getline(lines, line);) {
        std::smatch match;
        if (std::regex_search(line, match, declaration)) names.insert(match[1]);
    }
    return names;
}

// What engine/ops.hpp declares that is no op of its own: no gradient, or a helper of other ops.
const std::map<std::string, std::string> not_ops = {
    {"sum_to", "the backward helper of broadcasting ops (sums a gradient back to an input's shape)"},
    {"combine_masks", "a bool mask, no gradient"},
    {"pattern_mask", "a bool mask, no gradient"},
    {"distance_entry_index", "an int64 index, no gradient"},
};

// docs/engine.md's table of ops: each op named in a row's first column (`a`, `b`), with the file
// column of that row.
std::map<std::string, std::string> docs_rows() {
    const std::string text = read_text(source_dir / "docs/engine.md");
    const auto start = text.find("\n## The ops\n");
    REQUIRE(start != std::string::npos);
    std::map<std::string, std::string> rows;
    std::istringstream lines(text.substr(start + 1, text.find("\n## ", start + 1) - start));
    const std::regex name("`(\\w+)`");
    for (std::string line; std::getline(lines, line);) {
        if (line.rfind("| `", 0) != 0) continue;
        const auto first_bar = line.find(" | ");
        const auto second_bar = line.find(" | ", first_bar + 3);
        const std::string ops = line.substr(2, first_bar - 2);
        const std::string file = line.substr(first_bar + 3, second_bar - first_bar - 3);
        for (std::sregex_iterator it(ops.begin(), ops.end(), name), end; it != end; ++it) rows[(*it)[1]] = file;
    }
    return rows;
}

}  // namespace

TEST_CASE("every op has a gradient check, a Python binding and a row in docs/engine.md's table") {
    std::set<std::string> registered;
    for (const OpCheck& check : registered_op_checks()) registered.insert(check.name.substr(0, check.name.find('/')));

    // the ops: engine/ops.hpp's, and the views of Tensor that have a gradient check
    std::set<std::string> ops;
    for (const std::string& name : tensor_functions(read_text(source_dir / "engine/ops.hpp"), false)) {
        if (!not_ops.count(name)) ops.insert(name);
    }
    std::set<std::string> views;
    for (const std::string& name : tensor_functions(read_text(source_dir / "engine/tensor.hpp"), true)) {
        if (registered.count(name)) views.insert(name);
    }
    ops.insert(views.begin(), views.end());
    CHECK(ops.size() >= 40);  // the parsing found the declarations

    std::string bindings;
    for (const auto& entry : fs::directory_iterator(source_dir / "python")) {
        if (entry.path().extension() == ".cpp") bindings += read_text(entry.path());
    }
    const std::map<std::string, std::string> rows = docs_rows();
    for (const std::string& op : ops) {
        CAPTURE(op);
        CHECK_MESSAGE(registered.count(op), "no gradient check is registered in engine/op_gradchecks.cpp");
        CHECK_MESSAGE(std::regex_search(bindings, std::regex("def\\(\\s*\"" + op + "\"")),
                      "no Python binding in python/");
        const auto row = rows.find(op);
        REQUIRE_MESSAGE(row != rows.end(), "no row in docs/engine.md's table of ops");
        if (views.count(op)) {
            CHECK(row->second == "views (`Tensor`)");
        } else {  // the file named defines it
            const fs::path file = source_dir / "engine/ops" / row->second;
            REQUIRE_MESSAGE(fs::exists(file), "docs/engine.md names " << row->second << ", not a file of engine/ops/");
            CHECK_MESSAGE(read_text(file).find("\nTensor " + op + "(") != std::string::npos,
                          "engine/ops/" << row->second << " does not define it");
        }
    }
    for (const auto& [op, file] : rows) {
        CAPTURE(op);
        CHECK_MESSAGE(ops.count(op), "docs/engine.md's table of ops has a row for no op");
    }
}
