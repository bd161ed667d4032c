// relgrad's Python module: the optimizer and its learning-rate schedules (AdamW and LRScheduler,
// engine/optim.hpp, in the shape of torch.optim's) and gradient clipping.
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/stl.h>

#include "engine/errors.hpp"
#include "engine/optim.hpp"
#include "python/bindings.hpp"

namespace relgrad::python {

namespace {

// A list (or other iterable) of tensors is wanted; one tensor alone is refused, as PyTorch refuses
// it: taken as a sequence, it would give its rows, views that never get a gradient.
void require_list(const py::handle& items, const std::string& what) {
    if (py::isinstance<Tensor>(items) || !py::isinstance<py::iterable>(items)) {
        throw py::type_error(what + " must be a list of tensors, got " + std::string(py::str(py::type::of(items))));
    }
}

std::vector<Tensor> tensor_list(const py::handle& items, const std::string& what) {
    require_list(items, what);
    std::vector<Tensor> tensors;
    for (const py::handle item : items) {
        if (!py::isinstance<Tensor>(item)) {
            throw py::type_error(what + " must be a list of tensors, got an item of " +
                                 std::string(py::str(py::type::of(item))));
        }
        tensors.push_back(item.cast<Tensor>());
    }
    return tensors;
}

// A learning rate or a weight decay from Python: a finite number >= 0. What is no number is a
// TypeError, a negative, NaN or infinite number a ValueError; both name `what`.
double finite_non_negative(const py::handle& value, const std::string& what) {
    if (!PyNumber_Check(value.ptr())) {
        throw py::type_error(what + " must be a number, got " + std::string(py::str(py::type::of(value))));
    }
    const double number = py::float_(py::reinterpret_borrow<py::object>(value));
    RELGRAD_CHECK(number >= 0 && std::isfinite(number), what, " must be a finite number >= 0, got ",
                  py::repr(py::float_(number)).cast<std::string>());
    return number;
}

// AdamW's parameters, as PyTorch takes them: a list of tensors (one group), or a list of groups
// {"params": [...], "lr": 0.01, "weight_decay": 0}, whose lr and weight_decay default to the
// constructor's. They come back as param_groups: a dict per group with these three keys.
py::list parameter_groups(const py::handle& parameters, double lr, double weight_decay) {
    require_list(parameters, "AdamW: parameters");
    const py::list items(py::reinterpret_borrow<py::object>(parameters));  // from a generator too
    const auto group_of = [lr, weight_decay](const std::vector<Tensor>& params) {
        py::dict group;
        group["params"] = params;
        group["lr"] = lr;
        group["weight_decay"] = weight_decay;
        return group;
    };
    py::list groups;
    if (items.empty() || !py::isinstance<py::dict>(items[0])) {
        groups.append(group_of(tensor_list(items, "AdamW: parameters")));
        return groups;
    }
    for (const py::handle item : items) {
        const std::string name = "AdamW: group " + std::to_string(groups.size());
        if (!py::isinstance<py::dict>(item)) throw py::type_error(name + " is not a dict");
        py::dict group = group_of({});
        bool has_params = false;
        for (const auto& [key_handle, value] : item.cast<py::dict>()) {
            const std::string key = py::str(key_handle);
            RELGRAD_CHECK(key == "params" || key == "lr" || key == "weight_decay", name, " has an unknown key '", key,
                          "' (params, lr, weight_decay)");
            if (key == "params") {
                // one tensor alone is a group of one here, as in PyTorch
                group["params"] = py::isinstance<Tensor>(value) ? std::vector<Tensor>{value.cast<Tensor>()}
                                                                : tensor_list(value, name + "'s params");
                has_params = true;
            } else {
                group[key.c_str()] = finite_non_negative(value, name + "'s " + key);
            }
        }
        RELGRAD_CHECK(has_params, name, " has no 'params'");
        groups.append(group);
    }
    return groups;
}

// The C++ AdamW's groups: each group's learning rate is given at every step, so lr_scale is 1.
std::vector<ParameterGroup> engine_groups(const py::list& groups) {
    std::vector<ParameterGroup> built;
    for (const py::handle group : groups) {
        built.push_back({group["params"].cast<std::vector<Tensor>>(), 1.0, group["weight_decay"].cast<double>()});
    }
    return built;
}

// relgrad.AdamW in PyTorch's shape: the C++ AdamW, and its groups as param_groups, from which
// step() reads each group's "lr" (a scheduler or the user may change it between steps). A group's
// params and weight_decay are fixed when the optimizer is built: the C++ AdamW holds them, and
// each parameter's moments.
struct PythonAdamW {
    PythonAdamW(py::list groups, const AdamWOptions& options)
        : param_groups(std::move(groups)), adamw(engine_groups(param_groups), options) {}

    py::list param_groups;
    AdamW adamw;
};

bool same_tensors(const py::handle& params, const std::vector<Tensor>& tensors) {
    if (!py::isinstance<py::list>(params) || py::len(params) != tensors.size()) return false;
    std::size_t i = 0;
    for (const py::handle p : params) {
        if (!py::isinstance<Tensor>(p) || p.cast<const Tensor&>().impl() != tensors[i++].impl()) return false;
    }
    return true;
}

// A step's learning rates: each group's "lr" in param_groups. Groups added or taken away, or a
// group whose params or weight_decay changed, are refused, not ignored.
std::vector<double> step_learning_rates(const PythonAdamW& optimizer) {
    const std::vector<ParameterGroup>& groups = optimizer.adamw.groups();
    RELGRAD_CHECK(py::len(optimizer.param_groups) == groups.size(), "AdamW.step: param_groups has ",
                  py::len(optimizer.param_groups), " groups, the optimizer was built with ", groups.size());
    std::vector<double> lrs;
    for (std::size_t g = 0; g < groups.size(); ++g) {
        const std::string at = "AdamW.step: param_groups[" + std::to_string(g) + "]";
        const py::object group = optimizer.param_groups[g];
        RELGRAD_CHECK(same_tensors(group["params"], groups[g].parameters) &&
                          finite_non_negative(group["weight_decay"], at + "['weight_decay']") == groups[g].weight_decay,
                      at, ": its params and weight_decay are fixed when AdamW is built (its lr may change)");
        lrs.push_back(finite_non_negative(group["lr"], at + "['lr']"));
    }
    return lrs;
}

// relgrad.LRScheduler: the config's learning-rate schedules (engine/optim.hpp's learning_rate: a
// linear warmup, then constant, or decaying linearly or along a cosine to 0 at total_steps) in the
// shape of PyTorch's schedulers. Built, it sets each group's lr for step 0; each step(), after the
// optimizer's, sets the next step's. A group's lr at step t is learning_rate(schedule, base_lr, t,
// warmup_steps, total_steps), base_lr the group's lr when the scheduler was built (kept as its
// "initial_lr", as PyTorch keeps it): the trainer's formula with base_lr as the peak.
struct LRScheduler {
    py::object optimizer;  // its param_groups are read and written
    Schedule schedule;
    int64_t warmup_steps, total_steps;
    std::vector<double> base_lrs, last_lrs;
    int64_t last_epoch = 0;  // the step whose learning rates were set last (PyTorch's name)

    // Each group's lr for `step`.
    void set_learning_rates(int64_t step) {
        const py::list groups = optimizer.attr("param_groups");
        RELGRAD_CHECK(py::len(groups) == base_lrs.size(), "LRScheduler: the optimizer has ", py::len(groups),
                      " parameter groups, ", base_lrs.size(), " when the scheduler was built");
        last_lrs.clear();
        for (std::size_t g = 0; g < base_lrs.size(); ++g) {
            last_lrs.push_back(learning_rate(schedule, base_lrs[g], step, warmup_steps, total_steps));
            groups[g]["lr"] = last_lrs.back();
        }
        last_epoch = step;
    }
};

std::unique_ptr<LRScheduler> make_scheduler(const py::object& optimizer, const std::string& name, int64_t warmup_steps,
                                            const std::optional<int64_t>& total_steps) {
    const Schedule schedule = parse_schedule(name);
    RELGRAD_CHECK(warmup_steps >= 0, "LRScheduler: warmup_steps must be >= 0, got ", warmup_steps);
    RELGRAD_CHECK(!total_steps || *total_steps >= 1, "LRScheduler: total_steps must be >= 1, got ", *total_steps);
    RELGRAD_CHECK(schedule == Schedule::constant || total_steps, "LRScheduler: the ", name,
                  " schedule needs total_steps, the step where it reaches 0");
    auto scheduler = std::make_unique<LRScheduler>(
        LRScheduler{optimizer, schedule, warmup_steps, total_steps.value_or(0), {}, {}, 0});
    const py::list groups = optimizer.attr("param_groups");
    for (std::size_t g = 0; g < py::len(groups); ++g) {
        py::object group = groups[g];
        if (!group.contains("initial_lr")) group["initial_lr"] = group["lr"];
        scheduler->base_lrs.push_back(finite_non_negative(
            group["initial_lr"], "LRScheduler: param_groups[" + std::to_string(g) + "]['initial_lr']"));
    }
    scheduler->set_learning_rates(0);
    return scheduler;
}

}  // namespace

void bind_optim(py::module_& m) {
    // optimization
    py::class_<PythonAdamW>(m, "AdamW", "AdamW with decoupled weight decay (engine/optim.hpp), as torch.optim.AdamW")
        .def(py::init([](const py::object& params, const py::object& lr, const std::pair<double, double>& betas,
                         double eps, const py::object& weight_decay) {
                 const double default_lr = finite_non_negative(lr, "AdamW: lr");
                 const double default_decay = finite_non_negative(weight_decay, "AdamW: weight_decay");
                 return std::make_unique<PythonAdamW>(parameter_groups(params, default_lr, default_decay),
                                                      AdamWOptions{betas.first, betas.second, eps, default_decay});
             }),
             py::arg("params"), py::arg("lr") = 1e-3, py::arg("betas") = std::make_pair(0.9, 0.999),
             py::arg("eps") = 1e-8, py::arg("weight_decay") = 0.01,
             "params: a list of tensors, or of groups {'params': [...], 'lr': x, 'weight_decay': y}, which take "
             "lr and weight_decay from the keywords when they leave them out")
        .def_readonly("param_groups", &PythonAdamW::param_groups,
                      "The groups as dicts (params, lr, weight_decay); step() reads each group's lr, which may "
                      "change between steps")
        .def(
            "step",
            [](PythonAdamW& optimizer) {
                const std::vector<double> lrs = step_learning_rates(optimizer);
                py::gil_scoped_release release;
                optimizer.adamw.step(lrs);
            },
            "One update, each group at the lr its param_groups entry holds now")
        .def_property_readonly(
            "steps", [](const PythonAdamW& optimizer) { return optimizer.adamw.steps(); }, "The updates made");
    py::class_<LRScheduler> scheduler(m, "LRScheduler",
                                      "The config's learning-rate schedules (training.schedule, warmup_steps) for an "
                                      "optimizer's param_groups, in the shape of torch.optim.lr_scheduler");
    scheduler
        .def(py::init(&make_scheduler), py::arg("optimizer"), py::arg("schedule") = "cosine",
             py::arg("warmup_steps") = 0, py::arg("total_steps") = py::none(),
             "schedule: one of LRScheduler.schedules; total_steps: where linear and cosine reach 0. Sets each "
             "group's lr for step 0 (and its initial_lr, the base of its schedule, when it has none)")
        .def(
            "step", [](LRScheduler& s) { s.set_learning_rates(s.last_epoch + 1); },
            "Sets each group's lr for the next step; call it after the optimizer's step()")
        .def(
            "get_last_lr", [](const LRScheduler& s) { return s.last_lrs; }, "The lr of each group, as last set")
        .def_readonly("base_lrs", &LRScheduler::base_lrs)
        .def_readonly("last_epoch", &LRScheduler::last_epoch, "The step whose learning rates were set last");
    scheduler.attr("schedules") = py::tuple(py::cast(names_of(schedule_names)));
    m.def(
        "clip_grad_norm",
        [](const py::object& parameters, double max_norm) {
            // one tensor alone is a list of one, as in PyTorch's clip_grad_norm_ (taken as a sequence
            // it would give its rows, whose gradients are not the tensor's)
            return clip_grad_norm(py::isinstance<Tensor>(parameters)
                                      ? std::vector<Tensor>{parameters.cast<Tensor>()}
                                      : tensor_list(parameters, "clip_grad_norm: parameters"),
                                  max_norm);
        },
        py::arg("parameters"), py::arg("max_norm"));
}

}  // namespace relgrad::python
