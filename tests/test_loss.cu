// test_loss.cu: softmax and log_softmax (values against a naive double loop along every axis,
// stability for huge and -inf logits, gradients), cross_entropy (values, +1e5 shift invariance in
// float64 and float32, gradient = (softmax - onehot) / N, finite differences, invalid labels),
// mse (values, gradients for both arguments, shape errors), and GPU equal to CPU on seeded inputs.
// Parameterised over every device of the build; CUDA cases skip without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

#include "dualcast/error.hpp"
#include "dualcast/gradcheck.hpp"
#include "dualcast/ops/loss.hpp"
#include "dualcast/ops/reduce.hpp"
#include "dualcast/tape.hpp"
#include "dualcast/tensor.hpp"
#include "test_util.hpp"

namespace dualcast {
namespace {

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

/// Naive (log-)softmax along `axis` in double.
std::vector<double> naive_softmax(const std::vector<double>& x, const Shape& s, int axis, bool log) {
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= s[d];
  for (int d = axis + 1; d < s.rank(); ++d) inner *= s[d];
  const std::int64_t C = s[axis];
  std::vector<double> y(x.size());
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t i = 0; i < inner; ++i) {
      const auto at = [&](std::int64_t c) { return static_cast<std::size_t>((o * C + c) * inner + i); };
      double m = -INFINITY;
      for (std::int64_t c = 0; c < C; ++c) m = std::fmax(m, x[at(c)]);
      double z = 0.0;
      for (std::int64_t c = 0; c < C; ++c) z += std::exp(x[at(c)] - m);
      for (std::int64_t c = 0; c < C; ++c)
        y[at(c)] = log ? x[at(c)] - m - std::log(z) : std::exp(x[at(c)] - m) / z;
    }
  return y;
}

double naive_cross_entropy(const std::vector<double>& x, std::int64_t N, std::int64_t C,
                           const std::vector<int>& labels) {
  const std::vector<double> ls = naive_softmax(x, Shape{N, C}, 1, true);
  double s = 0.0;
  for (std::int64_t i = 0; i < N; ++i) s -= ls[static_cast<std::size_t>(i * C + labels[static_cast<std::size_t>(i)])];
  return s / static_cast<double>(N);
}

std::vector<int> make_labels(std::int64_t N, std::int64_t C, std::uint64_t seed) {
  std::vector<int> l(static_cast<std::size_t>(N));
  for (std::size_t i = 0; i < l.size(); ++i)
    l[i] = static_cast<int>(random::uniform(seed, i) * static_cast<double>(C)) % static_cast<int>(C);
  return l;
}

void expect_grad_ok(const GradCheckResult& r, const std::string& what) {
  EXPECT_TRUE(r.ok) << what << ": " << r.message;
}

class Loss : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override { DUALCAST_SKIP_IF_UNAVAILABLE(GetParam()); }
  [[nodiscard]] Device dev() const { return GetParam(); }
};

struct AxisCase {
  Shape x;
  int axis;
};

std::vector<AxisCase> softmax_cases() {
  return {{{7}, 0},        {{4, 10}, -1},     {{4, 10}, 0},       {{3, 5, 6}, 1},
          {{3, 5, 6}, 2},  {{3, 5, 6}, 0},    {{2, 1, 3}, 1},     {{1, 1}, -1},
          {{6, 2000}, 1},  {{3, 70, 40}, 1},  {{2, 33}, 1},       {{5, 1025}, -1}};
}

// ---- softmax / log_softmax --------------------------------------------------------------------

TEST_P(Loss, SoftmaxAndLogSoftmaxMatchNaiveLoopAlongEveryAxis) {
  std::uint64_t seed = 1;
  for (const auto& c : softmax_cases()) {
    for (DType dt : {DType::float32, DType::float64}) {
      const Tensor x = Tensor::randn(c.x, dev(), seed++, dt);
      const int ax = c.axis < 0 ? c.axis + c.x.rank() : c.axis;
      const std::vector<double> xv = x.to_vector<double>();
      const std::string what = c.x.str() + " axis " + std::to_string(c.axis) + " " + dtype_name(dt);
      const double tol = dt == DType::float32 ? kSameResultTolFloat : 1e-12;
      const Tensor y = softmax(x, c.axis), ly = log_softmax(x, c.axis);
      EXPECT_EQ(y.shape(), c.x);
      EXPECT_EQ(ly.dtype(), dt);
      expect_close(y.to_vector<double>(), naive_softmax(xv, c.x, ax, false), tol, "softmax " + what);
      expect_close(ly.to_vector<double>(), naive_softmax(xv, c.x, ax, true), tol,
                   "log_softmax " + what);
      expect_close(softmax(Var::param(x), c.axis).value().to_vector<double>(),
                   y.to_vector<double>(), 0.0, "Var softmax " + what);
    }
  }
}

TEST_P(Loss, SoftmaxIsStableForHugeAndInfiniteLogits) {
  const std::vector<double> base = {1.0, -2.0, 0.5, 3.0, 0.0, -1.0};
  std::vector<double> shifted = base;
  for (double& v : shifted) v += 1e5;
  const Tensor a = Tensor::from_vector<double>({2, 3}, base, dev());
  const Tensor b = Tensor::from_vector<double>({2, 3}, shifted, dev());
  expect_close(softmax(b).to_vector<double>(), softmax(a).to_vector<double>(), 1e-12, "softmax +1e5");
  expect_close(log_softmax(b).to_vector<double>(), log_softmax(a).to_vector<double>(), 1e-10,
               "log_softmax +1e5");
  // float32 logits of 1e30 and -inf: finite, exact results.
  const Tensor c = Tensor::from_vector<float>({1, 4}, {1e30f, -INFINITY, 1e30f, 0.0f}, dev());
  expect_close(softmax(c).to_vector<double>(), {0.5, 0.0, 0.5, 0.0}, 1e-7, "softmax 1e30/-inf");
  const Tensor d = Tensor::from_vector<float>({1, 3}, {-INFINITY, 0.0f, -INFINITY}, dev());
  expect_close(softmax(d).to_vector<double>(), {0.0, 1.0, 0.0}, 0.0, "softmax leading -inf");
  EXPECT_EQ(log_softmax(d).to_vector<double>()[1], 0.0);
  // +inf in a row wide enough for the four-at-a-time path: NaN at the +inf (inf - inf), 0 elsewhere,
  // exactly as in a short row, not NaN across the row (every path and pattern:
  // test_nonfinite_logits.cu).
  for (std::int64_t C : {3, 257}) {
    std::vector<float> row(static_cast<std::size_t>(C), 0.5f);
    row[1] = INFINITY;
    const auto y = softmax(Tensor::from_vector<float>({1, C}, row, dev())).to_vector<double>();
    for (std::int64_t k = 0; k < C; ++k) {
      if (k == 1)
        EXPECT_TRUE(std::isnan(y[1])) << "C " << C;
      else
        EXPECT_EQ(y[static_cast<std::size_t>(k)], 0.0) << "C " << C << " k " << k;
    }
  }
}

TEST_P(Loss, SoftmaxAndLogSoftmaxGradientsMatchFiniteDifferences) {
  std::uint64_t seed = 100;
  for (const auto& c : softmax_cases()) {
    if (c.x.numel() > 3000) continue;
    const Tensor x = Tensor::randn(c.x, dev(), seed++, DType::float64);
    const std::string what = c.x.str() + " axis " + std::to_string(c.axis);
    expect_grad_ok(check_gradients([&](const std::vector<Var>& v) { return softmax(v[0], c.axis); }, {x}),
                   "softmax " + what);
    expect_grad_ok(check_gradients([&](const std::vector<Var>& v) { return log_softmax(v[0], c.axis); }, {x}),
                   "log_softmax " + what);
  }
}

TEST_P(Loss, SoftmaxRejectsBadAxesAndDtypes) {
  const Tensor x = Tensor::randn({3, 4}, dev(), 5);
  try {
    (void)softmax(x, 2);
    ADD_FAILURE() << "softmax with axis 2 did not throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("softmax"), std::string::npos) << msg;
    EXPECT_NE(msg.find("axis 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[3, 4]"), std::string::npos) << msg;
  }
  EXPECT_THROW((void)log_softmax(Var::param(x), -3), Error);
  EXPECT_THROW((void)softmax(Tensor::zeros({3}, DType::uint8, dev())), Error);
  EXPECT_THROW((void)softmax(Tensor::scalar(1.0, DType::float32, dev())), Error);
  expect_close(sum(softmax(x), 1).to_vector<double>(), {1, 1, 1}, 1e-6, "rows sum to one");
}

// ---- cross_entropy ----------------------------------------------------------------------------

TEST_P(Loss, CrossEntropyMatchesNaiveLoop) {
  struct Case {
    std::int64_t N, C;
  };
  std::uint64_t seed = 200;
  for (const Case c : {Case{1, 1}, Case{1, 5}, Case{8, 10}, Case{33, 7}, Case{5, 1500}, Case{300, 3}}) {
    for (DType dt : {DType::float32, DType::float64}) {
      const Tensor x = Tensor::randn({c.N, c.C}, dev(), seed++, dt);
      const std::vector<int> lab = make_labels(c.N, c.C, seed++);
      const Tensor labels = Tensor::from_vector<int>({c.N}, lab, dev());
      const double want = naive_cross_entropy(x.to_vector<double>(), c.N, c.C, lab);
      const Tensor loss = cross_entropy(x, labels);
      EXPECT_EQ(loss.rank(), 0);
      EXPECT_EQ(loss.dtype(), dt);
      EXPECT_LE(relative_error(loss.item(), want), dt == DType::float32 ? kSameResultTolFloat : 1e-12)
          << "N=" << c.N << " C=" << c.C << " " << dtype_name(dt);
      // float64 and uint8 label tensors give the same loss.
      const std::vector<double> labd(lab.begin(), lab.end());
      EXPECT_EQ(cross_entropy(x, Tensor::from_vector<double>({c.N}, labd, dev())).item(), loss.item());
      if (c.C < 256) {
        const std::vector<std::uint8_t> lab8(lab.begin(), lab.end());
        EXPECT_EQ(cross_entropy(x, Tensor::from_vector<std::uint8_t>({c.N}, lab8, dev())).item(),
                  loss.item());
      }
    }
  }
}

TEST_P(Loss, CrossEntropyIsInvariantToShiftingLogitsBy1e5) {
  const std::int64_t N = 16, C = 10;
  const std::vector<int> lab = make_labels(N, C, 7);
  const Tensor labels = Tensor::from_vector<int>({N}, lab, dev());
  // Logits that are multiples of 1/64 in (-8, 8): x + 1e5 is exact even in float32.
  std::vector<double> x(static_cast<std::size_t>(N * C)), xs(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = std::round(random::normal(99, i) * 2.0 * 64.0) / 64.0;
    x[i] = std::fmax(-7.9, std::fmin(7.9, x[i]));
    xs[i] = x[i] + 1e5;
  }
  const double want = naive_cross_entropy(x, N, C, lab);
  for (DType dt : {DType::float64, DType::float32}) {
    const Tensor a = Tensor::from_vector<double>({N, C}, x, dev()).to(dt);
    const Tensor b = Tensor::from_vector<double>({N, C}, xs, dev()).to(dt);
    const double tol = dt == DType::float32 ? kSameResultTolFloat : 1e-12;
    const double la = cross_entropy(a, labels).item(), lb = cross_entropy(b, labels).item();
    EXPECT_TRUE(std::isfinite(lb)) << dtype_name(dt);
    EXPECT_LE(relative_error(la, want), tol) << dtype_name(dt);
    EXPECT_LE(relative_error(lb, want), tol) << dtype_name(dt);
    // The gradient is shift-invariant too.
    const Var va = Var::param(a), vb = Var::param(b);
    cross_entropy(va, labels).backward();
    cross_entropy(vb, labels).backward();
    expect_close(vb.grad().to_vector<double>(), va.grad().to_vector<double>(),
                 dt == DType::float32 ? 1e-6 : 1e-14, std::string("shifted gradient ") + dtype_name(dt));
  }
}

TEST_P(Loss, CrossEntropyGradientIsSoftmaxMinusOnehotOverN) {
  const std::int64_t N = 12, C = 9;
  const Tensor x = Tensor::randn({N, C}, dev(), 300, DType::float64);
  const std::vector<int> lab = make_labels(N, C, 301);
  const Var v = Var::param(x);
  cross_entropy(v, Tensor::from_vector<int>({N}, lab, dev())).backward();
  std::vector<double> want = naive_softmax(x.to_vector<double>(), Shape{N, C}, 1, false);
  for (std::int64_t i = 0; i < N; ++i) want[static_cast<std::size_t>(i * C + lab[static_cast<std::size_t>(i)])] -= 1.0;
  for (double& w : want) w /= static_cast<double>(N);
  expect_close(v.grad().to_vector<double>(), want, 1e-14, "(softmax - onehot) / N");
}

TEST_P(Loss, CrossEntropyGradientMatchesFiniteDifferences) {
  std::uint64_t seed = 400;
  for (const auto [N, C] : std::vector<std::pair<std::int64_t, std::int64_t>>{{1, 3}, {4, 5}, {7, 12}, {3, 40}}) {
    const Tensor x = Tensor::randn({N, C}, dev(), seed++, DType::float64);
    const Tensor labels = Tensor::from_vector<int>({N}, make_labels(N, C, seed++), dev());
    expect_grad_ok(check_gradients([&](const std::vector<Var>& v) { return cross_entropy(v[0], labels); }, {x}),
                   "cross_entropy N=" + std::to_string(N) + " C=" + std::to_string(C));
    // Composed with a scale, so the adjoint is not 1.
    expect_grad_ok(check_gradients([&](const std::vector<Var>& v) {
                     return sum(log_softmax(v[0]), 1);
                   }, {x}),
                   "sum(log_softmax) N=" + std::to_string(N));
  }
}

TEST_P(Loss, CrossEntropyRejectsInvalidLabelsAndTheNextOpWorks) {
  const Tensor x = Tensor::randn({3, 4}, dev(), 500);
  const auto expect_error = [&](const Tensor& labels, const std::string& needle) {
    try {
      (void)cross_entropy(Var::param(x), labels);
      ADD_FAILURE() << "no error for labels " << labels.str();
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("cross_entropy"), std::string::npos) << msg;
      EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    }
  };
  expect_error(Tensor::from_vector<int>({3}, {0, 4, 1}, dev()), "label 4");
  expect_error(Tensor::from_vector<int>({3}, {0, -1, 1}, dev()), "label -1");
  expect_error(Tensor::from_vector<float>({3}, {0.0f, 1.5f, 1.0f}, dev()), "label 1.5");
  expect_error(Tensor::from_vector<float>({3}, {0.0f, NAN, 1.0f}, dev()), "position 1");
  expect_error(Tensor::from_vector<int>({2}, {0, 1}, dev()), "[3, 4]");
  expect_error(Tensor::from_vector<int>({3, 1}, {0, 1, 2}, dev()), "[3, 1]");
  EXPECT_THROW((void)cross_entropy(Tensor::randn({3}, dev(), 1), Tensor::from_vector<int>({3}, {0, 0, 0}, dev())), Error);
  if (dev().is_cuda())
    EXPECT_THROW((void)cross_entropy(x, Tensor::from_vector<int>({3}, {0, 1, 2})), Error);
  // The next loss works.
  const Tensor ok = Tensor::from_vector<int>({3}, {0, 3, 1}, dev());
  EXPECT_TRUE(std::isfinite(cross_entropy(x, ok).item()));
}

// ---- mse --------------------------------------------------------------------------------------

TEST_P(Loss, MseMatchesNaiveLoopAndItsGradientsMatchFiniteDifferences) {
  std::uint64_t seed = 600;
  for (const Shape& s : {Shape{}, Shape{5}, Shape{4, 7}, Shape{3, 5, 2}, Shape{1000, 300}}) {
    for (DType dt : {DType::float32, DType::float64}) {
      const Tensor p = Tensor::randn(s, dev(), seed++, dt), t = Tensor::randn(s, dev(), seed++, dt);
      const std::vector<double> pv = p.to_vector<double>(), tv = t.to_vector<double>();
      double want = 0.0;
      for (std::size_t i = 0; i < pv.size(); ++i) want += (pv[i] - tv[i]) * (pv[i] - tv[i]);
      want /= static_cast<double>(pv.size());
      EXPECT_LE(relative_error(mse(p, t).item(), want), dt == DType::float32 ? kSameResultTolFloat : 1e-12)
          << s.str();
      EXPECT_EQ(mse(p, t).rank(), 0);
    }
    if (s.numel() > 1000) continue;
    const Tensor p = Tensor::randn(s, dev(), seed++, DType::float64);
    const Tensor t = Tensor::randn(s, dev(), seed++, DType::float64);
    expect_grad_ok(check_gradients([](const std::vector<Var>& v) { return mse(v[0], v[1]); }, {p, t}),
                   "mse " + s.str());
    // Only the prediction requires a gradient.
    expect_grad_ok(check_gradients([&](const std::vector<Var>& v) { return mse(v[0], t); }, {p}),
                   "mse constant target " + s.str());
  }
}

TEST_P(Loss, MseRejectsMismatchedShapesDevicesAndDtypes) {
  const Tensor p = Tensor::randn({4, 1}, dev(), 1), t = Tensor::randn({4}, dev(), 2);
  try {
    (void)mse(p, t);
    ADD_FAILURE() << "mse of [4, 1] and [4] did not throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("mse"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[4, 1]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[4]"), std::string::npos) << msg;
  }
  EXPECT_THROW((void)mse(Var::param(p), Var(p.to(DType::float64))), Error);
  EXPECT_NEAR(mse(p, p).item(), 0.0, 0.0);
}

TEST_P(Loss, NoNodesAreRecordedWithoutRequiresGradOrUnderNoGradGuard) {
  const Tensor x = Tensor::randn({4, 5}, dev(), 900);
  const Tensor labels = Tensor::from_vector<int>({4}, {0, 1, 2, 3}, dev());
  const auto before = autograd_stats().nodes_created;
  (void)softmax(Var(x));
  (void)log_softmax(Var(x), 0);
  (void)cross_entropy(Var(x), labels);
  (void)mse(Var(x), Var(x));
  {
    NoGradGuard guard;
    EXPECT_FALSE(cross_entropy(Var::param(x), labels).requires_grad());
    EXPECT_FALSE(mse(Var::param(x), x).requires_grad());
  }
  EXPECT_EQ(autograd_stats().nodes_created, before);
  EXPECT_TRUE(mse(x, Var::param(x)).requires_grad());
}

}  // namespace

// ---- GPU equals CPU ----------------------------------------------------------------------------

TEST(LossCuda, GpuLossesEqualCpuOnSeededInputs) {
  DUALCAST_REQUIRE_CUDA();
  const Device gpu = Device::cuda(0), cpu = Device::cpu();
  std::uint64_t seed = 1000;
  for (const auto& c : softmax_cases()) {
    const Tensor xc = Tensor::randn(c.x, cpu, seed), xg = Tensor::randn(c.x, gpu, seed);
    const Tensor gc = Tensor::randn(c.x, cpu, seed + 1), gg = Tensor::randn(c.x, gpu, seed + 1);
    seed += 2;
    const std::string what = c.x.str() + " axis " + std::to_string(c.axis);
    expect_close(softmax(xg, c.axis).to_vector<double>(), softmax(xc, c.axis).to_vector<double>(),
                 kSameResultTolFloat, "softmax " + what);
    expect_close(log_softmax(xg, c.axis).to_vector<double>(),
                 log_softmax(xc, c.axis).to_vector<double>(), kSameResultTolFloat,
                 "log_softmax " + what);
    for (bool log : {false, true}) {
      const Var vc = Var::param(xc), vg = Var::param(xg);
      (log ? log_softmax(vc, c.axis) : softmax(vc, c.axis)).backward(gc);
      (log ? log_softmax(vg, c.axis) : softmax(vg, c.axis)).backward(gg);
      expect_close(vg.grad().to_vector<double>(), vc.grad().to_vector<double>(),
                   kSameResultTolFloat, (log ? "log_softmax grad " : "softmax grad ") + what);
    }
  }
  for (const auto [N, C] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {1, 10}, {1000, 10}, {64, 5000}, {4096, 1000}, {100000, 3}}) {
    const Tensor xc = Tensor::randn({N, C}, cpu, seed), xg = Tensor::randn({N, C}, gpu, seed);
    const std::vector<int> lab = make_labels(N, C, seed + 1);
    seed += 2;
    const Var vc = Var::param(xc), vg = Var::param(xg);
    const Var lc = cross_entropy(vc, Tensor::from_vector<int>({N}, lab, cpu));
    const Var lg = cross_entropy(vg, Tensor::from_vector<int>({N}, lab, gpu));
    EXPECT_LE(relative_error(lg.item(), lc.item()), kSameResultTolFloat) << N << "x" << C;
    lc.backward();
    lg.backward();
    expect_close(vg.grad().to_vector<double>(), vc.grad().to_vector<double>(), kSameResultTolFloat,
                 "cross_entropy grad");
    const Tensor tc = Tensor::randn({N, C}, cpu, seed), tg = Tensor::randn({N, C}, gpu, seed);
    EXPECT_LE(relative_error(mse(xg, tg).item(), mse(xc, tc).item()), kSameResultTolFloat);
  }
}


/// Not a check: prints the time and effective bandwidth of softmax, cross_entropy and their
/// backward on typical shapes. Run with --gtest_also_run_disabled_tests.
TEST(LossCuda, DISABLED_ReportBandwidth) {
  DUALCAST_REQUIRE_CUDA();
  const Device gpu = Device::cuda(0);
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
  for (const auto [N, C] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {1000, 10}, {65536, 10}, {8192, 1000}, {4096, 32000}, {32, 1000000}}) {
    const Tensor x = Tensor::randn({N, C}, gpu, 1);
    const Tensor labels = Tensor::from_vector<int>({N}, make_labels(N, C, 2), gpu);
    const double bytes = static_cast<double>(x.nbytes());
    const double ts = time_it([&] { (void)softmax(x); });
    const double tc = time_it([&] { (void)cross_entropy(x, labels); });
    const double tcb = time_it([&] {
      const Var v = Var::param(x);
      cross_entropy(v, labels).backward();
    });
    const Tensor g = Tensor::randn({N, C}, gpu, 3);
    const double tsb = time_it([&] {
      const Var v = Var::param(x);
      softmax(v).backward(g);
    });
    std::printf("bench [%6lld, %7lld] softmax %8.1f us %6.0f GB/s | CE fwd %8.1f us | CE fwd+bwd %8.1f us"
                " | softmax fwd+bwd %8.1f us\n",
                static_cast<long long>(N), static_cast<long long>(C), ts * 1e6,
                2 * bytes / ts * 1e-9, tc * 1e6, tcb * 1e6, tsb * 1e6);
  }
  const Tensor xt = Tensor::randn({64, 512, 512}, gpu, 4);
  const double ta = time_it([&] { (void)softmax(xt, 1); });
  std::printf("bench [64, 512, 512] softmax axis 1: %8.1f us %6.0f GB/s\n", ta * 1e6,
              2.0 * static_cast<double>(xt.nbytes()) / ta * 1e-9);
}

INSTANTIATE_TEST_SUITE_P(Devices, Loss, ::testing::ValuesIn(testing::all_devices()),
                         [](const auto& info) { return std::string(testing::device_label(info.param)); });

}  // namespace dualcast
