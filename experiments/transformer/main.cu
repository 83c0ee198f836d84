// main.cu: transformer_experiment, the character-level transformer study (experiments/transformer/
// README.md). In one run: (1) validation: fused against composed attention in the whole model;
// (2) the training step timed (fused and composed attention; PyTorch eager and torch.compile with
// --peers, validated against dualcast's gradients first); (3) a training run with bits/char curves;
// (4) the HM-LSTM character model trained for the same training time on the same data, for a
// comparison of bits/char at equal time. Writes results.json, training.csv and a table.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "charlm.hpp"
#include "common/cli.hpp"
#include "common/json.hpp"
#include "common/report.hpp"
#include "common/text.hpp"
#include "driver_util.hpp"
#include "dualcast/error.hpp"
#include "network.hpp"
#include "train.hpp"

namespace {

using dcexp::json;
using namespace transformer;
using dcexp::fmt;
using dcexp::log_line;
using driver::positive;

constexpr const char* kUsage = R"(usage: transformer_experiment [options]

A decoder-only character transformer (GPT-2 style, pre-LN, causal) on the license texts, trained
with dualcast, timed against PyTorch, and compared with the HM-LSTM at equal training time.

Options:
  --device auto|cpu|cuda   where to run (default auto: the GPU when one is present)
  --layers N --heads N --width N --context N --batch N
                           model and batch (GPU default 4/4/256/128/64; CPU default 2/2/64/32/8)
  --steps N                training steps (GPU default 1000, CPU 60; 0 skips the training run)
  --log-every N            log interval (default steps / 20)
  --lr X --warmup N        Adam's peak learning rate (default 1e-3) and warm-up steps (default 100,
                           CPU 10); cosine decay to 10% after the warm-up
  --attention auto|fused|composed
                           attention of the training run (default auto: fused on the GPU)
  --step-reps N            timed training steps per variant (GPU default 20, CPU 3; 0 skips)
  --no-hmlstm              skip the HM-LSTM run at equal training time
  --hmlstm-hidden H --hmlstm-batch B --hmlstm-seq T
                           the HM-LSTM's shape (GPU default 512/64/100, CPU 32/8/16)
  --peers                  time PyTorch eager and torch.compile on the same step (peer_torch.py),
                           validated first against dualcast's loss and gradients
  --peer-methods LIST      default eager,compile
  --python PATH            interpreter for the peer (default: the first python3 with torch)
  --precision fp32|tf32|bf16|fp16
                           of the timed steps and the training run (default fp32: float32, TF32 off;
                           tf32: TF32 matmuls; bf16, fp16: the loss under Autocast, matmuls in the
                           16-bit dtype, attention, layer norm and the loss in float32, float32 Adam
                           weights; fp16 without loss scaling here: gradient clipping would need the
                           GradScaler's unscale_ first, not wired in yet). The
                           peer runs the same precision; the validations are always fp32
  --out DIR                output folder (default results/transformer)
  --help                   this text

Exit status: 0 done; 2 bad usage; 4 a validation failed; 1 any other error.
)";

struct Options {
  std::string device = "auto";
  int layers = -1, heads = -1, width = -1, context = -1, batch = -1;
  int steps = -1, log_every = -1, warmup = -1, step_reps = -1;
  double lr = 1e-3;
  std::string attention = "auto";
  bool hmlstm = true;
  int hm_hidden = -1, hm_batch = -1, hm_seq = -1;
  bool peers = false;
  std::string peer_methods = "eager,compile";
  std::string python;
  std::string out = "results/transformer";
  dcexp::Precision precision = dcexp::Precision::fp32;
};

Options parse(int argc, char** argv) {
  Options o;
  dcexp::cli::ArgWalker args(argc, argv);
  while (args.next()) {
    const std::string& a = args.option();
    auto num = [&](bool zero = false) { return static_cast<int>(positive(a, args.value(), zero)); };
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      std::exit(0);
    } else if (a == "--device") o.device = args.value();
    else if (a == "--layers") o.layers = num();
    else if (a == "--heads") o.heads = num();
    else if (a == "--width") o.width = num();
    else if (a == "--context") o.context = num();
    else if (a == "--batch") o.batch = num();
    else if (a == "--steps") o.steps = num(true);
    else if (a == "--log-every") o.log_every = num();
    else if (a == "--warmup") o.warmup = num(true);
    else if (a == "--step-reps") o.step_reps = num(true);
    else if (a == "--lr") o.lr = driver::positive_real(a, args.value());
    else if (a == "--attention") {
      o.attention = args.value();
      if (o.attention != "auto" && o.attention != "fused" && o.attention != "composed")
        throw dcexp::cli::UsageError("--attention: expected auto, fused or composed");
    } else if (a == "--no-hmlstm") {
      args.no_value();
      o.hmlstm = false;
    } else if (a == "--hmlstm-hidden") o.hm_hidden = num();
    else if (a == "--hmlstm-batch") o.hm_batch = num();
    else if (a == "--hmlstm-seq") o.hm_seq = num();
    else if (a == "--peers") {
      args.no_value();
      o.peers = true;
    } else if (a == "--peer-methods") o.peer_methods = args.value();
    else if (a == "--python") o.python = args.value();
    else if (a == "--out") o.out = args.value();
    else if (a == "--precision") o.precision = dcexp::cli::parse_precision(args.value());
    else throw dcexp::cli::UsageError("unknown option " + a + " (see --help)");
  }
  return o;
}

json log_json(const TrainLog& l) {
  json v = json::object();
  json st = json::array(), sec = json::array(), tr = json::array(), va = json::array();
  for (std::size_t i = 0; i < l.step.size(); ++i) {
    st.push_back(l.step[i]);
    sec.push_back(l.train_seconds[i]);
    tr.push_back(l.train_bpc[i]);
    va.push_back(l.valid_bpc[i]);
  }
  v["step"] = st;
  v["train_seconds"] = sec;
  v["train_bpc"] = tr;
  v["valid_bpc"] = va;
  v["train_seconds_total"] = l.train_seconds_total;
  v["ms_per_step"] = l.ms_per_step;
  v["parameters"] = static_cast<long long>(l.parameters);
  return v;
}

/// Linear interpolation of y(x) at x0 (clamped to the ends).
double interpolate(const std::vector<double>& x, const std::vector<double>& y, double x0) {
  if (x.empty()) return NAN;
  if (x0 <= x.front()) return y.front();
  for (std::size_t i = 1; i < x.size(); ++i)
    if (x0 <= x[i]) return y[i - 1] + (y[i] - y[i - 1]) * (x0 - x[i - 1]) / std::max(1e-12, x[i] - x[i - 1]);
  return y.back();
}

int run(const Options& o) {
  const dualcast::Device dev = driver::pick_device(o.device);
  const bool gpu = dev.is_cuda();
  TrainConfig cfg;
  cfg.model.layers = o.layers > 0 ? o.layers : (gpu ? 4 : 2);
  cfg.model.heads = o.heads > 0 ? o.heads : (gpu ? 4 : 2);
  cfg.model.width = o.width > 0 ? o.width : (gpu ? 256 : 64);
  cfg.model.context = o.context > 0 ? o.context : (gpu ? 128 : 32);
  cfg.model.device = dev;
  cfg.model.attention = o.attention == "fused" ? AttentionImpl::fused
                        : o.attention == "composed" ? AttentionImpl::composed : AttentionImpl::automatic;
  cfg.batch = o.batch > 0 ? o.batch : (gpu ? 64 : 8);
  cfg.steps = o.steps >= 0 ? o.steps : (gpu ? 1000 : 60);
  cfg.log_every = o.log_every > 0 ? o.log_every : std::max(1, cfg.steps / 20);
  cfg.warmup = o.warmup >= 0 ? o.warmup : (gpu ? 100 : 10);
  cfg.lr = o.lr;
  cfg.precision = o.precision;
  const int step_reps = o.step_reps >= 0 ? o.step_reps : (gpu ? 20 : 3);
  std::filesystem::create_directories(o.out);

  json root = json::object();
  json meta = json::object();
  meta["time"] = dcexp::iso_time();
  meta["device"] = dualcast::device_name(dev);
  meta["config"] = "layers " + std::to_string(cfg.model.layers) + " heads " + std::to_string(cfg.model.heads) +
                   " width " + std::to_string(cfg.model.width) + " context " + std::to_string(cfg.model.context) +
                   " batch " + std::to_string(cfg.batch) + ", " +
                   (o.precision == dcexp::Precision::fp32 ? std::string("float32") : dcexp::precision_name(o.precision)) +
                   ", Adam lr " + fmt("%g", cfg.lr);
  meta["precision"] = dcexp::precision_name(o.precision);
  meta["attention_impl"] = dualcast::attention_impl_name(
      cfg.model.attention == AttentionImpl::automatic ? (gpu ? AttentionImpl::fused : AttentionImpl::composed)
                                                      : cfg.model.attention);
  root["meta"] = meta;
  log_line("transformer_experiment on " + dualcast::device_name(dev) + ": " + meta.at("config").get<std::string>());

  // ---- 1. validation --------------------------------------------------------------------------
  if (gpu) {
    TrainConfig fp32 = cfg;  // fused against composed attention is judged in float32
    fp32.precision = dcexp::Precision::fp32;
    const ImplComparison c = compare_attention_impls(fp32);
    log_line("[validate] " + c.message);
    json v = json::object();
    v["fused_vs_composed"] = c.message;
    v["ok"] = c.ok;
    root["validation"] = v;
    if (!c.ok) {
      dcexp::write_json_file(o.out + "/results.json", root);
      std::cerr << "transformer_experiment: validation failed\n";
      return 4;
    }
  }

  // ---- 2. the training step, timed ---------------------------------------------------------------
  json steps = json::array();
  std::vector<std::pair<std::string, double>> table;
  if (step_reps > 0) {
    std::vector<std::pair<std::string, AttentionImpl>> variants{{"dualcast_fused", AttentionImpl::fused},
                                                                {"dualcast_composed", AttentionImpl::composed}};
    if (!gpu) variants.erase(variants.begin());
    for (const auto& [name, impl] : variants) {
      TrainConfig c = cfg;
      c.model.attention = impl;
      const StepTiming t = time_training_step(c, std::max(2, step_reps / 4), step_reps);
      json r = json::object();
      r["method"] = name;
      r["median_ms"] = t.ms_median;
      r["p10_ms"] = t.ms_p10;
      r["p90_ms"] = t.ms_p90;
      r["wall_ms"] = t.wall_ms_median;
      r["pipelined_ms"] = t.pipelined_ms;
      r["reps"] = t.reps;
      r["loss0"] = t.loss;
      steps.push_back(r);
      table.emplace_back(name, t.ms_median);
      log_line("[step] " + name + ": " + fmt("%.3f", t.ms_median) + " ms (p10 " + fmt("%.3f", t.ms_p10) + ", p90 " +
               fmt("%.3f", t.ms_p90) + ", pipelined " + fmt("%.3f", t.pipelined_ms) + ")");
    }
    if (o.peers) {
      const std::string valdir = o.out + "/validate";
      TrainConfig small = cfg;  // validation at a small size: the same code paths, small files
      small.model.layers = 2;
      small.model.width = 64;
      small.model.heads = 4;
      small.model.context = 32;
      small.batch = 4;
      write_validation(valdir, small);
      const std::string args =
          "step --valdir " + driver::shell_quote(valdir) + " --layers " + std::to_string(cfg.model.layers) +
          " --heads " + std::to_string(cfg.model.heads) + " --width " + std::to_string(cfg.model.width) +
          " --context " + std::to_string(cfg.model.context) + " --batch " + std::to_string(cfg.batch) +
          " --lr " + fmt("%g", cfg.lr) + " --methods " + driver::shell_quote(o.peer_methods) + " --reps " +
          std::to_string(step_reps) + (gpu ? "" : " --allow-cpu") +
          (o.precision == dcexp::Precision::fp32 ? "" : std::string(" --precision ") + dcexp::precision_name(o.precision));
      const json peer = driver::run_peer(o.python, args, o.out + "/peer_step.json");
      root["peers_raw"] = peer;
      using dcexp::member, dcexp::number_or, dcexp::string_or;
      if (const json& recs = member(peer, "records"); recs.is_array())
        for (const auto& r : recs) {
          steps.push_back(r);
          const std::string method = string_or(member(r, "method"));
          const double med = number_or(member(r, "median_ms"));
          if (member(r, "median_ms").is_number()) table.emplace_back("torch_" + method, med);
          log_line("[step] torch " + method + ": " + fmt("%.3f", med) + " ms, validated " +
                   (dcexp::bool_or(member(r, "validated")) ? "yes" : "NO") + " (" + string_or(member(r, "note")) + ")");
        }
    }
  }
  root["step_timing"] = steps;

  // ---- 3. training run -----------------------------------------------------------------------------
  TrainLog tl;
  if (cfg.steps > 0) {
    log_line("[train] " + std::to_string(cfg.steps) + " steps on " + cfg.corpus_dir);
    tl = train(cfg, [&](int step, double bpc) {
      log_line("  transformer step " + std::to_string(step) + ": " + fmt("%.4f", bpc) + " bits/char");
    });
    log_line("[train] " + fmt("%.1f", tl.train_seconds_total) + " s of training (" + fmt("%.2f", tl.ms_per_step) +
             " ms/step), valid " + fmt("%.4f", tl.valid_bpc.back()) + " bits/char");
  }

  // ---- 4. the HM-LSTM for the same training time ----------------------------------------------------
  hmlstm::TrainLog hl;
  bool have_hm = false;
  if (cfg.steps > 0 && o.hmlstm) {
    hmlstm::TrainConfig hc;
    hc.net.hidden = o.hm_hidden > 0 ? o.hm_hidden : (gpu ? 512 : 32);
    hc.net.batch = o.hm_batch > 0 ? o.hm_batch : (gpu ? 64 : 8);
    hc.net.seq = o.hm_seq > 0 ? o.hm_seq : (gpu ? 100 : 16);
    hc.net.device = dev;
    hc.net.mode = hmlstm::CellMode::mixed;
    // Calibrate its step time (a warm-up run, then a measured one), then give it the same time.
    hc.steps = 3;
    (void)hmlstm::train_charlm(hc);
    hc.steps = 12;
    const double ms = hmlstm::train_charlm(hc).ms_per_step;
    hc.steps = std::max(1, static_cast<int>(std::lround(1e3 * tl.train_seconds_total / ms)));
    hc.log_every = std::max(1, hc.steps / 15);
    log_line("[hmlstm] H=" + std::to_string(hc.net.hidden) + " B=" + std::to_string(hc.net.batch) + " T=" +
             std::to_string(hc.net.seq) + ": " + fmt("%.2f", ms) + " ms/step -> " + std::to_string(hc.steps) +
             " steps for " + fmt("%.1f", tl.train_seconds_total) + " s");
    hl = hmlstm::train_charlm(hc, [&](int step, double bpc) {
      log_line("  hmlstm step " + std::to_string(step) + ": " + fmt("%.4f", bpc) + " bits/char");
    });
    have_hm = true;
  }

  // ---- results --------------------------------------------------------------------------------------
  json training = json::object();
  std::ofstream csv(o.out + "/training.csv");
  csv.precision(9);
  csv << "model,step,train_seconds,train_bpc,valid_bpc\n";
  if (cfg.steps > 0) {
    training["transformer"] = log_json(tl);
    for (std::size_t i = 0; i < tl.step.size(); ++i)
      csv << "transformer," << tl.step[i] << "," << tl.train_seconds[i] << "," << tl.train_bpc[i] << ","
          << tl.valid_bpc[i] << "\n";
  }
  if (have_hm) {
    json h = json::object();
    json st = json::array(), sec = json::array(), tr = json::array(), va = json::array();
    std::vector<double> hsec;
    for (std::size_t i = 0; i < hl.step.size(); ++i) {
      const double s = hl.step[i] * hl.ms_per_step * 1e-3;  // steps take equal time: seconds at the entry
      hsec.push_back(s);
      st.push_back(hl.step[i]);
      sec.push_back(s);
      tr.push_back(hl.train_bpc[i]);
      va.push_back(hl.valid_bpc[i]);
      csv << "hmlstm," << hl.step[i] << "," << s << "," << hl.train_bpc[i] << "," << hl.valid_bpc[i] << "\n";
    }
    h["step"] = st;
    h["train_seconds"] = sec;
    h["train_bpc"] = tr;
    h["valid_bpc"] = va;
    h["train_seconds_total"] = hl.train_seconds;
    h["ms_per_step"] = hl.ms_per_step;
    training["hmlstm"] = h;
    const double t_eq = std::min(hl.train_seconds, tl.train_seconds_total);
    json cmp = json::object();
    cmp["equal_time_seconds"] = t_eq;
    cmp["transformer_valid_bpc"] = interpolate(tl.train_seconds, tl.valid_bpc, t_eq);
    cmp["hmlstm_valid_bpc"] = interpolate(hsec, hl.valid_bpc, t_eq);
    cmp["transformer_best_valid_bpc"] = *std::min_element(tl.valid_bpc.begin(), tl.valid_bpc.end());
    cmp["hmlstm_best_valid_bpc"] = *std::min_element(hl.valid_bpc.begin(), hl.valid_bpc.end());
    cmp["transformer_steps"] = cfg.steps;
    cmp["hmlstm_steps"] = hl.step.empty() ? 0 : hl.step.back();
    training["equal_time"] = cmp;
  }
  root["training"] = training;
  dcexp::write_json_file(o.out + "/results.json", root);

  std::cout << "\ntransformer_experiment (" << meta.at("device").get<std::string>() << ", "
            << meta.at("config").get<std::string>() << ")\n";
  if (!table.empty()) {
    std::cout << "training step (forward, backward, Adam), median ms:\n";
    for (const auto& [name, ms] : table) std::cout << "  " << name << std::string(22 - std::min<std::size_t>(21, name.size()), ' ') << fmt("%9.3f", ms) << "\n";
  }
  if (cfg.steps > 0)
    std::cout << "transformer: " << cfg.steps << " steps, " << fmt("%.1f", tl.train_seconds_total)
              << " s of training, valid bits/char " << fmt("%.4f", tl.valid_bpc.front()) << " -> "
              << fmt("%.4f", tl.valid_bpc.back()) << "\n";
  if (have_hm) {
    const auto& cmp = training.at("equal_time");
    std::cout << "HM-LSTM:     " << cmp.at("hmlstm_steps").get<double>() << " steps, " << fmt("%.1f", hl.train_seconds)
              << " s of training, valid bits/char " << fmt("%.4f", hl.valid_bpc.front()) << " -> "
              << fmt("%.4f", hl.valid_bpc.back()) << "\n"
              << "at equal training time (" << fmt("%.1f", cmp.at("equal_time_seconds").get<double>())
              << " s): transformer " << fmt("%.4f", cmp.at("transformer_valid_bpc").get<double>()) << ", HM-LSTM "
              << fmt("%.4f", cmp.at("hmlstm_valid_bpc").get<double>()) << " bits/char (validation; best along the way "
              << fmt("%.4f", cmp.at("transformer_best_valid_bpc").get<double>()) << " and "
              << fmt("%.4f", cmp.at("hmlstm_best_valid_bpc").get<double>()) << ")\n";
  }
  std::cout << "wrote " << o.out << "/results.json, " << o.out << "/training.csv\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return dcexp::cli::report_errors("transformer_experiment", [&] { return run(parse(argc, argv)); });
}
