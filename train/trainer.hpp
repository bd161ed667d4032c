// relgrad: training a model from a Config, with evaluation, checkpoints and a summary.
//
// The output directory receives config.json (the resolved config), metrics.jsonl (a line per
// logged step and per evaluation), checkpoint/ (model, optimizer, step; replaced atomically) and
// summary.json. A resumed run reaches the same result as an uninterrupted one: batches and
// dropout masks are drawn from (seed, step), not from a stream that a restart would lose.
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "train/config.hpp"

namespace relgrad {

struct TrainOptions {
    bool resume = false;      // continue from <output.dir>/checkpoint
    bool progress = false;    // a live progress line on stderr (for terminals)
    int64_t stop_after = -1;  // end this run after that step, checkpoint written (a planned interruption)
};

// Training produced a NaN or infinite loss or gradient norm; the message names the step.
struct TrainingDiverged : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Length bucketing (training.length_bucketing): the indices of the training examples sorted by
// length (ties by index) and cut into groups of group_size neighbours, the last group taking what
// is left; a batch is then drawn from one group, so it pads little.
std::vector<std::vector<int64_t>> length_groups(const std::vector<int64_t>& lengths, int64_t group_size);

// Trains, evaluates and writes the output directory; returns summary.json's content (or, when
// stopped by stop_after, {"stopped_at": step} and no summary). Throws
// std::invalid_argument for an unusable config or output directory and TrainingDiverged.
nlohmann::json train(const Config& config, const TrainOptions& options);

// The metrics of a trained run (<run_dir>/config.json and checkpoint/) on its test data, or on
// `test_file` (file tasks only: it replaces data.test).
nlohmann::json evaluate_run(const std::string& run_dir, const std::string& test_file = "");

// Greedy output of a trained run for `prompt`: the continuation of a language model, the target of
// a pairs / copy / reverse model (synthetic prompts are space-separated symbol ids).
std::string generate(const std::string& run_dir, const std::string& prompt, int64_t max_tokens);

// The self-attention weights of a trained run for one prompt (the encoder's for sequence pairs):
// <out_dir>/layer<i>.npy, [H, L, L] each, row i the weights query i gives every key. Returns the
// files written.
std::vector<std::string> write_attention(const std::string& run_dir, const std::string& prompt,
                                         const std::string& out_dir);

}  // namespace relgrad
