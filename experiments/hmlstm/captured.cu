// captured.cu: the HM-LSTM training step recorded once and replayed (CapturedStep), its validation
// against the eager step (compare_capture), and the timing of one training step, eager or captured
// (time_training_step). See network.hpp.
//
// Compiled by nvcc in CUDA builds and as plain C++ otherwise; the timing (CUDA events or the host
// clock) is gpu_timing.hpp's.
#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>
#include <vector>

#include "dualcast/error.hpp"
#include "dualcast/gradcheck.hpp"
#include "dualcast/graph.hpp"
#include "network.hpp"
#include "../common/gpu_timing.hpp"

namespace hmlstm {

using namespace dualcast;

// =================================================================================================
// CapturedStep
// =================================================================================================

CapturedStep::CapturedStep(HmlstmNetwork& net, std::int64_t seq, std::int64_t batch, float lr)
    : net_(net) {
  const Device d = net.config().device;
  // Everything the step reads or writes across replays exists before the capture.
  opt_ = std::make_unique<optim::SGD>(net.params(), lr);
  tokens_ = Tensor::zeros({seq + 1, batch}, DType::float32, d);
  loss_ = Tensor::zeros({}, net.config().dtype, d);
  graph_.capture(d, [this] {
    net_.zero_grad();
    Var l = net_.loss(tokens_);
    l.backward();
    opt_->step();
    loss_.copy_(l.value());
  });
}

void CapturedStep::run(const Tensor& tokens) {
  DUALCAST_CHECK(tokens.shape() == tokens_.shape(), "CapturedStep::run: tokens of shape ",
                 tokens.shape().str(), " but the step was captured for ", tokens_.shape().str());
  tokens_.copy_(tokens.dtype() == DType::float32 ? tokens : tokens.to(DType::float32));
  graph_.replay();
}

// =================================================================================================
// compare_capture
// =================================================================================================

CaptureComparison compare_capture(const NetworkConfig& config, const Tensor& tokens_in, float lr,
                                  double tolerance) {
  CaptureComparison r;
  r.tolerance = tolerance > 0 ? tolerance : (config.dtype == DType::float64 ? 1e-12 : 1e-6);
  const Tensor tokens = tokens_in.to(config.device).to(DType::float32);
  HmlstmNetwork eager(config), graphed(config);
  graphed.load_params_from(eager);
  // The eager step first: every kernel and cuBLAS configuration the capture records has then run
  // once (what PyTorch's warm-up before capture achieves).
  Var le = eager.loss(tokens);
  le.backward();
  r.loss_eager = le.item();
  CapturedStep step(graphed, tokens.shape()[0] - 1, tokens.shape()[1], lr);
  r.graph_nodes = step.graph().num_nodes();
  step.run(tokens);
  r.loss_graph = step.loss().item();
  r.bitwise = r.loss_eager == r.loss_graph;
  r.max_rel_err = std::fabs(r.loss_eager - r.loss_graph) / std::max(std::fabs(r.loss_eager), 1e-300);
  if (!std::isfinite(r.loss_graph)) r.max_rel_err = INFINITY;
  r.worst = "loss";
  const auto names = eager.param_names();
  auto consider = [&](const Tensor& got, const Tensor& want, const std::string& what) {
    const double e = dualcast::array_error(got, want, dualcast::ErrorScale::largest);
    if (!(e <= r.max_rel_err)) {
      r.max_rel_err = std::isnan(e) ? INFINITY : e;
      r.worst = what;
    }
    r.bitwise = r.bitwise && got.to_vector<double>() == want.to_vector<double>();
  };
  for (std::size_t k = 0; k < names.size(); ++k) {
    const Var& pe = eager.params()[k];
    const Var& pg = graphed.params()[k];
    if (pe.has_grad() != pg.has_grad()) {
      r.max_rel_err = INFINITY;
      r.worst = "gradient of " + names[k] + " (exists in one run only)";
      r.bitwise = false;
    } else if (pe.has_grad()) {
      consider(pg.grad(), pe.grad(), "gradient of " + names[k]);
    }
  }
  eager.sgd_step(lr);
  for (std::size_t k = 0; k < names.size(); ++k)
    consider(graphed.params()[k].value(), eager.params()[k].value(), "updated " + names[k]);
  r.ok = r.max_rel_err <= r.tolerance;
  std::ostringstream os;
  os << "captured vs eager step (" << cell_mode_name(config.mode) << ", H=" << config.hidden
     << " B=" << tokens.shape()[1] << " T=" << tokens.shape()[0] - 1 << " "
     << dtype_name(config.dtype) << " " << config.device.str() << ", " << r.graph_nodes
     << " graph nodes): loss " << r.loss_graph << " vs " << r.loss_eager << ", "
     << (r.bitwise ? "bit for bit identical (loss, gradients, updated parameters)"
                   : "max rel err " + std::to_string(r.max_rel_err) + " (" + r.worst + ")")
     << ", tolerance " << r.tolerance << (r.ok ? ": ok" : ": FAILED");
  r.message = os.str();
  return r;
}

// =================================================================================================
// timing
// =================================================================================================

namespace {
constexpr float kTimingLr = 0.1f;  // MODEL.md's timing default
}  // namespace

StepTiming time_training_step(const NetworkConfig& config, int warmup, int reps, bool captured) {
  DUALCAST_CHECK(warmup >= 0 && reps >= 1, "time_training_step: warmup >= 0 and reps >= 1 required");
  std::vector<Tensor> batches;
  for (int k = 0; k < 3; ++k)
    batches.push_back(random_tokens(config.seq, config.batch, config.vocab, config.seed + 1000 + k)
                          .to(config.device));

  StepTiming timing;
  timing.captured = captured;
  {
    const ModeComparison cmp = compare_modes(config, batches[0]);
    DUALCAST_CHECK(cmp.ok, "time_training_step: validation failed: ", cmp.message);
    timing.mode_rel_err = std::max(cmp.loss_rel_err, cmp.max_grad_rel_err);
    timing.loss = config.mode == CellMode::mixed ? cmp.loss_mixed : cmp.loss_reverse;
  }
  if (captured) {
    const CaptureComparison cc = compare_capture(config, batches[0], kTimingLr);
    DUALCAST_CHECK(cc.ok, "time_training_step: validation failed: ", cc.message);
    timing.capture_rel_err = cc.max_rel_err;
    timing.capture_bitwise = cc.bitwise;
  }

  HmlstmNetwork net(config);
  std::unique_ptr<CapturedStep> graph_step;
  if (captured) {
    graph_step = std::make_unique<CapturedStep>(net, config.seq, config.batch, kTimingLr);
    timing.graph_nodes = graph_step->graph().num_nodes();
  }
  auto step = [&](int k) {
    const Tensor& batch = batches[static_cast<std::size_t>(k % 3)];
    if (graph_step) {
      graph_step->run(batch);
      return;
    }
    Var l = net.loss(batch);
    l.backward();
    net.sgd_step(kTimingLr);
  };
  detail::DeviceGuard guard(config.device);  // the events on the network's device
  const dcexp::StepTimes t = dcexp::time_steps(config.device, [](int) {}, step, warmup, dcexp::after_reps(reps),
                                               /*pipelined=*/false, dcexp::EventStream::legacy);
  timing.reps = t.reps;
  timing.wall_ms_median = t.wall_ms.median;
  timing.wall_ms_p10 = t.wall_ms.p10;
  timing.wall_ms_p90 = t.wall_ms.p90;
  timing.gpu_ms_median = t.gpu_ms.median;  // NaN on the CPU
  return timing;
}

}  // namespace hmlstm
