#include "train/run_directory.hpp"

#include <fstream>
#include <sstream>
#include <stdexcept>

#include "engine/system.hpp"
#include "train/json_reader.hpp"

namespace relgrad {

namespace fs = std::filesystem;
using nlohmann::json;

json read_json_file(const fs::path& path) { return parse_json(read_file(path, "a JSON file"), path.string()); }

void write_json_file(const fs::path& path, const json& value) { write_file(path, value.dump(2) + "\n"); }

std::optional<Tokenizer> saved_tokenizer(const fs::path& run, TaskKind kind) {
    const fs::path path = run / "tokenizer.json";
    if (!reads_files(kind)) return std::nullopt;  // synthetic tasks have no text to tokenize
    if (!fs::exists(path)) {
        throw std::invalid_argument(path.string() + ": missing (a run on text files keeps its vocabulary there)");
    }
    try {
        return Tokenizer::from_json(read_file(path, "the run's tokenizer.json"));
    } catch (const std::runtime_error& e) {
        throw std::invalid_argument(path.string() + ": " + e.what());
    }
}

void save_checkpoint(const fs::path& dir, const Module& model, const AdamW& optimizer, int64_t step) {
    const fs::path partial = start_replacing(dir);
    model.save((partial / "model").string());
    optimizer.save((partial / "optimizer").string());
    write_file(partial / "state.json", json{{"step", step}}.dump() + "\n");
    finish_replacing(dir);
}

bool recovered_checkpoint(const fs::path& run) { return recover_directory(run / "checkpoint"); }

fs::path readable_checkpoint(const fs::path& run) {
    for (const char* name : {"checkpoint", "checkpoint.previous"}) {
        if (fs::exists(run / name / "state.json")) return run / name;
    }
    throw std::invalid_argument(run.string() + ": not a trained run (needs config.json and checkpoint/)");
}

int64_t load_checkpoint(const fs::path& dir, Module& model, AdamW& optimizer) {
    if (!fs::exists(dir / "state.json")) {
        throw std::invalid_argument("--resume: no checkpoint in " + dir.string());
    }
    const fs::path state_path = dir / "state.json";
    const json state = read_json_file(state_path);
    if (!state.is_object() || state.size() != 1 || !state.contains("step") || !is_int64(state["step"]) ||
        state["step"].get<int64_t>() < 0) {
        throw std::invalid_argument(state_path.string() + ": expected {\"step\": a whole number}, got " +
                                    json_excerpt(state));
    }
    const int64_t step = state["step"].get<int64_t>();
    model.load((dir / "model").string());
    optimizer.load((dir / "optimizer").string());
    if (optimizer.steps() != step) {
        throw std::invalid_argument(state_path.string() + ": step " + std::to_string(step) + ", but " +
                                    (dir / "optimizer" / "step.txt").string() + " counts " +
                                    std::to_string(optimizer.steps()) + " (a corrupt checkpoint)");
    }
    return step;
}

}  // namespace relgrad
