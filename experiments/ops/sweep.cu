// sweep.cu: ops_bench's timings and sweep (ops_bench.hpp): each op's forward and backward timed on a
// device through the public tape API with gpu_timing.hpp's loop under the Budget's stop rule, and one
// unit of the sweep (an op at a size): memory checked up front, the checks, then the timings, errors
// (out of memory above all) recorded so that the rest of the sweep goes on.
#include <cmath>
#include <exception>
#include <new>
#include <set>
#include <string>
#include <vector>

#include "../common/text.hpp"
#include "ops_bench.hpp"

namespace opsbench {
namespace {

using dcexp::fmt;
using dcexp::log_line;

/// Times prepare + step on `device` (step alone inside the timing) until the Budget says stop: CPU
/// calls after `cpu_warmup` untimed ones (the backend runs every op to completion before returning:
/// the thread pool and OpenBLAS both join, so the host clock around the call is the op's time); GPU
/// calls after kGpuWarmup, each from an idle device between CUDA events on the legacy default
/// stream (which orders with dualcast's), recorded before the call, so the host work that precedes
/// the first launch (argument checks, allocation from the cache, tape recording) is inside the
/// interval, as a user would see it; the host clock of the same repetition is kept beside.
template <class Prepare, class Step>
Timing time_on(Device device, Prepare&& prepare, Step&& step, const Budget& b, int cpu_warmup) {
  const dcexp::StepTimes st =
      dcexp::time_steps(device, [&](int) { prepare(); }, [&](int) { step(); }, device.is_cpu() ? cpu_warmup : kGpuWarmup,
                        [&](int done, double elapsed_ms) { return b.done(static_cast<std::size_t>(done), elapsed_ms); },
                        /*pipelined=*/false, dcexp::EventStream::legacy);
  Timing t;
  t.ms = st.primary();
  t.wall = st.wall_ms;
  t.warmup = st.warmup;
  return t;
}

/// Forward: the time to build the output Var from parameters that require gradients, i.e. the
/// kernel plus recording the tape node (what a training step pays). The previous repetition's output
/// is dropped before the clock starts, so freeing it is not counted. The last repetition's output
/// is left in `y`: the graph the backward is timed on.
Timing time_forward(const OpSpec& op, const std::vector<Var>& params, Device device, const Budget& b,
                    int cpu_warmup, Var& y) {
  return time_on(device, [&] { y = Var(); }, [&] { y = forward(op, params); }, b, cpu_warmup);
}

/// Backward: the graph y (the forward timing's last output) was built outside the timed region, and
/// each repetition runs backward(seed, retain_graph = true) after zero_grad. retain_graph only keeps
/// the node's saved inputs alive (it skips release_saved, which drops references and computes
/// nothing), so every repetition does exactly the work of a training step's backward, including
/// allocating fresh gradients, without re-running a forward per repetition (a whole second at
/// n = 8192 for the CPU's matmul). zero_grad makes each repetition write fresh gradients rather than accumulate into the
/// previous ones, which would add a read of the old gradient that a training step does not pay.
Timing time_backward(const OpSpec& op, const std::vector<Var>& params, const Var& y, Device device,
                     const Budget& b, int cpu_warmup) {
  const Tensor seed = make_seed(op, y, device);
  dualcast::synchronize(device);
  auto prepare = [&] {
    for (Var p : params) p.zero_grad();  // a Var is a handle: the copy clears the shared gradient
  };
  return time_on(device, prepare, [&] { y.backward(seed, /*retain_graph=*/true); }, b, cpu_warmup);
}

bool is_out_of_memory(const std::string& what) {
  return what.find("out of device memory") != std::string::npos ||
         what.find("out of host memory") != std::string::npos ||
         what.find("out of memory") != std::string::npos;
}

void add_rows(Sweep& s, const OpSpec& op, std::int64_t n, const std::string& dev, const std::string& status,
              const std::string& note) {
  for (const char* dir : {"fwd", "bwd"}) {
    Row r;
    r.op = op.name;
    r.dir = dir;
    r.n = n;
    r.device = dev;
    r.status = status;
    r.note = note;
    s.rows.push_back(r);
  }
}

/// Times forward and backward of `op` at n on `device`; appends the two rows. Errors (out of memory
/// above all) are caught here so the rest of the sweep goes on.
/// `check_fwd_ms` / `check_bwd_ms`: how long the check run's calls took on this device. A CPU call
/// longer than --max-time gets no warm-up: the check run made the same call at the same size just
/// before, and at a second per call (the CPU's matmul at 8192) warming would cost more than the
/// measurement and change nothing.
void measure(Sweep& s, const OpSpec& op, std::int64_t n, Device device, const std::string& dev,
             const Budget& b, const std::string& checked, double max_err, double check_fwd_ms,
             double check_bwd_ms, std::string& progress) {
  const std::string key = std::string(op.name) + "/" + dev;
  if (auto it = s.no_fit.find(key); it != s.no_fit.end() && n > it->second) {
    add_rows(s, op, n, dev, "skipped", "n = " + std::to_string(it->second) + " did not fit already");
    progress += " " + dev + " skipped;";
    return;
  }
  try {
    const std::vector<Var> params = make_params(op, n, device);
    Var y;  // the forward timing's last output, the backward timing's graph
    for (const bool bwd : {false, true}) {
      Row r;
      r.op = op.name;
      r.dir = bwd ? "bwd" : "fwd";
      r.n = n;
      r.device = dev;
      r.bytes = bytes_moved(op, n, bwd);
      r.flops = flops(op, n, bwd);
      r.checked = checked;
      r.max_err = max_err;
      const double check_ms = bwd ? check_bwd_ms : check_fwd_ms;
      const int warmup = check_ms >= b.max_s * 1e3 ? 0 : kCpuWarmup;
      r.t = bwd ? time_backward(op, params, y, device, b, warmup) : time_forward(op, params, device, b, warmup, y);
      s.rows.push_back(r);
      progress += " " + dev + " " + r.dir + " " + fmt_ms(r.t.ms.median) + " ms;";
    }
  } catch (const std::exception& e) {
    // Rows of this unit already written stay; the missing ones say why.
    const bool oom = dynamic_cast<const std::bad_alloc*>(&e) != nullptr || is_out_of_memory(e.what());
    std::string msg = "n=" + std::to_string(n) + " " + op.name + " on " + dev + ": " +
                      (oom ? "does not fit in memory: " : "error: ") + e.what();
    s.problems.push_back(msg);
    log_line("ops_bench: " + msg);
    std::set<std::string> have;
    for (const auto& r : s.rows)
      if (r.op == op.name && r.n == n && r.device == dev) have.insert(r.dir);
    for (const char* dir : {"fwd", "bwd"}) {
      if (have.count(dir)) continue;
      Row r;
      r.op = op.name;
      r.dir = dir;
      r.n = n;
      r.device = dev;
      r.status = oom ? "out_of_memory" : "error";
      r.note = e.what();
      s.rows.push_back(r);
    }
    if (oom) {
      s.any_oom = true;
      s.no_fit.emplace(key, n);
    } else {
      s.any_error = true;
    }
    progress += " " + dev + (oom ? " out of memory;" : " error;");
  }
  if (device.is_cuda()) dualcast::empty_cache(device);  // the next unit's sizes start from a clean cache
}

}  // namespace

/// Milliseconds with three significant digits, never in exponent form.
std::string fmt_ms(double ms) {
  if (!std::isfinite(ms)) return "-";
  if (ms >= 100) return fmt("%.0f", ms);
  if (ms >= 10) return fmt("%.1f", ms);
  if (ms >= 1) return fmt("%.2f", ms);
  if (ms >= 0.1) return fmt("%.3f", ms);
  if (ms >= 0.01) return fmt("%.4f", ms);
  return fmt("%.5f", ms);
}

/// One op at one size: the checks, then the timings on each requested device.
void run_unit(Sweep& s, const OpSpec& op, std::int64_t n, bool time_cpu_side, bool use_gpu,
              const Budget& b) {
  const Device cpu = Device::cpu();
  const Device gpu = use_gpu ? Device::cuda(0) : cpu;
  const double t_start = dcexp::now_ms();
  std::string progress = "[ops] n=" + std::to_string(n) + " " + op.name + ":";
  std::vector<std::string> devs;
  if (time_cpu_side) devs.push_back("cpu");
  if (use_gpu) devs.push_back("cuda");

  // Host memory is checked up front: with overcommit a too-large host allocation does not fail, the
  // process is killed when it touches the pages.
  const double need = kHostPeakArrays * 4.0 * static_cast<double>(n) * static_cast<double>(n);
  const double avail = static_cast<double>(dcexp::host_available_bytes());
  if (avail > 0 && need > 0.9 * avail) {
    const std::string msg = "n=" + std::to_string(n) + " " + op.name + ": does not fit in memory: needs about " +
                            fmt("%.1f", need / (1 << 30)) + " GiB of host memory (the CPU side and the " +
                            "reference for the GPU check), " + fmt("%.1f", avail / (1 << 30)) + " GiB available";
    log_line("ops_bench: " + msg);
    s.problems.push_back(msg);
    s.any_oom = true;
    for (const auto& d : devs) add_rows(s, op, n, d, "out_of_memory", msg);
    return;
  }

  // ---- checks ----
  // The CPU's result is the reference of every check, so nothing is timed without it. A GPU that
  // cannot hold this size only takes the GPU out of this unit (and of larger sizes of the op).
  std::string cpu_checked, gpu_checked;
  double cpu_err = NAN, gpu_err = NAN;
  bool passed = true;
  auto failure = [&](const std::exception& e, const std::string& where) {
    const bool oom = dynamic_cast<const std::bad_alloc*>(&e) != nullptr || is_out_of_memory(e.what());
    const std::string msg = "n=" + std::to_string(n) + " " + op.name + " " + where + ": the check could not run: " +
                            (oom ? "does not fit in memory: " : "") + e.what();
    log_line("ops_bench: " + msg);
    s.problems.push_back(msg);
    (oom ? s.any_oom : s.any_error) = true;
    return oom;
  };
  RunResult ref;
  try {
    ref = run_once(op, n, cpu);
    if (n <= kReferenceMaxSize) {
      const Check c = check_against_float64(op, n, ref);
      s.checks.push_back(c);
      passed = passed && c.passed;
      cpu_checked = "float64";
      cpu_err = c.err;
    }
  } catch (const std::exception& e) {
    const bool oom = failure(e, "on cpu");
    for (const auto& d : devs) add_rows(s, op, n, d, oom ? "out_of_memory" : "error", e.what());
    return;
  }
  bool gpu_ok = use_gpu;
  if (use_gpu) {
    const std::string key = std::string(op.name) + "/cuda";
    if (auto it = s.no_fit.find(key); it != s.no_fit.end() && n > it->second) {
      add_rows(s, op, n, "cuda", "skipped", "n = " + std::to_string(it->second) + " did not fit already");
      progress += " cuda skipped;";
      gpu_ok = false;
    } else {
      try {
        poison_device_cache(gpu, n);
        const RunResult got = run_once(op, n, gpu);
        const Check c = check_against_cpu(op, n, got, ref, gpu);
        s.checks.push_back(c);
        passed = passed && c.passed;
        gpu_checked = "cpu";
        gpu_err = c.err;
      } catch (const std::exception& e) {
        const bool oom = failure(e, "on cuda");
        add_rows(s, op, n, "cuda", oom ? "out_of_memory" : "error", e.what());
        if (oom) s.no_fit.emplace(key, n);
        progress += oom ? " cuda out of memory;" : " cuda error;";
        gpu_ok = false;
      }
      dualcast::empty_cache(gpu);
    }
  }
  const double cpu_fwd_ms = ref.fwd_ms, cpu_bwd_ms = ref.bwd_ms;
  ref = RunResult{};  // the reference's arrays are not needed while timing
  if (!passed) {
    s.failed_ops.insert(op.name);
    std::string what;
    for (const auto& c : s.checks)
      if (c.op == op.name && c.n == n && !c.passed)
        what += " " + c.device + " vs " + c.against + ": max error " + fmt("%.3g", c.err) + " in " + c.worst +
                " > " + fmt("%.1e", c.tol) + ";";
    const std::string msg = "n=" + std::to_string(n) + " " + op.name + ": CHECK FAILED:" + what + " not timed";
    log_line("ops_bench: " + msg);
    s.problems.push_back(msg);
    for (const auto& d : devs)
      if (d == "cpu" || gpu_ok) add_rows(s, op, n, d, "validation_failed", what);
    return;
  }

  // ---- timings ----
  if (time_cpu_side) measure(s, op, n, cpu, "cpu", b, cpu_checked, cpu_err, cpu_fwd_ms, cpu_bwd_ms, progress);
  if (gpu_ok) measure(s, op, n, gpu, "cuda", b, gpu_checked, gpu_err, NAN, NAN, progress);
  std::string checked;
  if (!cpu_checked.empty()) checked += " cpu~f64 " + fmt("%.1e", cpu_err);
  if (!gpu_checked.empty()) checked += " cuda~cpu " + fmt("%.1e", gpu_err);
  log_line(progress + (checked.empty() ? "" : " checked" + checked + ";") + " (" +
           fmt("%.1f", (dcexp::now_ms() - t_start) / 1e3) + " s)");
}

}  // namespace opsbench
