// soak.cu: the soak runs of soak.hpp: one training loop with readings, two trainers (the HM-LSTM
// step of charlm.cu on random tokens, the MLP step of mnist_train), the judgement and the record.
#include "soak.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <memory>
#include <sstream>

#include "../common/json.hpp"
#include "../common/report.hpp"
#include "../mnist/model.hpp"
#include "charlm.hpp"
#include "dualcast/data.hpp"
#include "dualcast/error.hpp"
#include "dualcast/ops/loss.hpp"
#include "dualcast/optim.hpp"
#include "dualcast/random.hpp"
#include "dualcast/tape.hpp"

namespace soak {

using dualcast::Device;
using dualcast::MemoryStats;
using dualcast::Shape;
using dualcast::Tensor;
using dualcast::Var;

namespace {

std::string mib(std::int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

/// A model that can take one training step and report the loss of a fixed held-out batch.
class Trainer {
 public:
  virtual ~Trainer() = default;
  /// Training step k (1-based); returns its loss.
  virtual double step(int k) = 0;
  /// Loss of the held-out batch at the current parameters, without a tape.
  virtual double eval() = 0;
};

/// The MLP of mnist_train (784-256-100-10, Adam lr 1e-3) on shuffled minibatches gathered on the
/// device. Every step has the same shapes: the last partial batch of an epoch is dropped.
class MlpTrainer final : public Trainer {
 public:
  MlpTrainer(const Config& c, std::string& data_used) : device_(c.device), seed_(c.seed), batch_(c.mlp_batch) {
    DUALCAST_CHECK(batch_ >= 1, "soak: the MLP batch must be >= 1 (got ", batch_, ")");
    Tensor images, labels, test_images, test_labels;
    if (c.data == "synthetic") {
      // Uniform images and labels: 1024 training and 256 held-out examples.
      auto labels_of = [](std::int64_t n, std::uint64_t seed) {
        std::vector<float> l(static_cast<std::size_t>(n));
        for (std::size_t i = 0; i < l.size(); ++i)
          l[i] = static_cast<float>(static_cast<int>(dualcast::random::uniform(seed, i) * 10.0) % 10);
        return Tensor::from_vector<float>(Shape{n}, l);
      };
      images = Tensor::uniform(Shape{1024, 784}, Device::cpu(), c.seed + 11);
      labels = labels_of(1024, c.seed + 12);
      test_images = Tensor::uniform(Shape{256, 784}, Device::cpu(), c.seed + 13);
      test_labels = labels_of(256, c.seed + 14);
      data_used = "synthetic";
    } else {
      const dualcast::Dataset train = dualcast::load_fashion_mnist(c.data, true);
      const dualcast::Dataset test = dualcast::load_fashion_mnist(c.data, false);
      images = train.images;
      labels = train.labels;
      test_images = test.images;
      test_labels = test.labels;
      data_used = c.data;
    }
    n_ = labels.numel();
    DUALCAST_CHECK(batch_ <= n_, "soak: the MLP batch ", batch_, " is larger than the training set (",
                   n_, " examples in ", data_used, ")");
    steps_per_epoch_ = n_ / batch_;
    images_ = images.to(device_);
    labels_ = labels.to(device_);
    // The held-out batch: the first (up to) 1000 test examples, gathered once.
    const std::int64_t m = std::min<std::int64_t>(1000, test_labels.numel());
    std::vector<std::int64_t> first(static_cast<std::size_t>(m));
    for (std::int64_t i = 0; i < m; ++i) first[static_cast<std::size_t>(i)] = i;
    const Tensor idx = index_tensor(first, 0, m);
    eval_x_ = mnist::gather_rows(test_images.to(device_), idx);
    eval_y_ = mnist::gather_rows(test_labels.to(device_), idx);
    model_ = mnist::Model::create(mnist::model_widths("mlp", images.shape()[1], 10), device_, c.seed);
    opt_ = std::make_unique<dualcast::Adam>(model_.params(), 1e-3);
  }

  double step(int k) override {
    const std::int64_t s = (k - 1) % steps_per_epoch_;
    if (s == 0) perm_ = mnist::epoch_permutation(n_, seed_, static_cast<int>((k - 1) / steps_per_epoch_) + 1);
    const Tensor idx = index_tensor(perm_, s * batch_, (s + 1) * batch_);
    const Tensor x = mnist::gather_rows(images_, idx);
    const Tensor y = mnist::gather_rows(labels_, idx);
    opt_->zero_grad();
    Var loss = dualcast::cross_entropy(model_.forward(Var(x)), y);
    loss.backward();
    opt_->step();
    return loss.item();
  }

  double eval() override {
    dualcast::NoGradGuard no_grad;
    return dualcast::cross_entropy(model_.forward(Var(eval_x_)), eval_y_).item();
  }

 private:
  Tensor index_tensor(const std::vector<std::int64_t>& rows, std::int64_t begin, std::int64_t end) const {
    const std::vector<float> idx(rows.begin() + begin, rows.begin() + end);
    return Tensor::from_vector<float>(Shape{end - begin}, idx, device_);
  }

  Device device_;
  std::uint64_t seed_;
  std::int64_t batch_, n_ = 0, steps_per_epoch_ = 1;
  Tensor images_, labels_, eval_x_, eval_y_;
  mnist::Model model_;
  std::unique_ptr<dualcast::Optimizer> opt_;
  std::vector<std::int64_t> perm_;
};

/// The training step of hmlstm::train_charlm (loss over T steps, backward through time, global
/// gradient norm, Adam lr 2e-3, slope annealed 1 -> 5 over the run) on i.i.d. random tokens, so the
/// soak needs no corpus. The gradient norm is computed every step as charlm does, but the clipping
/// threshold is off: clipping is a data-dependent branch whose first use would allocate a new block in
/// mid-run, which the allocator properties would rightly flag but which is no leak.
class HmlstmTrainer final : public Trainer {
 public:
  explicit HmlstmTrainer(const Config& c)
      : c_(c), net_(network_config(c)), opt_(net_.params(), 2e-3),
        valid_(hmlstm::random_tokens(c.seq, c.batch, hmlstm::kCharVocab, c.seed + 999'983)) {}

  double step(int k) override {
    const double frac = c_.steps > 1 ? static_cast<double>(k - 1) / (c_.steps - 1) : 0.0;
    net_.set_slope(static_cast<float>(1.0 + 4.0 * frac));
    const Tensor tokens =
        hmlstm::random_tokens(c_.seq, c_.batch, hmlstm::kCharVocab, c_.seed * 1'000'003ull + static_cast<std::uint64_t>(k));
    Var loss = net_.loss(tokens);
    loss.backward();
    (void)hmlstm::clip_grad_norm(net_.params(), 0.0);
    opt_.step();
    opt_.zero_grad();
    return loss.item();
  }

  double eval() override {
    dualcast::NoGradGuard no_grad;
    return net_.loss(valid_).item();
  }

 private:
  static hmlstm::NetworkConfig network_config(const Config& c) {
    DUALCAST_CHECK(c.hidden >= 1 && c.batch >= 1 && c.seq >= 1, "soak: hidden, batch and seq must be >= 1 (got ",
                   c.hidden, ", ", c.batch, ", ", c.seq, ")");
    hmlstm::NetworkConfig n;
    n.hidden = c.hidden;
    n.batch = c.batch;
    n.seq = c.seq;
    n.vocab = hmlstm::kCharVocab;
    n.device = c.device;
    n.seed = c.seed;
    n.mode = hmlstm::parse_cell_mode(c.mode);
    return n;
  }

  Config c_;
  hmlstm::HmlstmNetwork net_;
  dualcast::Adam opt_;
  Tensor valid_;
};

}  // namespace

std::int64_t resident_bytes() {
  std::ifstream in("/proc/self/statm");
  long long size = 0, resident = -1;
  if (!(in >> size >> resident)) return -1;
  return static_cast<std::int64_t>(resident) * static_cast<std::int64_t>(sysconf(_SC_PAGESIZE));
}

Verdict judge(const std::vector<Sample>& samples, int steps, bool on_cuda, const Limits& limits) {
  Verdict v;
  auto fail = [&](const std::string& msg) {
    v.ok = false;
    v.violations.push_back(msg);
  };
  for (const Sample& s : samples)
    if (!std::isfinite(s.loss) || !std::isfinite(s.eval_loss)) {
      std::ostringstream os;
      os << "non-finite loss at step " << s.step << " (training " << s.loss << ", held-out " << s.eval_loss << ")";
      fail(os.str());
      break;
    }
  const auto base = std::find_if(samples.begin(), samples.end(),
                                 [&](const Sample& s) { return s.step >= limits.warmup_steps; });
  if (base == samples.end()) {
    fail("no reading at or after the warm-up step " + std::to_string(limits.warmup_steps));
    return v;
  }

  // Each quantity must keep its value at the warm-up reading for the rest of the run.
  struct Quantity {
    const char* name;
    std::int64_t (*get)(const Sample&);
    bool applies;
  };
  const Quantity quantities[] = {
      {"cudaMalloc calls", [](const Sample& s) { return s.device.device_malloc_calls; }, on_cuda},
      {"cached bytes (bytes_held)", [](const Sample& s) { return s.device.bytes_held; }, on_cuda},
      {"bytes in use", [](const Sample& s) { return s.device.bytes_in_use; }, true},
      {"peak bytes in use", [](const Sample& s) { return s.device.peak_bytes_in_use; }, true},
      {"host bytes in use", [](const Sample& s) { return s.host.bytes_in_use; }, on_cuda},
      {"host peak bytes in use", [](const Sample& s) { return s.host.peak_bytes_in_use; }, on_cuda},
  };
  for (const Quantity& q : quantities) {
    if (!q.applies) continue;
    const std::int64_t want = q.get(*base);
    for (auto it = base + 1; it != samples.end(); ++it)
      if (q.get(*it) != want) {
        std::ostringstream os;
        os << q.name << " changed from " << want << " at step " << base->step << " to " << q.get(*it)
           << " at step " << it->step << " (" << q.get(samples.back()) << " at the end)";
        fail(os.str());
        break;
      }
  }

  if (limits.check_rss) {
    const int from = std::max(limits.warmup_steps, steps / 20);
    const auto rss_base =
        std::find_if(samples.begin(), samples.end(), [&](const Sample& s) { return s.step >= from; });
    if (rss_base != samples.end() && rss_base->rss_bytes >= 0 && samples.back().rss_bytes >= 0) {
      const std::int64_t growth = samples.back().rss_bytes - rss_base->rss_bytes;
      if (growth > limits.rss_slack_bytes) {
        std::ostringstream os;
        os << "resident set grew by " << mib(growth) << " from step " << rss_base->step << " to step "
           << samples.back().step << " (" << mib(rss_base->rss_bytes) << " -> " << mib(samples.back().rss_bytes)
           << "; limit " << mib(limits.rss_slack_bytes) << ")";
        fail(os.str());
      }
    }
  }
  return v;
}

Run run(const Config& c, const std::function<void(const Sample&)>& progress) {
  DUALCAST_CHECK(c.steps >= 1, "soak: steps must be >= 1 (got ", c.steps, ")");
  DUALCAST_CHECK(c.every >= 1, "soak: every must be >= 1 (got ", c.every, ")");
  DUALCAST_CHECK(c.limits.warmup_steps >= 1 && c.limits.warmup_steps < c.steps, "soak: the warm-up (",
                 c.limits.warmup_steps, " steps) must be at least 1 and shorter than the run (", c.steps, " steps)");
  // Each run starts from an empty cache and its own peak, whatever ran before it in the process.
  dualcast::empty_cache(c.device);
  dualcast::reset_peak_memory_stats(c.device);
  dualcast::reset_peak_memory_stats(Device::cpu());
  Run r;
  r.config = c;
  r.device_name = dualcast::device_name(c.device);
  std::unique_ptr<Trainer> trainer;
  if (c.model == "mlp") {
    trainer = std::make_unique<MlpTrainer>(c, r.data_used);
  } else if (c.model == "hmlstm") {
    trainer = std::make_unique<HmlstmTrainer>(c);
    r.data_used = "random tokens";
  } else {
    DUALCAST_FAIL("soak: unknown model '", c.model, "' (expected hmlstm or mlp)");
  }

  r.samples.reserve(static_cast<std::size_t>(c.limits.warmup_steps + c.steps / c.every + 2));
  const auto t0 = std::chrono::steady_clock::now();
  double loss_sum = 0.0;
  int since = 0;
  for (int k = 1; k <= c.steps; ++k) {
    loss_sum += trainer->step(k);
    ++since;
    if (k > c.limits.warmup_steps && k % c.every != 0 && k != c.steps) continue;
    Sample s;
    s.step = k;
    s.loss = loss_sum / since;
    loss_sum = 0.0;
    since = 0;
    s.eval_loss = trainer->eval();  // .item() waits for the device
    s.device = dualcast::memory_stats(c.device);
    s.host = dualcast::memory_stats(Device::cpu());
    s.rss_bytes = resident_bytes();
    s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.samples.push_back(s);
    if (progress) progress(s);
    if (!std::isfinite(s.loss) || !std::isfinite(s.eval_loss)) break;  // judged below; no point going on
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.verdict = judge(r.samples, c.steps, c.device.is_cuda(), c.limits);
  return r;
}

std::string verdict_line(const Run& r) {
  const Config& c = r.config;
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(1);
  os << "soak " << c.model << ' ' << c.device.str() << ": " << (r.verdict.ok ? "PASS" : "FAIL") << ' ';
  if (r.samples.empty()) return os.str() + "no readings";
  const Sample& first = r.samples.front();
  const Sample& last = r.samples.back();
  os << last.step << " steps in " << r.seconds << " s (" << std::setprecision(2) << 1e3 * r.seconds / last.step
     << " ms/step); loss " << std::setprecision(3) << first.loss << " -> " << last.loss << " (held-out "
     << last.eval_loss << ")";
  const auto base = std::find_if(r.samples.begin(), r.samples.end(),
                                 [&](const Sample& s) { return s.step >= c.limits.warmup_steps; });
  if (base != r.samples.end()) {
    os << "; after step " << base->step << ": ";
    if (c.device.is_cuda())
      os << base->device.device_malloc_calls << " cudaMalloc, " << mib(base->device.bytes_held) << " cached, ";
    os << mib(base->device.bytes_in_use) << " in use, peak " << mib(base->device.peak_bytes_in_use);
    if (first.rss_bytes >= 0)
      os << "; RSS " << mib(base->rss_bytes) << " -> " << mib(last.rss_bytes)
         << (c.limits.check_rss ? "" : " (not checked)");
  }
  os << "; data: " << r.data_used;
  for (const std::string& v : r.verdict.violations) os << "\n  violation: " << v;
  return os.str();
}

std::string write_records(const std::vector<Run>& runs, const std::string& dir) {
  namespace fs = std::filesystem;
  using dcexp::json;
  std::error_code ec;
  fs::create_directories(dir, ec);
  DUALCAST_CHECK(!ec && fs::is_directory(dir), "soak: cannot create the output directory '", dir, "': ", ec.message());
  const std::string csv_path = (fs::path(dir) / "soak.csv").string();
  const std::string json_path = (fs::path(dir) / "soak.json").string();

  std::ofstream csv(csv_path);
  DUALCAST_CHECK(csv.good(), "soak: cannot write '", csv_path, "'");
  csv << "model,device,step,seconds,loss,eval_loss,device_malloc_calls,device_free_calls,cache_hits,bytes_held,"
         "bytes_in_use,peak_bytes_in_use,host_bytes_in_use,host_peak_bytes_in_use,rss_bytes\n";
  csv.precision(9);
  for (const Run& r : runs)
    for (const Sample& s : r.samples)
      csv << r.config.model << ',' << r.config.device.str() << ',' << s.step << ',' << s.seconds << ',' << s.loss
          << ',' << s.eval_loss << ',' << s.device.device_malloc_calls << ',' << s.device.device_free_calls << ','
          << s.device.cache_hits << ',' << s.device.bytes_held << ',' << s.device.bytes_in_use << ','
          << s.device.peak_bytes_in_use << ',' << s.host.bytes_in_use << ',' << s.host.peak_bytes_in_use << ','
          << s.rss_bytes << '\n';
  DUALCAST_CHECK(csv.good(), "soak: writing '", csv_path, "' failed");

  json all = json::array();
  for (const Run& r : runs) {
    const Config& c = r.config;
    json j = json::object();
    j["model"] = c.model;
    j["device"] = c.device.str();
    j["device_name"] = r.device_name;
    j["data"] = r.data_used;
    j["steps"] = c.steps;
    j["every"] = c.every;
    j["seed"] = c.seed;
    j["warmup_steps"] = c.limits.warmup_steps;
    j["rss_slack_bytes"] = c.limits.rss_slack_bytes;
    j["rss_checked"] = c.limits.check_rss;
    json size = json::object();
    if (c.model == "hmlstm") {
      size["hidden"] = c.hidden;
      size["batch"] = c.batch;
      size["seq"] = c.seq;
      size["mode"] = c.mode;
    } else {
      size["batch"] = c.mlp_batch;
    }
    j["size"] = size;
    j["seconds"] = r.seconds;
    j["ok"] = r.verdict.ok;
    json violations = json::array();
    for (const std::string& v : r.verdict.violations) violations.push_back(v);
    j["violations"] = violations;
    j["verdict"] = verdict_line(r);
    json samples = json::array();
    for (const Sample& s : r.samples) {
      json o = json::object();
      o["step"] = s.step;
      o["seconds"] = s.seconds;
      o["loss"] = s.loss;
      o["eval_loss"] = s.eval_loss;
      o["device_malloc_calls"] = s.device.device_malloc_calls;
      o["cache_hits"] = s.device.cache_hits;
      o["bytes_held"] = s.device.bytes_held;
      o["bytes_in_use"] = s.device.bytes_in_use;
      o["peak_bytes_in_use"] = s.device.peak_bytes_in_use;
      o["host_bytes_in_use"] = s.host.bytes_in_use;
      o["rss_bytes"] = s.rss_bytes;
      samples.push_back(o);
    }
    j["samples"] = samples;
    all.push_back(j);
  }
  json doc = json::object();
  doc["time"] = dcexp::iso_time();
  doc["runs"] = all;
  dcexp::write_json_file(json_path, doc);
  return json_path;
}

}  // namespace soak
