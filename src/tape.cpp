// tape.cpp: Var, recording, and the backward walk (reverse creation order, each node once).
#include "dualcast/tape.hpp"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "dualcast/error.hpp"
#include "tensor_arith.hpp"

namespace dualcast {

namespace {
thread_local bool t_grad_enabled = true;
std::atomic<std::uint64_t> g_sequence{0};
std::atomic<std::int64_t> g_nodes_created{0};
std::atomic<std::int64_t> g_nodes_run{0};
std::atomic<std::uint64_t> g_hook_id{0};

void run_grad_ready_hooks(const VarState& leaf) {
  for (const auto& [id, hook] : leaf.grad_ready_hooks) hook();
}
}  // namespace

bool grad_enabled() { return t_grad_enabled; }

NoGradGuard::NoGradGuard() : previous_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = previous_; }

AutogradStats autograd_stats() { return {g_nodes_created.load(), g_nodes_run.load()}; }

Var::Var(Tensor value) : state_(std::make_shared<VarState>()) { state_->value = std::move(value); }

Var Var::param(Tensor value) {
  check_defined(value, "Var::param", "value");
  DUALCAST_CHECK(is_floating(value.dtype()), "Var::param: a ", dtype_name(value.dtype()),
                 " tensor of shape ", value.shape().str(),
                 " cannot require a gradient (use float32 or float64)");
  Var v(std::move(value));
  v.state_->requires_grad = true;
  return v;
}

const Tensor& Var::value() const {
  DUALCAST_CHECK(state_ != nullptr, "Var::value: the Var is undefined (default-constructed)");
  return state_->value;
}

Tensor Var::grad() const {
  DUALCAST_CHECK(state_ != nullptr, "Var::grad: the Var is undefined (default-constructed)");
  DUALCAST_CHECK(state_->requires_grad, "Var::grad: this Var of shape ", state_->value.shape().str(),
                 " is a constant and has no gradient; create it with Var::param(tensor) to "
                 "differentiate with respect to it");
  DUALCAST_CHECK(state_->grad.defined(), "Var::grad: no gradient exists for this Var of shape ",
                 state_->value.shape().str(),
                 " yet: call backward() on a result that depends on it first");
  return state_->grad;
}

void Var::zero_grad() {
  if (!state_) return;
  state_->grad = Tensor();
  state_->grad_owned = false;
}

std::uint64_t Var::add_grad_ready_hook(std::function<void()> hook) const {
  DUALCAST_CHECK(state_ != nullptr && state_->requires_grad && !state_->node,
                 "Var::add_grad_ready_hook: the Var must be a leaf that requires a gradient "
                 "(Var::param), not a constant or an op's result");
  DUALCAST_CHECK(static_cast<bool>(hook), "Var::add_grad_ready_hook: the hook is empty");
  const std::uint64_t id = ++g_hook_id;
  state_->grad_ready_hooks.emplace_back(id, std::move(hook));
  return id;
}

void Var::remove_grad_ready_hook(std::uint64_t id) const {
  if (!state_) return;
  auto& hooks = state_->grad_ready_hooks;
  hooks.erase(std::remove_if(hooks.begin(), hooks.end(), [id](const auto& h) { return h.first == id; }),
              hooks.end());
}

void Var::backward(bool retain_graph) const {
  const Tensor& v = value();
  DUALCAST_CHECK(v.numel() == 1, "backward: called without a gradient on a non-scalar Var of shape ",
                 v.shape().str(), "; pass grad_output (a tensor of that shape) or reduce to a scalar "
                 "first (e.g. sum)");
  backward(Tensor::ones(v.shape(), v.dtype(), v.device()), retain_graph);
}

void Var::backward(const Tensor& grad_output, bool retain_graph) const {
  const Tensor& v = value();
  check_defined(grad_output, "backward", "grad_output");
  DUALCAST_CHECK(grad_output.shape() == v.shape(), "backward: grad_output of shape ",
                 grad_output.shape().str(), " does not match the Var's shape ", v.shape().str());
  check_same_device_dtype("backward", "value", v, "grad_output", grad_output);
  DUALCAST_CHECK(state_->requires_grad, "backward: this Var of shape ", v.shape().str(),
                 " does not require a gradient (it depends on no Var::param, or was made under "
                 "NoGradGuard)");

  // Collect the nodes reachable from this Var; refuse before touching anything if one was freed.
  std::vector<Node*> order;
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack;
  bool leaf_hooks = false;
  if (state_->node) stack.push_back(state_->node.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second) continue;
    DUALCAST_CHECK(!n->released, "backward: the graph through '", n->name(),
                   "' was already freed by an earlier backward; call backward(..., "
                   "retain_graph=true) the first time to run backward twice");
    order.push_back(n);
    for (const auto& in : n->inputs) {
      if (in && in->node) stack.push_back(in->node.get());
      if (in && !in->node && !in->grad_ready_hooks.empty()) leaf_hooks = true;
    }
  }
  std::sort(order.begin(), order.end(),
            [](const Node* a, const Node* b) { return a->sequence > b->sequence; });

  // A hooked leaf's gradient is final after the last node (in this order) that has it as an input.
  std::vector<std::vector<const VarState*>> ready_after;
  if (leaf_hooks) {
    std::unordered_map<const VarState*, std::size_t> last;
    for (std::size_t i = 0; i < order.size(); ++i)
      for (const auto& in : order[i]->inputs)
        if (in && !in->node && !in->grad_ready_hooks.empty()) last[in.get()] = i;
    ready_after.resize(order.size());
    for (const auto& [leaf, i] : last) ready_after[i].push_back(leaf);
  }

  detail::accumulate_grad(*state_, grad_output, /*owned=*/false);
  if (!state_->node) run_grad_ready_hooks(*state_);
  for (std::size_t position = 0; position < order.size(); ++position) {
    Node* n = order[position];
    std::vector<Tensor> grads(n->outputs.size());
    for (std::size_t m = 0; m < n->outputs.size(); ++m)
      if (auto out = n->outputs[m].lock()) grads[m] = out->grad;
    n->backward(grads);
    ++g_nodes_run;
    // Intermediate adjoints are consumed; only leaves keep theirs.
    for (auto& w : n->outputs)
      if (auto out = w.lock()) {
        out->grad = Tensor();
        out->grad_owned = false;
      }
    if (!retain_graph) {
      n->release_saved();
      n->released = true;
    }
    if (leaf_hooks)
      for (const VarState* leaf : ready_after[position]) run_grad_ready_hooks(*leaf);
  }
  // The root may be a leaf (backward on a parameter itself): it keeps its gradient then.
}

namespace detail {

bool any_requires_grad(const std::vector<Var>& vars) {
  if (!grad_enabled()) return false;
  return std::any_of(vars.begin(), vars.end(), [](const Var& v) { return v.requires_grad(); });
}

std::vector<Var> record(std::shared_ptr<Node> node, const std::vector<Var>& inputs,
                        std::vector<Tensor> outputs) {
  std::vector<Var> result;
  result.reserve(outputs.size());
  const bool track = node && any_requires_grad(inputs);
  if (track) {
    node->sequence = ++g_sequence;
    ++g_nodes_created;
    node->inputs.clear();
    for (const auto& in : inputs)
      node->inputs.push_back(in.requires_grad() ? in.state() : nullptr);
  }
  for (std::size_t m = 0; m < outputs.size(); ++m) {
    auto s = std::make_shared<VarState>();
    s->value = std::move(outputs[m]);
    if (track) {
      s->requires_grad = true;
      s->node = node;
      s->output_index = static_cast<int>(m);
      node->outputs.push_back(s);
    }
    result.emplace_back(std::move(s));
  }
  return result;
}

Var record1(std::shared_ptr<Node> node, const std::vector<Var>& inputs, Tensor output) {
  std::vector<Tensor> outs;
  outs.push_back(std::move(output));
  return record(std::move(node), inputs, std::move(outs))[0];
}

void accumulate_grad(VarState& state, Tensor g, bool owned) {
  if (!g.defined()) return;
  DUALCAST_CHECK(g.shape() == state.value.shape(), "backward: gradient of shape ", g.shape().str(),
                 " does not match its variable's shape ", state.value.shape().str(),
                 " (an op's backward is wrong)");
  if (!state.grad.defined()) {
    state.grad = std::move(g);
    state.grad_owned = owned;
  } else if (state.grad_owned) {
    add_inplace(state.grad, g);
  } else {
    state.grad = add_tensors(state.grad, g);
    state.grad_owned = true;
  }
}

}  // namespace detail
}  // namespace dualcast
