// fuzz_checkpoint: a damaged checkpoint, loaded as `relgrad train --resume` loads one, and then
// evaluated as `relgrad eval` would. LLVMFuzzerInitialize trains a tiny run once (relgrad::train,
// 2 steps of a 1-layer model of width 8 with relative positions, in float16 so that state.json
// holds a loss scaler, under the scratch directory),
// checks that evaluate_run (commands/run_commands.hpp) reads it, and builds the run's task (model and
// data) and optimizer once. Each input then replaces ONE file of the run's checkpoint/: the first
// byte picks the file (modulo their count plus one, in sorted path order: model/*.npy,
// model/manifest.json, optimizer/m.*.npy, optimizer/step.txt, optimizer/v.*.npy, state.json, and
// last state.json again, resealed), the other bytes are its new content. Unless that file is
// state.json, state.json's fingerprints of the two halves and its seal are brought up to date (as
// an edit that updates them too would), so that the checks behind them are reached; state.json
// picked the second way gets its seal brought up to date, so that what it holds (the loss scaler
// above all) reaches the checks behind the seal. The checkpoint is loaded into that model and optimizer by
// load_checkpoint (train/run_directory.hpp, the resume path) and, when it loads, the model is evaluated on the run's
// test set; then the files are put back. Refusals are std::exceptions; weights the checks let through must only give
// numbers, never a crash or undefined behaviour. (The model is reused, not rebuilt per input: building one precomputes
// a 512 x 512 relative index, which under the sanitizers costs more than the rest of an input; a load that succeeds
// replaces every parameter and moment, so an evaluation depends only on the checkpoint it follows.) Seeds
// (corpus/checkpoint/): each file's selector byte followed by its content in such a run (so valid), and damaged
// versions of them (truncated, wrong shape, a bad step count, a manifest missing a parameter, naming one more or giving
// a size of 1e30, a step nested 100,000 levels deep, a loss scaler edited under its seal, or resealed with a scale or a
// count no run reaches). A seed whose selector points at another file than intended (a changed model) is still a valid
// input, only a less interesting one; regenerate them with
//     RELGRAD_FUZZ_WRITE_SEEDS=tests/fuzz/corpus/checkpoint build-fuzz/tests/fuzz/fuzz_checkpoint
#include <algorithm>
#include <exception>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "engine/optim.hpp"
#include "engine/system.hpp"
#include "fuzz_common.hpp"
#include "train/config.hpp"
#include "train/json_reader.hpp"
#include "train/make_task.hpp"
#include "commands/run_commands.hpp"
#include "train/run_directory.hpp"
#include "train/trainer.hpp"

using namespace relgrad_fuzz;

namespace {

fs::path run;                         // the trained run
relgrad::Config config;               // its config
std::unique_ptr<relgrad::Task> task;  // its task, and the optimizer of its model
std::unique_ptr<relgrad::AdamW> optimizer;
relgrad::LossScaler scaler;                // float16's, restored by each load
std::vector<fs::path> files;               // the files of run/checkpoint/, sorted
std::map<fs::path, std::string> pristine;  // their content as trained

std::string read_bytes(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

nlohmann::json tiny_config(const fs::path& out) {
    return {{"model",
             {{"layers", 1},
              {"dim", 8},
              {"heads", 2},
              {"ff_dim", 16},
              {"dropout", 0.0},
              {"position", "relative"},
              {"k", 2}}},
            {"task",
             {{"kind", "relative_order"},
              {"vocab", 8},
              {"train_lengths", {4, 6}},
              {"test_lengths", {4, 8}},
              {"distance", 1},
              {"train_examples", 8},
              {"test_examples", 4}}},
            {"training",
             {{"steps", 2},
              {"batch_size", 4},
              {"warmup_steps", 1},
              {"threads", 1},
              {"log_every", 1},
              {"precision", "float16"}}},
            {"evaluation", {{"every", 2}, {"batch_size", 4}, {"length_buckets", {4, 8}}}},
            {"output", {{"dir", out.string()}, {"checkpoint_every", 2}}}};
}

// RELGRAD_FUZZ_WRITE_SEEDS=DIR: writes the seeds of corpus/checkpoint/ into DIR (and exits): the
// checkpoint's small files and its first tensor of each kind, valid and damaged.
void write_seeds(const fs::path& dir) {
    fs::create_directories(dir);
    const auto write_seed = [&](const std::string& name, std::size_t selector, const std::string& content) {
        write_file(dir / name, std::string(1, static_cast<char>(selector)) + content);
        std::printf("%s: selector %zu, %s\n", name.c_str(), selector,
                    selector < files.size() ? fs::relative(files[selector], run / "checkpoint").string().c_str()
                                            : "state.json, resealed");
    };
    const auto seed = [&](const std::string& name, const fs::path& file, const std::string& content) {
        const auto at = std::find(files.begin(), files.end(), file);
        if (at == files.end()) finding("fuzz_checkpoint: no file " + file.string() + " in the tiny run");
        write_seed(name, static_cast<std::size_t>(at - files.begin()), content);
    };
    const fs::path checkpoint = run / "checkpoint";
    const fs::path model_npy = *std::find_if(files.begin(), files.end(), [&](const fs::path& f) {
        return f.parent_path() == checkpoint / "model" && f.extension() == ".npy";
    });
    const fs::path optimizer_npy = checkpoint / "optimizer" / "m.0.npy";
    for (const auto& [name, file] : {std::pair{"valid_state", checkpoint / "state.json"},
                                     {"valid_manifest", checkpoint / "model" / "manifest.json"},
                                     {"valid_step", checkpoint / "optimizer" / "step.txt"},
                                     {"valid_model_tensor", model_npy},
                                     {"valid_optimizer_tensor", optimizer_npy}}) {
        seed(name, file, pristine[file]);
    }
    nlohmann::json state = nlohmann::json::parse(pristine[checkpoint / "state.json"]);  // its run and fingerprints
    state["step"] = -1;
    seed("broken_state_negative", checkpoint / "state.json", state.dump());
    state["step"] = "2";
    seed("broken_state_text", checkpoint / "state.json", state.dump());
    state["step"] = 2;
    state["run"]["training"]["seed"] = 7;  // another run's checkpoint
    seed("broken_state_other_run", checkpoint / "state.json", state.dump());
    seed("broken_step", checkpoint / "optimizer" / "step.txt", "two\n");
    nlohmann::json manifest = nlohmann::json::parse(pristine[checkpoint / "model" / "manifest.json"]);
    nlohmann::json fewer = manifest;
    fewer["parameters"].erase(0);
    seed("broken_manifest_missing", checkpoint / "model" / "manifest.json", fewer.dump());
    nlohmann::json more = manifest;
    more["parameters"].push_back({{"name", "extra"}, {"shape", {2}}});
    seed("broken_manifest_extra", checkpoint / "model" / "manifest.json", more.dump());
    nlohmann::json huge = manifest;  // a size no int64_t holds
    huge["parameters"][0]["shape"][0] = 1e30;
    seed("broken_manifest_size", checkpoint / "model" / "manifest.json", huge.dump());
    const std::string tensor = pristine[model_npy];
    seed("broken_tensor_truncated", model_npy, tensor.substr(0, tensor.size() - 4));
    // the same bytes with a leading dimension of 1 (a shape the model does not expect), the header
    // kept at its length by taking three of its padding spaces
    std::string reshaped = tensor;
    const std::size_t open = reshaped.find("'shape': (");
    if (open != std::string::npos) {
        reshaped.replace(open, 10, "'shape': (1, ");
        const std::size_t end = reshaped.find('\n', open);
        if (end != std::string::npos && reshaped.compare(end - 3, 3, "   ") == 0) reshaped.erase(end - 3, 3);
    }
    seed("broken_tensor_shape", model_npy, reshaped);
    seed("broken_state_deep", checkpoint / "state.json",
         "{\"step\": " + std::string(100000, '[') + std::string(100000, ']') + "}");
    // the loss scaler: edited under the seal (refused by it), and resealed with values no run reaches
    nlohmann::json sealed = nlohmann::json::parse(pristine[checkpoint / "state.json"]);
    const nlohmann::json scaler_saved = sealed["loss_scaler"];
    sealed["loss_scaler"]["scale"] = scaler_saved["scale"].get<double>() / 2;
    seed("broken_scaler_unsealed", checkpoint / "state.json", sealed.dump());
    write_seed("valid_state_resealed", files.size(), pristine[checkpoint / "state.json"]);
    for (const auto& [name, key, value] :
         {std::tuple<const char*, const char*, nlohmann::json>{"broken_scaler_huge", "scale", 1e300},
          {"broken_scaler_denormal", "scale", 5e-324},
          {"broken_scaler_not_power", "scale", 3 * 65536.0},
          {"broken_scaler_clean", "clean_steps", 2000},
          {"broken_scaler_skipped", "skipped_steps", 3},
          {"broken_scaler_negative", "skipped_steps", -1}}) {
        nlohmann::json edited = nlohmann::json::parse(pristine[checkpoint / "state.json"]);
        edited["loss_scaler"][key] = value;
        write_seed(name, files.size(), edited.dump());  // the harness reseals it
    }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    single_thread();
    run = scratch_dir("checkpoint") / "run";
    try {
        config = relgrad::Config::parse(tiny_config(run), "tiny");
        relgrad::train(config, relgrad::TrainOptions{});
    } catch (const std::exception& e) {
        finding(std::string("fuzz_checkpoint: training the tiny run failed: ") + e.what());
    }
    for (const auto& entry : fs::recursive_directory_iterator(run / "checkpoint")) {
        if (entry.is_regular_file()) files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) finding("fuzz_checkpoint: the tiny run wrote no checkpoint files");
    for (const fs::path& file : files) pristine[file] = read_bytes(file);
    try {
        static_cast<void>(relgrad::evaluate_run(run.string()));
        relgrad::Generator gen(config.training.seed);
        std::optional<relgrad::Tokenizer> no_tokenizer;
        task = relgrad::make_task(config, relgrad::Init{gen, relgrad::DType::float32}, no_tokenizer);
        optimizer =
            std::make_unique<relgrad::AdamW>(relgrad::without_names(relgrad::parameter_groups(config, task->model())),
                                             config.training.adamw);  // as train() builds it
        relgrad::load_checkpoint(run / "checkpoint", task->model(), *optimizer, &scaler,
                                 relgrad::run_identity(config.resolved()));
    } catch (const std::exception& e) {
        finding(std::string("fuzz_checkpoint: the tiny run does not load: ") + e.what());
    }
    if (const char* dir = std::getenv("RELGRAD_FUZZ_WRITE_SEEDS")) {
        write_seeds(dir);
        std::exit(0);
    }
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const std::size_t selector = data[0] % (files.size() + 1);  // the last: state.json, resealed
    const fs::path state = run / "checkpoint" / "state.json";
    const fs::path& file = selector < files.size() ? files[selector] : state;
    const std::string_view content(reinterpret_cast<const char*>(data) + 1, size - 1);
    write_file(file, content);
    if (file != state) {
        nlohmann::json fresh = nlohmann::json::parse(pristine[state]);
        for (const char* half : {"model", "optimizer"}) {
            try {
                fresh["files"][half] = relgrad::directory_fingerprint(run / "checkpoint" / half);
            } catch (const std::exception&) {  // a file that cannot be read: load_checkpoint says so
            }
        }
        fresh["seal"] = relgrad::checkpoint_seal(fresh);
        write_file(state, fresh.dump());
    } else if (selector == files.size()) {
        // parsed as load_checkpoint parses it (a duplicate key, deep nesting: left for it to refuse)
        nlohmann::json edited = nlohmann::json::parse(content, nullptr, false);
        if (edited.is_object() && relgrad::nested_at_most(edited, 32)) {  // dump() recurses once per level
            edited["seal"] = relgrad::checkpoint_seal(edited);
            write_file(state, edited.dump());
        }
    }

    bool loaded = false;
    try {
        relgrad::load_checkpoint(run / "checkpoint", task->model(), *optimizer, &scaler,
                                 relgrad::run_identity(config.resolved()));
        loaded = true;
    } catch (const std::exception&) {
    }
    if (loaded) {  // relgrad eval's work on what was loaded
        try {
            task->model().eval();
            static_cast<void>(
                task->evaluate(config.evaluation.batch_size, relgrad::LengthBuckets(config.evaluation.length_buckets)));
        } catch (const std::exception&) {
        }
    }
    write_file(file, pristine[file]);
    write_file(state, pristine[state]);
    return 0;
}
