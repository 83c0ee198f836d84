// gradcheck.hpp: the one gradient checker. Central finite differences in double precision, with the
// tolerances every test uses, for scalar functions (dual-number rules) and, below, for tape functions.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

namespace dualcast {

/// Step of the central difference (f(x+h) - f(x-h)) / 2h: near the cube root of double's epsilon,
/// which balances truncation error (h^2) against rounding error (eps/h).
inline constexpr double kFiniteDifferenceStep = 1e-6;
/// Worst relative error accepted between an analytic double-precision derivative and the central
/// difference (relative to max(1, |derivative|)).
inline constexpr double kGradTolDouble = 1e-6;
/// Worst relative error accepted between float results and double references.
inline constexpr double kGradTolFloat = 2e-3;
/// Worst relative error accepted between a gradient computed in bfloat16 and the float64 finite
/// difference: bfloat16 keeps 8 significant bits (unit roundoff 2^-8 = 3.9e-3), and a gradient goes
/// through several roundings (the inputs, the forward values it depends on, the backward's own
/// result), each up to one unit roundoff; 3e-2 allows about eight of them.
inline constexpr double kGradTolBfloat16 = 3e-2;
/// The same for float16: 11 significant bits (unit roundoff 2^-11 = 4.9e-4), eight roundings.
inline constexpr double kGradTolFloat16 = 4e-3;
/// Worst relative error accepted between two float computations of the same quantity in different
/// orders (CPU vs GPU, mixed vs reverse mode): a few ulps accumulated over a reduction.
inline constexpr double kSameResultTolFloat = 1e-4;
/// Worst relative error accepted between a result stored in a 16-bit dtype and the float32 result
/// of the same computation rounded once to that dtype: one unit in the last place (2^-7 for
/// bfloat16, 2^-10 for float16), since the two float results may differ by a few float ulps (other
/// exp/tanh implementations, other operation order), which can move the rounding by one step.
inline constexpr double kSameResultTolBfloat16 = 0.0078125;
inline constexpr double kSameResultTolFloat16 = 0.0009765625;
/// Worst relative error accepted between two double computations of the same quantity that may use
/// different implementations of exp, tanh, ...: the CPU SIMD tiles call libmvec (<= 4 ulp), a
/// functor they cannot vectorise (nvcc's type-erased __host__ __device__ lambdas) the C library's
/// (< 1 ulp); a sum that cancels amplifies those ulps (4e-14 relative seen).
inline constexpr double kSameResultTolDouble = 1e-12;

/// Whether the process runs under compute-sanitizer: scripts/gpu-sanitize sets DUALCAST_SANITIZE=1.
/// Checks that only scale with repetition (more elements, larger sizes) may do less there: every
/// kernel launch then costs about a millisecond, and the tool checks each code path's memory
/// accesses, which the first element exercises as well as the hundredth.
inline bool running_under_sanitizer() {
  static const bool sanitizing = std::getenv("DUALCAST_SANITIZE") != nullptr;
  return sanitizing;
}

/// Elements per input check_gradients checks under the sanitizer (evenly spread, as always, over
/// the input), whatever the options ask: each costs two evaluations of the whole function.
inline constexpr std::int64_t kSanitizerElementsPerInput = 3;

/// Central difference of a scalar function at x, in double.
template <class F>
double central_difference(const F& f, double x, double h = kFiniteDifferenceStep) {
  return (f(x + h) - f(x - h)) / (2.0 * h);
}

/// Relative error of `got` against `want`, scaled by max(1, |want|) so values near zero are
/// judged absolutely. NaN in either gives infinity, so a NaN never passes a tolerance.
inline double relative_error(double got, double want) {
  if (std::isnan(got) || std::isnan(want)) return INFINITY;
  const double scale = std::fmax(1.0, std::fabs(want));
  return std::fabs(got - want) / scale;
}

/// How array_error scales the differences of two arrays.
enum class ErrorScale {
  /// max |got - want| / max |want|: normwise in the max norm (experiments/peers/valdir.py's
  /// array_rel_err), so small entries are judged against the array's largest; an all-zero reference
  /// accepts only all-zero results.
  largest,
  /// max |got - want| / max(1, max |want|): as `largest`, but arrays of small values judged absolutely.
  largest_or_one,
  /// max over the elements of relative_error(got_i, want_i): each element against itself.
  elementwise,
};

/// The error of a whole array against a reference (anything with size() and operator[] giving
/// numbers; the tests, the experiments' validations and the benchmarks' checks all measure with it).
/// Infinity for a length mismatch or a NaN anywhere, so that it never passes a tolerance; an
/// infinite reference entry agrees with the same infinity and does not count in the scale.
template <class Got, class Want>
double array_error(const Got& got, const Want& want, ErrorScale scale) {
  if (got.size() != want.size()) return INFINITY;
  double worst = 0.0, largest = scale == ErrorScale::largest ? 0.0 : 1.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    if (std::isinf(w) && g == w) continue;
    const double d = std::fabs(g - w);
    if (!std::isfinite(d)) return INFINITY;
    if (scale == ErrorScale::elementwise) {
      worst = std::fmax(worst, d / std::fmax(1.0, std::fabs(w)));
    } else {
      worst = std::fmax(worst, d);
      largest = std::fmax(largest, std::fabs(w));
    }
  }
  if (scale == ErrorScale::elementwise) return worst;
  if (largest == 0.0) return worst == 0.0 ? 0.0 : INFINITY;
  return worst / largest;
}

}  // namespace dualcast

// ---- tape-level checker ---------------------------------------------------------------------------
#include <algorithm>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "dualcast/ops/cast.hpp"
#include "dualcast/random.hpp"
#include "dualcast/tape.hpp"

namespace dualcast {

/// array_error of two tensors, copied to the host in double; infinity for different shapes.
inline double array_error(const Tensor& got, const Tensor& want, ErrorScale scale) {
  if (got.shape() != want.shape()) return INFINITY;
  return array_error(got.to_vector<double>(), want.to_vector<double>(), scale);
}

/// What check_gradients found: the worst relative error over all checked elements and where.
struct GradCheckResult {
  bool ok = true;
  double worst_error = 0.0;
  int worst_input = -1;
  std::int64_t worst_index = -1;
  double analytic = 0.0;
  double numeric = 0.0;
  std::string message;  ///< human-readable summary naming the offending input and index
};

struct GradCheckOptions {
  double tolerance = kGradTolDouble;
  double step = kFiniteDifferenceStep;
  /// Elements checked per input (evenly spread); inputs at most this large are checked entirely.
  std::int64_t max_elements_per_input = 96;
  std::uint64_t seed = 12345;
};

/// Compares the tape's gradients of `f` with central finite differences in double precision.
/// `f` takes a std::vector<Var> (one per input, each a Var::param on the inputs' device) and returns a
/// Var of any shape; a non-scalar output is projected onto a fixed random direction R, so the checked
/// quantity is sum(f(x) * R) and backward is seeded with R (rounded to the output's dtype, and the
/// same rounded R projects the differences).
///
/// The differencing always runs in float64: inputs are converted to float64 for it, and it holds a
/// KeepPrecisionGuard (ops/cast.hpp), so casts of those float64 values to narrower dtypes inside `f`
/// do nothing. The tape's gradients come from f as written: float32 and float64 inputs are converted
/// to float64 for it too (as always), while a bfloat16 or float16 input is passed in its own dtype,
/// so f runs its 16-bit path, and a cast to 16 bits inside f (of a float64 input) takes effect. Those
/// gradients carry 16-bit rounding: check them with kGradTolBfloat16 / kGradTolFloat16.
template <class F>
GradCheckResult check_gradients(const F& f, const std::vector<Tensor>& inputs,
                                const GradCheckOptions& opts = {}) {
  std::vector<Tensor> x;
  for (const auto& t : inputs) x.push_back(t.to(DType::float64).clone());
  std::vector<Var> params;
  for (std::size_t k = 0; k < x.size(); ++k)
    params.push_back(Var::param(is_half(inputs[k].dtype()) ? inputs[k].clone() : x[k]));
  const Var out = f(params);
  const Shape out_shape = out.shape();
  const Device dev = out.device();
  std::vector<double> r(static_cast<std::size_t>(out_shape.numel()));
  for (std::size_t j = 0; j < r.size(); ++j) r[j] = random::normal(opts.seed, j);
  const Tensor seed = Tensor::from_vector(out_shape, r, dev).to(out.dtype());
  r = seed.to_vector<double>();
  out.backward(seed);

  auto project = [&](const std::vector<Tensor>& xs) {
    NoGradGuard no_grad;
    KeepPrecisionGuard keep;
    std::vector<Var> vs(xs.begin(), xs.end());
    const std::vector<double> y = f(vs).value().template to_vector<double>();
    double s = 0.0;
    for (std::size_t j = 0; j < y.size(); ++j) s += y[j] * r[j];
    return s;
  };

  GradCheckResult res;
  for (std::size_t k = 0; k < x.size(); ++k) {
    const std::vector<double> analytic = params[k].has_grad()
                                             ? params[k].grad().template to_vector<double>()
                                             : std::vector<double>(x[k].numel(), 0.0);
    const std::vector<double> base = x[k].template to_vector<double>();
    const std::int64_t n = x[k].numel();
    const std::int64_t per_input = running_under_sanitizer()
                                       ? std::min(opts.max_elements_per_input, kSanitizerElementsPerInput)
                                       : opts.max_elements_per_input;
    const std::int64_t stride = n <= per_input ? 1 : (n + per_input - 1) / per_input;
    for (std::int64_t j = 0; j < n; j += stride) {
      std::vector<Tensor> xs = x;
      std::vector<double> v = base;
      v[j] = base[j] + opts.step;
      xs[k] = Tensor::from_vector(x[k].shape(), v, x[k].device());
      const double up = project(xs);
      v[j] = base[j] - opts.step;
      xs[k] = Tensor::from_vector(x[k].shape(), v, x[k].device());
      const double down = project(xs);
      const double numeric = (up - down) / (2.0 * opts.step);
      const double err = relative_error(analytic[j], numeric);
      if (err > res.worst_error || res.worst_input < 0) {
        res.worst_error = err;
        res.worst_input = static_cast<int>(k);
        res.worst_index = j;
        res.analytic = analytic[j];
        res.numeric = numeric;
      }
    }
  }
  res.ok = res.worst_error <= opts.tolerance;
  std::ostringstream os;
  os << "check_gradients: worst relative error " << res.worst_error << " (tolerance "
     << opts.tolerance << ") at input " << res.worst_input << " element " << res.worst_index
     << ": analytic " << res.analytic << " vs finite difference " << res.numeric;
  res.message = os.str();
  return res;
}

}  // namespace dualcast
