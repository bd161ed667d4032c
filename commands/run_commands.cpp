#include "commands/run_commands.hpp"

#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "engine/autograd.hpp"
#include "engine/errors.hpp"
#include "engine/npy.hpp"
#include "engine/system.hpp"
#include "train/config.hpp"
#include "train/make_task.hpp"
#include "train/run_directory.hpp"

namespace relgrad {

namespace fs = std::filesystem;
using nlohmann::json;

LoadedRun load_run(const std::string& run_dir, const std::string& test_file, bool weights_kept, Device device) {
    const fs::path dir(run_dir);
    const CheckpointReader checkpoint(dir);  // the writer's next swap waits until the model is loaded
    LoadedRun run;
    json document = read_json_file(dir / "config.json");
    if (!test_file.empty()) {
        const TaskKind kind = parse_task_kind(document);
        RELGRAD_CHECK(reads_files(kind), "--data: a ", task_kind_name(kind), " run generates its own test data");
        document["data"]["test"] = test_file;
    }
    run.config = Config::parse(document, (dir / "config.json").string());
    if (weights_kept && run.config.model.transformer.impl == AttentionImpl::fused) {
        run.config.model.transformer.impl = AttentionImpl::bucketed;
    }
    run.tokenizer = saved_tokenizer(dir, run.config.task.kind);
    Generator gen(run.config.training.seed);
    run.task = make_task(run.config, Init{gen, DType::float32}, run.tokenizer);
    run.task->model().load((checkpoint.path() / "model").string());
    run.task->model().to(device);
    // in the precision it trained in: the same values as casting the float32 weights at each use
    if (run.config.training.precision != DType::float32) run.task->model().to(run.config.training.precision);
    run.task->model().eval();
    return run;
}

namespace {

// Refuses a prompt of `length` tokens that the model cannot read: past the rows of its learned
// positions, or, unless its attention is fused, whose attention scores and weights, two
// [H, L, L] tensors per layer, would not fit in the memory the process may have.
void check_prompt_fits(const LoadedRun& run, int64_t length, const char* command) {
    const TransformerOptions& t = run.config.model.transformer;
    const std::string prompt = std::string(command) + ": ";
    if (t.position == PositionMode::learned && length > t.max_positions) {
        throw PromptTooLong(prompt + "the prompt has " + std::to_string(length) +
                            " tokens, but the model's learned positions cover " + std::to_string(t.max_positions) +
                            " (the longest input it was trained for); give a shorter prompt");
    }
    if (t.impl == AttentionImpl::fused) return;  // O(L) memory
    const double bytes = static_cast<double>(t.heads) * static_cast<double>(length) * static_cast<double>(length) *
                         static_cast<double>(dtype_size(run.config.training.precision));
    const MemoryLimit limit = memory_limit();
    if (2 * bytes > limit.bytes) {
        const std::string L = std::to_string(length);
        throw PromptTooLong(prompt + "a prompt of " + L + " tokens needs attention weights [" +
                            std::to_string(t.heads) + ", " + L + ", " + L + "] of " + readable_bytes(bytes) +
                            " in each layer, with their scores " + readable_bytes(2 * bytes) +
                            ", and this process may have " + readable_bytes(limit.bytes) + " (" + limit.source +
                            "); give a shorter prompt (generate with model.attention = fused keeps no [L, L] tensor)");
    }
}

// A synthetic task's prompt: space-separated symbol ids.
std::vector<int64_t> symbol_ids(const LoadedRun& run, const std::string& prompt, const char* command) {
    std::vector<int64_t> ids;
    std::istringstream words(prompt);
    for (std::string word; words >> word;) {
        std::size_t used = 0;
        int64_t id = -1;
        try {
            id = std::stoll(word, &used);
        } catch (const std::exception&) {
        }
        RELGRAD_CHECK(used == word.size() && id >= 4 && id < run.config.task.vocab, command, ": '", word,
                      "' is not a symbol id in [4, ", run.config.task.vocab, ") of this synthetic task");
        ids.push_back(id);
    }
    return ids;
}

}  // namespace

std::vector<int64_t> prompt_ids(const LoadedRun& run, const std::string& prompt, const char* command) {
    RELGRAD_CHECK(prompt.find_first_not_of(" \t\r\n") != std::string::npos, command, ": the prompt is empty");
    std::vector<int64_t> ids = run.tokenizer ? run.tokenizer->encode(prompt) : symbol_ids(run, prompt, command);
    check_prompt_fits(run, static_cast<int64_t>(ids.size()), command);
    return ids;
}

std::string output_text(const LoadedRun& run, const std::vector<int64_t>& ids) {
    if (run.tokenizer) return run.tokenizer->decode(ids);
    std::string out;
    for (int64_t id : ids) out += (out.empty() ? "" : " ") + std::to_string(id);
    return out;
}

json evaluate_run(const std::string& run_dir, const std::string& test_file, Device device) {
    LoadedRun run = load_run(run_dir, test_file, false, device);
    json result =
        run.task->evaluate(run.config.evaluation.batch_size, LengthBuckets(run.config.evaluation.length_buckets));
    result["metric"] = run.task->metric();
    return result;
}

std::string generate(const std::string& run_dir, const std::string& prompt, int64_t max_tokens, Device device,
                     const DecodeProgress& progress) {
    RELGRAD_CHECK(max_tokens >= 1, "generate: --max-tokens must be positive");
    LoadedRun run = load_run(run_dir, "", false, device);
    return output_text(run, run.task->generate(prompt_ids(run, prompt, "generate"), max_tokens, progress));
}

std::vector<Tensor> attention_weights(const std::string& run_dir, const std::string& prompt, Device device) {
    LoadedRun run = load_run(run_dir, "", /*weights_kept=*/true, device);
    const std::vector<int64_t> ids = prompt_ids(run, prompt, "attention");
    NoGradGuard no_grad;
    return run.task->attention(ids);
}

std::vector<std::string> write_attention(const std::string& run_dir, const std::string& prompt,
                                         const std::string& out_dir, Device device) {
    const std::vector<Tensor> weights = attention_weights(run_dir, prompt, device);
    create_output_directory(out_dir, "the output directory (--out)");
    std::vector<std::string> written;
    for (std::size_t layer = 0; layer < weights.size(); ++layer) {
        written.push_back((fs::path(out_dir) / ("layer" + std::to_string(layer) + ".npy")).string());
        save_npy(weights[layer], written.back());
    }
    return written;
}

}  // namespace relgrad
