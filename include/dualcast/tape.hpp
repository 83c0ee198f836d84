// tape.hpp: Var, the reverse-mode tape's nodes, backward, and NoGradGuard.
//
// The tape is implicit and dynamic, as in PyTorch: every Var produced by a recorded operation points
// to the Node that made it, and each Node holds its inputs. There is no global list, so threads never
// share state, nothing needs clearing between training steps (a step's graph is freed when its loss
// and intermediates go out of scope), and backward frees each node's saved tensors as it passes
// (unless retain_graph), which is what lets memory be reused by the next step. Topological order
// comes from creation order: a node is always created after the nodes of its inputs, so running the
// reachable nodes by decreasing sequence number visits every node once, after all its consumers.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dualcast/tensor.hpp"

namespace dualcast {

struct VarState;

/// One recorded operation. Holds what its backward needs (saved tensors, shapes) and nothing more;
/// backward only accumulates into its inputs' gradients.
class Node {
 public:
  virtual ~Node() = default;
  [[nodiscard]] virtual const char* name() const = 0;
  /// grad_outputs[m] is the adjoint of output m (undefined when nothing flowed into it).
  virtual void backward(const std::vector<Tensor>& grad_outputs) = 0;
  /// Drops saved tensors after a backward without retain_graph.
  virtual void release_saved() {}

  /// One entry per differentiable argument of the op, in order; null where that argument needs no
  /// gradient (a constant, or a Var without requires_grad).
  std::vector<std::shared_ptr<VarState>> inputs;
  std::vector<std::weak_ptr<VarState>> outputs;
  std::uint64_t sequence = 0;
  bool released = false;
};

/// The shared state behind Var handles.
struct VarState {
  Tensor value;
  Tensor grad;              ///< accumulated adjoint (leaves keep it; intermediates drop it)
  bool grad_owned = false;  ///< whether `grad`'s storage is ours alone (may be updated in place)
  bool requires_grad = false;
  std::shared_ptr<Node> node;  ///< the op that produced this value (null for leaves and constants)
  int output_index = 0;
  /// Leaves: called during backward once this gradient is final (Var::add_grad_ready_hook).
  std::vector<std::pair<std::uint64_t, std::function<void()>>> grad_ready_hooks;
};

/// A tensor on the tape. Copies of a Var are handles to the same variable.
class Var {
 public:
  Var() = default;
  /// A constant (no gradient). Tensors and Vars mix freely in every op.
  Var(Tensor value);  // NOLINT(google-explicit-constructor): a Tensor is a constant Var
  /// A leaf that requires a gradient (a parameter or an input to differentiate with respect to).
  static Var param(Tensor value);
  static Var constant(Tensor value) { return Var(std::move(value)); }

  [[nodiscard]] bool defined() const { return state_ && state_->value.defined(); }
  [[nodiscard]] const Tensor& value() const;
  [[nodiscard]] const Shape& shape() const { return value().shape(); }
  [[nodiscard]] DType dtype() const { return value().dtype(); }
  [[nodiscard]] Device device() const { return value().device(); }
  [[nodiscard]] std::int64_t numel() const { return value().numel(); }
  [[nodiscard]] double item() const { return value().item(); }
  [[nodiscard]] bool requires_grad() const { return state_ && state_->requires_grad; }
  [[nodiscard]] bool is_leaf() const { return !state_ || !state_->node; }

  /// The accumulated gradient. Throws dualcast::Error for a constant (it never has one) and for a
  /// variable whose gradient does not exist yet (no backward reached it since zero_grad()).
  [[nodiscard]] Tensor grad() const;
  [[nodiscard]] bool has_grad() const { return state_ && state_->grad.defined(); }
  /// Forgets the accumulated gradient (the next backward starts from zero).
  void zero_grad();

  /// Backpropagates from a scalar (one-element) Var with adjoint 1.
  void backward(bool retain_graph = false) const;
  /// Backpropagates with the given adjoint (same shape, device and dtype as the value).
  void backward(const Tensor& grad_output, bool retain_graph = false) const;

  /// Registers `hook` on a leaf that requires a gradient: each backward that reaches this leaf calls
  /// it as soon as the leaf's gradient is final for that backward (right after the last node that
  /// adds to it has run, while the nodes nearer the inputs still wait), so that work on the gradient
  /// (data-parallel all-reduce) overlaps the rest of the backward. The gradient must not be written
  /// by the hook's caller after that, except through the hook's own work. Returns an id for
  /// remove_grad_ready_hook. An Error on a constant or a non-leaf.
  std::uint64_t add_grad_ready_hook(std::function<void()> hook) const;
  /// Removes a hook added by add_grad_ready_hook (an unknown id is ignored).
  void remove_grad_ready_hook(std::uint64_t id) const;

  /// The same value, cut from the tape (a constant sharing storage).
  [[nodiscard]] Var detach() const { return Var(value()); }

  // ---- for op implementations ---------------------------------------------------------------
  [[nodiscard]] const std::shared_ptr<VarState>& state() const { return state_; }
  explicit Var(std::shared_ptr<VarState> state) : state_(std::move(state)) {}

 private:
  std::shared_ptr<VarState> state_;
};

/// Disables recording in its scope (thread-local): ops return constants and build no nodes.
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

/// Whether ops record nodes on this thread right now.
bool grad_enabled();

/// Counters of the autograd engine, for tests and experiments.
struct AutogradStats {
  std::int64_t nodes_created = 0;
  std::int64_t nodes_run = 0;  ///< node backward calls so far
};
AutogradStats autograd_stats();

namespace detail {
/// Registers `node` as the producer of `outputs` (values already computed): assigns the sequence
/// number, links inputs (only those that require a gradient are kept) and outputs. Returns the Vars.
std::vector<Var> record(std::shared_ptr<Node> node, const std::vector<Var>& inputs,
                        std::vector<Tensor> outputs);
/// Single-output convenience form.
Var record1(std::shared_ptr<Node> node, const std::vector<Var>& inputs, Tensor output);
/// Adds `g` to the gradient of `state` (takes ownership of g's storage when the gradient is
/// empty and `owned` says nobody else holds g; otherwise adds out of place or in place as safe).
void accumulate_grad(VarState& state, Tensor g, bool owned);
/// Whether any of the Vars requires a gradient and recording is enabled.
bool any_requires_grad(const std::vector<Var>& vars);
}  // namespace detail

}  // namespace dualcast
