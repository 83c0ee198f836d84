// test_math_edges.cu: the edges of dualcast/math.hpp's rules on numbers and duals: overflow and
// tiny arguments, tails, kinks and ties (subgradients), NaN against numbers, pow at zero and negative
// bases, mixed number/dual arguments of any arithmetic type, and unqualified calls after
// `using namespace dualcast;` (the rules themselves against finite differences: test_math.cu).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "dualcast/gradcheck.hpp"
#include "dualcast/math.hpp"
#include "dualcast/parallel.hpp"
#include "test_util.hpp"

using dualcast::Dual;
using dualcast::kGradTolDouble;
using dualcast::kGradTolFloat;
using dualcast::relative_error;

namespace {

double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

// ---- edge cases ----------------------------------------------------------------------------------

template <class T>
void check_sigmoid_softplus_extremes() {
  using D = Dual<T, 1>;
  for (const T x : {T(1e4), T(-1e4), T(1e3), T(-1e3)}) {
    SCOPED_TRACE(::testing::Message() << "x = " << x);
    const D s = dualcast::sigmoid(D::variable(x, 0));
    const D p = dualcast::softplus(D::variable(x, 0));
    EXPECT_TRUE(std::isfinite(s.val) && std::isfinite(s.d[0]));
    EXPECT_TRUE(std::isfinite(p.val) && std::isfinite(p.d[0]));
    EXPECT_EQ(s.val, x > 0 ? T(1) : T(0));
    EXPECT_EQ(dualcast::sigmoid(x), s.val);
    EXPECT_EQ(dualcast::softplus(x), p.val);
    EXPECT_EQ(p.val, x > 0 ? x : T(0));
    EXPECT_EQ(p.d[0], x > 0 ? T(1) : T(0));
    EXPECT_EQ(s.d[0], T(0));  // e^-1000 underflows: the exact result rounds to 0
  }
}

TEST(DualMathEdge, SigmoidAndSoftplusStayFiniteAndExactAtPlusMinus1e4ForFloatAndDouble) {
  check_sigmoid_softplus_extremes<float>();
  check_sigmoid_softplus_extremes<double>();
}

TEST(DualMathEdge, SigmoidSoftplusAndTanhDerivativesKeepRelativeAccuracyInTheTails) {
  // s * (1 - s) and 1 - tanh^2 would give exactly 0 in float here; the stable forms do not.
  for (const double x : {-30.0, -20.0, 12.0, 20.0, 30.0}) {
    SCOPED_TRACE(::testing::Message() << "x = " << x);
    const double ds = std::exp(-std::fabs(x)) / std::pow(1.0 + std::exp(-std::fabs(x)), 2);
    const double dt = 1.0 / (std::cosh(x) * std::cosh(x));
    using F = Dual<float, 1>;
    const float xf = static_cast<float>(x);
    EXPECT_NEAR(dualcast::sigmoid(F::variable(xf, 0)).d[0] / ds, 1.0, kGradTolFloat);
    EXPECT_NEAR(dualcast::tanh(F::variable(xf, 0)).d[0] / dt, 1.0, kGradTolFloat);
    EXPECT_NEAR(dualcast::softplus(F::variable(-xf * (x > 0 ? 1 : -1), 0)).d[0] /
                    sigmoid_ref(-std::fabs(x)),
                1.0, kGradTolFloat);
    using D = Dual<double, 1>;
    EXPECT_NEAR(dualcast::sigmoid(D::variable(x, 0)).d[0] / ds, 1.0, kGradTolDouble);
    EXPECT_NEAR(dualcast::tanh(D::variable(x, 0)).d[0] / dt, 1.0, kGradTolDouble);
  }
}

TEST(DualMathEdge, Expm1AndLog1pAreAccurateAtOneETenthNegative) {
  // At 1e-10, exp(x) - 1 and log(1 + x) would keep only ~6 significant digits in double.
  const double x = 1e-10;
  using D = Dual<double, 1>;
  const D e = dualcast::expm1(D::variable(x, 0));
  const D l = dualcast::log1p(D::variable(x, 0));
  EXPECT_NEAR(e.val / (x + x * x / 2), 1.0, 1e-15);
  EXPECT_NEAR(l.val / (x - x * x / 2), 1.0, 1e-15);
  EXPECT_NEAR(e.d[0], 1.0 + x, 1e-15);
  EXPECT_NEAR(l.d[0], 1.0 / (1.0 + x), 1e-15);
  using F = Dual<float, 1>;
  const F ef = dualcast::expm1(F::variable(1e-10f, 0));
  const F lf = dualcast::log1p(F::variable(1e-10f, 0));
  EXPECT_NEAR(ef.val / 1e-10f, 1.0, FLT_EPSILON);
  EXPECT_NEAR(lf.val / 1e-10f, 1.0, FLT_EPSILON);
  EXPECT_EQ(ef.d[0], 1.0f);
  EXPECT_EQ(lf.d[0], 1.0f);
}

TEST(DualMathEdge, AbsAndReluHaveZeroSubgradientAtZero) {
  using D = Dual<double, 2>;
  const D x{0.0, {1.0, -3.0}};
  const D a = dualcast::abs(x);
  const D r = dualcast::relu(x);
  EXPECT_EQ(a.val, 0.0);
  EXPECT_EQ(r.val, 0.0);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(a.d[k], 0.0);
    EXPECT_EQ(r.d[k], 0.0);
  }
  EXPECT_EQ(dualcast::abs(D{-2.0, {1.0, -3.0}}).d[1], 3.0);
  EXPECT_EQ(dualcast::relu(D{2.0, {1.0, -3.0}}).d[1], -3.0);
  EXPECT_EQ(dualcast::relu(-0.5), 0.0);
  EXPECT_EQ(dualcast::relu(0.5f), 0.5f);
}

TEST(DualMathEdge, MaxAndMinSplitPartialsEvenlyOnTiesOfValues) {
  using D = Dual<double, 3>;
  // equal values, different partials: comparisons see a tie, each side gets half
  const D a{1.5, {1.0, 0.0, 4.0}};
  const D b{1.5, {0.0, 1.0, -2.0}};
  ASSERT_TRUE(a == b);
  const D mx = dualcast::max(a, b), mn = dualcast::min(a, b);
  EXPECT_EQ(mx.val, 1.5);
  EXPECT_EQ(mn.val, 1.5);
  const double half[3] = {0.5, 0.5, 1.0};
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(mx.d[k], half[k]);
    EXPECT_EQ(mn.d[k], half[k]);
  }
  // a tie with a constant: the dual keeps half its partials
  const D m1 = dualcast::max(a, 1.5), m2 = dualcast::min(1.5f, a);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(m1.d[k], 0.5 * a.d[k]);
    EXPECT_EQ(m2.d[k], 0.5 * a.d[k]);
  }
  // max(x, x): halves add back to the whole
  const D mxx = dualcast::max(a, a);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(mxx.d[k], a.d[k]);
}

TEST(DualMathEdge, MaxAndMinLetANaNLoseToANumberLikeFmax) {
  using D = Dual<double, 1>;
  const D n = D::constant(std::nan(""));
  const D x = D::variable(2.0, 0);
  EXPECT_EQ(dualcast::max(n, x).val, 2.0);
  EXPECT_EQ(dualcast::max(x, n).d[0], 1.0);
  EXPECT_EQ(dualcast::min(n, x).val, 2.0);
  EXPECT_EQ(dualcast::min(x, n).d[0], 1.0);
  EXPECT_EQ(dualcast::max(std::nan(""), 2.0), 2.0);
}

TEST(DualMathEdge, ClampPassesTheGradientOnInclusiveBoundsAndTakesTheBoundsPartialsOutside) {
  using D = Dual<double, 3>;  // partials: x, lo, hi
  const D lo = D::variable(-1.0, 1), hi = D::variable(2.0, 2);
  const D at_lo = dualcast::clamp(D::variable(-1.0, 0), lo, hi);
  const D at_hi = dualcast::clamp(D::variable(2.0, 0), lo, hi);
  const D inside = dualcast::clamp(D::variable(0.5, 0), lo, hi);
  const D below = dualcast::clamp(D::variable(-3.0, 0), lo, hi);
  const D above = dualcast::clamp(D::variable(5.0, 0), lo, hi);
  EXPECT_EQ(at_lo.val, -1.0);
  EXPECT_EQ(at_hi.val, 2.0);
  EXPECT_EQ(below.val, -1.0);
  EXPECT_EQ(above.val, 2.0);
  EXPECT_EQ(inside.val, 0.5);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(at_lo.d[k], k == 0 ? 1.0 : 0.0) << k;
    EXPECT_EQ(at_hi.d[k], k == 0 ? 1.0 : 0.0) << k;
    EXPECT_EQ(inside.d[k], k == 0 ? 1.0 : 0.0) << k;
    EXPECT_EQ(below.d[k], k == 1 ? 1.0 : 0.0) << k;
    EXPECT_EQ(above.d[k], k == 2 ? 1.0 : 0.0) << k;
  }
  // constant bounds: the gradient passes at the bounds, 0 outside
  using D1 = Dual<float, 1>;
  EXPECT_EQ(dualcast::clamp(D1::variable(0.f, 0), 0, 1.0).d[0], 1.f);
  EXPECT_EQ(dualcast::clamp(D1::variable(1.f, 0), 0, 1.0).d[0], 1.f);
  EXPECT_EQ(dualcast::clamp(D1::variable(1.5f, 0), 0, 1.0).d[0], 0.f);
  EXPECT_EQ(dualcast::clamp(1.5f, 0, 1), 1.f);
  EXPECT_EQ(dualcast::clamp(-0.5, 0.f, 1), 0.0);
}

TEST(DualMathEdge, SqrtCbrtAndLogAtZeroGiveInfinitePartialsOnlyInTheSeededDirection) {
  using D = Dual<double, 3>;
  const D x{0.0, {1.0, 0.0, -2.0}};  // partial 1 absent: must stay 0, never inf * 0 = NaN
  const D s = dualcast::sqrt(x), c = dualcast::cbrt(x), l = dualcast::log(x);
  EXPECT_EQ(s.val, 0.0);
  EXPECT_EQ(c.val, 0.0);
  EXPECT_EQ(l.val, -INFINITY);
  for (const D& r : {s, c, l}) {
    EXPECT_EQ(r.d[0], INFINITY);
    EXPECT_EQ(r.d[1], 0.0);
    EXPECT_EQ(r.d[2], -INFINITY);
  }
  const D p = dualcast::pow(x, 0.5);
  EXPECT_EQ(p.d[0], INFINITY);
  EXPECT_EQ(p.d[1], 0.0);
}

TEST(DualMathEdge, PowAtZeroBaseWithIntegerExponentHasFinitePartials) {
  using D = Dual<double, 2>;
  const D zero = D::variable(0.0, 0);
  EXPECT_EQ(dualcast::pow(zero, 1).d[0], 1.0);
  EXPECT_EQ(dualcast::pow(zero, 2).d[0], 0.0);
  EXPECT_EQ(dualcast::pow(zero, 3.0).d[0], 0.0);
  const D p0 = dualcast::pow(zero, 0);
  EXPECT_EQ(p0.val, 1.0);
  EXPECT_EQ(p0.d[0], 0.0);
  // dual^dual with a constant exponent: the log(0) term never enters
  const D q = dualcast::pow(zero, D::constant(2.0));
  EXPECT_EQ(q.val, 0.0);
  EXPECT_EQ(q.d[0], 0.0);
  EXPECT_EQ(q.d[1], 0.0);
  // dual^dual with a varying exponent at base 0: d/dy 0^y = 0 (0^y is 0 for all y > 0)
  const D r = dualcast::pow(D::variable(0.0, 0), D::variable(2.0, 1));
  EXPECT_EQ(r.d[0], 0.0);
  EXPECT_EQ(r.d[1], 0.0);
  const D r1 = dualcast::pow(D::variable(0.0, 0), D::variable(1.0, 1));
  EXPECT_EQ(r1.d[0], 1.0);
  EXPECT_EQ(r1.d[1], 0.0);
  // number base 0, dual exponent
  EXPECT_EQ(dualcast::pow(0.0, D::variable(2.0, 1)).d[1], 0.0);
}

TEST(DualMathEdge, PowOfNegativeBaseWithConstantIntegerExponentIsFiniteAlsoAsDualToDual) {
  using D = Dual<double, 2>;
  const D x = D::variable(-2.0, 0);
  const D a = dualcast::pow(x, 3);
  EXPECT_EQ(a.val, -8.0);
  EXPECT_DOUBLE_EQ(a.d[0], 12.0);
  const D b = dualcast::pow(x, D::constant(3.0));  // log(-2) is NaN but y carries no partial
  EXPECT_EQ(b.val, -8.0);
  EXPECT_DOUBLE_EQ(b.d[0], 12.0);
  EXPECT_EQ(b.d[1], 0.0);
  // a varying exponent at a negative base: the partial y carries is NaN (not differentiable in y)
  const D c = dualcast::pow(x, D::variable(3.0, 1));
  EXPECT_DOUBLE_EQ(c.d[0], 12.0);
  EXPECT_TRUE(std::isnan(c.d[1]));
}

TEST(DualMathEdge, HypotAtTheOriginHasZeroPartials) {
  using D = Dual<double, 2>;
  const D h = dualcast::hypot(D::variable(0.0, 0), D::variable(0.0, 1));
  EXPECT_EQ(h.val, 0.0);
  EXPECT_EQ(h.d[0], 0.0);
  EXPECT_EQ(h.d[1], 0.0);
  EXPECT_EQ(dualcast::hypot(D::variable(0.0, 0), 0).d[0], 0.0);
}

TEST(DualMathEdge, MaxOfDualsWithEqualValuesButDifferentPartialsIsATieNotDecidedByPartials) {
  using F = Dual<float, 2>;
  const F a{3.f, {1.f, 0.f}};
  const F b{3.f, {0.f, 100.f}};
  EXPECT_FALSE(a < b);
  EXPECT_FALSE(b < a);
  const F m = dualcast::max(a, b);
  EXPECT_EQ(m.d[0], 0.5f);
  EXPECT_EQ(m.d[1], 50.f);
}

// ---- mixed arguments and unqualified calls -------------------------------------------------------

TEST(DualMathMixed, NumberAndDualArgumentsOfAnyArithmeticTypeCombine) {
  using F = Dual<float, 4>;
  const F x = F::variable(0.5f, 2);
  static_assert(std::is_same_v<decltype(dualcast::max(x, 1.0)), F>);
  static_assert(std::is_same_v<decltype(dualcast::min(0, x)), F>);
  static_assert(std::is_same_v<decltype(dualcast::clamp(x, 0, 1.0f)), F>);
  static_assert(std::is_same_v<decltype(dualcast::clamp(0.25, x, 1)), F>);
  static_assert(std::is_same_v<decltype(dualcast::hypot(x, 2)), F>);
  static_assert(std::is_same_v<decltype(dualcast::hypot(2.0, x)), F>);
  static_assert(std::is_same_v<decltype(dualcast::fma(x, 2, 1.0)), F>);
  static_assert(std::is_same_v<decltype(dualcast::fma(2, x, x)), F>);
  static_assert(std::is_same_v<decltype(dualcast::select(true, x, 1)), F>);
  static_assert(std::is_same_v<decltype(dualcast::select(true, 0.5, x)), F>);
  static_assert(std::is_same_v<decltype(dualcast::pow(x, 2)), F>);
  static_assert(std::is_same_v<decltype(dualcast::pow(2.0, x)), F>);
  static_assert(std::is_same_v<decltype(dualcast::max(1, 2.5f)), float>);
  static_assert(std::is_same_v<decltype(dualcast::select(true, 1, 2.0)), double>);
  EXPECT_EQ(dualcast::max(x, 1.0).val, 1.f);
  EXPECT_EQ(dualcast::max(x, 1.0).d[2], 0.f);
  EXPECT_EQ(dualcast::min(0, x).val, 0.f);
  EXPECT_EQ(dualcast::max(0, x).d[2], 1.f);
  EXPECT_EQ(dualcast::min(1.0, x).d[2], 1.f);
  EXPECT_FLOAT_EQ(dualcast::hypot(x, 2).d[2], 0.5f / std::hypot(0.5f, 2.f));
  EXPECT_FLOAT_EQ(dualcast::fma(x, 2, 1.0).val, 2.f);
  EXPECT_FLOAT_EQ(dualcast::fma(x, 2, 1.0).d[2], 2.f);
  EXPECT_FLOAT_EQ(dualcast::fma(2, x, x).d[2], 3.f);
  EXPECT_EQ(dualcast::select(false, x, 1).val, 1.f);
  EXPECT_EQ(dualcast::select(false, x, 1).d[2], 0.f);
  EXPECT_EQ(dualcast::select(false, 0.5, x).d[2], 1.f);
  EXPECT_FLOAT_EQ(dualcast::pow(x, 2).d[2], 1.f);
  EXPECT_FLOAT_EQ(dualcast::pow(2.0, x).d[2], std::pow(2.f, 0.5f) * std::log(2.f));
  // the HM-LSTM hard sigmoid, one expression for numbers and duals
  const auto hard = [](auto v) { return dualcast::max(0, dualcast::min(1, (v * 2 + 1) / 2)); };
  EXPECT_EQ(hard(0.25f), 0.75f);
  EXPECT_EQ(hard(F::variable(0.25f, 0)).d[0], 1.f);
  EXPECT_EQ(hard(F::variable(3.f, 0)).d[0], 0.f);
}

namespace unqualified {
// Calls written as user code writes them: `using namespace dualcast;` then unqualified names. For
// numbers the C/C++ library's (or CUDA's) non-template overloads win where they exist, our templates
// elsewhere; no call is ambiguous.
template <class T>
void check_number_calls(T x, T y) {
  using namespace dualcast;
  constexpr bool f = std::is_same_v<T, float>;
  EXPECT_EQ(exp(x), f ? ::expf(x) : ::exp(x));
  EXPECT_EQ(expm1(x), f ? ::expm1f(x) : ::expm1(x));
  EXPECT_EQ(log(x), f ? ::logf(x) : ::log(x));
  EXPECT_EQ(log1p(x), f ? ::log1pf(x) : ::log1p(x));
  EXPECT_EQ(sqrt(x), f ? ::sqrtf(x) : ::sqrt(x));
  EXPECT_EQ(cbrt(x), f ? ::cbrtf(x) : ::cbrt(x));
  EXPECT_EQ(pow(x, y), f ? ::powf(x, y) : ::pow(x, y));
  EXPECT_EQ(sin(x), f ? ::sinf(x) : ::sin(x));
  EXPECT_EQ(cos(x), f ? ::cosf(x) : ::cos(x));
  EXPECT_EQ(tan(x), f ? ::tanf(x) : ::tan(x));
  EXPECT_EQ(tanh(x), f ? ::tanhf(x) : ::tanh(x));
  EXPECT_EQ(erf(x), f ? ::erff(x) : ::erf(x));
  EXPECT_EQ(abs(-x), f ? ::fabsf(x) : ::fabs(x));
  EXPECT_EQ(hypot(x, y), f ? ::hypotf(x, y) : ::hypot(x, y));
  EXPECT_EQ(fma(x, y, x), f ? ::fmaf(x, y, x) : ::fma(x, y, x));
  EXPECT_EQ(max(x, y), f ? ::fmaxf(x, y) : ::fmax(x, y));
  EXPECT_EQ(min(x, y), f ? ::fminf(x, y) : ::fmin(x, y));
  static_assert(std::is_same_v<decltype(exp(x)), T>);
  static_assert(std::is_same_v<decltype(tanh(x)), T>);
  static_assert(std::is_same_v<decltype(max(x, y)), T>);
  // dualcast-only names on numbers
  EXPECT_EQ(sigmoid(x), T(1) / (T(1) + ::dualcast::exp(-x)));
  EXPECT_EQ(softplus(x), x + ::dualcast::log1p(::dualcast::exp(-x)));
  EXPECT_EQ(relu(-x), T(0));
  EXPECT_EQ(clamp(x, T(0), y), x < y ? x : y);
  EXPECT_EQ(select(x > y, x, y), x > y ? x : y);
  // and the same names on duals
  using D = Dual<T, 2>;
  const D dx = D::variable(x, 0);
  EXPECT_EQ(tanh(dx).val, tanh(x));
  EXPECT_EQ(pow(dx, D::variable(y, 1)).val, pow(x, y));
  EXPECT_EQ(max(dx, 0).val, x);
  EXPECT_EQ(hypot(dx, y).val, hypot(x, y));
}
}  // namespace unqualified

TEST(DualMathMixed, UnqualifiedCallsAfterUsingNamespaceCompileAndGiveTheCLibraryValues) {
  // volatile: keep the compiler from folding one side at compile time and not the other
  volatile float xf = 0.8125f, yf = 1.375f;
  volatile double xd = 0.8125, yd = 1.375;
  unqualified::check_number_calls<float>(xf, yf);
  unqualified::check_number_calls<double>(xd, yd);
}
