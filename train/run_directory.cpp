#include "train/run_directory.hpp"

#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <thread>

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
    state["seal"] = checkpoint_seal(state);
    write_file(partial / "state.json", state.dump() + "\n");
    const FileLock no_reader_loading(dir.parent_path(), FileLock::Kind::exclusive);
    finish_replacing(dir);
}

std::string checkpoint_seal(json state) {
    state.erase("seal");
    const std::string text = state.dump();  // keys in order, numbers as they round-trip
    return fingerprint_hex(fingerprint(text.data(), text.size()));
}

bool recovered_checkpoint(const fs::path& run) {
    if (!fs::is_directory(run)) return false;
    const FileLock no_reader_loading(run, FileLock::Kind::exclusive);
    return recover_directory(run / "checkpoint");
}

namespace {

// The lock of a writer of `run`, which is created if missing; nothing if another process holds it.
std::optional<FileLock> try_lock_for_writing(const fs::path& run) {
    create_output_directory(run, "the run's directory");
    return FileLock::try_exclusive(run / "lock", std::to_string(::getpid()) + "\n");
}

}  // namespace

RunWriter::RunWriter(const fs::path& run) : run_(run), created_(!fs::exists(run)), lock_(try_lock_for_writing(run)) {
    const fs::path lock_path = run / "lock";
    if (!lock_) {
        // the holder's pid, once it has written it (a holder that has just created the file has
        // not yet): the pid is a courtesy, and the refusal stands without it
        std::string holder;
        for (int attempt = 0; attempt < 100 && holder.empty(); ++attempt) {
            if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
            try {
                holder = read_file(lock_path, "the lock file");
            } catch (const std::exception&) {
            }
            holder = holder.substr(0, holder.find_first_not_of("0123456789"));
        }
        RELGRAD_CHECK_RUNTIME(false, run.string(), ": another relgrad process",
                              holder.empty() ? std::string() : " (pid " + holder + ")",
                              " is training this run; wait for it to end or choose another --out");
    }
}

RunWriter::RunWriter(RunWriter&& other) noexcept
    : run_(std::move(other.run_)), created_(other.created_), lock_(std::move(other.lock_)) {
    other.created_ = false;
    other.lock_.reset();
}

RunWriter::~RunWriter() {
    if (!lock_ || !created_) return;
    std::error_code ignored;  // a destructor reports nothing: what cannot be removed stays
    for (const fs::directory_entry& entry : fs::directory_iterator(run_, ignored)) {
        if (entry.path().filename() != "lock") return;  // the run wrote something: it stays
    }
    fs::remove(run_ / "lock", ignored);  // still holding the lock, so no other writer has begun
    fs::remove(run_, ignored);
}

namespace {

// A checkpoint directory without its state.json, for readers and --resume alike.
[[noreturn]] void missing_state(const fs::path& checkpoint) {
    RELGRAD_CHECK(false, (checkpoint / "state.json").string(),
                  ": missing, expected the checkpoint's state (deleted, or an incomplete checkpoint)");
}

fs::path readable_checkpoint(const fs::path& run) {
    for (const char* name : {"checkpoint", "checkpoint.previous"}) {
        if (fs::exists(run / name / "state.json")) return run / name;
    }
    if (fs::is_directory(run / "checkpoint")) missing_state(run / "checkpoint");
    RELGRAD_CHECK(false, run.string(), ": not a trained run (needs config.json and checkpoint/)");
}

std::optional<FileLock> swap_lock_if_directory(const fs::path& run) {
    if (!fs::is_directory(run)) return std::nullopt;  // readable_checkpoint says what is wrong
    return std::optional<FileLock>(std::in_place, run, FileLock::Kind::shared);
}

}  // namespace

CheckpointReader::CheckpointReader(const fs::path& run)
    : swap_lock_(swap_lock_if_directory(run)), path_(readable_checkpoint(run)) {}

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
    const fs::path state_path = dir / "state.json";
    RELGRAD_CHECK(fs::exists(dir), "--resume: no checkpoint in ", dir.string(), " (the run stopped before its first)");
    if (!fs::exists(state_path)) missing_state(dir);
    const json state = read_json_file(state_path);
    const char* expected = scaler ? "{\"step\": a whole number, \"run\": the run's config, \"files\": "
                                    "{\"model\": a fingerprint, \"optimizer\": a fingerprint}, \"loss_scaler\": "
                                    "{\"scale\": a number, \"clean_steps\": a whole number, \"skipped_steps\": a "
                                    "whole number}, \"seal\": a fingerprint} (a float16 run)"
                                  : "{\"step\": a whole number, \"run\": the run's config, \"files\": "
                                    "{\"model\": a fingerprint, \"optimizer\": a fingerprint}, \"seal\": a "
                                    "fingerprint}";
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
    // a checkpoint written before checkpoints were sealed has no seal
    const bool sealed = state.is_object() && state.contains("seal");
    RELGRAD_CHECK(state.is_object() && state.size() == (scaler ? 4u : 3u) + (sealed ? 1 : 0) &&
                      state.contains("step") && is_int64(state["step"]) && state["step"].get<int64_t>() >= 0 &&
                      (!sealed || state["seal"].is_string()) && scaler_ok && record_ok,
                  state_path.string(), ": expected ", expected, ", got ", json_excerpt(state));
    // first the run: a state.json of another run (or nested too deep to print) is refused by name
    check_run_record(dir, state, run);
    if (sealed) {
        RELGRAD_CHECK(state["seal"].get<std::string>() == checkpoint_seal(state), state_path.string(),
                      ": edited since it was written (its seal ", state["seal"].get<std::string>(),
                      " is not that of its step, run, files and loss_scaler)");
    } else {
        std::cerr << "relgrad: warning: " << state_path.string()
                  << " has no seal (written by an earlier relgrad); its step and loss scaler are taken as they are\n";
    }
    const int64_t step = state["step"].get<int64_t>();
    int64_t skipped = 0;
    if (scaler) {
        const json& saved = state["loss_scaler"];
        skipped = saved["skipped_steps"].get<int64_t>();
        try {
            scaler->restore(saved["scale"].get<double>(), saved["clean_steps"].get<int64_t>(), skipped);
        } catch (const std::invalid_argument& e) {
            throw std::invalid_argument(state_path.string() + ": loss_scaler: " + e.what());
        }
        RELGRAD_CHECK(skipped <= step, state_path.string(), ": loss_scaler: skipped_steps ", skipped,
                      ": expected at most the step, ", step);
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
