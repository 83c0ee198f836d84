// bench.cu: resnet_train's benchmark (--bench: one training step timed at several batch sizes, eager
// and, when dualcast::Graph exists, captured) and validation export (--export: the state PyTorch must
// reproduce, as .npy files).
//
// The step is zero_grad, forward in training mode, softmax cross-entropy, backward, SGD with momentum
// 0.9 and weight decay 5e-4: what experiments/resnet/peer_torch.py times for PyTorch, at the same
// --precision (the forward under Autocast for bf16/fp16, the loss on float32 logits). On a CUDA device
// each repetition starts from an idle GPU and is timed by CUDA events on dualcast's stream
// (experiments/common/gpu_timing.hpp); the allocator's cudaMalloc count is read around the timed
// repetitions to show that a warm step allocates nothing new.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "../common/cli.hpp"
#include "../common/distributed.hpp"
#include "../common/dp_report.hpp"
#include "../common/gpu_timing.hpp"
#include "../common/json.hpp"
#include "../common/report.hpp"
#include "dualcast/memory.hpp"
#include "dualcast/optim.hpp"
#include "dualcast/random.hpp"
#include "driver.hpp"

#if defined(__CUDACC__)
#include <cuda_profiler_api.h>
#endif

// The hook for whole-step capture (issue "Whole-step capture"): compiled in once
// include/dualcast/graph.hpp exists, against the Graph contract of that issue.
#if __has_include("dualcast/graph.hpp")
#include "dualcast/graph.hpp"
#define RESNET_HAVE_GRAPH 1
#else
#define RESNET_HAVE_GRAPH 0
#endif

namespace resnet {

namespace {

using dualcast::DType;
using dualcast::Shape;
using dcexp::json;

/// A random batch: images [B, 1, 28, 28] ~ N(0, 1) and labels uniform over the classes (float32).
struct Batch {
  Tensor x, y;
};
Batch random_batch(std::int64_t B, std::int64_t classes, Device device, std::uint64_t seed) {
  Batch b;
  b.x = Tensor::randn(Shape{B, 1, 28, 28}, Device::cpu(), seed).to(device);
  std::vector<float> labels(static_cast<std::size_t>(B));
  for (std::int64_t i = 0; i < B; ++i)
    labels[static_cast<std::size_t>(i)] = static_cast<float>(
        static_cast<std::int64_t>(dualcast::random::uniform(seed + 1, static_cast<std::uint64_t>(i)) *
                                  static_cast<double>(classes)) % classes);
  b.y = Tensor::from_vector<float>(Shape{B}, labels, device);
  return b;
}

/// One training step of the benchmark.
struct Step {
  const Model& model;
  dualcast::SGD& opt;
  const Batch& batch;
  Fusion fusion;
  double label_smoothing;
  dcexp::Precision precision;
  dualcast::GradScaler* scaler;  ///< fp16 only
  dualcast::dist::DataParallel* ddp;  ///< --gpus N > 1 only
  Tensor loss;
  void operator()() {
    opt.zero_grad();
    const Var logits = dcexp::autocast_forward(precision, [&] { return model.forward(Var(batch.x), true, fusion); });
    Var l = classification_loss(dcexp::float32(logits), batch.y, label_smoothing);
    dcexp::backward_and_step(scaler, l, opt, ddp);
    loss = l.value();
  }
};

json times_json(const dcexp::StepTimes& t, std::int64_t B) {
  json v = json::object();
  v["step_ms"] = dcexp::summary_json(t.primary());
  v["wall_ms"] = dcexp::summary_json(t.wall_ms);
  v["pipelined_ms"] = t.pipelined_ms;
  v["images_per_s"] = static_cast<double>(B) / (t.primary().median * 1e-3);
  v["images_per_s_pipelined"] = static_cast<double>(B) / (t.pipelined_ms * 1e-3);
  v["warmup"] = t.warmup;
  v["reps"] = t.reps;
  return v;
}

dcexp::StepTimes time_step(Device device, const std::function<void()>& step, int warmup, int reps) {
  auto prepare = [](int) {};
  auto run = [&](int) { step(); };
  return dcexp::time_steps(device, prepare, run, warmup, reps);
}

#if RESNET_HAVE_GRAPH
/// The same step captured once and replayed (Graph contract of the whole-step capture issue): the
/// batch lives in static tensors allocated before capture; the loss is copied out of the graph.
json time_captured(Device device, Step& step, const Options& o, std::int64_t B) {
  Tensor loss_out = Tensor::zeros(Shape{}, DType::float32, device);
  dualcast::Graph graph;
  graph.capture(device, [&] {
    step();
    loss_out.copy_(step.loss);
  });
  const dcexp::StepTimes t = time_step(device, [&] { graph.replay(); }, o.bench_warmup, o.bench_reps);
  json v = times_json(t, B);
  v["loss_after"] = loss_out.item();
  return v;
}
#endif

}  // namespace

int run_bench(const Options& o) {
  const dcexp::DataParallelRun group = dcexp::join_group(o.gpus, dcexp::cli::parse_device(o.device));
  const Device device = group.device;
  const dcexp::PrecisionScope precision(o.precision);
  json results = json::array();
  std::printf("resnet_train --bench: ResNet-18 width %lld on %s (%s), convolutions: %s, %s elementwise, "
              "precision %s, activations %s\n",
              static_cast<long long>(o.width), device.str().c_str(), dualcast::device_name(device).c_str(),
              dualcast::conv_backend_name(device).c_str(),
              o.fusion == Fusion::fused ? "fused" : "composed", dcexp::precision_text(o.precision),
              o.channels_last ? "channels last (NHWC)" : "NCHW");
  if (group.size() > 1)
    std::printf("data-parallel: %d ranks (%s); batch is the global batch, each rank takes batch/%d\n",
                group.size(), group.comm->backend().c_str(), group.size());
  std::printf("%8s %12s %12s %12s %14s %10s\n", "batch", "median ms", "p10 ms", "p90 ms", "images/s",
              "mallocs");
  for (const std::int64_t B : o.bench) {
    Config cfg;
    cfg.width = o.width;
    cfg.channels_last = o.channels_last;
    const Model model = Model::create(cfg, device, o.seed);
    dualcast::SGD opt(model.params(), 0.01, 0.9, 5e-4);
    const std::int64_t local = B / group.size();
    const Batch batch = random_batch(local, cfg.classes, device, o.seed + 7 + 1000 * static_cast<std::uint64_t>(group.rank()));
    const auto scaler = dcexp::make_scaler(o.precision, device);
    std::unique_ptr<dualcast::dist::DataParallel> ddp;
    if (group.size() > 1) ddp = std::make_unique<dualcast::dist::DataParallel>(*group.comm, model.params(),
                                                                             dualcast::dist::DataParallelOptions::with_bucket_mib(o.bucket_mib));
    Step step{model, opt, batch, o.fusion, o.label_smoothing, o.precision, scaler.get(), ddp.get(), Tensor()};
    // The first steps search cuDNN's algorithms and fill the allocator's cache: warm up before
    // counting allocations.
    for (int i = 0; i < 3; ++i) step();
    dualcast::synchronize(device);
    const std::int64_t mallocs_before = dualcast::memory_stats(device).device_malloc_calls;
    const dcexp::StepTimes t = time_step(device, [&] { step(); }, o.bench_warmup, o.bench_reps);
    const std::int64_t new_mallocs = dualcast::memory_stats(device).device_malloc_calls - mallocs_before;
    json r = times_json(t, B);
    r["batch"] = static_cast<long long>(B);
    r["batch_per_gpu"] = static_cast<long long>(local);
    r["gpus"] = group.size();
    r["new_device_mallocs_while_timed"] = static_cast<long long>(new_mallocs);
    r["peak_bytes_in_use"] = static_cast<long long>(dualcast::memory_stats(device).peak_bytes_in_use);
    r["loss_after"] = step.loss.item();
    std::printf("%8lld %12.3f %12.3f %12.3f %14.0f %10lld\n", static_cast<long long>(B), t.primary().median,
                t.primary().p10, t.primary().p90, static_cast<double>(B) / (t.primary().median * 1e-3),
                static_cast<long long>(new_mallocs));
    if (o.capture) {
#if RESNET_HAVE_GRAPH
      r["captured"] = time_captured(device, step, o, B);
      std::printf("%8s %12.3f (captured step replayed)\n", "",
                  r["captured"]["step_ms"]["median"].get<double>());
#else
      r["captured"] = "skipped: this dualcast has no dualcast::Graph (include/dualcast/graph.hpp)";
      std::printf("%8s captured: skipped (no dualcast::Graph in this build)\n", "");
#endif
    }
    if (ddp)
      r["data_parallel"] = dcexp::time_data_parallel_parts(
          device,
          [&] {
            ddp->set_sync(false);
            step();
            ddp->set_sync(true);
          },
          *ddp, model.params(), t.primary().median, o.bench_warmup, o.bench_reps);
#if defined(__CUDACC__)
    if (o.profile_step && device.is_cuda()) {
      // One more step inside a profiler range: `ncu --profile-from-start off` sees exactly one step.
      dualcast::synchronize(device);
      DCEXP_CUDA(cudaProfilerStart());
      step();
      dualcast::synchronize(device);
      DCEXP_CUDA(cudaProfilerStop());
      r["profiled_step"] = true;
    }
#endif
    results.push_back(std::move(r));
  }
  if (!o.out.empty() && group.is_root()) {
    namespace fs = std::filesystem;
    fs::create_directories(o.out);
    json js = json::object();
    js["what"] = std::string("one ResNet-18 training step (forward, cross-entropy, backward, SGD momentum 0.9, "
                             "weight decay 5e-4), ") + dcexp::precision_name(o.precision);
    js["framework"] = "dualcast";
    js["precision"] = dcexp::precision_name(o.precision);
    js["layout"] = o.channels_last ? "nhwc" : "nchw";
    js["cudnn_algorithms"] = dualcast::conv_algorithms_chosen();  // which kernels the timed steps ran
    // The method's name says what differs from the default (fused elementwise, cuDNN, Find, direct
    // sums in the forward and FFT or Winograd allowed in the backward).
    std::string method = o.fusion == Fusion::fused ? "eager" : "eager_composed";
    if (o.channels_last) method += "_nhwc";
    const std::string backend = dualcast::conv_backend_name(device);
    const auto has = [&](const char* part) { return backend.find(part) != std::string::npos; };
    if (device.is_cuda() && has("im2col")) method += "_gemm";
    if (has("heuristic")) method += "_heuristic";
    if (has("no FFT or Winograd")) method += "_direct";
    if (has("FFT and Winograd allowed") && !has("float32 backward")) method += "_fft_winograd";
    constexpr std::string_view kListed = "FFT/Winograd allowed: ";  // a DUALCAST_CUDNN_FAST_ALGOS list
    if (const std::size_t at = backend.find(kListed); at != std::string::npos) {
      std::string rule = backend.substr(at + kListed.size());  // "fft,forward)" -> "_fft_forward"
      rule = rule.substr(0, rule.find(')'));
      for (char& c : rule) c = c == ',' ? '_' : c;
      method += "_" + rule;
    }
    js["method"] = method;
    js["width"] = static_cast<long long>(o.width);
    js["input"] = "[B, 1, 28, 28]";
    js["device"] = device.str();
    js["device_name"] = dualcast::device_name(device);
    js["gpus"] = group.size();
    js["comm_backend"] = group.comm->backend();
    js["conv_backend"] = dualcast::conv_backend_name(device);
    js["time_utc"] = dcexp::iso_time();
    js["results"] = std::move(results);
    std::string stem = o.name.empty() ? "dualcast_resnet" : o.name;
    if (o.name.empty() && o.precision != dcexp::Precision::fp32)
      stem += std::string("_") + dcexp::precision_name(o.precision);
    const std::string path = (fs::path(o.out) / (stem + "_bench.json")).string();
    dcexp::write_json_file(path, js);
    std::printf("wrote %s\n", path.c_str());
  }
  return 0;
}

// ---- export ----------------------------------------------------------------------------------------

namespace {

/// A float32 array as a NumPy .npy file (format 1.0, little-endian, C order).
void write_npy(const std::string& path, const Tensor& t) {
  const std::vector<float> v = t.to_vector<float>();
  std::string shape = "(";
  for (int d = 0; d < t.rank(); ++d) shape += std::to_string(t.shape()[d]) + (t.rank() == 1 || d + 1 < t.rank() ? "," : "");
  shape += ")";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
  const std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  DUALCAST_CHECK(out.good(), "--export: cannot write '", path, "'");
  const char magic[] = "\x93NUMPY\x01\x00";
  out.write(magic, 8);
  const auto len = static_cast<std::uint16_t>(header.size());
  const char len_bytes[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(len_bytes, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  DUALCAST_CHECK(out.good(), "--export: writing '", path, "' failed");
}

json shape_json(const Tensor& t) {
  json s = json::array();
  for (int d = 0; d < t.rank(); ++d) s.push_back(static_cast<long long>(t.shape()[d]));
  return s;
}

}  // namespace

int run_export(const Options& o) {
  namespace fs = std::filesystem;
  const Device device = dcexp::cli::parse_device(o.device);
  for (const char* sub : {"params", "buffers", "grads", "params_after", "buffers_after"})
    fs::create_directories(fs::path(o.export_dir) / sub);
  Config cfg;
  cfg.width = o.width;
  cfg.channels_last = o.channels_last;
  const Model model = Model::create(cfg, device, o.seed);
  const Batch batch = random_batch(o.batch, cfg.classes, device, o.seed + 7);
  auto dir = [&](const char* sub, const std::string& name) {
    return (fs::path(o.export_dir) / sub / (name + ".npy")).string();
  };
  json params = json::array(), buffers = json::array();
  for (const auto& [name, v] : model.named_params()) {
    write_npy(dir("params", name), v.value());
    json e = json::object();
    e["name"] = name;
    e["shape"] = shape_json(v.value());
    params.push_back(std::move(e));
  }
  for (const auto& [name, t] : model.named_buffers()) {
    write_npy(dir("buffers", name), t);
    json e = json::object();
    e["name"] = name;
    e["shape"] = shape_json(t);
    buffers.push_back(std::move(e));
  }
  write_npy((fs::path(o.export_dir) / "x.npy").string(), batch.x);
  write_npy((fs::path(o.export_dir) / "y.npy").string(), batch.y);

  dualcast::SGD opt(model.params(), o.lr, o.momentum, o.weight_decay);
  opt.zero_grad();
  Var loss = classification_loss(model.forward(Var(batch.x), true, o.fusion), batch.y, o.label_smoothing);
  loss.backward();
  for (const auto& [name, v] : model.named_params()) write_npy(dir("grads", name), v.grad());
  opt.step();
  for (const auto& [name, v] : model.named_params()) write_npy(dir("params_after", name), v.value());
  for (const auto& [name, t] : model.named_buffers()) write_npy(dir("buffers_after", name), t);

  json m = json::object();
  m["width"] = static_cast<long long>(o.width);
  m["batch"] = static_cast<long long>(o.batch);
  m["lr"] = o.lr;
  m["momentum"] = o.momentum;
  m["weight_decay"] = o.weight_decay;
  m["label_smoothing"] = o.label_smoothing;
  m["bn_momentum"] = cfg.bn_momentum;
  m["bn_eps"] = cfg.bn_eps;
  m["loss"] = loss.item();
  m["device"] = device.str();
  m["device_name"] = dualcast::device_name(device);
  m["conv_backend"] = dualcast::conv_backend_name(device);
  m["fusion"] = o.fusion == Fusion::fused ? "fused" : "composed";
  m["layout"] = o.channels_last ? "nhwc" : "nchw";
  m["params"] = std::move(params);
  m["buffers"] = std::move(buffers);
  dcexp::write_json_file((fs::path(o.export_dir) / "manifest.json").string(), m);
  std::printf("resnet_train --export: width %lld, batch %lld, loss %.8g on %s; wrote %s\n",
              static_cast<long long>(o.width), static_cast<long long>(o.batch), loss.item(),
              device.str().c_str(), o.export_dir.c_str());
  return 0;
}

}  // namespace resnet
