#include "train/run_directory.hpp"

#include <fstream>
#include <sstream>
#include <stdexcept>

#include "engine/errors.hpp"
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
    RELGRAD_CHECK(fs::exists(path), path.string(), ": missing (a run on text files keeps its vocabulary there)");
    try {
        return Tokenizer::from_json(read_file(path, "the run's tokenizer.json"));
    } catch (const std::runtime_error& e) {
        throw std::invalid_argument(path.string() + ": " + e.what());
    }
}

json run_identity(json resolved) {
    resolved["output"].erase("dir");               // the same run, reached by another path
    resolved["output"].erase("checkpoint_every");  // when it is saved changes no number of the run
    resolved["training"].erase("threads");         // nor does the thread count
    resolved["training"].erase("device");          // nor does the device
    return resolved;
}

std::string first_difference(const json& a, const json& b) {
    for (const auto& [section, values] : a.items()) {
        for (const auto& [key, value] : values.items()) {
            if (!b.contains(section) || !b[section].contains(key) || b[section][key] != value)
                return "/" + section + "/" + key;
        }
    }
    return a == b ? "" : "(a section)";
}

void save_checkpoint(const fs::path& dir, const Module& model, const AdamW& optimizer, const LossScaler* scaler,
                     int64_t step, const json& run) {
    const fs::path partial = start_replacing(dir);
    model.save((partial / "model").string());
    optimizer.save((partial / "optimizer").string());
    json state{{"step", step},
               {"run", run},
               {"files",
                {{"model", directory_fingerprint(partial / "model")},
                 {"optimizer", directory_fingerprint(partial / "optimizer")}}}};
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
    RELGRAD_CHECK(!fs::is_directory(run / "checkpoint"), (run / "checkpoint" / "state.json").string(),
                  ": missing, expected the checkpoint's state (an incomplete checkpoint)");
    RELGRAD_CHECK(false, run.string(), ": not a trained run (needs config.json and checkpoint/)");
}

// state.json's record of the run: its identity, and the fingerprints of the two halves
void check_run_record(const fs::path& dir, const json& state, const json& run) {
    const fs::path state_path = dir / "state.json";
    std::string differs = first_difference(run, state["run"]);
    if (differs.empty()) differs = first_difference(state["run"], run);  // a key only the checkpoint has
    const auto value_in = [&differs](const json& config) {
        const bool named = differs.front() == '/' && config.contains(json::json_pointer(differs));
        return named ? json_excerpt(config[json::json_pointer(differs)]) : std::string("absent");
    };
    RELGRAD_CHECK(differs.empty(), state_path.string(), ": the checkpoint is of another run: ", differs, " is ",
                  value_in(state["run"]), " there and ", value_in(run),
                  " in this run's config (a run resumes only with the config it was trained with)");
    for (const char* half : {"model", "optimizer"}) {
        RELGRAD_CHECK(directory_fingerprint(dir / half) == state["files"][half].get<std::string>(),
                      (dir / half).string(), ": not the ", half, " state saved with ", state_path.string(),
                      " (its files differ: a half of another checkpoint, or edited)");
    }
}

int64_t load_checkpoint(const fs::path& dir, Module& model, AdamW& optimizer, LossScaler* scaler, const json& run) {
    RELGRAD_CHECK(fs::exists(dir / "state.json"), "--resume: no checkpoint in ", dir.string());
    const fs::path state_path = dir / "state.json";
    const json state = read_json_file(state_path);
    const char* expected = scaler ? "{\"step\": a whole number, \"run\": the run's config, \"files\": "
                                    "{\"model\": a fingerprint, \"optimizer\": a fingerprint}, \"loss_scaler\": "
                                    "{\"scale\": a number, \"clean_steps\": a whole number, \"skipped_steps\": a "
                                    "whole number}} (a float16 run)"
                                  : "{\"step\": a whole number, \"run\": the run's config, \"files\": "
                                    "{\"model\": a fingerprint, \"optimizer\": a fingerprint}}";
    const auto fingerprint_at = [&](const char* half) {
        return state.contains("files") && state["files"].is_object() && state["files"].size() == 2 &&
               state["files"].contains(half) && state["files"][half].is_string();
    };
    const bool record_ok = state.is_object() && state.contains("run") && state["run"].is_object() &&
                           fingerprint_at("model") && fingerprint_at("optimizer");
    const bool scaler_ok = !scaler || (state.contains("loss_scaler") && state["loss_scaler"].is_object() &&
                                       state["loss_scaler"].size() == 3 && state["loss_scaler"].contains("scale") &&
                                       state["loss_scaler"]["scale"].is_number() &&
                                       is_int64(state["loss_scaler"].value("clean_steps", json())) &&
                                       is_int64(state["loss_scaler"].value("skipped_steps", json())));
    RELGRAD_CHECK(state.is_object() && state.size() == (scaler ? 4u : 3u) && state.contains("step") &&
                      is_int64(state["step"]) && state["step"].get<int64_t>() >= 0 && scaler_ok && record_ok,
                  state_path.string(), ": expected ", expected, ", got ", json_excerpt(state));
    check_run_record(dir, state, run);
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
    // a skipped step does not update
    RELGRAD_CHECK(optimizer.steps() == step - skipped, state_path.string(), ": step ", step,
                  skipped ? " less " + std::to_string(skipped) + " skipped" : std::string(), ", but ",
                  (dir / "optimizer" / "step.txt").string(), " counts ", optimizer.steps(), " (a corrupt checkpoint)");
    return step;
}

}  // namespace relgrad
