// fuzz_config: the input is a training config as `relgrad train CONFIG.json --set KEY=VALUE ...`
// reads it (train/config.hpp): every leading line that starts with "--set " is one assignment
// (the rest of that line, without its \n), and everything after them is the text of the config
// file. The file is read by read_config_file, the assignments applied in order by apply_override,
// the task kind read by parse_task_kind (as `relgrad eval RUN --data FILE` reads a run's config)
// and the document checked by Config::parse, which must agree with it on the kind. Refusals are
// std::exceptions. A config that parses must parse again from its resolved() form, to the same
// resolved() form (a resumed run compares them).
// Seeds (corpus/config/): the quickstart, configs of every task kind with assignments, broken
// ones (bad values, unknown keys, not JSON, not UTF-8, a root that is not an object), and JSON
// nested 100,000 levels deep in the file (as a value, and as the task section) and in an
// assignment (run with -max_len=1000000: deep JSON once crashed the program, and must not again).
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "train/config.hpp"

using namespace relgrad_fuzz;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    single_thread();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::string_view rest(reinterpret_cast<const char*>(data), size);
    std::vector<std::string> assignments;
    constexpr std::string_view prefix = "--set ";
    while (rest.substr(0, prefix.size()) == prefix) {
        const std::size_t end = rest.find('\n');
        assignments.emplace_back(
            rest.substr(prefix.size(), end == std::string_view::npos ? std::string_view::npos : end - prefix.size()));
        rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
    }
    const fs::path file = scratch_dir("config") / "config.json";
    write_file(file, rest);

    relgrad::Config config;
    std::optional<relgrad::TaskKind> kind;  // what parse_task_kind reads from the document, if anything
    try {
        nlohmann::json document = relgrad::read_config_file(file.string());
        for (const std::string& assignment : assignments) relgrad::apply_override(document, assignment);
        try {
            kind = relgrad::parse_task_kind(document);  // as `relgrad eval RUN --data FILE` reads a run's config
        } catch (const std::exception&) {
        }
        config = relgrad::Config::parse(document, file.string());
    } catch (const std::exception&) {
        return 0;  // refused, as it may be
    }
    if (kind != config.task.kind) {
        finding(std::string("parse_task_kind and Config::parse disagree on the task kind of an accepted config: ") +
                (kind ? relgrad::task_kind_name(*kind) : "an error") + " and " +
                relgrad::task_kind_name(config.task.kind));
    }
    // accepted: its resolved form (what a run writes as config.json) must be accepted too, as itself
    nlohmann::json resolved, again;
    try {
        resolved = config.resolved();
        again = relgrad::Config::parse(resolved, "resolved").resolved();
    } catch (const std::exception& e) {
        finding(std::string("the resolved form of an accepted config is refused: ") + e.what());
    }
    if (again != resolved)
        finding("a config's resolved form resolves differently: " + resolved.dump() + " became " + again.dump());
    return 0;
}
