// reference_functions.hpp: the fuzzer's double-precision reference for elementwise functions, values
// and derivatives written by hand from <cmath> (no dualcast code): the primitives of the op library
// (ops/elementwise.hpp) and the functor family of functors.hpp, whose branches and subgradient
// conventions (ties of max/min split evenly, relu'(0) = abs'(0) = 0, clamp's gradient passing at the
// bounds, hypot'(0, 0) = 0) are the ones dualcast documents. The unary and binary functions are
// enumerated from the library's lists (DUALCAST_UNARY_FUNCTIONS, DUALCAST_BINARY_FUNCTIONS), so a
// function added there is fuzzed at once: against its hand-written reference below where there is
// one, else against its math.hpp rule in double (which tests/test_math.cu checks against central
// differences), the fuzzer then checking what lies around the rule (indices, broadcasts, views,
// dtypes, CPU against CUDA).
#pragma once

#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "dualcast/dual.hpp"
#include "dualcast/math.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "reference.hpp"

namespace fuzzref {

// ---- primitives ----------------------------------------------------------------------------------

#define FUZZREF_ENUMERATOR(fn, ...) fn,
#define FUZZREF_NAME(fn, ...) #fn,
enum class Unary { DUALCAST_UNARY_FUNCTIONS(FUZZREF_ENUMERATOR) neg };
inline constexpr const char* kUnaryNames[] = {DUALCAST_UNARY_FUNCTIONS(FUZZREF_NAME) "neg"};
inline constexpr int kUnaryCount = static_cast<int>(sizeof kUnaryNames / sizeof *kUnaryNames);
inline const char* unary_name(Unary u) { return kUnaryNames[static_cast<int>(u)]; }

/// The listed function u's math.hpp rule on Dual<double, 1>: value, and *d = u'(x).
inline double unary_rule(Unary u, double x, double* d) {
  using D = dualcast::Dual<double, 1>;
  switch (u) {
#define FUZZREF_RULE(fn)                                   \
  case Unary::fn: {                                        \
    const D r = dualcast::fn(D::variable(x, 0));           \
    *d = r.d[0];                                           \
    return r.val;                                          \
  }
    DUALCAST_UNARY_FUNCTIONS(FUZZREF_RULE)
#undef FUZZREF_RULE
    case Unary::neg: *d = -1.0; return -x;
  }
  return 0.0;
}

inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

/// Value of u at x; *d = u'(x).
inline double unary(Unary u, double x, double* d) {
  switch (u) {
    case Unary::exp: return *d = std::exp(x);
    case Unary::expm1: *d = std::exp(x); return std::expm1(x);
    case Unary::log: *d = 1.0 / x; return std::log(x);
    case Unary::log1p: *d = 1.0 / (1.0 + x); return std::log1p(x);
    case Unary::sqrt: *d = 0.5 / std::sqrt(x); return std::sqrt(x);
    case Unary::cbrt: { const double c = std::cbrt(x); *d = 1.0 / (3.0 * c * c); return c; }
    case Unary::sin: *d = std::cos(x); return std::sin(x);
    case Unary::cos: *d = -std::sin(x); return std::cos(x);
    case Unary::tan: { const double t = std::tan(x); *d = 1.0 + t * t; return t; }
    case Unary::tanh: { const double t = std::tanh(x); *d = 1.0 - t * t; return t; }
    case Unary::sigmoid: { const double s = sigmoid(x); *d = s * (1.0 - s); return s; }
    case Unary::softplus: *d = sigmoid(x); return std::max(x, 0.0) + std::log1p(std::exp(-std::fabs(x)));
    case Unary::erf: *d = 2.0 / std::sqrt(M_PI) * std::exp(-x * x); return std::erf(x);
    case Unary::gelu: {
      const double cdf = 0.5 * std::erfc(-x / std::sqrt(2.0));
      *d = cdf + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
      return x * cdf;
    }
    case Unary::abs: *d = x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0); return std::fabs(x);
    case Unary::relu: *d = x > 0 ? 1.0 : 0.0; return x > 0 ? x : 0.0;
    case Unary::neg: *d = -1.0; return -x;
    default: return unary_rule(u, x, d);  // a listed function without a hand-written reference
  }
}

/// The interval the fuzzer draws arguments of u from (where u and u' are well conditioned).
inline void unary_domain(Unary u, double& lo, double& hi) {
  lo = -3.0;
  hi = 3.0;
  switch (u) {
    case Unary::log: case Unary::sqrt: lo = 0.125; break;
    case Unary::log1p: lo = -0.75; break;
    case Unary::tan: lo = -1.25; hi = 1.25; break;
    default: break;
  }
}

enum class Binary { add, sub, mul, div, DUALCAST_BINARY_FUNCTIONS(FUZZREF_ENUMERATOR) };
inline constexpr const char* kBinaryNames[] = {"add", "sub", "mul", "div",
                                               DUALCAST_BINARY_FUNCTIONS(FUZZREF_NAME)};
inline constexpr int kBinaryCount = static_cast<int>(sizeof kBinaryNames / sizeof *kBinaryNames);
inline const char* binary_name(Binary b) { return kBinaryNames[static_cast<int>(b)]; }
#undef FUZZREF_ENUMERATOR
#undef FUZZREF_NAME

/// The listed function b's math.hpp rule on Dual<double, 2>: value, d[0] = db/dx, d[1] = db/dy.
inline double binary_rule(Binary b, double x, double y, double* d) {
  using D = dualcast::Dual<double, 2>;
  switch (b) {
#define FUZZREF_RULE(fn, ...)                                               \
  case Binary::fn: {                                                        \
    const D r = dualcast::fn(D::variable(x, 0), D::variable(y, 1));         \
    d[0] = r.d[0];                                                          \
    d[1] = r.d[1];                                                          \
    return r.val;                                                           \
  }
    DUALCAST_BINARY_FUNCTIONS(FUZZREF_RULE)
#undef FUZZREF_RULE
    default: break;
  }
  return 0.0;
}

/// Value of b(x, y); d[0] = db/dx, d[1] = db/dy.
inline double binary(Binary b, double x, double y, double* d) {
  switch (b) {
    case Binary::add: d[0] = 1; d[1] = 1; return x + y;
    case Binary::sub: d[0] = 1; d[1] = -1; return x - y;
    case Binary::mul: d[0] = y; d[1] = x; return x * y;
    case Binary::div: d[0] = 1.0 / y; d[1] = -x / (y * y); return x / y;
    case Binary::pow: {
      const double v = std::pow(x, y);
      d[0] = y == 0 ? 0.0 : y * std::pow(x, y - 1.0);
      d[1] = x == 0 ? 0.0 : v * std::log(x);
      return v;
    }
    case Binary::min:
    case Binary::max: {
      const bool first = b == Binary::max ? x > y : x < y;
      d[0] = x == y ? 0.5 : (first ? 1.0 : 0.0);
      d[1] = x == y ? 0.5 : (first ? 0.0 : 1.0);
      return first ? x : y;
    }
    case Binary::hypot: {
      const double h = std::hypot(x, y);
      d[0] = h == 0 ? 0.0 : x / h;
      d[1] = h == 0 ? 0.0 : y / h;
      return h;
    }
    default: return binary_rule(b, x, y, d);  // a listed function without a hand-written reference
  }
}

// ---- the functor family (mirrors functors.hpp branch for branch) ------------------------------------

/// BranchChain: acc = a0/2, then per neighbour pair (x, y) = (a_i, a_{i+1 mod n}) one of three terms.
inline void branch_chain(int n, const double* a, double* y, double* d) {
  double acc = 0.5 * a[0];
  d[0] += 0.5;
  for (int i = 0; i < n; ++i) {
    const int j = (i + 1) % n;
    const double x = a[i], w = a[j];
    if (x > w) {
      const double t = std::tanh(x);
      acc += t * w;
      d[i] += (1 - t * t) * w;
      d[j] += t;
    } else if (x < -0.5) {
      const double s = sigmoid(w);
      acc -= s * x;
      d[j] -= s * (1 - s) * x;
      d[i] -= s;
    } else {
      acc += 0.25 * x * x - std::sin(w);
      d[i] += 0.5 * x;
      d[j] -= std::cos(w);
    }
  }
  y[0] = acc;
}

/// EarlyExit: an early return on a0, a loop with a data-dependent exit, then a mix of kinks.
inline void early_exit(int n, const double* a, double* y, double* d) {
  if (a[0] > 1.5) {
    y[0] = 2 * a[n - 1] - a[0];
    d[n - 1] += 2;
    d[0] -= 1;
    return;
  }
  double s = 0;
  std::vector<double> ds(static_cast<std::size_t>(n), 0.0);
  for (int i = 0; i < n; ++i) {
    if (a[i] < -1.25) {
      y[0] = s + 0.5 * std::fabs(a[i]);
      for (int k = 0; k < n; ++k) d[k] += ds[static_cast<std::size_t>(k)];
      d[i] -= 0.5;  // a_i < 0
      return;
    }
    const int j = (i + 1) % n;
    double dsp;
    const double sp = unary(Unary::softplus, a[i], &dsp);
    double dm[2];
    const double mx = binary(Binary::max, a[i], a[j], dm);
    s += sp * 0.125 * (i + 1) + mx * 0.25;
    ds[static_cast<std::size_t>(i)] += dsp * 0.125 * (i + 1) + 0.25 * dm[0];
    ds[static_cast<std::size_t>(j)] += 0.25 * dm[1];
  }
  const int l = n - 1, h = n / 2;
  const double c = std::min(std::max(a[l], -0.5), 0.75);
  const double dc = (a[l] >= -0.5 && a[l] <= 0.75) ? 1.0 : 0.0;
  double dh[2];
  const double hy = binary(Binary::hypot, a[0], a[l], dh);
  double dr;
  const double re = unary(Unary::relu, a[h], &dr);
  y[0] = s * c + hy + re - (a[0] * a[l] + a[h]);
  for (int k = 0; k < n; ++k) d[k] += ds[static_cast<std::size_t>(k)] * c;
  d[l] += s * dc;
  d[0] += dh[0];
  d[l] += dh[1];
  d[h] += dr;
  d[0] -= a[l];
  d[l] -= a[0];
  d[h] -= 1;
}

/// PairOut: the first maximum m, a bounded product p; two outputs chosen by a0.
inline void pair_out(int n, const double* a, double* y, double* d) {
  int im = 0;
  for (int i = 1; i < n; ++i)
    if (a[i] > a[im]) im = i;
  const double m = a[im];
  double p = 1;
  for (int i = 0; i < n; ++i) p *= 1 + 0.25 * std::sin(a[i]);
  std::vector<double> dp(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) dp[static_cast<std::size_t>(i)] = p / (1 + 0.25 * std::sin(a[i])) * 0.25 * std::cos(a[i]);
  double* d0 = d;      // d[0 * n + k]
  double* d1 = d + n;  // d[1 * n + k]
  if (a[0] > 0.25) {
    y[0] = m * p;
    y[1] = p - a[n - 1];
    for (int k = 0; k < n; ++k) {
      d0[k] += m * dp[static_cast<std::size_t>(k)];
      d1[k] += dp[static_cast<std::size_t>(k)];
    }
    d0[im] += p;
    d1[n - 1] -= 1;
    return;
  }
  y[0] = p + 0.5 * m;
  y[1] = std::expm1(0.5 * a[n - 1]);
  for (int k = 0; k < n; ++k) d0[k] += dp[static_cast<std::size_t>(k)];
  d0[im] += 0.5;
  d1[n - 1] += 0.5 * std::exp(0.5 * a[n - 1]);
}

/// TripleOut: a weighted sum of tanh, a min fold (ties split), and a branch on a_{n-1} >= a0.
inline void triple_out(int n, const double* a, double* y, double* d) {
  double* d0 = d;
  double* d1 = d + n;
  double* d2 = d + 2 * n;
  y[0] = 0;
  for (int i = 0; i < n; ++i) {
    const double w = i % 2 == 0 ? 0.5 : -0.25, t = std::tanh(a[i]);
    y[0] += w * t;
    d0[i] += w * (1 - t * t);
  }
  double r = a[0];
  std::vector<double> dr(static_cast<std::size_t>(n), 0.0);
  dr[0] = 1;
  for (int i = 1; i < n; ++i) {
    if (r < a[i]) continue;
    if (r > a[i]) {
      std::fill(dr.begin(), dr.end(), 0.0);
      dr[static_cast<std::size_t>(i)] = 1;
      r = a[i];
      continue;
    }
    for (double& v : dr) v *= 0.5;
    dr[static_cast<std::size_t>(i)] += 0.5;
  }
  y[1] = r;
  for (int k = 0; k < n; ++k) d1[k] += dr[static_cast<std::size_t>(k)];
  const double q = 1 + a[0] * a[0];
  if (a[n - 1] >= a[0]) {
    y[2] = a[n - 1] / q;
    d2[n - 1] += 1 / q;
    d2[0] += -a[n - 1] * 2 * a[0] / (q * q);
  } else {
    y[2] = std::log1p(a[0] * a[0]);
    d2[0] += 2 * a[0] / q;
  }
}

enum class Family { branch_chain, early_exit, pair_out, triple_out };

inline int family_outputs(Family f) {
  return f == Family::pair_out ? 2 : (f == Family::triple_out ? 3 : 1);
}

/// The family member as an ElementFn of n arguments.
inline ElementFn family_fn(Family f, int n) {
  switch (f) {
    case Family::branch_chain: return [n](const double* a, double* y, double* d) { branch_chain(n, a, y, d); };
    case Family::early_exit: return [n](const double* a, double* y, double* d) { early_exit(n, a, y, d); };
    case Family::pair_out: return [n](const double* a, double* y, double* d) { pair_out(n, a, y, d); };
    case Family::triple_out: return [n](const double* a, double* y, double* d) { triple_out(n, a, y, d); };
  }
  return {};
}

}  // namespace fuzzref
