// relgrad: the commands that use a trained run (a directory written by train(), with config.json
// and checkpoint/): relgrad eval, relgrad generate and relgrad attention. The run's task and
// tokenizer are rebuilt from its config (the data read again) and its weights loaded from the
// checkpoint.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace relgrad {

// The metrics of a trained run on its test data, or on `test_file` (file tasks only: it replaces
// data.test).
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
