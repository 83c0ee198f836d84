// test_pool.cu: max_pool2d, avg_pool2d, adaptive_avg_pool2d and flatten. Values against naive loops
// (odd sizes, strides, padding, both average divisors, windows that do not divide the input);
// gradients against finite differences in float64; max pooling's ties (the first maximum in scan
// order gets the gradient, overlapping windows add) and NaN; GPU equal to CPU; bad input named in
// clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "dualcast/gradcheck.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "dualcast/ops/pool.hpp"
#include "nn_reference.hpp"
#include "test_util.hpp"

using namespace dualcast;
using dualcast::testing::expect_close;
using dualcast::testing::expect_error;
using dualcast::testing::NaivePool;

namespace {

struct PoolCase {
  const char* name;
  Shape x;
  Size2 k, s, p;
};

std::vector<PoolCase> pool_cases() {
  return {
      {"2x2", {2, 3, 6, 6}, 2, 2, 0},
      {"3x3_stride2_pad1", {2, 2, 7, 9}, 3, 2, 1},
      {"overlapping_3x3_stride1", {1, 2, 5, 6}, 3, 1, 1},
      {"asymmetric", {2, 1, 9, 5}, {3, 2}, {2, 1}, {1, 0}},
      {"odd_stride3", {1, 3, 11, 10}, 4, 3, 2},
      {"whole_plane", {3, 2, 4, 5}, {4, 5}, 1, 0},
  };
}

class Pool : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override { DUALCAST_SKIP_IF_UNAVAILABLE(GetParam()); }
};

TEST_P(Pool, MatchesNaiveLoops) {
  const Device dev = GetParam();
  std::uint64_t seed = 1;
  for (const auto& c : pool_cases()) {
    for (const DType dt : {DType::float64, DType::float32}) {
      const Tensor x = Tensor::randn(c.x, dev, ++seed, dt);
      const auto xv = x.to_vector<double>();
      const double tol = dt == DType::float64 ? 1e-14 : 1e-6;
      const std::string what = std::string(c.name) + " " + dtype_name(dt);
      expect_close(max_pool2d(x, c.k, c.s, c.p).to_vector<double>(),
                   dualcast::testing::naive_pool(xv, c.x, NaivePool::max, c.k, c.s, c.p), tol, what + " max");
      expect_close(avg_pool2d(x, c.k, c.s, c.p).to_vector<double>(),
                   dualcast::testing::naive_pool(xv, c.x, NaivePool::avg, c.k, c.s, c.p), tol, what + " avg");
      expect_close(avg_pool2d(x, c.k, c.s, c.p, false).to_vector<double>(),
                   dualcast::testing::naive_pool(xv, c.x, NaivePool::avg_exclude_pad, c.k, c.s, c.p), tol,
                   what + " avg without padding");
    }
  }
}

TEST_P(Pool, AdaptiveAverageMatchesPyTorchWindows) {
  const Device dev = GetParam();
  const Shape xs{2, 3, 7, 10};
  const Tensor x = Tensor::randn(xs, dev, 5, DType::float64);
  for (const Size2 out : {Size2(1), Size2(3), Size2(7, 10), Size2(4, 6), Size2(5, 3), Size2(9, 13)}) {
    const Tensor y = adaptive_avg_pool2d(x, out);
    ASSERT_EQ(y.shape(), (Shape{2, 3, out.h, out.w}));
    expect_close(y.to_vector<double>(), dualcast::testing::naive_adaptive_avg(x.to_vector<double>(), xs, out),
                 1e-14, "adaptive " + out.str());
  }
}

struct MaxOf {
  PoolCase c;
  Var operator()(const std::vector<Var>& v) const { return max_pool2d(v[0], c.k, c.s, c.p); }
};
struct AvgOf {
  PoolCase c;
  bool include_pad;
  Var operator()(const std::vector<Var>& v) const { return avg_pool2d(v[0], c.k, c.s, c.p, include_pad); }
};
struct AdaptiveOf {
  Size2 out;
  Var operator()(const std::vector<Var>& v) const { return adaptive_avg_pool2d(v[0], out); }
};
struct FlattenOf {
  Var operator()(const std::vector<Var>& v) const { return flatten(v[0]) * flatten(v[0]); }
};

TEST_P(Pool, GradientsMatchFiniteDifferences) {
  const Device dev = GetParam();
  std::uint64_t seed = 50;
  for (const auto& c : pool_cases()) {
    // Distinct values (no ties within 1e-3): a finite-difference step never changes the maximum.
    const std::int64_t n = c.x.numel();
    std::vector<double> v(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i)
      v[static_cast<std::size_t>(i)] = std::fmod(static_cast<double>(i) * 0.6180339887 * 37.0, 5.0) - 2.5 +
                                       1e-3 * static_cast<double>(i % 7);
    const Tensor x = Tensor::from_vector(c.x, v, dev);
    for (const auto& [what, r] :
         {std::pair<const char*, GradCheckResult>{"max", check_gradients(MaxOf{c}, {x})},
          {"avg", check_gradients(AvgOf{c, true}, {Tensor::randn(c.x, dev, ++seed, DType::float64)})},
          {"avg exclude pad", check_gradients(AvgOf{c, false}, {Tensor::randn(c.x, dev, ++seed, DType::float64)})}})
      EXPECT_TRUE(r.ok) << c.name << " " << what << ": " << r.message;
  }
  for (const Size2 out : {Size2(1), Size2(3, 4), Size2(5, 3)}) {
    const GradCheckResult r = check_gradients(AdaptiveOf{out}, {Tensor::randn({2, 2, 7, 10}, dev, ++seed)});
    EXPECT_TRUE(r.ok) << "adaptive " << out.str() << ": " << r.message;
  }
  const GradCheckResult r = check_gradients(FlattenOf{}, {Tensor::randn({2, 3, 2, 2}, dev, ++seed)});
  EXPECT_TRUE(r.ok) << "flatten: " << r.message;
}

TEST_P(Pool, MaxTiesSendTheGradientToTheFirstMaximumInScanOrder) {
  const Device dev = GetParam();
  // Plane 0: all equal. 2x2 windows, stride 2: each window's top-left element gets its adjoint.
  // Plane 1: 3x3 windows with stride 1 over a constant plane overlap; every window picks its own
  // top-left element, so interior elements that start a window get exactly one adjoint each.
  const Tensor x = Tensor::full({1, 1, 4, 4}, 1.5, DType::float64, dev);
  Var xv = Var::param(x);
  max_pool2d(xv, 2).backward(Tensor::ones({1, 1, 2, 2}, DType::float64, dev));
  const std::vector<double> want{1, 0, 1, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0};
  expect_close(xv.grad().to_vector<double>(), want, 0.0, "2x2 ties");

  Var xo = Var::param(x);
  max_pool2d(xo, 3, 1, 0).backward(Tensor::from_vector<double>({1, 1, 2, 2}, {1, 2, 3, 4}, dev));
  const std::vector<double> want_o{1, 2, 0, 0, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  expect_close(xo.grad().to_vector<double>(), want_o, 0.0, "overlapping ties");

  // Two windows picking the same element add their adjoints: the maximum 9 at (1, 1) is in all four
  // 3x3 windows (stride 1) of a 4x4 plane.
  std::vector<double> v(16, 0.0);
  v[5] = 9;
  Var xs = Var::param(Tensor::from_vector<double>({1, 1, 4, 4}, v, dev));
  max_pool2d(xs, 3, 1, 0).backward(Tensor::from_vector<double>({1, 1, 2, 2}, {1, 2, 3, 4}, dev));
  EXPECT_EQ(xs.grad().to_vector<double>()[5], 10.0);
}

TEST_P(Pool, MaxPoolPropagatesNaN) {
  const Device dev = GetParam();
  std::vector<double> v{1, 2, 3, 4};
  v[2] = std::numeric_limits<double>::quiet_NaN();
  const Tensor y = max_pool2d(Tensor::from_vector<double>({1, 1, 2, 2}, v, dev), 2);
  EXPECT_TRUE(std::isnan(y.to_vector<double>()[0]));
}

TEST_P(Pool, GpuEqualsCpu) {
  const Device dev = GetParam();
  if (dev.is_cpu()) GTEST_SKIP() << "compares a CUDA device with the CPU";
  std::uint64_t seed = 90;
  for (const auto& c : pool_cases()) {
    const Tensor x = Tensor::randn(c.x, Device::cpu(), ++seed);
    auto run = [&](Device d, int which) {
      Var xv = Var::param(x.to(d));
      Var y = which == 0 ? max_pool2d(xv, c.k, c.s, c.p)
              : which == 1 ? avg_pool2d(xv, c.k, c.s, c.p)
                           : adaptive_avg_pool2d(xv, {3, 2});
      y.backward(Tensor::randn(y.shape(), d, 7));
      return std::make_pair(y.value().to(Device::cpu()), xv.grad().to(Device::cpu()));
    };
    for (int which = 0; which < 3; ++which) {
      const auto [yc, gc] = run(Device::cpu(), which);
      const auto [yg, gg] = run(dev, which);
      expect_close(yg, yc, 1e-6, std::string(c.name) + " value " + std::to_string(which));
      expect_close(gg, gc, 1e-6, std::string(c.name) + " gradient " + std::to_string(which));
    }
  }
}

TEST_P(Pool, BadInputIsAClearError) {
  const Device dev = GetParam();
  const Tensor x = Tensor::randn({2, 3, 5, 5}, dev, 1);
  expect_error([&] { (void)max_pool2d(Tensor::randn({3, 5, 5}, dev, 1), 2, 2); },
               {"max_pool2d", "4-D", "[3, 5, 5]"}, "3-D");
  expect_error([&] { (void)avg_pool2d(x, 2, 0); }, {"avg_pool2d", "stride (0, 0)", "[2, 3, 5, 5]"}, "stride 0");
  expect_error([&] { (void)max_pool2d(x, 2, -1); }, {"max_pool2d", "stride (-1, -1)"}, "negative stride");
  expect_error([&] { (void)max_pool2d(x, 0, 1); }, {"max_pool2d", "kernel (0, 0)"}, "kernel 0");
  expect_error([&] { (void)max_pool2d(x, 2, 1, 2); }, {"max_pool2d", "padding (2, 2)", "half"}, "padding");
  expect_error([&] { (void)avg_pool2d(x, 6, 1); }, {"avg_pool2d", "larger than the padded input", "5x5"},
               "kernel too large");
  expect_error([&] { (void)adaptive_avg_pool2d(x, {0, 2}); }, {"adaptive_avg_pool2d", "(0, 2)"}, "size 0");
  expect_error([&] { (void)flatten(x, 3, 1); }, {"flatten", "start_dim 3"}, "flatten order");
  EXPECT_EQ(flatten(x).shape(), (Shape{2, 75}));
  EXPECT_EQ(flatten(x, 0, 1).shape(), (Shape{6, 5, 5}));
  EXPECT_EQ(max_pool2d(x, 2).shape(), (Shape{2, 3, 2, 2}));
}

INSTANTIATE_TEST_SUITE_P(Devices, Pool, ::testing::ValuesIn(dualcast::testing::all_devices()),
                         [](const ::testing::TestParamInfo<Device>& info) {
                           return std::string(dualcast::testing::device_label(info.param));
                         });

}  // namespace
