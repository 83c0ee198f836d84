// resnet_train: trains ResNet-18 (CIFAR form, model.hpp) on Fashion-MNIST with SGD + momentum (or
// Adam), random-crop and flip augmentation and a one-cycle (or cosine) learning-rate schedule, on the
// CPU or a CUDA device; reports per epoch the training loss, test loss and accuracy and the time, and
// writes them as CSV and JSON (plot.py draws the PNG). --bench times one training step at given batch
// sizes; --export writes what experiments/resnet/peer_torch.py needs to check PyTorch against
// dualcast (bench.cu). See README.md beside this file.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "../common/cli.hpp"
#include "../common/distributed.hpp"
#include "../common/json.hpp"
#include "../common/report.hpp"
#include "../mnist/model.hpp"  // gather_rows, epoch_permutation
#include "dualcast/data.hpp"
#include "dualcast/memory.hpp"
#include "dualcast/optim.hpp"
#include "driver.hpp"

namespace {

using dcexp::cli::parse_double;
using dcexp::cli::parse_int;
using dcexp::cli::UsageError;
using dualcast::Device;
using dualcast::Shape;
using dualcast::Tensor;
using dualcast::Var;
using resnet::Options;

const char* kUsage = R"(usage: resnet_train [options]

Trains ResNet-18 (CIFAR form: 3x3 stem, stages of w, 2w, 4w, 8w channels, two basic blocks each,
global average pooling, linear head) on Fashion-MNIST and reports, per epoch, the training loss,
the test loss and accuracy and the time taken.

model and data:
  --width N                 channels of the first stage (default 64: ResNet-18; 8 or 16 for a CPU run)
  --data DIR                Fashion-MNIST IDX files (default /usr/share/datasets/fashion-mnist)
  --train-subset N          train on a fixed random subset of N images (default: all 60000)
  --test-subset N           evaluate on the first N test images (default: all 10000)
  --augment-pad N           random crop: shift by up to N pixels, zero padding (default 2; 0: none)
  --no-flip                 no random horizontal flips
  --fusion fused|composed   elementwise layers as fused channel_broadcast kernels (default) or as
                            separate batch_norm, relu and add ops
  --channels-last           activations [N, H, W, C] (NHWC convolutions, cuDNN's tensor-core
                            layout; batch norm on [N*H*W, C]); default [N, C, H, W]
training:
  --optimizer sgd|adam      (default sgd, momentum 0.9)
  --lr X                    peak learning rate (default 0.1 for sgd, 0.001 for adam)
  --schedule onecycle|cosine|constant
                            onecycle (default): linear from lr/10 to lr over --warmup of the steps,
                            then cosine to 0; cosine: from lr to 0
  --warmup X                onecycle's rising share of all steps, in [0, 1) (default 0.2)
  --momentum X              SGD momentum in [0, 1) (default 0.9)
  --weight-decay X          L2 weight decay on every parameter (default 5e-4)
  --label-smoothing X       in [0, 1) (default 0)
  --epochs N                (default 10)
  --batch N                 (default 128)
  --eval-batch N            (default 500)
  --max-steps-per-epoch N   cut every epoch short (smoke tests)
  --seed N                  weights, subset, shuffling and augmentation (default 0)
  --device cpu|cuda|cuda:K  (default cpu)
  --gpus N                  data-parallel over N ranks, one per GPU (cuda:0..N-1 with --device cuda,
                            CPU processes with --device cpu), started through scripts/launch. --batch
                            and the --bench sizes stay global batches: each rank takes batch/N
                            images (which must divide evenly). Batch norm uses each rank's own
                            statistics, as PyTorch's DistributedDataParallel does without SyncBatchNorm.
                            Rank 0 prints and writes the results (default 1)
  --bucket-mib X            with --gpus: gradient bucket size in MiB (default 25, PyTorch DDP's)
  --precision fp32|tf32|bf16|fp16
                            fp32 (default): float32, TF32 off; tf32: TF32 convolutions and matmuls;
                            bf16, fp16: the forward pass under Autocast (convolutions and the head in
                            the 16-bit dtype, batch norm statistics and the loss in float32, float32
                            master weights, optimizer unchanged). fp16 scales the loss with a
                            GradScaler (bf16 has float32's range and needs none). Applies to training,
                            evaluation and --bench; --export is the fp32 step only
  --out DIR, --name STEM    write DIR/STEM.csv and DIR/STEM.json (stem default resnet_wW_DEVICE,
                            with _PRECISION appended for a precision other than fp32)
  --expect-loss-decrease    exit with status 1 unless the last epoch's training loss is below the first's
  --quiet                   no progress lines
benchmark and validation (no data needed):
  --bench B1,B2,..          time one training step (forward, backward, SGD) at each batch size on
                            random data; writes OUT/STEM_bench.json
  --bench-reps N, --bench-warmup N   (default 30, 10)
  --capture                 also time the step captured once and replayed as a CUDA graph (needs
                            dualcast::Graph, include/dualcast/graph.hpp)
  --profile-step            bracket one step after the warm-up with cudaProfilerStart/Stop (for
                            ncu --profile-from-start off)
  --export DIR              write initial weights, one batch (--batch), loss, gradients and the state
                            after one SGD step for experiments/resnet/peer_torch.py
  --help                    this text

Exit status: 0 on success, 1 for a data or runtime error (or a loss that did not fall with
--expect-loss-decrease), 2 for a command-line error.
)";

std::vector<std::int64_t> parse_list(const std::string& opt, const std::string& s) {
  std::vector<std::int64_t> out;
  std::size_t start = 0;
  while (start <= s.size()) {
    const std::size_t comma = s.find(',', start);
    out.push_back(parse_int(opt, s.substr(start, comma == std::string::npos ? std::string::npos : comma - start), 1));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

Options parse(int argc, char** argv, bool& help) {
  Options o;
  help = false;
  dcexp::cli::ArgWalker args(argc, argv);
  bool lr_given = false;
  while (args.next()) {
    const std::string a = args.option();
    auto next = [&] { return args.value(); };
    auto flag = [&] { args.no_value(); };
    if (a == "--help" || a == "-h") { flag(); help = true; }
    else if (a == "--quiet") { flag(); o.quiet = true; }
    else if (a == "--width") o.width = parse_int(a, next(), 1);
    else if (a == "--data") o.data = next();
    else if (a == "--train-subset") o.train_subset = parse_int(a, next(), 1);
    else if (a == "--test-subset") o.test_subset = parse_int(a, next(), 1);
    else if (a == "--augment-pad") o.augment.pad = parse_int(a, next(), 0);
    else if (a == "--no-flip") { flag(); o.augment.flip = false; }
    else if (a == "--channels-last") { flag(); o.channels_last = true; }
    else if (a == "--fusion") {
      const std::string v = next();
      if (v != "fused" && v != "composed") throw UsageError("--fusion: unknown value '" + v + "' (expected fused or composed)");
      o.fusion = v == "fused" ? resnet::Fusion::fused : resnet::Fusion::composed;
    }
    else if (a == "--optimizer") o.optimizer = next();
    else if (a == "--lr") { o.lr = parse_double(a, next()); lr_given = true; }
    else if (a == "--schedule") o.schedule = next();
    else if (a == "--warmup") o.warmup = parse_double(a, next());
    else if (a == "--momentum") o.momentum = parse_double(a, next());
    else if (a == "--weight-decay") o.weight_decay = parse_double(a, next());
    else if (a == "--label-smoothing") o.label_smoothing = parse_double(a, next());
    else if (a == "--epochs") o.epochs = static_cast<int>(parse_int(a, next(), 1));
    else if (a == "--batch") o.batch = parse_int(a, next(), std::numeric_limits<std::int64_t>::min());
    else if (a == "--eval-batch") o.eval_batch = parse_int(a, next(), 1);
    else if (a == "--max-steps-per-epoch") o.max_steps = parse_int(a, next(), 1);
    else if (a == "--seed") o.seed = static_cast<std::uint64_t>(parse_int(a, next(), 0));
    else if (a == "--device") o.device = next();
    else if (a == "--gpus") o.gpus = static_cast<int>(parse_int(a, next(), 1, 64));
    else if (a == "--bucket-mib") o.bucket_mib = parse_double(a, next());
    else if (a == "--precision") o.precision = dcexp::cli::parse_precision(next());
    else if (a == "--out") o.out = next();
    else if (a == "--name") o.name = next();
    else if (a == "--expect-loss-decrease") { flag(); o.expect_loss_decrease = true; }
    else if (a == "--bench") o.bench = parse_list(a, next());
    else if (a == "--bench-reps") o.bench_reps = static_cast<int>(parse_int(a, next(), 1));
    else if (a == "--bench-warmup") o.bench_warmup = static_cast<int>(parse_int(a, next(), 0));
    else if (a == "--capture") { flag(); o.capture = true; }
    else if (a == "--profile-step") { flag(); o.profile_step = true; }
    else if (a == "--export") o.export_dir = next();
    else throw UsageError("unknown option '" + a + "'");
  }
  if (help) return o;
  if (o.optimizer != "sgd" && o.optimizer != "adam")
    throw UsageError("--optimizer: unknown optimizer '" + o.optimizer + "' (expected sgd or adam)");
  if (o.schedule != "onecycle" && o.schedule != "cosine" && o.schedule != "constant")
    throw UsageError("--schedule: unknown schedule '" + o.schedule + "' (expected onecycle, cosine or constant)");
  if (!lr_given) o.lr = o.optimizer == "sgd" ? 0.1 : 1e-3;
  if (!std::isfinite(o.lr) || o.lr <= 0)
    throw UsageError("--lr: learning rate " + std::to_string(o.lr) + " is invalid (it must be a finite number > 0)");
  if (!(o.warmup >= 0 && o.warmup < 1)) throw UsageError("--warmup: must lie in [0, 1)");
  if (!(o.momentum >= 0 && o.momentum < 1)) throw UsageError("--momentum: must lie in [0, 1)");
  if (!(o.weight_decay >= 0 && std::isfinite(o.weight_decay))) throw UsageError("--weight-decay: must be a finite number >= 0");
  if (!(o.label_smoothing >= 0 && o.label_smoothing < 1)) throw UsageError("--label-smoothing: must lie in [0, 1)");
  if (o.batch < 1) throw UsageError("--batch: " + std::to_string(o.batch) + " must be at least 1");
  if (!(o.bucket_mib * 1048576.0 >= 1.0 && o.bucket_mib <= 4096))
    throw UsageError("--bucket-mib: must be at least one byte (about 1e-6) and at most 4096");
  // peer_torch.py's validation judges the float32 step against float32 and float64 tolerances.
  if (!o.export_dir.empty() && o.precision != dcexp::Precision::fp32)
    throw UsageError("--export writes the fp32 step for peer_torch.py's validation; run it without --precision");
  if (!o.export_dir.empty() && o.gpus > 1) throw UsageError("--export runs on one device; run it without --gpus");
  for (const std::int64_t b : o.bench.empty() ? std::vector<std::int64_t>{o.batch} : o.bench)
    if (b % o.gpus != 0)
      throw UsageError((o.bench.empty() ? "--batch: " : "--bench: ") + std::to_string(b) +
                       " does not split evenly over --gpus " + std::to_string(o.gpus));
  dcexp::relaunch_if_requested(o.gpus, argc, argv);
  return o;
}

/// Learning rate at progress t in [0, 1) of the run.
double lr_at(const Options& o, double t) {
  constexpr double kPi = 3.14159265358979323846;
  if (o.schedule == "constant") return o.lr;
  if (o.schedule == "cosine") return o.lr * 0.5 * (1.0 + std::cos(kPi * t));
  if (t < o.warmup) return o.lr * (0.1 + 0.9 * t / o.warmup);
  return o.lr * 0.5 * (1.0 + std::cos(kPi * (t - o.warmup) / (1.0 - o.warmup)));
}

struct EpochMetrics {
  int epoch = 0;
  std::int64_t steps = 0;
  double lr_end = 0, train_loss = 0, test_loss = 0, test_accuracy = 0;
  double train_seconds = 0, train_cpu_seconds = 0, eval_seconds = 0, images_per_second = 0;
  std::int64_t malloc_calls = 0, bytes_in_use = 0, bytes_held = 0;
};

void evaluate(const resnet::Model& model, const dualcast::Dataset& test, std::int64_t n,
              const Options& o, double& loss, double& accuracy) {
  dualcast::NoGradGuard no_grad;
  std::vector<std::int64_t> rows(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) rows[static_cast<std::size_t>(i)] = i;
  const std::vector<float> labels = test.labels.to_vector<float>();
  resnet::Augment plain = o.augment;
  plain.pad = 0;
  plain.flip = false;
  double total = 0;
  std::int64_t correct = 0;
  for (std::int64_t start = 0; start < n; start += o.eval_batch) {
    const std::int64_t stop = std::min(n, start + o.eval_batch);
    const Tensor idx = mnist::index_tensor(rows, static_cast<std::size_t>(start), static_cast<std::size_t>(stop),
                                    test.images.device());
    const Tensor x = resnet::gather_batch(test.images, idx, test.rows, test.cols, plain, 0, 0);
    const Var logits = dcexp::autocast_forward(o.precision, [&] { return model.forward(Var(x), false, o.fusion); });
    const std::vector<float> z = dcexp::float32(logits).value().to_vector<float>();
    mnist::score_logits(z, stop - start, labels, start, total, correct);
  }
  loss = total / static_cast<double>(n);
  accuracy = static_cast<double>(correct) / static_cast<double>(n);
}

void write_outputs(const Options& o, const std::string& stem, Device device, const resnet::Model& model,
                   std::int64_t train_n, std::int64_t test_n, double load_seconds,
                   const std::vector<EpochMetrics>& epochs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(o.out, ec);
  DUALCAST_CHECK(!ec && fs::is_directory(o.out), "--out: cannot create directory '", o.out, "': ", ec.message());
  const std::string csv_path = (fs::path(o.out) / (stem + ".csv")).string();
  const std::string json_path = (fs::path(o.out) / (stem + ".json")).string();
  std::ofstream csv(csv_path);
  DUALCAST_CHECK(csv.good(), "--out: cannot write '", csv_path, "'");
  csv << "epoch,steps,lr_end,train_loss,test_loss,test_accuracy,epoch_seconds,epoch_cpu_seconds,"
         "images_per_second,eval_seconds,device_malloc_calls,bytes_in_use,bytes_held\n";
  csv.precision(8);
  for (const auto& e : epochs)
    csv << e.epoch << ',' << e.steps << ',' << e.lr_end << ',' << e.train_loss << ',' << e.test_loss << ','
        << e.test_accuracy << ',' << e.train_seconds << ',' << e.train_cpu_seconds << ','
        << e.images_per_second << ',' << e.eval_seconds << ',' << e.malloc_calls << ',' << e.bytes_in_use
        << ',' << e.bytes_held << '\n';
  DUALCAST_CHECK(csv.good(), "--out: writing '", csv_path, "' failed");

  using dcexp::json;
  json js = json::object();
  js["model"] = "resnet18-cifar";
  js["width"] = static_cast<long long>(o.width);
  js["num_params"] = static_cast<long long>(model.num_params());
  js["fusion"] = o.fusion == resnet::Fusion::fused ? "fused" : "composed";
  js["layout"] = o.channels_last ? "nhwc" : "nchw";
  js["optimizer"] = o.optimizer;
  js["lr"] = o.lr;
  js["schedule"] = o.schedule;
  js["warmup"] = o.warmup;
  js["momentum"] = o.momentum;
  js["weight_decay"] = o.weight_decay;
  js["label_smoothing"] = o.label_smoothing;
  js["precision"] = dcexp::precision_name(o.precision);
  js["augment_pad"] = static_cast<long long>(o.augment.pad);
  js["augment_flip"] = o.augment.flip;
  js["batch"] = static_cast<long long>(o.batch);
  js["gpus"] = o.gpus;
  js["epochs"] = static_cast<long long>(epochs.size());
  js["seed"] = static_cast<long long>(o.seed);
  js["max_steps_per_epoch"] = static_cast<long long>(o.max_steps);
  js["device"] = device.str();
  js["device_name"] = dualcast::device_name(device);
  js["conv_backend"] = dualcast::conv_backend_name(device);
  js["data"] = o.data;
  js["train_size"] = static_cast<long long>(train_n);
  js["test_size"] = static_cast<long long>(test_n);
  js["load_seconds"] = load_seconds;
  js["time_utc"] = dcexp::iso_time();
  double total = 0;
  for (const auto& e : epochs) total += e.train_seconds;
  js["total_train_seconds"] = total;
  js["final_test_accuracy"] = epochs.empty() ? 0.0 : epochs.back().test_accuracy;
  json rows = json::array();
  for (const auto& e : epochs) {
    json r = json::object();
    r["epoch"] = e.epoch;
    r["steps"] = static_cast<long long>(e.steps);
    r["lr_end"] = e.lr_end;
    r["train_loss"] = e.train_loss;
    r["test_loss"] = e.test_loss;
    r["test_accuracy"] = e.test_accuracy;
    r["epoch_seconds"] = e.train_seconds;
    r["epoch_cpu_seconds"] = e.train_cpu_seconds;
    r["images_per_second"] = e.images_per_second;
    r["eval_seconds"] = e.eval_seconds;
    r["device_malloc_calls"] = static_cast<long long>(e.malloc_calls);
    r["bytes_in_use"] = static_cast<long long>(e.bytes_in_use);
    r["bytes_held"] = static_cast<long long>(e.bytes_held);
    rows.push_back(std::move(r));
  }
  js["per_epoch"] = std::move(rows);
  dcexp::write_json_file(json_path, js);
  std::printf("wrote %s and %s\n", csv_path.c_str(), json_path.c_str());
}

int run_training(const Options& o) {
  const dcexp::DataParallelRun group = dcexp::join_group(o.gpus, dcexp::cli::parse_device(o.device));
  const Device device = group.device;
  const dcexp::PrecisionScope precision(o.precision);
  const auto t_load = std::chrono::steady_clock::now();
  dualcast::Dataset train = dualcast::load_fashion_mnist(o.data, true);
  dualcast::Dataset test = dualcast::load_fashion_mnist(o.data, false);
  const std::int64_t n_all = train.size();
  const std::int64_t n = o.train_subset > 0 ? std::min(o.train_subset, n_all) : n_all;
  const std::int64_t n_test = o.test_subset > 0 ? std::min(o.test_subset, test.size()) : test.size();
  if (o.batch > n)
    throw UsageError("--batch: " + std::to_string(o.batch) + " is larger than the training set (" +
                     std::to_string(n) + " images)");
  // A fixed random subset (all images when no subset is asked for), in the order of epoch 0's shuffle.
  std::vector<std::int64_t> subset = mnist::epoch_permutation(n_all, o.seed, 0);
  subset.resize(static_cast<std::size_t>(n));
  train = train.to(device);
  test = test.to(device);
  dualcast::synchronize(device);
  const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();

  resnet::Config cfg;
  cfg.width = o.width;
  cfg.channels_last = o.channels_last;
  const resnet::Model model = resnet::Model::create(cfg, device, o.seed);
  std::unique_ptr<dualcast::Optimizer> opt;
  if (o.optimizer == "sgd")
    opt = std::make_unique<dualcast::SGD>(model.params(), o.lr, o.momentum, o.weight_decay);
  else
    opt = std::make_unique<dualcast::Adam>(model.params(), o.lr, 0.9, 0.999, 1e-8, o.weight_decay);
  const auto scaler = dcexp::make_scaler(o.precision, device);
  std::unique_ptr<dualcast::dist::DataParallel> ddp;
  if (group.size() > 1) ddp = std::make_unique<dualcast::dist::DataParallel>(*group.comm, model.params(),
                                                                           dualcast::dist::DataParallelOptions::with_bucket_mib(o.bucket_mib));

  std::printf("resnet_train: ResNet-18 (CIFAR form) width %lld, %lld parameters, %s; %s lr %g (%s), "
              "momentum %g, weight decay %g, label smoothing %g, batch %lld, %d epochs, crop pad %lld, "
              "flip %s, seed %llu\n",
              static_cast<long long>(o.width), static_cast<long long>(model.num_params()),
              o.fusion == resnet::Fusion::fused ? "fused elementwise" : "composed elementwise",
              o.optimizer.c_str(), o.lr, o.schedule.c_str(), o.momentum, o.weight_decay, o.label_smoothing,
              static_cast<long long>(o.batch), o.epochs, static_cast<long long>(o.augment.pad),
              o.augment.flip ? "on" : "off", static_cast<unsigned long long>(o.seed));
  std::printf("precision %s, activations %s\n", dcexp::precision_text(o.precision),
              o.channels_last ? "channels last (NHWC)" : "NCHW");
  if (ddp)
    std::printf("data-parallel: %d ranks (%s), %lld images each per step\n", group.size(),
                group.comm->backend().c_str(), static_cast<long long>(o.batch / group.size()));
  std::printf("device %s (%s), convolutions: %s; data %s: %lld of %lld train, %lld test, loaded in %.2f s\n",
              device.str().c_str(), dualcast::device_name(device).c_str(),
              dualcast::conv_backend_name(device).c_str(), o.data.c_str(), static_cast<long long>(n),
              static_cast<long long>(n_all), static_cast<long long>(n_test), load_seconds);
  std::fflush(stdout);

  // Data-parallel runs drop a last partial batch that would not split evenly over the ranks.
  const std::int64_t steps_full = group.steps_per_epoch(n, o.batch);
  const std::int64_t steps = o.max_steps > 0 ? std::min(steps_full, o.max_steps) : steps_full;
  const double total_steps = static_cast<double>(steps) * o.epochs;
  std::vector<EpochMetrics> history;
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    const std::vector<std::int64_t> order = mnist::epoch_permutation(n, o.seed, epoch);
    std::vector<std::int64_t> rows(order.size());
    for (std::size_t i = 0; i < order.size(); ++i) rows[i] = subset[static_cast<std::size_t>(order[i])];
    const auto t0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();
    double loss_sum = 0, lr = o.lr;
    std::int64_t images = 0;
    for (std::int64_t s = 0; s < steps; ++s) {
      const auto shard = group.shard_rows(n, o.batch, s);  // this rank's part of the global batch
      const auto begin = static_cast<std::size_t>(shard.first);
      const auto end = begin + static_cast<std::size_t>(shard.count);
      const Tensor idx = mnist::index_tensor(rows, begin, end, device);
      const Tensor x = resnet::gather_batch(train.images, idx, train.rows, train.cols, o.augment, o.seed,
                                            static_cast<std::uint64_t>(epoch) * 1000000ull + static_cast<std::uint64_t>(s),
                                            shard.first - s * o.batch);
      const Tensor y = mnist::gather_rows(train.labels, idx);
      lr = lr_at(o, static_cast<double>((epoch - 1) * steps + s) / total_steps);
      opt->set_lr(lr);
      opt->zero_grad();
      const Var logits = dcexp::autocast_forward(o.precision, [&] { return model.forward(Var(x), true, o.fusion); });
      Var loss = resnet::classification_loss(dcexp::float32(logits), y, o.label_smoothing);
      dcexp::backward_and_step(scaler.get(), loss, *opt, ddp.get());
      const double l = group.mean_over_ranks(loss.value());
      if (!std::isfinite(l))
        DUALCAST_FAIL("training diverged: loss ", l, " at epoch ", epoch, " step ", s + 1, " (try a smaller --lr)");
      loss_sum += l;
      images += shard.global;
      if (!o.quiet && ((s + 1) % 50 == 0 || s + 1 == steps)) {
        std::fprintf(stderr, "\repoch %d/%d step %lld/%lld loss %.4f lr %.4g %.1f s", epoch, o.epochs,
                     static_cast<long long>(s + 1), static_cast<long long>(steps),
                     loss_sum / static_cast<double>(s + 1), lr,
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        std::fflush(stderr);
      }
    }
    dualcast::synchronize(device);
    const auto t1 = std::chrono::steady_clock::now();
    const std::clock_t c1 = std::clock();
    if (!o.quiet) std::fprintf(stderr, "\n");
    EpochMetrics m;
    m.epoch = epoch;
    m.steps = steps;
    m.lr_end = lr;
    m.train_loss = loss_sum / static_cast<double>(steps);
    m.train_seconds = std::chrono::duration<double>(t1 - t0).count();
    m.train_cpu_seconds = static_cast<double>(c1 - c0) / CLOCKS_PER_SEC;
    m.images_per_second = static_cast<double>(images) / m.train_seconds;
    evaluate(model, test, n_test, o, m.test_loss, m.test_accuracy);
    m.eval_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    const auto stats = dualcast::memory_stats(device);
    m.malloc_calls = stats.device_malloc_calls;
    m.bytes_in_use = stats.bytes_in_use;
    m.bytes_held = stats.bytes_held;
    history.push_back(m);
    std::printf("epoch %d: train_loss %.4f test_loss %.4f test_acc %.4f (%.2f s train, %.0f images/s, "
                "%.2f s eval, lr %.4g, %lld allocations so far)\n",
                epoch, m.train_loss, m.test_loss, m.test_accuracy, m.train_seconds, m.images_per_second,
                m.eval_seconds, lr, static_cast<long long>(m.malloc_calls));
    std::fflush(stdout);
  }
  std::string stem = o.name;
  if (stem.empty()) {
    std::string dev = device.str();
    std::replace(dev.begin(), dev.end(), ':', '-');
    stem = "resnet_w" + std::to_string(o.width) + "_" + dev;
    if (o.precision != dcexp::Precision::fp32) stem += std::string("_") + dcexp::precision_name(o.precision);
  }
  if (!o.out.empty() && group.is_root()) write_outputs(o, stem, device, model, n, n_test, load_seconds, history);
  if (o.expect_loss_decrease) {
    const double first = history.front().train_loss, last = history.back().train_loss;
    if (!(last < first)) {
      std::fprintf(stderr, "resnet_train: the training loss did not fall: %.4f in epoch 1, %.4f in epoch %d\n",
                   first, last, o.epochs);
      return 1;
    }
    std::printf("training loss fell from %.4f to %.4f\n", first, last);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return dcexp::cli::driver_main("resnet_train", kUsage, argc, argv, parse, [](const Options& o) {
    if (!o.export_dir.empty()) return resnet::run_export(o);
    if (!o.bench.empty()) return resnet::run_bench(o);
    return run_training(o);
  });
}
