// optim.hpp: first-order optimizers over Var::param leaves: SGD (momentum, weight decay) and Adam.
//
// step() updates each parameter in place, in its own storage (every Tensor handle to it, including
// p.value(), sees the new values), with one fused parallel_for kernel per parameter: the gradient,
// weight decay, the state update and the parameter update are one pass over the elements, on the CPU
// or the GPU from the same body. State tensors (momentum buffers, Adam moments) are allocated once,
// in the constructor, on each parameter's device and dtype; step() allocates nothing. Parameters
// whose gradient does not exist (no backward reached them since zero_grad()) are skipped and their
// state is left untouched (Adam keeps a step count per parameter, as PyTorch does).
//
// State values that decay below the smallest normal number (where gradients stay 0 for hundreds of
// steps) are stored as 0: subnormal arithmetic is 15-20x slower on x86 CPUs. This changes results by
// less than 1e-38 (float) and is done identically on the GPU.
//
// 16-bit parameters (bfloat16, float16): the optimizers keep their state in float32 (momentum
// buffers and Adam moments are float32 tensors), read the parameter and its gradient (which has the
// parameter's dtype) into float, compute the update in float32 and store the new value rounded to
// the parameter's dtype. float32 and float64 parameters are updated exactly as before. An update
// smaller than half a unit in the last place of a 16-bit parameter is lost in that rounding (no
// float32 master copy is kept here: keep float32 parameters and cast them, as Autocast does, when
// that matters).
//
// step_unless(found_inf) is step() made conditional on a device flag, for GradScaler: every update
// kernel (and Adam's step count) reads the flag and leaves everything unchanged when it is nonzero,
// so a captured step needs no host decision.
//
// The update rules follow PyTorch's torch.optim (SGD without dampening or Nesterov; Adam with L2
// weight decay added to the gradient), so results can be compared with it.
//
// Capture-safe (graph.hpp): everything that changes from step to step lives on the parameters'
// devices, as in PyTorch's capturable Adam. The learning rate is a float64 device scalar per device
// that the update kernels read (set_lr writes it, between replays of a captured step); Adam's step
// count t and its bias corrections (lr / (1 - beta1^t) and 1 / sqrt(1 - beta2^t)) are float64 device
// scalars per parameter, advanced and recomputed by a small kernel at the start of each step() (one
// per device when every parameter has a gradient). Eager results are those of the same formulas
// computed on the host before, in double precision. Construct optimizers before capturing a step
// that uses them (their constructor initialises device state, which a capture would only record).
#pragma once

#include <cstdint>
#include <vector>

#include "dualcast/tape.hpp"
#include "dualcast/tensor.hpp"

namespace dualcast::optim {

/// Common part: the parameter list, the learning rate and zero_grad().
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// Applies one update to every parameter that has a gradient.
  virtual void step() = 0;
  /// step(), except that the update kernels leave every parameter and every state unchanged when
  /// the float32 one-element device tensor `found_inf` is nonzero at the time they run (GradScaler's
  /// flag; capture-safe, nothing is read on the host). The flag must live on every parameter's
  /// device. Counts in steps() either way.
  void step_unless(const Tensor& found_inf);
  /// Forgets every parameter's gradient (the next backward starts from zero).
  void zero_grad();

  [[nodiscard]] double lr() const { return lr_; }
  /// Changes the learning rate (schedules); NaN, infinite or non-positive is a dualcast::Error. Writes
  /// the device scalar the updates read, so it takes effect at the next step() or the next replay of
  /// a captured step. Setting a different value while a Graph captures on a parameter's device is an
  /// Error (the write would be recorded into the step); the same value is a no-op.
  void set_lr(double lr);
  [[nodiscard]] const std::vector<Var>& params() const { return params_; }
  /// Number of step() calls made from the host so far (a step captured in a Graph counts once, at
  /// capture, however often it is replayed).
  [[nodiscard]] std::int64_t steps() const { return steps_; }

 protected:
  /// Checks the parameters (non-empty, defined, each a floating Var that requires a gradient, no
  /// duplicates) and the learning rate; `who` names the optimizer in messages.
  Optimizer(std::vector<Var> params, double lr, const char* who);
  /// The gradient of parameter i when it has one that matches it (undefined tensor otherwise:
  /// skip it). A gradient of another shape, dtype or device is an Error.
  [[nodiscard]] Tensor grad_of(std::size_t i) const;
  /// The learning-rate scalar (float64, one element) on parameter i's device.
  [[nodiscard]] const double* lr_on_device(std::size_t i) const;

  /// The parameters that live on one device, and the state they share there.
  struct DeviceGroup {
    Device device;
    Tensor lr;                         ///< float64 [1]: the learning rate the kernels read
    std::vector<std::size_t> members;  ///< parameter indices, in order
  };
  std::vector<Var> params_;
  double lr_;
  std::int64_t steps_ = 0;
  const char* who_;
  std::vector<DeviceGroup> groups_;
  std::vector<std::size_t> group_of_;  ///< parameter i -> its index in groups_
  std::vector<std::size_t> slot_of_;   ///< parameter i -> its position in its group's members
  /// During step_unless: the flag the update kernels read (nullptr: update unconditionally).
  const float* skip_ = nullptr;
};

/// Stochastic gradient descent: g = grad + weight_decay * p; with momentum, buf = momentum * buf + g
/// and g = buf; then p -= lr * g.
class SGD final : public Optimizer {
 public:
  SGD(std::vector<Var> params, double lr, double momentum = 0.0, double weight_decay = 0.0);
  void step() override;

  [[nodiscard]] double momentum() const { return momentum_; }
  [[nodiscard]] double weight_decay() const { return weight_decay_; }
  /// The momentum buffer of parameter i (undefined when momentum is 0; float32 for a 16-bit
  /// parameter).
  [[nodiscard]] const Tensor& momentum_buffer(std::size_t i) const { return buffers_.at(i); }

 private:
  double momentum_;
  double weight_decay_;
  std::vector<Tensor> buffers_;
};

/// Adam (Kingma and Ba, 2015): g = grad + weight_decay * p; m = b1 m + (1-b1) g;
/// v = b2 v + (1-b2) g^2; p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps), t counted per
/// parameter on the device (capturable: see the file comment).
class Adam final : public Optimizer {
 public:
  Adam(std::vector<Var> params, double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999,
       double eps = 1e-8, double weight_decay = 0.0);
  void step() override;

  [[nodiscard]] double beta1() const { return beta1_; }
  [[nodiscard]] double beta2() const { return beta2_; }
  [[nodiscard]] double eps() const { return eps_; }
  [[nodiscard]] const Tensor& first_moment(std::size_t i) const { return m_.at(i); }
  [[nodiscard]] const Tensor& second_moment(std::size_t i) const { return v_.at(i); }
  /// How many updates parameter i has received, replays of a captured step included (reads the
  /// device's count: waits for the device, and is an Error during a capture).
  [[nodiscard]] std::int64_t param_steps(std::size_t i) const;

 private:
  double beta1_, beta2_, eps_, weight_decay_;
  std::vector<Tensor> m_, v_;
  /// Per device group: float64 [members, 3] = (t, lr / (1 - beta1^t), 1 / sqrt(1 - beta2^t)).
  std::vector<Tensor> schedule_;
};

}  // namespace dualcast::optim

namespace dualcast {
using optim::Adam;
using optim::Optimizer;
using optim::SGD;
}  // namespace dualcast
