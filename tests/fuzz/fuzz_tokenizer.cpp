// fuzz_tokenizer: the input is a run's tokenizer.json, loaded as `relgrad eval` and `relgrad
// generate` load it: saved_tokenizer(run_dir, kind) for a task on text files (train/run_directory.hpp,
// which hands the text to Tokenizer::from_json, train/tokenizer.hpp). A file it refuses must be
// refused with a std::exception; a tokenizer it accepts must come back unchanged from its own
// to_json(), and each learned token must encode to exactly its own id and decode back to itself.
// Seeds (corpus/tokenizer/): saved char and word tokenizers with and without their options,
// non-ASCII tokens, and broken ones (missing or unknown keys, reserved tokens out of place, a
// repeated token, a token of two characters or with a space, not an object, not JSON, an array
// nested 100,000 levels deep: run with -max_len=1000000).
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "train/run_directory.hpp"

using namespace relgrad_fuzz;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    single_thread();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const fs::path run = scratch_dir("tokenizer");
    write_file(run / "tokenizer.json", std::string_view(reinterpret_cast<const char*>(data), size));
    std::optional<relgrad::Tokenizer> tokenizer;
    try {
        tokenizer = relgrad::saved_tokenizer(run, relgrad::TaskKind::classification);
    } catch (const std::exception&) {
        return 0;  // refused, as it may be
    }
    if (!tokenizer) finding("saved_tokenizer found no tokenizer.json in " + run.string());

    const std::string saved = tokenizer->to_json();
    try {
        if (relgrad::Tokenizer::from_json(saved).to_json() != saved) {
            finding("a loaded tokenizer changes through to_json + from_json: " + saved);
        }
    } catch (const std::exception& e) {
        finding(std::string("a loaded tokenizer does not load from its own to_json(): ") + e.what());
    }
    const std::vector<std::string> tokens = nlohmann::json::parse(saved).at("tokens").get<std::vector<std::string>>();
    if (static_cast<int64_t>(tokens.size()) != tokenizer->vocab_size()) finding("to_json() lost tokens");
    for (std::size_t id = 4; id < tokens.size(); ++id) {
        const std::vector<int64_t> ids = tokenizer->encode(tokens[id]);
        if (ids != std::vector<int64_t>{static_cast<int64_t>(id)}) {
            finding("learned token " + std::to_string(id) + " " + nlohmann::json(tokens[id]).dump() +
                    " does not encode to its own id");
        }
        if (tokenizer->decode(ids) != tokens[id]) {
            finding("learned token " + std::to_string(id) + " does not decode to itself");
        }
    }
    return 0;
}
