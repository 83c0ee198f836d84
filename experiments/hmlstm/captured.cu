// captured.cu: the HM-LSTM training step recorded once and replayed (CapturedStep), its validation
// against the eager step (compare_capture), and the timing of one training step, eager or captured
// (time_training_step). See network.hpp.
//
// Compiled by nvcc in CUDA builds and as plain C++ otherwise; CUDA-only code (event timing) is
// guarded by __CUDACC__.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <sstream>
#include <vector>

#include "dualcast/error.hpp"
#include "dualcast/graph.hpp"
#include "network.hpp"

#if defined(__CUDACC__)
#include <cuda_runtime_api.h>
#endif

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
    const double e = array_rel_err(got, want);
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
double percentile(std::vector<double> v, double q) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const std::size_t lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}
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
  for (int k = 0; k < warmup; ++k) step(k);
  synchronize(config.device);

  std::vector<double> wall, gpu;
#if defined(__CUDACC__)
  cudaEvent_t ev0 = nullptr, ev1 = nullptr;
  std::unique_ptr<detail::DeviceGuard> guard;
  if (config.device.is_cuda()) {
    guard = std::make_unique<detail::DeviceGuard>(config.device);
    DUALCAST_CUDA_CHECK(cudaEventCreate(&ev0));
    DUALCAST_CUDA_CHECK(cudaEventCreate(&ev1));
  }
#endif
  for (int k = 0; k < reps; ++k) {
    synchronize(config.device);
    const auto t0 = std::chrono::steady_clock::now();
#if defined(__CUDACC__)
    if (config.device.is_cuda()) DUALCAST_CUDA_CHECK(cudaEventRecord(ev0, 0));
#endif
    step(warmup + k);
#if defined(__CUDACC__)
    if (config.device.is_cuda()) DUALCAST_CUDA_CHECK(cudaEventRecord(ev1, 0));
#endif
    synchronize(config.device);
    const auto t1 = std::chrono::steady_clock::now();
    wall.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
#if defined(__CUDACC__)
    if (config.device.is_cuda()) {
      float ms = 0.0f;
      DUALCAST_CUDA_CHECK(cudaEventElapsedTime(&ms, ev0, ev1));
      gpu.push_back(ms);
    }
#endif
  }
#if defined(__CUDACC__)
  if (ev0) cudaEventDestroy(ev0);
  if (ev1) cudaEventDestroy(ev1);
#endif
  timing.reps = reps;
  timing.wall_ms_median = percentile(wall, 0.5);
  timing.wall_ms_p10 = percentile(wall, 0.1);
  timing.wall_ms_p90 = percentile(wall, 0.9);
  timing.gpu_ms_median = gpu.empty() ? std::numeric_limits<double>::quiet_NaN() : percentile(gpu, 0.5);
  return timing;
}

}  // namespace hmlstm
