// profile_step.cu: hmlstm_step_profile, the captured HM-LSTM training step (workload e) as a target
// for per-kernel profiling (experiments/hmlstm/step_breakdown.py drives it).
//
//   hmlstm_step_profile [--mode mixed|reverse] [--hidden H] [--batch B] [--seq T] [--reps N] [--profile]
//                       [--unfused-cell]   (NetworkConfig::fused_cell = false: the cell as library broadcasts)
//                       [--own-inputs]     (NetworkConfig::cell_writes_next_inputs = false: each layer-step
//                                           runs its own gate-input kernel)
//                       [--autocast bf16|fp16]  (NetworkConfig::autocast: the products under Autocast)
//
// Captures one SGD training step (CapturedStep: forward over T steps, BPTT, update), validates it
// against the eager step (compare_capture), then:
//   default     times N replays (CUDA events, each from an idle device) and prints
//               "step_ms=<median> p10=<..> p90=<..> pipelined_ms=<..> graph_nodes=<n>";
//   --profile   replays the step once between cudaProfilerStart and cudaProfilerStop, so that
//               `ncu --profile-from-start off` (or `nsys --capture-range=cudaProfilerApi`) sees
//               exactly one step's kernels.
// Exit status: 0 done, 2 bad usage or no GPU, 4 the captured step disagrees with the eager one.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "../common/cli.hpp"
#include "../common/gpu_timing.hpp"
#include "dualcast/device.hpp"
#include "dualcast/error.hpp"
#include "network.hpp"

#if defined(__CUDACC__)
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#endif

namespace {

struct Options {
  std::string mode = "mixed";
  int hidden = 512, batch = 64, seq = 100, reps = 20;
  bool profile = false;
  bool fused_cell = true;
  bool next_inputs = true;
  std::string autocast;  // "", bf16 or fp16
};

int usage(const std::string& msg) {
  std::cerr << "hmlstm_step_profile: error: " << msg
            << "\nusage: hmlstm_step_profile [--mode mixed|reverse] [--hidden H] [--batch B] [--seq T] "
               "[--reps N] [--profile] [--unfused-cell] [--autocast bf16|fp16]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    dcexp::cli::ArgWalker args(argc, argv);
    while (args.next()) {
      const std::string a = args.option();
      auto int_value = [&](int lo) {
        const std::string v = args.value();
        char* end = nullptr;
        const long x = std::strtol(v.c_str(), &end, 10);
        if (v.empty() || *end != '\0' || x < lo || x > (1 << 20))
          throw dcexp::cli::UsageError(a + ": expected an integer >= " + std::to_string(lo) + ", got '" + v + "'");
        return static_cast<int>(x);
      };
      if (a == "--mode") {
        o.mode = args.value();
      } else if (a == "--hidden") {
        o.hidden = int_value(1);
      } else if (a == "--batch") {
        o.batch = int_value(1);
      } else if (a == "--seq") {
        o.seq = int_value(1);
      } else if (a == "--reps") {
        o.reps = int_value(1);
      } else if (a == "--profile") {
        args.no_value();
        o.profile = true;
      } else if (a == "--unfused-cell") {
        args.no_value();
        o.fused_cell = false;
      } else if (a == "--own-inputs") {
        args.no_value();
        o.next_inputs = false;
      } else if (a == "--autocast") {
        o.autocast = args.value();
        if (o.autocast != "bf16" && o.autocast != "fp16") throw dcexp::cli::UsageError("--autocast: bf16 or fp16");
      } else if (a == "--help" || a == "-h") {
        std::cout << "see the comment at the top of experiments/hmlstm/profile_step.cu\n";
        return 0;
      } else {
        throw dcexp::cli::UsageError("unknown option '" + a + "'");
      }
    }
    if (o.mode != "mixed" && o.mode != "reverse") throw dcexp::cli::UsageError("--mode: mixed or reverse");
  } catch (const dcexp::cli::UsageError& e) {
    return usage(e.what());
  }
#if !defined(__CUDACC__)
  return usage("this build has no CUDA backend");
#else
  if (!dualcast::cuda_available()) return usage("no CUDA device");
  try {
    hmlstm::NetworkConfig cfg;
    cfg.hidden = o.hidden;
    cfg.batch = o.batch;
    cfg.seq = o.seq;
    cfg.vocab = 64;
    cfg.device = dualcast::Device::cuda(0);
    cfg.mode = hmlstm::parse_cell_mode(o.mode);
    cfg.fused_cell = o.fused_cell;
    cfg.cell_writes_next_inputs = o.next_inputs;
    if (!o.autocast.empty())
      cfg.autocast = o.autocast == "bf16" ? dualcast::DType::bfloat16 : dualcast::DType::float16;
    std::vector<dualcast::Tensor> batches;
    for (int k = 0; k < 3; ++k)
      batches.push_back(hmlstm::random_tokens(cfg.seq, cfg.batch, cfg.vocab, cfg.seed + 1000 + k).to(cfg.device));
    const hmlstm::CaptureComparison cc = hmlstm::compare_capture(cfg, batches[0]);
    std::cerr << cc.message << "\n";
    if (!cc.ok) return 4;

    hmlstm::HmlstmNetwork net(cfg);
    hmlstm::CapturedStep step(net, cfg.seq, cfg.batch, 0.1f);
    for (int k = 0; k < 3; ++k) step.run(batches[static_cast<std::size_t>(k % 3)]);
    dualcast::synchronize(cfg.device);
    if (o.profile) {
      DCEXP_CUDA(cudaProfilerStart());
      step.run(batches[0]);
      dualcast::synchronize(cfg.device);
      DCEXP_CUDA(cudaProfilerStop());
      std::printf("profiled one replay: graph_nodes=%zu\n", step.graph().num_nodes());
      return 0;
    }
    const dcexp::StepTimes t = dcexp::time_steps_cuda(
        [](int) {}, [&](int r) { step.run(batches[static_cast<std::size_t>(r % 3)]); }, 2, o.reps);
    std::printf("step_ms=%.4f p10=%.4f p90=%.4f wall_ms=%.4f pipelined_ms=%.4f graph_nodes=%zu mode=%s H=%d B=%d T=%d device=%s\n",
                t.gpu_ms.median, t.gpu_ms.p10, t.gpu_ms.p90, t.wall_ms.median, t.pipelined_ms,
                step.graph().num_nodes(), o.mode.c_str(), o.hidden, o.batch, o.seq,
                dualcast::device_name(cfg.device).c_str());
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "hmlstm_step_profile: error: " << e.what() << "\n";
    return 1;
  }
#endif
}
