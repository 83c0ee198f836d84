// test_reduce.cu: sum_to (every broadcast pattern against a naive double loop, large shapes, errors),
// sum / mean / amax over all elements and over axes (values, keepdims, negative axes, errors),
// their gradients (check_gradients in float64 on several shapes, amax ties split evenly), GPU equal to
// CPU on seeded inputs, and the tape's bookkeeping (no node without requires_grad or under
// NoGradGuard). Parameterised over every device of the build; CUDA cases skip without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "dualcast/error.hpp"
#include "dualcast/gradcheck.hpp"
#include "dualcast/ops/reduce.hpp"
#include "dualcast/tape.hpp"
#include "dualcast/tensor.hpp"
#include "test_util.hpp"

namespace dualcast {
namespace {

// ---- naive references ---------------------------------------------------------------------------

/// sum_to by definition: every input element added to the output element it broadcasts from.
std::vector<double> naive_sum_to(const std::vector<double>& x, const Shape& xs, const Shape& target) {
  std::vector<double> out(static_cast<std::size_t>(target.numel()), 0.0);
  const int offset = xs.rank() - target.rank();
  const Shape tstr = contiguous_strides(target);
  std::vector<std::int64_t> idx(static_cast<std::size_t>(xs.rank()), 0);
  for (std::int64_t i = 0; i < xs.numel(); ++i) {
    std::int64_t rem = i;
    for (int d = xs.rank() - 1; d >= 0; --d) {
      idx[static_cast<std::size_t>(d)] = rem % xs[d];
      rem /= xs[d];
    }
    std::int64_t o = 0;
    for (int d = 0; d < target.rank(); ++d)
      if (target[d] != 1) o += idx[static_cast<std::size_t>(d + offset)] * tstr[d];
    out[static_cast<std::size_t>(o)] += x[static_cast<std::size_t>(i)];
  }
  return out;
}

/// Maximum over a keepdims-shaped target, by definition.
std::vector<double> naive_amax_to(const std::vector<double>& x, const Shape& xs, const Shape& keep) {
  std::vector<double> out(static_cast<std::size_t>(keep.numel()), -INFINITY);
  const Shape kstr = contiguous_strides(keep);
  std::vector<std::int64_t> idx(static_cast<std::size_t>(xs.rank()), 0);
  for (std::int64_t i = 0; i < xs.numel(); ++i) {
    std::int64_t rem = i;
    for (int d = xs.rank() - 1; d >= 0; --d) {
      idx[static_cast<std::size_t>(d)] = rem % xs[d];
      rem /= xs[d];
    }
    std::int64_t o = 0;
    for (int d = 0; d < keep.rank(); ++d)
      if (keep[d] != 1) o += idx[static_cast<std::size_t>(d)] * kstr[d];
    auto& v = out[static_cast<std::size_t>(o)];
    v = std::fmax(v, x[static_cast<std::size_t>(i)]);
  }
  return out;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0.0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double e = relative_error(got[i], want[i]);
    if (e > worst || std::isnan(e)) {
      worst = e;
      at = i;
    }
  }
  EXPECT_LE(worst, tol) << what << ": element " << at << " got " << got[at] << " want " << want[at];
}

/// Keepdims shape of a reduction over `axes` (non-negative).
Shape keep_shape(const Shape& s, const std::vector<int>& axes) {
  Shape k = s;
  for (int a : axes) k[a] = 1;
  return k;
}

class Reduce : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override { DUALCAST_SKIP_IF_UNAVAILABLE(GetParam()); }
  [[nodiscard]] Device dev() const { return GetParam(); }
};

struct Pattern {
  Shape x;
  Shape target;
};

std::vector<Pattern> sum_to_patterns() {
  return {
      {{5}, {}},                    // vector to scalar (rank 0)
      {{5}, {1}},                   // vector to [1]
      {{4, 6}, {}},                 // full reduction to a scalar
      {{4, 6}, {1, 1}},             // full reduction keeping rank
      {{4, 6}, {6}},                // rows summed: lower rank (bias gradient)
      {{4, 6}, {1, 6}},             // column sums, same rank
      {{4, 6}, {4, 1}},             // row sums (inner reduced)
      {{7, 13, 5}, {13, 5}},        // odd sizes, leading dim dropped
      {{7, 13, 5}, {7, 1, 5}},      // middle dimension
      {{7, 13, 5}, {7, 13, 1}},     // innermost
      {{7, 13, 5}, {1, 13, 1}},     // outer and inner, keep the middle
      {{7, 13, 5}, {7, 1, 1}},      // two inner dims
      {{7, 13, 5}, {5}},            // two leading dims
      {{7, 13, 5}, {1}},            // everything, rank 1 target
      {{7, 1, 5}, {1, 5}},          // size-1 input dims
      {{1, 13, 1}, {13, 1}},        // only size-1 dims differ
      {{3, 1, 4, 1, 2}, {1, 4, 1, 2}},
      {{2, 3, 4, 5}, {3, 1, 5}},    // rank-different with an interior 1
      {{2, 3, 4, 5}, {2, 1, 4, 1}}, // alternating kept/reduced
      {{6, 0, 3}, {3}},             // empty input: zeros
      {{0, 3}, {1, 3}},
  };
}

TEST_P(Reduce, SumToMatchesNaiveLoopForEveryBroadcastPattern) {
  std::uint64_t seed = 1;
  for (const auto& pat : sum_to_patterns()) {
    for (DType dt : {DType::float32, DType::float64}) {
      const Tensor x = Tensor::randn(pat.x, dev(), seed++, dt);
      const Tensor y = sum_to(x, pat.target);
      const std::string what = "sum_to " + pat.x.str() + " -> " + pat.target.str() + " " +
                               dtype_name(dt);
      ASSERT_EQ(y.shape(), pat.target) << what;
      EXPECT_EQ(y.dtype(), dt) << what;
      EXPECT_EQ(y.device(), dev()) << what;
      EXPECT_TRUE(y.is_contiguous()) << what;
      const double tol = dt == DType::float32 ? kSameResultTolFloat : 1e-12;
      expect_close(y.to_vector<double>(), naive_sum_to(x.to_vector<double>(), pat.x, pat.target),
                   tol, what);
    }
  }
}

TEST_P(Reduce, SumToOfLargeShapesMatchesNaiveLoop) {
  const std::vector<Pattern> pats = {
      {{1000, 1000}, {1000}},     {{1000, 1000}, {1000, 1}},   {{1000, 1000}, {}},
      {{3, 1000000}, {3, 1}},     {{3, 1000000}, {1000000}},   {{3, 1000000}, {}},
      {{1000000, 3}, {3}},        {{64, 513, 33}, {513, 1}},   {{2, 300001}, {2, 1}},
  };
  std::uint64_t seed = 100;
  for (const auto& pat : pats) {
    const Tensor x = Tensor::randn(pat.x, dev(), seed++);
    const Tensor y = sum_to(x, pat.target);
    ASSERT_EQ(y.shape(), pat.target);
    expect_close(y.to_vector<double>(), naive_sum_to(x.to_vector<double>(), pat.x, pat.target),
                 kSameResultTolFloat, "sum_to " + pat.x.str() + " -> " + pat.target.str());
  }
}

TEST_P(Reduce, SumToOfEqualShapeReturnsTheInputItself) {
  const Tensor x = Tensor::randn({3, 4}, dev(), 7);
  const Tensor y = sum_to(x, Shape{3, 4});
  EXPECT_TRUE(y.shares_storage(x));
  EXPECT_EQ(y.shape(), x.shape());
}

TEST_P(Reduce, SumToRejectsTargetsThatDoNotBroadcastNamingOpAndShapes) {
  const Tensor x = Tensor::randn({4, 6}, dev(), 3);
  for (const Shape& bad : {Shape{4}, Shape{2, 6}, Shape{4, 6, 1}, Shape{1, 4, 6}, Shape{5, 1}}) {
    try {
      (void)sum_to(x, bad);
      ADD_FAILURE() << "sum_to to " << bad.str() << " did not throw";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("sum_to"), std::string::npos) << msg;
      EXPECT_NE(msg.find("[4, 6]"), std::string::npos) << msg;
      EXPECT_NE(msg.find(bad.str()), std::string::npos) << msg;
    }
  }
  // The library still works after the errors.
  EXPECT_NEAR(sum_to(Tensor::ones({4, 6}, DType::float32, dev()), Shape{}).item(), 24.0, 1e-6);
}


// ---- sum / mean / amax over axes --------------------------------------------------------------

struct AxesCase {
  Shape x;
  std::vector<int> axes;  // as passed (may be negative)
};

std::vector<AxesCase> axes_cases() {
  return {
      {{6}, {0}},           {{4, 6}, {0}},         {{4, 6}, {1}},       {{4, 6}, {-1}},
      {{4, 6}, {0, 1}},     {{4, 6}, {-1, -2}},    {{7, 13, 5}, {1}},   {{7, 13, 5}, {0, 2}},
      {{7, 13, 5}, {2, 0}}, {{7, 13, 5}, {-2}},    {{2, 3, 4, 5}, {1, 3}}, {{2, 1, 4, 1}, {1, 2}},
      {{3, 1000}, {1}},     {{1000, 3}, {0}},      {{5, 2048}, {1}},    {{2, 5000, 3}, {1}},
  };
}

std::vector<int> normalized(const std::vector<int>& axes, int rank) {
  std::vector<int> out;
  for (int a : axes) out.push_back(a < 0 ? a + rank : a);
  return out;
}

TEST_P(Reduce, SumMeanAndAmaxOverAxesMatchNaiveLoops) {
  std::uint64_t seed = 200;
  for (const auto& c : axes_cases()) {
    for (DType dt : {DType::float32, DType::float64}) {
      const Tensor x = Tensor::randn(c.x, dev(), seed++, dt);
      const Shape keep = keep_shape(c.x, normalized(c.axes, c.x.rank()));
      const std::vector<double> xv = x.to_vector<double>();
      const std::vector<double> want_sum = naive_sum_to(xv, c.x, keep);
      std::vector<double> want_mean = want_sum;
      const double n = static_cast<double>(c.x.numel()) / static_cast<double>(keep.numel());
      for (double& v : want_mean) v /= n;
      const std::vector<double> want_max = naive_amax_to(xv, c.x, keep);
      const double tol = dt == DType::float32 ? kSameResultTolFloat : 1e-12;
      for (bool keepdims : {false, true}) {
        const std::string what = "x " + c.x.str() + " " + dtype_name(dt) +
                                 (keepdims ? " keepdims" : "");
        const Tensor s = sum(x, c.axes, keepdims), m = mean(x, c.axes, keepdims),
                     a = amax(x, c.axes, keepdims);
        Shape want_shape;
        const std::vector<int> ax = normalized(c.axes, c.x.rank());
        for (int d = 0; d < c.x.rank(); ++d) {
          const bool reduced = std::find(ax.begin(), ax.end(), d) != ax.end();
          if (!reduced) want_shape.push_back(c.x[d]);
          else if (keepdims) want_shape.push_back(1);
        }
        EXPECT_EQ(s.shape(), want_shape) << what;
        EXPECT_EQ(m.shape(), want_shape) << what;
        EXPECT_EQ(a.shape(), want_shape) << what;
        expect_close(s.to_vector<double>(), want_sum, tol, "sum " + what);
        expect_close(m.to_vector<double>(), want_mean, tol, "mean " + what);
        expect_close(a.to_vector<double>(), want_max, 0.0, "amax " + what);
        // The tape forms compute the same values.
        const Var xv2 = Var::param(x);
        expect_close(sum(xv2, c.axes, keepdims).value().to_vector<double>(), want_sum, tol,
                     "Var sum " + what);
        expect_close(amax(xv2, c.axes, keepdims).value().to_vector<double>(), want_max, 0.0,
                     "Var amax " + what);
      }
    }
  }
}

TEST_P(Reduce, SingleAxisOverloadsEqualTheListForm) {
  const Tensor x = Tensor::randn({5, 6, 7}, dev(), 11);
  for (int axis : {0, 1, 2, -1, -3}) {
    for (bool keepdims : {false, true}) {
      expect_close(sum(x, axis, keepdims).to_vector<double>(),
                   sum(x, std::vector<int>{axis}, keepdims).to_vector<double>(), 0.0, "sum");
      expect_close(mean(x, axis, keepdims).to_vector<double>(),
                   mean(x, std::vector<int>{axis}, keepdims).to_vector<double>(), 0.0, "mean");
      expect_close(amax(x, axis, keepdims).to_vector<double>(),
                   amax(x, std::vector<int>{axis}, keepdims).to_vector<double>(), 0.0, "amax");
      EXPECT_EQ(amax(Var(x), axis, keepdims).shape(), amax(x, axis, keepdims).shape());
    }
  }
}

TEST_P(Reduce, FullReductionsGiveZeroDimTensors) {
  const Tensor x = Tensor::randn({9, 11}, dev(), 12, DType::float64);
  const std::vector<double> v = x.to_vector<double>();
  double s = 0.0, mx = -INFINITY;
  for (double e : v) {
    s += e;
    mx = std::fmax(mx, e);
  }
  EXPECT_EQ(sum(x).rank(), 0);
  EXPECT_EQ(mean(x).rank(), 0);
  EXPECT_EQ(amax(x).rank(), 0);
  EXPECT_NEAR(sum(x).item(), s, 1e-12);
  EXPECT_NEAR(mean(x).item(), s / 99.0, 1e-12);
  EXPECT_EQ(amax(x).item(), mx);
  EXPECT_EQ(sum(Var::param(x)).shape(), Shape{});
  // A 0-d input reduces to itself.
  EXPECT_EQ(sum(Tensor::scalar(2.5, DType::float32, dev())).item(), 2.5);
}

TEST_P(Reduce, Float32SumsAccumulateInDouble) {
  // 2^24 + 3 copies of 0.1f: a float accumulator drifts by far more than 1e-6 (a naive loop ends
  // near 2.1e6 instead of 1.68e6); a double one is exact to float rounding.
  const std::int64_t n = (1 << 24) + 3;
  const Tensor x = Tensor::full({n}, 0.1, DType::float32, dev());
  const double want = static_cast<double>(n) * static_cast<double>(0.1f);
  EXPECT_LE(relative_error(sum(x).item(), want), 1e-6);
  EXPECT_LE(relative_error(mean(x).item(), 0.1f), 1e-6);
  const Tensor x2 = Tensor::full({4, n / 4}, 0.1, DType::float32, dev());
  for (double v : sum(x2, 1).to_vector<double>())
    EXPECT_LE(relative_error(v, static_cast<double>(n / 4) * 0.1f), 1e-6);
}

TEST_P(Reduce, EmptyAxisListReducesNothing) {
  const Tensor x = Tensor::randn({3, 4}, dev(), 13);
  EXPECT_TRUE(sum(x, std::vector<int>{}).shares_storage(x));
  const Var v = Var::param(x);
  EXPECT_EQ(mean(v, std::vector<int>{}).state(), v.state());
}

TEST_P(Reduce, EmptyReductionsGiveZeroSumNanMeanAndAmaxError) {
  const Tensor x = Tensor::zeros({3, 0}, DType::float32, dev());
  EXPECT_EQ(sum(x, 1).to_vector<double>(), std::vector<double>(3, 0.0));
  for (double v : mean(x, 1).to_vector<double>()) EXPECT_TRUE(std::isnan(v));
  EXPECT_THROW((void)amax(x, 1), Error);
  EXPECT_EQ(amax(x, 0).shape(), Shape{0});
}

TEST_P(Reduce, BadAxesRaiseErrorsNamingOpAxisAndShapeAndTheNextOpWorks) {
  const Tensor x = Tensor::randn({4, 6}, dev(), 14);
  const auto expect_error = [&](auto&& fn, const std::string& op, const std::string& axis) {
    try {
      fn();
      ADD_FAILURE() << op << " with axis " << axis << " did not throw";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(op), std::string::npos) << msg;
      EXPECT_NE(msg.find("axis " + axis), std::string::npos) << msg;
      EXPECT_NE(msg.find("[4, 6]"), std::string::npos) << msg;
    }
  };
  expect_error([&] { (void)sum(x, 2); }, "sum", "2");
  expect_error([&] { (void)sum(x, -3); }, "sum", "-3");
  expect_error([&] { (void)mean(x, {0, 0}); }, "mean", "0");
  expect_error([&] { (void)mean(x, {1, -1}); }, "mean", "-1");
  expect_error([&] { (void)amax(x, 5); }, "amax", "5");
  expect_error([&] { (void)amax(Var::param(x), {0, -2}); }, "amax", "-2");
  expect_error([&] { (void)sum(Var::param(x), 7, true); }, "sum", "7");
  EXPECT_THROW((void)sum(Tensor()), Error);
  EXPECT_THROW((void)sum(Tensor::zeros({2}, DType::uint8, dev())), Error);
  // Everything still works afterwards.
  EXPECT_NEAR(sum(Tensor::ones({4, 6}, DType::float32, dev()), {0, 1}).item(), 24.0, 1e-6);
}


TEST_P(Reduce, BroadcastCopyMatchesNaiveIndexingForEveryPattern) {
  std::vector<Pattern> pats = sum_to_patterns();
  for (const Pattern& p : std::vector<Pattern>{{{1000, 1000}, {1000}},   {{1000, 1000}, {1000, 1}},
                                               {{200000, 3}, {3}},       {{64, 512, 130}, {512, 1}},
                                               {{7, 300, 5}, {7, 1, 5}}, {{3, 70000}, {3, 1}}})
    pats.push_back(p);
  std::uint64_t seed = 900;
  for (const auto& p : pats) {
    const Tensor g = Tensor::randn(p.target, dev(), seed++);
    const Tensor out = detail::broadcast_copy(g, p.x, 2.0);
    ASSERT_EQ(out.shape(), p.x);
    const std::vector<double> gv = g.to_vector<double>(), ov = out.to_vector<double>();
    // Naive: output element i reads the target element it broadcasts from.
    const int offset = p.x.rank() - p.target.rank();
    const Shape tstr = contiguous_strides(p.target);
    std::int64_t bad = -1;
    for (std::int64_t i = 0; i < p.x.numel() && bad < 0; ++i) {
      std::int64_t rem = i, src = 0;
      for (int d = p.x.rank() - 1; d >= 0; --d) {
        const std::int64_t idx = rem % p.x[d];
        rem /= p.x[d];
        if (d >= offset && p.target[d - offset] != 1) src += idx * tstr[d - offset];
      }
      if (ov[static_cast<std::size_t>(i)] != 2.0 * static_cast<double>(static_cast<float>(gv[static_cast<std::size_t>(src)])))
        bad = i;
    }
    EXPECT_EQ(bad, -1) << "broadcast_copy " << p.target.str() << " -> " << p.x.str();
  }
}

// ---- gradients --------------------------------------------------------------------------------

void expect_grad_ok(const GradCheckResult& r, const std::string& what) {
  EXPECT_TRUE(r.ok) << what << ": " << r.message;
}

TEST_P(Reduce, SumAndMeanGradientsMatchFiniteDifferences) {
  std::uint64_t seed = 300;
  for (const auto& c : axes_cases()) {
    if (c.x.numel() > 20000) continue;
    const Tensor x = Tensor::randn(c.x, dev(), seed++, DType::float64);
    for (bool keepdims : {false, true}) {
      const std::string what = "x " + c.x.str() + (keepdims ? " keepdims" : "");
      expect_grad_ok(check_gradients([&](const std::vector<Var>& v) { return sum(v[0], c.axes, keepdims); }, {x}),
                     "sum " + what);
      expect_grad_ok(check_gradients([&](const std::vector<Var>& v) { return mean(v[0], c.axes, keepdims); }, {x}),
                     "mean " + what);
    }
  }
  const Tensor x = Tensor::randn({3, 4, 5}, dev(), 399, DType::float64);
  expect_grad_ok(check_gradients([](const std::vector<Var>& v) { return sum(v[0]); }, {x}), "sum all");
  expect_grad_ok(check_gradients([](const std::vector<Var>& v) { return mean(v[0]); }, {x}), "mean all");
}

TEST_P(Reduce, SumToGradientMatchesFiniteDifferences) {
  std::uint64_t seed = 400;
  for (const auto& pat : sum_to_patterns()) {
    if (pat.x.numel() == 0) continue;
    const Tensor x = Tensor::randn(pat.x, dev(), seed++, DType::float64);
    expect_grad_ok(check_gradients([&](const std::vector<Var>& v) { return sum_to(v[0], pat.target); }, {x}),
                   "sum_to " + pat.x.str() + " -> " + pat.target.str());
  }
}

TEST_P(Reduce, AmaxGradientMatchesFiniteDifferences) {
  std::uint64_t seed = 500;
  for (const auto& c : axes_cases()) {
    if (c.x.numel() > 20000) continue;
    const Tensor x = Tensor::randn(c.x, dev(), seed++, DType::float64);
    for (bool keepdims : {false, true})
      expect_grad_ok(check_gradients([&](const std::vector<Var>& v) { return amax(v[0], c.axes, keepdims); }, {x}),
                     "amax x " + c.x.str());
  }
  const Tensor x = Tensor::randn({6, 7}, dev(), 599, DType::float64);
  expect_grad_ok(check_gradients([](const std::vector<Var>& v) { return amax(v[0]); }, {x}), "amax all");
}

TEST_P(Reduce, AmaxSplitsTheGradientEvenlyAmongTies) {
  const Tensor x = Tensor::from_vector<double>({2, 3}, {3, 3, 3, 1, 2, 2}, dev());
  const Var v = Var::param(x);
  amax(v, 1).backward(Tensor::from_vector<double>({2}, {3.0, 1.0}, dev()));
  const std::vector<double> want = {1, 1, 1, 0, 0.5, 0.5};
  expect_close(v.grad().to_vector<double>(), want, 1e-15, "amax ties");
  const Var w = Var::param(Tensor::from_vector<float>({4}, {1, 5, 5, -2}, dev()));
  amax(w).backward();
  expect_close(w.grad().to_vector<double>(), {0, 0.5, 0.5, 0}, 1e-7, "amax all ties");
}

TEST_P(Reduce, GradientsAccumulateIntoExistingGradients) {
  const Var v = Var::param(Tensor::randn({3, 4}, dev(), 600, DType::float64));
  // d/dx [sum(x) + 2 * mean over axis 0 summed] = 1 + 2/3 everywhere.
  const Var a = sum(v);
  a.backward();
  const Var b = sum(mean(v, 0));
  b.backward();
  for (double g : v.grad().to_vector<double>()) EXPECT_NEAR(g, 1.0 + 1.0 / 3.0, 1e-14);
}

TEST_P(Reduce, NoNodesAreRecordedWithoutRequiresGradOrUnderNoGradGuard) {
  const Tensor x = Tensor::randn({3, 4}, dev(), 700);
  const auto before = autograd_stats().nodes_created;
  (void)sum(Var(x), 1);
  (void)mean(Var(x));
  (void)amax(Var(x), 0);
  (void)sum_to(Var(x), Shape{4});
  {
    NoGradGuard guard;
    const Var p = Var::param(x);
    EXPECT_FALSE(sum(p).requires_grad());
    EXPECT_FALSE(amax(p, 1).requires_grad());
    EXPECT_FALSE(sum_to(p, Shape{1, 4}).requires_grad());
  }
  EXPECT_EQ(autograd_stats().nodes_created, before);
  const Var p = Var::param(x);
  EXPECT_TRUE(sum(p, 0).requires_grad());
  EXPECT_EQ(autograd_stats().nodes_created, before + 1);
}

}  // namespace

// ---- GPU equals CPU ----------------------------------------------------------------------------

TEST(ReduceCuda, GpuReductionsEqualCpuOnSeededInputs) {
  DUALCAST_REQUIRE_CUDA();
  const Device gpu = Device::cuda(0), cpu = Device::cpu();
  std::vector<Pattern> pats = sum_to_patterns();
  for (const Pattern& p : std::vector<Pattern>{{{1000, 1000}, {1000}},
                                               {{1000, 1000}, {1000, 1}},
                                               {{3, 1000000}, {3, 1}},
                                               {{1000000, 3}, {3}},
                                               {{4096, 4096}, {}},
                                               {{257, 129, 65}, {129, 1}},
                                               {{8, 100000}, {100000}}})
    pats.push_back(p);
  std::uint64_t seed = 800;
  for (const auto& p : pats) {
    const Tensor xc = Tensor::randn(p.x, cpu, seed), xg = Tensor::randn(p.x, gpu, seed);
    ++seed;
    const std::string what = p.x.str() + " -> " + p.target.str();
    expect_close(sum_to(xg, p.target).to_vector<double>(), sum_to(xc, p.target).to_vector<double>(),
                 kSameResultTolFloat, "sum_to " + what);
    const int off = p.x.rank() - p.target.rank();
    std::vector<int> axes;
    for (int d = 0; d < p.x.rank(); ++d)
      if (d < off || p.target[d - off] == 1) axes.push_back(d);
    if (p.x.numel() == 0) continue;
    expect_close(amax(xg, axes).to_vector<double>(), amax(xc, axes).to_vector<double>(), 0.0,
                 "amax " + what);
    expect_close(mean(xg, axes).to_vector<double>(), mean(xc, axes).to_vector<double>(),
                 kSameResultTolFloat, "mean " + what);
    // Backward of the reductions on both devices.
    const Var vc = Var::param(xc), vg = Var::param(xg);
    sum(amax(vc, axes)).backward();
    sum(amax(vg, axes)).backward();
    expect_close(vg.grad().to_vector<double>(), vc.grad().to_vector<double>(), 0.0,
                 "amax grad " + what);
  }
}


/// Not a check: prints the effective bandwidth (bytes read + written per second) of sum_to, amax
/// and the gradient broadcast for typical patterns. Run with --gtest_also_run_disabled_tests.
TEST(ReduceCuda, DISABLED_ReportBandwidth) {
  DUALCAST_REQUIRE_CUDA();
  const Device gpu = Device::cuda(0);
  const std::vector<Pattern> pats = {{{4096, 4096}, {}},       {{4096, 4096}, {4096}},
                                     {{4096, 4096}, {4096, 1}}, {{3, 10000000}, {3, 1}},
                                     {{10000000, 3}, {3}},      {{256, 4096}, {4096}},
                                     {{65536, 10}, {65536, 1}}, {{64, 512, 512}, {512, 1}},
                                     {{1024, 1024}, {1024}},    {{1000, 1000}, {1000, 1}}};
  // Seconds per call in a stream of back-to-back calls (one synchronisation at the end).
  const auto time_it = [&](auto&& fn) {
    fn();
    synchronize(gpu);
    auto t0 = std::chrono::steady_clock::now();
    fn();
    synchronize(gpu);
    const double once = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int iters = static_cast<int>(std::min(2000.0, std::max(10.0, 0.1 / once)));
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) fn();
    synchronize(gpu);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  };
  for (const auto& p : pats) {
    const Tensor x = Tensor::randn(p.x, gpu, 1);
    const double bytes = static_cast<double>(x.nbytes() + p.target.numel() * 4);
    const double t = time_it([&] { (void)sum_to(x, p.target); });
    const int off = p.x.rank() - p.target.rank();
    std::vector<int> axes;
    for (int d = 0; d < p.x.rank(); ++d)
      if (d < off || p.target[d - off] == 1) axes.push_back(d);
    const double ta = time_it([&] { (void)amax(x, axes); });
    const Tensor g = Tensor::randn(p.target, gpu, 2);
    const double tb = time_it([&] { (void)detail::broadcast_copy(g, p.x); });
    std::printf("bench %-16s -> %-12s sum_to %8.1f us %7.0f GB/s | amax %8.1f us %7.0f GB/s | "
                "broadcast %8.1f us %7.0f GB/s\n",
                p.x.str().c_str(), p.target.str().c_str(), t * 1e6, bytes / t * 1e-9, ta * 1e6,
                bytes / ta * 1e-9, tb * 1e6, bytes / tb * 1e-9);
  }
}

namespace {
}  // namespace

INSTANTIATE_TEST_SUITE_P(Devices, Reduce, ::testing::ValuesIn(testing::all_devices()),
                         [](const auto& info) { return std::string(testing::device_label(info.param)); });

}  // namespace dualcast
