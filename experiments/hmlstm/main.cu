// main.cu: hmlstm_experiment, the driver of the HM-LSTM experiment (workloads a-e; see
// experiments/README.md). Validates every configuration before timing it, times on the GPU with CUDA
// events (and the host clock), measures the copy bandwidth in the same run for the memory floor,
// optionally runs the PyTorch/JAX peers (experiments/peers/peers.py) on the same shapes, and writes
// results.json, results.csv and a table. This file: run() up to workloads a-d, and main(); the other
// parts are listed in driver.hpp.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <sys/stat.h>

#include "dualcast/device.hpp"
#include "dualcast/error.hpp"
#include "dualcast/gradcheck.hpp"
#include "dualcast/memory.hpp"
#include "dualcast/precision.hpp"
#include "driver.hpp"

namespace hmdriver {
namespace {

int run(const Options& opt_in) {
  Options o = opt_in;
  // ---- device ----
  dualcast::Device device = dualcast::Device::cpu();
  if (o.device == "cuda") {
    if (!dualcast::cuda_available()) {
      std::cerr << "hmlstm_experiment: error: --device cuda: "
                << (DUALCAST_WITH_CUDA ? "no CUDA device is available on this machine"
                                       : "this build has no CUDA backend (configured without nvcc)")
                << "; use --device cpu or --device auto\n";
      return 2;
    }
    device = dualcast::Device::cuda(0);
  } else if (o.device == "auto" && dualcast::cuda_available()) {
    device = dualcast::Device::cuda(0);
  }
  const bool gpu = device.is_cuda();
#if !defined(__CUDACC__)
  if (gpu) {
    std::cerr << "hmlstm_experiment: error: this driver was compiled by a host compiler and cannot time "
                 "on the GPU; build it with the CUDA backend\n";
    return 2;
  }
#endif

  // ---- defaults by device ----
  if (o.dims.empty()) {
    if (o.full) o.dims = {512, 1024, 2048, 4096, 8192};
    else if (gpu) o.dims = {512, 1024, 2048};
    else o.dims = {256, 512};
  }
  if (o.arity_dims < 0) o.arity_dims = gpu || o.full ? 2048 : 256;
  if (o.reps < 0) o.reps = gpu ? 100 : 5;
  if (o.warmup < 0) o.warmup = gpu ? 10 : 1;
  const bool big_e = gpu || o.full;
  if (o.e_hidden < 0) o.e_hidden = big_e ? 512 : 32;
  if (o.e_batch < 0) o.e_batch = big_e ? 64 : 8;
  if (o.e_seq < 0) o.e_seq = big_e ? 100 : 16;
  if (o.e_reps < 0) o.e_reps = gpu ? 20 : 3;
  if (o.train_steps < 0) o.train_steps = big_e ? 300 : 40;

  if (!make_dirs(o.out)) {
    std::cerr << "hmlstm_experiment: error: cannot create output folder '" << o.out << "': " << std::strerror(errno) << "\n";
    return 1;
  }

  // ---- machine numbers ----
  const std::string dev_name = dualcast::device_name(device);
  log_line("hmlstm_experiment: device " + device.str() + " (" + dev_name + "), workloads " +
           [&] { std::string s; for (auto& w : o.workloads) s += (s.empty() ? "" : ",") + w; return s; }() +
           ", reps " + std::to_string(o.reps) + ", out " + o.out);
  dcexp::Bandwidth bw;
  std::size_t cache = 0;
  if (gpu) {
#if defined(__CUDACC__)
    bw = dcexp::measure_cuda_copy_bandwidth();
    cache = dcexp::cuda_l2_bytes(device.index);
#endif
  } else {
    const std::size_t avail = dcexp::host_available_bytes();
    std::size_t bytes = std::size_t(128) << 20;
    if (avail && avail / 8 < bytes) bytes = std::max<std::size_t>(avail / 8, 8 << 20);
    bw = dcexp::measure_host_copy_bandwidth(bytes, 10);
    cache = dcexp::host_llc_bytes();
  }
  log_line("  copy bandwidth " + fmt("%.1f", bw.gbps) + " GB/s (" + bw.how + "; p10-p90 " +
           fmt("%.1f", bw.gbps_p10) + "-" + fmt("%.1f", bw.gbps_p90) + "), cache " +
           std::to_string(cache >> 20) + " MiB");

  hmexp::RunContext ctx;
  ctx.device = device;
  ctx.reps = o.reps;
  ctx.warmup = o.warmup;
  ctx.copy_gbps = bw.gbps;
  ctx.cache_bytes = cache;
  ctx.max_sets = o.max_sets;
  ctx.graphs = o.graphs;
  ctx.graph_max_dims = o.graph_max_dims;
  ctx.progress = log_line;
  ctx.dtype = cell_dtype(o);
  if (dualcast::is_half(ctx.dtype)) {
    // Every value of a 16-bit run is rounded to 8 (bfloat16) or 11 (float16) significant bits, and
    // reverse mode rounds after each primitive: a few units in the last place, against the float64
    // reference of the same rounded inputs.
    ctx.rtol = 4 * (ctx.dtype == dualcast::DType::bfloat16 ? dualcast::kSameResultTolBfloat16
                                                           : dualcast::kSameResultTolFloat16);
  }
  if (o.precision == "tf32") dualcast::set_float32_matmul_precision("high");
  // Workload e's float32 products: "high" at tf32; at bf16 and fp16 the model runs under Autocast
  // instead (workload_e.cu), whose products do not read this setting.
  const std::string e_precision = device.is_cpu()          ? "highest"  // the CPU ignores the setting
                                   : o.precision == "tf32" ? "high"
                                                           : "highest";
  log_line("  precision " + o.precision + " (a, b, d stored as " + dualcast::dtype_name(ctx.dtype) +
           "; matmul precision " + dualcast::get_float32_matmul_precision() + "; e's products at \"" +
           e_precision + "\"" +
           (dualcast::is_half(ctx.dtype) ? std::string("; e under Autocast ") + dualcast::dtype_name(ctx.dtype)
            : device.is_cpu() && o.precision == "tf32" ? std::string(": the CPU's products are exact float32")
                                                       : std::string()) + ")");

  Results res;
  auto add = [&](std::vector<Measurement> v) { res.add(device, std::move(v)); };
  const Elapsed elapsed;

  // ---- pre-flight: every planned configuration must fit before anything runs ----
  for (const char* w : {"a", "b", "d"})
    if (has(o, w))
      for (auto d : o.dims) {
        const int K = std::string(w) == "b" ? 6 : 4, M = std::string(w) == "b" ? 2 : 1;
        hmexp::check_fits(ctx, hmexp::bytes_needed_cell(d, K, M, hmexp::sets_for(ctx, d, K, M)),
                          std::string("workload ") + w + " (dims " + std::to_string(d) + ")");
      }
  if (has(o, "c"))
    for (int K : o.arity)
      hmexp::check_fits(ctx, hmexp::bytes_needed_cell(o.arity_dims, K, 1, hmexp::sets_for(ctx, o.arity_dims, K, 1)),
                        "workload c (K=" + std::to_string(K) + ", dims " + std::to_string(o.arity_dims) + ")");
  if (has(o, "e")) {
    // parameters (x3: values, gradients, optimiser state) and the activations of T steps (rough)
    const double H = o.e_hidden, B = o.e_batch, T = o.e_seq, G = 4 * H + 1;
    const double params = 3 * 3 * H * G + 64 * H + 3 * H * 64;
    const double acts = T * 3 * (B * G * 8 + B * H * 16) + T * B * (3 * H + 64) * 4;
    hmexp::check_fits(ctx, 4.0 * (3 * params + acts),
                      "workload e (H=" + std::to_string(o.e_hidden) + " B=" + std::to_string(o.e_batch) +
                          " T=" + std::to_string(o.e_seq) + ")");
  }

  // ---- a ----
  if (has(o, "a")) {
    for (std::size_t j = 0; j < o.dims.size(); ++j) {
      log_line("[a] cell update K=4 dims=" + std::to_string(o.dims[j]) + " (" + std::to_string(j + 1) + "/" +
               std::to_string(o.dims.size()) + ", " + elapsed() + ")");
      add(hmexp::run_a(ctx, o.dims[j]));
    }
  }
  // ---- b ----
  if (has(o, "b")) {
    for (std::size_t j = 0; j < o.dims.size(); ++j) {
      log_line("[b] full cell K=6 M=2 dims=" + std::to_string(o.dims[j]) + " (" + std::to_string(j + 1) + "/" +
               std::to_string(o.dims.size()) + ", " + elapsed() + ")");
      add(hmexp::run_b(ctx, o.dims[j]));
    }
  }
  // ---- c ----
  if (has(o, "c")) {
    for (std::size_t j = 0; j < o.arity.size(); ++j) {
      log_line("[c] arity K=" + std::to_string(o.arity[j]) + " dims=" + std::to_string(o.arity_dims) + " (" +
               std::to_string(j + 1) + "/" + std::to_string(o.arity.size()) + ", " + elapsed() + ")");
      add(hmexp::run_c(ctx, o.arity_dims, o.arity[j]));
    }
  }
  // ---- d ----
  if (has(o, "d")) {
    for (std::size_t j = 0; j < o.dims.size(); ++j)
      for (auto layout : {hmexp::FlagLayout::rows, hmexp::FlagLayout::columns}) {
        log_line(std::string("[d] flags ") + hmexp::flag_layout_name(layout) + " dims=" + std::to_string(o.dims[j]) +
                 " (" + std::to_string(j + 1) + "/" + std::to_string(o.dims.size()) + ", " + elapsed() + ")");
        add(hmexp::run_d(ctx, o.dims[j], layout));
      }
  }
  WorkloadE e;
  if (has(o, "e")) {
    struct Restore {  // the process-wide setting back to the run's, however e ends
      std::string was = dualcast::get_float32_matmul_precision();
      ~Restore() { dualcast::set_float32_matmul_precision(was); }
    } restore;
    dualcast::set_float32_matmul_precision(e_precision);
    e = run_workload_e(o, device, res, elapsed);
    e.matmul_precision = e_precision;
  }
  const std::string valdir = write_validation_dir(o, device);
  const Peers peers = run_peers(o, device, gpu, valdir, e.variant, res, elapsed);
  return write_outputs(o, Machine{device, dev_name, bw, cache}, res, e, peers, elapsed);
}

}  // namespace

bool make_dirs(const std::string& path) {
  std::string cur;
  std::stringstream ss(path);
  std::string part;
  if (!path.empty() && path[0] == '/') cur = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += part + "/";
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return false;
  }
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace hmdriver

int main(int argc, char** argv) {
  const hmdriver::Options o = hmdriver::parse_args(argc, argv);
  try {
    return hmdriver::run(o);
  } catch (const hmexp::ExperimentError& e) {
    std::cerr << "hmlstm_experiment: error: " << e.what() << "\n";
    return e.exit_code;
  } catch (const std::exception& e) {
    std::cerr << "hmlstm_experiment: error: " << e.what() << "\n";
    return 1;
  }
}
