#include "engine/optim.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "engine/autograd.hpp"
#include "engine/npy.hpp"
#include "engine/ops.hpp"

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

}  // namespace

AdamW::AdamW(std::vector<Tensor> parameters, const AdamWOptions& options)
    : parameters_(std::move(parameters)), options_(options) {
    if (!(options.beta1 >= 0 && options.beta1 < 1) || !(options.beta2 >= 0 && options.beta2 < 1) ||
        !(options.eps > 0) || !(options.weight_decay >= 0)) {
        throw std::invalid_argument("AdamW: needs 0 <= beta1, beta2 < 1, eps > 0 and weight_decay >= 0");
    }
    for (const Tensor& p : parameters_) {
        m_.push_back(zeros_like(p));
        v_.push_back(zeros_like(p));
    }
}

// The update in place, written with the engine's ops on detached tensors: the parameters are
// leaves, and nothing here is recorded.
void AdamW::step(double lr) {
    NoGradGuard no_grad;
    ++step_;
    const double b1 = options_.beta1, b2 = options_.beta2;
    const double m_correction = 1.0 / (1.0 - std::pow(b1, static_cast<double>(step_)));
    const double v_correction = 1.0 / (1.0 - std::pow(b2, static_cast<double>(step_)));
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
        Tensor p = parameters_[i].detach();
        const Tensor g = parameters_[i].grad();
        if (!g.defined()) continue;
        m_[i] = add(mul(m_[i], b1), mul(g, 1 - b1));
        v_[i] = add(mul(v_[i], b2), mul(mul(g, g), 1 - b2));
        const Tensor update = div(mul(m_[i], m_correction), add(sqrt(mul(v_[i], v_correction)), options_.eps));
        const Tensor next = sub(mul(p, 1 - lr * options_.weight_decay), mul(update, lr));
        p.copy_(next);  // p = p (1 - lr wd) - lr m_hat / (sqrt(v_hat) + eps)
    }
}

void AdamW::save(const std::string& dir) const {
    std::filesystem::create_directories(dir);
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
        save_npy(m_[i], dir + "/m." + std::to_string(i) + ".npy");
        save_npy(v_[i], dir + "/v." + std::to_string(i) + ".npy");
    }
    std::ofstream step_file(dir + "/step.txt");
    step_file << step_ << "\n";
    step_file.close();
    if (!step_file) throw std::runtime_error("AdamW::save: could not write " + dir + "/step.txt");
}

void AdamW::load(const std::string& dir) {
    std::vector<Tensor> m, v;
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
        const std::string v_path = dir + "/v." + std::to_string(i) + ".npy";
        m.push_back(load_saved_state(dir + "/m." + std::to_string(i) + ".npy"));
        v.push_back(load_saved_state(v_path));
        const std::vector<double> v_values = v.back().to_vector();
        if (std::any_of(v_values.begin(), v_values.end(), [](double x) { return x < 0; })) {
            throw std::runtime_error(v_path + ": a second moment is negative (a corrupt checkpoint)");
        }
        if (m.back().shape() != parameters_[i].shape() || v.back().shape() != parameters_[i].shape()) {
            throw std::runtime_error(dir + ": optimizer state " + std::to_string(i) + " has shape " +
                                     shape_str(m.back().shape()) + ", the parameter " +
                                     shape_str(parameters_[i].shape()));
        }
        m.back() = m.back().to(parameters_[i].dtype()).to(parameters_[i].device());
        v.back() = v.back().to(parameters_[i].dtype()).to(parameters_[i].device());
    }
    const int64_t step = read_step_count(dir + "/step.txt");
    m_ = std::move(m);
    v_ = std::move(v);
    step_ = step;
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
    if (!(max_norm > 0)) throw std::invalid_argument("clip_grad_norm: max_norm must be positive");
    NoGradGuard no_grad;
    double total = 0;
    for (const Tensor& p : parameters) {
        if (p.grad().defined()) total += sum(mul(p.grad(), p.grad())).to(DType::float64).item();
    }
    const double norm = std::sqrt(total);
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

}  // namespace relgrad
