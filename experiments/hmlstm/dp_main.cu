// hmlstm_dp: the 3-layer HM-LSTM character model (network.hpp) trained data-parallel over --gpus N
// ranks (include/dualcast/data_parallel.hpp): the training step timed (--bench: eager and captured,
// with the share of the gradient all-reduce the backward hides), and the character-LM run of
// charlm.hpp (--train-steps) with its bits/char curve. --batch is the global batch: N ranks take
// batch/N sequences each, so --batch 64 --gpus 4 is strong scaling of the 1-GPU step and
// --batch 256 --gpus 4 weak scaling (64 per GPU). Rank 0 prints and writes OUT/STEM.json.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "../common/cli.hpp"
#include "../common/distributed.hpp"
#include "../common/dp_report.hpp"
#include "charlm.hpp"
#include "dualcast/graph.hpp"
#include "dualcast/optim.hpp"
#include "dualcast/random.hpp"
#include "network.hpp"
#include "train_log_json.hpp"

#if defined(__CUDACC__)
#include <cuda_profiler_api.h>
#endif

namespace {

using dcexp::json;
using dcexp::cli::parse_double;
using dcexp::cli::parse_int;
using dcexp::cli::UsageError;
using dualcast::Device;
using dualcast::Tensor;
using dualcast::Var;

const char* kUsage = R"(usage: hmlstm_dp [options]

The HM-LSTM character model (3 layers, vocabulary 64) trained data-parallel: --bench times one
training step (Adam, gradient clipping at norm 1, the gradients averaged over the ranks); with
--train-steps N it also trains the character LM for N steps on the license corpus and writes the
bits/char curve.

options:
  --gpus N             ranks (one per GPU with --device cuda; CPU processes with --device cpu),
                       started through scripts/launch (default 1)
  --device cpu|cuda    (default cuda when a GPU is present, else cpu)
  --hidden H           (default 512; CPU default 64)
  --batch B            global batch: each rank takes B/N sequences (default 64; CPU default 8)
  --seq T              (default 100; CPU default 20)
  --mode mixed|reverse the cell's differentiation (default mixed)
  --bench              time the step (eager, then captured in a Graph)
  --reps N, --warmup N timed and untimed steps (default 30, 5)
  --compute-first      with --bench and N > 1: time the step captured before the data-parallel
                       layer exists (the communicator is up, no collective has run), as well as
                       the usual compute-only step after (does a rank's compute depend on the
                       collectives, buffers or hooks that came with DataParallel?); that same
                       graph is timed again once DataParallel exists and after the data-parallel
                       step ran (is the slowdown the graph or the device's state?)
  --profile-first      with --compute-first on GPUs: rank 0 also replays that graph once between
                       cudaProfilerStart and cudaProfilerStop before DataParallel exists and once
                       after, for ncu --profile-from-start off (kernel by kernel, which slow?);
                       experiments/scaling/compare_ncu.py compares the two
  --train-steps N      character-LM steps (default 0: none)
  --lr X               Adam's learning rate for --train-steps (default 2e-3)
  --bucket-mib X       gradient bucket size in MiB (default 4: one gate weight matrix per bucket,
                       experiments/hmlstm/charlm.hpp says why)
  --corpus DIR         (default /usr/share/common-licenses)
  --out DIR, --name STEM   write DIR/STEM.json (default stem hmlstm_dp_gN)
  --help               this text

Exit status: 0 on success, 1 for a runtime error, 2 for a command-line error.
)";

struct Options {
  int gpus = 1;
  std::string device;
  int hidden = 0, batch = 0, seq = 0;  // 0 until parse settles the device's default
  hmlstm::CellMode mode = hmlstm::CellMode::mixed;
  bool bench = false;
  int reps = 30, warmup = 5;
  int train_steps = 0;
  double lr = 2e-3;
  double bucket_mib = hmlstm::kDataParallelBucketMib;
  bool compute_first = false;
  bool profile_first = false;
  std::string corpus = "/usr/share/common-licenses";
  std::string out, name;
};

Options parse(int argc, char** argv, bool& help) {
  Options o;
  help = false;
  dcexp::cli::ArgWalker args(argc, argv);
  while (args.next()) {
    const std::string a = args.option();
    auto next = [&] { return args.value(); };
    if (a == "--help" || a == "-h") { args.no_value(); help = true; }
    else if (a == "--gpus") o.gpus = static_cast<int>(parse_int(a, next(), 1, 64));
    else if (a == "--device") o.device = next();
    else if (a == "--hidden") o.hidden = static_cast<int>(parse_int(a, next(), 1, 1 << 16));
    else if (a == "--batch") o.batch = static_cast<int>(parse_int(a, next(), 1, 1 << 20));
    else if (a == "--seq") o.seq = static_cast<int>(parse_int(a, next(), 1, 1 << 16));
    else if (a == "--mode") {
      const std::string m = next();
      if (m != "mixed" && m != "reverse") throw UsageError("--mode: expected mixed or reverse, not '" + m + "'");
      o.mode = m == "mixed" ? hmlstm::CellMode::mixed : hmlstm::CellMode::reverse;
    }
    else if (a == "--bench") { args.no_value(); o.bench = true; }
    else if (a == "--compute-first") { args.no_value(); o.compute_first = true; }
    else if (a == "--profile-first") { args.no_value(); o.profile_first = true; }
    else if (a == "--reps") o.reps = static_cast<int>(parse_int(a, next(), 1));
    else if (a == "--warmup") o.warmup = static_cast<int>(parse_int(a, next(), 0));
    else if (a == "--train-steps") o.train_steps = static_cast<int>(parse_int(a, next(), 0));
    else if (a == "--lr") o.lr = parse_double(a, next());
    else if (a == "--bucket-mib") o.bucket_mib = parse_double(a, next());
    else if (a == "--corpus") o.corpus = next();
    else if (a == "--out") o.out = next();
    else if (a == "--name") o.name = next();
    else throw UsageError("unknown option '" + a + "'");
  }
  if (help) return o;
  if (!o.bench && o.train_steps == 0) throw UsageError("nothing to do: give --bench and/or --train-steps N");
  if (!(o.lr > 0 && std::isfinite(o.lr))) throw UsageError("--lr: must be a finite number > 0");
  if (!(o.bucket_mib * 1048576.0 >= 1.0 && o.bucket_mib <= 4096))
    throw UsageError("--bucket-mib: must be at least one byte (about 1e-6) and at most 4096");
  // The device's defaults are settled here, so that a batch that does not split over the ranks is
  // refused once, before any rank starts.
  if (o.device.empty()) o.device = dualcast::cuda_available() ? "cuda" : "cpu";
  const bool gpu = o.device.rfind("cuda", 0) == 0;
  if (o.hidden == 0) o.hidden = gpu ? 512 : 64;
  if (o.batch == 0) o.batch = gpu ? 64 : 8;
  if (o.seq == 0) o.seq = gpu ? 100 : 20;
  if (o.compute_first && (!o.bench || o.gpus < 2))
    throw UsageError("--compute-first: needs --bench and --gpus 2 or more");
  if (o.profile_first && (!o.compute_first || !gpu))
    throw UsageError("--profile-first: needs --compute-first on GPUs (--device cuda)");
  if (o.batch % o.gpus != 0)
    throw UsageError("--batch: " + std::to_string(o.batch) + " does not split evenly over --gpus " + std::to_string(o.gpus));
  dcexp::relaunch_if_requested(o.gpus, argc, argv);
  return o;
}

/// Random token windows [T+1, B] (ids 0..63) for the benchmark: the step's cost does not depend on
/// the text.
Tensor random_tokens(int T, int B, Device device, std::uint64_t seed) {
  std::vector<std::uint8_t> text(static_cast<std::size_t>(T + 1) * static_cast<std::size_t>(B));
  for (std::size_t i = 0; i < text.size(); ++i)
    text[i] = static_cast<std::uint8_t>(dualcast::random::uniform(seed, i) * 63.999);
  std::vector<std::int64_t> offsets(static_cast<std::size_t>(B));
  for (int b = 0; b < B; ++b) offsets[static_cast<std::size_t>(b)] = static_cast<std::int64_t>(b) * (T + 1);
  return hmlstm::window_batch(text, offsets, T).to(device);
}

/// One call of `replay` between cudaProfilerStart and cudaProfilerStop on rank 0 (what ncu
/// --profile-from-start off profiles), synchronised on both sides.
void profile_once(const dcexp::DataParallelRun& group, const std::function<void()>& replay) {
  if (group.rank() != 0) return;
#if defined(__CUDACC__)
  dualcast::synchronize(group.device);
  DCEXP_CUDA(cudaProfilerStart());
  replay();
  dualcast::synchronize(group.device);
  DCEXP_CUDA(cudaProfilerStop());
#else
  (void)replay;
#endif
}

json bench(const Options& o, const hmlstm::NetworkConfig& global, dcexp::DataParallelRun& group) {
  hmlstm::NetworkConfig local = global;
  local.batch = global.batch / group.size();
  hmlstm::HmlstmNetwork net(local);
  dualcast::Adam opt(net.params(), 2e-3);
  std::unique_ptr<dualcast::dist::DataParallel> ddp;
  const Tensor tokens = random_tokens(local.seq, local.batch, group.device, 11 + static_cast<std::uint64_t>(group.rank()));
  auto none = [](int) {};
  json first = nullptr, first_again = nullptr;
  dualcast::Graph g0;  // --compute-first: the step captured before DataParallel exists
  if (o.compute_first) {
    // Before DataParallel exists: no broadcast, no bucket, no hook, no collective yet. One eager
    // step first, so that the capture meets no first-time work.
    auto plain = [&] {
      opt.zero_grad();
      Var loss = net.loss(tokens);
      loss.backward();
      (void)hmlstm::clip_grad_norm_on_device(net.params(), 1.0);
      opt.step();
    };
    plain();
    g0.capture(group.device, plain);
    const dcexp::StepTimes t = dcexp::time_steps(group.device, none, [&](int) { g0.replay(); }, o.warmup, o.reps);
    first = dcexp::summary_json(t.primary());
    std::printf("%-10s %10d %12.3f %12.3f   (compute only, before the data-parallel layer existed)\n", "local",
                group.size(), t.primary().median, t.primary().p90);
    if (o.profile_first) profile_once(group, [&] { g0.replay(); });
  }
  if (group.size() > 1) ddp = std::make_unique<dualcast::dist::DataParallel>(
        *group.comm, net.params(), dualcast::dist::DataParallelOptions::with_bucket_mib(o.bucket_mib));
  // On the CPU a Graph replays its lambda, whose backward would now reach DataParallel's hooks.
  auto replay_first = [&](int) {
    ddp->set_sync(false);
    g0.replay();
    ddp->set_sync(true);
  };
  if (o.compute_first) {
    const dcexp::StepTimes t = dcexp::time_steps(group.device, none, replay_first, o.warmup, o.reps);
    first_again = dcexp::summary_json(t.primary());
    std::printf("%-10s %10d %12.3f %12.3f   (the same graph, replayed once DataParallel exists)\n", "local",
                group.size(), t.primary().median, t.primary().p90);
    if (o.profile_first) profile_once(group, [&] { replay_first(0); });
  }
  auto step = [&] {
    opt.zero_grad();
    Var loss = net.loss(tokens);
    loss.backward();
    if (ddp) ddp->finish();
    (void)hmlstm::clip_grad_norm_on_device(net.params(), 1.0);
    opt.step();
  };
  // The step without the gradient average, captured (sync is switched inside the lambda: on the CPU a
  // Graph replays the lambda itself).
  dualcast::Graph local_graph;
  auto capture_local = [&] {
    local_graph.capture(group.device, [&] {
      ddp->set_sync(false);
      step();
      ddp->set_sync(true);
    });
  };
  const dcexp::StepTimes eager = dcexp::time_steps(group.device, none, [&](int) { step(); }, o.warmup, o.reps);
  dualcast::Graph graph;
  graph.capture(group.device, step);
  const dcexp::StepTimes captured = dcexp::time_steps(group.device, none, [&](int) { graph.replay(); }, o.warmup, o.reps);
  const double tokens_per_step = static_cast<double>(global.batch) * global.seq;
  std::printf("%-10s %10s %12s %12s %14s\n", "step", "gpus", "median ms", "p90 ms", "tokens/s");
  for (const auto& [name, t] : {std::pair{"eager", &eager}, std::pair{"captured", &captured}})
    std::printf("%-10s %10d %12.3f %12.3f %14.0f\n", name, group.size(), t->primary().median, t->primary().p90,
                tokens_per_step / (t->primary().median * 1e-3));
  json r = json::object();
  r["eager_ms"] = dcexp::summary_json(eager.primary());
  r["captured_ms"] = dcexp::summary_json(captured.primary());
  r["tokens_per_s_captured"] = tokens_per_step / (captured.primary().median * 1e-3);
  r["graph_nodes"] = static_cast<long long>(graph.num_nodes());
  if (ddp) {
    // The captured step's parts: the same step captured without the gradient average.
    capture_local();
    if (!first.is_null()) {
      r["compute_only_before_data_parallel_ms"] = first;
      r["compute_only_before_replayed_with_data_parallel_ms"] = first_again;
      const dcexp::StepTimes t = dcexp::time_steps(group.device, none, replay_first, o.warmup, o.reps);
      r["compute_only_before_replayed_last_ms"] = dcexp::summary_json(t.primary());
      std::printf("%-10s %10d %12.3f %12.3f   (the same graph, replayed after the data-parallel step ran)\n",
                  "local", group.size(), t.primary().median, t.primary().p90);
    }
    r["data_parallel"] = dcexp::time_data_parallel_parts(group.device, [&] { local_graph.replay(); }, *ddp,
                                                         net.params(), captured.primary().median, o.warmup, o.reps);
  }
  return r;
}

json train(const Options& o, const hmlstm::NetworkConfig& cfg, dcexp::DataParallelRun& group) {
  hmlstm::TrainConfig tc;
  tc.net = cfg;
  tc.steps = o.train_steps;
  tc.log_every = std::max(1, o.train_steps / 12);
  tc.lr = static_cast<float>(o.lr);
  tc.corpus_dir = o.corpus;
  tc.captured = true;
  tc.comm = group.comm.get();
  tc.ddp_options = dualcast::dist::DataParallelOptions::with_bucket_mib(o.bucket_mib);
  const hmlstm::TrainLog log = tc.steps > 0 ? hmlstm::train_charlm(tc, [](int step, double bpc) {
    std::printf("  step %4d: %.4f bits/char (training)\n", step, bpc);
    std::fflush(stdout);
  }) : hmlstm::TrainLog{};
  json v = hmlstm::train_log_json(log);
  v["lr"] = o.lr;
  if (!log.valid_bpc.empty())
    std::printf("final validation %.4f bits/char after %d steps; %.3f ms/step, %.1f s training\n",
                log.valid_bpc.back(), tc.steps, log.ms_per_step, log.train_seconds);
  return v;
}

int run(const Options& o) {
  dcexp::DataParallelRun group = dcexp::join_group(o.gpus, dcexp::cli::parse_device(o.device));
  hmlstm::NetworkConfig cfg;
  cfg.hidden = o.hidden;
  cfg.batch = o.batch;
  cfg.seq = o.seq;
  cfg.vocab = hmlstm::kCharVocab;
  cfg.device = group.device;
  cfg.mode = o.mode;
  std::printf("hmlstm_dp: H=%d B=%d (global; %d per rank) T=%d, %s mode, %d rank(s) (%s) on %s\n", cfg.hidden,
              cfg.batch, cfg.batch / group.size(), cfg.seq, hmlstm::cell_mode_name(cfg.mode), group.size(),
              group.comm->backend().c_str(), dualcast::device_name(group.device).c_str());
  json js = json::object();
  js["what"] = "HM-LSTM character model training step (Adam, clip 1.0), data-parallel";
  js["hidden"] = cfg.hidden;
  js["batch"] = cfg.batch;
  js["batch_per_gpu"] = cfg.batch / group.size();
  js["seq"] = cfg.seq;
  js["mode"] = hmlstm::cell_mode_name(cfg.mode);
  js["gpus"] = group.size();
  js["comm_backend"] = group.comm->backend();
  js["device_name"] = dualcast::device_name(group.device);
  js["precision"] = "fp32";
  js["time_utc"] = dcexp::iso_time();
  if (o.bench) js["bench"] = bench(o, cfg, group);
  if (o.train_steps > 0) js["training"] = train(o, cfg, group);
  if (!o.out.empty() && group.is_root()) {
    std::filesystem::create_directories(o.out);
    const std::string path = o.out + "/" + (o.name.empty() ? "hmlstm_dp_g" + std::to_string(group.size()) : o.name) + ".json";
    dcexp::write_json_file(path, js);
    std::printf("wrote %s\n", path.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return dcexp::cli::driver_main("hmlstm_dp", kUsage, argc, argv, parse, run); }
