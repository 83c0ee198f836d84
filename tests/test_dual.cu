// test_dual.cu: Dual<T, N>: aggregate layout, traits, accessors, seeding, arithmetic (dual and
// mixed scalar operands, compound assignment), value-only comparisons, and the same arithmetic inside
// a CUDA kernel. Compiled by nvcc in CUDA builds and as C++ in CPU-only builds; device tests are in
// the `#if defined(__CUDACC__)` block and skip without a GPU.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "dualcast/dual.hpp"
#include "dualcast/gradcheck.hpp"
#include "dualcast/parallel.hpp"
#include "test_util.hpp"

using dualcast::Dual;

namespace {

// A rational function of two arguments using every operator, dual-dual and mixed with int, float and
// double scalars on both sides:
//   f(a, b) = (a * b - a / b + 3) / (a + 2.5) * 2 - b + 1 / b - (0.5f - a) + (-b) * 4
// Used on plain doubles (finite differences), on duals (host) and inside a kernel (device).
struct Rational {
  template <class X>
  DUALCAST_HD X operator()(const X& a, const X& b) const {
    X r = (a * b - a / b + 3) / (a + 2.5) * 2 - b + 1 / b - (0.5f - a) + (-b) * 4;
    return r;
  }
};

// The same function written with compound assignment.
struct RationalCompound {
  template <class X>
  DUALCAST_HD X operator()(const X& a, const X& b) const {
    X num = a;
    num *= b;
    num -= a / b;
    num += 3;
    X r = num;
    r /= a + 2.5;
    r *= 2;
    r -= b;
    r += 1 / b;
    X t = a;
    t -= 0.5f;  // -(0.5f - a) = a - 0.5f
    r += t;
    X u = b;
    u *= -4;
    r += u;
    return r;
  }
};

// Closed-form partials of Rational.
double rational_da(double a, double b) {
  const double num = a * b - a / b + 3.0;
  const double den = a + 2.5;
  return 2.0 * ((b - 1.0 / b) * den - num) / (den * den) + 1.0;
}
double rational_db(double a, double b) {
  const double den = a + 2.5;
  return 2.0 * (a + a / (b * b)) / den - 1.0 - 1.0 / (b * b) - 4.0;
}

// Random points in [lo, hi] at least `gap` away from 0 (tests never sit on zeros).
std::vector<double> sample(double lo, double hi, unsigned seed, int n = 5, double gap = 0.1) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> xs;
  while (static_cast<int>(xs.size()) < n) {
    const double x = dist(gen);
    if (std::fabs(x) >= gap) xs.push_back(x);
  }
  return xs;
}

// f(x_0, ..., x_{N-1}) = prod_k (x_k + c_k) / (1 + sum_k x_k^2), c_k = 1 + k / 4: every argument
// enters both the numerator and the denominator, so the whole Jacobian row is nontrivial.
template <int N>
struct ProductOverNorm {
  template <class X>
  X operator()(const X* x) const {
    X prod = x[0] + 1.0;
    for (int k = 1; k < N; ++k) prod = prod * (x[k] + (1.0 + k / 4.0));
    X norm = 1 + x[0] * x[0];
    for (int k = 1; k < N; ++k) norm += x[k] * x[k];
    return prod / norm;
  }
};

template <int N>
double product_over_norm_partial(const double* x, int j) {
  double prod = 1.0, norm = 1.0, prod_without_j = 1.0;
  for (int k = 0; k < N; ++k) {
    const double f = x[k] + (1.0 + k / 4.0);
    prod *= f;
    if (k != j) prod_without_j *= f;
    norm += x[k] * x[k];
  }
  return prod_without_j / norm - prod * 2.0 * x[j] / (norm * norm);
}

// Seeds each argument with its own unit vector and checks the whole Jacobian row against central
// differences and the closed form.
template <int N>
void check_jacobian_row(unsigned seed) {
  using D = Dual<double, N>;
  const std::vector<double> x0 = sample(-1.5, 1.5, seed, N);
  D xs[N];
  for (int k = 0; k < N; ++k) xs[k] = D::variable(x0[k], k);
  const D y = ProductOverNorm<N>{}(xs);
  EXPECT_DOUBLE_EQ(y.val, ProductOverNorm<N>{}(x0.data()));
  for (int j = 0; j < N; ++j) {
    SCOPED_TRACE(::testing::Message() << "N = " << N << ", partial " << j);
    std::vector<double> x = x0;
    const double fd = dualcast::central_difference(
        [&](double t) {
          x[j] = t;
          return ProductOverNorm<N>{}(x.data());
        },
        x0[j]);
    EXPECT_LE(dualcast::relative_error(y.d[j], fd), dualcast::kGradTolDouble) << y.d[j] << " vs " << fd;
    const double closed = product_over_norm_partial<N>(x0.data(), j);
    EXPECT_LE(dualcast::relative_error(y.d[j], closed), dualcast::kGradTolDouble);
  }
}

}  // namespace

// ---- layout and traits ---------------------------------------------------------------------------

TEST(DualType, IsATriviallyCopyableStandardLayoutAggregateOfValueAndPartials) {
  static_assert(std::is_aggregate_v<Dual<float, 4>>);
  static_assert(std::is_trivially_copyable_v<Dual<float, 4>>);
  static_assert(std::is_standard_layout_v<Dual<double, 10>>);
  static_assert(std::is_trivially_default_constructible_v<Dual<double, 1>>);
  static_assert(sizeof(Dual<float, 4>) == 5 * sizeof(float));
  static_assert(sizeof(Dual<double, 10>) == 11 * sizeof(double));
  const Dual<float, 3> x{1.5f, {1.f, 2.f, 3.f}};
  EXPECT_EQ(x.val, 1.5f);
  EXPECT_EQ(x.d[2], 3.f);
}

TEST(DualTraits, IdentifyDualsTheirSizeAndScalarTypeAndTreatNumbersAsSizeZero) {
  using dualcast::dual_size_v;
  using dualcast::is_dual_v;
  using dualcast::scalar_t;
  static_assert(is_dual_v<Dual<float, 4>>);
  static_assert(is_dual_v<const Dual<double, 1>&>);
  static_assert(!is_dual_v<float>);
  static_assert(!is_dual_v<int>);
  static_assert(dual_size_v<Dual<float, 4>> == 4);
  static_assert(dual_size_v<Dual<double, 10>> == 10);
  static_assert(dual_size_v<double> == 0);
  static_assert(std::is_same_v<scalar_t<Dual<float, 4>>, float>);
  static_assert(std::is_same_v<scalar_t<Dual<double, 2>>, double>);
  static_assert(std::is_same_v<scalar_t<double>, double>);
  static_assert(std::is_same_v<scalar_t<int>, int>);
  static_assert(Dual<float, 7>::size == 7);
  SUCCEED();
}

// ---- seeding and accessors -----------------------------------------------------------------------

template <int N>
void check_seeding() {
  using D = Dual<double, N>;
  const D c = D::constant(2.5);
  EXPECT_EQ(c.val, 2.5);
  for (int k = 0; k < N; ++k) EXPECT_EQ(c.d[k], 0.0);
  for (int k = 0; k < N; ++k) {
    const D v = D::variable(-1.25, k);
    EXPECT_EQ(v.val, -1.25);
    for (int j = 0; j < N; ++j) EXPECT_EQ(v.d[j], j == k ? 1.0 : 0.0) << "N=" << N << " k=" << k;
  }
}

TEST(DualSeeding, ConstantHasZeroPartialsAndVariableKHasUnitPartialKForN1N4N10) {
  check_seeding<1>();
  check_seeding<4>();
  check_seeding<10>();
}

TEST(DualAccessors, ValueAndPartialWorkOnDualsAndOnPlainNumbers) {
  const Dual<float, 4> x{2.f, {0.5f, -1.f, 3.f, 4.f}};
  EXPECT_EQ(dualcast::value(x), 2.f);
  EXPECT_EQ(dualcast::partial(x, 0), 0.5f);
  EXPECT_EQ(dualcast::partial(x, 2), 3.f);
  EXPECT_EQ(dualcast::partial(x, 3), 4.f);
  EXPECT_EQ(dualcast::partial(x, 4), 0.f);  // outside [0, N): 0
  EXPECT_EQ(dualcast::value(1.5), 1.5);
  EXPECT_EQ(dualcast::value(7), 7);
  EXPECT_EQ(dualcast::partial(1.5, 0), 0.0);
  EXPECT_EQ(dualcast::partial(3.f, 2), 0.f);
  static_assert(std::is_same_v<decltype(dualcast::value(1.5f)), float>);
  static_assert(dualcast::partial(Dual<double, 2>::variable(1.0, 1), 1) == 1.0);
}

// ---- arithmetic ----------------------------------------------------------------------------------

TEST(DualArithmetic, SumDifferenceProductQuotientPartialsMatchClosedFormForDirectionSeeds) {
  using D = Dual<double, 3>;
  const D a{1.75, {1.0, -0.5, 2.0}};
  const D b{-0.625, {0.25, 3.0, -1.0}};
  const D s = a + b, m = a - b, p = a * b, q = a / b;
  EXPECT_DOUBLE_EQ(s.val, 1.75 - 0.625);
  EXPECT_DOUBLE_EQ(m.val, 1.75 + 0.625);
  EXPECT_DOUBLE_EQ(p.val, 1.75 * -0.625);
  EXPECT_DOUBLE_EQ(q.val, 1.75 / -0.625);
  for (int k = 0; k < 3; ++k) {
    EXPECT_DOUBLE_EQ(s.d[k], a.d[k] + b.d[k]);
    EXPECT_DOUBLE_EQ(m.d[k], a.d[k] - b.d[k]);
    EXPECT_DOUBLE_EQ(p.d[k], a.d[k] * b.val + a.val * b.d[k]);
    EXPECT_NEAR(q.d[k], (a.d[k] * b.val - a.val * b.d[k]) / (b.val * b.val), 1e-14);
  }
}

TEST(DualArithmetic, RationalFunctionPartialsMatchFiniteDifferencesAndClosedForm) {
  const std::vector<double> as = sample(-2.0, 2.0, 11u);
  const std::vector<double> bs = sample(0.3, 3.0, 12u);
  for (std::size_t i = 0; i < as.size(); ++i) {
    const double a = as[i], b = bs[i];
    SCOPED_TRACE(::testing::Message() << "a = " << a << ", b = " << b);
    using D = Dual<double, 2>;
    const D y = Rational{}(D::variable(a, 0), D::variable(b, 1));
    EXPECT_DOUBLE_EQ(y.val, Rational{}(a, b));
    const double fd_a = dualcast::central_difference([&](double t) { return Rational{}(t, b); }, a);
    const double fd_b = dualcast::central_difference([&](double t) { return Rational{}(a, t); }, b);
    EXPECT_LE(dualcast::relative_error(y.d[0], fd_a), dualcast::kGradTolDouble);
    EXPECT_LE(dualcast::relative_error(y.d[1], fd_b), dualcast::kGradTolDouble);
    EXPECT_LE(dualcast::relative_error(y.d[0], rational_da(a, b)), dualcast::kGradTolDouble);
    EXPECT_LE(dualcast::relative_error(y.d[1], rational_db(a, b)), dualcast::kGradTolDouble);
    // float duals against the double closed form
    using F = Dual<float, 2>;
    const F yf = Rational{}(F::variable(static_cast<float>(a), 0), F::variable(static_cast<float>(b), 1));
    EXPECT_LE(dualcast::relative_error(yf.d[0], rational_da(a, b)), dualcast::kGradTolFloat);
    EXPECT_LE(dualcast::relative_error(yf.d[1], rational_db(a, b)), dualcast::kGradTolFloat);
  }
}

TEST(DualArithmetic, CompoundAssignmentGivesTheSameResultAsBinaryOperators) {
  using D = Dual<double, 2>;
  for (const double a : sample(-2.0, 2.0, 21u)) {
    const D x = D::variable(a, 0), y = D::variable(a * 0.5 + 1.25, 1);
    const D r1 = Rational{}(x, y);
    const D r2 = RationalCompound{}(x, y);
    EXPECT_NEAR(r1.val, r2.val, 1e-12);
    EXPECT_NEAR(r1.d[0], r2.d[0], 1e-12);
    EXPECT_NEAR(r1.d[1], r2.d[1], 1e-12);
  }
  D z = D::variable(2.0, 0);
  D& ref = (z += D::variable(1.0, 1));
  EXPECT_EQ(&ref, &z);
  EXPECT_EQ(z.val, 3.0);
  EXPECT_EQ(z.d[0], 1.0);
  EXPECT_EQ(z.d[1], 1.0);
  z /= 2;
  EXPECT_EQ(z.val, 1.5);
  EXPECT_EQ(z.d[1], 0.5);
}

TEST(DualArithmetic, UnaryMinusNegatesValueAndPartialsAndUnaryPlusIsIdentity) {
  const Dual<float, 3> x{1.5f, {1.f, -2.f, 0.25f}};
  const auto n = -x;
  const auto p = +x;
  EXPECT_EQ(n.val, -1.5f);
  EXPECT_EQ(p.val, 1.5f);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(n.d[k], -x.d[k]);
    EXPECT_EQ(p.d[k], x.d[k]);
  }
}

TEST(DualArithmetic, IntFloatAndDoubleScalarsOnEitherSideConvertToTheDualScalarType) {
  using F = Dual<float, 4>;
  const F x = F::variable(2.f, 1);
  static_assert(std::is_same_v<decltype(x + 1), F>);
  static_assert(std::is_same_v<decltype(1.0 + x), F>);
  static_assert(std::is_same_v<decltype(x * 2.5f), F>);
  static_assert(std::is_same_v<decltype(3 / x), F>);
  static_assert(std::is_same_v<decltype(x - 1.0), F>);
  static_assert(std::is_same_v<decltype(Dual<double, 2>::constant(1.0) * 2.0f), Dual<double, 2>>);
  // x + s and s + x: partials unchanged
  for (const F r : {x + 1, x + 1.0f, x + 1.0, 1 + x, 1.0f + x, 1.0 + x}) {
    EXPECT_EQ(r.val, 3.f);
    EXPECT_EQ(r.d[1], 1.f);
    EXPECT_EQ(r.d[0], 0.f);
  }
  // x - s and s - x
  EXPECT_EQ((x - 3).val, -1.f);
  EXPECT_EQ((x - 3).d[1], 1.f);
  EXPECT_EQ((3.0 - x).val, 1.f);
  EXPECT_EQ((3.0 - x).d[1], -1.f);
  // x * s and s * x: partials scale
  for (const F r : {x * 3, x * 3.0f, x * 3.0, 3 * x, 3.0f * x, 3.0 * x}) {
    EXPECT_EQ(r.val, 6.f);
    EXPECT_EQ(r.d[1], 3.f);
  }
  // x / s and s / x: d(s / x) = -s / x^2
  for (const F r : {x / 4, x / 4.0f, x / 4.0}) {
    EXPECT_EQ(r.val, 0.5f);
    EXPECT_EQ(r.d[1], 0.25f);
  }
  for (const F r : {8 / x, 8.0f / x, 8.0 / x}) {
    EXPECT_EQ(r.val, 4.f);
    EXPECT_EQ(r.d[1], -2.f);
  }
  // compound assignment with scalars of every kind
  F y = x;
  y += 1;
  y *= 2.0;
  y -= 0.5f;
  y /= 2;
  EXPECT_FLOAT_EQ(y.val, ((2.f + 1.f) * 2.f - 0.5f) / 2.f);
  EXPECT_FLOAT_EQ(y.d[1], 1.f);
}

TEST(DualArithmetic, IsUsableInConstantExpressions) {
  constexpr auto x = Dual<double, 2>::variable(3.0, 0);
  constexpr auto y = Dual<double, 2>::variable(2.0, 1);
  constexpr auto r = (x * y + 1) / y - 2.0;
  static_assert(r.val == 1.5);
  static_assert(r.d[0] == 1.0);                  // d/dx (x*y + 1)/y = 1
  static_assert(r.d[1] == -1.0 / 4.0);           // d/dy = -1/y^2
  static_assert(-x == -3.0 && x > y && y <= 2);  // comparisons are constexpr too
  SUCCEED();
}

// ---- multi-partial seeding: the whole Jacobian row -----------------------------------------------

TEST(DualSeeding, JacobianRowOfARationalFunctionMatchesFiniteDifferencesForN1) {
  check_jacobian_row<1>(31u);
}
TEST(DualSeeding, JacobianRowOfARationalFunctionMatchesFiniteDifferencesForN4) {
  check_jacobian_row<4>(32u);
}
TEST(DualSeeding, JacobianRowOfARationalFunctionMatchesFiniteDifferencesForN10) {
  check_jacobian_row<10>(33u);
}

// ---- comparisons ---------------------------------------------------------------------------------

TEST(DualComparison, DualsWithEqualValuesAndDifferentPartialsCompareEqual) {
  const Dual<double, 3> a{1.5, {1.0, 0.0, 0.0}};
  const Dual<double, 3> b{1.5, {0.0, -7.0, 2.0}};
  EXPECT_TRUE(a == b);
  EXPECT_FALSE(a != b);
  EXPECT_FALSE(a < b);
  EXPECT_FALSE(b < a);
  EXPECT_TRUE(a <= b);
  EXPECT_TRUE(a >= b);
  EXPECT_FALSE(a > b);
}

TEST(DualComparison, AllSixOperatorsCompareValuesWithDualsAndScalarsOnEitherSide) {
  const Dual<float, 2> a{1.0f, {5.f, 5.f}};
  const Dual<float, 2> b{2.0f, {-5.f, 0.f}};
  EXPECT_TRUE(a < b);
  EXPECT_TRUE(a <= b);
  EXPECT_TRUE(b > a);
  EXPECT_TRUE(b >= a);
  EXPECT_TRUE(a != b);
  EXPECT_FALSE(a == b);
  // scalar on the right, int / float / double
  EXPECT_TRUE(a == 1);
  EXPECT_TRUE(a == 1.0f);
  EXPECT_TRUE(a == 1.0);
  EXPECT_TRUE(a != 2);
  EXPECT_TRUE(a < 1.5);
  EXPECT_TRUE(a <= 1);
  EXPECT_TRUE(b > 1.5f);
  EXPECT_TRUE(b >= 2);
  // scalar on the left
  EXPECT_TRUE(1 == a);
  EXPECT_TRUE(2.0 != a);
  EXPECT_TRUE(0.5f < a);
  EXPECT_TRUE(1 <= a);
  EXPECT_TRUE(3.0 > b);
  EXPECT_TRUE(2 >= b);
  EXPECT_FALSE(2 < b);
  EXPECT_FALSE(0.5 > a);
}

TEST(DualComparison, NaNValuesCompareUnorderedLikePlainNumbers) {
  const Dual<double, 1> n = Dual<double, 1>::constant(std::nan(""));
  EXPECT_FALSE(n == n);
  EXPECT_TRUE(n != n);
  EXPECT_FALSE(n < 0.0);
  EXPECT_FALSE(n >= 0.0);
}

// ---- device --------------------------------------------------------------------------------------

namespace {

// Evaluates Rational on Dual<T, N> with a seeded as partial 0 and b as partial N - 1, and writes
// value and partials to out[i * (N + 1) ...]; also a comparison-driven branch (values only).
template <class T, int N>
struct RationalKernel {
  const T* a;
  const T* b;
  T* out;
  DUALCAST_HD void operator()(std::int64_t i) const {
    using D = Dual<T, N>;
    const D x = D::variable(a[i], 0);
    const D y = D::variable(b[i], N - 1);
    D r = Rational{}(x, y);
    if (x > y) r += RationalCompound{}(y, x);  // control flow on values only
    T* o = out + i * (N + 1);
    o[0] = r.val;
    DUALCAST_UNROLL
    for (int k = 0; k < N; ++k) o[1 + k] = r.d[k];
  }
};

}  // namespace

#if defined(__CUDACC__)

namespace {

// Largest relative error (relative_error: scaled by max(1, |want|)) between the kernel's results and
// the same functor run on the host, over n elements of N + 1 values.
template <class T, int N>
double device_vs_host_error(int n, unsigned seed) {
  std::vector<T> a(n), b(n);
  const std::vector<double> as = sample(-2.0, 2.0, seed, n);
  const std::vector<double> bs = sample(0.3, 3.0, seed + 1, n);
  for (int i = 0; i < n; ++i) {
    a[i] = static_cast<T>(as[i]);
    b[i] = static_cast<T>(bs[i]);
  }
  const std::size_t out_count = static_cast<std::size_t>(n) * (N + 1);
  std::vector<T> host(out_count), device(out_count);
  const RationalKernel<T, N> host_kernel{a.data(), b.data(), host.data()};
  for (int i = 0; i < n; ++i) host_kernel(i);

  T *da = nullptr, *db = nullptr, *dout = nullptr;
  DUALCAST_CUDA_CHECK(cudaMalloc(&da, n * sizeof(T)));
  DUALCAST_CUDA_CHECK(cudaMalloc(&db, n * sizeof(T)));
  DUALCAST_CUDA_CHECK(cudaMalloc(&dout, out_count * sizeof(T)));
  DUALCAST_CUDA_CHECK(cudaMemcpy(da, a.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  DUALCAST_CUDA_CHECK(cudaMemcpy(db, b.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  dualcast::parallel_for(dualcast::Device::cuda(), n, RationalKernel<T, N>{da, db, dout});
  DUALCAST_CUDA_CHECK(cudaDeviceSynchronize());
  DUALCAST_CUDA_CHECK(cudaMemcpy(device.data(), dout, out_count * sizeof(T), cudaMemcpyDeviceToHost));
  DUALCAST_CUDA_CHECK(cudaFree(da));
  DUALCAST_CUDA_CHECK(cudaFree(db));
  DUALCAST_CUDA_CHECK(cudaFree(dout));

  double worst = 0.0;
  for (std::size_t j = 0; j < out_count; ++j)
    worst = std::fmax(worst, dualcast::relative_error(device[j], host[j]));
  ::testing::Test::RecordProperty("worst_relative_error", ::testing::PrintToString(worst));
  return worst;
}

}  // namespace

// Host and device differ only by rounding (nvcc contracts a * b + c into fma, g++ on x86-64 does not):
// a few float ulps, far below 1e-12 in double.
TEST(DualDevice, ArithmeticInAKernelMatchesTheHostForFloatN4) {
  DUALCAST_REQUIRE_CUDA();
  EXPECT_LE((device_vs_host_error<float, 4>(1000, 41u)), 16 * FLT_EPSILON);
}
TEST(DualDevice, ArithmeticInAKernelMatchesTheHostForFloatN10) {
  DUALCAST_REQUIRE_CUDA();
  EXPECT_LE((device_vs_host_error<float, 10>(1000, 43u)), 16 * FLT_EPSILON);
}
TEST(DualDevice, ArithmeticInAKernelMatchesTheHostForDoubleN4) {
  DUALCAST_REQUIRE_CUDA();
  EXPECT_LE((device_vs_host_error<double, 4>(1000, 45u)), 1e-12);
}

#endif  // __CUDACC__

TEST(DualHost, KernelFunctorRunsOnTheHostWithTheSameResultsAsDirectEvaluation) {
  // The device functor is plain host code in a CPU build; check it writes what Rational computes.
  const double a = 0.75, b = 1.5;
  std::vector<double> out(5);
  RationalKernel<double, 4>{&a, &b, out.data()}(0);
  using D = Dual<double, 4>;
  const D r = Rational{}(D::variable(a, 0), D::variable(b, 3));  // a < b: no extra branch
  EXPECT_DOUBLE_EQ(out[0], r.val);
  for (int k = 0; k < 4; ++k) EXPECT_DOUBLE_EQ(out[1 + k], r.d[k]);
}
