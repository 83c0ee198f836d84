// ops_bench.hpp: what the parts of ops_bench (the per-op CPU vs GPU analysis, README.md beside this
// file) share: the constants, the ops and their error measures, the records of checks, timings and
// the sweep, the options, and the functions each part offers the others:
//   ops.cu        the ops, their float64 host reference and the checks made before timing
//   sweep.cu      the timing of one op's forward and backward, and the sweep over ops and sizes
//   report.cu     the markdown table, ops.csv and ops.json
//   ops_bench.cu  the command line, run() and main()
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "dualcast/dualcast.hpp"

#include "../common/gpu_timing.hpp"

namespace opsbench {

using dualcast::Device;
using dualcast::DType;
using dualcast::Shape;
using dualcast::Tensor;
using dualcast::Var;

// ---- constants ----------------------------------------------------------------------------------------

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

// ---- the ops ------------------------------------------------------------------------------------------

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

inline const OpSpec kOps[] = {
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

const OpSpec* find_op(const std::string& name);  ///< nullptr for an unknown name

// ---- records ------------------------------------------------------------------------------------------

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

struct Options {
  std::vector<std::int64_t> sizes;
  std::int64_t max_size = -1;
  std::vector<std::string> devices;  // empty: auto
  std::vector<const OpSpec*> ops;
  Budget budget;
  std::string out = "results/ops";
};

/// What the sweep found: the timed rows, the checks and what went wrong.
struct Sweep {
  std::vector<Row> rows;
  std::vector<Check> checks;
  std::vector<std::string> problems;          // messages of out-of-memory and other errors
  std::set<std::string> failed_ops;           // ops with a failed check at some size
  std::map<std::string, std::int64_t> no_fit;  // "op/device" -> smallest n that did not fit
  bool any_oom = false, any_error = false;
};

// ---- ops.cu -------------------------------------------------------------------------------------------

std::vector<Var> make_params(const OpSpec& op, std::int64_t n, Device device);
Var forward(const OpSpec& op, const std::vector<Var>& p);
Tensor make_seed(const OpSpec& op, const Var& y, Device device);
double bytes_moved(const OpSpec& op, std::int64_t n, bool backward);
double flops(const OpSpec& op, std::int64_t n, bool backward);
RunResult run_once(const OpSpec& op, std::int64_t n, Device device);
void poison_device_cache(Device device, std::int64_t n);
Check check_against_float64(const OpSpec& op, std::int64_t n, const RunResult& cpu);
Check check_against_cpu(const OpSpec& op, std::int64_t n, const RunResult& got, const RunResult& cpu,
                        Device device);

// ---- sweep.cu -----------------------------------------------------------------------------------------

/// One op at one size: the checks, then the timings on each requested device, appended to `s`.
void run_unit(Sweep& s, const OpSpec& op, std::int64_t n, bool time_cpu_side, bool use_gpu, const Budget& b);
std::string fmt_ms(double ms);  ///< milliseconds with three significant digits, never in exponent form

// ---- report.cu ----------------------------------------------------------------------------------------

std::string cpu_model();  ///< the model name in /proc/cpuinfo ("unknown CPU" where there is none)

/// Prints the table and writes ops.json, ops.csv and table.md under o.out; returns the exit status
/// the sweep earns (a failed check, an error, a size that did not fit, or none).
int write_outputs(const Sweep& s, const Options& o, const std::vector<std::string>& devices,
                  const std::string& cpu_desc, const std::string& gpu_desc, const std::string& date,
                  double total_s);

}  // namespace opsbench
