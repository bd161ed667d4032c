#include "engine/optim.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>

#include "engine/autograd.hpp"
#include "engine/errors.hpp"
#include "engine/npy.hpp"
#include "engine/ops.hpp"
#include "engine/profile.hpp"

namespace relgrad {

namespace {

// step.txt: the count of steps taken, in decimal, and a newline; anything else is corrupt.
int64_t read_step_count(const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    const std::string s = text.str();
    const std::size_t digits = s.find_first_not_of("0123456789");
    const bool well_formed =
        in && digits > 0 && digits != std::string::npos && digits <= 18 && s.substr(digits) == "\n";
    if (!well_formed) throw std::runtime_error(path + ": missing or not a step count");
    return std::stoll(s.substr(0, digits));
}

// groups.txt: a line "lr_scale weight_decay parameters" per group. There must be as many groups
// as in `groups`, with as many parameters each; their lr_scale and weight_decay are read into it.
void read_groups(const std::string& path, std::vector<ParameterGroup>& groups) {
    std::ifstream in(path);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    if (lines.size() != groups.size()) {
        throw std::runtime_error(path + ": " + std::to_string(lines.size()) + " parameter groups, the optimizer has " +
                                 std::to_string(groups.size()));
    }
    for (std::size_t g = 0; g < groups.size(); ++g) {
        std::istringstream fields(lines[g]);
        double lr_scale = 0, weight_decay = -1;
        std::size_t count = 0;
        std::string rest;
        const bool well_formed = static_cast<bool>(fields >> lr_scale >> weight_decay >> count) && !(fields >> rest) &&
                                 lr_scale > 0 && std::isfinite(lr_scale) && weight_decay >= 0 &&
                                 std::isfinite(weight_decay);
        if (!well_formed) {
            throw std::runtime_error(path + ":line " + std::to_string(g + 1) +
                                     ": expected \"lr_scale weight_decay parameters\" (a corrupt checkpoint)");
        }
        if (count != groups[g].parameters.size()) {
            throw std::runtime_error(path + ": group " + std::to_string(g) + " of the checkpoint has " +
                                     std::to_string(count) + " parameters, the optimizer's " +
                                     std::to_string(groups[g].parameters.size()));
        }
        groups[g].lr_scale = lr_scale;
        groups[g].weight_decay = weight_decay;
    }
}

// The sum over the parameters' gradients of term(gradient), a scalar each, added in float64 on the
// gradients' device and read once: one copy to the host per call, not one per parameter.
template <class Term>
double sum_over_gradients(const std::vector<Tensor>& parameters, Term term) {
    Tensor total;
    for (const Tensor& p : parameters) {
        if (!p.grad().defined()) continue;
        const Tensor value = term(p.grad()).to(DType::float64);
        total = total.defined() ? add(total, value.to(total.device())) : value;
    }
    return total.defined() ? total.item() : 0.0;
}

}  // namespace

AdamW::AdamW(std::vector<Tensor> parameters, const AdamWOptions& options)
    : AdamW(std::vector<ParameterGroup>{{std::move(parameters), 1.0, options.weight_decay}}, options) {}

AdamW::AdamW(std::vector<ParameterGroup> groups, const AdamWOptions& options)
    : groups_(std::move(groups)), options_(options) {
    RELGRAD_CHECK(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1 &&
                      options.eps > 0 && options.weight_decay >= 0,
                  "AdamW: needs 0 <= beta1, beta2 < 1, eps > 0 and weight_decay >= 0");
    std::map<const TensorImpl*, std::size_t> group_of;  // a parameter listed twice would be updated twice a step
    for (std::size_t g = 0; g < groups_.size(); ++g) {
        RELGRAD_CHECK(groups_[g].lr_scale > 0 && std::isfinite(groups_[g].lr_scale) && groups_[g].weight_decay >= 0 &&
                          std::isfinite(groups_[g].weight_decay),
                      "AdamW: group ", g, " needs a finite lr_scale > 0 and a finite weight_decay >= 0");
        for (const Tensor& p : groups_[g].parameters) {
            const auto [listed, first_time] = group_of.emplace(p.impl(), g);
            RELGRAD_CHECK(first_time, "AdamW: a parameter is ",
                          listed->second == g
                              ? "listed twice in group " + std::to_string(g)
                              : "in groups " + std::to_string(listed->second) + " and " + std::to_string(g));
            m_.push_back(zeros_like(p));
            v_.push_back(zeros_like(p));
        }
    }
}

void AdamW::step(double lr) {
    std::vector<double> group_lrs;
    for (const ParameterGroup& group : groups_) group_lrs.push_back(lr * group.lr_scale);
    step(group_lrs);
}

// The update in place, written with the engine's ops on detached tensors: the parameters are
// leaves, and nothing here is recorded.
void AdamW::step(const std::vector<double>& group_lrs) {
    RELGRAD_CHECK(group_lrs.size() == groups_.size(), "AdamW::step: ", group_lrs.size(), " learning rates for ",
                  groups_.size(), " parameter groups");
    const ProfileScope profiled("AdamW step", Phase::update);
    NoGradGuard no_grad;
    ++step_;
    const double b1 = options_.beta1, b2 = options_.beta2;
    const double m_correction = 1.0 / (1.0 - std::pow(b1, static_cast<double>(step_)));
    const double v_correction = 1.0 / (1.0 - std::pow(b2, static_cast<double>(step_)));
    std::size_t i = 0;  // the parameter's index among all groups' parameters
    for (std::size_t g = 0; g < groups_.size(); ++g) {
        const ParameterGroup& group = groups_[g];
        const double group_lr = group_lrs[g];
        for (const Tensor& parameter : group.parameters) {
            const std::size_t at = i++;
            Tensor p = parameter.detach();
            const Tensor g = parameter.grad();
            if (!g.defined()) continue;
            m_[at] = add(mul(m_[at], b1), mul(g, 1 - b1));
            v_[at] = add(mul(v_[at], b2), mul(mul(g, g), 1 - b2));
            const Tensor update = div(mul(m_[at], m_correction), add(sqrt(mul(v_[at], v_correction)), options_.eps));
            const Tensor next = sub(mul(p, 1 - group_lr * group.weight_decay), mul(update, group_lr));
            p.copy_(next);  // p = p (1 - lr wd) - lr m_hat / (sqrt(v_hat) + eps)
        }
    }
}

void AdamW::save(const std::string& dir) const {
    std::filesystem::create_directories(dir);
    for (std::size_t i = 0; i < m_.size(); ++i) {
        save_npy(m_[i], dir + "/m." + std::to_string(i) + ".npy");
        save_npy(v_[i], dir + "/v." + std::to_string(i) + ".npy");
    }
    std::ofstream step_file(dir + "/step.txt");
    step_file << step_ << "\n";
    step_file.close();
    std::ofstream groups_file(dir + "/groups.txt");
    groups_file.precision(17);  // doubles that read back exactly
    for (const ParameterGroup& group : groups_) {
        groups_file << group.lr_scale << " " << group.weight_decay << " " << group.parameters.size() << "\n";
    }
    groups_file.close();
    if (!step_file || !groups_file) throw std::runtime_error("AdamW::save: could not write " + dir);
}

void AdamW::load(const std::string& dir) {
    std::vector<ParameterGroup> groups = groups_;
    if (std::filesystem::exists(dir + "/groups.txt")) {
        read_groups(dir + "/groups.txt", groups);
    } else if (groups_.size() != 1) {  // written before groups: one group, whose moments would land elsewhere
        throw std::runtime_error(dir +
                                 "/groups.txt is missing: the state of an optimizer with one parameter group, "
                                 "this one has " +
                                 std::to_string(groups_.size()));
    }
    std::vector<Tensor> m, v;
    std::vector<Tensor> parameters;
    for (const ParameterGroup& group : groups_) {
        parameters.insert(parameters.end(), group.parameters.begin(), group.parameters.end());
    }
    for (std::size_t i = 0; i < parameters.size(); ++i) {
        const std::string v_path = dir + "/v." + std::to_string(i) + ".npy";
        m.push_back(load_saved_state(dir + "/m." + std::to_string(i) + ".npy"));
        v.push_back(load_saved_state(v_path));
        const std::vector<double> v_values = v.back().to_vector();
        if (std::any_of(v_values.begin(), v_values.end(), [](double x) { return x < 0; })) {
            throw std::runtime_error(v_path + ": a second moment is negative (a corrupt checkpoint)");
        }
        if (m.back().shape() != parameters[i].shape() || v.back().shape() != parameters[i].shape()) {
            throw std::runtime_error(dir + ": optimizer state " + std::to_string(i) + " has shape " +
                                     shape_str(m.back().shape()) + ", the parameter " +
                                     shape_str(parameters[i].shape()));
        }
        m.back() = m.back().to(parameters[i].dtype()).to(parameters[i].device());
        v.back() = v.back().to(parameters[i].dtype()).to(parameters[i].device());
    }
    const int64_t step = read_step_count(dir + "/step.txt");
    m_ = std::move(m);
    v_ = std::move(v);
    step_ = step;
    groups_ = std::move(groups);
}

Schedule parse_schedule(const std::string& name) { return parse_named(schedule_names, name, "schedule"); }

double learning_rate(Schedule schedule, double peak, int64_t step, int64_t warmup_steps, int64_t total_steps) {
    if (step < warmup_steps) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
    if (schedule == Schedule::constant || total_steps <= warmup_steps) return peak;
    const double progress =
        std::min(1.0, static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps));
    if (schedule == Schedule::linear) return peak * (1.0 - progress);
    return peak * 0.5 * (1.0 + std::cos(M_PI * progress));
}

double clip_grad_norm(const std::vector<Tensor>& parameters, double max_norm) {
    RELGRAD_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be positive");
    const ProfileScope profiled("clip_grad_norm", Phase::update);
    NoGradGuard no_grad;
    const double norm = std::sqrt(sum_over_gradients(parameters, [](const Tensor& g) { return sum(mul(g, g)); }));
    if (std::isfinite(norm) && norm > max_norm) {  // an infinite norm is the caller's to report, not to scale by 0
        const double scale = max_norm / norm;
        for (const Tensor& p : parameters) {
            if (!p.grad().defined()) continue;
            Tensor g = p.grad();
            g.copy_(mul(g, scale));
        }
    }
    return norm;
}

LossScaler::LossScaler(const LossScalerOptions& options) : options_(options), scale_(options.initial_scale) {
    RELGRAD_CHECK(options.initial_scale > 0 && std::isfinite(options.initial_scale) && options.growth_factor > 1 &&
                      options.backoff_factor > 0 && options.backoff_factor < 1 && options.growth_interval > 0,
                  "LossScaler: needs a finite initial_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and "
                  "growth_interval > 0");
}

bool LossScaler::unscale(const std::vector<Tensor>& parameters) {
    const ProfileScope profiled("unscale gradients", Phase::update);
    NoGradGuard no_grad;
    // 0 g is 0 for every finite g, NaN for inf and NaN: one sum of them all tells
    const bool finite = !std::isnan(sum_over_gradients(parameters, [](const Tensor& g) { return sum(mul(g, 0.0)); }));
    if (!finite) {
        scale_ *= options_.backoff_factor;
        clean_steps_ = 0;
        ++skipped_steps_;
        return false;
    }
    for (const Tensor& p : parameters) {
        if (!p.grad().defined()) continue;
        Tensor g = p.grad();
        g.copy_(mul(g, 1.0 / scale_));
    }
    if (++clean_steps_ == options_.growth_interval) {
        scale_ *= options_.growth_factor;
        clean_steps_ = 0;
    }
    return true;
}

void LossScaler::restore(double scale, int64_t clean_steps, int64_t skipped_steps) {
    // Halving and doubling the initial scale reach only initial * 2^n, and only normal doubles (a
    // scale that small would have made every gradient inf long before): 5e-324 or 3 * 2^10 is no
    // scale a run can have left.
    int exponent = 0;
    const bool by_halving_and_doubling = options_.growth_factor != 2 || options_.backoff_factor != 0.5 ||
                                         std::frexp(scale / options_.initial_scale, &exponent) == 0.5;
    RELGRAD_CHECK(std::isfinite(scale) && scale >= std::numeric_limits<double>::min() && by_halving_and_doubling,
                  "scale ", scale, " is no scale a run reaches: halving and doubling ", options_.initial_scale,
                  " give only powers of two, each a normal double");
    RELGRAD_CHECK(clean_steps >= 0 && clean_steps < options_.growth_interval, "clean_steps ", clean_steps,
                  ": expected a count in [0, ", options_.growth_interval, ") (the scale grows at ",
                  options_.growth_interval, ")");
    RELGRAD_CHECK(skipped_steps >= 0, "skipped_steps ", skipped_steps, ": expected a count >= 0");
    scale_ = scale;
    clean_steps_ = clean_steps;
    skipped_steps_ = skipped_steps;
}

}  // namespace relgrad
