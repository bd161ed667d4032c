#include "engine/autograd.hpp"

#include <algorithm>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "engine/errors.hpp"
#include "engine/ops.hpp"
#include "engine/profile.hpp"
#include "engine/system.hpp"

namespace relgrad {

static thread_local bool grad_mode = true;

bool grad_mode_enabled() { return grad_mode; }
GradModeGuard::GradModeGuard(bool enabled) : previous_(grad_mode) { grad_mode = enabled; }
GradModeGuard::~GradModeGuard() { grad_mode = previous_; }

// Each input that only this node still holds, and whose own node only it holds, would free that
// node inside this destructor, and so on down the chain. Those nodes are taken out first and freed
// one by one from a list instead, each with its inputs already taken.
Node::~Node() {
    std::vector<std::shared_ptr<Node>> orphans;
    auto take_orphans = [&orphans](std::vector<Tensor>& inputs) {
        std::vector<Tensor> taken = std::move(inputs);
        inputs.clear();
        // a tensor used twice by one node (add(y, y)) is held twice: keep one handle of it
        auto by_impl = [](const Tensor& a, const Tensor& b) { return a.impl() < b.impl(); };
        std::sort(taken.begin(), taken.end(), by_impl);
        taken.erase(std::unique(taken.begin(), taken.end(),
                                [](const Tensor& a, const Tensor& b) { return a.impl() == b.impl(); }),
                    taken.end());
        for (Tensor& t : taken) {
            if (!t.defined() || t.impl_ptr().use_count() != 1) continue;
            std::shared_ptr<Node>& node = t.impl()->grad_fn;
            if (node && node.use_count() == 1) orphans.push_back(std::move(node));
        }
    };
    take_orphans(inputs);
    while (!orphans.empty()) {
        std::shared_ptr<Node> node = std::move(orphans.back());
        orphans.pop_back();
        take_orphans(node->inputs);
    }  // each node is freed here with no inputs left: no recursion
}

// The fingerprint of the tensor's values, packed: two of them differ where NumPy wrote the memory
static uint64_t fingerprint_of(const Tensor& t) {
    const Tensor packed = t.contiguous();
    const auto* first = static_cast<const unsigned char*>(packed.storage()->data()) +
                        packed.offset() * static_cast<int64_t>(dtype_size(packed.dtype()));
    return fingerprint(first, packed.numel() * dtype_size(packed.dtype()));
}

SavedTensor save_for_backward(const Save& save) {
    const std::shared_ptr<Storage>& storage = save.tensor.storage();
    SavedTensor saved;
    saved.name = save.name;
    saved.tensor = save.tensor.detach();
    saved.version = storage->version();
    if (storage->numpy_can_write()) saved.fingerprint = fingerprint_of(saved.tensor);
    ++storage->saved_by_graphs;
    saved.hold = std::shared_ptr<void>(nullptr, [storage](void*) { --storage->saved_by_graphs; });
    return saved;
}

void check_unchanged(const SavedTensor& saved, const std::string& op_name) {
    const Storage& storage = *saved.tensor.storage();
    const bool written = storage.version() != saved.version;
    // a fingerprint was taken where NumPy could write the memory when the op saved it (while a graph
    // keeps memory, numpy() hands out no writable view of it)
    const bool fingerprinted = saved.fingerprint != 0;
    if (!written && !(fingerprinted && fingerprint_of(saved.tensor) != saved.fingerprint)) return;
    throw std::runtime_error(
        "backward of " + op_name + ": " + saved.name + " (" + shape_str(saved.tensor.shape()) + ", " +
        dtype_name(saved.tensor.dtype()) + "), which " + op_name + " saved for its gradient, was changed in place " +
        (written ? "(copy_, an optimizer step or a load)" : "through a NumPy array sharing its memory") +
        " after the forward; the gradient would be of the new values. Run the forward again after the change, or "
        "change a clone()");
}

Tensor record(Tensor output, std::string op_name, std::vector<Tensor> inputs, const std::vector<Save>& saved,
              BackwardFn backward) {
    if (!grad_mode || !is_floating(output.dtype())) return output;  // an integer result has no gradient
    bool any_requires_grad = false;
    for (const Tensor& input : inputs) any_requires_grad |= input.defined() && input.requires_grad();
    if (!any_requires_grad) return output;
    auto node = std::make_shared<Node>();
    node->op_name = std::move(op_name);
    node->inputs = std::move(inputs);
    node->backward = std::move(backward);
    for (const Save& save : saved) {
        if (save.tensor.defined()) node->saved.push_back(save_for_backward(save));
    }
    node->output_shape = output.shape();
    node->output_dtype = output.dtype();
    node->output_device = output.device();
    output.impl()->requires_grad = true;
    output.impl()->grad_fn = std::move(node);
    return output;
}

// A post-order depth-first walk with an explicit stack: a tensor is listed when all of its inputs
// have been.
std::vector<Tensor> topological_order(const Tensor& root) {
    // The list owns its tensors: releasing a node must not free a tensor still to be visited.
    std::vector<Tensor> order;
    std::unordered_set<TensorImpl*> seen;
    std::vector<std::pair<Tensor, bool>> stack{{root, false}};  // (tensor, inputs pushed?)
    while (!stack.empty()) {
        auto [handle, inputs_done] = stack.back();
        stack.pop_back();
        TensorImpl* tensor = handle.impl();
        if (inputs_done) {
            order.push_back(handle);
            continue;
        }
        if (!seen.insert(tensor).second) continue;
        stack.push_back({handle, true});
        if (!tensor->grad_fn) continue;
        if (tensor->grad_fn->released) {
            throw std::runtime_error("backward: the graph through '" + tensor->grad_fn->op_name +
                                     "' was already freed by an earlier backward(); pass retain_graph = true to the "
                                     "first call to run backward twice");
        }
        for (const Tensor& input : tensor->grad_fn->inputs) {
            if (input.defined() && input.requires_grad() && !seen.count(input.impl())) {
                stack.push_back({input, false});
            }
        }
    }
    return order;
}

static void check_gradient(const Tensor& grad, const TensorImpl& target, const std::string& where) {
    if (grad.shape() != target.shape || grad.dtype() != target.dtype || grad.device() != target.storage->device()) {
        throw std::logic_error(where + " produced a gradient of shape " + shape_str(grad.shape()) + " (" +
                               dtype_name(grad.dtype()) + ") for a tensor of shape " + shape_str(target.shape) + " (" +
                               dtype_name(target.dtype) + ")");
    }
}

// g itself when nothing else can see its memory (a fresh, packed result), else a packed copy: a
// stored gradient never aliases the caller's seed, another leaf's gradient or a broadcast view.
static Tensor owned(const Tensor& g) {
    const bool sole_owner = g.storage().use_count() == 1 && g.is_contiguous() && g.offset() == 0 &&
                            g.storage()->nbytes() == g.numel() * dtype_size(g.dtype());
    return sole_owner ? g : g.detach().clone();
}

void run_backward(const Tensor& root, const Tensor& gradient, bool retain_graph) {
    RELGRAD_CHECK(root.requires_grad(), "backward: the tensor of shape ", shape_str(root.shape()),
                  " does not require a gradient (no input of it did)");
    Tensor seed = gradient;
    if (!seed.defined()) {
        RELGRAD_CHECK(root.numel() == 1, "backward: the tensor has shape ", shape_str(root.shape()),
                      "; only a single-element tensor gets the implicit gradient 1, so pass a gradient of that shape");
        seed = ones(root.shape(), root.dtype(), root.device());
    } else if (seed.shape() != root.shape() || seed.dtype() != root.dtype() || seed.device() != root.device()) {
        throw std::invalid_argument("backward: the gradient has shape " + shape_str(seed.shape()) + " (" +
                                    dtype_name(seed.dtype()) + ", " + device_name(seed.device()) + "), expected " +
                                    shape_str(root.shape()) + " (" + dtype_name(root.dtype()) + ", " +
                                    device_name(root.device()) + ")");
    }

    NoGradGuard no_grad;  // the backward computation itself is not recorded
    const std::vector<Tensor> order = topological_order(root);
    std::unordered_map<TensorImpl*, Tensor> pending;  // dL/dt summed over t's uses so far
    pending[root.impl()] = seed.detach();
    std::vector<Node*> processed;

    for (auto it = order.rbegin(); it != order.rend(); ++it) {
        TensorImpl* tensor = it->impl();
        auto found = pending.find(tensor);
        if (found == pending.end()) continue;  // every use returned "no gradient"
        const Tensor grad = found->second;
        pending.erase(found);

        if (!tensor->grad_fn || tensor->retains_grad) {
            const ProfileScope profiled("(summing gradients)", Phase::backward);
            // leaves keep the sum over backward calls until zero_grad(), in memory of their own
            tensor->grad = tensor->grad.defined() ? add(tensor->grad, grad) : owned(grad);
        }
        if (!tensor->grad_fn) continue;

        Node& node = *tensor->grad_fn;
        for (const SavedTensor& saved : node.saved) check_unchanged(saved, node.op_name);
        std::vector<Tensor> input_grads;
        {
            const ProfileScope profiled(node.op_name.c_str(), Phase::backward);
            input_grads = node.backward(grad);
        }
        if (input_grads.size() != node.inputs.size()) {
            throw std::logic_error("backward of '" + node.op_name + "' returned " + std::to_string(input_grads.size()) +
                                   " gradients for " + std::to_string(node.inputs.size()) + " inputs");
        }
        for (std::size_t i = 0; i < node.inputs.size(); ++i) {
            const Tensor& input = node.inputs[i];
            if (!input.defined() || !input.requires_grad() || !input_grads[i].defined()) continue;
            check_gradient(input_grads[i], *input.impl(), "backward of '" + node.op_name + "'");
            Tensor& slot = pending[input.impl()];
            const ProfileScope profiled("(summing gradients)", Phase::backward);
            slot = slot.defined() ? add(slot, input_grads[i]) : input_grads[i];  // +=
        }
        processed.push_back(&node);
    }
    // release only after the whole pass succeeded: a backward that throws can be retried
    if (!retain_graph) {
        for (Node* node : processed) node->release();
    }
}

Tensor checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs, const std::vector<Tensor>& parameters,
                  const std::function<void()>& before_recompute) {
    Tensor output;
    {
        NoGradGuard no_grad;
        output = fn(inputs).detach();  // a tensor of its own, even if fn returned an input
    }
    std::vector<Tensor> saved;  // the inputs without their graphs, and whether each wants a gradient
    std::vector<bool> wants_grad;
    for (const Tensor& input : inputs) {
        saved.push_back(input.defined() ? input.detach() : Tensor());
        wants_grad.push_back(input.defined() && input.requires_grad());
    }
    // the parameters are inputs of the node only so that it is recorded when they alone need a
    // gradient; their gradients come from the inner pass, so the node returns none for them
    std::vector<Tensor> recorded = inputs;
    recorded.insert(recorded.end(), parameters.begin(), parameters.end());
    std::vector<Save> read_again;  // the inputs fn runs on again (the parameters are their own graph's)
    for (const Tensor& input : inputs) read_again.push_back({"an input", input});
    return record(output, "checkpoint", recorded, read_again,
                  [fn, saved, wants_grad, before_recompute, count = recorded.size()](const Tensor& g) {
                      if (before_recompute) before_recompute();
                      std::vector<Tensor> fresh;  // new leaves on every pass
                      for (std::size_t i = 0; i < saved.size(); ++i) {
                          fresh.push_back(wants_grad[i] ? saved[i].detach().requires_grad_(true) : saved[i]);
                      }
                      Tensor recomputed;
                      {
                          EnableGradGuard recording;
                          recomputed = fn(fresh);
                      }
                      if (recomputed.requires_grad()) recomputed.backward(g);
                      std::vector<Tensor> grads(count);
                      for (std::size_t i = 0; i < saved.size(); ++i) {
                          if (wants_grad[i]) grads[i] = fresh[i].grad();
                      }
                      return grads;
                  });
}

}  // namespace relgrad
