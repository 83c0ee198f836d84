// main.cu: hmlstm_experiment, the driver of the HM-LSTM experiment (workloads a-e; see
// experiments/README.md). Validates every configuration before timing it, times on the GPU with CUDA
// events (and the host clock), measures the copy bandwidth in the same run for the memory floor,
// optionally runs the PyTorch/JAX peers (experiments/peers/peers.py) on the same shapes, and writes
// results.json, results.csv and a table.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dualcast/device.hpp"
#include "dualcast/error.hpp"
#include "dualcast/memory.hpp"

#include "../common/cli.hpp"
#include "../common/gpu_timing.hpp"
#include "../common/json_lite.hpp"
#include "../common/report.hpp"
#include "workloads.hpp"

#if DCEXP_HAVE_NETWORK
#include "charlm.hpp"
#include "network.hpp"
#endif

#ifndef DCEXP_SOURCE_DIR
#define DCEXP_SOURCE_DIR "."
#endif

namespace {

using dcexp::json::Value;
using hmexp::ExperimentError;
using hmexp::Measurement;

// =====================================================================================================
// command line
// =====================================================================================================

constexpr const char* kUsage = R"(usage: hmlstm_experiment [options]

The HM-LSTM experiment of dualcast: mixed-mode broadcast (one fused kernel of the if-form) against
pure reverse mode (the select form on Vars: one kernel per primitive), validated, then timed.

Workloads (--workloads, comma-separated; default a,b,c,d,e):
  a  the 2018 paper's cell update, K = 4, z/zb [dims,1] row flags, dims x dims
  b  the full cell: c', h' from z, zb, c, h, f, i, o, g (K = 6, two outputs from one kernel)
  c  arity sweep: prod_k tanh(x_k > 0.5 ? x_k : -x_k), K = 1..10, at --arity-dims^2
  d  flags row-uniform [dims,1] vs divergent [1,dims] (workload a), store vs recompute
  e  the 3-layer HM-LSTM character model: one training step (mixed vs reverse), then a short
     character-LM training run in both modes (bits/char curves)
Each of a-d times three methods: mixed (Partials::recompute), mixed_store (Partials::store),
reverse (select form on Vars). a and b (dims up to --graph-max-dims) and e also time the step
recorded once in a dualcast::Graph and replayed: mixed_graph, reverse_graph (validated against the
eager step first).

Options:
  --device auto|cpu|cuda   where to run (default auto: the GPU when one is present)
  --workloads LIST         subset of a,b,c,d,e
  --dims LIST              matrix sizes for a, b, d (default: GPU 512,1024,2048; CPU 256,512)
  --full                   the full GPU sweep: dims 512,1024,2048,4096,8192, network H=512 B=64
                           T=100, 300 training steps
  --arity-dims N           size of workload c (default: GPU 2048, CPU 256)
  --arity LIST             arities of workload c (default 1..10)
  --reps N                 timed repetitions per measurement (default: GPU 100, CPU 5)
  --warmup N               untimed repetitions first (default: GPU 10, CPU 1; at least one pass
                           over every rotated input set)
  --e-hidden H --e-batch B --e-seq T
                           network shape of workload e (default: GPU 512/64/100; CPU 32/8/16)
  --e-reps N               timed training steps (default: GPU 20, CPU 3)
  --train-steps N          steps of the training run (default: GPU 300, CPU 40; 0 skips it); the
                           mixed-mode run is also replayed from a capture and must give the eager
                           run's bits/char curve (to 1e-6)
  --no-graphs              skip the captured variants (mixed_graph, reverse_graph, captured training)
  --graph-max-dims N       largest dims of a and b with captured variants (default 1024)
  --max-sets N             input sets rotated at most (default 16; enough to exceed 2x the cache)
  --out DIR                output folder (default results/hmlstm): results.json, results.csv
  --validate-dir DIR       write the peers' validation directory (a_*, b_* at dims 256; e_* by
                           hmlstm::write_validation at H=64 B=8 T=24)
  --peers                  run experiments/peers/peers.py (python3) on the same shapes and add its
                           numbers to the table (validated against --validate-dir, or OUT/validate)
  --peer-methods LIST      peers' methods, each run in its own python process in this order
                           (default eager,jax,compile; numpy = CPU test double)
  --peer-budget S          seconds the peers may take all together (default: no limit); a
                           measurement that would start later is recorded as skipped, so a run
                           under a hard wall-clock limit keeps what it measured
  --python PATH            interpreter for the peers (default: the first of python3,
                           /usr/bin/python3 that has numpy)
  --help                   this text

Exit status: 0 done; 2 bad usage (or a GPU requested where there is none); 3 a size does not fit in
memory; 4 a validation failed (mixed vs reverse vs float64 reference); 1 any other error.
)";

struct Options {
  std::string device = "auto";
  std::vector<std::string> workloads{"a", "b", "c", "d", "e"};
  std::vector<std::int64_t> dims;
  bool full = false;
  std::int64_t arity_dims = -1;
  std::vector<int> arity{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  int reps = -1, warmup = -1;
  int e_hidden = -1, e_batch = -1, e_seq = -1, e_reps = -1, train_steps = -1;
  int max_sets = 16;
  bool graphs = true;
  std::int64_t graph_max_dims = 1024;
  std::string out = "results/hmlstm";
  std::string validate_dir;
  bool peers = false;
  // torch.compile last: its per-shape compilation is the slowest part of the peers
  std::string peer_methods = "eager,jax,compile";
  double peer_budget_s = 0;  // 0: no limit
  std::string python;
};

[[noreturn]] void usage_error(const std::string& msg) {
  std::cerr << "hmlstm_experiment: error: " << msg << "\n(run with --help for the options)\n";
  std::exit(2);
}

std::vector<std::string> split_csv(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

long long parse_int(const std::string& opt, const std::string& v, long long lo, long long hi) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0) usage_error(opt + ": not an integer: '" + v + "'");
  if (x < lo || x > hi)
    usage_error(opt + ": " + v + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

Options parse_args(int argc, char** argv) {
  Options o;
  dcexp::cli::ArgWalker args(argc, argv);
  // The walk throws for a missing or unwanted value; this driver's convention is usage_error (exit 2).
  auto value = [&]() -> std::string {
    try {
      return args.value();
    } catch (const dcexp::cli::UsageError& e) {
      usage_error(e.what());
    }
  };
  auto flag = [&] {
    try {
      args.no_value();
    } catch (const dcexp::cli::UsageError& e) {
      usage_error(e.what());
    }
  };
  while (args.next()) {
    const std::string a = args.option();
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      std::exit(0);
    } else if (a == "--device") {
      o.device = value();
      if (o.device != "auto" && o.device != "cpu" && o.device != "cuda" && o.device != "gpu")
        usage_error("--device: expected auto, cpu or cuda, got '" + o.device + "'");
      if (o.device == "gpu") o.device = "cuda";
    } else if (a == "--workloads") {
      o.workloads.clear();
      for (const auto& w : split_csv(value())) {
        if (w != "a" && w != "b" && w != "c" && w != "d" && w != "e")
          usage_error("--workloads: unknown workload '" + w + "' (choose from a,b,c,d,e)");
        if (std::find(o.workloads.begin(), o.workloads.end(), w) == o.workloads.end()) o.workloads.push_back(w);
      }
      if (o.workloads.empty()) usage_error("--workloads: empty list");
    } else if (a == "--dims") {
      o.dims.clear();
      for (const auto& d : split_csv(value())) o.dims.push_back(parse_int("--dims", d, 4, 1 << 17));
      if (o.dims.empty()) usage_error("--dims: empty list");
    } else if (a == "--full") {
      flag();
      o.full = true;
    } else if (a == "--arity-dims") {
      o.arity_dims = parse_int(a, value(), 1, 1 << 17);
    } else if (a == "--arity") {
      o.arity.clear();
      for (const auto& k : split_csv(value())) o.arity.push_back(static_cast<int>(parse_int("--arity", k, 1, 10)));
      if (o.arity.empty()) usage_error("--arity: empty list");
    } else if (a == "--reps") {
      o.reps = static_cast<int>(parse_int(a, value(), 1, 1000000));
    } else if (a == "--warmup") {
      o.warmup = static_cast<int>(parse_int(a, value(), 0, 1000000));
    } else if (a == "--e-hidden") {
      o.e_hidden = static_cast<int>(parse_int(a, value(), 1, 1 << 16));
    } else if (a == "--e-batch") {
      o.e_batch = static_cast<int>(parse_int(a, value(), 1, 1 << 16));
    } else if (a == "--e-seq") {
      o.e_seq = static_cast<int>(parse_int(a, value(), 1, 1 << 16));
    } else if (a == "--e-reps") {
      o.e_reps = static_cast<int>(parse_int(a, value(), 1, 100000));
    } else if (a == "--train-steps") {
      o.train_steps = static_cast<int>(parse_int(a, value(), 0, 10000000));
    } else if (a == "--no-graphs") {
      flag();
      o.graphs = false;
    } else if (a == "--graph-max-dims") {
      o.graph_max_dims = parse_int(a, value(), 1, 1 << 17);
    } else if (a == "--max-sets") {
      o.max_sets = static_cast<int>(parse_int(a, value(), 1, 1024));
    } else if (a == "--out") {
      o.out = value();
      if (o.out.empty()) usage_error("--out: empty path");
    } else if (a == "--validate-dir") {
      o.validate_dir = value();
      if (o.validate_dir.empty()) usage_error("--validate-dir: empty path");
    } else if (a == "--peers") {
      flag();
      o.peers = true;
    } else if (a == "--peer-methods") {
      o.peer_methods = value();
      const std::set<std::string> known{"eager", "compile", "jax", "jax_remat", "numpy"};
      for (const auto& m : split_csv(o.peer_methods))
        if (!known.count(m)) usage_error("--peer-methods: unknown method '" + m + "' (eager, compile, jax, jax_remat, numpy)");
      if (split_csv(o.peer_methods).empty()) usage_error("--peer-methods: empty list");
    } else if (a == "--peer-budget") {
      const std::string v = value();
      char* end = nullptr;
      o.peer_budget_s = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(o.peer_budget_s > 0) || !std::isfinite(o.peer_budget_s))
        usage_error("--peer-budget: expected a positive number of seconds, got '" + v + "'");
    } else if (a == "--python") {
      o.python = value();
    } else {
      usage_error("unknown option '" + a + "'");
    }
  }
  return o;
}

bool has(const Options& o, const std::string& w) {
  return std::find(o.workloads.begin(), o.workloads.end(), w) != o.workloads.end();
}

// =====================================================================================================
// helpers
// =====================================================================================================

void log_line(const std::string& s) {
  std::cerr << s << std::endl;
}

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

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

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') q += "'\\''";
    else q += c;
  }
  return q + "'";
}

Value measurement_json(const Measurement& m) {
  Value v = Value::object();
  v["workload"] = m.workload;
  v["variant"] = m.variant;
  v["dims"] = static_cast<double>(m.dims);
  v["method"] = m.method;
  v["policy"] = m.policy;
  v["median_ms"] = m.median_ms();
  v["p10_ms"] = m.times.primary().p10;
  v["p90_ms"] = m.times.primary().p90;
  v["timer"] = m.times.gpu_ms.n > 0 ? "cuda_events" : "wall";
  v["gpu_ms"] = dcexp::summary_json(m.times.gpu_ms);
  v["wall_ms"] = dcexp::summary_json(m.times.wall_ms);
  v["pipelined_ms"] = m.times.pipelined_ms;
  v["reps"] = m.times.reps;
  v["warmup"] = m.times.warmup;
  v["bytes"] = m.bytes;
  v["floor_bytes"] = m.floor_bytes;
  v["floor_ms"] = m.floor_ms;
  v["achieved_gbps"] = m.bytes > 0 ? dcexp::achieved_gbps(m.bytes, m.median_ms()) : NAN;
  v["ratio_to_floor"] = m.floor_ms > 0 ? m.median_ms() / m.floor_ms : NAN;
  v["input_sets"] = m.input_sets;
  v["tape_nodes_per_step"] = m.kernels_per_step;
  v["validated"] = m.validated;
  v["max_rel_err"] = m.max_rel_err;
  v["mallocs_during_timing"] = static_cast<double>(m.mallocs_during_timing);
  v["note"] = m.note;
  return v;
}

// =====================================================================================================
// the table
// =====================================================================================================

struct Row {
  std::string workload, variant;
  std::int64_t dims = 0;
  double floor_ms = NAN;
  std::map<std::string, double> ms;  // method -> median ms
};

std::string row_label(const Row& r) {
  if (r.workload == "c") return "c " + r.variant + " @" + std::to_string(r.dims);
  if (r.workload == "e") return "e " + r.variant;
  return r.workload + (r.variant.empty() ? "" : " " + r.variant) + " " + std::to_string(r.dims);
}

Row& row_for(std::vector<Row>& rows, const std::string& w, const std::string& variant, std::int64_t dims) {
  for (auto& r : rows)
    if (r.workload == w && r.variant == variant && r.dims == dims) return r;
  rows.push_back(Row{w, variant, dims, NAN, {}});
  return rows.back();
}

struct TableOut {
  std::string text;
  Value json = Value::array();
};

TableOut make_table(const std::vector<Row>& rows, const std::vector<std::string>& peer_methods) {
  std::vector<std::string> cols{"mixed", "mixed_store", "reverse", "mixed_graph", "reverse_graph"};
  for (const auto& p : peer_methods) cols.push_back(p);
  std::ostringstream os;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-24s %4s %10s", "workload/size", "unit", "floor");
  os << buf;
  for (const auto& c : cols) {
    std::snprintf(buf, sizeof buf, " %11s", c.c_str());
    os << buf;
  }
  os << "  mixed/floor reverse/mixed best-peer/mixed rev_g/mix_g best-peer/mix_g\n";
  TableOut t;
  for (const auto& r : rows) {
    const bool ms_unit = r.workload == "e";
    const double scale = ms_unit ? 1.0 : 1000.0;
    std::snprintf(buf, sizeof buf, "%-24s %4s %10s", row_label(r).c_str(), ms_unit ? "ms" : "us",
                  std::isfinite(r.floor_ms) ? fmt(ms_unit ? "%.3f" : "%.1f", r.floor_ms * scale).c_str() : "n/a");
    os << buf;
    Value jr = Value::object();
    jr["row"] = row_label(r);
    jr["workload"] = r.workload;
    jr["variant"] = r.variant;
    jr["dims"] = static_cast<double>(r.dims);
    jr["floor_ms"] = r.floor_ms;
    for (const auto& c : cols) {
      const auto it = r.ms.find(c);
      const bool ok = it != r.ms.end() && std::isfinite(it->second);
      std::snprintf(buf, sizeof buf, " %11s", ok ? fmt(ms_unit ? "%.3f" : "%.1f", it->second * scale).c_str() : "-");
      os << buf;
      jr[c + "_ms"] = ok ? it->second : NAN;
    }
    auto get = [&](const std::string& k) {
      const auto it = r.ms.find(k);
      return it == r.ms.end() ? NAN : it->second;
    };
    const double mixed = get("mixed"), reverse = get("reverse");
    double best_peer = NAN;
    for (const auto& p : peer_methods) {
      const double v = get(p);
      if (std::isfinite(v) && !(v >= best_peer)) best_peer = v;
    }
    const double mixed_g = get("mixed_graph"), reverse_g = get("reverse_graph");
    const double r1 = mixed / r.floor_ms, r2 = reverse / mixed, r3 = best_peer / mixed;
    const double r4 = reverse_g / mixed_g, r5 = best_peer / mixed_g;
    auto ratio = [](double x) { return std::isfinite(x) ? fmt("%.2f", x) : std::string("-"); };
    std::snprintf(buf, sizeof buf, "  %11s %13s %15s %11s %15s\n", ratio(r1).c_str(), ratio(r2).c_str(),
                  ratio(r3).c_str(), ratio(r4).c_str(), ratio(r5).c_str());
    os << buf;
    jr["mixed_over_floor"] = r1;
    jr["reverse_over_mixed"] = r2;
    jr["best_peer_over_mixed"] = r3;
    jr["reverse_graph_over_mixed_graph"] = r4;
    jr["best_peer_over_mixed_graph"] = r5;
    t.json.push_back(std::move(jr));
  }
  t.text = os.str();
  return t;
}

// =====================================================================================================
// peers
// =====================================================================================================

std::string find_python(const Options& o) {
  std::vector<std::string> cands;
  if (!o.python.empty()) cands.push_back(o.python);
  cands.push_back("python3");
  cands.push_back("/usr/bin/python3");
  for (const auto& c : cands) {
    const std::string cmd = shell_quote(c) + " -c 'import numpy' >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) return c;
  }
  return "";
}

// =====================================================================================================
// main
// =====================================================================================================

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

  std::vector<Measurement> ms;
  std::vector<Row> rows;
  auto add = [&](std::vector<Measurement> v) {
    dualcast::empty_cache(device);  // the next configuration's sizes start from a clean cache
    for (auto& m : v) {
      Row& r = row_for(rows, m.workload, m.variant, m.dims);
      if (m.floor_ms > 0) r.floor_ms = m.floor_ms;
      r.ms[m.method] = m.median_ms();
      ms.push_back(std::move(m));
    }
  };
  const double t_start = dcexp::now_ms();
  auto elapsed = [&] { return fmt("%.0fs", (dcexp::now_ms() - t_start) / 1000); };

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
  // ---- e ----
  Value training = Value::object();
  bool training_ok = true;
  std::string e_variant;
  if (has(o, "e")) {
#if DCEXP_HAVE_NETWORK
    hmlstm::NetworkConfig cfg;
    cfg.hidden = o.e_hidden;
    cfg.batch = o.e_batch;
    cfg.seq = o.e_seq;
    cfg.vocab = 64;
    cfg.device = device;
    e_variant = "H=" + std::to_string(cfg.hidden) + " B=" + std::to_string(cfg.batch) + " T=" + std::to_string(cfg.seq);
    std::vector<std::pair<hmlstm::CellMode, bool>> e_methods{{hmlstm::CellMode::mixed, false},
                                                             {hmlstm::CellMode::reverse, false}};
    if (o.graphs) {
      e_methods.emplace_back(hmlstm::CellMode::mixed, true);
      e_methods.emplace_back(hmlstm::CellMode::reverse, true);
    }
    for (const auto& [mode, captured] : e_methods) {
      cfg.mode = mode;
      const std::string method = std::string(hmlstm::cell_mode_name(mode)) + (captured ? "_graph" : "");
      log_line("[e] training step " + method + " " + e_variant + " (" + elapsed() + ")");
      hmlstm::StepTiming st;
      try {
        st = hmlstm::time_training_step(cfg, std::max(1, o.warmup / 5), o.e_reps, captured);
      } catch (const dualcast::Error& e) {
        const std::string what = e.what();
        if (what.find("validation failed") != std::string::npos)
          throw ExperimentError(std::string("VALIDATION FAILED: workload e: ") + what, 4);
        throw;
      }
      Measurement m;
      m.workload = "e";
      m.variant = e_variant;
      m.dims = cfg.hidden;
      m.method = method;
      m.policy = mode == hmlstm::CellMode::mixed ? "automatic" : "";
      if (captured) m.kernels_per_step = static_cast<int>(st.graph_nodes);
      m.times.reps = st.reps;
      m.times.wall_ms.median = st.wall_ms_median;
      m.times.wall_ms.p10 = st.wall_ms_p10;
      m.times.wall_ms.p90 = st.wall_ms_p90;
      m.times.wall_ms.n = st.reps;
      if (std::isfinite(st.gpu_ms_median)) {
        m.times.gpu_ms.median = st.gpu_ms_median;
        m.times.gpu_ms.n = st.reps;
      }
      m.floor_ms = 0;
      m.validated = true;
      m.max_rel_err = st.mode_rel_err;
      m.note = "step-0 loss " + fmt("%.6f", st.loss) + " nats; SGD lr 0.1";
      if (captured) {
        m.max_rel_err = std::max(st.mode_rel_err, st.capture_rel_err);
        m.note += "; captured step (" + std::to_string(st.graph_nodes) + " graph nodes) vs eager: " +
                  (st.capture_bitwise ? std::string("identical") : "max rel err " + fmt("%.1e", st.capture_rel_err));
      }
      log_line("  e " + e_variant + " " + m.method + " median " + fmt("%.3f", m.median_ms()) + " ms/step (wall " +
               fmt("%.3f", st.wall_ms_median) + "), validated (mixed vs reverse err " + fmt("%.1e", st.mode_rel_err) +
               (captured ? std::string(st.capture_bitwise ? "; captured == eager bit for bit"
                                                          : "; captured vs eager err " + fmt("%.1e", st.capture_rel_err))
                         : std::string()) +
               ")");
      add({m});
    }
    if (o.train_steps > 0) {
      hmlstm::TrainConfig tc;
      tc.net = cfg;
      tc.net.mode = hmlstm::CellMode::mixed;
      tc.steps = o.train_steps;
      tc.log_every = std::max(1, o.train_steps / 12);
      log_line("[e] character-LM training, " + std::to_string(tc.steps) + " steps per mode, " + e_variant +
               ", corpus " + tc.corpus_dir + " (" + elapsed() + ")");
      std::string cur_mode = "mixed";
      int last_step = -1;
      auto progress = [&](int step, double bpc) {
        if (step < last_step) cur_mode = "reverse";
        last_step = step;
        log_line("  train " + cur_mode + " step " + std::to_string(step) + ": " + fmt("%.4f", bpc) + " bits/char");
      };
      const hmlstm::CurveComparison cc = hmlstm::compare_charlm_modes(tc, 0.0, progress);
      auto log_json = [](const hmlstm::TrainLog& l) {
        Value v = Value::object();
        Value st = Value::array(), tr = Value::array(), va = Value::array(), sl = Value::array();
        for (auto s : l.step) st.push_back(s);
        for (auto s : l.train_bpc) tr.push_back(s);
        for (auto s : l.valid_bpc) va.push_back(s);
        for (auto s : l.slope) sl.push_back(s);
        v["step"] = st;
        v["train_bpc"] = tr;
        v["valid_bpc"] = va;
        v["slope"] = sl;
        v["seconds"] = l.seconds;
        v["train_seconds"] = l.train_seconds;
        v["ms_per_step"] = l.ms_per_step;
        return v;
      };
      training["config"] = e_variant + " steps=" + std::to_string(tc.steps) + " Adam lr " + fmt("%g", tc.lr) +
                           " slope " + fmt("%g", tc.net.slope) + "->" + fmt("%g", tc.slope_final);
      training["mixed"] = log_json(cc.mixed);
      training["reverse"] = log_json(cc.reverse);
      training["max_abs_diff_bpc"] = cc.max_abs_diff_bpc;
      training["tolerance_bpc"] = cc.tolerance;
      training["parted_at_step"] = cc.parted_at_step;
      training["max_rel_diff_after_parting"] = cc.max_rel_diff_after;
      training["drift_rtol"] = cc.drift_rtol;
      training["curves_agree"] = cc.ok;
      training["message"] = cc.message;
      auto falling = [](const hmlstm::TrainLog& l) {
        return l.train_bpc.size() >= 2 && l.train_bpc.back() < l.train_bpc.front();
      };
      training["bpc_falls"] = falling(cc.mixed) && falling(cc.reverse);
      training_ok = cc.ok && falling(cc.mixed) && falling(cc.reverse);
      hmlstm::TrainLog graph_log;
      if (o.graphs) {
        // The mixed-mode run again, its step recorded once and replayed: the same curve.
        hmlstm::TrainConfig tg = tc;
        tg.captured = true;
        log_line("[e] character-LM training replayed from a capture (mixed), " + std::to_string(tc.steps) +
                 " steps (" + elapsed() + ")");
        cur_mode = "mixed_graph";
        last_step = -1;
        graph_log = hmlstm::train_charlm(tg, progress);
        const hmlstm::CaptureCurveComparison gc = hmlstm::compare_capture_curves(cc.mixed, graph_log);
        training["mixed_graph"] = log_json(graph_log);
        training["capture_max_abs_diff_bpc"] = gc.max_abs_diff_bpc;
        training["capture_bitwise"] = gc.bitwise;
        training["capture_curves_equal"] = gc.ok;
        training["capture_message"] = gc.message;
        log_line("  " + gc.message);
        training_ok = training_ok && gc.ok;
      }
      // training.csv for plotting
      std::ofstream tcsv(o.out + "/training.csv");
      tcsv.precision(9);
      tcsv << "mode,step,train_bpc,valid_bpc,slope\n";
      for (const hmlstm::TrainLog* l : {&cc.mixed, &cc.reverse, static_cast<const hmlstm::TrainLog*>(&graph_log)})
        for (std::size_t j = 0; j < l->step.size(); ++j)
          tcsv << (l == &cc.mixed ? "mixed" : l == &cc.reverse ? "reverse" : "mixed_graph") << "," << l->step[j] << "," << l->train_bpc[j] << ","
               << (j < l->valid_bpc.size() ? l->valid_bpc[j] : NAN) << "," << (j < l->slope.size() ? l->slope[j] : NAN) << "\n";
    }
#else
    log_line("[e] skipped: this build has no hmlstm_network library (experiments/hmlstm/network.cu missing)");
#endif
  }

  // ---- validation directory ----
  std::string valdir = o.validate_dir;
  if (valdir.empty() && o.peers) valdir = o.out + "/validate";
  if (!valdir.empty()) {
    if (!make_dirs(valdir)) throw ExperimentError("cannot create --validate-dir '" + valdir + "'", 1);
    log_line("[validate] writing " + valdir + " (a, b at dims 256; e at H=64 B=8 T=24)");
    const auto arrays = hmexp::write_cell_validation(valdir, 256, device);
    Value manifest = Value::object();
    const std::string mpath = valdir + "/manifest.json";
    if (std::ifstream(mpath).good()) {
      try {
        manifest = dcexp::json::parse_file(mpath);
      } catch (const std::exception& e) {
        log_line(std::string("  existing manifest unreadable, replaced: ") + e.what());
        manifest = Value::object();
      }
    }
    Value& arr = manifest["arrays"];
    if (!arr.is_object()) arr = Value::object();
    for (const auto& a : arrays) {
      Value e = Value::object();
      e["file"] = a.name + ".bin";
      Value shp = Value::array();
      for (auto d : a.shape) shp.push_back(static_cast<double>(d));
      e["shape"] = shp;
      e["dtype"] = a.dtype;
      arr[a.name] = e;
    }
    if (!manifest["scalars"].is_object()) manifest["scalars"] = Value::object();
    dcexp::json::write_file(mpath, manifest);
#if DCEXP_HAVE_NETWORK
    hmlstm::NetworkConfig vc;
    vc.hidden = 64;
    vc.batch = 8;
    vc.seq = 24;
    vc.device = device;
    hmlstm::write_validation(valdir, vc);
#endif
  }

  // ---- peers ----
  std::vector<std::string> peer_cols;
  Value peers_json = Value::array();
  std::string peers_note;
  if (o.peers) {
    dualcast::empty_cache(device);  // leave the GPU memory to the peers' frameworks
    std::vector<std::string> pw;
    for (const char* w : {"a", "b", "e"})
      if (has(o, w)) pw.push_back(w);
    const std::string py = find_python(o);
    if (pw.empty()) {
      peers_note = "peers skipped: none of the peer workloads (a, b, e) was selected";
    } else if (py.empty()) {
      peers_note = "peers skipped: no python3 with numpy found (tried " +
                   (o.python.empty() ? std::string() : o.python + ", ") + "python3, /usr/bin/python3)";
    } else {
      std::string dims;
      for (auto d : o.dims) dims += (dims.empty() ? "" : ",") + std::to_string(d);
      std::string wl;
      for (auto& w : pw) wl += (wl.empty() ? "" : ",") + w;
      const std::string pout = o.out + "/peers.json";
      std::remove(pout.c_str());
      // One process per method (appending to one file): each framework starts with the whole GPU,
      // and a crash in one cannot take the others' records with it.
      const double peers_start = dcexp::now_ms();
      for (const auto& method : split_csv(o.peer_methods)) {
        std::string cmd = shell_quote(py) + " " +
                          shell_quote(std::string(DCEXP_SOURCE_DIR) + "/experiments/peers/peers.py") +
                          " --append --workloads " + wl + " --dims " + dims + " --methods " + method +
                          " --reps " + std::to_string(std::min(o.reps, 100)) + " --out " + shell_quote(pout) +
                          " --e-reps " + std::to_string(o.e_reps) + " --e-warmup " + std::to_string(std::min(o.warmup, 5)) +
                          " --e-hidden " + std::to_string(o.e_hidden) + " --e-batch " + std::to_string(o.e_batch) +
                          " --e-seq " + std::to_string(std::max(1, o.e_seq)) + " --e-vocab 64";
        if (o.peer_budget_s > 0) {
          const double left = o.peer_budget_s - (dcexp::now_ms() - peers_start) / 1000;
          cmd += fmt(" --time-budget %.3f", std::max(left, 0.001));
        }
        if (!valdir.empty()) cmd += " --validate " + shell_quote(valdir);
        if (!gpu) cmd += " --allow-cpu";
        cmd += " 1>&2";
        log_line("[peers] " + cmd + " (" + elapsed() + ")");
        const int rc = std::system(cmd.c_str());
        if (rc != 0) log_line("[peers] peers.py (" + method + ") exited with status " + std::to_string(rc));
      }
      try {
        peers_json = dcexp::json::parse_file(pout);
      } catch (const std::exception& e) {
        peers_note = std::string("peers: could not read ") + pout + ": " + e.what();
      }
      std::set<std::string> skipped;
      for (const auto& rec : peers_json.items()) {
        const std::string w = rec.get("workload").str(), method = rec.get("method").str();
        const double med = rec.get("median_ms").number();
        const std::string note = rec.get("note").str();
        if (!std::isfinite(med)) {
          if (skipped.insert(method).second) log_line("[peers] " + method + ": " + note.substr(0, 200));
          continue;
        }
        if (rec.get("validated").is_bool() && !rec.get("validated").boolean())
          log_line("[peers] WARNING: " + method + " " + w + " failed validation: " + note.substr(0, 300));
        if (std::find(peer_cols.begin(), peer_cols.end(), method) == peer_cols.end()) peer_cols.push_back(method);
        if (w == "e") {
          row_for(rows, "e", e_variant, o.e_hidden).ms[method] = med;
        } else {
          const auto d = static_cast<std::int64_t>(rec.get("dims").number(0));
          row_for(rows, w, "", d).ms[method] = med;
        }
        Measurement m;
        m.workload = w;
        m.variant = w == "e" ? e_variant : "";
        m.dims = w == "e" ? o.e_hidden : static_cast<std::int64_t>(rec.get("dims").number(0));
        m.method = method;
        m.times.gpu_ms.median = med;
        m.times.gpu_ms.p10 = rec.get("p10_ms").number();
        m.times.gpu_ms.p90 = rec.get("p90_ms").number();
        m.times.gpu_ms.n = static_cast<int>(rec.get("reps").number(0));
        m.times.pipelined_ms = rec.get("pipelined_ms").number();
        m.times.reps = m.times.gpu_ms.n;
        m.validated = rec.get("validated").boolean(false);
        m.max_rel_err = rec.get("max_rel_err").number();
        m.note = "peer (" + rec.get("timer").str() + "): " + note;
        ms.push_back(std::move(m));
      }
      if (peers_note.empty())
        peers_note = "peers: " + std::to_string(peers_json.size()) + " records from " + pout + (peer_cols.empty() ? " (none timed)" : "");
    }
    log_line("[peers] " + peers_note);
  }

  // ---- outputs ----
  const TableOut table = make_table(rows, peer_cols);
  Value root = Value::object();
  Value meta = Value::object();
  meta["tool"] = "hmlstm_experiment";
  meta["date"] = dcexp::iso_time();
  meta["device"] = device.str();
  meta["device_name"] = dev_name;
  meta["copy_bandwidth_gbps"] = bw.gbps;
  meta["copy_bandwidth_p10_gbps"] = bw.gbps_p10;
  meta["copy_bandwidth_p90_gbps"] = bw.gbps_p90;
  meta["copy_bandwidth_how"] = bw.how;
  meta["cache_bytes"] = static_cast<double>(cache);
  meta["reps"] = o.reps;
  meta["warmup"] = o.warmup;
  meta["dtype"] = "float32";
  meta["floor"] = "bytes / copy bandwidth; recompute counts: a,d 14, b 22, c 3K+2 fp32 values per element";
  meta["timer"] = gpu ? "CUDA events per step from an idle device (median of reps); wall = host clock"
                      : "host wall clock per step (median of reps)";
  root["meta"] = meta;
  root["measurements"] = Value::array();
  for (const auto& m : ms) root["measurements"].push_back(measurement_json(m));
  root["table"] = table.json;
  root["training"] = training;
  root["peers_note"] = peers_note;
  root["peers_raw"] = peers_json;
  dcexp::json::write_file(o.out + "/results.json", root);

  {
    std::ofstream csv(o.out + "/results.csv");
    csv.precision(9);
    csv << "workload,variant,dims,method,policy,median_ms,p10_ms,p90_ms,wall_median_ms,pipelined_ms,bytes,floor_ms,"
           "achieved_gbps,ratio_to_floor,reps,input_sets,tape_nodes_per_step,validated,max_rel_err,mallocs_during_timing,note\n";
    for (const auto& m : ms) {
      std::string note = m.note;
      std::replace(note.begin(), note.end(), '"', '\'');
      csv << m.workload << "," << m.variant << "," << m.dims << "," << m.method << "," << m.policy << ","
          << m.median_ms() << "," << m.times.primary().p10 << "," << m.times.primary().p90 << ","
          << m.times.wall_ms.median << "," << m.times.pipelined_ms << "," << m.bytes << "," << m.floor_ms << ","
          << (m.bytes > 0 ? dcexp::achieved_gbps(m.bytes, m.median_ms()) : NAN) << ","
          << (m.floor_ms > 0 ? m.median_ms() / m.floor_ms : NAN) << "," << m.times.reps << "," << m.input_sets << ","
          << m.kernels_per_step << "," << (m.validated ? "true" : "false") << "," << m.max_rel_err << ","
          << m.mallocs_during_timing << ",\"" << note << "\"\n";
    }
  }

  std::cout << "\nHM-LSTM experiment on " << device.str() << " (" << dev_name << "), fp32; copy bandwidth "
            << fmt("%.1f", bw.gbps) << " GB/s; time per forward+backward (a-d: " << (gpu ? "CUDA events" : "wall clock")
            << ", median of " << o.reps << "), per training step (e)\n";
  std::cout << "floor = bytes (recompute count) / copy bandwidth; mixed = Partials::recompute; "
               "mixed_store = Partials::store; reverse = select form on Vars; *_graph = the same step "
               "recorded once (dualcast::Graph) and replayed\n\n";
  std::cout << table.text;
  if (has(o, "e") && training.find("mixed")) {
    const auto& tm = training.get("mixed");
    const auto& tr = training.get("reverse");
    auto first_last = [](const Value& l, const char* key) {
      const auto& v = l.get(key);
      if (v.size() == 0) return std::string("-");
      return fmt("%.3f", v.at(0).number()) + " -> " + fmt("%.3f", v.at(v.size() - 1).number());
    };
    std::cout << "\ntraining (" << training.get("config").str() << "): train bits/char mixed "
              << first_last(tm, "train_bpc") << " (valid " << first_last(tm, "valid_bpc") << "), reverse "
              << first_last(tr, "train_bpc") << " (valid " << first_last(tr, "valid_bpc") << "); "
              << fmt("%.1f", tm.get("ms_per_step").number()) << " vs " << fmt("%.1f", tr.get("ms_per_step").number())
              << " ms/step; " << training.get("message").str() << "\n";
    if (training.find("capture_message")) std::cout << training.get("capture_message").str() << "\n";
    if (!training_ok) std::cout << "WARNING: training curves disagree or bits/char did not fall (see results.json)\n";
  }
  if (!peers_note.empty()) std::cout << peers_note << "\n";
  std::cout << "\nwrote " << o.out << "/results.json, " << o.out << "/results.csv" << (has(o, "e") && o.train_steps > 0 ? ", training.csv" : "")
            << " (" << elapsed() << ")\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_args(argc, argv);
  try {
    return run(o);
  } catch (const ExperimentError& e) {
    std::cerr << "hmlstm_experiment: error: " << e.what() << "\n";
    return e.exit_code;
  } catch (const std::exception& e) {
    std::cerr << "hmlstm_experiment: error: " << e.what() << "\n";
    return 1;
  }
}
