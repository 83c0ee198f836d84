// ops_bench.cu: ops_bench, the per-op CPU vs GPU analysis (see README.md beside this file). For each
// op of the reverse-mode op library (add, multiply, materialised transpose, pow, broadcast add, sum,
// sum over an axis, matmul) and each square size n, it first checks the GPU's output and gradients
// against the CPU's (and the CPU's against a float64 host reference at small n), then times the
// forward and the backward separately on each device through the public tape API, and writes
// ops.json, ops.csv and a markdown table of times and GPU speedups. This file: the command line,
// run() and main(); the parts are listed in ops_bench.hpp.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../common/cli.hpp"
#include "../common/report.hpp"
#include "../common/text.hpp"
#include "ops_bench.hpp"

namespace opsbench {
namespace {

using dcexp::fmt;
using dcexp::log_line;
using dcexp::cli::parse_int;
using dcexp::cli::UsageError;

// =====================================================================================================
// command line
// =====================================================================================================

constexpr const char* kUsage = R"(usage: ops_bench [options]

The per-op CPU vs GPU analysis of dualcast: each op of the reverse-mode op library on square float32
[n,n] operands, through the tape API, forward and backward timed separately, on the CPU (dualcast's
thread pool; OpenBLAS for matmul) and on the GPU (CUDA; cuBLAS for matmul). Every op and size is
checked before it is timed: the GPU's output and gradients against the CPU's (every size), and the
CPU's against a float64 host reference (n <= 256).

ops (--ops, comma-separated; default all):
  add        x + y                 mul        x * y
  transpose  transpose(x), a materialised copy
  pow        pow(x, y), both differentiated, x in (0.5,2], y in (-2,2]
  broadcast  x[n,n] + b[1,n]; its backward sums the adjoint over rows into db (sum_to)
  sum        sum of all elements   sum_axis1  sum(x, 1), one total per row
  matmul     a[n,n] b[n,n]

options:
  --sizes LIST        sizes n, comma-separated (default 64,128,...,8192)
  --max-size N        drop sizes above N
  --devices LIST      cpu, cuda or cpu,cuda (default: both when a GPU is present, else cpu)
  --ops LIST          subset of the ops above
  --reps N            timed repetitions per measurement, at least 3 (default 30)
  --min-time S        keep repeating beyond --reps (up to 10x) until S seconds (default 0.05)
  --max-time S        stop once S seconds have passed, after at least 3 repetitions; wins over
                      --reps and --min-time, so large CPU sizes take a few (default 0.5)
  --out DIR           output folder (default results/ops): ops.json, ops.csv, table.md
  --help              this text

Timing: the median (and p10/p90) of the repetitions after warm-up. GPU: CUDA events around each
repetition, started from an idle device. CPU: the host clock. Forward = building the output Var;
backward = backward(seed) alone, on a graph built outside the timed region (retain_graph).
Rates: GB/s = bytes that must move (reads + writes, float32) / median time; TFLOP/s for matmul
(2n^3 forward, 4n^3 backward). Speedup = CPU median / GPU median.

The table goes to stdout (and DIR/table.md), progress to stderr. Exit status: 0 done; 1 an error;
2 bad usage; 3 a size did not fit in memory (the rest was measured); 4 a check failed (that op's
timings are marked invalid).
)";

std::vector<std::string> split_list(const std::string& opt, const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) throw UsageError(opt + ": empty entry in '" + s + "'");
    out.push_back(item);
  }
  if (out.empty()) throw UsageError(opt + ": empty list");
  return out;
}

double parse_seconds(const std::string& opt, const std::string& s, bool zero_ok) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || errno != 0) throw UsageError(opt + ": '" + s + "' is not a number");
  if (!std::isfinite(v) || v < 0 || (!zero_ok && v == 0))
    throw UsageError(opt + ": " + s + " must be a finite number of seconds " + (zero_ok ? ">= 0" : "> 0"));
  return v;
}

Options parse(int argc, char** argv, bool& help) {
  Options o;
  help = false;
  dcexp::cli::ArgWalker args(argc, argv);
  while (args.next()) {
    const std::string a = args.option();
    auto next = [&] { return args.value(); };
    if (a == "--help" || a == "-h") {
      args.no_value();
      help = true;
    } else if (a == "--sizes") {
      o.sizes.clear();
      for (const auto& s : split_list(a, next())) o.sizes.push_back(parse_int(a, s, 1, 65536));
    } else if (a == "--max-size") {
      o.max_size = parse_int(a, next(), 1, 65536);
    } else if (a == "--devices") {
      o.devices = split_list(a, next());
      for (const auto& d : o.devices)
        if (d != "cpu" && d != "cuda") throw UsageError("--devices: unknown device '" + d + "' (expected cpu or cuda)");
    } else if (a == "--ops") {
      o.ops.clear();
      for (const auto& s : split_list(a, next())) {
        const OpSpec* op = find_op(s);
        if (!op) throw UsageError("--ops: unknown op '" + s + "' (see --help)");
        if (std::find(o.ops.begin(), o.ops.end(), op) == o.ops.end()) o.ops.push_back(op);
      }
    } else if (a == "--reps") {
      o.budget.reps = static_cast<int>(parse_int(a, next(), kMinReps, 1000000));
    } else if (a == "--min-time") {
      o.budget.min_s = parse_seconds(a, next(), true);
    } else if (a == "--max-time") {
      o.budget.max_s = parse_seconds(a, next(), false);
    } else if (a == "--out") {
      o.out = next();
      if (o.out.empty()) throw UsageError("--out: empty folder name");
    } else {
      throw UsageError("unknown option '" + a + "'");
    }
  }
  if (o.sizes.empty())
    for (std::int64_t n = 64; n <= 8192; n *= 2) o.sizes.push_back(n);
  std::sort(o.sizes.begin(), o.sizes.end());
  o.sizes.erase(std::unique(o.sizes.begin(), o.sizes.end()), o.sizes.end());
  if (o.max_size > 0) {
    std::erase_if(o.sizes, [&](std::int64_t n) { return n > o.max_size; });
    if (o.sizes.empty()) throw UsageError("--max-size " + std::to_string(o.max_size) + " leaves no size to run");
  }
  if (o.ops.empty())
    for (const auto& op : kOps) o.ops.push_back(&op);
  return o;
}

int run(const Options& o) {
  // ---- devices ----
  const bool have_gpu = dualcast::cuda_available();
  std::vector<std::string> devices = o.devices;
  if (devices.empty()) devices = have_gpu ? std::vector<std::string>{"cpu", "cuda"} : std::vector<std::string>{"cpu"};
  const bool want_cpu = std::find(devices.begin(), devices.end(), "cpu") != devices.end();
  const bool want_gpu = std::find(devices.begin(), devices.end(), "cuda") != devices.end();
  if (want_gpu) {
#if !defined(__CUDACC__)
    throw UsageError("--devices cuda: this ops_bench was built without the CUDA backend (a CPU-only build)");
#endif
    if (!have_gpu) throw UsageError("--devices cuda: no CUDA device is available");
  }

  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(o.out, ec);
  DUALCAST_CHECK(!ec && fs::is_directory(o.out), "ops_bench: cannot create output folder '", o.out, "'",
                 ec ? ": " + ec.message() : std::string());

  const std::string date = dcexp::iso_time();
  const std::string cpu_desc = cpu_model() + ", " + dualcast::device_name(Device::cpu());
  const std::string gpu_desc = want_gpu ? dualcast::device_name(Device::cuda(0)) : "";
  {
    std::string ops, sizes;
    for (const OpSpec* op : o.ops) ops += (ops.empty() ? "" : ",") + std::string(op->name);
    for (std::int64_t n : o.sizes) sizes += (sizes.empty() ? "" : ",") + std::to_string(n);
    log_line("ops_bench: CPU " + cpu_desc + (want_cpu ? "" : " (reference only)") +
             (want_gpu ? "; GPU " + gpu_desc : "; no GPU") + "; ops " + ops + "; sizes " + sizes + "; reps " +
             std::to_string(o.budget.reps) + ", min-time " + fmt("%g", o.budget.min_s) + " s, max-time " +
             fmt("%g", o.budget.max_s) + " s; out " + o.out);
  }

  // ---- the sweep: sizes ascending, so memory grows gradually and a size that does not fit comes last
  Sweep s;
  const double t0 = dcexp::now_ms();
  for (std::int64_t n : o.sizes)
    for (const OpSpec* op : o.ops) run_unit(s, *op, n, want_cpu, want_gpu, o.budget);
  const double total_s = (dcexp::now_ms() - t0) / 1e3;
  for (auto& r : s.rows) r.valid = r.timed() && !s.failed_ops.count(r.op);

  // ---- outputs ----
  return write_outputs(s, o, devices, cpu_desc, gpu_desc, date, total_s);
}

}  // namespace
}  // namespace opsbench

int main(int argc, char** argv) {
  return dcexp::cli::driver_main("ops_bench", opsbench::kUsage, argc, argv, opsbench::parse, opsbench::run);
}
