// charlm.cu: character-level language modelling with the HM-LSTM on the license texts (charlm.hpp).
#include "charlm.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "dualcast/data_parallel.hpp"
#include "dualcast/error.hpp"
#include "dualcast/graph.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "dualcast/ops/reduce.hpp"
#include "dualcast/optim.hpp"
#include "dualcast/random.hpp"

namespace hmlstm {

using namespace dualcast;

namespace {
constexpr char kPunct[] = ".,;:'\"()-!?/&*%$#@[]_<>=+";  // ids 39..63
static_assert(sizeof(kPunct) - 1 == 25, "25 punctuation symbols");
constexpr double kLn2 = 0.69314718055994530942;
}  // namespace

int char_to_id(unsigned char c) {
  if (c == '\n') return 1;
  if (c == ' ' || c == '\t') return 2;
  if (c >= 'a' && c <= 'z') return 3 + (c - 'a');
  if (c >= 'A' && c <= 'Z') return 3 + (c - 'A');
  if (c >= '0' && c <= '9') return 29 + (c - '0');
  if (c == '`') c = '\'';
  for (int k = 0; k < 25; ++k)
    if (static_cast<unsigned char>(kPunct[k]) == c) return 39 + k;
  return 0;
}

char id_to_char(int id) {
  if (id == 1) return '\n';
  if (id == 2) return ' ';
  if (id >= 3 && id <= 28) return static_cast<char>('a' + (id - 3));
  if (id >= 29 && id <= 38) return static_cast<char>('0' + (id - 29));
  if (id >= 39 && id <= 63) return kPunct[id - 39];
  return '?';
}

std::vector<std::uint8_t> encode_text(const std::string& text) {
  std::vector<std::uint8_t> ids;
  ids.reserve(text.size());
  for (const char c : text)
    if (c != '\r') ids.push_back(static_cast<std::uint8_t>(char_to_id(static_cast<unsigned char>(c))));
  return ids;
}

namespace {
std::string read_corpus(const std::string& dir, std::vector<std::string>* files_out) {
  namespace fs = std::filesystem;
  std::error_code ec;
  DUALCAST_CHECK(!dir.empty(), "charlm: corpus directory is empty string");
  DUALCAST_CHECK(fs::exists(dir, ec), "charlm: corpus directory ", dir, " does not exist");
  DUALCAST_CHECK(fs::is_directory(dir, ec), "charlm: corpus path ", dir, " is not a directory");
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const fs::file_status st = entry.symlink_status(ec);
    if (fs::is_regular_file(st)) files.push_back(entry.path());  // links skipped: no text twice
  }
  DUALCAST_CHECK(!ec, "charlm: cannot list corpus directory ", dir, ": ", ec.message());
  std::sort(files.begin(), files.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename().string() < b.filename().string(); });
  std::string text;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    DUALCAST_CHECK(in.good(), "charlm: cannot read corpus file ", f.string());
    std::ostringstream ss;
    ss << in.rdbuf();
    text += ss.str();
    if (files_out) files_out->push_back(f.filename().string());
  }
  DUALCAST_CHECK(!text.empty(), "charlm: corpus directory ", dir, " holds no non-empty regular file");
  return text;
}
}  // namespace

std::string load_corpus_text(const std::string& dir) { return read_corpus(dir, nullptr); }

CharCorpus load_char_corpus(const std::string& dir, double valid_fraction) {
  DUALCAST_CHECK(valid_fraction > 0.0 && valid_fraction < 1.0, "charlm: valid_fraction ", valid_fraction,
                 " must lie in (0, 1)");
  CharCorpus c;
  const std::vector<std::uint8_t> ids = encode_text(read_corpus(dir, &c.files));
  c.chars = static_cast<std::int64_t>(ids.size());
  const std::size_t n_train =
      static_cast<std::size_t>(std::llround(static_cast<double>(ids.size()) * (1.0 - valid_fraction)));
  c.train.assign(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n_train));
  c.valid.assign(ids.begin() + static_cast<std::ptrdiff_t>(n_train), ids.end());
  return c;
}

double clip_grad_norm(std::vector<Var>& params, double max_norm) {
  double sq = 0.0;
  for (const Var& p : params)
    if (p.has_grad()) {
      const double n = norm(p.grad());
      sq += n * n;
    }
  const double total = std::sqrt(sq);
  if (max_norm > 0.0 && std::isfinite(total) && total > max_norm) {
    const double scale = max_norm / total;
    for (Var& p : params)
      if (p.has_grad()) {
        Tensor g = p.grad();
        g.copy_(g * scale);
      }
  }
  return total;
}

Tensor clip_grad_norm_on_device(std::vector<Var>& params, double max_norm) {
  Tensor sq;
  for (const Var& p : params)
    if (p.has_grad()) {
      const Tensor g = p.grad();
      const Tensor s = sum(g * g);
      sq = sq.defined() ? sq + s : s;
    }
  DUALCAST_CHECK(sq.defined(), "clip_grad_norm_on_device: no parameter has a gradient");
  const Tensor total = sqrt(sq);
  if (max_norm > 0.0) {
    const Tensor scale = max_norm / clamp(total, max_norm, HUGE_VAL);
    for (Var& p : params)
      if (p.has_grad()) {
        Tensor g = p.grad();
        g.copy_(g * scale);
      }
  }
  return total;
}

/// Tokens [T+1, B] (float32, CPU): column b is text[off_b .. off_b + T].
Tensor window_batch(const std::vector<std::uint8_t>& text, const std::vector<std::int64_t>& offsets, int T) {
  const std::size_t B = offsets.size();
  std::vector<float> v(static_cast<std::size_t>(T + 1) * B);
  for (int t = 0; t <= T; ++t)
    for (std::size_t b = 0; b < B; ++b)
      v[static_cast<std::size_t>(t) * B + b] = text[static_cast<std::size_t>(offsets[b] + t)];
  return Tensor::from_vector({static_cast<std::int64_t>(T + 1), static_cast<std::int64_t>(B)}, v);
}

std::vector<std::int64_t> train_offsets(std::int64_t n_train, int T, int B, std::uint64_t seed, int step) {
  std::vector<std::int64_t> off(static_cast<std::size_t>(B));
  const std::int64_t span = n_train - T;  // offsets 0 .. n_train - T - 1
  for (int b = 0; b < B; ++b) {
    const double u = random::uniform(seed, static_cast<std::uint64_t>(step) * B + b);  // (0, 1]
    off[static_cast<std::size_t>(b)] =
        std::min<std::int64_t>(span - 1, static_cast<std::int64_t>(std::floor((1.0 - u) * span)));
  }
  return off;
}

std::vector<Tensor> validation_batches(const std::vector<std::uint8_t>& valid, int T, int B, int max_batches) {
  const std::int64_t windows = (static_cast<std::int64_t>(valid.size()) - 1) / T;
  DUALCAST_CHECK(windows >= B, "charlm: the validation split (", valid.size(), " chars) holds ", windows,
                 " windows of T = ", T, ", fewer than B = ", B);
  std::vector<Tensor> out;
  const std::int64_t n = std::min<std::int64_t>(max_batches, windows / B);
  for (std::int64_t j = 0; j < n; ++j) {
    std::vector<std::int64_t> off(static_cast<std::size_t>(B));
    for (int b = 0; b < B; ++b) off[static_cast<std::size_t>(b)] = (j * B + b) * T;
    out.push_back(window_batch(valid, off, T));
  }
  return out;
}

TrainLog train_charlm(const TrainConfig& cfg, std::function<void(int step, double bpc)> progress) {
  DUALCAST_CHECK(cfg.net.vocab == kCharVocab, "train_charlm: net.vocab must be ", kCharVocab, " (got ",
                 cfg.net.vocab, ")");
  DUALCAST_CHECK(cfg.steps >= 0 && cfg.log_every >= 1, "train_charlm: steps >= 0 and log_every >= 1 required");
  DUALCAST_CHECK(cfg.lr > 0.0f && std::isfinite(cfg.lr), "train_charlm: lr must be positive");
  DUALCAST_CHECK(cfg.valid_batches >= 1, "train_charlm: valid_batches must be >= 1");
  const auto t_start = std::chrono::steady_clock::now();
  const CharCorpus corpus = load_char_corpus(cfg.corpus_dir, cfg.valid_fraction);
  const int T = cfg.net.seq, B = cfg.net.batch;
  const std::int64_t n_train = static_cast<std::int64_t>(corpus.train.size());
  DUALCAST_CHECK(n_train >= T + 1, "train_charlm: the training split (", n_train,
                 " chars) is shorter than one window of T+1 = ", T + 1);
  const bool parallel = cfg.comm != nullptr && cfg.comm->size() > 1;
  DUALCAST_CHECK(!parallel || B % cfg.comm->size() == 0, "train_charlm: batch ", B, " does not split evenly over ",
                 cfg.comm->size(), " ranks");
  // This rank's columns of a [T+1, B] minibatch (all of it on one process).
  auto mine = [&](const Tensor& tokens) { return parallel ? dist::shard(tokens, *cfg.comm, 1) : tokens; };
  // Validation: batch j holds windows j*Bv + b (stride T) with Bv = kValidationBatch (fewer only when
  // the split holds fewer windows): the same text whatever the batch and the number of ranks, so the
  // runs a comparison sets side by side (N ranks at N times the batch, or at the same batch, against
  // one process) are judged alike. The ranks split a batch that divides evenly over them and average
  // their losses; otherwise each evaluates all of it.
  const std::int64_t windows = (static_cast<std::int64_t>(corpus.valid.size()) - 1) / T;
  const int Bv = static_cast<int>(std::min<std::int64_t>(kValidationBatch, std::max<std::int64_t>(windows, 1)));
  const bool split_valid = parallel && Bv % cfg.comm->size() == 0;
  std::vector<Tensor> valid = validation_batches(corpus.valid, T, Bv, cfg.valid_batches);
  for (Tensor& v : valid) v = split_valid ? mine(v.to(cfg.net.device)) : v.to(cfg.net.device);
  auto train_batch = [&](int step) {
    return mine(window_batch(corpus.train, train_offsets(n_train, T, B, cfg.data_seed, step), T).to(cfg.net.device));
  };
  // A loss averaged over the ranks (each computed on the rank's columns).
  auto global = [&](const Tensor& loss) { return parallel ? dist::all_reduced(*cfg.comm, loss).item() : loss.item(); };

  NetworkConfig local = cfg.net;
  if (parallel) local.batch = B / cfg.comm->size();
  HmlstmNetwork net(local);
  std::unique_ptr<dist::DataParallel> ddp;
  if (parallel) ddp = std::make_unique<dist::DataParallel>(*cfg.comm, net.params(), cfg.ddp_options);
  std::unique_ptr<optim::Optimizer> opt;
  if (cfg.adam) opt = std::make_unique<optim::Adam>(net.params(), cfg.lr);
  else opt = std::make_unique<optim::SGD>(net.params(), cfg.lr);

  auto slope_at = [&](int step) {
    const double frac = cfg.steps > 0 ? static_cast<double>(step) / cfg.steps : 0.0;
    return static_cast<float>(cfg.net.slope + (cfg.slope_final - cfg.net.slope) * frac);
  };
  auto evaluate = [&]() {
    NoGradGuard no_grad;
    double s = 0.0;
    for (const Tensor& v : valid) s += split_valid ? global(net.loss(v).value()) : net.loss(v).item();
    return s / static_cast<double>(valid.size()) / kLn2;
  };

  TrainLog log;
  log.mode = cfg.net.mode;
  auto record = [&](int step, double train_bpc, double gnorm) {
    log.step.push_back(step);
    log.train_bpc.push_back(train_bpc);
    log.valid_bpc.push_back(evaluate());
    log.slope.push_back(net.config().slope);
    log.grad_norm.push_back(gnorm);
    if (progress) progress(step, train_bpc);
  };
  {
    NoGradGuard no_grad;
    net.set_slope(slope_at(0));
    const double first = global(net.loss(train_batch(0)).value()) / kLn2;
    record(0, first, 0.0);
  }

  // The step: one minibatch, backward, clipping on the device, the update. Captured, it is recorded
  // once and replayed; the minibatch is fed into tokens_in and the slope is a device scalar the
  // step reads (set_slope between replays). Eager, the same code runs each step.
  log.captured = cfg.captured;
  const Device dev = cfg.net.device;
  Tensor tokens_in = Tensor::zeros({T + 1, local.batch}, DType::float32, dev);
  Tensor loss_out = Tensor::zeros({}, cfg.net.dtype, dev);
  Tensor gnorm_out = Tensor::zeros({}, cfg.net.dtype, dev);
  auto train_step = [&] {
    opt->zero_grad();
    Var loss = net.loss(tokens_in);
    loss.backward();
    if (ddp) ddp->finish();  // every rank clips and steps with the averaged gradients
    const Tensor gnorm = clip_grad_norm_on_device(net.params(), cfg.clip_norm);
    opt->step();
    loss_out.copy_(loss.value());
    gnorm_out.copy_(gnorm);
    if (ddp) {
      cfg.comm->all_reduce({loss_out}, dist::ReduceOp::average);  // stream-ordered: capturable
      cfg.comm->wait();
    }
  };
  Graph graph;
  if (cfg.captured) graph.capture(dev, train_step);

  double loss_acc = 0.0, gnorm_acc = 0.0, train_seconds = 0.0;
  int since = 0;
  for (int step = 0; step < cfg.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    net.set_slope(slope_at(step));
    tokens_in.copy_(train_batch(step));
    if (cfg.captured) graph.replay();
    else train_step();
    const double l = loss_out.item();
    gnorm_acc += gnorm_out.item();
    train_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    DUALCAST_CHECK(std::isfinite(l), "train_charlm: non-finite training loss at step ", step);
    loss_acc += l;
    ++since;
    if ((step + 1) % cfg.log_every == 0 || step + 1 == cfg.steps) {
      record(step + 1, loss_acc / since / kLn2, gnorm_acc / since);
      loss_acc = gnorm_acc = 0.0;
      since = 0;
    }
  }
  log.train_seconds = train_seconds;
  log.ms_per_step = cfg.steps > 0 ? 1e3 * train_seconds / cfg.steps : 0.0;
  log.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return log;
}

CurveComparison compare_charlm_modes(const TrainConfig& cfg, double tolerance,
                                     std::function<void(int step, double bpc)> progress) {
  TrainConfig c = cfg;
  c.net.mode = CellMode::mixed;
  TrainLog mixed = train_charlm(c, progress);
  c.net.mode = CellMode::reverse;
  TrainLog reverse = train_charlm(c, progress);
  return compare_curves(std::move(mixed), std::move(reverse),
                        dualcast::is_half(cfg.net.autocast) ? cfg.net.autocast : cfg.net.dtype, tolerance);
}

CaptureCurveComparison compare_charlm_capture(const TrainConfig& cfg, double tolerance,
                                              std::function<void(int step, double bpc)> progress) {
  TrainConfig c = cfg;
  c.captured = false;
  TrainLog eager = train_charlm(c, progress);
  c.captured = true;
  TrainLog graph = train_charlm(c, progress);
  return compare_capture_curves(std::move(eager), std::move(graph), tolerance);
}

CaptureCurveComparison compare_capture_curves(TrainLog eager, TrainLog graph, double tolerance) {
  CaptureCurveComparison r;
  r.tolerance = tolerance > 0 ? tolerance : 1e-6;
  r.eager = std::move(eager);
  r.graph = std::move(graph);
  const std::size_t n = std::min(r.eager.step.size(), r.graph.step.size());
  r.bitwise = r.eager.step.size() == r.graph.step.size() && n > 0;
  double worst = 0.0;
  for (std::size_t k = 0; k < n; ++k)
    for (std::vector<double> TrainLog::*curve : {&TrainLog::train_bpc, &TrainLog::valid_bpc}) {
      const double a = (r.eager.*curve)[k], b = (r.graph.*curve)[k];
      const double d = std::fabs(a - b);
      if (!(d <= worst)) worst = std::isnan(d) ? INFINITY : d;
      r.bitwise = r.bitwise && a == b;
    }
  r.max_abs_diff_bpc = worst;
  r.ok = r.eager.step.size() == r.graph.step.size() && n > 0 && worst <= r.tolerance;
  std::ostringstream os;
  os << "charlm " << cell_mode_name(r.eager.mode) << " eager vs captured over " << n << " log entries: "
     << (r.bitwise ? "identical bits/char" : "max |diff| " + std::to_string(worst) + " bits/char")
     << " (tolerance " << r.tolerance << ")" << (r.ok ? ": ok" : ": FAILED") << "; final valid bpc "
     << (n ? r.graph.valid_bpc[n - 1] : NAN) << "; " << r.eager.ms_per_step << " (eager) vs "
     << r.graph.ms_per_step << " (captured) ms/step";
  r.message = os.str();
  return r;
}

CurveComparison compare_curves(TrainLog mixed, TrainLog reverse, DType dtype, double tolerance) {
  CurveComparison r;
  r.mixed = std::move(mixed);
  r.reverse = std::move(reverse);
  r.tolerance = tolerance > 0 ? tolerance : (dtype == DType::float64 ? 1e-8 : float32_products_tolerance(1e-3, dtype));
  r.drift_rtol = dtype == DType::float64 ? 1e-6 : float32_products_tolerance(0.03, dtype);
  double worst = 0.0;
  int worst_step = -1;
  std::size_t parted = static_cast<std::size_t>(-1);
  const std::size_t n = std::min(r.mixed.step.size(), r.reverse.step.size());
  for (std::size_t k = 0; k < n; ++k) {
    const double dt = std::fabs(r.mixed.train_bpc[k] - r.reverse.train_bpc[k]);
    const double dv = std::fabs(r.mixed.valid_bpc[k] - r.reverse.valid_bpc[k]);
    const double d = std::isnan(dt) || std::isnan(dv) ? NAN : std::max(dt, dv);  // max would drop a NaN
    if (!(d <= worst)) {  // NaN counts as worst
      worst = std::isnan(d) ? INFINITY : d;
      worst_step = r.mixed.step[k];
    }
    if (parted == static_cast<std::size_t>(-1) && !(d <= r.tolerance)) parted = k;
    if (parted != static_cast<std::size_t>(-1)) {
      const double rt = dt / std::fabs(r.reverse.train_bpc[k]), rv = dv / std::fabs(r.reverse.valid_bpc[k]);
      // std::max would drop a NaN; a NaN entry can never agree
      r.max_rel_diff_after = std::isnan(rt) || std::isnan(rv) ? INFINITY : std::max({r.max_rel_diff_after, rt, rv});
    }
  }
  r.max_abs_diff_bpc = worst;
  const bool never_parted = parted == static_cast<std::size_t>(-1);
  if (!never_parted) r.parted_at_step = r.mixed.step[parted];
  const bool parted_late = !never_parted && parted >= std::max<std::size_t>(2, n / 4);
  r.ok = r.mixed.step.size() == r.reverse.step.size() && n > 0 &&
         (never_parted || (parted_late && r.max_rel_diff_after <= r.drift_rtol));
  std::ostringstream os;
  os << "charlm mixed vs reverse over " << n << " log entries: ";
  if (never_parted)
    os << "agree within " << r.tolerance << " bits/char throughout (max |diff| " << worst << ")";
  else
    os << "agree within " << r.tolerance << " bits/char through step "
       << (parted > 0 ? r.mixed.step[parted - 1] : 0) << ", part at step " << r.parted_at_step
       << " (a boundary decision rounded the other way" << (parted_late ? "" : ", TOO EARLY: suspect a gradient")
       << "), then within " << 100 * r.max_rel_diff_after << "% (limit " << 100 * r.drift_rtol
       << "%; max |diff| " << worst << " bits/char at step " << worst_step << ")";
  os << (r.ok ? ": ok" : ": FAILED") << "; final valid bpc " << (n ? r.mixed.valid_bpc[n - 1] : NAN)
     << " (mixed) vs " << (n ? r.reverse.valid_bpc[n - 1] : NAN) << " (reverse); " << r.mixed.ms_per_step
     << " vs " << r.reverse.ms_per_step << " ms/step";
  r.message = os.str();
  return r;
}

}  // namespace hmlstm
