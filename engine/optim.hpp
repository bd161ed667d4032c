// relgrad: AdamW, its learning-rate schedule, gradient clipping and float16's loss scaling.
//
// AdamW (Loshchilov & Hutter 2019), for each parameter p with gradient g at step t = 1, 2, ...:
//     m = beta1 m + (1 - beta1) g              v = beta2 v + (1 - beta2) g^2
//     m_hat = m / (1 - beta1^t)                v_hat = v / (1 - beta2^t)
//     p = p - lr (m_hat / (sqrt(v_hat) + eps) + weight_decay p)
// The weight decay is decoupled: it shrinks p directly instead of being added to g.
//
// Parameter groups (PyTorch's convention): each group steps with its own learning rate, lr_scale
// times the step's lr, and its own weight decay; a common use is no decay on biases and norms.
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

struct ParameterGroup {
    std::vector<Tensor> parameters;
    double lr_scale = 1.0;  // the group's learning rate is lr_scale times the step's
    double weight_decay = 0.0;
};

class AdamW {
public:
    // One group: every parameter at the step's lr and options.weight_decay.
    AdamW(std::vector<Tensor> parameters, const AdamWOptions& options);
    // Groups of their own (options.weight_decay is not used).
    AdamW(std::vector<ParameterGroup> groups, const AdamWOptions& options);
    // One update with learning rate lr, each group at lr times its lr_scale; parameters without a
    // gradient are left alone.
    void step(double lr);
    // One update with each group at a learning rate of its own, group_lrs[g] for groups()[g]
    // (Python's param_groups, whose "lr" a scheduler sets); the groups' lr_scale is not used.
    void step(const std::vector<double>& group_lrs);
    int64_t steps() const { return step_; }
    const std::vector<ParameterGroup>& groups() const { return groups_; }
    // The moments, as .npy files in `dir` (m.<i>.npy, v.<i>.npy, i counting the parameters group
    // by group), the step count and the groups (groups.txt: a line "lr_scale weight_decay
    // parameters" each). load checks that the shapes and the groups' sizes match, and restores
    // the groups' lr_scale and weight_decay.
    void save(const std::string& dir) const;
    void load(const std::string& dir);

private:
    std::vector<ParameterGroup> groups_;
    std::vector<Tensor> m_, v_;  // one per parameter, group by group
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

// Dynamic loss scaling for float16 training, with PyTorch's GradScaler semantics. float16's
// smallest value is 6e-8, and many gradients are smaller: they would become 0. So the loss is
// multiplied by scale() before the backward, which multiplies every gradient by the same factor,
// and unscale() divides them again before the step. A scale too large overflows a gradient to
// inf: that step is skipped and the scale halved; after growth_interval clean steps in a row it
// doubles, to find the largest scale that does not overflow. (bfloat16 has float32's range and
// needs none of this.)
struct LossScalerOptions {
    double initial_scale = 65536;  // 2^16
    double growth_factor = 2;
    double backoff_factor = 0.5;
    int64_t growth_interval = 2000;
};

class LossScaler {
public:
    explicit LossScaler(const LossScalerOptions& options = {});
    double scale() const { return scale_; }
    // After the backward of loss * scale(): when every gradient is finite, divides each by the
    // scale and returns true; when one holds an inf or a NaN, returns false (skip this step: the
    // gradients are left as they are). Then updates the scale as described above.
    bool unscale(const std::vector<Tensor>& parameters);
    int64_t clean_steps() const { return clean_steps_; }      // since the scale last changed
    int64_t skipped_steps() const { return skipped_steps_; }  // in all
    // Where a checkpoint left it: a scale that halving and doubling reach, 0 <= clean_steps <
    // growth_interval, skipped_steps >= 0; std::invalid_argument naming the field else.
    void restore(double scale, int64_t clean_steps, int64_t skipped_steps);

private:
    LossScalerOptions options_;
    double scale_;
    int64_t clean_steps_ = 0, skipped_steps_ = 0;
};

}  // namespace relgrad
