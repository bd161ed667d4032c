// relgrad: training a model from a Config, with evaluation, checkpoints and a summary.
//
// The output directory receives config.json (the resolved config), metrics.jsonl (a line per
// logged step and per evaluation), checkpoint/ (model, optimizer, step; replaced atomically) and
// summary.json (train/run_directory.hpp). A resumed run reaches the same result as an
// uninterrupted one: batches and dropout masks are drawn from (seed, step), not from a stream that
// a restart would lose.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

#include "engine/profile.hpp"
#include "train/config.hpp"

namespace relgrad {

struct TrainOptions {
    bool resume = false;      // continue from <output.dir>/checkpoint
    bool progress = false;    // a live progress line on stderr (for terminals)
    int64_t stop_after = -1;  // end this run after that step, checkpoint written (a planned interruption)
    // Asked after every step but the last: true ends the run there, checkpoint written, as
    // stop_after does (how `relgrad train` and Python's relgrad.train pass Ctrl-C on).
    std::function<bool()> interrupted;
    // When set, the training steps of this run after its first (the warm-up) are profiled into it
    // (engine/profile.hpp): the steps alone, not the evaluations between them.
    Profile* profile = nullptr;
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
// stopped by stop_after or interrupted, {"stopped_at": step} and no summary). Throws
// std::invalid_argument for an unusable config or output directory and TrainingDiverged. Under
// mpirun every process calls it; rank 0 writes the run and returns the summary, the others
// return {"rank": their rank} (docs/distributed.md).
nlohmann::json train(const Config& config, const TrainOptions& options);

}  // namespace relgrad
