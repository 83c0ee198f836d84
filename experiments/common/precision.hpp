// precision.hpp: the drivers' --precision fp32|tf32|bf16|fp16 option (issue 30) and what each value
// switches on, so that every experiment means the same by it and its PyTorch peer can match it:
//   fp32  nothing: the code path and numbers of a run without the option
//   tf32  set_float32_matmul_precision("high") for the run: TF32 cuBLAS matmuls and cuDNN
//         convolutions (PyTorch: allow_tf32 on for cuDNN and matmul)
//   bf16  the forward pass under Autocast(bfloat16); parameters stay float32 master weights and the
//         optimizers are unchanged (PyTorch: torch.autocast("cuda", dtype=torch.bfloat16))
//   fp16  the same with float16, the loss scaled by a GradScaler (as PyTorch's peer does with
//         torch.amp.GradScaler): backward_and_step below
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "cli.hpp"
#include "dualcast/data_parallel.hpp"
#include "dualcast/grad_scaler.hpp"
#include "dualcast/ops/cast.hpp"
#include "dualcast/optim.hpp"
#include "dualcast/precision.hpp"

namespace dcexp {

enum class Precision { fp32, tf32, bf16, fp16 };

/// The name written to result files and table headers ("precision" field).
inline const char* precision_name(Precision p) {
  switch (p) {
    case Precision::tf32: return "tf32";
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
    default: return "fp32";
  }
}

/// What the name means, for the drivers' first output line.
inline const char* precision_text(Precision p) {
  switch (p) {
    case Precision::tf32: return "tf32 (TF32 matmuls and convolutions)";
    case Precision::bf16: return "bf16 (Autocast bfloat16 forward, float32 master weights)";
    case Precision::fp16: return "fp16 (Autocast float16 forward, float32 master weights, GradScaler)";
    default: return "fp32 (TF32 off)";
  }
}

inline bool is_autocast(Precision p) { return p == Precision::bf16 || p == Precision::fp16; }

/// The 16-bit dtype of an autocast precision.
inline dualcast::DType autocast_dtype(Precision p) {
  return p == Precision::fp16 ? dualcast::DType::float16 : dualcast::DType::bfloat16;
}

namespace cli {
/// --precision fp32|tf32|bf16|fp16.
inline Precision parse_precision(const std::string& s) {
  if (s == "fp32") return Precision::fp32;
  if (s == "tf32") return Precision::tf32;
  if (s == "bf16") return Precision::bf16;
  if (s == "fp16") return Precision::fp16;
  throw UsageError("--precision: unknown precision '" + s + "' (expected fp32, tf32, bf16 or fp16)");
}
}  // namespace cli

/// The process-wide part of a precision, for the length of a run: tf32 sets the float32 matmul
/// precision to "high" and the destructor restores what it found; the other values leave the
/// setting alone (fp32 must not touch anything, and bf16/fp16 keep exact float32 outside Autocast,
/// as their PyTorch peer does).
class PrecisionScope {
 public:
  explicit PrecisionScope(Precision p) {
    if (p != Precision::tf32) return;
    previous_ = dualcast::get_float32_matmul_precision();
    dualcast::set_float32_matmul_precision("high");
  }
  ~PrecisionScope() {
    if (previous_) dualcast::set_float32_matmul_precision(*previous_);
  }
  PrecisionScope(const PrecisionScope&) = delete;
  PrecisionScope& operator=(const PrecisionScope&) = delete;

 private:
  std::optional<std::string> previous_;
};

/// f() run under Autocast of p's 16-bit dtype when p is bf16 or fp16, plainly otherwise. For the
/// forward pass only, as with torch.autocast: the backward then runs outside the guard.
template <class F>
decltype(auto) autocast_forward(Precision p, F&& f) {
  if (!is_autocast(p)) return std::forward<F>(f)();
  const dualcast::Autocast guard(autocast_dtype(p));
  return std::forward<F>(f)();
}

/// x in float32 (x itself when it is float32 already): what a loss or norm is given where PyTorch's
/// autocast would run it in float32, so that the result is float32 (the 16-bit losses and norms
/// also compute in float32, but return the input's dtype, as PyTorch does outside autocast).
inline dualcast::Var float32(const dualcast::Var& x) { return dualcast::cast(x, dualcast::DType::float32); }

/// The loss scaler a precision needs: a GradScaler on `device` for fp16 (PyTorch's defaults), none
/// otherwise. Make it before capturing a step.
inline std::unique_ptr<dualcast::GradScaler> make_scaler(Precision p, dualcast::Device device) {
  if (p != Precision::fp16) return nullptr;
  return std::make_unique<dualcast::GradScaler>(device);
}

/// loss.backward() and opt.step(), through the scaler when there is one (scale, backward, step
/// skipped on an overflow, update of the scale); with `ddp`, the gradients are averaged over the
/// ranks between the backward and the step (before the scaler looks at them, so every rank skips
/// the same steps).
inline void backward_and_step(dualcast::GradScaler* scaler, const dualcast::Var& loss, dualcast::Optimizer& opt,
                              dualcast::dist::DataParallel* ddp = nullptr) {
  if (!scaler) {
    loss.backward();
    if (ddp) ddp->finish();
    opt.step();
    return;
  }
  scaler->scale(loss).backward();
  if (ddp) ddp->finish();
  scaler->step(opt);
  scaler->update();
}

}  // namespace dcexp
