// relgrad's Python module: training from a config (the command line's keys, defaults and errors)
// and the commands on a trained run: evaluate, generate, attention weights, the loaded model.
#include <cmath>
#include <filesystem>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "engine/errors.hpp"
#include "engine/system.hpp"
#include "layers/module.hpp"
#include "python/bindings.hpp"
#include "train/config.hpp"
#include "train/json_reader.hpp"
#include "commands/explorer.hpp"
#include "commands/run_commands.hpp"
#include "train/run_directory.hpp"
#include "train/trainer.hpp"

namespace relgrad::python {

namespace {

namespace fs = std::filesystem;

py::object to_python(const nlohmann::json& value) { return py::module_::import("json").attr("loads")(value.dump()); }

// Checks what a config dict holds before it becomes JSON: a float JSON cannot hold (NaN, infinity)
// and a dict or list that holds itself (json.dumps would refuse it; a walk would not end) are
// std::invalid_argument naming the JSON path ("/training/learning_rate"). Walked with a stack of
// its own, not recursion; `open` holds the containers from the root to the one being walked.
void require_json_values(const py::dict& config) {
    struct Step {
        py::handle value;
        std::string path;
        bool leaving;  // the walk has finished this container's items
    };
    std::vector<Step> pending = {{config, "", false}};
    std::set<PyObject*> open;
    while (!pending.empty()) {
        const Step step = pending.back();
        pending.pop_back();
        if (step.leaving) {
            open.erase(step.value.ptr());
            continue;
        }
        if (py::isinstance<py::float_>(step.value)) {
            RELGRAD_CHECK(std::isfinite(step.value.cast<double>()), "config: ", step.path,
                          " is NaN or infinite, a number JSON cannot hold");
            continue;
        }
        const bool dict = py::isinstance<py::dict>(step.value);
        if (!dict && !py::isinstance<py::list>(step.value) && !py::isinstance<py::tuple>(step.value)) continue;
        RELGRAD_CHECK(open.insert(step.value.ptr()).second, "config: ", step.path.empty() ? "/" : step.path,
                      " refers back to a dict or list that holds it (a circular reference, which JSON cannot hold)");
        pending.push_back({step.value, step.path, true});
        if (dict) {
            for (const auto& [key, item] : py::reinterpret_borrow<py::dict>(step.value)) {
                pending.push_back({item, step.path + "/" + py::str(key).cast<std::string>(), false});
            }
        } else {
            std::size_t index = 0;
            for (const py::handle item : step.value) {
                pending.push_back({item, step.path + "/" + std::to_string(index++), false});
            }
        }
    }
}

// A prompt as UTF-8; a str that has none (a lone surrogate, "\\ud800") is a ValueError naming it.
std::string prompt_text(const py::str& prompt, const char* method) {
    const py::object bytes = py::reinterpret_steal<py::object>(PyUnicode_AsUTF8String(prompt.ptr()));
    if (!bytes) {
        PyErr_Clear();
        RELGRAD_CHECK(false, method,
                      ": prompt is not valid Unicode text (it holds a lone surrogate, which UTF-8 cannot "
                      "encode)");
    }
    return bytes.cast<std::string>();
}

// A config document from a dict (read as the JSON it would be written as), a path to a JSON file,
// or None (the quickstart); then the overrides, as `relgrad train --set`.
nlohmann::json config_document(const py::object& config, const std::vector<std::string>& overrides, std::string& name) {
    nlohmann::json document;
    if (config.is_none()) {
        name = "quickstart";
        document = quickstart_config();
    } else if (py::isinstance<py::dict>(config)) {
        name = "config";
        require_json_values(config.cast<py::dict>());
        const std::string text = py::module_::import("json").attr("dumps")(config).cast<std::string>();
        document = parse_json(text, name);
    } else if (py::isinstance<py::str>(config) || py::hasattr(config, "__fspath__")) {
        name = py::module_::import("os").attr("fspath")(config).cast<std::string>();
        document = read_config_file(name);
    } else {
        throw py::type_error("a config is a dict, a path to a JSON file, or None for the quickstart");
    }
    for (const std::string& assignment : overrides) apply_override(document, assignment);
    return document;
}

// A trained run, loaded once: its model stays in memory for Python to inspect.
struct Run {
    std::string dir;
    LoadedRun loaded;
};

}  // namespace

void bind_run(py::module_& m) {
    m.def(
        "quickstart_config", [] { return to_python(quickstart_config()); },
        "The default config of `relgrad train`: relative-order classification with relative positions");
    m.def(
        "validate",
        [](const py::object& config, const std::vector<std::string>& set) {
            std::string name;
            return to_python(Config::parse(config_document(config, set, name), name).resolved());
        },
        py::arg("config") = py::none(), py::arg("set") = std::vector<std::string>{},
        "Checks a config as `relgrad validate` does; returns it with every default filled in");
    m.def(
        "train",
        [](const py::object& config, const std::optional<std::string>& out, bool resume, bool progress,
           const std::vector<std::string>& set) {
            std::string name;
            nlohmann::json document = config_document(config, set, name);
            if (out) {
                RELGRAD_CHECK(document.is_object(), "out: the config is not a JSON object {...}");
                document["output"]["dir"] = *out;
            }
            const Config parsed = Config::parse(document, name);
            // Ctrl-C (or any signal whose Python handler raises) ends the run after the current
            // step with its checkpoint written, and the handler's exception is raised here.
            std::optional<py::error_already_set> raised_by_signal;
            TrainOptions options;
            options.resume = resume;
            options.progress = progress;
            options.interrupted = [&raised_by_signal] {
                py::gil_scoped_acquire acquire;
                if (PyErr_CheckSignals() == 0) return false;
                raised_by_signal.emplace();  // takes the pending exception (KeyboardInterrupt)
                return true;
            };
            nlohmann::json summary;
            {
                py::gil_scoped_release release;
                summary = train(parsed, options);
            }
            if (raised_by_signal) {
                const std::string note = "relgrad.train: interrupted after step " +
                                         std::to_string(summary["stopped_at"].get<long long>()) +
                                         ", checkpoint written; train(..., resume=True) continues\n";
                PySys_WriteStderr("%s", note.c_str());
                throw *raised_by_signal;
            }
            return to_python(summary);
        },
        py::arg("config") = py::none(), py::arg("out") = py::none(), py::arg("resume") = false,
        py::arg("progress") = false, py::arg("set") = std::vector<std::string>{},
        "Trains as `relgrad train` does (config: a dict, a JSON file or None for the quickstart; set: 'a.b=value' "
        "overrides); writes the run directory and returns summary.json's content");

    py::class_<Run>(m, "Run", "A trained run directory, loaded: its config, its model with the checkpoint's weights")
        .def(py::init([](const std::string& dir) {
                 py::gil_scoped_release release;
                 return std::make_unique<Run>(Run{dir, load_run(dir)});
             }),
             py::arg("dir"))
        .def_readonly("dir", &Run::dir)
        .def_property_readonly("config", [](const Run& run) { return to_python(run.loaded.config.resolved()); })
        .def_property_readonly("task",
                               [](const Run& run) { return std::string(task_kind_name(run.loaded.config.task.kind)); })
        .def_property_readonly(
            "model", [](Run& run) -> Module& { return run.loaded.task->model(); },
            py::return_value_policy::reference_internal,
            "The model (a relgrad.nn SequenceClassifier, CausalLanguageModel or EncoderDecoder)")
        .def("summary", [](const Run& run) { return to_python(read_json_file(fs::path(run.dir) / "summary.json")); })
        .def(
            "metrics",
            [](const Run& run) {
                const fs::path path = fs::path(run.dir) / "metrics.jsonl";
                std::istringstream lines(read_file(path.string(), "a metrics file"));
                py::list metrics;
                for (std::string line; std::getline(lines, line);) {
                    if (!line.empty()) metrics.append(to_python(parse_json(line, path.string())));
                }
                return metrics;
            },
            "metrics.jsonl: a dict per logged step and per evaluation")
        .def(
            "gates", [](const Run& run) { return run.loaded.task->gates(); }, "g per layer and head (gated models)")
        .def(
            "evaluate",
            [](const Run& run, const std::optional<std::string>& data) {
                nlohmann::json result;
                {
                    py::gil_scoped_release release;
                    result = evaluate_run(run.dir, data.value_or(""));
                }
                return to_python(result);
            },
            py::arg("data") = py::none(), "As `relgrad eval`: the metrics on the test data, or on the file data")
        .def(
            "generate",
            [](const Run& run, const py::str& prompt, int64_t max_tokens) {
                RELGRAD_CHECK(max_tokens >= 1, "generate: max_tokens must be positive, got ", max_tokens);
                const std::string text = prompt_text(prompt, "generate");
                py::gil_scoped_release release;
                return generate(run.dir, text, max_tokens);
            },
            py::arg("prompt"), py::arg("max_tokens") = 32,
            "As `relgrad generate`: the greedy continuation or target for a prompt")
        .def(
            "attention",
            [](const Run& run, const py::str& prompt) {
                const std::string text = prompt_text(prompt, "attention");
                std::vector<Tensor> weights;
                {
                    py::gil_scoped_release release;
                    weights = attention_weights(run.dir, text);
                }
                py::list arrays;
                for (const Tensor& w : weights) arrays.append(to_numpy(w.to(Device::cpu).contiguous()));
                return arrays;
            },
            py::arg("prompt"), "As `relgrad attention`: per layer, the weights [H, L, L] for the prompt");
    m.attr("load_run") = m.attr("Run");  // relgrad.load_run(dir) reads as what it does
    m.def(
        "_explorer_page",
        [](const std::vector<std::string>& run_dirs, const std::vector<std::string>& prompts) {
            Explorer explorer(run_dirs);
            return export_page(explorer, prompts);
        },
        py::arg("run_dirs"), py::arg("prompts"), py::call_guard<py::gil_scoped_release>(),
        "As `relgrad explore RUN_DIR... --export FILE --prompt TEXT...`: the page's HTML (relgrad.explore shows it)");
}

}  // namespace relgrad::python
