// relgrad: the autograd graph.
//
// Every differentiable op builds its output and, when some input requires a gradient, attaches a
// Node to it: the op's name, its inputs, and a backward function that maps the gradient of the
// output (dL/dy) to the gradients of the inputs (dL/dx_i), each of the input's exact shape.
//
// backward() collects the nodes reachable from the root in a topological order (built with an
// explicit stack, so a graph thousands of ops deep cannot overflow the call stack), then walks it
// from the root down, summing (+=) the contributions a tensor receives from every use. Leaves keep
// their sum in .grad(); the nodes are released afterwards unless retain_graph is set.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/tensor.hpp"

namespace relgrad {

// Maps dL/dy to {dL/dx_0, dL/dx_1, ...}; an undefined Tensor means "no gradient for this input".
using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output)>;

// A tensor whose values a backward reads, by its name in the op ("x", "y" for the output, "cond"),
// as an op hands it to record().
struct Save {
    const char* name;
    Tensor tensor;
};

// What the node keeps of a Save: the storage's version when the op recorded it (Storage::version:
// relgrad's in-place writes count) and, for memory NumPy can write too, a fingerprint of the
// values. Before the node's backward runs, run_backward checks that both are unchanged: a tensor
// written in place in between would give a gradient of other values than the forward's, without
// a word. While a node keeps it, Tensor.numpy() hands out read-only views of that memory.
struct SavedTensor {
    std::string name;
    Tensor tensor;
    uint64_t version = 0;
    uint64_t fingerprint = 0;    // where the memory is NumPy's to write too; else 0
    std::shared_ptr<void> hold;  // counts the save in Storage::saved_by_graphs while it lives
};
SavedTensor save_for_backward(const Save& save);
// throws std::runtime_error naming the op and the tensor when the memory changed since
void check_unchanged(const SavedTensor& saved, const std::string& op_name);

struct Node {
    std::string op_name;
    std::vector<Tensor> inputs;
    BackwardFn backward;
    std::vector<SavedTensor> saved;  // what backward reads, checked before it runs
    // what the op produced, which is what backward's argument must be like
    Shape output_shape;
    DType output_dtype = DType::float32;
    Device output_device = Device::cpu;
    bool released = false;  // set when backward ran without retain_graph

    Node() = default;
    Node(const Node&) = delete;
    Node& operator=(const Node&) = delete;
    // Frees the graph behind this node without recursion: a chain of a million ops dropped
    // without a backward would otherwise free node by node on the call stack.
    ~Node();

    void release() {
        inputs.clear();
        backward = nullptr;
        saved.clear();
        released = true;
    }
};

// Recording switch, set for a scope and restored after it. While a NoGradGuard lives, ops build no
// graph (used by backward itself, by optimizers and by gradcheck's numeric evaluations); an
// EnableGradGuard is the opposite, for code that must record inside a backward pass (checkpoint
// below).
bool grad_mode_enabled();
class GradModeGuard {
public:
    explicit GradModeGuard(bool enabled);
    ~GradModeGuard();
    GradModeGuard(const GradModeGuard&) = delete;
    GradModeGuard& operator=(const GradModeGuard&) = delete;

private:
    bool previous_;
};
struct NoGradGuard : GradModeGuard {
    NoGradGuard() : GradModeGuard(false) {}
};
struct EnableGradGuard : GradModeGuard {
    EnableGradGuard() : GradModeGuard(true) {}
};

// Called by every op: when recording is on and an input requires a gradient, attach a Node to
// `output` and return it. The backward closure must not capture `output` itself (that would be a
// reference cycle); capture output.detach() instead. `saved` names every tensor whose values the
// closure reads, written beside its captures (a backward that needs only shapes saves none).
Tensor record(Tensor output, std::string op_name, std::vector<Tensor> inputs, const std::vector<Save>& saved,
              BackwardFn backward);
inline Tensor record(Tensor output, std::string op_name, std::vector<Tensor> inputs, BackwardFn backward) {
    return record(std::move(output), std::move(op_name), std::move(inputs), {}, std::move(backward));
}

// The tensors reachable from root through inputs that require a gradient, each listed after all
// the tensors it depends on (root last). backward() walks this list from the end, so every use
// of a tensor has added its share to the tensor's gradient before that gradient is passed on.
std::vector<Tensor> topological_order(const Tensor& root);

// The reverse-mode pass; Tensor::backward calls this.
void run_backward(const Tensor& root, const Tensor& gradient, bool retain_graph);

// Gradient checkpointing: trades compute for memory. The forward runs fn(inputs) without
// recording, so none of fn's intermediates stay alive; the backward runs fn again on the same
// inputs, this time recording, and runs a backward pass through that fresh graph. `parameters`
// are the tensors fn reads besides its inputs (a module's weights): the inner pass accumulates
// their gradients itself. before_recompute runs just before the second call (to restore dropout's
// random state), so that the second call computes exactly what the first did and the gradients
// are those of the plain forward.
using CheckpointFn = std::function<Tensor(const std::vector<Tensor>& inputs)>;
Tensor checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs, const std::vector<Tensor>& parameters,
                  const std::function<void()>& before_recompute = {});

}  // namespace relgrad
