// ops_bench.cu: ops_bench, the per-op CPU vs GPU analysis (see README.md beside this file). For each
// op of the reverse-mode op library (add, multiply, materialised transpose, pow, broadcast add, sum,
// sum over an axis, matmul) and each square size n, it first checks the GPU's output and gradients
// against the CPU's (and the CPU's against a float64 host reference at small n), then times the
// forward and the backward separately on each device through the public tape API, and writes
// ops.json, ops.csv and a markdown table of times and GPU speedups.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <new>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "dualcast/dualcast.hpp"

#include "../common/cli.hpp"
#include "../common/gpu_timing.hpp"
#include "../common/json_lite.hpp"
#include "../common/report.hpp"

#if defined(__CUDACC__)
#include <cuda_runtime.h>
#endif

namespace {

using dualcast::Device;
using dualcast::DType;
using dualcast::Shape;
using dualcast::Tensor;
using dualcast::Var;
using dcexp::json::Value;

// =====================================================================================================
// constants
// =====================================================================================================

// Tolerances (relative errors; see max_error for the two definitions).
// GPU vs CPU: both run the same elementwise bodies in float32; they differ only where libm and CUDA
// round pow/log differently (a few ulp), in summation order (sums accumulate in double on both) and in
// GEMM blocking (cuBLAS vs OpenBLAS), which the normwise measure absorbs.
constexpr double kTolGpuVsCpu = 1e-5;
// float32 results vs the float64 host reference computed from the same float32 inputs.
constexpr double kTolVsFloat64 = 1e-5;
// The float64 host reference is plain loops (matmul is O(n^3) on one thread): small sizes only.
constexpr std::int64_t kReferenceMaxSize = 256;

// At least this many timed repetitions, whatever --max-time says: a median needs a few.
constexpr int kMinReps = 3;
// --min-time may add repetitions beyond --reps, but never more than this factor.
constexpr int kRepCeilingFactor = 10;
// Untimed calls before timing. The check run has already made the same call at the same size on each
// device, so one CPU call suffices (none when a call is longer than --max-time, see measure); the GPU
// gets a few so the caching allocator holds every block size the op needs and cuBLAS has picked its
// kernels.
constexpr int kCpuWarmup = 1;
constexpr int kGpuWarmup = 3;
// Arrays of n x n floats alive at once at the worst point of a unit (inputs, seed, output, gradients,
// the reference results kept for the GPU check, a broadcast gradient's full-size buffer), with room.
constexpr double kHostPeakArrays = 10;
// Blocks of n x n floats poisoned with NaN in the GPU's cache before the validation run.
constexpr int kPoisonBlocks = 6;

// Exit status.
constexpr int kExitOk = 0, kExitError = 1, kExitUsage = 2, kExitMemory = 3, kExitValidation = 4;

// =====================================================================================================
// the ops
// =====================================================================================================

enum class OpId { add, mul, transpose, pow, broadcast, sum, sum_axis1, matmul };
// elementwise: max_i |a_i - b_i| / max(1, |b_i|), for results each element of which is computed
//   independently in the same way on both sides.
// normwise: max_i |a_i - b_i| / max(1, max_i |b_i|), for GEMM, whose elements are long dot products
//   blocked differently by each BLAS: an element that cancels to near 0 keeps the absolute error of
//   its large terms, so only an error relative to the result's scale is meaningful.
enum class Metric { elementwise, normwise };

struct OpSpec {
  OpId id;
  const char* name;     // in ops.csv, the table and --ops
  const char* formula;  // what is computed, for --help and the JSON
  int nargs;            // differentiated inputs
  const char* arg[2];   // their names
  Metric metric;
};

const OpSpec kOps[] = {
    {OpId::add, "add", "x + y, x and y [n,n]", 2, {"x", "y"}, Metric::elementwise},
    {OpId::mul, "mul", "x * y, x and y [n,n]", 2, {"x", "y"}, Metric::elementwise},
    {OpId::transpose, "transpose", "transpose(x) materialised, x [n,n]", 1, {"x", nullptr},
     Metric::elementwise},
    {OpId::pow, "pow", "pow(x, y), x in (0.5,2], y in (-2,2], both [n,n] and differentiated", 2,
     {"x", "y"}, Metric::elementwise},
    {OpId::broadcast, "broadcast", "x + b, x [n,n], b [1,n] (backward: sum_to over rows)", 2,
     {"x", "b"}, Metric::elementwise},
    {OpId::sum, "sum", "sum(x) over all elements, x [n,n]", 1, {"x", nullptr}, Metric::elementwise},
    {OpId::sum_axis1, "sum_axis1", "sum(x, 1): one total per row, x [n,n]", 1, {"x", nullptr},
     Metric::elementwise},
    {OpId::matmul, "matmul", "matmul(a, b), a and b [n,n] (OpenBLAS / cuBLAS sgemm)", 2, {"a", "b"},
     Metric::normwise},
};

const OpSpec* find_op(const std::string& name) {
  for (const auto& op : kOps)
    if (name == op.name) return &op;
  return nullptr;
}

/// The inputs of `op` at size n on `device`. Philox streams depend only on (seed, index), so the CPU
/// and the GPU get the same values and their results can be compared element by element.
std::vector<Tensor> make_inputs(const OpSpec& op, std::int64_t n, Device device) {
  const std::uint64_t base = 1000 * (static_cast<std::uint64_t>(op.id) + 1);
  const Shape sq{n, n};
  switch (op.id) {
    case OpId::pow:  // a positive base keeps x^y and log(x) (the exponent's gradient) finite
      return {Tensor::uniform(sq, device, base + 1, 0.5, 2.0), Tensor::uniform(sq, device, base + 2, -2.0, 2.0)};
    case OpId::broadcast:
      return {Tensor::randn(sq, device, base + 1), Tensor::randn(Shape{1, n}, device, base + 2)};
    case OpId::transpose:
    case OpId::sum:
    case OpId::sum_axis1:
      return {Tensor::randn(sq, device, base + 1)};
    default:
      return {Tensor::randn(sq, device, base + 1), Tensor::randn(sq, device, base + 2)};
  }
}

std::vector<Var> make_params(const OpSpec& op, std::int64_t n, Device device) {
  std::vector<Var> p;
  for (auto& t : make_inputs(op, n, device)) p.push_back(Var::param(std::move(t)));
  return p;
}

Var forward(const OpSpec& op, const std::vector<Var>& p) {
  switch (op.id) {
    case OpId::add: return p[0] + p[1];
    case OpId::mul: return p[0] * p[1];
    case OpId::transpose: return dualcast::transpose(p[0]);
    case OpId::pow: return dualcast::pow(p[0], p[1]);
    case OpId::broadcast: return p[0] + p[1];
    case OpId::sum: return dualcast::sum(p[0]);
    case OpId::sum_axis1: return dualcast::sum(p[0], 1);
    case OpId::matmul: return dualcast::matmul(p[0], p[1]);
  }
  DUALCAST_FAIL("ops_bench: unknown op");
}

/// A random adjoint (never ones: a backward that ignores it, or transposes it wrongly, shows).
Tensor make_seed(const OpSpec& op, const Var& y, Device device) {
  return Tensor::randn(y.shape(), device, 777 + static_cast<std::uint64_t>(op.id));
}

/// Bytes a direction must move at the least: each input it depends on read once, each result
/// written once (float32). The op library may move more (e.g. its recompute backward reloads inputs
/// a gradient does not need); GB/s against this count says how close it comes to the floor.
double bytes_moved(const OpSpec& op, std::int64_t n_, bool backward) {
  const double n = static_cast<double>(n_), nn = n * n, f = 4.0;
  switch (op.id) {
    case OpId::add: return f * 3 * nn;                       // fwd x,y -> z; bwd g -> dx,dy
    case OpId::mul: return f * (backward ? 5 * nn : 3 * nn);  // bwd g,x,y -> dx,dy
    case OpId::transpose: return f * 2 * nn;
    case OpId::pow: return f * (backward ? 5 * nn : 3 * nn);  // bwd g,x,y -> dx,dy
    case OpId::broadcast: return f * (2 * nn + n);            // fwd x,b -> z; bwd g -> dx,db
    case OpId::sum: return f * (nn + 1);
    case OpId::sum_axis1: return f * (nn + n);
    case OpId::matmul: return f * 3 * nn * (backward ? 2 : 1);  // not used for the rate
  }
  return 0;
}

/// Floating-point operations of a direction (matmul only: 2n^3 forward, 4n^3 for dA and dB).
double flops(const OpSpec& op, std::int64_t n_, bool backward) {
  if (op.id != OpId::matmul) return 0;
  const double n = static_cast<double>(n_);
  return (backward ? 4.0 : 2.0) * n * n * n;
}

// =====================================================================================================
// validation
// =====================================================================================================

/// Output and gradients of one forward + backward, with the inputs and adjoint that produced them,
/// and the host time of each direction (on the CPU: how long one call takes, which decides whether
/// timing it later needs a warm-up call).
struct RunResult {
  std::vector<Tensor> inputs;
  Tensor seed;
  Tensor out;
  std::vector<Tensor> grads;
  double fwd_ms = NAN, bwd_ms = NAN;
};

RunResult run_once(const OpSpec& op, std::int64_t n, Device device) {
  RunResult r;
  std::vector<Var> p = make_params(op, n, device);
  dualcast::synchronize(device);
  const double t0 = dcexp::now_ms();
  Var y = forward(op, p);
  dualcast::synchronize(device);
  r.fwd_ms = dcexp::now_ms() - t0;
  r.seed = make_seed(op, y, device);
  dualcast::synchronize(device);
  const double t1 = dcexp::now_ms();
  y.backward(r.seed);
  dualcast::synchronize(device);
  r.bwd_ms = dcexp::now_ms() - t1;
  r.out = y.value();
  for (const auto& v : p) {
    r.inputs.push_back(v.value());
    r.grads.push_back(v.grad());
  }
  return r;
}

/// Fills cached device blocks of the sizes the op allocates with NaN, so that an element a kernel of
/// the next run forgets to write shows up as NaN in the comparison instead of as stale data.
void poison_device_cache(Device device, std::int64_t n) {
  if (!device.is_cuda()) return;
  dualcast::empty_cache(device);
  std::vector<Tensor> blocks;
  for (int i = 0; i < kPoisonBlocks; ++i) blocks.push_back(Tensor::full(Shape{n, n}, NAN, DType::float32, device));
  for (int i = 0; i < 2; ++i) blocks.push_back(Tensor::full(Shape{n}, NAN, DType::float32, device));
  dualcast::synchronize(device);
}

/// Error of `got` against `want` (same shape and device), computed where they live; NaN anywhere
/// makes it NaN, which fails every `err <= tol` test.
double max_error(const Tensor& got, const Tensor& want, Metric metric) {
  DUALCAST_CHECK(got.shape() == want.shape(), "ops_bench: result of shape ", got.shape().str(),
                 " where ", want.shape().str(), " was expected");
  dualcast::NoGradGuard no_tape;
  const Var g(got), w(want);
  const Var diff = dualcast::abs(g - w);
  if (metric == Metric::elementwise) return dualcast::amax(diff / dualcast::max(dualcast::abs(w), 1.0)).item();
  const double scale = std::max(1.0, dualcast::amax(dualcast::abs(w)).item());
  return dualcast::amax(diff).item() / scale;
}

double host_error(const std::vector<double>& got, const std::vector<double>& want, Metric metric) {
  if (got.size() != want.size()) return INFINITY;
  double worst = 0, scale = 1;
  for (double v : want) scale = std::max(scale, std::fabs(v));
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(got[i] - want[i]);
    const double e = metric == Metric::elementwise ? d / std::max(1.0, std::fabs(want[i])) : d / scale;
    if (std::isnan(e)) return NAN;
    worst = std::max(worst, e);
  }
  return worst;
}

/// The op's output and gradients in float64 from the same float32 inputs, by plain loops written
/// from the definitions, independent of dualcast's kernels and derivative rules.
void reference(const OpSpec& op, std::int64_t n, const std::vector<std::vector<double>>& in,
               const std::vector<double>& g, std::vector<double>& out,
               std::vector<std::vector<double>>& grads) {
  const auto N = static_cast<std::size_t>(n);
  const std::size_t nn = N * N;
  grads.assign(static_cast<std::size_t>(op.nargs), {});
  const auto& x = in[0];
  switch (op.id) {
    case OpId::add:
      out.resize(nn);
      for (std::size_t i = 0; i < nn; ++i) out[i] = x[i] + in[1][i];
      grads[0] = g;
      grads[1] = g;
      break;
    case OpId::mul:
      out.resize(nn);
      grads[0].resize(nn);
      grads[1].resize(nn);
      for (std::size_t i = 0; i < nn; ++i) {
        out[i] = x[i] * in[1][i];
        grads[0][i] = g[i] * in[1][i];
        grads[1][i] = g[i] * x[i];
      }
      break;
    case OpId::transpose:
      out.resize(nn);
      grads[0].resize(nn);
      for (std::size_t i = 0; i < N; ++i)
        for (std::size_t j = 0; j < N; ++j) {
          out[j * N + i] = x[i * N + j];
          grads[0][i * N + j] = g[j * N + i];
        }
      break;
    case OpId::pow:
      out.resize(nn);
      grads[0].resize(nn);
      grads[1].resize(nn);
      for (std::size_t i = 0; i < nn; ++i) {
        const double b = x[i], e = in[1][i];
        out[i] = std::pow(b, e);
        grads[0][i] = g[i] * e * std::pow(b, e - 1);
        grads[1][i] = g[i] * out[i] * std::log(b);
      }
      break;
    case OpId::broadcast:
      out.resize(nn);
      grads[1].assign(N, 0.0);
      for (std::size_t i = 0; i < N; ++i)
        for (std::size_t j = 0; j < N; ++j) {
          out[i * N + j] = x[i * N + j] + in[1][j];
          grads[1][j] += g[i * N + j];
        }
      grads[0] = g;
      break;
    case OpId::sum: {
      double s = 0;
      for (double v : x) s += v;
      out.assign(1, s);
      grads[0].assign(nn, g[0]);
      break;
    }
    case OpId::sum_axis1:
      out.assign(N, 0.0);
      grads[0].resize(nn);
      for (std::size_t i = 0; i < N; ++i)
        for (std::size_t j = 0; j < N; ++j) {
          out[i] += x[i * N + j];
          grads[0][i * N + j] = g[i];
        }
      break;
    case OpId::matmul: {
      const auto& a = x;
      const auto& b = in[1];
      out.assign(nn, 0.0);
      grads[0].assign(nn, 0.0);
      grads[1].assign(nn, 0.0);
      for (std::size_t i = 0; i < N; ++i)
        for (std::size_t k = 0; k < N; ++k) {
          const double aik = a[i * N + k];
          double da = 0;  // dA = G B^T
          for (std::size_t j = 0; j < N; ++j) {
            out[i * N + j] += aik * b[k * N + j];
            da += g[i * N + j] * b[k * N + j];
            grads[1][k * N + j] += aik * g[i * N + j];  // dB = A^T G
          }
          grads[0][i * N + k] = da;
        }
      break;
    }
  }
}

/// One comparison made before timing.
struct Check {
  std::string op;
  std::int64_t n = 0;
  std::string device;   // the device whose results were checked
  std::string against;  // "float64" (host reference) or "cpu"
  double err = NAN;
  double tol = NAN;
  std::string worst;    // which array had the largest error
  bool passed = false;
};

Check check_against_float64(const OpSpec& op, std::int64_t n, const RunResult& cpu) {
  std::vector<std::vector<double>> in;
  for (const auto& t : cpu.inputs) in.push_back(t.to_vector<double>());
  std::vector<double> out;
  std::vector<std::vector<double>> grads;
  reference(op, n, in, cpu.seed.to_vector<double>(), out, grads);
  Check c;
  c.op = op.name;
  c.n = n;
  c.device = "cpu";
  c.against = "float64";
  c.tol = kTolVsFloat64;
  c.err = host_error(cpu.out.to_vector<double>(), out, op.metric);
  c.worst = "out";
  for (int k = 0; k < op.nargs; ++k) {
    const double e = host_error(cpu.grads[static_cast<std::size_t>(k)].to_vector<double>(),
                                grads[static_cast<std::size_t>(k)], op.metric);
    if (std::isnan(e) || e > c.err) {
      c.err = e;
      c.worst = std::string("d") + op.arg[k];
    }
    if (std::isnan(e)) break;
  }
  c.passed = c.err <= c.tol;
  return c;
}

Check check_against_cpu(const OpSpec& op, std::int64_t n, const RunResult& got, const RunResult& cpu,
                        Device device) {
  Check c;
  c.op = op.name;
  c.n = n;
  c.device = device.str();
  c.against = "cpu";
  c.tol = kTolGpuVsCpu;
  c.err = max_error(got.out, cpu.out.to(device), op.metric);
  c.worst = "out";
  for (int k = 0; k < op.nargs && !std::isnan(c.err); ++k) {
    const auto i = static_cast<std::size_t>(k);
    const double e = max_error(got.grads[i], cpu.grads[i].to(device), op.metric);
    if (std::isnan(e) || e > c.err) {
      c.err = e;
      c.worst = std::string("d") + op.arg[k];
    }
  }
  c.passed = c.err <= c.tol;
  return c;
}

// =====================================================================================================
// timing
// =====================================================================================================

/// When a measurement stops. Rules, checked before each timed repetition (r done so far, `elapsed`
/// seconds of wall time since the first, untimed preparation included):
///   r >= kMinReps and elapsed >= max_s: stop (a large CPU size stops after a few repetitions)
///   r >= reps and elapsed >= min_s:     stop
///   r >= kRepCeilingFactor * reps:      stop (a tiny op does not repeat forever under --min-time)
struct Budget {
  int reps = 30;
  double min_s = 0.05;
  double max_s = 0.5;
  [[nodiscard]] bool done(std::size_t r_, double elapsed_ms) const {
    const auto r = static_cast<int>(r_);
    if (r >= kMinReps && elapsed_ms >= max_s * 1e3) return true;
    if (r >= reps && elapsed_ms >= min_s * 1e3) return true;
    return r >= kRepCeilingFactor * reps;
  }
};

struct Timing {
  dcexp::Summary ms;    // the device's own time: CUDA events on the GPU, the host clock on the CPU
  dcexp::Summary wall;  // host clock around each repetition (the same as ms on the CPU)
  int warmup = 0;
};

/// CPU timing: the backend runs every op to completion before returning (the thread pool and
/// OpenBLAS both join), so the host clock around the call is the op's time.
template <class Prepare, class Step>
Timing time_cpu(Prepare&& prepare, Step&& step, const Budget& b, int warmup) {
  Timing t;
  for (t.warmup = 0; t.warmup < warmup; ++t.warmup) {
    prepare();
    step();
  }
  std::vector<double> ms;
  const double start = dcexp::now_ms();
  while (!b.done(ms.size(), dcexp::now_ms() - start)) {
    prepare();
    const double t0 = dcexp::now_ms();
    step();
    ms.push_back(dcexp::now_ms() - t0);
  }
  t.ms = dcexp::summarize(ms);
  t.wall = t.ms;
  return t;
}

#if defined(__CUDACC__)
/// GPU timing: each repetition starts from an idle device and is bracketed by CUDA events on the
/// legacy default stream (dualcast's one stream), recorded before the call, so the host work that
/// precedes the first launch (argument checks, allocation from the cache, tape recording) is inside
/// the interval, as a user would see it. The host clock of the same repetition is kept beside.
template <class Prepare, class Step>
Timing time_gpu(Prepare&& prepare, Step&& step, const Budget& b) {
  Timing t;
  for (int r = 0; r < kGpuWarmup; ++r) {
    prepare();
    step();
  }
  t.warmup = kGpuWarmup;
  DCEXP_CUDA(cudaDeviceSynchronize());
  DCEXP_CUDA(cudaGetLastError());
  dcexp::EventPair ev;
  std::vector<double> gpu, wall;
  const double start = dcexp::now_ms();
  while (!b.done(gpu.size(), dcexp::now_ms() - start)) {
    prepare();
    DCEXP_CUDA(cudaDeviceSynchronize());
    const double t0 = dcexp::now_ms();
    DCEXP_CUDA(cudaEventRecord(ev.start, nullptr));
    step();
    DCEXP_CUDA(cudaEventRecord(ev.stop, nullptr));
    gpu.push_back(ev.elapsed_ms());  // waits for the stop event
    wall.push_back(dcexp::now_ms() - t0);
    DCEXP_CUDA(cudaGetLastError());
  }
  t.ms = dcexp::summarize(gpu);
  t.wall = dcexp::summarize(wall);
  return t;
}
#endif

/// `cpu_warmup`: untimed CPU calls first (the GPU always makes kGpuWarmup).
template <class Prepare, class Step>
Timing time_on(Device device, Prepare&& prepare, Step&& step, const Budget& b, int cpu_warmup) {
  if (device.is_cpu()) return time_cpu(prepare, step, b, cpu_warmup);
#if defined(__CUDACC__)
  return time_gpu(prepare, step, b);
#else
  DUALCAST_FAIL("ops_bench: built without CUDA; cannot time on ", device.str());
#endif
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

// =====================================================================================================
// results
// =====================================================================================================

/// One op / direction / size / device.
struct Row {
  std::string op;
  std::string dir;  // fwd or bwd
  std::int64_t n = 0;
  std::string device;  // cpu or cuda
  Timing t;
  double bytes = 0, flops = 0;
  std::string status = "ok";  // ok, validation_failed, out_of_memory, skipped, error
  std::string note;
  std::string checked;  // what this size was checked against on this device ("" when nothing)
  double max_err = NAN;
  bool valid = false;  // filled at the end: ok and its op passed every check
  [[nodiscard]] bool timed() const { return status == "ok" && t.ms.n > 0; }
  [[nodiscard]] double gbps() const {
    return timed() && flops == 0 ? dcexp::achieved_gbps(bytes, t.ms.median) : NAN;
  }
  [[nodiscard]] double tflops() const {
    return timed() && flops > 0 ? flops / (t.ms.median * 1e-3) / 1e12 : NAN;
  }
};

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

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

bool is_out_of_memory(const std::string& what) {
  return what.find("out of device memory") != std::string::npos ||
         what.find("out of host memory") != std::string::npos ||
         what.find("out of memory") != std::string::npos;
}

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

using dcexp::cli::UsageError;

struct Options {
  std::vector<std::int64_t> sizes;
  std::int64_t max_size = -1;
  std::vector<std::string> devices;  // empty: auto
  std::vector<const OpSpec*> ops;
  Budget budget;
  std::string out = "results/ops";
};

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

std::int64_t parse_int(const std::string& opt, const std::string& s, std::int64_t lo, std::int64_t hi) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno != 0) throw UsageError(opt + ": '" + s + "' is not an integer");
  if (v < lo || v > hi)
    throw UsageError(opt + ": " + s + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
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

// =====================================================================================================
// the sweep
// =====================================================================================================

struct Sweep {
  std::vector<Row> rows;
  std::vector<Check> checks;
  std::vector<std::string> problems;          // messages of out-of-memory and other errors
  std::set<std::string> failed_ops;           // ops with a failed check at some size
  std::map<std::string, std::int64_t> no_fit;  // "op/device" -> smallest n that did not fit
  bool any_oom = false, any_error = false;
};

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

void log_line(const std::string& s) {
  std::cerr << s << "\n";
  std::cerr.flush();
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

// =====================================================================================================
// outputs
// =====================================================================================================

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
  const std::string table = make_table(s, o, cpu_desc, gpu_desc, date);
  std::cout << table;
  std::cout.flush();

  Value root = Value::object();
  Value meta = Value::object();
  meta["tool"] = "ops_bench";
  meta["date"] = date;
  meta["cpu"] = cpu_desc;
  meta["cpu_model"] = cpu_model();
  meta["cpu_threads"] = dualcast::detail::cpu_thread_count();
  meta["cpu_blas"] = "OpenBLAS (cblas_sgemm; threads: OPENBLAS_NUM_THREADS or all cores)";
  meta["gpu"] = want_gpu ? Value(gpu_desc) : Value();
  meta["gpu_blas"] = want_gpu ? Value("cuBLAS sgemm, fp32 (no TF32)") : Value();
  meta["devices_timed"] = Value::array();
  for (const auto& d : devices) meta["devices_timed"].push_back(d);
  meta["dtype"] = "float32";
  meta["sizes"] = Value::array();
  for (std::int64_t n : o.sizes) meta["sizes"].push_back(static_cast<double>(n));
  meta["ops"] = Value::object();
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
  meta["reference_max_size"] = static_cast<double>(kReferenceMaxSize);
  meta["error_measures"] = "elementwise: max|a-b|/max(1,|b|); normwise (matmul): max|a-b|/max(1,max|b|)";
  meta["total_seconds"] = total_s;
  root["meta"] = meta;

  Value rows = Value::array();
  for (const auto& r : s.rows) {
    Value v = Value::object();
    v["op"] = r.op;
    v["direction"] = r.dir;
    v["n"] = static_cast<double>(r.n);
    v["device"] = r.device;
    v["status"] = r.status;
    v["valid"] = r.valid;
    v["ms"] = dcexp::summary_json(r.t.ms);
    v["wall_ms"] = dcexp::summary_json(r.t.wall);
    v["warmup"] = r.t.warmup;
    v["bytes"] = r.bytes;
    v["flops"] = r.flops;
    v["gbps"] = r.gbps();
    v["tflops"] = r.tflops();
    if (r.device == "cuda") v["speedup"] = speedup(s.rows, r.op, r.dir, r.n);
    v["checked_against"] = r.checked;
    v["max_err"] = r.max_err;
    if (!r.note.empty()) v["note"] = r.note;
    rows.push_back(v);
  }
  root["rows"] = rows;
  Value checks = Value::array();
  for (const auto& c : s.checks) {
    Value v = Value::object();
    v["op"] = c.op;
    v["n"] = static_cast<double>(c.n);
    v["device"] = c.device;
    v["against"] = c.against;
    v["max_err"] = c.err;
    v["tol"] = c.tol;
    v["worst"] = c.worst;
    v["passed"] = c.passed;
    checks.push_back(v);
  }
  root["checks"] = checks;
  Value problems = Value::array();
  for (const auto& p : s.problems) problems.push_back(p);
  root["problems"] = problems;
  root["table_markdown"] = table;

  const std::string json_path = (fs::path(o.out) / "ops.json").string();
  const std::string csv_path = (fs::path(o.out) / "ops.csv").string();
  const std::string md_path = (fs::path(o.out) / "table.md").string();
  dcexp::json::write_file(json_path, root);
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

}  // namespace

int main(int argc, char** argv) {
  bool help = false;
  Options o;
  try {
    o = parse(argc, argv, help);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "ops_bench: %s\n(run ops_bench --help for the options)\n", e.what());
    return kExitUsage;
  }
  if (help) {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  try {
    return run(o);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "ops_bench: %s\n", e.what());
    return kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ops_bench: error: %s\n", e.what());
    return kExitError;
  }
}
