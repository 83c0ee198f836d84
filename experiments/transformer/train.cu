// train.cu: training, step timing and validation of the character-level transformer (train.hpp).
#include "train.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>

#include "charlm.hpp"
#include "common/json.hpp"
#include "dualcast/error.hpp"
#include "dualcast/memory.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "dualcast/ops/reduce.hpp"
#include "dualcast/optim.hpp"
#include "dualcast/tape.hpp"

#include "common/gpu_timing.hpp"

namespace transformer {

using namespace dualcast;

namespace {

constexpr double kLn2 = 0.69314718055994530942;

void check_config(const TrainConfig& cfg) {
  DUALCAST_CHECK(cfg.model.vocab == hmlstm::kCharVocab, "transformer: vocab must be ", hmlstm::kCharVocab,
                 " (charlm's), got ", cfg.model.vocab);
  DUALCAST_CHECK(cfg.batch >= 1 && cfg.steps >= 0 && cfg.log_every >= 1 && cfg.valid_batches >= 1,
                 "transformer: batch >= 1, steps >= 0, log_every >= 1 and valid_batches >= 1 required");
  DUALCAST_CHECK(cfg.lr > 0.0 && std::isfinite(cfg.lr), "transformer: lr must be positive");
}

/// Warm-up then cosine decay to lr * min_lr_ratio.
double lr_at(const TrainConfig& cfg, int step) {
  if (step < cfg.warmup) return cfg.lr * (step + 1) / std::max(1, cfg.warmup);
  const double span = std::max(1, cfg.steps - cfg.warmup);
  const double t = std::min(1.0, (step - cfg.warmup) / span);
  return cfg.lr * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + std::cos(t * 3.14159265358979323846)));
}

/// The training batches of the corpus, as charlm samples them ([T+1, B] on the model's device).
struct Batches {
  hmlstm::CharCorpus corpus;
  const TrainConfig& cfg;
  explicit Batches(const TrainConfig& c)
      : corpus(hmlstm::load_char_corpus(c.corpus_dir, c.valid_fraction)), cfg(c) {
    DUALCAST_CHECK(static_cast<std::int64_t>(corpus.train.size()) > cfg.model.context + 1,
                   "transformer: the training split (", corpus.train.size(), " chars) is shorter than one window");
  }
  [[nodiscard]] Tensor train(int step) const {
    const int T = cfg.model.context;
    return hmlstm::window_batch(corpus.train,
                                hmlstm::train_offsets(static_cast<std::int64_t>(corpus.train.size()), T,
                                                      cfg.batch, cfg.data_seed, step),
                                T)
        .to(cfg.model.device);
  }
};

}  // namespace

TrainLog train(const TrainConfig& cfg, const std::function<void(int, double)>& progress) {
  const dcexp::PrecisionScope precision(cfg.precision);
  check_config(cfg);
  const auto t_start = std::chrono::steady_clock::now();
  const Batches data(cfg);
  std::vector<Tensor> valid =
      hmlstm::validation_batches(data.corpus.valid, cfg.model.context, cfg.batch, cfg.valid_batches);
  for (Tensor& v : valid) v = v.to(cfg.model.device);

  Transformer model(cfg.model);
  optim::Adam opt(model.params(), cfg.lr);
  TrainLog log;
  log.parameters = model.parameter_count();
  auto evaluate = [&] {
    NoGradGuard no_grad;
    double s = 0.0;
    for (const Tensor& v : valid) s += dcexp::autocast_forward(cfg.precision, [&] { return model.loss(v); }).item();
    return s / static_cast<double>(valid.size()) / kLn2;
  };
  double train_seconds = 0.0;
  auto record = [&](int step, double train_bpc) {
    log.step.push_back(step);
    log.train_seconds.push_back(train_seconds);
    log.train_bpc.push_back(train_bpc);
    log.valid_bpc.push_back(evaluate());
    if (progress) progress(step, train_bpc);
  };
  {
    NoGradGuard no_grad;
    record(0, dcexp::autocast_forward(cfg.precision, [&] { return model.loss(data.train(0)); }).item() / kLn2);
  }
  double loss_acc = 0.0;
  int since = 0;
  for (int step = 0; step < cfg.steps; ++step) {
    const Tensor batch = data.train(step);  // host work outside the timed region
    synchronize(cfg.model.device);
    const auto t0 = std::chrono::steady_clock::now();
    opt.set_lr(lr_at(cfg, step));
    Var loss = dcexp::autocast_forward(cfg.precision, [&] { return model.loss(batch); });
    loss.backward();
    hmlstm::clip_grad_norm(model.params(), cfg.clip_norm);
    opt.step();
    opt.zero_grad();
    const double l = loss.item();  // waits for the device
    train_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    DUALCAST_CHECK(std::isfinite(l), "transformer: non-finite training loss at step ", step);
    loss_acc += l;
    ++since;
    if ((step + 1) % cfg.log_every == 0 || step + 1 == cfg.steps) {
      record(step + 1, loss_acc / since / kLn2);
      loss_acc = 0.0;
      since = 0;
    }
  }
  log.train_seconds_total = train_seconds;
  log.ms_per_step = cfg.steps > 0 ? 1e3 * train_seconds / cfg.steps : 0.0;
  log.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return log;
}

StepTiming time_training_step(const TrainConfig& cfg, int warmup, int reps) {
  const dcexp::PrecisionScope precision(cfg.precision);
  check_config(cfg);
  const Batches data(cfg);
  Transformer model(cfg.model);
  optim::Adam opt(model.params(), cfg.lr);
  const std::vector<Tensor> sets{data.train(0), data.train(1), data.train(2)};
  StepTiming out;
  {
    NoGradGuard no_grad;
    out.loss = dcexp::autocast_forward(cfg.precision, [&] { return model.loss(sets[0]); }).item();
  }
  auto prepare = [&](int) { opt.zero_grad(); };
  // No gradient clipping here: dualcast's clip_grad_norm reads each norm back to the host, and the
  // PyTorch peer's timed step is forward, backward and the Adam update too.
  auto step = [&](int r) {
    Var loss = dcexp::autocast_forward(cfg.precision,
                                       [&] { return model.loss(sets[static_cast<std::size_t>(r) % sets.size()]); });
    loss.backward();
    opt.step();
  };
  const dcexp::StepTimes t = dcexp::time_steps(cfg.model.device, prepare, step, warmup, reps);
  const dcexp::Summary& s = t.primary();
  out.ms_median = s.median;
  out.ms_p10 = s.p10;
  out.ms_p90 = s.p90;
  out.wall_ms_median = t.wall_ms.median;
  out.pipelined_ms = t.pipelined_ms;
  out.reps = reps;
  return out;
}

ImplComparison compare_attention_impls(const TrainConfig& cfg) {
  check_config(cfg);
  const Batches data(cfg);
  TransformerConfig mc = cfg.model;
  mc.attention = AttentionImpl::fused;
  Transformer fused(mc);
  mc.attention = AttentionImpl::composed;
  Transformer composed(mc);  // the same seed: the same parameters
  const Tensor batch = data.train(0);
  Var lf = fused.loss(batch), lc = composed.loss(batch);
  lf.backward();
  lc.backward();
  ImplComparison r;
  r.loss_fused = lf.item();
  r.loss_composed = lc.item();
  for (std::size_t i = 0; i < fused.params().size(); ++i) {
    const auto gf = fused.params()[i].grad().to_vector<double>();
    const auto gc = composed.params()[i].grad().to_vector<double>();
    double diff = 0.0, scale = 0.0;
    for (std::size_t j = 0; j < gf.size(); ++j) {
      diff = std::max(diff, std::fabs(gf[j] - gc[j]));
      scale = std::max(scale, std::fabs(gc[j]));
    }
    const double e = scale > 0 ? diff / scale : diff;
    if (!(e <= r.max_grad_rel_err)) {
      r.max_grad_rel_err = std::isnan(e) ? INFINITY : e;
      r.worst_param = fused.param_names()[i];
    }
  }
  const double tol = cfg.model.dtype == DType::float64 ? 1e-10 : 1e-4;
  const double loss_err = std::fabs(r.loss_fused - r.loss_composed) / std::max(1e-30, std::fabs(r.loss_composed));
  r.ok = loss_err <= tol && r.max_grad_rel_err <= tol;
  r.message = "fused vs composed attention in the whole model: loss " + std::to_string(r.loss_fused) + " vs " +
              std::to_string(r.loss_composed) + " (rel err " + std::to_string(loss_err) + "), worst gradient " +
              r.worst_param + " rel err " + std::to_string(r.max_grad_rel_err) + (r.ok ? ": ok" : ": FAILED");
  return r;
}

namespace {
template <class T>
void write_raw(const std::filesystem::path& file, const std::vector<T>& v) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  DUALCAST_CHECK(out.good(), "write_validation: cannot open ", file.string());
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
  DUALCAST_CHECK(out.good(), "write_validation: writing ", file.string(), " failed");
}
}  // namespace

void write_validation(const std::string& dir, const TrainConfig& cfg) {
  namespace fs = std::filesystem;
  using dcexp::json;
  const fs::path root(dir);
  std::error_code ec;
  fs::create_directories(root, ec);
  DUALCAST_CHECK(fs::is_directory(root), "write_validation: cannot create ", dir);
  TrainConfig c = cfg;
  c.model.dtype = DType::float32;
  const Batches data(c);
  Transformer model(c.model);
  const Tensor tokens = data.train(0);
  Var loss = model.loss(tokens);
  loss.backward();
  json manifest = json::object();
  json& arrays = manifest["arrays"];
  arrays = json::object();
  auto add_array = [&](const std::string& name, const Shape& shape, const char* dtype) {
    json meta = json::object();
    json sh = json::array();
    for (int i = 0; i < shape.rank(); ++i) sh.push_back(static_cast<long long>(shape[i]));
    meta["file"] = name + ".bin";
    meta["shape"] = sh;
    meta["dtype"] = dtype;
    arrays[name] = meta;
  };
  std::vector<std::int32_t> tok;
  for (double x : tokens.to_vector<double>()) tok.push_back(static_cast<std::int32_t>(x));
  write_raw(root / "tokens.bin", tok);
  add_array("tokens", tokens.shape(), "int32");
  for (std::size_t i = 0; i < model.params().size(); ++i) {
    const std::string& n = model.param_names()[i];
    const Var& p = model.params()[i];
    write_raw(root / ("param_" + n + ".bin"), p.value().to_vector<float>());
    add_array("param_" + n, p.shape(), "float32");
    write_raw(root / ("grad_" + n + ".bin"), p.grad().to_vector<float>());
    add_array("grad_" + n, p.shape(), "float32");
  }
  json& sc = manifest["scalars"];
  sc = json::object();
  sc["loss"] = loss.item();
  sc["layers"] = c.model.layers;
  sc["heads"] = c.model.heads;
  sc["width"] = c.model.width;
  sc["context"] = c.model.context;
  sc["vocab"] = c.model.vocab;
  sc["mlp_ratio"] = c.model.mlp_ratio;
  sc["batch"] = c.batch;
  json names = json::array();
  for (const auto& n : model.param_names()) names.push_back(n);
  manifest["param_names"] = names;
  dcexp::write_json_file((root / "manifest.json").string(), manifest);
}

}  // namespace transformer
