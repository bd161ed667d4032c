// relgrad: AdamW, its learning-rate schedule, and gradient clipping.
//
// AdamW (Loshchilov & Hutter 2019), for each parameter p with gradient g at step t = 1, 2, ...:
//     m = beta1 m + (1 - beta1) g              v = beta2 v + (1 - beta2) g^2
//     m_hat = m / (1 - beta1^t)                v_hat = v / (1 - beta2^t)
//     p = p - lr (m_hat / (sqrt(v_hat) + eps) + weight_decay p)
// The weight decay is decoupled: it shrinks p directly instead of being added to g.
#pragma once

#include <string>
#include <vector>

#include "engine/tensor.hpp"

namespace relgrad {

struct AdamWOptions {
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.01;
};

class AdamW {
public:
    AdamW(std::vector<Tensor> parameters, const AdamWOptions& options);
    // One update with learning rate lr; parameters without a gradient are left alone.
    void step(double lr);
    int64_t steps() const { return step_; }
    // The moments, as .npy files in `dir` (m.<i>.npy, v.<i>.npy) plus the step count; load checks
    // that the shapes match the parameters.
    void save(const std::string& dir) const;
    void load(const std::string& dir);

private:
    std::vector<Tensor> parameters_, m_, v_;
    AdamWOptions options_;
    int64_t step_ = 0;
};

enum class Schedule { constant, linear, cosine };
inline constexpr EnumName<Schedule> schedule_names[] = {
    {Schedule::constant, "constant"}, {Schedule::linear, "linear"}, {Schedule::cosine, "cosine"}};
Schedule parse_schedule(const std::string& name);  // "constant" | "linear" | "cosine"

// Linear warmup from 0 to peak over warmup_steps, then constant, or decaying linearly or along a
// cosine to 0 at total_steps. step counts from 0.
double learning_rate(Schedule schedule, double peak, int64_t step, int64_t warmup_steps, int64_t total_steps);

// Scales all gradients by min(1, max_norm / ||g||) with ||g|| the norm of all of them together;
// returns ||g|| before clipping. A NaN or infinite norm is returned and nothing is scaled.
double clip_grad_norm(const std::vector<Tensor>& parameters, double max_norm);

}  // namespace relgrad
