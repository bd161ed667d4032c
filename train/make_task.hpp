// relgrad: a task built from a config and its data: the synthetic tasks generated from the seed,
// the file tasks read from data.train (and data.test, or a held-out part of data.train) and
// tokenized.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "train/config.hpp"
#include "train/task.hpp"
#include "train/tokenizer.hpp"

namespace relgrad {

// The estimate for config `c` with a vocabulary of `vocab` tokens and, for a classifier, `classes`.
MemoryEstimate estimate_memory(const Config& c, int64_t vocab, int64_t classes);

// The task of config `c`, its model initialised from `init`. The file tasks use `tokenizer` when
// it holds one (a trained run's) and otherwise build one from the training texts and leave it
// there. Before the model is allocated, its memory estimate is compared with what the process may
// have (engine/system.hpp's memory_limit; a cpu run's): more is refused with the estimate, the
// limit and the keys that drive it. Throws std::invalid_argument for data that cannot make the
// task.
std::unique_ptr<Task> make_task(const Config& c, const Init& init, std::optional<Tokenizer>& tokenizer);

}  // namespace relgrad
