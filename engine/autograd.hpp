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

struct Node {
    std::string op_name;
    std::vector<Tensor> inputs;
    BackwardFn backward;
    bool released = false;  // set when backward ran without retain_graph

    void release() {
        inputs.clear();
        backward = nullptr;
        released = true;
    }
};

// Recording switch. While a NoGradGuard lives, ops build no graph (used by backward itself, by
// optimizers and by gradcheck's numeric evaluations).
bool grad_mode_enabled();
class NoGradGuard {
public:
    NoGradGuard();
    ~NoGradGuard();
    NoGradGuard(const NoGradGuard&) = delete;
    NoGradGuard& operator=(const NoGradGuard&) = delete;

private:
    bool previous_;
};

// Called by every op: when recording is on and an input requires a gradient, attach a Node to
// `output` and return it. The backward closure must not capture `output` itself (that would be a
// reference cycle); capture output.detach() instead.
Tensor record(Tensor output, std::string op_name, std::vector<Tensor> inputs, BackwardFn backward);

// The reverse-mode pass; Tensor::backward calls this.
void run_backward(const Tensor& root, const Tensor& gradient, bool retain_graph);

}  // namespace relgrad
