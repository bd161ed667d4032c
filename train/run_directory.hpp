// relgrad: the files of a run directory (docs/training.md lists them):
//
//   config.json, tokenizer.json, summary.json   written to NAME.partial, then renamed to NAME
//   metrics.jsonl                               a line per logged step and per evaluation; --resume
//                                               keeps the lines up to the checkpoint's step
//   checkpoint/                                 model/, optimizer/ and state.json, replaced whole
//
// A checkpoint is replaced as engine/system.hpp describes: stopped at any point, one whole
// checkpoint remains, as checkpoint/ or, between the two renames, as checkpoint.previous/.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "engine/optim.hpp"
#include "layers/module.hpp"
#include "train/config.hpp"
#include "train/tokenizer.hpp"

namespace relgrad {

// A JSON file of a run; errors (std::invalid_argument) name the file.
nlohmann::json read_json_file(const std::filesystem::path& path);
// `value`, indented, written whole as engine/system.hpp's write_file writes (path.partial, renamed).
void write_json_file(const std::filesystem::path& path, const nlohmann::json& value);

// The run's tokenizer.json for a task on text files (an error when it is missing: its ids are the
// checkpoint's), nothing for a synthetic task.
std::optional<Tokenizer> saved_tokenizer(const std::filesystem::path& run, TaskKind kind);

// What identifies a run: its resolved config less what changes none of its numbers (the output
// directory's name, how often it is checkpointed, the thread count, the device). A checkpoint records it; --resume
// compares it.
nlohmann::json run_identity(nlohmann::json resolved);
// The first key ("/training/seed") whose value differs between two such configs, or "" if none.
std::string first_difference(const nlohmann::json& a, const nlohmann::json& b);

// Replaces the checkpoint directory `dir` with the model, the optimizer and the step count.
// state.json holds the step, the run's identity (`run`), the fingerprints of the model/ and
// optimizer/ halves (`files`), and for a float16 run the loss scaler (its scale and counts).
void save_checkpoint(const std::filesystem::path& dir, const Module& model, const AdamW& optimizer,
                     const LossScaler* scaler, int64_t step, const nlohmann::json& run);
// Whether the run directory `run` holds a checkpoint; one left as checkpoint.previous/ by a run
// stopped between save_checkpoint's two renames is first renamed back to checkpoint/.
bool recovered_checkpoint(const std::filesystem::path& run);
// The checkpoint a reading command (eval, generate, attention) loads from: checkpoint/, or one left
// as checkpoint.previous/, read where it is; std::invalid_argument when the run has neither.
std::filesystem::path readable_checkpoint(const std::filesystem::path& run);
// Loads the checkpoint `dir` of the run `run` (its run_identity) into model and optimizer and
// returns its step count. Every file is checked before use: state.json is {"step": N, "run": ...,
// "files": ...} with this run's identity and the optimizer's own count equal to N; the two halves
// are the ones saved with it (their fingerprints); the weights and moments are floating (as
// Module::load and AdamW::load check them), finite, with no negative second moment.
int64_t load_checkpoint(const std::filesystem::path& dir, Module& model, AdamW& optimizer, LossScaler* scaler,
                        const nlohmann::json& run);

}  // namespace relgrad
