// relgrad: the commands that use a trained run (a directory written by train(), with config.json
// and checkpoint/): relgrad eval, relgrad generate and relgrad attention. The run's task and
// tokenizer are rebuilt from its config (the data read again) and its weights loaded from the
// checkpoint.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "train/config.hpp"
#include "train/task.hpp"
#include "train/tokenizer.hpp"

namespace relgrad {

// A trained run: its config, tokenizer (file tasks) and task (data read again), with the
// checkpoint's weights loaded into the task's model, in eval mode.
struct LoadedRun {
    Config config;
    std::optional<Tokenizer> tokenizer;
    std::unique_ptr<Task> task;
};
// Loads a trained run, its model on `device` (whichever device it was trained on); test_file
// replaces data.test (file tasks only). `weights_kept` asks for an attention implementation that
// keeps the weights: the fused one keeps none, and all three share the parameters, so a fused run
// is then loaded as bucketed.
LoadedRun load_run(const std::string& run_dir, const std::string& test_file = "", bool weights_kept = false,
                   Device device = Device::cpu);

// A prompt longer than the model can read: past its learned positions, or with attention weights
// the process has no memory for. Bad input (an std::invalid_argument); the explorer answers it
// with 413.
struct PromptTooLong : std::invalid_argument {
    using std::invalid_argument::invalid_argument;
};

// A prompt as token ids: the run's tokenizer, or for a synthetic task space-separated symbol ids
// (std::invalid_argument, the message starting with `command`, for an empty prompt or another
// word; PromptTooLong for a prompt past its learned positions, or, unless its attention is fused,
// with [H, L, L] attention weights the process has no memory for).
std::vector<int64_t> prompt_ids(const LoadedRun& run, const std::string& prompt, const char* command);
// Token ids as text: the run's tokenizer, or for a synthetic task the ids separated by spaces.
std::string output_text(const LoadedRun& run, const std::vector<int64_t>& ids);

// The metrics of a trained run on its test data, or on `test_file` (file tasks only: it replaces
// data.test).
nlohmann::json evaluate_run(const std::string& run_dir, const std::string& test_file = "", Device device = Device::cpu);

// Greedy output of a trained run for `prompt`: the continuation of a language model, the target of
// a pairs / copy / reverse model (synthetic prompts are space-separated symbol ids); `progress` is
// told each token made.
std::string generate(const std::string& run_dir, const std::string& prompt, int64_t max_tokens,
                     Device device = Device::cpu, const DecodeProgress& progress = {});

// The self-attention weights of a trained run for one prompt (the encoder's for sequence pairs):
// one [H, L, L] tensor per layer on `device`, row i the weights query i gives every key.
std::vector<Tensor> attention_weights(const std::string& run_dir, const std::string& prompt,
                                      Device device = Device::cpu);
// The same as <out_dir>/layer<i>.npy; returns the files written.
std::vector<std::string> write_attention(const std::string& run_dir, const std::string& prompt,
                                         const std::string& out_dir, Device device = Device::cpu);

}  // namespace relgrad
