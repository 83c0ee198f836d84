// report.cu: ops_bench's outputs (ops_bench.hpp): the markdown table of times and GPU speedups
// (stdout and table.md), ops.csv and ops.json, and the exit status the sweep earns.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "../common/json.hpp"
#include "../common/report.hpp"
#include "../common/text.hpp"
#include "ops_bench.hpp"

namespace opsbench {
namespace {

using dcexp::fmt;
using dcexp::json;
using dcexp::log_line;

const Row* find_row(const std::vector<Row>& rows, const std::string& op, const std::string& dir,
                    std::int64_t n, const std::string& dev) {
  for (const auto& r : rows)
    if (r.op == op && r.dir == dir && r.n == n && r.device == dev) return &r;
  return nullptr;
}

/// GPU speedup of an op/dir/size: CPU median / GPU median, when both are timed and valid.
double speedup(const std::vector<Row>& rows, const std::string& op, const std::string& dir, std::int64_t n) {
  const Row* c = find_row(rows, op, dir, n, "cpu");
  const Row* g = find_row(rows, op, dir, n, "cuda");
  if (!c || !g || !c->valid || !g->valid) return NAN;
  return c->t.ms.median / g->t.ms.median;
}

std::string cell(const Row* r) {
  if (!r) return "-";
  if (r->status == "ok" && !r->valid) return "invalid";
  if (r->status == "validation_failed") return "FAIL";
  if (r->status == "out_of_memory") return "oom";
  if (r->status != "ok") return r->status;
  return fmt_ms(r->t.ms.median);
}

std::string speedup_cell(double x) {
  if (!std::isfinite(x)) return "-";
  return (x >= 100 ? fmt("%.0f", x) : x >= 10 ? fmt("%.1f", x) : fmt("%.2f", x)) + "x";
}

std::string make_table(const Sweep& s, const Options& o, const std::string& cpu_desc,
                       const std::string& gpu_desc, const std::string& date) {
  std::ostringstream t;
  t << "Per-op forward and backward times (ms, median), float32 [n,n]; " << date << "\n";
  t << "CPU: " << cpu_desc << "; GPU: " << (gpu_desc.empty() ? "none" : gpu_desc) << "\n";
  t << "speedup = CPU / GPU; FAIL = check failed at this size, invalid = the op failed a check at "
       "another size, oom = did not fit\n\n";
  t << "| op | n | CPU fwd | GPU fwd | speedup fwd | CPU bwd | GPU bwd | speedup bwd |\n";
  t << "|---|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const OpSpec* op : o.ops)
    for (std::int64_t n : o.sizes) {
      const Row* cf = find_row(s.rows, op->name, "fwd", n, "cpu");
      const Row* gf = find_row(s.rows, op->name, "fwd", n, "cuda");
      const Row* cb = find_row(s.rows, op->name, "bwd", n, "cpu");
      const Row* gb = find_row(s.rows, op->name, "bwd", n, "cuda");
      if (!cf && !gf && !cb && !gb) continue;
      t << "| " << op->name << " | " << n << " | " << cell(cf) << " | " << cell(gf) << " | "
        << speedup_cell(speedup(s.rows, op->name, "fwd", n)) << " | " << cell(cb) << " | " << cell(gb)
        << " | " << speedup_cell(speedup(s.rows, op->name, "bwd", n)) << " |\n";
    }
  return t.str();
}

void write_csv(const std::string& path, const std::vector<Row>& rows) {
  std::ofstream csv(path);
  DUALCAST_CHECK(csv.good(), "ops_bench: cannot write '", path, "'");
  csv.precision(9);
  csv << "op,direction,n,device,median_ms,p10_ms,p90_ms,min_ms,reps,warmup,wall_median_ms,bytes,flops,"
         "gbps,tflops,speedup,valid,status,checked_against,max_err,note\n";
  for (const auto& r : rows) {
    auto num = [&](double v) {
      std::ostringstream os;
      os.precision(9);
      if (std::isfinite(v)) os << v;
      return os.str();
    };
    const double sp = r.device == "cuda" ? speedup(rows, r.op, r.dir, r.n) : NAN;
    std::string note = r.note;
    std::replace(note.begin(), note.end(), '"', '\'');
    std::replace(note.begin(), note.end(), '\n', ' ');
    csv << r.op << ',' << r.dir << ',' << r.n << ',' << r.device << ',' << num(r.t.ms.median) << ','
        << num(r.t.ms.p10) << ',' << num(r.t.ms.p90) << ',' << num(r.t.ms.min) << ',' << r.t.ms.n << ','
        << r.t.warmup << ',' << num(r.t.wall.median) << ',' << num(r.bytes) << ',' << num(r.flops) << ','
        << num(r.gbps()) << ',' << num(r.tflops()) << ',' << num(sp) << ',' << (r.valid ? "true" : "false")
        << ',' << r.status << ',' << r.checked << ',' << num(r.max_err) << ",\"" << note << "\"\n";
  }
  DUALCAST_CHECK(csv.good(), "ops_bench: writing '", path, "' failed");
}

}  // namespace

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) {
        std::string s = line.substr(colon + 1);
        s.erase(0, s.find_first_not_of(" \t"));
        return s;
      }
    }
  return "unknown CPU";
}

int write_outputs(const Sweep& s, const Options& o, const std::vector<std::string>& devices,
                  const std::string& cpu_desc, const std::string& gpu_desc, const std::string& date,
                  double total_s) {
  namespace fs = std::filesystem;
  const bool want_gpu = !gpu_desc.empty();
  const std::string table = make_table(s, o, cpu_desc, gpu_desc, date);
  std::cout << table;
  std::cout.flush();

  json root = json::object();
  json meta = json::object();
  meta["tool"] = "ops_bench";
  meta["date"] = date;
  meta["cpu"] = cpu_desc;
  meta["cpu_model"] = cpu_model();
  meta["cpu_threads"] = dualcast::detail::cpu_thread_count();
  meta["cpu_blas"] = "OpenBLAS (cblas_sgemm; threads: OPENBLAS_NUM_THREADS or all cores)";
  meta["gpu"] = want_gpu ? json(gpu_desc) : json();
  meta["gpu_blas"] = want_gpu ? json("cuBLAS sgemm, fp32 (no TF32)") : json();
  meta["devices_timed"] = json::array();
  for (const auto& d : devices) meta["devices_timed"].push_back(d);
  meta["dtype"] = "float32";
  meta["sizes"] = json::array();
  for (std::int64_t n : o.sizes) meta["sizes"].push_back(n);
  meta["ops"] = json::object();
  for (const OpSpec* op : o.ops) meta["ops"][op->name] = op->formula;
  meta["reps"] = o.budget.reps;
  meta["min_reps"] = kMinReps;
  meta["min_time_s"] = o.budget.min_s;
  meta["max_time_s"] = o.budget.max_s;
  meta["warmup_cpu"] = kCpuWarmup;
  meta["warmup_cpu_note"] = "0 where the check run's call of the same size took longer than max_time_s";
  meta["warmup_gpu"] = kGpuWarmup;
  meta["timer_gpu"] = "CUDA events around each repetition on the default stream, from an idle device "
                      "(cudaDeviceSynchronize first); host work before the first launch included";
  meta["timer_cpu"] = "std::chrono::steady_clock around each repetition";
  meta["forward"] = "time to build the output Var from parameters requiring gradients (kernel + tape node)";
  meta["backward"] = "backward(seed, retain_graph=true) on a graph built once outside the timing, "
                     "zero_grad before each repetition (untimed)";
  meta["bytes"] = "float32 bytes that must move: each input a direction depends on read once, each result "
                  "written once";
  meta["tol_gpu_vs_cpu"] = kTolGpuVsCpu;
  meta["tol_vs_float64"] = kTolVsFloat64;
  meta["reference_max_size"] = kReferenceMaxSize;
  meta["error_measures"] = "elementwise: max|a-b|/max(1,|b|); normwise (matmul): max|a-b|/max(1,max|b|)";
  meta["total_seconds"] = total_s;
  root["meta"] = meta;

  json rows = json::array();
  for (const auto& r : s.rows) {
    json v = json::object();
    v["op"] = r.op;
    v["direction"] = r.dir;
    v["n"] = r.n;
    v["device"] = r.device;
    v["status"] = r.status;
    v["valid"] = r.valid;
    v["ms"] = dcexp::summary_json(r.t.ms);
    v["wall_ms"] = dcexp::summary_json(r.t.wall);
    v["warmup"] = r.t.warmup;
    v["bytes"] = static_cast<std::int64_t>(r.bytes);  // whole counts: written as integers
    v["flops"] = static_cast<std::int64_t>(r.flops);
    v["gbps"] = r.gbps();
    v["tflops"] = r.tflops();
    if (r.device == "cuda") v["speedup"] = speedup(s.rows, r.op, r.dir, r.n);
    v["checked_against"] = r.checked;
    v["max_err"] = r.max_err;
    if (!r.note.empty()) v["note"] = r.note;
    rows.push_back(v);
  }
  root["rows"] = rows;
  json checks = json::array();
  for (const auto& c : s.checks) {
    json v = json::object();
    v["op"] = c.op;
    v["n"] = c.n;
    v["device"] = c.device;
    v["against"] = c.against;
    v["max_err"] = c.err;
    v["tol"] = c.tol;
    v["worst"] = c.worst;
    v["passed"] = c.passed;
    checks.push_back(v);
  }
  root["checks"] = checks;
  json problems = json::array();
  for (const auto& p : s.problems) problems.push_back(p);
  root["problems"] = problems;
  root["table_markdown"] = table;

  const std::string json_path = (fs::path(o.out) / "ops.json").string();
  const std::string csv_path = (fs::path(o.out) / "ops.csv").string();
  const std::string md_path = (fs::path(o.out) / "table.md").string();
  dcexp::write_json_file(json_path, root);
  write_csv(csv_path, s.rows);
  {
    std::ofstream md(md_path);
    md << table;
    DUALCAST_CHECK(md.good(), "ops_bench: writing '", md_path, "' failed");
  }
  log_line("ops_bench: " + std::to_string(s.checks.size()) + " checks, " +
           std::to_string(s.checks.size() - static_cast<std::size_t>(std::count_if(
                                                 s.checks.begin(), s.checks.end(),
                                                 [](const Check& c) { return c.passed; }))) +
           " failed; sweep took " + fmt("%.1f", total_s) + " s; wrote " + json_path + ", " + csv_path + ", " +
           md_path);

  if (!s.failed_ops.empty()) {
    std::string ops;
    for (const auto& op : s.failed_ops) ops += " " + op;
    log_line("ops_bench: CHECK FAILED for:" + ops + " (their timings are marked invalid)");
    return kExitValidation;
  }
  if (s.any_error) {
    log_line("ops_bench: some measurements failed with an error (see 'problems' in ops.json)");
    return kExitError;
  }
  if (s.any_oom) {
    log_line("ops_bench: some sizes did not fit in memory (see 'problems' in ops.json); the rest was measured");
    return kExitMemory;
  }
  return kExitOk;
}

}  // namespace opsbench
