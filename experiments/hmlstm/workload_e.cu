// workload_e.cu: workload e of hmlstm_experiment (driver.hpp): the 3-layer HM-LSTM character model's
// training step timed in mixed and reverse mode, eager and captured (validated first), then a short
// character-LM training run in both modes whose bits/char curves must fall and agree, and the mixed
// run once more replayed from a capture (its curve must equal the eager one).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "dualcast/error.hpp"
#include "driver.hpp"

#if DCEXP_HAVE_NETWORK
#include "charlm.hpp"
#include "network.hpp"
#include "train_log_json.hpp"
#endif

namespace hmdriver {

WorkloadE run_workload_e(const Options& o, dualcast::Device device, Results& res, const Elapsed& elapsed) {
  WorkloadE r;
#if DCEXP_HAVE_NETWORK
  hmlstm::NetworkConfig cfg;
  cfg.hidden = o.e_hidden;
  cfg.batch = o.e_batch;
  cfg.seq = o.e_seq;
  cfg.vocab = 64;
  cfg.device = device;
  cfg.fused_cell = o.fused_cell;
  // --precision bf16 / fp16: the model's products under Autocast (operands rounded to 16 bits, float32
  // sums; gates.hpp), everything else float32: what the peers run at that precision (torch.autocast,
  // JAX's "bfloat16" matmul precision).
  if (dualcast::is_half(cell_dtype(o))) cfg.autocast = cell_dtype(o);
  r.variant = "H=" + std::to_string(cfg.hidden) + " B=" + std::to_string(cfg.batch) + " T=" + std::to_string(cfg.seq);
  std::vector<std::pair<hmlstm::CellMode, bool>> e_methods{{hmlstm::CellMode::mixed, false},
                                                           {hmlstm::CellMode::reverse, false}};
  if (o.graphs) {
    e_methods.emplace_back(hmlstm::CellMode::mixed, true);
    e_methods.emplace_back(hmlstm::CellMode::reverse, true);
  }
  for (const auto& [mode, captured] : e_methods) {
    cfg.mode = mode;
    const std::string method = std::string(hmlstm::cell_mode_name(mode)) + (captured ? "_graph" : "");
    log_line("[e] training step " + method + " " + r.variant + " (" + elapsed() + ")");
    hmlstm::StepTiming st;
    try {
      st = hmlstm::time_training_step(cfg, std::max(1, o.warmup / 5), o.e_reps, captured);
    } catch (const dualcast::Error& e) {
      const std::string what = e.what();
      if (what.find("validation failed") != std::string::npos)
        throw ExperimentError(std::string("VALIDATION FAILED: workload e: ") + what, 4);
      throw;
    }
    Measurement m;
    m.workload = "e";
    m.variant = r.variant;
    m.dims = cfg.hidden;
    m.method = method;
    m.policy = mode == hmlstm::CellMode::mixed ? "automatic" : "";
    if (captured) m.kernels_per_step = static_cast<int>(st.graph_nodes);
    m.times.reps = st.reps;
    m.times.wall_ms.median = st.wall_ms_median;
    m.times.wall_ms.p10 = st.wall_ms_p10;
    m.times.wall_ms.p90 = st.wall_ms_p90;
    m.times.wall_ms.n = st.reps;
    if (std::isfinite(st.gpu_ms_median)) {
      m.times.gpu_ms.median = st.gpu_ms_median;
      m.times.gpu_ms.n = st.reps;
    }
    m.floor_ms = 0;
    m.validated = true;
    m.max_rel_err = st.mode_rel_err;
    m.note = "step-0 loss " + fmt("%.6f", st.loss) + " nats; SGD lr 0.1" +
             (dualcast::is_half(cfg.autocast) ? std::string("; products under Autocast ") + dualcast::dtype_name(cfg.autocast)
                                              : std::string());
    if (captured) {
      m.max_rel_err = std::max(st.mode_rel_err, st.capture_rel_err);
      m.note += "; captured step (" + std::to_string(st.graph_nodes) + " graph nodes) vs eager: " +
                (st.capture_bitwise ? std::string("identical") : "max rel err " + fmt("%.1e", st.capture_rel_err));
    }
    log_line("  e " + r.variant + " " + m.method + " median " + fmt("%.3f", m.median_ms()) + " ms/step (wall " +
             fmt("%.3f", st.wall_ms_median) + "), validated (mixed vs reverse err " + fmt("%.1e", st.mode_rel_err) +
             (captured ? std::string(st.capture_bitwise ? "; captured == eager bit for bit"
                                                        : "; captured vs eager err " + fmt("%.1e", st.capture_rel_err))
                       : std::string()) +
             ")");
    res.add(device, {m});
  }
  if (o.e_accuracy) {
    // Mixed mode, the flagship; the tokens are the timing's kind (random ids), a seed of their own.
    hmlstm::NetworkConfig ca = cfg;
    ca.mode = hmlstm::CellMode::mixed;
    ca.autocast = dualcast::DType::float32;  // the study compares float32 matmul precisions
    log_line("[e] accuracy: the float32 step at each matmul precision against the float64 step, " + r.variant + " (" +
             elapsed() + ")");
    const auto acc = hmlstm::precision_accuracy(ca, hmlstm::random_tokens(ca.seq, ca.batch, ca.vocab, 11),
                                                {"highest", "high", "medium"});
    for (const hmlstm::PrecisionAccuracy& a : acc) {
      json per = json::object();
      for (const auto& [name, err] : a.grad_rel_err) per[name] = err;
      r.accuracy[a.precision] = {{"loss", a.loss},
                                 {"loss_rel_err", a.loss_rel_err},
                                 {"max_grad_rel_err", a.max_grad_rel_err},
                                 {"worst_param", a.worst_param},
                                 {"grad_rel_err", per},
                                 {"same_boundaries", a.same_boundaries}};
      log_line("  e accuracy \"" + a.precision + "\": loss rel err " + fmt("%.2e", a.loss_rel_err) +
               ", worst gradient rel err " + fmt("%.2e", a.max_grad_rel_err) + " (" + a.worst_param + ")" +
               (a.same_boundaries ? ", every boundary decision as in float64"
                                  : ", SOME boundary decisions differ from float64's"));
    }
  }
  if (o.train_steps > 0) {
    hmlstm::TrainConfig tc;
    tc.net = cfg;
    tc.net.mode = hmlstm::CellMode::mixed;
    tc.steps = o.train_steps;
    tc.net.seed = static_cast<std::uint64_t>(o.train_seed);
    tc.data_seed = static_cast<std::uint64_t>(6 + o.train_seed);
    tc.log_every = std::max(1, o.train_steps / 12);
    log_line("[e] character-LM training, " + std::to_string(tc.steps) + " steps per mode, " + r.variant +
             ", corpus " + tc.corpus_dir + " (" + elapsed() + ")");
    std::string cur_mode = "mixed";
    int last_step = -1;
    auto progress = [&](int step, double bpc) {
      if (step < last_step) cur_mode = "reverse";
      last_step = step;
      log_line("  train " + cur_mode + " step " + std::to_string(step) + ": " + fmt("%.4f", bpc) + " bits/char");
    };
    const hmlstm::CurveComparison cc = hmlstm::compare_charlm_modes(tc, 0.0, progress);
    const auto log_json = hmlstm::train_log_json;
    r.training["config"] = r.variant + " steps=" + std::to_string(tc.steps) + " seed " + std::to_string(o.train_seed) +
                         " Adam lr " + fmt("%g", tc.lr) +
                         " slope " + fmt("%g", tc.net.slope) + "->" + fmt("%g", tc.slope_final);
    r.training["mixed"] = log_json(cc.mixed);
    r.training["reverse"] = log_json(cc.reverse);
    r.training["max_abs_diff_bpc"] = cc.max_abs_diff_bpc;
    r.training["tolerance_bpc"] = cc.tolerance;
    r.training["parted_at_step"] = cc.parted_at_step;
    r.training["max_rel_diff_after_parting"] = cc.max_rel_diff_after;
    r.training["drift_rtol"] = cc.drift_rtol;
    r.training["curves_agree"] = cc.ok;
    r.training["message"] = cc.message;
    auto falling = [](const hmlstm::TrainLog& l) {
      return l.train_bpc.size() >= 2 && l.train_bpc.back() < l.train_bpc.front();
    };
    r.training["bpc_falls"] = falling(cc.mixed) && falling(cc.reverse);
    r.training_ok = cc.ok && falling(cc.mixed) && falling(cc.reverse);
    hmlstm::TrainLog graph_log;
    if (o.graphs) {
      // The mixed-mode run again, its step recorded once and replayed: the same curve.
      hmlstm::TrainConfig tg = tc;
      tg.captured = true;
      log_line("[e] character-LM training replayed from a capture (mixed), " + std::to_string(tc.steps) +
               " steps (" + elapsed() + ")");
      cur_mode = "mixed_graph";
      last_step = -1;
      graph_log = hmlstm::train_charlm(tg, progress);
      const hmlstm::CaptureCurveComparison gc = hmlstm::compare_capture_curves(cc.mixed, graph_log);
      r.training["mixed_graph"] = log_json(graph_log);
      r.training["capture_max_abs_diff_bpc"] = gc.max_abs_diff_bpc;
      r.training["capture_bitwise"] = gc.bitwise;
      r.training["capture_curves_equal"] = gc.ok;
      r.training["capture_message"] = gc.message;
      log_line("  " + gc.message);
      r.training_ok = r.training_ok && gc.ok;
    }
    // training.csv for plotting
    std::ofstream tcsv(o.out + "/training.csv");
    tcsv.precision(9);
    tcsv << "mode,step,train_bpc,valid_bpc,slope\n";
    for (const hmlstm::TrainLog* l : {&cc.mixed, &cc.reverse, static_cast<const hmlstm::TrainLog*>(&graph_log)})
      for (std::size_t j = 0; j < l->step.size(); ++j)
        tcsv << (l == &cc.mixed ? "mixed" : l == &cc.reverse ? "reverse" : "mixed_graph") << "," << l->step[j] << "," << l->train_bpc[j] << ","
             << (j < l->valid_bpc.size() ? l->valid_bpc[j] : NAN) << "," << (j < l->slope.size() ? l->slope[j] : NAN) << "\n";
  }
#else
  log_line("[e] skipped: this build has no hmlstm_network library (experiments/hmlstm/network.cu missing)");
#endif
  return r;
}

}  // namespace hmdriver
