// What the config, trainer and run-command tests share: a tiny run and how its outputs are read.
#pragma once

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "train/config.hpp"

namespace relgrad::testing {

inline std::string error_of(const nlohmann::json& document) {
    try {
        Config::parse(document, "c.json");
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    return "no error";
}

// A run small enough for a test: a few seconds on two cores.
inline nlohmann::json tiny_run(const std::filesystem::path& out) {
    nlohmann::json c = quickstart_config();
    c["model"] = {{"layers", 1}, {"dim", 16}, {"heads", 2}, {"ff_dim", 32}, {"dropout", 0.1}, {"position", "relative"},
                  {"k", 4}};
    c["task"]["train_examples"] = 400;
    c["task"]["test_examples"] = 64;
    c["task"]["train_lengths"] = {6, 12};
    c["task"]["test_lengths"] = {6, 16};
    c["training"] = {{"steps", 12}, {"batch_size", 16}, {"learning_rate", 3e-3}, {"warmup_steps", 2}, {"log_every", 1}};
    c["evaluation"] = {{"every", 6}, {"length_buckets", {8, 16}}};
    c["output"] = {{"dir", out.string()}, {"checkpoint_every", 4}};
    return c;
}

inline std::vector<nlohmann::json> read_lines(const std::filesystem::path& path) {
    std::ifstream in(path);
    std::vector<nlohmann::json> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
    return lines;
}

// metrics.jsonl without its timing keys: what two runs of the same config must share exactly
inline std::vector<nlohmann::json> metrics_without_timing(const std::filesystem::path& run) {
    std::vector<nlohmann::json> lines = read_lines(run / "metrics.jsonl");
    for (auto& line : lines) {
        line.erase("tokens_per_second");
        line.erase("seconds");
    }
    return lines;
}

// Two JSON documents of one structure whose numbers agree to `tol` relative (strings, keys and
// every other value equal).
inline void check_json_close(const nlohmann::json& a, const nlohmann::json& b, double tol, const std::string& where = "") {
    if (a.is_number() && b.is_number()) {
        const double x = a.get<double>(), y = b.get<double>();
        CHECK_MESSAGE(std::fabs(x - y) <= tol * (1 + std::fabs(y)), where << ": " << x << " vs " << y);
    } else if (a.is_object() && b.is_object()) {
        CHECK_MESSAGE(a.size() == b.size(), where << ": " << a.dump() << " vs " << b.dump());
        for (const auto& item : b.items()) {
            REQUIRE_MESSAGE(a.contains(item.key()), where << ": no " << item.key());
            check_json_close(a[item.key()], item.value(), tol, where + "/" + item.key());
        }
    } else {
        CHECK_MESSAGE(a == b, where << ": " << a.dump() << " vs " << b.dump());
    }
}

inline std::filesystem::path dir_for_batch(const std::filesystem::path& base) { return base.string() + "-batch"; }

struct TempDir {
    std::filesystem::path path;
    explicit TempDir(const std::string& name) : path(std::filesystem::temp_directory_path() / name) { std::filesystem::remove_all(path); }
    ~TempDir() { std::filesystem::remove_all(path); }
};

}  // namespace relgrad::testing
