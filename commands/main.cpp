// relgrad: the command-line program.
//
//   relgrad train [CONFIG] [--set a.b=v ...] [--out DIR] [--resume] [--stop-after N]
//                                                   train (the quickstart by default)
//   relgrad validate CONFIG [--set a.b=v ...]       check a config (and its data) without training;
//                                                   list the optimizer groups' parameters
//   relgrad eval RUN_DIR [--data FILE]              metrics of a trained run on its test data (or FILE)
//   relgrad generate RUN_DIR --prompt TEXT [--max-tokens N]   greedy continuation or target (pairs)
//   relgrad attention RUN_DIR --prompt TEXT --out DIR   the attention weights per layer as .npy
//   relgrad explore RUN_DIR... [--host H] [--port P]  look inside trained runs in a browser
//   relgrad explore RUN_DIR... --export FILE --prompt TEXT...   the same view as one HTML file
//   relgrad data fetch NAME [--dir DIR]             download and convert sentiment, de-en or brown
//   relgrad gradcheck [--filter OP]                 run the registered gradient checks, print a table
//   relgrad layer --spec SPEC --in DIR --out DIR    one layer forward and backward on .npy files
//   --threads N with any of them                    the threads (train, validate: training.threads)
//   --device D with any of them                     where to compute: cpu (default), guarded_cpu or
//                                                   cuda (train, validate: training.device)
//
// Exit codes: 0 success, 1 a gradient check failed or training diverged, 2 bad input (one line
// on stderr), 130 (143) training interrupted by Ctrl-C (SIGTERM), checkpoint written.
#include <algorithm>
#include <charconv>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <string>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <omp.h>

#include "engine/backend/backend.hpp"
#include "engine/errors.hpp"
#include "engine/op_gradchecks.hpp"
#include "engine/system.hpp"
#include "train/config.hpp"
#include "train/datasets.hpp"
#include "commands/explorer.hpp"
#include "commands/fetch.hpp"
#include "commands/layer_command.hpp"
#include "train/make_task.hpp"
#include "train/processes.hpp"
#include "commands/run_commands.hpp"
#include "train/trainer.hpp"

namespace {

int run_gradcheck(const std::string& filter, relgrad::Device on) {
    const std::vector<relgrad::OpCheck> checks = relgrad::op_checks_for(filter);
    RELGRAD_CHECK(!checks.empty(), "no registered op is named '", filter, "'");
    relgrad::backend_for(on);  // no usable device: the one-line error before the table
    std::printf("%-32s %12s %12s  %s\n", "op", "max abs err", "max rel err", "pass");
    int failed = 0;
    std::string reports;
    for (const relgrad::OpCheck& check : checks) {
        const relgrad::GradcheckResult result = check.run(on);
        std::printf("%-32s %12.3e %12.3e  %s\n", check.name.c_str(), result.max_abs_error, result.max_rel_error,
                    result.passed ? "yes" : "NO");
        if (!result.passed) {
            ++failed;
            reports += "\n" + check.name + ": " + result.report;
        }
    }
    std::printf("%s\n%zu passed, %d failed\n", reports.c_str(), checks.size() - failed, failed);
    return failed == 0 ? 0 : 1;
}

// The config a command reads: a file or the built-in quickstart, then --set overrides.
relgrad::Config load_config(const std::string& path, const std::vector<std::string>& overrides,
                            const std::string& out) {
    nlohmann::json document = path.empty() ? relgrad::quickstart_config() : relgrad::read_config_file(path);
    for (const std::string& assignment : overrides) relgrad::apply_override(document, assignment);
    if (!out.empty()) {
        relgrad::require_utf8(out, "--out");
        RELGRAD_CHECK(document.is_object(), "--out: the config is not a JSON object {...}");
        document["output"]["dir"] = out;  // as given, not re-read as JSON
    }
    return relgrad::Config::parse(document, path.empty() ? "quickstart" : path);
}

// Ctrl-C (SIGINT) or SIGTERM while training: the first ends the run after its current step with
// a checkpoint written; the handler then steps aside, so a second one stops the program at once.
volatile std::sig_atomic_t interrupting_signal = 0;

extern "C" void on_interrupt(int signal_number) {
    interrupting_signal = signal_number;
    std::signal(signal_number, SIG_DFL);
}

// --profile: where the steps' time went (engine/profile.hpp), against this machine's product rate
void print_profile(const relgrad::Profile& profile) {
    if (profile.rows.empty()) {  // the first step this process runs warms up and is not timed
        std::printf(
            "\nprofile: no step to show: only the first step this process ran (a warm-up, not timed) was "
            "run; profile a run of two steps or more\n");
        return;
    }
    std::printf("\nprofile of the training steps after the first (%.1f s):\n%s", profile.seconds,
                relgrad::profile_table(profile, relgrad::measure_gemm_gflops()).c_str());
}

int run_train(const relgrad::Config& config, relgrad::TrainOptions options, const std::string& config_hint,
              bool profile_steps) {
    std::signal(SIGINT, on_interrupt);
    std::signal(SIGTERM, on_interrupt);
    options.interrupted = [] { return interrupting_signal != 0; };
    relgrad::Profile profile;
    if (profile_steps) options.profile = &profile;
    const nlohmann::json summary = relgrad::train(config, options);
    if (summary.contains("rank")) return 0;  // a process of several other than rank 0: rank 0 reports
    if (profile_steps) print_profile(profile);
    if (summary.contains("stopped_at")) {
        const bool interrupted = interrupting_signal != 0;
        std::fprintf(interrupted ? stderr : stdout,
                     "%s after step %lld%s; continue with: relgrad train%s --resume --out %s\n",
                     interrupted ? "interrupted" : "stopped", summary["stopped_at"].get<long long>(),
                     interrupted ? ", checkpoint written" : "", config_hint.c_str(), config.output.dir.c_str());
        // 128 + the signal: the shell's convention for a program ended by a signal
        return interrupted ? 128 + interrupting_signal : 0;
    }
    const nlohmann::json& final = summary["final"];
    const std::string metric = summary["metric"].get<std::string>();
    std::printf("%s with %s positions: test %s", summary["task"].get<std::string>().c_str(),
                summary["position"].get<std::string>().c_str(), metric.c_str());
    if (summary.contains("initial")) std::printf(" %.4g before training ->", summary["initial"][metric].get<double>());
    std::printf(" %.4g after %lld steps (%.0f s)\nby length:", final[metric].get<double>(),
                summary["steps"].get<long long>(), summary["train_seconds"].get<double>());
    // buckets in length order ("1-8", "9-16", ..., ">48"), not the JSON object's alphabetical one
    std::vector<std::pair<long long, std::string>> buckets;
    for (const auto& item : final["by_length"].items()) {
        const std::string& name = item.key();
        buckets.emplace_back(std::stoll(name.substr(name[0] == '>' ? 1 : 0)) + (name[0] == '>'), name);
    }
    std::sort(buckets.begin(), buckets.end());
    for (const auto& bucket : buckets) {
        const nlohmann::json& result = final["by_length"][bucket.second];
        std::printf(" %s: %.4g", bucket.second.c_str(), result[metric].get<double>());
    }
    std::printf("\nsummary, metrics and checkpoint in %s\n", config.output.dir.c_str());
    return 0;
}

// validate: the task built (its data read), the memory its first step needs, and the optimizer's
// groups with the parameters each caught.
void print_task(const relgrad::Config& config, const std::string& config_path) {
    relgrad::Generator init_gen(config.training.seed);
    std::optional<relgrad::Tokenizer> tokenizer;
    const std::unique_ptr<relgrad::Task> task = relgrad::make_task(config, relgrad::Init{init_gen}, tokenizer);
    const bool by_epochs = config.training.epochs > 0;
    std::printf("%s: valid (task %s, %s positions, %lld %s)\n", config_path.c_str(),
                relgrad::task_kind_name(config.task.kind),
                relgrad::position_mode_name(config.model.transformer.position),
                static_cast<long long>(by_epochs ? config.training.epochs : config.training.steps),
                by_epochs ? "epochs" : "steps");
    const relgrad::MemoryLimit limit = relgrad::memory_limit();
    std::printf("memory: the first step needs %s; this process may have %s (%s)\n",
                task->memory_estimate.describe().c_str(), relgrad::readable_bytes(limit.bytes).c_str(),
                limit.source.c_str());
    std::printf("optimizer groups (a parameter joins the first that matches its name):\n");
    for (const relgrad::MatchedGroup& g : relgrad::parameter_groups(config, task->model())) {
        const std::string name = g.match.empty() ? "the rest" : "\"" + g.match + "\"";
        std::printf("  %s: lr x %g, weight_decay %g, %zu parameters\n", name.c_str(), g.group.lr_scale,
                    g.group.weight_decay, g.names.size());
        for (const std::string& parameter : g.names) std::printf("    %s\n", parameter.c_str());
    }
}

// relgrad explore: serve until Ctrl-C (or SIGTERM), or write the export
int run_explore(const std::vector<std::string>& runs, const std::string& host, int port, const std::string& export_file,
                const std::vector<std::string>& prompts, relgrad::Device device) {
    RELGRAD_CHECK(!export_file.empty() || prompts.empty(),
                  "explore: --prompt is for --export; in the browser, type the prompt on the page");
    relgrad::Explorer explorer(runs, {}, device);
    if (!export_file.empty()) {
        relgrad::write_file(export_file, relgrad::export_page(explorer, prompts));
        std::printf("%s\n", export_file.c_str());
        return 0;
    }
    std::signal(SIGINT, on_interrupt);
    std::signal(SIGTERM, on_interrupt);
    relgrad::serve(
        explorer, host, port,
        [&host](const std::string& address) {
            if (!relgrad::is_loopback(host)) {
                std::fprintf(stderr,
                             "relgrad: warning: whoever reaches %s reads these runs, unauthenticated "
                             "(docs/explorer.md: an SSH tunnel instead)\n",
                             address.c_str());
            }
            std::printf("explorer at %s (Ctrl-C stops it)\n", address.c_str());
            std::fflush(stdout);
        },
        [] { return interrupting_signal != 0; });
    std::printf("stopped\n");
    return 0;
}

// A whole number in [low, high], read without saturating: "99999999999999999999" is out of range,
// not INT64_MAX (CLI11 reads integers with strtoll, which saturates).
CLI::Validator whole_number_in(int64_t low, int64_t high) {
    const std::string range = "[" + std::to_string(low) + ", " + std::to_string(high) + "]";
    return CLI::Validator(
        [low, high, range](std::string& text) -> std::string {
            int64_t value = 0;
            const char* end = text.data() + text.size();
            const auto [stop, error] = std::from_chars(text.data(), end, value);
            if (error != std::errc() || stop != end || value < low || value > high) {
                return "expected a whole number in " + range + ", got '" + text + "'";
            }
            return "";
        },
        "INT in " + range);
}

// CLI11 reports a command it does not know as "A subcommand is required"; name it instead. The
// command is the first argument that is not an option (nor the value of --threads or --device).
void require_known_command(const CLI::App& app, int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--threads" || arg == "--device") {
            ++i;
            continue;
        }
        if (arg.empty() || arg[0] == '-') continue;
        const auto commands = app.get_subcommands([](const CLI::App*) { return true; });
        std::string known;
        for (std::size_t n = 0; n < commands.size(); ++n) {
            if (commands[n]->get_name() == arg) return;
            known += (n == 0 ? "" : n + 1 == commands.size() ? " or " : ", ") + commands[n]->get_name();
        }
        RELGRAD_CHECK(false, "unknown command '", arg, "' (expected ", known, ")");
    }
}

// An option given as "" (--out "", --device ""): refused, never taken as one not given.
void refuse_empty_values(const CLI::App& app) {
    for (const CLI::Option* option : app.get_options()) {
        for (const std::string& value : option->results()) {
            RELGRAD_CHECK(!value.empty(), option->get_name(), ": the value is empty");
        }
    }
    for (const CLI::App* command : app.get_subcommands()) refuse_empty_values(*command);
}

std::string one_line(std::string message) {
    for (char& c : message) {
        if (c == '\n') c = ' ';
    }
    return message;
}

// The command line parsed and run: the exit code (0, 1 for a failed check or a diverged run, 2 for
// bad input, each error one line on stderr).
int run(int argc, char** argv) {
    CLI::App app{"relgrad: a reverse-mode autograd engine and relative-position Transformer layers"};
    app.require_subcommand(1);
    app.fallthrough();  // --threads may come after the subcommand too
    int threads = 0;
    app.add_option("--threads", threads, "threads for every command (train: overrides training.threads)")
        ->check(whole_number_in(1, 1024));
    std::string device_choice;
    app.add_option("--device", device_choice,
                   "where every command computes: " + relgrad::names_in_words(relgrad::device_names) +
                       " (default cpu; docs/engine.md#devices; train: overrides training.device)");
    std::string filter;
    std::string config_path, out_dir_override;
    std::vector<std::string> overrides;
    relgrad::TrainOptions train_options;
    CLI::App* train = app.add_subcommand("train", "train a model from a JSON config (the quickstart without one)");
    train->add_option("config", config_path, "the config file (default: the built-in quickstart)");
    train->add_option("--set", overrides, "override a value: path.to.key=value (repeatable)");
    train->add_option("--out", out_dir_override, "the output directory (output.dir)");
    train->add_flag("--resume", train_options.resume, "continue the run in the output directory");
    train->add_option("--stop-after", train_options.stop_after, "stop after this step, checkpoint written")
        ->check(whole_number_in(1, int64_t{1} << 40));
    bool profile_steps = false;
    train->add_flag("--profile", profile_steps, "print where the steps' time went, per op, forward and backward");
    CLI::App* validate = app.add_subcommand("validate", "check a config without training");
    validate->add_option("config", config_path, "the config file")->required();
    validate->add_option("--set", overrides, "override a value: path.to.key=value (repeatable)");

    std::string run_dir, data_file, prompt, dataset, data_dir;
    int64_t max_tokens = 64;
    CLI::App* eval = app.add_subcommand("eval", "evaluate a trained run");
    eval->add_option("run", run_dir, "the run's output directory")->required();
    eval->add_option("--data", data_file, "a test file to use instead of the run's own test data");
    CLI::App* generate = app.add_subcommand("generate", "greedy output of a trained run for a prompt");
    generate->add_option("run", run_dir, "the run's output directory")->required();
    generate->add_option("--prompt", prompt, "the text to continue or translate")->required();
    generate->add_option("--max-tokens", max_tokens, "the most tokens to produce (1 - 65536, default 64)")
        ->check(whole_number_in(1, 65536));
    std::string attention_out;
    CLI::App* attention = app.add_subcommand("attention", "write a trained run's attention weights for a prompt");
    attention->add_option("run", run_dir, "the run's output directory")->required();
    attention->add_option("--prompt", prompt, "the input (synthetic tasks: space-separated symbol ids)")->required();
    attention->add_option("--out", attention_out, "the directory for layer<i>.npy, [H, L, L] each")->required();
    std::vector<std::string> explore_runs, explore_prompts;
    std::string explore_host = "127.0.0.1", explore_export;
    int64_t explore_port = 8000;
    CLI::App* explore = app.add_subcommand("explore", "look inside trained runs in a browser (docs/explorer.md)");
    explore->add_option("runs", explore_runs, "the runs' output directories")->required();
    explore->add_option("--host", explore_host, "the address to listen on (default 127.0.0.1: this machine only)");
    explore->add_option("--port", explore_port, "the port (default 8000; 0: a free one)")
        ->check(whole_number_in(0, 65535));
    explore->add_option("--export", explore_export, "write the view as one self-contained HTML file instead");
    explore->add_option("--prompt", explore_prompts, "a prompt the exported view shows (repeatable)");
    CLI::App* data = app.add_subcommand("data", "real data sets");
    CLI::App* fetch = data->add_subcommand("fetch", "download, verify and convert a data set into the cache");
    fetch->add_option("name", dataset, "sentiment, de-en or brown")->required();
    fetch->add_option("--dir", data_dir, "the cache (default $RELGRAD_DATA, else ~/.cache/relgrad)");
    data->require_subcommand(1);

    CLI::App* gradcheck = app.add_subcommand("gradcheck", "run the gradient check of every registered op");
    gradcheck->add_option("--filter", filter, "run only the cases of this op (e.g. matmul)");
    std::string spec, in_dir, out_dir;
    CLI::App* layer = app.add_subcommand("layer", "run one layer forward and backward on .npy files");
    layer->add_option("--spec", spec, "the layer as JSON: type and options")->required();
    layer->add_option("--in", in_dir, "directory with x.npy, one <parameter>.npy each, optional mask.npy, dy.npy")
        ->required();
    layer->add_option("--out", out_dir, "directory for y.npy, dx.npy and grad.<parameter>.npy")->required();
    try {
        require_known_command(app, argc, argv);
        app.parse(argc, argv);
        refuse_empty_values(app);
        if (threads > 0) {
            relgrad::set_thread_count(threads, "--threads");
            overrides.push_back("training.threads=" + std::to_string(threads));
        }
        const relgrad::Device device = relgrad::parse_device(device_choice.empty() ? "cpu" : device_choice);
        if (!device_choice.empty()) overrides.push_back("training.device=\"" + device_choice + "\"");
        if (train->parsed()) {
            train_options.progress = isatty(fileno(stderr));
            relgrad::Config config = load_config(config_path, overrides, out_dir_override);
            if (config_path.empty() && out_dir_override.empty()) {
                // the quickstart never overwrites an earlier one: runs/quickstart, runs/quickstart-2, ...
                // and --resume continues the newest of them
                const std::string base = config.output.dir;
                std::string newest = base;
                for (int n = 2; std::filesystem::exists(config.output.dir); ++n) {
                    newest = config.output.dir;
                    config.output.dir = base + "-" + std::to_string(n);
                }
                if (train_options.resume) config.output.dir = newest;
            }
            std::string hint = config_path.empty() ? "" : " " + config_path;
            for (const std::string& assignment : overrides) hint += " --set " + assignment;
            return run_train(config, train_options, hint, profile_steps);
        }
        if (validate->parsed()) {
            print_task(load_config(config_path, overrides, ""), config_path);
            return 0;
        }
        if (eval->parsed()) {
            std::printf("%s\n", relgrad::evaluate_run(run_dir, data_file, device).dump(2).c_str());
            return 0;
        }
        if (generate->parsed()) {
            // on a terminal, the tokens made so far (a long --max-tokens takes a while), as training shows its steps
            relgrad::DecodeProgress progress;
            if (isatty(fileno(stderr))) {
                progress = [](int64_t done, int64_t most) {
                    std::fprintf(stderr, "\rgenerating: token %lld of at most %lld", static_cast<long long>(done),
                                 static_cast<long long>(most));
                };
            }
            const std::string text = relgrad::generate(run_dir, prompt, max_tokens, device, progress);
            if (progress) std::fprintf(stderr, "\n");
            std::printf("%s\n", text.c_str());
            return 0;
        }
        if (attention->parsed()) {
            for (const std::string& file : relgrad::write_attention(run_dir, prompt, attention_out, device)) {
                std::printf("%s\n", file.c_str());
            }
            return 0;
        }
        if (explore->parsed())
            return run_explore(explore_runs, explore_host, static_cast<int>(explore_port), explore_export,
                               explore_prompts, device);
        if (fetch->parsed()) {
            const std::string written =
                relgrad::fetch_dataset(dataset, data_dir.empty() ? relgrad::default_data_dir() : data_dir, std::cout);
            std::printf("%s\n", written.c_str());
            return 0;
        }
        if (gradcheck->parsed()) return run_gradcheck(filter, device);
        if (layer->parsed()) relgrad::run_layer_command(spec, in_dir, out_dir, device);
    } catch (const CLI::ParseError& e) {
        if (e.get_exit_code() == 0) return app.exit(e);  // --help
        std::cerr << "relgrad: " << one_line(e.what()) << " (run 'relgrad --help')\n";
        return 2;
    } catch (const relgrad::TrainingDiverged& e) {
        return relgrad::Processes::ending("relgrad: " + one_line(e.what()), 1);
    } catch (const std::filesystem::filesystem_error& e) {  // a path that skipped relgrad's own checks
        return relgrad::Processes::ending("relgrad: error: " + one_line(relgrad::filesystem_error_line(e)), 2);
    } catch (const std::bad_alloc& e) {  // relgrad's own say what could not be allocated
        return relgrad::Processes::ending("relgrad: error: out of memory: " + one_line(e.what()), 2);
    } catch (const std::exception& e) {
        return relgrad::Processes::ending("relgrad: error: " + one_line(e.what()), 2);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const int code = run(argc, argv);
    // what a command printed must have reached stdout: a full disk is an error, not a success
    std::cout.flush();
    if (std::fflush(stdout) != 0 || std::ferror(stdout) || !std::cout) {
        std::cerr << "relgrad: error: writing to stdout failed (" << std::strerror(errno) << ")\n";
        return code == 0 ? 2 : code;
    }
    return code;
}
