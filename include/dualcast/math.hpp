// math.hpp: elementary functions on plain numbers and on Dual<T, N>, side by side, for host and device
// code. Each dual version states its derivative; kinks and singular points state the (sub)gradient
// chosen.
//
// Plain-number versions are function templates constrained to floating-point types and call the C
// library by type (::expf for float, ::exp for double, ::expl for long double on the host), which
// CUDA provides in device code as well. Being templates, they never make an unqualified call
// ambiguous after `using namespace dualcast;`: `exp(1.0f)` still picks the C/C++ library's (or CUDA's)
// non-template exp(float), which is an exact match and wins over a template; our template is chosen
// only where nothing else matches exactly. min, max and clamp of numbers accept a mix of arithmetic
// types with at least one floating-point argument (result: the common type), so that one functor such
// as `max(0, min(1, (a * x + 1) / 2))` compiles for x a float, a double or a dual.
//
// Dual versions accept Dual<T, N>; the binary and ternary ones (pow, min, max, clamp, hypot, fma,
// select) accept any mix of plain numbers and duals of one type Dual<T, N>, numbers converted to T.
// Unary rules go through chain(x, f, f'): val = f, d[k] = f' * x.d[k]. Where f' can be infinite
// (sqrt, cbrt, log, log1p, pow at 0) the partials use chain_sparse: a partial that is exactly 0 in x
// stays 0 (instead of inf * 0 = NaN), so a singularity in argument j never poisons the gradients of
// the other arguments.
#pragma once

#include <math.h>

#include <cmath>
#include <type_traits>

#include "dualcast/config.hpp"
#include "dualcast/dual.hpp"
#include "dualcast/vector_math.hpp"  // libmvec variants of the calls below, for the CPU tiles

namespace dualcast {

// ---- machinery -----------------------------------------------------------------------------------

/// The chain rule for a unary function: val = f_value, d[k] = f_derivative * x.d[k].
template <class T, int N>
DUALCAST_HD DUALCAST_INLINE constexpr Dual<T, N> chain(const Dual<T, N>& x,
                                                       std::type_identity_t<T> f_value,
                                                       std::type_identity_t<T> f_derivative) {
  Dual<T, N> r;
  r.val = f_value;
  DUALCAST_UNROLL
  for (int k = 0; k < N; ++k) r.d[k] = f_derivative * x.d[k];
  return r;
}

namespace detail {

/// df * dx, except that dx == 0 gives 0 even when df is infinite or NaN.
template <class T>
DUALCAST_HD DUALCAST_INLINE constexpr T scale_sparse(T df, T dx) {
  return dx == T(0) ? T(0) : df * dx;
}

/// 1 / d for d in [1, 4] (sigmoid's 1 + e, tanh's (1 + u)^2). In float on the GPU: the hardware
/// reciprocal refined by one Newton step, which is what IEEE division computes for such d, without
/// its branch to the slow path for denormal or huge divisors (the branch and its bookkeeping cost
/// more than the arithmetic). Everywhere else: plain division.
template <class T>
DUALCAST_HD DUALCAST_INLINE T recip_moderate(T d) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
    return fmaf(r, fmaf(-d, r, 1.0f), r);
  }
#endif
  return T(1) / d;
}

/// chain() for derivatives that may be infinite: partials that are 0 in x stay 0.
template <class T, int N>
DUALCAST_HD DUALCAST_INLINE constexpr Dual<T, N> chain_sparse(const Dual<T, N>& x,
                                                              std::type_identity_t<T> f_value,
                                                              std::type_identity_t<T> f_derivative) {
  Dual<T, N> r;
  r.val = f_value;
  DUALCAST_UNROLL
  for (int k = 0; k < N; ++k) r.d[k] = scale_sparse(f_derivative, x.d[k]);
  return r;
}

/// The one Dual type among Xs (void when there is none).
template <class... Xs>
struct common_dual {
  using type = void;
};
template <class X, class... Rest>
struct common_dual<X, Rest...> {
  using type = std::conditional_t<is_dual_v<X>, std::remove_cvref_t<X>,
                                  typename common_dual<Rest...>::type>;
};
template <class... Xs>
using common_dual_t = typename common_dual<Xs...>::type;

/// Arguments of a mixed function: each a dual or an arithmetic number, at least one dual, and all
/// duals of one type.
template <class... Xs>
concept dual_mix =
    (... && (is_dual_v<Xs> || std::is_arithmetic_v<std::remove_cvref_t<Xs>>)) &&
    !std::is_void_v<common_dual_t<Xs...>> &&
    (... && (!is_dual_v<Xs> || std::is_same_v<std::remove_cvref_t<Xs>, common_dual_t<Xs...>>));

/// Arguments of a mixed plain-number function: all arithmetic, at least one floating-point.
template <class... Xs>
concept number_mix = (... && std::is_arithmetic_v<Xs>) && (... || std::is_floating_point_v<Xs>);

/// x as a dual of type R: a dual is returned as is, a number becomes a constant.
template <class R, class X>
DUALCAST_HD DUALCAST_INLINE constexpr R as_dual(const X& x) {
  if constexpr (is_dual_v<X>) {
    return x;
  } else {
    return R::constant(static_cast<typename R::scalar_type>(x));
  }
}

}  // namespace detail

// Plain-number versions: name(x) calls ::cname##f (float), ::cname (double), ::cname##l (long double).
#define DUALCAST_C_UNARY(name, cname)                                              \
  template <class T>                                                               \
    requires std::is_floating_point_v<T>                                           \
  DUALCAST_HD DUALCAST_INLINE T name(T x) {                                        \
    if constexpr (std::is_same_v<T, float>) {                                      \
      return ::cname##f(x);                                                        \
    } else if constexpr (std::is_same_v<T, double>) {                              \
      return ::cname(x);                                                           \
    } else {                                                                       \
      return ::cname##l(x);                                                        \
    }                                                                              \
  }
#define DUALCAST_C_BINARY(name, cname)                                             \
  template <class T>                                                               \
    requires std::is_floating_point_v<T>                                           \
  DUALCAST_HD DUALCAST_INLINE T name(T x, T y) {                                   \
    if constexpr (std::is_same_v<T, float>) {                                      \
      return ::cname##f(x, y);                                                     \
    } else if constexpr (std::is_same_v<T, double>) {                              \
      return ::cname(x, y);                                                        \
    } else {                                                                       \
      return ::cname##l(x, y);                                                     \
    }                                                                              \
  }

/// abs(x) = |x| (C fabs) of a number; the dual version is with the piecewise functions below.
DUALCAST_C_UNARY(abs, fabs)

// ---- exponentials and logarithms -----------------------------------------------------------------

/// exp(x).  d/dx exp(x) = exp(x).
DUALCAST_C_UNARY(exp, exp)
template <class T, int N>
DUALCAST_HD DUALCAST_INLINE Dual<T, N> exp(const Dual<T, N>& x) {
  const T e = exp(x.val);
  return chain(x, e, e);
}

/// expm1(x) = exp(x) - 1, accurate near 0.  d/dx expm1(x) = exp(x) (computed by exp, not as
/// expm1(x) + 1, which loses accuracy for x << 0).
DUALCAST_C_UNARY(expm1, expm1)
template <class T, int N>
DUALCAST_HD DUALCAST_INLINE Dual<T, N> expm1(const Dual<T, N>& x) {
  return chain(x, expm1(x.val), exp(x.val));
}

/// log(x).  d/dx log(x) = 1 / x.  At x = 0: value -inf, partial inf * dx (sparse: 0 where dx = 0).
DUALCAST_C_UNARY(log, log)
template <class T, int N>
DUALCAST_HD DUALCAST_INLINE Dual<T, N> log(const Dual<T, N>& x) {
  return detail::chain_sparse(x, log(x.val), T(1) / x.val);
}

/// log1p(x) = log(1 + x), accurate near 0.  d/dx log1p(x) = 1 / (1 + x).  At x = -1: value -inf,
/// partial inf * dx (sparse).
DUALCAST_C_UNARY(log1p, log1p)
template <class T, int N>
DUALCAST_HD DUALCAST_INLINE Dual<T, N> log1p(const Dual<T, N>& x) {
  return detail::chain_sparse(x, log1p(x.val), T(1) / (T(1) + x.val));
}

// ---- roots and powers ----------------------------------------------------------------------------

/// sqrt(x).  d/dx sqrt(x) = 1 / (2 sqrt(x)).  At x = 0 the derivative is +inf: a partial with
/// dx > 0 is +inf, dx < 0 gives -inf, and dx = 0 gives 0 (sparse), never NaN.
DUALCAST_C_UNARY(sqrt, sqrt)
template <class T, int N>
DUALCAST_HD DUALCAST_INLINE Dual<T, N> sqrt(const Dual<T, N>& x) {
  const T s = sqrt(x.val);
  return detail::chain_sparse(x, s, T(0.5) / s);
}

/// cbrt(x), defined for negative x too.  d/dx cbrt(x) = 1 / (3 cbrt(x)^2).  At x = 0: +inf, as for
/// sqrt (sparse partials).
DUALCAST_C_UNARY(cbrt, cbrt)
template <class T, int N>
DUALCAST_HD DUALCAST_INLINE Dual<T, N> cbrt(const Dual<T, N>& x) {
  const T c = cbrt(x.val);
  return detail::chain_sparse(x, c, T(1) / (T(3) * c * c));
}

/// pow(x, p) on numbers (same floating-point type; C library semantics).
DUALCAST_C_BINARY(pow, pow)

/// pow(x, p) for a dual base and a constant exponent.  d/dx x^p = p x^(p-1), computed with pow, never
/// with log, so x = 0 with an integer p >= 1 gives the exact finite partial (p = 1: 1, p >= 2: 0) and
/// negative x with integer p works. p = 0: partial 0 (x^0 = 1 everywhere, also at x = 0).
/// x = 0 with 0 < p < 1: +inf partial (sparse, as sqrt). Negative x with non-integer p: NaN (as the
/// value). Note: x * x is cheaper than pow(x, 2).
template <class T, int N, detail::dual_scalar S>
DUALCAST_HD DUALCAST_INLINE Dual<T, N> pow(const Dual<T, N>& x, S exponent) {
  const T p = static_cast<T>(exponent);
  const T dfdx = (p == T(0)) ? T(0) : p * pow(x.val, p - T(1));
  return detail::chain_sparse(x, pow(x.val, p), dfdx);
}

/// pow(a, y) for a constant base and a dual exponent.  d/dy a^y = a^y log(a). a = 0: partial 0
/// (0^y is 0 for every y > 0: locally constant; no 0 * log(0) = NaN). a < 0: NaN partial (a^y is
/// not differentiable in y there). a = 1: 0.
template <class T, int N, detail::dual_scalar S>
DUALCAST_HD DUALCAST_INLINE Dual<T, N> pow(S base, const Dual<T, N>& y) {
  const T a = static_cast<T>(base);
  const T f = pow(a, y.val);
  const T dfdy = (a == T(0)) ? T(0) : f * log(a);
  return detail::chain_sparse(y, f, dfdy);
}

/// pow(x, y) for a dual base and a dual exponent.
///   d/dx x^y = y x^(y-1)   (as pow(dual, number): no log; y = 0 gives 0)
///   d/dy x^y = x^y log(x)  (as pow(number, dual): x = 0 gives 0)
/// log(x) is evaluated only when some partial of y is nonzero, and each term is sparse: where y
/// carries no partial (a constant exponent, or the partials of other arguments), the log term never
/// enters, so x <= 0 with a constant integer exponent gives the same finite result as pow(dual, p).
/// x < 0 with a varying exponent gives NaN in the partials y carries (x^y is not differentiable in
/// y there).
template <class T, int N>
DUALCAST_HD DUALCAST_INLINE Dual<T, N> pow(const Dual<T, N>& x, const Dual<T, N>& y) {
  const T f = pow(x.val, y.val);
  const T dfdx = (y.val == T(0)) ? T(0) : y.val * pow(x.val, y.val - T(1));
  bool y_varies = false;
  DUALCAST_UNROLL
  for (int k = 0; k < N; ++k) y_varies = y_varies || (y.d[k] != T(0));
  const T dfdy = (y_varies && x.val != T(0)) ? f * log(x.val) : T(0);
  Dual<T, N> r;
  r.val = f;
  DUALCAST_UNROLL
  for (int k = 0; k < N; ++k)
    r.d[k] = detail::scale_sparse(dfdx, x.d[k]) + detail::scale_sparse(dfdy, y.d[k]);
  return r;
}

// ---- trigonometric and hyperbolic ----------------------------------------------------------------

/// sin(x) and cos(x) of numbers (both declared before the dual versions, which use each other's).
DUALCAST_C_UNARY(sin, sin)
DUALCAST_C_UNARY(cos, cos)

/// sin(x).  d/dx sin(x) = cos(x).
template <class T, int N>
DUALCAST_HD DUALCAST_INLINE Dual<T, N> sin(const Dual<T, N>& x) {
  return chain(x, sin(x.val), cos(x.val));
}

/// cos(x).  d/dx cos(x) = -sin(x).
template <class T, int N>
DUALCAST_HD DUALCAST_INLINE Dual<T, N> cos(const Dual<T, N>& x) {
  return chain(x, cos(x.val), -sin(x.val));
}

/// tan(x).  d/dx tan(x) = 1 + tan(x)^2 (= 1 / cos(x)^2; a sum of positives, no cancellation).
DUALCAST_C_UNARY(tan, tan)
template <class T, int N>
DUALCAST_HD DUALCAST_INLINE Dual<T, N> tan(const Dual<T, N>& x) {
  const T t = tan(x.val);
  return chain(x, t, T(1) + t * t);
}

/// tanh(x).  d/dx tanh(x) = 1 - tanh(x)^2 = sech(x)^2, computed as 4u / (1 + u)^2 with
/// u = exp(-2|x|) <= 1: accurate to a few ulps for every x (1 - t*t cancels once |t| -> 1 and gives
/// 0 for |x| > ~9 in float), no overflow, exactly 0 only where sech^2 underflows.
DUALCAST_C_UNARY(tanh, tanh)
template <class T, int N>
DUALCAST_HD DUALCAST_INLINE Dual<T, N> tanh(const Dual<T, N>& x) {
  const T u = exp(T(-2) * ::dualcast::abs(x.val));
  const T one_u = T(1) + u;
  return chain(x, tanh(x.val), T(4) * u * detail::recip_moderate(one_u * one_u));
}

// ---- activations ---------------------------------------------------------------------------------

/// sigmoid(x) = 1 / (1 + exp(-x)), as 1 / (1 + e) for x >= 0 and e / (1 + e) for x < 0 with
/// e = exp(-|x|) <= 1: never overflows (exact 0 or 1 for |x| ~ 1e4, float and double).
template <class T>
  requires std::is_floating_point_v<T>
DUALCAST_HD DUALCAST_INLINE T sigmoid(T x) {
  const T e = exp(-::dualcast::abs(x));
  const T r = detail::recip_moderate(T(1) + e);
  return x >= T(0) ? r : e * r;
}
/// d/dx sigmoid(x) = sigmoid(x) sigmoid(-x) = e / (1 + e)^2 with e = exp(-|x|): no cancellation
/// (s * (1 - s) gives 0 once s rounds to 1), 0 where it underflows.
template <class T, int N>
DUALCAST_HD DUALCAST_INLINE Dual<T, N> sigmoid(const Dual<T, N>& x) {
  const T e = exp(-::dualcast::abs(x.val));
  const T r = detail::recip_moderate(T(1) + e);
  const T er = e * r;
  return chain(x, x.val >= T(0) ? r : er, er * r);
}

/// softplus(x) = log(1 + exp(x)), as max(x, 0) + log1p(exp(-|x|)): never overflows (x = 1e4 gives
/// 1e4, x = -1e4 gives 0), accurate for x << 0.
template <class T>
  requires std::is_floating_point_v<T>
DUALCAST_HD DUALCAST_INLINE T softplus(T x) {
  return (x > T(0) ? x : T(0)) + log1p(exp(-::dualcast::abs(x)));
}
/// d/dx softplus(x) = sigmoid(x), from the same e = exp(-|x|).
template <class T, int N>
DUALCAST_HD DUALCAST_INLINE Dual<T, N> softplus(const Dual<T, N>& x) {
  const T e = exp(-::dualcast::abs(x.val));
  const T r = detail::recip_moderate(T(1) + e);
  const T s = x.val >= T(0) ? r : e * r;
  return chain(x, (x.val > T(0) ? x.val : T(0)) + log1p(e), s);
}

/// relu(x) = max(x, 0) (NaN stays NaN).
template <class T>
  requires std::is_floating_point_v<T>
DUALCAST_HD DUALCAST_INLINE T relu(T x) {
  return x <= T(0) ? T(0) : x;
}
/// d/dx relu(x) = 1 for x > 0, 0 for x < 0, and relu'(0) = 0 (subgradient; as PyTorch).
template <class T, int N>
DUALCAST_HD DUALCAST_INLINE Dual<T, N> relu(const Dual<T, N>& x) {
  return x.val <= T(0) ? Dual<T, N>::constant(T(0)) : x;
}

// ---- special functions ---------------------------------------------------------------------------

/// erf(x).  d/dx erf(x) = 2 / sqrt(pi) * exp(-x^2).
DUALCAST_C_UNARY(erf, erf)
template <class T, int N>
DUALCAST_HD DUALCAST_INLINE Dual<T, N> erf(const Dual<T, N>& x) {
  constexpr T two_over_sqrt_pi = T(1.12837916709551257389615890312154517);
  return chain(x, erf(x.val), two_over_sqrt_pi * exp(-(x.val * x.val)));
}

namespace detail {
/// erfc by type (kept private: gelu needs it for its left tail, where 1 + erf(x) cancels).
template <class T>
DUALCAST_HD DUALCAST_INLINE T erfc_of(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return ::erfcf(x);
  } else if constexpr (std::is_same_v<T, double>) {
    return ::erfc(x);
  } else {
    return ::erfcl(x);
  }
}
}  // namespace detail

/// gelu(x) = x Phi(x), the exact (erf) form, with Phi the standard normal CDF. Phi is computed as
/// erfc(-x / sqrt(2)) / 2, which keeps full relative accuracy in the left tail (0.5 * (1 + erf(x /
/// sqrt(2))) cancels to 0 below x ~ -6 in float); gelu(x) underflows to -0 only where x Phi(x) does.
template <class T>
  requires std::is_floating_point_v<T>
DUALCAST_HD DUALCAST_INLINE T gelu(T x) {
  constexpr T rsqrt2 = T(0.707106781186547524400844362104849039);
  return T(0.5) * x * detail::erfc_of(-x * rsqrt2);
}
/// d/dx gelu(x) = Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi): both terms finite for
/// every x (0 in the far left tail, 1 in the far right; no inf * 0).
template <class T, int N>
DUALCAST_HD DUALCAST_INLINE Dual<T, N> gelu(const Dual<T, N>& x) {
  constexpr T rsqrt2 = T(0.707106781186547524400844362104849039);
  constexpr T rsqrt2pi = T(0.398942280401432677939946059934381868);
  const T cdf = T(0.5) * detail::erfc_of(-x.val * rsqrt2);
  const T pdf = rsqrt2pi * exp(T(-0.5) * x.val * x.val);
  return chain(x, x.val * cdf, cdf + x.val * pdf);
}

// ---- piecewise functions -------------------------------------------------------------------------

/// d/dx |x| = sign(x), and abs'(0) = 0 (subgradient; as PyTorch). (The number version is above.)
template <class T, int N>
DUALCAST_HD DUALCAST_INLINE Dual<T, N> abs(const Dual<T, N>& x) {
  const T sign = x.val > T(0) ? T(1) : (x.val < T(0) ? T(-1) : T(0));
  return chain(x, abs(x.val), sign);
}

namespace detail {
/// a or b whole (take_a decides), or, on a tie of values, the value with the partials averaged.
template <class T, int N>
DUALCAST_HD DUALCAST_INLINE constexpr Dual<T, N> pick_or_split(const Dual<T, N>& a,
                                                               const Dual<T, N>& b, bool take_a) {
  const bool tie = a.val == b.val;
  Dual<T, N> r;
  r.val = (tie || take_a) ? a.val : b.val;
  DUALCAST_UNROLL
  for (int k = 0; k < N; ++k)
    r.d[k] = tie ? T(0.5) * (a.d[k] + b.d[k]) : (take_a ? a.d[k] : b.d[k]);
  return r;
}
}  // namespace detail

/// max(a, b) of numbers (C fmax: a NaN loses to a number), in the common type of the arguments (at
/// least one floating-point; max(0, x) works for float x).
template <class A, class B>
  requires detail::number_mix<A, B>
DUALCAST_HD DUALCAST_INLINE std::common_type_t<A, B> max(A a, B b) {
  using C = std::common_type_t<A, B>;
  if constexpr (std::is_same_v<C, float>) {
    return ::fmaxf(static_cast<C>(a), static_cast<C>(b));
  } else if constexpr (std::is_same_v<C, double>) {
    return ::fmax(static_cast<C>(a), static_cast<C>(b));
  } else {
    return ::fmaxl(static_cast<C>(a), static_cast<C>(b));
  }
}
/// max(a, b) with duals (and numbers, as constants). The larger value wins with its partials; on a
/// tie of values each side gets half (d = (da + db) / 2, as PyTorch); a NaN loses to a number (as
/// fmax).
template <class A, class B>
  requires detail::dual_mix<A, B>
DUALCAST_HD DUALCAST_INLINE detail::common_dual_t<A, B> max(const A& a, const B& b) {
  using R = detail::common_dual_t<A, B>;
  const R x = detail::as_dual<R>(a);
  const R y = detail::as_dual<R>(b);
  return detail::pick_or_split(x, y, x.val > y.val || y.val != y.val);
}

/// min(a, b) of numbers (C fmin: a NaN loses to a number), in the common type of the arguments.
template <class A, class B>
  requires detail::number_mix<A, B>
DUALCAST_HD DUALCAST_INLINE std::common_type_t<A, B> min(A a, B b) {
  using C = std::common_type_t<A, B>;
  if constexpr (std::is_same_v<C, float>) {
    return ::fminf(static_cast<C>(a), static_cast<C>(b));
  } else if constexpr (std::is_same_v<C, double>) {
    return ::fmin(static_cast<C>(a), static_cast<C>(b));
  } else {
    return ::fminl(static_cast<C>(a), static_cast<C>(b));
  }
}
/// min(a, b) with duals (and numbers, as constants). The smaller value wins with its partials; a tie
/// of values splits the partials evenly (0.5 each); a NaN loses to a number (as fmin).
template <class A, class B>
  requires detail::dual_mix<A, B>
DUALCAST_HD DUALCAST_INLINE detail::common_dual_t<A, B> min(const A& a, const B& b) {
  using R = detail::common_dual_t<A, B>;
  const R x = detail::as_dual<R>(a);
  const R y = detail::as_dual<R>(b);
  return detail::pick_or_split(x, y, x.val < y.val || y.val != y.val);
}

/// clamp(x, lo, hi) of numbers: lo if x < lo, hi if x > hi, else x (NaN stays NaN); expects
/// lo <= hi; common type of the arguments.
template <class X, class L, class H>
  requires detail::number_mix<X, L, H>
DUALCAST_HD DUALCAST_INLINE std::common_type_t<X, L, H> clamp(X x, L lo, H hi) {
  using C = std::common_type_t<X, L, H>;
  const C v = static_cast<C>(x);
  const C l = static_cast<C>(lo);
  const C h = static_cast<C>(hi);
  return v < l ? l : (v > h ? h : v);
}
/// clamp(x, lo, hi) with duals (any mix). d/dx = 1 for lo <= x <= hi INCLUSIVE (at x == lo or
/// x == hi the gradient passes to x, as PyTorch), 0 outside; outside, the result is lo (or hi) with
/// lo's (hi's) own partials when the bound is a dual.
template <class X, class L, class H>
  requires detail::dual_mix<X, L, H>
DUALCAST_HD DUALCAST_INLINE detail::common_dual_t<X, L, H> clamp(const X& x, const L& lo,
                                                                 const H& hi) {
  using R = detail::common_dual_t<X, L, H>;
  constexpr int N = R::size;
  const R v = detail::as_dual<R>(x);
  const R l = detail::as_dual<R>(lo);
  const R h = detail::as_dual<R>(hi);
  const bool below = v.val < l.val;
  const bool above = v.val > h.val;
  R r;
  r.val = below ? l.val : (above ? h.val : v.val);
  DUALCAST_UNROLL
  for (int k = 0; k < N; ++k) r.d[k] = below ? l.d[k] : (above ? h.d[k] : v.d[k]);
  return r;
}

/// select(cond, a, b) of numbers: cond ? a : b in the common type (a branch-free `where`).
template <class A, class B>
  requires(std::is_arithmetic_v<A> && std::is_arithmetic_v<B>)
DUALCAST_HD DUALCAST_INLINE constexpr std::common_type_t<A, B> select(bool cond, A a, B b) {
  using C = std::common_type_t<A, B>;
  return cond ? static_cast<C>(a) : static_cast<C>(b);
}
/// select(cond, a, b) with duals (any mix): the chosen side whole, value and partials (a number
/// becomes a constant). The gradient flows only into the chosen side.
template <class A, class B>
  requires detail::dual_mix<A, B>
DUALCAST_HD DUALCAST_INLINE constexpr detail::common_dual_t<A, B> select(bool cond, const A& a,
                                                                         const B& b) {
  using R = detail::common_dual_t<A, B>;
  return cond ? detail::as_dual<R>(a) : detail::as_dual<R>(b);
}

// ---- two- and three-argument functions -----------------------------------------------------------

/// hypot(a, b) = sqrt(a^2 + b^2) without overflow (same floating-point type).
DUALCAST_C_BINARY(hypot, hypot)
/// hypot with duals (any mix).  d/da = a / h, d/db = b / h with h = hypot(a, b). At a = b = 0 both
/// partials are 0 (subgradient, as abs'(0) = 0; no 0/0 NaN); if h is infinite they are 0 too.
template <class A, class B>
  requires detail::dual_mix<A, B>
DUALCAST_HD DUALCAST_INLINE detail::common_dual_t<A, B> hypot(const A& a, const B& b) {
  using R = detail::common_dual_t<A, B>;
  using T = typename R::scalar_type;
  constexpr int N = R::size;
  const T va = static_cast<T>(value(a));
  const T vb = static_cast<T>(value(b));
  const T h = hypot(va, vb);
  const T inv = (h == T(0)) ? T(0) : T(1) / h;
  const T dfda = va * inv;
  const T dfdb = vb * inv;
  R r;
  r.val = h;
  DUALCAST_UNROLL
  for (int k = 0; k < N; ++k) {
    T dk = T(0);
    if constexpr (is_dual_v<A>) dk = dfda * a.d[k];
    if constexpr (is_dual_v<B>) dk = dk + dfdb * b.d[k];
    r.d[k] = dk;
  }
  return r;
}

/// fma(a, b, c) = a * b + c with one rounding (same floating-point type).
template <class T>
  requires std::is_floating_point_v<T>
DUALCAST_HD DUALCAST_INLINE T fma(T a, T b, T c) {
  if constexpr (std::is_same_v<T, float>) {
    return ::fmaf(a, b, c);
  } else if constexpr (std::is_same_v<T, double>) {
    return ::fma(a, b, c);
  } else {
    return ::fmal(a, b, c);
  }
}
/// fma with duals (any mix).  d(a*b + c) = da * b + a * db + dc; the value is the fused fma.
template <class A, class B, class C>
  requires detail::dual_mix<A, B, C>
DUALCAST_HD DUALCAST_INLINE detail::common_dual_t<A, B, C> fma(const A& a, const B& b, const C& c) {
  using R = detail::common_dual_t<A, B, C>;
  using T = typename R::scalar_type;
  constexpr int N = R::size;
  const T va = static_cast<T>(value(a));
  const T vb = static_cast<T>(value(b));
  const T vc = static_cast<T>(value(c));
  R r;
  r.val = fma(va, vb, vc);
  DUALCAST_UNROLL
  for (int k = 0; k < N; ++k) {
    T dk = T(0);
    if constexpr (is_dual_v<A>) dk = a.d[k] * vb;
    if constexpr (is_dual_v<B>) dk = dk + va * b.d[k];
    if constexpr (is_dual_v<C>) dk = dk + c.d[k];
    r.d[k] = dk;
  }
  return r;
}

#undef DUALCAST_C_UNARY
#undef DUALCAST_C_BINARY

}  // namespace dualcast
