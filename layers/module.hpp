// relgrad: the Module base class of every layer, and parameter initialisation.
//
// A Module owns named parameters (leaf tensors that require a gradient) and child modules.
// named_parameters() lists them with PyTorch-style dotted names ("w_q.weight",
// "layers.0.attention.w_q.bias"), in registration order. A module registers its parameters and
// children by address, so modules are neither copied nor moved once built.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.hpp"

namespace relgrad {

// What every layer constructor needs to create its parameters. With shapes_only, the weights are
// shapes without memory (truncated_normal and xavier_uniform return one zero broadcast to the
// shape, stride 0): a model built so costs only its small vectors, and counts its parameters
// exactly before the real one is allocated (train/make_task.hpp's memory estimate).
struct Init {
    Generator& gen;
    DType dtype = DType::float32;
    bool shapes_only = false;
};

// N(0, std^2) redrawn outside +-2 std (as BERT and GPT-2 initialise embeddings)
Tensor truncated_normal(const Shape& shape, double std, const Init& init);
// Glorot/Xavier uniform for a [fan_out, fan_in] weight: U(-a, a), a = sqrt(6 / (fan_in + fan_out))
Tensor xavier_uniform(const Shape& shape, const Init& init);

class Module {
public:
    Module() = default;
    virtual ~Module() = default;
    Module(const Module&) = delete;
    Module& operator=(const Module&) = delete;

    std::vector<std::pair<std::string, Tensor>> named_parameters() const;
    std::vector<Tensor> parameters() const;
    int64_t parameter_count() const;  // number of scalar parameters

    void train(bool training = true);  // also sets every child
    // Restart every random stream (dropout masks) from `seed`, each child from its own seed
    // derived from it: a trainer that reseeds at every step draws the same masks after a resume.
    virtual void reseed(uint64_t seed);
    // Where every random stream of this module and its children stands, in a fixed order; setting
    // it back makes the next forward draw the same masks again (used by gradient checkpointing).
    std::vector<Generator> random_state();
    void set_random_state(const std::vector<Generator>& state);
    void eval() { train(false); }
    bool is_training() const { return training_; }
    void zero_grad();

    // Replace the parameters (in named_parameters() order) with the given tensors, which must
    // have the same shapes. Used by gradient checks, which feed perturbed copies.
    void assign_parameters(const std::vector<Tensor>& values);
    // Convert every parameter to `dtype` (new leaves that require a gradient).
    void to(DType dtype);
    // Move every parameter (the same leaf tensors, their values copied) to `device`;
    // the module's forward then computes there. Build the optimizer after moving (its state
    // stays where it was made).
    void to(Device device);
    Device device() const;  // where the parameters are (the CPU for a module without any)

    // State as a directory: one <name>.npy per parameter plus manifest.json, readable by NumPy
    // alone. save() replaces `dir` atomically: a crash leaves the old state or the new, whole.
    void save(const std::string& dir) const;
    // Loads values into the existing parameters; names and shapes must match exactly.
    void load(const std::string& dir);

protected:
    // Stores `value` in `slot` as a parameter; returns the slot.
    Tensor& register_parameter(const std::string& name, Tensor& slot, Tensor value);
    void register_module(const std::string& name, Module& child);
    // The module's own random streams (Dropout has one); children are visited by the caller.
    virtual void own_generators(std::vector<Generator*>&) {}

private:
    void collect_generators(std::vector<Generator*>& out);
    void collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor*>>& out) const;

    std::vector<std::pair<std::string, Tensor*>> parameters_;
    std::vector<std::pair<std::string, Module*>> children_;
    bool training_ = true;
};

// Mixed precision (docs/precision.md): while a ComputeIn lives, the module computes in `dtype`.
// Each float32 parameter is replaced by its cast to dtype (a recorded to(), so a backward run
// while it lives brings every gradient to the float32 parameter, the master copy, in float32),
// and the parameters are put back when it goes. For float32 it changes nothing.
class ComputeIn {
public:
    ComputeIn(Module& module, DType dtype);
    ~ComputeIn();
    ComputeIn(const ComputeIn&) = delete;
    ComputeIn& operator=(const ComputeIn&) = delete;

private:
    Module& module_;
    std::vector<Tensor> masters_;  // empty when nothing was cast
};

}  // namespace relgrad
