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

void save_checkpoint(const fs::path& dir, const Module& model, const AdamW& optimizer, const LossScaler* scaler,
                     int64_t step) {
    const fs::path partial = start_replacing(dir);
    model.save((partial / "model").string());
    optimizer.save((partial / "optimizer").string());
    json state{{"step", step}};
    if (scaler) {
        state["loss_scaler"] = {{"scale", scaler->scale()},
                                {"clean_steps", scaler->clean_steps()},
                                {"skipped_steps", scaler->skipped_steps()}};
    }
    write_file(partial / "state.json", state.dump() + "\n");
    finish_replacing(dir);
}

bool recovered_checkpoint(const fs::path& run) { return recover_directory(run / "checkpoint"); }

fs::path readable_checkpoint(const fs::path& run) {
    for (const char* name : {"checkpoint", "checkpoint.previous"}) {
        if (fs::exists(run / name / "state.json")) return run / name;
    }
    throw std::invalid_argument(run.string() + ": not a trained run (needs config.json and checkpoint/)");
}

int64_t load_checkpoint(const fs::path& dir, Module& model, AdamW& optimizer, LossScaler* scaler) {
    if (!fs::exists(dir / "state.json")) {
        throw std::invalid_argument("--resume: no checkpoint in " + dir.string());
    }
    const fs::path state_path = dir / "state.json";
    const json state = read_json_file(state_path);
    const char* expected = scaler ? "{\"step\": a whole number, \"loss_scaler\": {\"scale\": a number, "
                                    "\"clean_steps\": a whole number, \"skipped_steps\": a whole number}} (a "
                                    "float16 run)"
                                  : "{\"step\": a whole number}";
    const bool scaler_ok = !scaler || (state.contains("loss_scaler") && state["loss_scaler"].is_object() &&
                                       state["loss_scaler"].size() == 3 && state["loss_scaler"].contains("scale") &&
                                       state["loss_scaler"]["scale"].is_number() &&
                                       is_int64(state["loss_scaler"].value("clean_steps", json())) &&
                                       is_int64(state["loss_scaler"].value("skipped_steps", json())));
    if (!state.is_object() || state.size() != (scaler ? 2u : 1u) || !state.contains("step") ||
        !is_int64(state["step"]) || state["step"].get<int64_t>() < 0 || !scaler_ok) {
        throw std::invalid_argument(state_path.string() + ": expected " + expected + ", got " + json_excerpt(state));
    }
    const int64_t step = state["step"].get<int64_t>();
    int64_t skipped = 0;
    if (scaler) {
        const json& saved = state["loss_scaler"];
        skipped = saved["skipped_steps"].get<int64_t>();
        try {
            scaler->restore(saved["scale"].get<double>(), saved["clean_steps"].get<int64_t>(), skipped);
        } catch (const std::invalid_argument& e) {
            throw std::invalid_argument(state_path.string() + ": " + e.what());
        }
    }
    model.load((dir / "model").string());
    optimizer.load((dir / "optimizer").string());
    if (optimizer.steps() != step - skipped) {  // a skipped step does not update
        throw std::invalid_argument(state_path.string() + ": step " + std::to_string(step) +
                                    (skipped ? " less " + std::to_string(skipped) + " skipped" : std::string()) +
                                    ", but " + (dir / "optimizer" / "step.txt").string() + " counts " +
                                    std::to_string(optimizer.steps()) + " (a corrupt checkpoint)");
    }
    return step;
}

}  // namespace relgrad
