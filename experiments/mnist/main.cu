// mnist_train: trains logistic regression or a 784-256-100-10 ReLU MLP on Fashion-MNIST (or MNIST:
// same files) with softmax cross-entropy, minibatch SGD or Adam, on the CPU or a CUDA device, and
// reports per-epoch train loss, test loss and accuracy, and time. See README.md beside this file.
//
// The data set lives on the run device; each step gathers its shuffled minibatch there with one
// kernel. Every step has the same shapes, so after the first epoch every buffer comes from the caching
// allocator: the CSV records the allocator's counters per epoch to show it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "dualcast/data.hpp"
#include "dualcast/device.hpp"
#include "dualcast/error.hpp"
#include "dualcast/memory.hpp"
#include "dualcast/ops/loss.hpp"
#include "dualcast/optim.hpp"
#include "../common/cli.hpp"
#include "../common/distributed.hpp"
#include "../common/json.hpp"
#include "../common/precision.hpp"
#include "model.hpp"

namespace {

using dualcast::Device;
using dualcast::Shape;
using dualcast::Tensor;
using dualcast::Var;

const char* kUsage = R"(usage: mnist_train [options]

Trains a classifier on Fashion-MNIST (or MNIST: same IDX files) and reports, per epoch, the mean
training loss, the test loss and accuracy, and the time taken.

options:
  --model logreg|mlp        784->10 logistic regression, or 784-256-100-10 ReLU MLP (default mlp)
  --optimizer sgd|adam      (default sgd)
  --lr X                    learning rate > 0 (default 0.1 for sgd, 0.001 for adam)
  --schedule constant|cosine  learning rate constant, or cosine-annealed from --lr towards 0 over
                            all steps of the run (default constant)
  --momentum X              SGD momentum in [0, 1) (default 0)
  --weight-decay X          L2 weight decay >= 0 (default 0)
  --epochs N                (default 10)
  --batch N                 minibatch size, 1..training-set size (default 100)
  --seed N                  weight init and shuffling seed (default 0)
  --device cpu|cuda|cuda:K  (default cpu)
  --gpus N                  data-parallel over N ranks, one per GPU (cuda:0..N-1 with --device cuda;
                            CPU processes with --device cpu), started through scripts/launch; --batch
                            stays the global batch (each rank takes batch/N rows of it, which must
                            divide evenly), so the loss curve is one process's; rank 0 prints and
                            writes the results (default 1)
  --precision fp32|tf32|bf16|fp16
                            fp32 (default): float32, TF32 off; tf32: TF32 matmuls; bf16, fp16: the
                            forward pass under Autocast (matmuls in the 16-bit dtype, bias, ReLU and
                            the loss in float32, float32 master weights, optimizer unchanged). fp16
                            scales the loss with a GradScaler (bf16 has float32's range and needs
                            none)
  --data DIR                directory of {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]
                            (default /usr/share/datasets/fashion-mnist, Debian dataset-fashion-mnist)
  --out DIR                 write DIR/NAME.json and DIR/NAME.csv with the per-epoch metrics
  --name NAME               file stem for --out (default MODEL_OPTIMIZER[_SCHEDULE]_DEVICE[_PRECISION],
                            e.g. mlp_sgd_cpu, mlp_adam_cosine_cuda-0, mlp_sgd_cuda-0_bf16)
  --max-steps-per-epoch N   stop each epoch after N steps (smoke tests)
  --eval-batch N            rows per forward pass when evaluating (default 1000)
  --quiet                   no progress bar
  --help                    this text

The progress bar goes to stderr; one line per epoch to stdout. Exit status: 0 on success, 1 for a
data or runtime error, 2 for a command-line error.
)";

using dcexp::cli::parse_device;
using dcexp::cli::parse_double;
using dcexp::cli::parse_int;
using dcexp::cli::UsageError;

struct Options {
  std::string model = "mlp";
  std::string optimizer = "sgd";
  double lr = std::numeric_limits<double>::quiet_NaN();
  bool lr_given = false;
  std::string schedule = "constant";
  double momentum = 0.0;
  double weight_decay = 0.0;
  int epochs = 10;
  std::int64_t batch = 100;
  std::uint64_t seed = 0;
  std::string device = "cpu";
  int gpus = 1;
  dcexp::Precision precision = dcexp::Precision::fp32;
  std::string data = dualcast::data::kFashionMnistDir;
  std::string out;
  std::string name;
  std::int64_t max_steps = -1;
  std::int64_t eval_batch = 1000;
  bool quiet = false;
};

/// A number as the user would write it (the shortest form that reads back: -0.1, not -0.100000).
std::string num(double v) {
  std::ostringstream os;
  if (!std::isfinite(v)) {
    os << v;
    return os.str();
  }
  for (int p = 1; p < 17; ++p) {
    std::ostringstream t;
    t << std::setprecision(p) << v;
    if (std::stod(t.str()) == v) return t.str();
  }
  os << std::setprecision(17) << v;
  return os.str();
}

Options parse(int argc, char** argv, bool& help) {
  Options o;
  help = false;
  dcexp::cli::ArgWalker args(argc, argv);
  while (args.next()) {
    const std::string a = args.option();
    auto next = [&] { return args.value(); };
    auto flag = [&] { args.no_value(); };
    if (a == "--help" || a == "-h") { flag(); help = true; }
    else if (a == "--quiet") { flag(); o.quiet = true; }
    else if (a == "--model") o.model = next();
    else if (a == "--optimizer") o.optimizer = next();
    else if (a == "--lr") { o.lr = parse_double(a, next()); o.lr_given = true; }
    else if (a == "--schedule") o.schedule = next();
    else if (a == "--momentum") o.momentum = parse_double(a, next());
    else if (a == "--weight-decay") o.weight_decay = parse_double(a, next());
    else if (a == "--epochs") o.epochs = static_cast<int>(parse_int(a, next(), 1));
    else if (a == "--batch") o.batch = parse_int(a, next(), std::numeric_limits<std::int64_t>::min());
    else if (a == "--seed") o.seed = static_cast<std::uint64_t>(parse_int(a, next(), 0));
    else if (a == "--device") o.device = next();
    else if (a == "--gpus") o.gpus = static_cast<int>(parse_int(a, next(), 1, 64));
    else if (a == "--precision") o.precision = dcexp::cli::parse_precision(next());
    else if (a == "--data") o.data = next();
    else if (a == "--out") o.out = next();
    else if (a == "--name") o.name = next();
    else if (a == "--max-steps-per-epoch") o.max_steps = parse_int(a, next(), 1);
    else if (a == "--eval-batch") o.eval_batch = parse_int(a, next(), 1);
    else throw UsageError("unknown option '" + a + "'");
  }
  if (help) return o;
  if (o.model != "logreg" && o.model != "mlp")
    throw UsageError("--model: unknown model '" + o.model + "' (expected logreg or mlp)");
  if (o.optimizer != "sgd" && o.optimizer != "adam")
    throw UsageError("--optimizer: unknown optimizer '" + o.optimizer + "' (expected sgd or adam)");
  if (o.schedule != "constant" && o.schedule != "cosine")
    throw UsageError("--schedule: unknown schedule '" + o.schedule + "' (expected constant or cosine)");
  if (!o.lr_given) o.lr = o.optimizer == "sgd" ? 0.1 : 1e-3;
  if (!std::isfinite(o.lr) || o.lr <= 0)
    throw UsageError("--lr: learning rate " + num(o.lr) + " is invalid (it must be a finite number > 0)");
  if (!(o.momentum >= 0 && o.momentum < 1))
    throw UsageError("--momentum: " + num(o.momentum) + " is outside [0, 1)");
  if (!(o.weight_decay >= 0 && std::isfinite(o.weight_decay)))
    throw UsageError("--weight-decay: " + num(o.weight_decay) + " is invalid (it must be a finite number >= 0)");
  if (o.batch < 1) throw UsageError("--batch: " + std::to_string(o.batch) + " must be at least 1");
  if (o.batch % o.gpus != 0)
    throw UsageError("--batch: " + std::to_string(o.batch) + " does not split evenly over --gpus " +
                     std::to_string(o.gpus));
  dcexp::relaunch_if_requested(o.gpus, argc, argv);
  return o;
}

/// A one-line progress bar, redrawn in place on stderr.
class Progress {
 public:
  Progress(bool enabled, int epoch, int epochs, std::int64_t total)
      : enabled_(enabled), epoch_(epoch), epochs_(epochs), total_(total),
        every_(std::max<std::int64_t>(1, total / 100)), start_(std::chrono::steady_clock::now()) {}
  void update(std::int64_t done, double loss) {
    if (!enabled_ || (done % every_ != 0 && done != total_)) return;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * done / std::max<std::int64_t>(1, total_));
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::fprintf(stderr, "\repoch %d/%d [%s%s] %lld/%lld loss %.4f %.1fs", epoch_, epochs_,
                 std::string(static_cast<std::size_t>(filled), '#').c_str(),
                 std::string(static_cast<std::size_t>(kWidth - filled), '.').c_str(),
                 static_cast<long long>(done), static_cast<long long>(total_), loss, secs);
    std::fflush(stderr);
  }
  void finish() {
    if (enabled_) std::fprintf(stderr, "\n");
  }

 private:
  bool enabled_;
  int epoch_, epochs_;
  std::int64_t total_, every_;
  std::chrono::steady_clock::time_point start_;
};

struct EpochMetrics {
  int epoch = 0;
  std::int64_t steps = 0;
  double train_loss = 0, test_loss = 0, test_accuracy = 0;
  double train_seconds = 0, eval_seconds = 0;
  double train_cpu_seconds = 0;  ///< process CPU time of the training part (all threads)
  std::int64_t malloc_calls = 0, bytes_in_use = 0, bytes_held = 0;
};

/// Test loss and accuracy: forward passes of eval_batch rows without a tape; softmax cross-entropy
/// and argmax of the logits on the host in double.
void evaluate(const mnist::Model& model, const dualcast::Dataset& test, std::int64_t eval_batch,
              dcexp::Precision precision, double& loss, double& accuracy) {
  dualcast::NoGradGuard no_grad;
  const std::int64_t n = test.size();
  std::vector<std::int64_t> all(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) all[static_cast<std::size_t>(i)] = i;
  const std::vector<float> labels = test.labels.to_vector<float>();
  double total_loss = 0;
  std::int64_t correct = 0;
  for (std::int64_t start = 0; start < n; start += eval_batch) {
    const std::int64_t stop = std::min(n, start + eval_batch);
    const Tensor idx = mnist::index_tensor(all, static_cast<std::size_t>(start), static_cast<std::size_t>(stop),
                                    test.images.device());
    const Tensor x = mnist::gather_rows(test.images, idx);
    const Var z = dcexp::autocast_forward(precision, [&] { return model.forward(Var(x)); });
    const std::vector<float> logits = dcexp::float32(z).value().to_vector<float>();
    mnist::score_logits(logits, stop - start, labels, start, total_loss, correct);
  }
  loss = total_loss / static_cast<double>(n);
  accuracy = static_cast<double>(correct) / static_cast<double>(n);
}

void write_outputs(const Options& o, const std::string& device_str, const std::string& device_name,
                   const mnist::Model& model, std::int64_t train_n, std::int64_t test_n,
                   double load_seconds, const std::vector<EpochMetrics>& epochs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(o.out, ec);
  DUALCAST_CHECK(!ec && fs::is_directory(o.out), "--out: cannot create directory '", o.out,
                 "': ", ec.message());
  std::string stem = o.name;
  if (stem.empty()) {
    std::string dev = device_str;
    std::replace(dev.begin(), dev.end(), ':', '-');
    stem = o.model + "_" + o.optimizer + (o.schedule == "constant" ? "" : "_" + o.schedule) + "_" + dev;
    if (o.precision != dcexp::Precision::fp32) stem += std::string("_") + dcexp::precision_name(o.precision);
  }
  const std::string csv_path = (fs::path(o.out) / (stem + ".csv")).string();
  const std::string json_path = (fs::path(o.out) / (stem + ".json")).string();

  std::ofstream csv(csv_path);
  DUALCAST_CHECK(csv.good(), "--out: cannot write '", csv_path, "'");
  csv << "epoch,steps,train_loss,test_loss,test_accuracy,epoch_seconds,epoch_cpu_seconds,"
         "eval_seconds,device_malloc_calls,bytes_in_use,bytes_held\n";
  csv.precision(8);
  for (const auto& e : epochs)
    csv << e.epoch << ',' << e.steps << ',' << e.train_loss << ',' << e.test_loss << ','
        << e.test_accuracy << ',' << e.train_seconds << ',' << e.train_cpu_seconds << ','
        << e.eval_seconds << ','
        << e.malloc_calls << ',' << e.bytes_in_use << ',' << e.bytes_held << '\n';
  DUALCAST_CHECK(csv.good(), "--out: writing '", csv_path, "' failed");

  using dcexp::json;
  double total = 0;
  for (const auto& e : epochs) total += e.train_seconds;
  json js = json::object();
  js["model"] = o.model;
  js["optimizer"] = o.optimizer;
  js["lr"] = o.lr;
  js["schedule"] = o.schedule;
  js["momentum"] = o.momentum;
  js["weight_decay"] = o.weight_decay;
  js["precision"] = dcexp::precision_name(o.precision);
  js["batch"] = o.batch;
  js["gpus"] = o.gpus;
  js["epochs"] = epochs.size();
  js["seed"] = o.seed;
  js["max_steps_per_epoch"] = o.max_steps;
  js["device"] = device_str;
  js["device_name"] = device_name;
  js["data"] = o.data;
  js["train_size"] = train_n;
  js["test_size"] = test_n;
  js["num_params"] = model.num_params();
  js["load_seconds"] = load_seconds;
  js["total_train_seconds"] = total;
  js["final_test_accuracy"] = epochs.empty() ? 0.0 : epochs.back().test_accuracy;
  json rows = json::array();
  for (const auto& e : epochs) {
    json r = json::object();
    r["epoch"] = e.epoch;
    r["steps"] = e.steps;
    r["train_loss"] = e.train_loss;
    r["test_loss"] = e.test_loss;
    r["test_accuracy"] = e.test_accuracy;
    r["epoch_seconds"] = e.train_seconds;
    r["epoch_cpu_seconds"] = e.train_cpu_seconds;
    r["eval_seconds"] = e.eval_seconds;
    r["device_malloc_calls"] = e.malloc_calls;
    r["bytes_in_use"] = e.bytes_in_use;
    r["bytes_held"] = e.bytes_held;
    rows.push_back(std::move(r));
  }
  js["per_epoch"] = std::move(rows);
  try {
    dcexp::write_json_file(json_path, js);
  } catch (const std::runtime_error& e) {
    DUALCAST_FAIL("--out: ", e.what());
  }
  std::printf("wrote %s and %s\n", csv_path.c_str(), json_path.c_str());
}

int run(const Options& o) {
  const dcexp::DataParallelRun group = dcexp::join_group(o.gpus, parse_device(o.device));
  const Device device = group.device;
  const dcexp::PrecisionScope precision(o.precision);

  const auto t_load = std::chrono::steady_clock::now();
  dualcast::Dataset train = dualcast::load_fashion_mnist(o.data, true);
  dualcast::Dataset test = dualcast::load_fashion_mnist(o.data, false);
  const std::int64_t n = train.size();
  if (o.batch > n)
    throw UsageError("--batch: " + std::to_string(o.batch) + " is larger than the training set (" +
                     std::to_string(n) + " examples in " + o.data + ")");
  train = train.to(device);
  test = test.to(device);
  dualcast::synchronize(device);
  const double load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();

  const mnist::Model model =
      mnist::Model::create(mnist::model_widths(o.model, train.images.shape()[1], train.num_classes),
                           device, o.seed);
  std::unique_ptr<dualcast::Optimizer> opt;
  if (o.optimizer == "sgd")
    opt = std::make_unique<dualcast::SGD>(model.params(), o.lr, o.momentum, o.weight_decay);
  else
    opt = std::make_unique<dualcast::Adam>(model.params(), o.lr, 0.9, 0.999, 1e-8, o.weight_decay);
  const auto scaler = dcexp::make_scaler(o.precision, device);
  std::unique_ptr<dualcast::dist::DataParallel> ddp;
  if (group.size() > 1) ddp = std::make_unique<dualcast::dist::DataParallel>(*group.comm, model.params());

  std::printf("mnist_train: %s (%lld parameters), %s lr %g (%s), batch %lld, %d epochs, seed %llu\n",
              o.model.c_str(), static_cast<long long>(model.num_params()), o.optimizer.c_str(), o.lr,
              o.schedule.c_str(),
              static_cast<long long>(o.batch), o.epochs, static_cast<unsigned long long>(o.seed));
  std::printf("precision %s\n", dcexp::precision_text(o.precision));
  if (ddp)
    std::printf("data-parallel: %d ranks (%s), %lld rows each per step\n", group.size(),
                group.comm->backend().c_str(), static_cast<long long>(o.batch / group.size()));
  std::printf("device %s (%s); data %s: %lld train, %lld test, loaded in %.2f s\n",
              device.str().c_str(), dualcast::device_name(device).c_str(), o.data.c_str(),
              static_cast<long long>(n), static_cast<long long>(test.size()), load_seconds);
  std::fflush(stdout);

  // Data-parallel runs drop a last partial batch that would not split evenly over the ranks.
  const std::int64_t steps_full = group.steps_per_epoch(n, o.batch);
  const std::int64_t steps = o.max_steps > 0 ? std::min(steps_full, o.max_steps) : steps_full;
  std::vector<EpochMetrics> history;
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    const auto perm = mnist::epoch_permutation(n, o.seed, epoch);
    Progress bar(!o.quiet, epoch, o.epochs, steps);
    const auto t0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();
    double loss_sum = 0;
    for (std::int64_t s = 0; s < steps; ++s) {
      const auto shard = group.shard_rows(n, o.batch, s);  // this rank's part of the global batch
      const auto begin = static_cast<std::size_t>(shard.first);
      const auto end = begin + static_cast<std::size_t>(shard.count);
      const Tensor idx = mnist::index_tensor(perm, begin, end, device);
      const Tensor x = mnist::gather_rows(train.images, idx);
      const Tensor y = mnist::gather_rows(train.labels, idx);
      if (o.schedule == "cosine") {
        // t / T in [0, 1): the rate stays positive and reaches about lr * pi^2 / (4 T^2) at the end.
        const double t = static_cast<double>((epoch - 1) * steps + s) /
                         static_cast<double>(static_cast<std::int64_t>(o.epochs) * steps);
        opt->set_lr(o.lr * 0.5 * (1.0 + std::cos(3.14159265358979323846 * t)));
      }
      opt->zero_grad();
      const Var logits = dcexp::autocast_forward(o.precision, [&] { return model.forward(Var(x)); });
      Var loss = dualcast::cross_entropy(dcexp::float32(logits), y);
      dcexp::backward_and_step(scaler.get(), loss, *opt, ddp.get());
      const double l = group.mean_over_ranks(loss.value());
      if (!std::isfinite(l)) {
        bar.finish();
        DUALCAST_FAIL("training diverged: loss ", l, " at epoch ", epoch, " step ", s + 1,
                      " (try a smaller --lr)");
      }
      loss_sum += l;
      bar.update(s + 1, loss_sum / static_cast<double>(s + 1));
    }
    dualcast::synchronize(device);
    const auto t1 = std::chrono::steady_clock::now();
    const std::clock_t c1 = std::clock();
    bar.finish();
    EpochMetrics m;
    m.epoch = epoch;
    m.steps = steps;
    m.train_loss = loss_sum / static_cast<double>(steps);
    m.train_seconds = std::chrono::duration<double>(t1 - t0).count();
    m.train_cpu_seconds = static_cast<double>(c1 - c0) / CLOCKS_PER_SEC;
    evaluate(model, test, o.eval_batch, o.precision, m.test_loss, m.test_accuracy);
    m.eval_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    const auto stats = dualcast::memory_stats(device);
    m.malloc_calls = stats.device_malloc_calls;
    m.bytes_in_use = stats.bytes_in_use;
    m.bytes_held = stats.bytes_held;
    history.push_back(m);
    std::printf("epoch %d: train_loss %.4f test_loss %.4f test_acc %.4f (%.2f s train [%.2f s CPU], "
                "%.2f s eval, %lld allocations so far)\n",
                epoch, m.train_loss, m.test_loss, m.test_accuracy, m.train_seconds,
                m.train_cpu_seconds, m.eval_seconds, static_cast<long long>(m.malloc_calls));
    std::fflush(stdout);
  }
  if (!o.out.empty() && group.is_root())
    write_outputs(o, device.str(), dualcast::device_name(device), model, n, test.size(),
                  load_seconds, history);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return dcexp::cli::driver_main("mnist_train", kUsage, argc, argv, parse, run);
}
