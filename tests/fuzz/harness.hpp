// harness.hpp: what the fuzzer's case runners share: the case categories, the report of one case,
// the tolerances, the comparison of dualcast's numbers with the reference's (and of one device's
// with another's), and the evaluation of an Expr (expr.hpp) with dualcast's shape ops, as a Var on
// the tape or as a plain Tensor.
#pragma once

#include <cstdint>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "dualcast/device.hpp"
#include "dualcast/dtype.hpp"
#include "dualcast/gradcheck.hpp"
#include "dualcast/tape.hpp"
#include "dualcast/tensor.hpp"
#include "expr.hpp"
#include "reference.hpp"
#include "rng.hpp"

namespace fuzz {

enum class Category { broadcast, elementwise, reduce, shape };
inline constexpr int kCategoryCount = 4;
inline const char* category_name(Category c) {
  static const char* names[] = {"broadcast", "elementwise", "reduce", "shape"};
  return names[static_cast<int>(c)];
}

struct Options {
  std::vector<dualcast::Device> devices{dualcast::Device::cpu()};
  Budget budget;
  /// A case may be large (up to this many elements) now and then: the multi-threaded CPU paths and
  /// the split GPU reductions only start above tens of thousands of elements.
  std::int64_t large_numel = 200000;
  double large_chance = 0.04;
  /// Known issues (handed to whoever owns the code, see README.md) fail the case when set; else
  /// they are counted and reported.
  bool strict = false;
};

/// What one case did and found.
struct Report {
  Category category = Category::broadcast;
  std::string what;                    ///< the case, in words (printed with failures)
  std::vector<std::string> failures;
  std::vector<std::string> known;      ///< ids of known issues the case ran into
  std::int64_t compared = 0;           ///< numbers compared with the reference or across devices
  void fail(const std::string& msg) { failures.push_back(msg); }
  /// A known issue: counted (and a failure under strict).
  void known_issue(const std::string& id, const std::string& msg, bool strict) {
    known.push_back(id);
    if (strict) fail("[known issue " + id + "] " + msg);
  }
};

// ---- tolerances --------------------------------------------------------------------------------------
// A result passes when |got - want| <= rel * max(1, |want|) + mag_tol * mag, where mag is the sum of
// the absolute values of the terms that make up `want` (reference.hpp): the rounding a correct float
// sum of many terms may accumulate, however much they cancel.

/// float32 against the double reference: dualcast's float tolerance (gradcheck.hpp).
inline constexpr double kTolFloat = dualcast::kGradTolFloat;
/// float64 against the double reference: the same formulas in another order (and CUDA's libm).
inline constexpr double kTolDouble = 1e-9;
/// Rounding allowed per unit of summed magnitude: a few float / double epsilons.
inline constexpr double kMagTolFloat = 1e-5;
inline constexpr double kMagTolDouble = 1e-13;
/// GPU against CPU, both dualcast: rounding of sums taken in another order, libm vs CUDA math.
inline constexpr double kCrossTolFloat = dualcast::kSameResultTolFloat;
inline constexpr double kCrossTolDouble = 1e-11;

/// Compares got with want (values, NaN = NaN) and records the first few mismatches.
void check_close(Report& rep, const std::string& label, const std::vector<double>& got,
                 const fuzzref::Array& want, bool single);
/// Compares one device's numbers with the first device's (same case, same inputs).
void check_same(Report& rep, const std::string& label, const std::vector<double>& got,
                const std::vector<double>& first, const std::vector<double>& mag, bool single);

// ---- running a case on several devices -------------------------------------------------------------

/// The numbers one device produced for a case, in a fixed order, labelled, for the cross-device
/// comparison; `mag` holds the reference's magnitudes (same order) when known.
struct Outcome {
  std::vector<std::string> labels;
  std::vector<std::vector<double>> numbers;
  std::vector<std::vector<double>> mags;
  void add(const std::string& label, std::vector<double> v, const fuzzref::Array* ref) {
    labels.push_back(label);
    numbers.push_back(std::move(v));
    mags.push_back(ref && !ref->mag.empty() ? ref->mag : std::vector<double>());
  }
};

/// Checks every device's outcome against the first device's.
void check_devices(Report& rep, const std::vector<dualcast::Device>& devices,
                   const std::vector<Outcome>& outcomes, bool single);

inline const char* dev_label(dualcast::Device d) { return d.is_cpu() ? "cpu" : "cuda"; }

/// Runs one device's share of a case; an exception fails the case, naming the device.
template <class Fn>
void on_device(Report& rep, dualcast::Device d, Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    rep.fail(std::string(dev_label(d)) + ": unexpected exception: " + e.what());
  }
}

// ---- tensors from a case description ---------------------------------------------------------------

/// A leaf's values as a tensor of `dtype` (uint8 for a mask leaf) on `device`.
dualcast::Tensor make_tensor(const Leaf& leaf, dualcast::DType dtype, dualcast::Device device);
/// Every leaf as a Var: Var::param for param leaves, constants otherwise.
std::vector<dualcast::Var> make_leaf_vars(const std::vector<Leaf>& leaves, dualcast::DType dtype,
                                          dualcast::Device device);
std::vector<dualcast::Tensor> make_leaf_tensors(const std::vector<Leaf>& leaves,
                                                dualcast::DType dtype, dualcast::Device device);

/// e computed with dualcast's Var shape ops (recorded on the tape). `memo` makes an Expr shared by
/// two arguments one Var.
dualcast::Var eval_var(const ExprP& e, const std::vector<dualcast::Var>& leaves,
                       std::map<const Expr*, dualcast::Var>& memo);
/// e computed with dualcast's Tensor shape ops (no tape).
dualcast::Tensor eval_tensor(const ExprP& e, const std::vector<dualcast::Tensor>& leaves);

/// A random adjoint for a result of shape s (rounded to float for float32 cases).
fuzzref::Array random_adjoint(Rng& r, const Dims& s, bool single);
dualcast::Tensor to_tensor(const fuzzref::Array& a, dualcast::DType dtype, dualcast::Device device);

/// Compares the gradients of the param leaves with the reference's (scaled by `times`: backward
/// run twice) and adds them to the outcome. A param leaf without a gradient is a failure.
void check_leaf_grads(Report& rep, Outcome& out, const std::vector<Leaf>& leaves,
                      const std::vector<dualcast::Var>& vars, const std::vector<fuzzref::Array>& want,
                      double times, bool single, const std::string& prefix);

/// Whether any param leaf is read by e.
bool reads_param(const ExprP& e, const std::vector<Leaf>& leaves);

// ---- the categories (one file each) --------------------------------------------------------------------
void run_broadcast_case(Rng& r, const Options& opt, Report& rep);
void run_elementwise_case(Rng& r, const Options& opt, Report& rep);
void run_reduce_case(Rng& r, const Options& opt, Report& rep);
void run_shape_case(Rng& r, const Options& opt, Report& rep);

/// One case of a random category (the first decision picks it).
Report run_case(Rng& r, const Options& opt);

/// The largest element count a case may use: usually the budget, now and then large_numel.
std::int64_t draw_numel_cap(Rng& r, const Options& opt);

}  // namespace fuzz
