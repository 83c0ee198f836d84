// test_gelu.cu: gelu, the exact (erf) form, as a math.hpp function (numbers and duals) and as a tape
// op. Values against x Phi(x) in long double, with full relative accuracy in the left tail; partials
// against central differences and the closed form Phi(x) + x phi(x); the same function inside a
// broadcast functor (mixed mode) and on the tape (reverse mode) giving the same gradients, checked
// against finite differences in double on every device; a kernel on the GPU equal to the host.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "dualcast/broadcast.hpp"
#include "dualcast/gradcheck.hpp"
#include "dualcast/math.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "dualcast/ops/reduce.hpp"
#include "test_util.hpp"

namespace dualcast {
namespace {

long double gelu_ref(long double x) { return 0.5L * x * std::erfc(-x / std::sqrt(2.0L)); }
double dgelu_ref(double x) {
  return 0.5 * std::erfc(-x / std::sqrt(2.0)) + x * std::exp(-0.5 * x * x) * 0.398942280401432677939946059934381868;
}

TEST(GeluMath, ValuesMatchXTimesTheNormalCdfIncludingTheLeftTail) {
  for (double x : {-30.0, -12.0, -7.5, -3.0, -1.0, -1e-3, 0.0, 1e-3, 0.5, 1.0, 2.5, 8.0, 40.0}) {
    const double want = static_cast<double>(gelu_ref(x));
    // Tolerances: rounding x / sqrt(2) is amplified by 2 z^2 in erfc's relative error at z = -x / sqrt(2).
    EXPECT_LE(std::fabs(gelu(x) - want), 1e-12 * std::fabs(want) + 1e-300) << "x = " << x;
    const float xf = static_cast<float>(x);
    const double wantf = static_cast<double>(gelu_ref(xf));
    EXPECT_LE(std::fabs(gelu(xf) - wantf), 1e-4 * std::fabs(wantf) + 1e-38) << "float x = " << x;
  }
  // 0.5 x (1 + erf(x / sqrt 2)) would give exactly 0 here in float.
  EXPECT_LT(gelu(-7.0f), 0.0f);
}

TEST(GeluMath, PartialsMatchFiniteDifferencesAndClosedForm) {
  for (double x : {-9.0, -3.3, -1.0, -0.2, 0.0, 0.4, 1.7, 6.0}) {
    const auto y = gelu(Dual<double, 1>::variable(x, 0));
    EXPECT_DOUBLE_EQ(y.val, gelu(x));
    const double fd = central_difference([](double t) { return gelu(t); }, x);
    EXPECT_LE(relative_error(y.d[0], fd), kGradTolDouble) << "x = " << x;
    EXPECT_LE(relative_error(y.d[0], dgelu_ref(x)), 1e-14) << "x = " << x;
    const auto y3 = gelu(Dual<double, 3>{x, {1.0, -2.0, 0.0}});
    EXPECT_DOUBLE_EQ(y3.d[1], -2.0 * y.d[0]);
    EXPECT_EQ(y3.d[2], 0.0);
    const auto yf = gelu(Dual<float, 1>::variable(static_cast<float>(x), 0));
    EXPECT_LE(relative_error(yf.d[0], dgelu_ref(static_cast<float>(x))), kGradTolFloat) << "x = " << x;
  }
  // Far tails: derivative exactly 0 on the left and 1 on the right, never NaN.
  EXPECT_EQ(gelu(Dual<double, 1>::variable(-60.0, 0)).d[0], 0.0);
  EXPECT_EQ(gelu(Dual<double, 1>::variable(60.0, 0)).d[0], 1.0);
}

/// gelu(x + b) * s in one fused broadcast: gelu is an ordinary math function inside a functor.
struct GeluBiasScale {
  DUALCAST_HD auto operator()(auto x, auto b, auto s) const { return gelu(x + b) * s; }
};

class Gelu : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override { DUALCAST_SKIP_IF_UNAVAILABLE(GetParam()); }
  Device dev() const { return GetParam(); }
};

TEST_P(Gelu, TapeOpGradientsMatchFiniteDifferences) {
  const Tensor x = Tensor::randn({5, 7}, dev(), 1, DType::float64) * 3.0;
  const GradCheckResult r = check_gradients([](const std::vector<Var>& v) { return gelu(v[0]); }, {x});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST_P(Gelu, InsideABroadcastFunctorMixedModeEqualsReverseModeAndFiniteDifferences) {
  const Tensor x = Tensor::randn({6, 9}, dev(), 2, DType::float64) * 2.0;
  const Tensor b = Tensor::randn({9}, dev(), 3, DType::float64);
  const Tensor s = Tensor::randn({6, 1}, dev(), 4, DType::float64);
  const GradCheckResult r = check_gradients(
      [](const std::vector<Var>& v) { return broadcast(GeluBiasScale{}, v[0], v[1], v[2]); }, {x, b, s});
  EXPECT_TRUE(r.ok) << r.message;
  Var xm = Var::param(x), bm = Var::param(b), xr = Var::param(x), br = Var::param(b);
  const Var mixed = sum(broadcast(GeluBiasScale{}, xm, bm, s));
  const Var reverse = sum(gelu(xr + br) * Var(s));
  mixed.backward();
  reverse.backward();
  EXPECT_LE(relative_error(mixed.item(), reverse.item()), 1e-14);
  const auto gm = xm.grad().to_vector<double>(), gr = xr.grad().to_vector<double>();
  for (std::size_t i = 0; i < gm.size(); ++i) EXPECT_LE(relative_error(gm[i], gr[i]), 1e-14);
  const auto bgm = bm.grad().to_vector<double>(), bgr = br.grad().to_vector<double>();
  for (std::size_t i = 0; i < bgm.size(); ++i) EXPECT_LE(relative_error(bgm[i], bgr[i]), 1e-13);
}

TEST_P(Gelu, TensorFormMatchesTheMathFunction) {
  const Tensor x = Tensor::randn({1000}, dev(), 5) * 4.0;
  const auto got = gelu(x).to_vector<float>(), xv = x.to_vector<float>();
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_LE(relative_error(got[i], gelu(xv[i])), kSameResultTolFloat) << "x = " << xv[i];
}

INSTANTIATE_TEST_SUITE_P(Devices, Gelu, ::testing::ValuesIn(testing::all_devices()),
                         [](const auto& info) { return testing::device_label(info.param); });

}  // namespace
}  // namespace dualcast
