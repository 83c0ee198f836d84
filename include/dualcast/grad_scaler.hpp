// grad_scaler.hpp: dynamic loss scaling for float16 training, modelled on torch.amp.GradScaler.
//
// float16 has little range (smallest normal 2^-14, largest 65504), so small gradients underflow to
// zero. The scaler multiplies the loss by a large factor S before backward, so every gradient is S
// times larger; unscale_() divides them by S again (in place, in each gradient's dtype) and notes
// whether any of them is inf or NaN (S was too large); step() then skips the optimizer's update
// when it found one, and update() adapts S: halved (backoff_factor) after an overflow, doubled
// (growth_factor) after growth_interval consecutive clean steps. The usual loop:
//
//     GradScaler scaler(dev);
//     for (...) {
//       opt.zero_grad();
//       Var loss = ...;
//       scaler.scale(loss).backward();
//       scaler.step(opt);   // unscale_(opt) first unless the caller already did (e.g. to clip)
//       scaler.update();
//     }
//
// Capture-safe (graph.hpp): the scale, the found-inf flag and the growth counter live in device
// memory on the scaler's device, and every decision is taken by a kernel: scale() and the backward
// read S there, unscale_() raises the flag there, the optimizer's update kernels read it
// (Optimizer::step_unless) and update()'s one-thread kernel adapts S and clears the flag. Such a
// step can be captured in a Graph and replayed; get_scale() and last_step_skipped() read the device
// (they wait for it) and are an Error while a capture runs. Construct the scaler before capturing.
//
// Differences from PyTorch: one found-inf flag per scaler rather than per optimizer, so with several
// optimizers stepped between two update() calls an overflow in any of their gradients skips all of
// them; all parameters of an optimizer passed to it live on the scaler's device. The same logic runs
// on the CPU.
#pragma once

#include <cstdint>
#include <vector>

#include "dualcast/optim.hpp"
#include "dualcast/tape.hpp"
#include "dualcast/tensor.hpp"

namespace dualcast {

/// PyTorch's defaults.
struct GradScalerOptions {
  double init_scale = 65536.0;          ///< finite, > 0
  double growth_factor = 2.0;           ///< > 1
  double backoff_factor = 0.5;          ///< in (0, 1)
  std::int64_t growth_interval = 2000;  ///< >= 1: clean steps before the scale grows
  /// false: scale() returns the loss, step() is optimizer.step(), update() does nothing, the scale
  /// reads as 1 (so code can switch loss scaling off without changing shape).
  bool enabled = true;
};

class GradScaler {
 public:
  /// Allocates the scaler's state on `device` (an Error while a Graph captures there). Invalid
  /// options are an Error naming the option and its value.
  explicit GradScaler(Device device, GradScalerOptions options = {});

  /// loss * S, in the loss's dtype, recorded on the tape (its gradient is S times the adjoint).
  /// `loss` may have any shape and floating dtype and must live on the scaler's device. In float16
  /// the product itself can overflow to inf; unscale_() then finds inf gradients and the step is
  /// skipped, as intended.
  [[nodiscard]] Var scale(const Var& loss) const;

  /// Multiplies the gradient of each of `opt`'s parameters that has one by 1/S, in place, and raises
  /// the found-inf flag when any unscaled value is inf or NaN. At most once per optimizer between
  /// two update() calls, and not after step(opt) (an Error naming the order otherwise).
  void unscale_(Optimizer& opt);

  /// unscale_(opt) unless already done since the last update(), then opt.step_unless(flag): the
  /// update is skipped on the device when an inf or NaN was found. At most once per optimizer
  /// between two update() calls.
  void step(Optimizer& opt);

  /// Adapts S from the flag (backoff after an overflow, growth after growth_interval clean steps;
  /// a growth that would make S infinite is not taken) and clears the flag. An Error unless some
  /// optimizer was unscaled since the last update().
  void update();

  /// The current S (waits for the device; an Error while capturing; 1 when disabled).
  [[nodiscard]] double get_scale() const;
  /// Whether the step before the last update() found an inf or NaN and was skipped (waits for the
  /// device; an Error while capturing; false when disabled or before the first update()).
  [[nodiscard]] bool last_step_skipped() const;
  /// Clean steps counted towards the next growth (waits for the device; an Error while capturing).
  [[nodiscard]] std::int64_t growth_tracker() const;

  [[nodiscard]] Device device() const { return device_; }
  [[nodiscard]] const GradScalerOptions& options() const { return options_; }
  /// The device flag (float32 [1], nonzero: an inf or NaN was found since the last update()).
  [[nodiscard]] const Tensor& found_inf() const { return found_; }

 private:
  Device device_;
  GradScalerOptions options_;
  Tensor scale_;    ///< float32 [1]: S
  Tensor found_;    ///< float32 [1]: the found-inf flag
  Tensor tracker_;  ///< float64 [2]: clean steps since the last growth or backoff, last step skipped
  std::vector<const Optimizer*> unscaled_;  ///< since the last update()
  std::vector<const Optimizer*> stepped_;   ///< since the last update()
};

}  // namespace dualcast
