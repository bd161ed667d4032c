// relgrad: the files of a run directory (docs/training.md lists them):
//
//   config.json, tokenizer.json, summary.json   written to NAME.partial, then renamed to NAME
//   metrics.jsonl                               a line per logged step and per evaluation; --resume
//                                               keeps the lines up to the checkpoint's step
//   checkpoint/                                 model/, optimizer/ and state.json, replaced whole
//   lock                                        the pid of the process training the run
//
// A checkpoint is replaced as engine/system.hpp describes: stopped at any point, one whole
// checkpoint remains, as checkpoint/ or, between the two renames, as checkpoint.previous/.
//
// One writer per run: `relgrad train` holds an exclusive lock on <run>/lock from before it looks
// at the directory until it ends, and a second writer is refused. Readers (eval, generate,
// attention, the explorer, Python's Run) hold the run directory's own lock shared while they load
// a checkpoint, and the writer swaps one in (and recovers one) holding it exclusive: a reader sees
// the old checkpoint or the new one, never neither.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "engine/optim.hpp"
#include "engine/system.hpp"
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
// optimizer/ halves (`files`), for a float16 run the loss scaler (its scale and counts), and the
// `seal`: checkpoint_seal of all that, so that an edit of any of it is found.
void save_checkpoint(const std::filesystem::path& dir, const Module& model, const AdamW& optimizer,
                     const LossScaler* scaler, int64_t step, const nlohmann::json& run);
// The fingerprint (engine/system.hpp) of a state.json's content but its "seal", as 16 hex digits.
std::string checkpoint_seal(nlohmann::json state);
// Whether the run directory `run` holds a checkpoint; one left as checkpoint.previous/ by a run
// stopped between save_checkpoint's two renames is first renamed back to checkpoint/.
bool recovered_checkpoint(const std::filesystem::path& run);
// The calling process as the run's one writer: the lock on <run>/lock, its pid written there (the
// directory is created if missing). Another holder is refused (std::runtime_error):
//     runs/x: another relgrad process (pid 4242) is training this run; wait for it to end or choose another --out
// A directory it created that still holds nothing but the lock when it is destroyed (a run
// refused before it wrote anything) is removed, so that a refused run leaves nothing behind.
class RunWriter {
public:
    explicit RunWriter(const std::filesystem::path& run);
    RunWriter(RunWriter&& other) noexcept;
    RunWriter& operator=(RunWriter&&) = delete;
    ~RunWriter();

private:
    std::filesystem::path run_;
    bool created_;  // the directory, by this writer
    std::optional<FileLock> lock_;
};

// A reading command's hold on the checkpoint of the run `run`: checkpoint/, or one left as
// checkpoint.previous/, read where it is; std::invalid_argument when the run has neither. While
// it lives the writer's swap waits, so path() holds one whole checkpoint.
class CheckpointReader {
public:
    explicit CheckpointReader(const std::filesystem::path& run);
    const std::filesystem::path& path() const { return path_; }

private:
    std::optional<FileLock> swap_lock_;
    std::filesystem::path path_;
};
// Loads the checkpoint `dir` of the run `run` (its run_identity) into model and optimizer and
// returns its step count. Every file is checked before use: state.json is {"step": N, "run": ...,
// "files": ..., "seal": ...} whose seal matches, with this run's identity and the optimizer's own
// count equal to N (less the skipped steps), a loss scaler that a run can reach; the two halves
// are the ones saved with it (their fingerprints); the weights and moments are floating (as
// Module::load and AdamW::load check them), finite, with no negative second moment.
int64_t load_checkpoint(const std::filesystem::path& dir, Module& model, AdamW& optimizer, LossScaler* scaler,
                        const nlohmann::json& run);

}  // namespace relgrad
