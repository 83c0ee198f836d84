// network.hpp: workload e of the HM-LSTM experiment, the 3-layer HM-LSTM character model of
// experiments/peers/MODEL.md, on dualcast's tape.
//
// Everything that is not elementwise (the gate matmuls, the embedding lookup written as a one-hot
// matmul, the concatenation of the three layers' h, the output projection, the cross-entropy) is the
// same code in both cell modes. The modes differ only in the per-layer elementwise step, i.e. in the
// cell (c', h' from the flags z, zb, the state c, h and the gate pre-activations f, i, o, g) and in the
// boundary detector (hard sigmoid of s_z, step, straight-through estimator):
//
//   CellMode::mixed    the cell is ONE broadcast of an if-form functor returning std::tuple (FLUSH /
//                      COPY / UPDATE chosen by data-dependent `if`): one fused forward kernel, one
//                      fused backward kernel, K = 6 differentiated arguments, 2 outputs. The boundary
//                      detector is a second broadcast (value step(hard_sigm(s_z)), partial that of
//                      hard_sigm: the straight-through estimator written on duals).
//   CellMode::reverse  the same math in select form on Vars: every sigmoid, tanh, *, +, select and
//                      comparison is its own kernel and tape node (pure reverse mode; PyTorch-eager
//                      style). This is the baseline.
//
// Implementation notes (same in both modes): the embedding lookup h^0_t = E[x_t] is a product
// onehot(x) @ E (its gradient onehot^T @ dh is the scatter-add of repeated tokens), computed once for
// all T steps and split per step; for t > 0 the three gate products of a layer are one matmul of the
// concatenated inputs [zb*h_below, h, z*h_above] with [W; U; Td] (concatenated once per loss() call);
// the pre-activation s of a layer is split into f, i, o, g, s_z by one split node; at t = 0 the
// recurrent and top-down terms (zero state) are skipped, which changes no value and no gradient; the
// loss is dualcast's fused cross_entropy of logits [T*B, V]. Both modes
// agree with experiments/peers/reference.py's float64 BPTT (ref_e) to ~1e-15 in float64.
//
// Parameters are created from seeded Tensor::randn / Tensor::uniform (counter-based: the same values
// on the CPU and the GPU), initialised as MODEL.md says (E ~ N(0,1); W, U, Td, Wout ~
// U(-1/sqrt(H), 1/sqrt(H)); biases 0).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dualcast/broadcast.hpp"
#include "dualcast/device.hpp"
#include "dualcast/dtype.hpp"
#include "dualcast/graph.hpp"
#include "dualcast/math.hpp"
#include "dualcast/optim.hpp"
#include "dualcast/tape.hpp"
#include "dualcast/tensor.hpp"

#include "cell.hpp"

namespace hmlstm {

using dualcast::Device;
using dualcast::DType;
using dualcast::Tensor;
using dualcast::Var;

// =================================================================================================
// The elementwise step, mixed mode: two functors, each one broadcast (one fused forward kernel, one
// fused backward kernel): the cell HmCell (cell.hpp, shared with workload b of the driver) and the
// boundary detector below. Written with `auto` parameters, they run on plain numbers (no gradient
// needed) and on Dual<T, K> (Var arguments).
// =================================================================================================

/// z~ = hard_sigm(s) = clamp((a s + 1) / 2, 0, 1), derivative a/2 on the open interior 0 < u < 1, 0
/// elsewhere (ties included, MODEL.md). `a` arrives as a plain number. Used as the boundary itself
/// only with soft_boundary (tests only); BoundarySte builds on it.
struct BoundarySoft {
  DUALCAST_HD auto operator()(auto s, auto a) const {
    using dualcast::select;
    using dualcast::value;
    using T = dualcast::scalar_t<decltype(s)>;
    const auto u = (a * s + T(1)) * T(0.5);
    const T uv = value(u);
    return select(uv > T(0) && uv < T(1), u, uv >= T(1) ? T(1) : T(0));
  }
};

/// The boundary detector with the straight-through estimator: value step(z~) (exactly 0 or 1),
/// derivative that of z~ = hard_sigm(s) (BoundarySoft).
struct BoundarySte {
  DUALCAST_HD auto operator()(auto s, auto a) const {
    using dualcast::value;
    using T = dualcast::scalar_t<decltype(s)>;
    const auto zt = BoundarySoft{}(s, a);
    const T ztv = value(zt);
    const T step = ztv > T(0.5) ? T(1) : T(0);
    // zt + (step - zt) is exactly `step` in floating point (Sterbenz: step - zt is exact for zt in
    // [0, 1] and step in {0, 1}), and carries zt's partials.
    return zt + (step - ztv);
  }
};

// The same two steps in reverse mode (select form on Vars: one kernel and one tape node per
// primitive). zflag, zbflag: [B, 1] 0/1 flags of the network's dtype. reverse_cell is HmCellSelect
// (cell.hpp).
std::pair<Var, Var> reverse_cell(const Tensor& zflag, const Tensor& zbflag, const Var& c, const Var& h,
                                 const Var& f, const Var& i, const Var& o, const Var& g);
/// soft = false: the STE boundary (value step(z~), gradient that of z~); true: z~ itself.
Var reverse_boundary(const Var& sz, double a, bool soft = false);
/// The same with the slope a in a tensor broadcastable against sz (the network's device scalar, so a
/// captured step reads the slope current at each replay).
Var reverse_boundary(const Var& sz, const Tensor& a, bool soft = false);

/// How the per-layer elementwise step is differentiated (see the file comment).
enum class CellMode { mixed, reverse };

const char* cell_mode_name(CellMode mode);  ///< "mixed" / "reverse"
/// "mixed" or "reverse" -> CellMode; anything else is a dualcast::Error.
CellMode parse_cell_mode(const std::string& name);

struct NetworkConfig {
  int layers = 3;  ///< must be 3 (MODEL.md fixes L = 3; other values are a dualcast::Error)
  int hidden = 512;
  int batch = 64;
  int seq = 100;
  int vocab = 64;
  float slope = 1.0f;  ///< a, the slope of the boundary hard sigmoid (set_slope changes it later)
  DType dtype = DType::float32;
  Device device;
  std::uint64_t seed = 1;  ///< parameter initialisation (and tokens in time_training_step)
  CellMode mode = CellMode::mixed;
  /// Partials policy of the two mixed-mode broadcasts (ignored in reverse mode).
  dualcast::Partials partials = dualcast::Partials::automatic;
  /// Tests only (reference.py's soft=True): the boundary used as a multiplier is z~ = hard_sigm(s_z)
  /// itself instead of step(z~) with the straight-through estimator; the flags stay step(z~). This
  /// makes the loss differentiable (away from flag flips and the clamp's kinks), so finite
  /// differences can check every backward path, including the multiplier gradients.
  bool soft_boundary = false;
  /// The gate products of each layer through LayerGates (gates.hpp): one fused gate-input kernel per
  /// step and the weight gradient of all T steps as one product after the time loop (default).
  /// false: one matmul node per step and the flag products, concatenation, bias add and split as
  /// separate ops (the earlier form; kept to check that both give the same values and gradients).
  bool stacked_weight_grad = true;
  /// Mixed mode with stacked gates (needs stacked_weight_grad), partials not stored: each
  /// layer-step's gate split, cell and boundary detector run inside the gate node
  /// (LayerGates::cell_step: the functors HmCell and BoundarySte/BoundarySoft evaluated on numbers
  /// forward and on dual numbers backward), 3 kernels forward and 3 backward per layer and step
  /// instead of 5 and 5 (default). false: the gates as Vars and the cell and boundary as two library
  /// broadcasts (kept to check that both agree, and to time them: --unfused-cell).
  bool fused_cell = true;
  /// With fused_cell: each layer-step's cell kernel also writes the gate inputs of the layer-step
  /// after it (gates.hpp, NextInputs), so those run no gate-input kernel: 2 kernels forward per layer
  /// and step instead of 3 (default). false: each step packs its own (to check both agree, and to
  /// time them).
  bool cell_writes_next_inputs = true;
  /// bfloat16 or float16: loss() runs the forward under Autocast(autocast) (precision.hpp): every
  /// product rounds its operands to that dtype and sums in float32 (the gates: gates.hpp; the
  /// embedding and output layers: Autocast's matmul, their results cast back to float32), while the
  /// cells, states, losses, parameters and gradients stay float32. float32 (default): no Autocast.
  DType autocast = DType::float32;
};

/// Boundary statistics of the last loss() call, summed over time steps and batch rows, per layer
/// (index 0 = layer 1). flush + copy + update = T * B for each layer; z1 counts z^l_t = 1.
struct BoundaryStats {
  std::vector<std::int64_t> flush, copy, update, z1;
};

class HmlstmNetwork {
 public:
  explicit HmlstmNetwork(const NetworkConfig& config);

  /// Mean cross-entropy (nats) of the model over tokens [T+1, B] (float ids in [0, V); any float
  /// dtype and device: they are moved to the network's). Builds the graph: call backward() on the
  /// result to get every parameter's gradient. T and B are taken from the tokens (they need not equal
  /// config().seq / batch). Ids outside [0, V) are a dualcast::Error: checked on the host when the
  /// tokens live on the CPU; on a GPU only the targets are checked (by cross_entropy, one device
  /// synchronisation per call), and a bad input id gives a zero embedding row.
  Var loss(const Tensor& tokens);

  /// The 14 parameters in MODEL.md order: E, W1, U1, b1, Td1, W2, U2, b2, Td2, W3, U3, b3, Wout, bout.
  std::vector<Var>& params() { return params_; }
  [[nodiscard]] const std::vector<Var>& params() const { return params_; }
  /// Their names ("E", "W1", ...), same order.
  [[nodiscard]] std::vector<std::string> param_names() const;
  /// The parameter of that name; an unknown name is a dualcast::Error.
  Var& param(const std::string& name);

  /// Plain SGD (MODEL.md): p -= lr * dloss/dp for every parameter with a gradient, one fused kernel
  /// per parameter, then forgets the gradients (the next backward starts from zero).
  void sgd_step(float lr);
  /// Forgets every parameter's gradient.
  void zero_grad();
  /// Copies the parameter values of `other` (same hidden size and vocabulary; any device or dtype:
  /// values are converted) into this network's parameters, in place.
  void load_params_from(const HmlstmNetwork& other);

  [[nodiscard]] const NetworkConfig& config() const { return config_; }
  /// Changes the boundary slope a used by later loss() calls (slope annealing). The slope is a device
  /// scalar that the boundary kernels read: a new value takes effect at the next replay of a captured
  /// step too. A new value while a Graph captures on the network's device is a dualcast::Error.
  void set_slope(float slope);
  /// Switches the cell implementation used by later loss() calls.
  void set_mode(CellMode mode) { config_.mode = mode; }

  /// Branch and boundary counts of the last loss() call (reads the flags back to the host; costs a
  /// device synchronisation, so it is computed only when asked for).
  [[nodiscard]] BoundaryStats boundary_stats() const;
  /// The boundary decisions z^l_t (0/1) of the last loss(), in (t, l, row) order (reads them back).
  [[nodiscard]] std::vector<std::uint8_t> boundary_flags() const;
  /// min over the last loss()'s boundary decisions of |z~ - 0.5|: how far the nearest decision is from
  /// flipping. Meaningful with soft_boundary (in STE mode z is 0/1 and this returns 0.5).
  [[nodiscard]] double min_boundary_margin() const;

 private:
  NetworkConfig config_;
  std::vector<Var> params_;
  Tensor slope_;  // [1, 1]: config_.slope on the device, in the network's dtype
  std::unique_ptr<dualcast::optim::SGD> sgd_;
  // The flags of the last loss(): z^l_{t-1} and zb_l (undefined for layer 1) per (t, l).
  std::vector<Tensor> last_z_prev_, last_zb_, last_z_new_;
};

/// Random token ids [T+1, B], i.i.d. uniform in [0, V), float32 on the CPU (counter-based from seed).
Tensor random_tokens(int seq, int batch, int vocab, std::uint64_t seed);

/// Mixed mode against reverse mode on the same parameters (those of `config`'s seed) and tokens.
struct ModeComparison {
  double loss_mixed = 0.0, loss_reverse = 0.0;
  double loss_rel_err = 0.0;      ///< |mixed - reverse| / |reverse|
  double max_grad_rel_err = 0.0;  ///< max over parameters of max|g_m - g_r| / max|g_r|
  std::string worst_param;        ///< the parameter with the largest gradient error
  double tolerance = 0.0;         ///< what both errors were held to
  bool same_boundaries = true;    ///< whether both modes took the same FLUSH/COPY/UPDATE counts
  bool ok = false;
  std::string message;  ///< one line summary
};
/// tolerance <= 0 picks the default: 1e-3 for float32 (fp32 over T steps of BPTT; MODEL.md's
/// --rtol-model), 1e-10 for float64.
ModeComparison compare_modes(const NetworkConfig& config, const Tensor& tokens, double tolerance = 0.0);
/// A float32 tolerance `exact` widened for the products set_float32_matmul_precision asks for, or for
/// products under Autocast (`autocast` bfloat16 or float16): the two modes' inputs to a product
/// differ by float32 rounding, which "high" (TF32), "medium" and bfloat16 products amplify to their
/// own rounding (1e-2, 5e-2 and 5e-2; float16 1e-2: the PyTorch peers' model tolerances).
double float32_products_tolerance(double exact, DType autocast = DType::float32);

/// The float32 step's accuracy at one float32 matmul precision against the float64 step (issue 30's
/// accuracy study; accuracy.cpp).
struct PrecisionAccuracy {
  std::string precision;             ///< set_float32_matmul_precision's name: "highest", "high", "medium"
  double loss = 0.0;                 ///< the float32 step's loss (nats)
  double loss_rel_err = 0.0;         ///< |loss - loss64| / |loss64|
  double max_grad_rel_err = 0.0;     ///< max over parameters of max|g - g64| / max|g64|
  std::string worst_param;           ///< where that maximum is
  std::vector<std::pair<std::string, double>> grad_rel_err;  ///< (name, error) per parameter, params() order
  bool same_boundaries = true;       ///< whether every boundary decision equals the float64 step's
};
/// One float32 loss and backward of `config`'s network (its dtype is ignored) per precision in
/// `precisions`, each against one float64 step from the same parameters (the float32 initial values)
/// and tokens. The process's precision is restored afterwards; an unknown name is a dualcast::Error.
/// A boundary decision that rounds the other way at some precision changes the gradients by more
/// than rounding: same_boundaries says whether that happened.
std::vector<PrecisionAccuracy> precision_accuracy(const NetworkConfig& config, const Tensor& tokens,
                                                  const std::vector<std::string>& precisions);

// ---- the training step recorded once and replayed (captured.cu) ---------------------------------

/// One plain-SGD training step of `net` (forward over T steps, BPTT, update with learning rate lr)
/// recorded in a dualcast::Graph: run(tokens) copies the tokens [T+1, B] into the step's static input
/// (on the network's device) and replays. Each replay starts with zero_grad, so after it the
/// parameters' gradients are those of that step, and loss() its loss (a 0-d device tensor). The
/// network must outlive this object; its SGD optimizer is this object's own.
class CapturedStep {
 public:
  CapturedStep(HmlstmNetwork& net, std::int64_t seq, std::int64_t batch, float lr);
  void run(const Tensor& tokens);
  [[nodiscard]] const Tensor& loss() const { return loss_; }
  [[nodiscard]] dualcast::Graph& graph() { return graph_; }

 private:
  HmlstmNetwork& net_;
  std::unique_ptr<dualcast::optim::SGD> opt_;
  Tensor tokens_, loss_;
  dualcast::Graph graph_;
};

/// The captured step against the same step run eagerly, from the same parameters and tokens: loss,
/// every gradient, and every parameter after the update.
struct CaptureComparison {
  double loss_eager = 0.0, loss_graph = 0.0;
  double max_rel_err = 0.0;  ///< over the loss, the 14 gradients and the 14 updated parameters
  std::string worst;         ///< where the largest error is
  bool bitwise = false;      ///< every compared value identical
  double tolerance = 0.0;
  std::size_t graph_nodes = 0;
  bool ok = false;
  std::string message;
};
/// tolerance <= 0 picks the default: 1e-6 for float32, 1e-12 for float64 (the same kernels run in the
/// same order, so the results are expected to be identical).
CaptureComparison compare_capture(const NetworkConfig& config, const Tensor& tokens, float lr = 0.1f,
                                  double tolerance = 0.0);

struct StepTiming {
  double wall_ms_median = 0.0, wall_ms_p10 = 0.0, wall_ms_p90 = 0.0;
  double gpu_ms_median = 0.0;  ///< CUDA-event time of the step; NaN on the CPU (not measured)
  int reps = 0;
  double loss = 0.0;  ///< the step-0 loss (nats) at the initial parameters, on the first token batch
  double mode_rel_err = 0.0;  ///< max(loss, gradient) error of the mixed-vs-reverse validation
  bool captured = false;
  double capture_rel_err = 0.0;  ///< captured: compare_capture's error (captured vs eager)
  bool capture_bitwise = false;  ///< captured: whether compare_capture found identical values
  std::size_t graph_nodes = 0;   ///< captured: nodes of the recorded graph
};

/// Times one training step (forward over T steps, backward through time, SGD with lr = 0.1) of the
/// network `config` describes, in config.mode. Validates first: compare_modes on the first token
/// batch must pass (dualcast::Error otherwise, with its message), and with `captured` also
/// compare_capture. Then `warmup` untimed steps and `reps` timed ones, rotating 3 token batches.
/// captured = true times CapturedStep::run (a device-to-device copy of the tokens and one replay)
/// instead of the eager step. Each timed step starts from an idle device; wall time (std::chrono)
/// runs from before the forward to after a device synchronisation; on CUDA, events recorded around
/// the step give gpu_ms. The loss is read after the timed region.
StepTiming time_training_step(const NetworkConfig& config, int warmup, int reps, bool captured = false);

/// Writes workload e's validation data into `dir` (created if needed): e_tokens (int32 [T+1, B],
/// random_tokens(seq, batch, vocab, seed + 1000 + k)), the 14 parameters e_<name> (float32), scalars
/// e_loss (step-0 loss, nats), e_slope, e_H, e_B, e_T and e_gradnorm_<name>. The loss and gradients
/// are computed in config.mode and config.dtype at the float32-rounded parameters. k is the first of
/// 0..15 whose token batch gives the same boundary decisions in float32 and float64 (no decision
/// within rounding of 0.5, which another fp32 implementation could take the other way); extra
/// scalars e_token_seed and e_boundaries_fp64_agree record it. An existing manifest.json is merged:
/// its other entries are kept, e_* entries are replaced.
void write_validation(const std::string& dir, const NetworkConfig& config);

}  // namespace hmlstm
