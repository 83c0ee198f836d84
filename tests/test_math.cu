// test_math.cu: the functions of dualcast/math.hpp on numbers and duals: every function's partials
// against central finite differences and against its closed form at random points inside its domain,
// float and double, seeding with N = 1, 4 and 10 partials, dual^dual pow, and the same functions
// inside a CUDA kernel against the host (every function of ops/elementwise.hpp's lists among them;
// device tests are in the `#if defined(__CUDACC__)` block and skip without a GPU). Edge cases, mixed
// arguments and unqualified calls: test_math_edges.cu.
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
#include "dualcast/ops/elementwise.hpp"
#include "dualcast/parallel.hpp"
#include "test_util.hpp"

using dualcast::Dual;
using dualcast::kGradTolDouble;
using dualcast::kGradTolFloat;
using dualcast::relative_error;

namespace {

constexpr double kPi = 3.14159265358979323846;

// n random points in [lo, hi], none within `gap` of 0 or of `kink` (tests never sit on zeros or on a
// function's kink, where finite differences straddle two branches).
std::vector<double> sample(double lo, double hi, unsigned seed, int n = 5, double kink = 0.0,
                           double gap = 0.05) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> xs;
  while (static_cast<int>(xs.size()) < n) {
    const double x = dist(gen);
    if (std::fabs(x) >= gap && std::fabs(x - kink) >= gap) xs.push_back(x);
  }
  return xs;
}

// Checks a unary rule f at random points of [lo, hi]:
//  - Dual<double, 1>: value equals the number version; partial matches the central difference of
//    the number version and the closed form df;
//  - Dual<double, 4> seeded with a direction u: every partial k is df * u[k] (chain rule per lane);
//  - Dual<double, 10> seeded with unit vector 7: partial 7 is df, the other nine are exactly 0;
//  - Dual<float, 1>: value and partial match the double references to float tolerance.
// f is a generic callable (numbers and duals), df the closed-form derivative in double.
template <class F, class DF>
void check_unary(F f, DF df, double lo, double hi, unsigned seed, double kink = 0.0) {
  for (const double x : sample(lo, hi, seed, 5, kink)) {
    SCOPED_TRACE(::testing::Message() << "x = " << x);
    const double want = df(x);

    const auto y1 = f(Dual<double, 1>::variable(x, 0));
    static_assert(std::is_same_v<decltype(y1), const Dual<double, 1>>);
    EXPECT_DOUBLE_EQ(y1.val, f(x));
    const double fd = dualcast::central_difference([&](double t) { return f(t); }, x);
    EXPECT_LE(relative_error(y1.d[0], fd), kGradTolDouble) << y1.d[0] << " vs difference " << fd;
    EXPECT_LE(relative_error(y1.d[0], want), kGradTolDouble) << y1.d[0] << " vs closed " << want;

    const double u[4] = {0.5, -1.25, 2.0, 0.75};
    const auto y4 = f(Dual<double, 4>{x, {u[0], u[1], u[2], u[3]}});
    EXPECT_DOUBLE_EQ(y4.val, y1.val);
    for (int k = 0; k < 4; ++k) EXPECT_LE(relative_error(y4.d[k], want * u[k]), kGradTolDouble);

    const auto y10 = f(Dual<double, 10>::variable(x, 7));
    EXPECT_DOUBLE_EQ(y10.val, y1.val);
    for (int k = 0; k < 10; ++k) {
      if (k == 7) {
        EXPECT_LE(relative_error(y10.d[k], want), kGradTolDouble);
      } else {
        EXPECT_EQ(y10.d[k], 0.0) << "partial " << k;
      }
    }

    const float xf = static_cast<float>(x);
    const auto yf = f(Dual<float, 1>::variable(xf, 0));
    static_assert(std::is_same_v<decltype(yf), const Dual<float, 1>>);
    EXPECT_FLOAT_EQ(yf.val, static_cast<float>(f(xf)));
    EXPECT_LE(relative_error(yf.val, f(static_cast<double>(xf))), kGradTolFloat);
    EXPECT_LE(relative_error(yf.d[0], df(static_cast<double>(xf))), kGradTolFloat);
  }
}

// Checks a binary rule f(a, b) at the given points:
//  - Dual<double, 2> with a = e_0, b = e_1: both partials against differences and closed forms;
//  - one dual, one number (either order): the dual's partial alone;
//  - Dual<double, 4> (a = e_3, b = e_0) and Dual<double, 10> (a = e_9, b = e_4): the whole row;
//  - Dual<float, 2>: against the double closed forms.
template <class F, class DA, class DB>
void check_binary(F f, DA dfa, DB dfb, const std::vector<double>& as, const std::vector<double>& bs) {
  for (std::size_t i = 0; i < as.size(); ++i) {
    const double a = as[i], b = bs[i];
    SCOPED_TRACE(::testing::Message() << "a = " << a << ", b = " << b);
    const double wa = dfa(a, b), wb = dfb(a, b);

    using D2 = Dual<double, 2>;
    const auto y = f(D2::variable(a, 0), D2::variable(b, 1));
    EXPECT_DOUBLE_EQ(y.val, f(a, b));
    const double fda = dualcast::central_difference([&](double t) { return f(t, b); }, a);
    const double fdb = dualcast::central_difference([&](double t) { return f(a, t); }, b);
    EXPECT_LE(relative_error(y.d[0], fda), kGradTolDouble) << y.d[0] << " vs difference " << fda;
    EXPECT_LE(relative_error(y.d[1], fdb), kGradTolDouble) << y.d[1] << " vs difference " << fdb;
    EXPECT_LE(relative_error(y.d[0], wa), kGradTolDouble) << y.d[0] << " vs closed " << wa;
    EXPECT_LE(relative_error(y.d[1], wb), kGradTolDouble) << y.d[1] << " vs closed " << wb;

    using D1 = Dual<double, 1>;
    const auto ya = f(D1::variable(a, 0), b);
    const auto yb = f(a, D1::variable(b, 0));
    EXPECT_DOUBLE_EQ(ya.val, y.val);
    EXPECT_DOUBLE_EQ(yb.val, y.val);
    EXPECT_LE(relative_error(ya.d[0], wa), kGradTolDouble);
    EXPECT_LE(relative_error(yb.d[0], wb), kGradTolDouble);

    const auto y4 = f(Dual<double, 4>::variable(a, 3), Dual<double, 4>::variable(b, 0));
    const double row4[4] = {wb, 0.0, 0.0, wa};
    for (int k = 0; k < 4; ++k) EXPECT_LE(relative_error(y4.d[k], row4[k]), kGradTolDouble) << k;
    const auto y10 = f(Dual<double, 10>::variable(a, 9), Dual<double, 10>::variable(b, 4));
    for (int k = 0; k < 10; ++k) {
      const double want = k == 9 ? wa : (k == 4 ? wb : 0.0);
      EXPECT_LE(relative_error(y10.d[k], want), kGradTolDouble) << k;
    }

    using F2 = Dual<float, 2>;
    const auto yf = f(F2::variable(static_cast<float>(a), 0), F2::variable(static_cast<float>(b), 1));
    EXPECT_LE(relative_error(yf.val, y.val), kGradTolFloat);
    EXPECT_LE(relative_error(yf.d[0], wa), kGradTolFloat);
    EXPECT_LE(relative_error(yf.d[1], wb), kGradTolFloat);
  }
}

// Pairs (a, b) with |a - b| >= gap, so min/max never sit on a tie.
void sample_pairs(double lo, double hi, unsigned seed, std::vector<double>& as,
                  std::vector<double>& bs, double gap = 0.05) {
  const std::vector<double> xs = sample(lo, hi, seed, 40);
  as.clear();
  bs.clear();
  for (std::size_t i = 0; i + 1 < xs.size() && as.size() < 5; i += 2) {
    if (std::fabs(xs[i] - xs[i + 1]) < gap) continue;
    as.push_back(xs[i]);
    bs.push_back(xs[i + 1]);
  }
}

double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

// ---- one test per function: partials vs finite differences and closed form -----------------------

TEST(DualMath, ExpPartialsMatchFiniteDifferencesAndClosedForm) {
  check_unary([](auto x) { return dualcast::exp(x); }, [](double x) { return std::exp(x); }, -3, 3,
              101u);
}
TEST(DualMath, Expm1PartialsMatchFiniteDifferencesAndClosedForm) {
  check_unary([](auto x) { return dualcast::expm1(x); }, [](double x) { return std::exp(x); }, -3,
              3, 102u);
}
TEST(DualMath, LogPartialsMatchFiniteDifferencesAndClosedForm) {
  check_unary([](auto x) { return dualcast::log(x); }, [](double x) { return 1.0 / x; }, 0.1, 5,
              103u);
}
TEST(DualMath, Log1pPartialsMatchFiniteDifferencesAndClosedForm) {
  check_unary([](auto x) { return dualcast::log1p(x); }, [](double x) { return 1.0 / (1.0 + x); },
              -0.9, 5, 104u);
}
TEST(DualMath, SqrtPartialsMatchFiniteDifferencesAndClosedForm) {
  check_unary([](auto x) { return dualcast::sqrt(x); },
              [](double x) { return 0.5 / std::sqrt(x); }, 0.1, 5, 105u);
}
TEST(DualMath, CbrtPartialsMatchFiniteDifferencesAndClosedFormForBothSigns) {
  check_unary([](auto x) { return dualcast::cbrt(x); },
              [](double x) { return std::pow(x * x, -1.0 / 3.0) / 3.0; }, -5, 5, 106u);
}
TEST(DualMath, PowOfDualBaseAndFractionalExponentPartialsMatchFiniteDifferencesAndClosedForm) {
  // number versions take one type: the exponent is written in the scalar type of x
  check_unary([](auto x) { return dualcast::pow(x, dualcast::scalar_t<decltype(x)>(2.5)); },
              [](double x) { return 2.5 * std::pow(x, 1.5); }, 0.2, 3, 107u);
  check_unary([](auto x) { return dualcast::pow(x, dualcast::scalar_t<decltype(x)>(-1.5)); },
              [](double x) { return -1.5 * std::pow(x, -2.5); }, 0.2, 3, 108u);
}
TEST(DualMath, PowOfDualBaseAndIntegerExponentPartialsMatchClosedFormForNegativeBases) {
  check_unary([](auto x) { return dualcast::pow(x, dualcast::scalar_t<decltype(x)>(3)); },
              [](double x) { return 3.0 * x * x; }, -3, 3, 109u);
  // an int exponent with a dual base
  const Dual<double, 1> y = dualcast::pow(Dual<double, 1>::variable(-1.5, 0), 3);
  EXPECT_DOUBLE_EQ(y.d[0], 3.0 * 1.5 * 1.5);
}
TEST(DualMath, PowOfNumberBaseAndDualExponentPartialsMatchFiniteDifferencesAndClosedForm) {
  check_unary([](auto y) { return dualcast::pow(dualcast::scalar_t<decltype(y)>(2.3), y); },
              [](double y) { return std::pow(2.3, y) * std::log(2.3); }, -2, 2, 110u);
  check_unary([](auto y) { return dualcast::pow(dualcast::scalar_t<decltype(y)>(0.4), y); },
              [](double y) { return std::pow(0.4, y) * std::log(0.4); }, -2, 2, 111u);
}
TEST(DualMath, SinPartialsMatchFiniteDifferencesAndClosedForm) {
  check_unary([](auto x) { return dualcast::sin(x); }, [](double x) { return std::cos(x); }, -3, 3,
              112u);
}
TEST(DualMath, CosPartialsMatchFiniteDifferencesAndClosedForm) {
  check_unary([](auto x) { return dualcast::cos(x); }, [](double x) { return -std::sin(x); }, -3, 3,
              113u);
}
TEST(DualMath, TanPartialsMatchFiniteDifferencesAndClosedForm) {
  check_unary([](auto x) { return dualcast::tan(x); },
              [](double x) { return 1.0 / (std::cos(x) * std::cos(x)); }, -1.3, 1.3, 114u);
}
TEST(DualMath, TanhPartialsMatchFiniteDifferencesAndClosedForm) {
  check_unary([](auto x) { return dualcast::tanh(x); },
              [](double x) { return 1.0 / (std::cosh(x) * std::cosh(x)); }, -4, 4, 115u);
}
TEST(DualMath, SigmoidPartialsMatchFiniteDifferencesAndClosedForm) {
  check_unary([](auto x) { return dualcast::sigmoid(x); },
              [](double x) { return sigmoid_ref(x) * sigmoid_ref(-x); }, -8, 8, 116u);
}
TEST(DualMath, SoftplusPartialsMatchFiniteDifferencesAndClosedForm) {
  check_unary([](auto x) { return dualcast::softplus(x); }, [](double x) { return sigmoid_ref(x); },
              -8, 8, 117u);
}
TEST(DualMath, ErfPartialsMatchFiniteDifferencesAndClosedForm) {
  check_unary([](auto x) { return dualcast::erf(x); },
              [](double x) { return 2.0 / std::sqrt(kPi) * std::exp(-x * x); }, -2.5, 2.5, 118u);
}
TEST(DualMath, AbsPartialsMatchFiniteDifferencesAndClosedFormAwayFromZero) {
  check_unary([](auto x) { return dualcast::abs(x); }, [](double x) { return x > 0 ? 1.0 : -1.0; },
              -3, 3, 119u);
}
TEST(DualMath, ReluPartialsMatchFiniteDifferencesAndClosedFormAwayFromZero) {
  check_unary([](auto x) { return dualcast::relu(x); }, [](double x) { return x > 0 ? 1.0 : 0.0; },
              -3, 3, 120u);
}
TEST(DualMath, ClampPartialsMatchFiniteDifferencesAndClosedFormAwayFromTheBounds) {
  // bounds of mixed number types: int and double
  check_unary([](auto x) { return dualcast::clamp(x, -1, 1.5); },
              [](double x) { return (x >= -1.0 && x <= 1.5) ? 1.0 : 0.0; }, -3, 3, 121u, -1.0);
  check_unary([](auto x) { return dualcast::clamp(x, -1, 1.5); },
              [](double x) { return (x >= -1.0 && x <= 1.5) ? 1.0 : 0.0; }, -3, 3, 122u, 1.5);
}
TEST(DualMath, SelectPartialsFollowTheChosenBranchAndMatchFiniteDifferences) {
  // select(x > 0, x^2 (as x * x), sin(x)): the partial is that of the branch chosen by the value.
  check_unary([](auto x) { return dualcast::select(x > 0, x * x, dualcast::sin(x)); },
              [](double x) { return x > 0 ? 2.0 * x : std::cos(x); }, -3, 3, 123u);
}
TEST(DualMath, MaxPartialsMatchFiniteDifferencesAndClosedFormAwayFromTies) {
  std::vector<double> as, bs;
  sample_pairs(-3, 3, 124u, as, bs);
  check_binary([](auto a, auto b) { return dualcast::max(a, b); },
               [](double a, double b) { return a > b ? 1.0 : 0.0; },
               [](double a, double b) { return a > b ? 0.0 : 1.0; }, as, bs);
}
TEST(DualMath, MinPartialsMatchFiniteDifferencesAndClosedFormAwayFromTies) {
  std::vector<double> as, bs;
  sample_pairs(-3, 3, 125u, as, bs);
  check_binary([](auto a, auto b) { return dualcast::min(a, b); },
               [](double a, double b) { return a < b ? 1.0 : 0.0; },
               [](double a, double b) { return a < b ? 0.0 : 1.0; }, as, bs);
}
TEST(DualMath, HypotPartialsMatchFiniteDifferencesAndClosedForm) {
  check_binary([](auto a, auto b) { return dualcast::hypot(a, b); },
               [](double a, double b) { return a / std::hypot(a, b); },
               [](double a, double b) { return b / std::hypot(a, b); }, sample(-3, 3, 126u),
               sample(-3, 3, 127u));
}
TEST(DualMath, PowOfDualBaseAndDualExponentBothPartialsMatchFiniteDifferencesAndClosedForm) {
  check_binary([](auto x, auto y) { return dualcast::pow(x, y); },
               [](double x, double y) { return y * std::pow(x, y - 1.0); },
               [](double x, double y) { return std::pow(x, y) * std::log(x); },
               sample(0.2, 3, 128u), sample(-2, 2, 129u));
}
TEST(DualMath, FmaPartialsMatchFiniteDifferencesAndClosedFormForEveryMixOfArguments) {
  const std::vector<double> as = sample(-2, 2, 130u), bs = sample(-2, 2, 131u), cs = sample(-2, 2, 132u);
  using D = Dual<double, 3>;
  for (std::size_t i = 0; i < as.size(); ++i) {
    const double a = as[i], b = bs[i], c = cs[i];
    const D y = dualcast::fma(D::variable(a, 0), D::variable(b, 1), D::variable(c, 2));
    EXPECT_DOUBLE_EQ(y.val, dualcast::fma(a, b, c));
    const double fd[3] = {
        dualcast::central_difference([&](double t) { return dualcast::fma(t, b, c); }, a),
        dualcast::central_difference([&](double t) { return dualcast::fma(a, t, c); }, b),
        dualcast::central_difference([&](double t) { return dualcast::fma(a, b, t); }, c)};
    const double closed[3] = {b, a, 1.0};
    for (int k = 0; k < 3; ++k) {
      EXPECT_LE(relative_error(y.d[k], fd[k]), kGradTolDouble);
      EXPECT_LE(relative_error(y.d[k], closed[k]), kGradTolDouble);
    }
    using D1 = Dual<double, 1>;
    EXPECT_DOUBLE_EQ(dualcast::fma(D1::variable(a, 0), b, c).d[0], b);
    EXPECT_DOUBLE_EQ(dualcast::fma(a, D1::variable(b, 0), 1).d[0], a);
    EXPECT_DOUBLE_EQ(dualcast::fma(a, b, D1::variable(c, 0)).d[0], 1.0);
    EXPECT_DOUBLE_EQ(dualcast::fma(2, D1::variable(b, 0), D1::variable(c, 0)).d[0], 3.0);
  }
}

// ---- multi-partial seeding: whole Jacobian rows of composite functions ---------------------------

namespace {

// The arity study of Revels et al.: prod_k tanh(x_k > 0.5 ? x_k : -x_k). The branch is on values.
template <int N>
struct ArityProduct {
  template <class X>
  DUALCAST_HD X operator()(const X* x) const {
    X p = dualcast::tanh(x[0] > 0.5 ? x[0] : -x[0]);
    DUALCAST_UNROLL
    for (int k = 1; k < N; ++k) p = p * dualcast::tanh(x[k] > 0.5 ? x[k] : -x[k]);
    return p;
  }
};

template <int N>
double arity_product_partial(const double* x, int j) {
  double r = 1.0;
  for (int k = 0; k < N; ++k) {
    const double s = x[k] > 0.5 ? 1.0 : -1.0;
    const double t = std::tanh(s * x[k]);
    r *= (k == j) ? s * (1.0 - t * t) : t;
  }
  return r;
}

// Many smooth functions and mixed scalars, written with unqualified calls as user code would be:
// one definition serves doubles (finite differences) and duals.
template <int N>
struct Composite {
  template <class X>
  DUALCAST_HD X operator()(const X* x) const {
    using namespace dualcast;
    X acc = x[0] * 0.5f;
    DUALCAST_UNROLL
    for (int k = 0; k < N; ++k) {
      const X& a = x[k];
      const X& b = x[(k + 1) % N];
      acc = acc + sigmoid(a) * exp(b / 4) + log1p(a * a) - tanh(a * b) + softplus(2 * b) / 3.0;
      acc = acc + pow(hypot(a, b), 1.5) + erf(a - b) * cos(a) + sqrt(1.0 + b * b) + cbrt(a + 3);
      acc = acc + pow(1.5 + sin(b), a) + pow(1.25, b) - expm1(a / 2) / (2 + tan(b / 4));
    }
    return acc;
  }
};

template <template <int> class F, int N>
void check_jacobian_row(unsigned seed, bool closed_form) {
  using D = Dual<double, N>;
  const std::vector<double> x0 = sample(-1.2, 1.2, seed, N, 0.5);
  D xs[N];
  for (int k = 0; k < N; ++k) xs[k] = D::variable(x0[k], k);
  const D y = F<N>{}(xs);
  EXPECT_NEAR(y.val, F<N>{}(x0.data()), 1e-12 * std::fmax(1.0, std::fabs(y.val)));
  for (int j = 0; j < N; ++j) {
    SCOPED_TRACE(::testing::Message() << "N = " << N << ", partial " << j);
    std::vector<double> x = x0;
    const double fd = dualcast::central_difference(
        [&](double t) {
          x[j] = t;
          return F<N>{}(x.data());
        },
        x0[j]);
    EXPECT_LE(relative_error(y.d[j], fd), kGradTolDouble) << y.d[j] << " vs difference " << fd;
    if (closed_form) {
      EXPECT_LE(relative_error(y.d[j], arity_product_partial<N>(x0.data(), j)), kGradTolDouble);
    }
  }
}

}  // namespace

TEST(DualMathSeeding, ArityProductJacobianRowMatchesFiniteDifferencesAndClosedFormForN1) {
  check_jacobian_row<ArityProduct, 1>(201u, true);
}
TEST(DualMathSeeding, ArityProductJacobianRowMatchesFiniteDifferencesAndClosedFormForN4) {
  check_jacobian_row<ArityProduct, 4>(202u, true);
}
TEST(DualMathSeeding, ArityProductJacobianRowMatchesFiniteDifferencesAndClosedFormForN10) {
  check_jacobian_row<ArityProduct, 10>(203u, true);
}
TEST(DualMathSeeding, CompositeOfAllSmoothFunctionsJacobianRowMatchesFiniteDifferencesForN1) {
  check_jacobian_row<Composite, 1>(204u, false);
}
TEST(DualMathSeeding, CompositeOfAllSmoothFunctionsJacobianRowMatchesFiniteDifferencesForN4) {
  check_jacobian_row<Composite, 4>(205u, false);
}
TEST(DualMathSeeding, CompositeOfAllSmoothFunctionsJacobianRowMatchesFiniteDifferencesForN10) {
  check_jacobian_row<Composite, 10>(206u, false);
}

// ---- device --------------------------------------------------------------------------------------

namespace {

// The device test's functions: 28 written out below, then every function of ops/elementwise.hpp's
// lists as it is (a function added to a list runs in a kernel here without a line of its own).
constexpr int kWrittenOut = 28;
#define DUALCAST_TEST_COUNT(...) +1
constexpr int kMathFunctions = kWrittenOut DUALCAST_UNARY_FUNCTIONS(DUALCAST_TEST_COUNT)
    DUALCAST_BINARY_FUNCTIONS(DUALCAST_TEST_COUNT);
#undef DUALCAST_TEST_COUNT

// Listed function k (unary ones first) at a, or at (a, b).
template <class X>
DUALCAST_HD X apply_listed(int k, const X& a, const X& b) {
  namespace dc = dualcast;
  int i = 0;
#define DUALCAST_TEST_UNARY(fn) \
  if (k == i++) return dc::fn(a);
#define DUALCAST_TEST_BINARY(fn, ...) \
  if (k == i++) return dc::fn(a, b);
  DUALCAST_UNARY_FUNCTIONS(DUALCAST_TEST_UNARY)
  DUALCAST_BINARY_FUNCTIONS(DUALCAST_TEST_BINARY)
#undef DUALCAST_TEST_UNARY
#undef DUALCAST_TEST_BINARY
  return a;
}

// Function `fn` of the device test on X (a number or Dual<T, 2>): the inputs a, b lie in (0.2, 1.4);
// shifts reach negative arguments and kinks' both sides.
template <class X>
DUALCAST_HD X apply_math(int fn, const X& a, const X& b) {
  using T = dualcast::scalar_t<X>;
  namespace dc = dualcast;
  switch (fn) {
    case 0: return dc::exp(a);
    case 1: return dc::expm1(a - T(0.8));
    case 2: return dc::log(a);
    case 3: return dc::log1p(a - T(1));
    case 4: return dc::sqrt(a);
    case 5: return dc::cbrt(a - T(0.8));
    case 6: return dc::pow(a, T(2.5));
    case 7: return dc::pow(T(1.7), b);
    case 8: return dc::pow(a, b);
    case 9: return dc::sin(T(3) * a);
    case 10: return dc::cos(T(3) * a);
    case 11: return dc::tan(a);
    case 12: return dc::tanh(T(3) * (a - T(0.8)));
    case 13: return dc::sigmoid(T(6) * (a - T(0.8)));
    case 14: return dc::softplus(T(6) * (a - T(0.8)));
    case 15: return dc::erf(T(2) * (a - T(0.8)));
    case 16: return dc::abs(a - T(0.8));
    case 17: return dc::relu(a - T(0.8));
    case 18: return dc::min(a, b);
    case 19: return dc::max(a, b);
    case 20: return dc::clamp(a, T(0.5), T(1.1));
    case 21: return dc::hypot(a - T(0.8), b);
    case 22: return dc::fma(a, b, T(0.25));
    case 23: return dc::select(a > b, a * b, a / b);
    case 24: return dc::pow(a - T(0.8), T(3));
    case 25: return a * b - a / b + T(2) * a - T(1) / b;
    case 26: return dc::sigmoid(T(1e4) * (a - T(0.8)));
    case 27: return dc::softplus(T(-1e4) * (a - T(0.8)));
    default: return apply_listed(fn - kWrittenOut, a, b);
  }
}

// Element i = fn * points + p: evaluates function fn at point p on Dual<T, 2> (a = e_0, b = e_1) and
// on numbers; writes value, both partials and the number result to out[4 * i ...].
template <class T>
struct MathKernel {
  const T* a;
  const T* b;
  T* out;
  int points;
  DUALCAST_HD void operator()(std::int64_t i) const {
    using D = Dual<T, 2>;
    const int fn = static_cast<int>(i / points);
    const D r = apply_math(fn, D::variable(a[i], 0), D::variable(b[i], 1));
    const T v = apply_math(fn, a[i], b[i]);
    out[4 * i + 0] = r.val;
    out[4 * i + 1] = r.d[0];
    out[4 * i + 2] = r.d[1];
    out[4 * i + 3] = v;
  }
};

// Ten differentiated arguments per element, Dual<float, 10> (the paper's widest case): the arity
// product and the composite, value and all ten partials of each to out[22 * i ...].
// Register note (nvcc 13.0, sm_90, -Xptxas -v): the Dual<float, 10> arithmetic itself does not spill;
// this kernel reports a 40-byte stack frame and 16 bytes of spills, which come from CUDA's sinf/cosf/
// tanf large-argument reduction (a local array) inside parallel_for's grid-stride loop: the same
// kernel without the three trig calls, or as a plain one-element-per-thread kernel, has no stack and
// no spills.
template <class T>
struct WideKernel {
  const T* x;  // 10 per element
  T* out;
  DUALCAST_HD void operator()(std::int64_t i) const {
    using D = Dual<T, 10>;
    D xs[10];
    DUALCAST_UNROLL
    for (int k = 0; k < 10; ++k) xs[k] = D::variable(x[10 * i + k], k);
    const D p = ArityProduct<10>{}(xs);
    const D c = Composite<10>{}(xs);
    T* o = out + 22 * i;
    o[0] = p.val;
    o[11] = c.val;
    DUALCAST_UNROLL
    for (int k = 0; k < 10; ++k) {
      o[1 + k] = p.d[k];
      o[12 + k] = c.d[k];
    }
  }
};

}  // namespace

TEST(DualMathHost, DeviceTestFunctionsOnDualsAgreeWithTheNumberVersionsOnTheHost) {
  // The device kernels' functors are host code too: their dual values equal the number versions.
  const int points = 3;
  const int n = kMathFunctions * points;
  std::vector<double> a(n), b(n), out(4 * n);
  const std::vector<double> as = sample(0.2, 1.4, 301u, n), bs = sample(0.2, 1.4, 302u, n);
  for (int i = 0; i < n; ++i) {
    a[i] = as[i];
    b[i] = bs[i];
  }
  const MathKernel<double> kernel{a.data(), b.data(), out.data(), points};
  for (int i = 0; i < n; ++i) {
    kernel(i);
    EXPECT_DOUBLE_EQ(out[4 * i], out[4 * i + 3]) << "function " << i / points;
    EXPECT_TRUE(std::isfinite(out[4 * i + 1]) && std::isfinite(out[4 * i + 2]))
        << "function " << i / points;
  }
}

#if defined(__CUDACC__)

namespace {

template <class T>
T* to_device(const std::vector<T>& host) {
  T* p = nullptr;
  DUALCAST_CUDA_CHECK(cudaMalloc(&p, host.size() * sizeof(T)));
  DUALCAST_CUDA_CHECK(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

template <class T>
std::vector<T> to_host_and_free(T* p, std::size_t n) {
  std::vector<T> host(n);
  DUALCAST_CUDA_CHECK(cudaDeviceSynchronize());
  DUALCAST_CUDA_CHECK(cudaMemcpy(host.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  DUALCAST_CUDA_CHECK(cudaFree(p));
  return host;
}

// Runs MathKernel<T> over every function at `points` points on the GPU and on the host; returns the
// worst relative error (relative_error: scaled by max(1, |host|)) of device against host per function.
template <class T>
std::vector<double> math_device_vs_host(int points, unsigned seed) {
  const int n = kMathFunctions * points;
  std::vector<T> a(n), b(n);
  const std::vector<double> as = sample(0.2, 1.4, seed, n), bs = sample(0.2, 1.4, seed + 1, n);
  for (int i = 0; i < n; ++i) {
    a[i] = static_cast<T>(as[i]);
    b[i] = static_cast<T>(bs[i]);
  }
  std::vector<T> host(4 * static_cast<std::size_t>(n));
  const MathKernel<T> host_kernel{a.data(), b.data(), host.data(), points};
  for (int i = 0; i < n; ++i) host_kernel(i);

  T* da = to_device(a);
  T* db = to_device(b);
  T* dout = to_device(std::vector<T>(host.size(), T(0)));
  dualcast::parallel_for(dualcast::Device::cuda(), n, MathKernel<T>{da, db, dout, points});
  const std::vector<T> device = to_host_and_free(dout, host.size());
  DUALCAST_CUDA_CHECK(cudaFree(da));
  DUALCAST_CUDA_CHECK(cudaFree(db));

  std::vector<double> worst(kMathFunctions, 0.0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < 4; ++j)
      worst[i / points] =
          std::fmax(worst[i / points], relative_error(device[4 * i + j], host[4 * i + j]));
  return worst;
}

}  // namespace

// Tolerances: CUDA's float functions are within 1-4 ulps of the correctly rounded result (expf 2,
// powf 4, tanf 4), glibc's within 1, and nvcc contracts a * b + c into fma where g++ does not; so
// device and host float results differ by a few ulps (bound: 16 * FLT_EPSILON relative); double
// results agree to 1e-12.
TEST(DualMathDevice, EveryFunctionInAKernelMatchesTheHostToAFewUlpsInFloat) {
  DUALCAST_REQUIRE_CUDA();
  const std::vector<double> worst = math_device_vs_host<float>(257, 401u);
  double all = 0.0;
  for (const double w : worst) all = std::fmax(all, w);
  RecordProperty("worst_float_epsilons", ::testing::PrintToString(all / FLT_EPSILON));
  for (int fn = 0; fn < kMathFunctions; ++fn)
    EXPECT_LE(worst[fn], 16 * FLT_EPSILON) << "function " << fn << ": " << worst[fn] / FLT_EPSILON
                                           << " float epsilons";
}

TEST(DualMathDevice, EveryFunctionInAKernelMatchesTheHostTo1e12InDouble) {
  DUALCAST_REQUIRE_CUDA();
  const std::vector<double> worst = math_device_vs_host<double>(257, 403u);
  double all = 0.0;
  for (const double w : worst) all = std::fmax(all, w);
  RecordProperty("worst_relative_error", ::testing::PrintToString(all));
  for (int fn = 0; fn < kMathFunctions; ++fn)
    EXPECT_LE(worst[fn], 1e-12) << "function " << fn << ": " << worst[fn];
}

TEST(DualMathDevice, TenPartialArityProductAndCompositeInAKernelMatchTheHostInFloat) {
  DUALCAST_REQUIRE_CUDA();
  const int n = 1000;
  const std::vector<double> xs = sample(-1.2, 1.2, 405u, 10 * n, 0.5);
  const std::vector<float> x(xs.begin(), xs.end());
  std::vector<float> host(22 * static_cast<std::size_t>(n));
  const WideKernel<float> host_kernel{x.data(), host.data()};
  for (int i = 0; i < n; ++i) host_kernel(i);

  float* dx = to_device(x);
  float* dout = to_device(std::vector<float>(host.size(), 0.f));
  dualcast::parallel_for(dualcast::Device::cuda(), n, WideKernel<float>{dx, dout});
  const std::vector<float> device = to_host_and_free(dout, host.size());
  DUALCAST_CUDA_CHECK(cudaFree(dx));
  // Products of ten tanh and sums of ~150 terms: a few ulps per term accumulate; judged against the
  // value scale of each output (relative_error uses max(1, |want|)).
  double worst = 0.0;
  for (std::size_t j = 0; j < host.size(); ++j)
    worst = std::fmax(worst, relative_error(device[j], host[j]));
  RecordProperty("worst_float_epsilons", ::testing::PrintToString(worst / FLT_EPSILON));
  EXPECT_LE(worst, dualcast::kSameResultTolFloat) << worst / FLT_EPSILON << " float epsilons";
}

#endif  // __CUDACC__
