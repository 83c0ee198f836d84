// dual.hpp: Dual<T, N>, a forward-mode dual number (one value, N partials), its traits, accessors,
// arithmetic and value-only comparisons. Everything here runs in host and device code.
//
// Design rules (see docs and technique.md section 1):
//  - Dual is a plain aggregate: `Dual<float, 4>{1.f, {1.f, 0.f, 0.f, 0.f}}`, trivially copyable, so
//    it travels into CUDA kernels by value and lives in registers.
//  - The partials are indexed only by loops whose trip count N is a compile-time constant, unrolled
//    (DUALCAST_UNROLL); no function here indexes d[] with a run-time index, so nvcc never has to put
//    the partials in local memory. (partial(x, k) with a run-time k selects by an unrolled loop too.)
//  - Comparisons look at values only: gradients never change control flow, and ties are never
//    broken by partials.
//  - Mixed arithmetic with a plain number of any arithmetic type (int, float, double, ...) converts
//    the number to T: Dual<float, N> + 1.0 is a Dual<float, N>.
//  - Only floating-point T (float, double) is supported; nested duals are not.
//  - Results are built as `Dual r; r.val = v;` with every partial assigned by an unrolled loop, never
//    as `Dual{v, {}}`: that zero-initialising form is a block clear which stops GCC from keeping a
//    dual in scalars, and so from vectorising the CPU loops over elements.
#pragma once

#include <type_traits>

#include "dualcast/config.hpp"


namespace dualcast {

/// A dual number: value `val` and the N partial derivatives `d[k]` = d val / d x_k.
/// Plain aggregate (no constructors): build with `Dual<T, N>{v, {...}}`, `constant(v)` or
/// `variable(v, k)`.
template <class T, int N>
struct Dual {
  static_assert(N >= 1, "Dual<T, N> needs at least one partial (N >= 1)");
  static_assert(std::is_floating_point_v<T>, "Dual<T, N> supports floating-point T (float, double)");

  using scalar_type = T;
  static constexpr int size = N;

  T val;
  T d[N];

  /// A constant: value v, every partial 0.
  DUALCAST_HD static constexpr Dual constant(T v) {
    Dual r;
    r.val = v;
    DUALCAST_UNROLL
    for (int i = 0; i < N; ++i) r.d[i] = T(0);
    return r;
  }

  /// The k-th independent variable: value v, partial k = 1, the others 0 (k in [0, N); any other k
  /// gives a constant).
  DUALCAST_HD static constexpr Dual variable(T v, int k) {
    Dual r;
    r.val = v;
    DUALCAST_UNROLL
    for (int i = 0; i < N; ++i) r.d[i] = (i == k) ? T(1) : T(0);
    return r;
  }
};

// ---- traits --------------------------------------------------------------------------------------

namespace detail {
template <class X>
struct is_dual : std::false_type {};
template <class T, int N>
struct is_dual<Dual<T, N>> : std::true_type {};

template <class X>
struct dual_size : std::integral_constant<int, 0> {};
template <class T, int N>
struct dual_size<Dual<T, N>> : std::integral_constant<int, N> {};

template <class X, class = void>
struct scalar_of {};  // neither dual nor arithmetic: no `type` (SFINAE-friendly)
template <class X>
struct scalar_of<X, std::enable_if_t<std::is_arithmetic_v<X>>> {
  using type = X;
};
template <class T, int N>
struct scalar_of<Dual<T, N>, void> {
  using type = T;
};
}  // namespace detail

/// True for Dual<T, N> (cv/ref-qualified too), false for everything else.
template <class X>
inline constexpr bool is_dual_v = detail::is_dual<std::remove_cvref_t<X>>::value;

/// N for Dual<T, N>, 0 for anything else (plain numbers).
template <class X>
inline constexpr int dual_size_v = detail::dual_size<std::remove_cvref_t<X>>::value;

/// T for Dual<T, N>, X itself for an arithmetic type X.
template <class X>
using scalar_t = typename detail::scalar_of<std::remove_cvref_t<X>>::type;

namespace detail {
/// A plain number usable next to a dual: any arithmetic type (it is converted to the dual's T).
template <class S>
concept dual_scalar = std::is_arithmetic_v<std::remove_cvref_t<S>>;
}  // namespace detail

// ---- accessors -----------------------------------------------------------------------------------

/// The value of a dual.
template <class T, int N>
DUALCAST_HD DUALCAST_INLINE constexpr T value(const Dual<T, N>& x) {
  return x.val;
}
/// The value of a plain number: the number itself.
template <class S>
  requires std::is_arithmetic_v<S>
DUALCAST_HD DUALCAST_INLINE constexpr S value(S x) {
  return x;
}

/// Partial k of a dual (0 for k outside [0, N)). Selects by an unrolled loop, so a run-time k does
/// not force the partials out of registers.
template <class T, int N>
DUALCAST_HD DUALCAST_INLINE constexpr T partial(const Dual<T, N>& x, int k) {
  T r = T(0);
  DUALCAST_UNROLL
  for (int i = 0; i < N; ++i) r = (i == k) ? x.d[i] : r;
  return r;
}
/// Partial k of a plain number: 0 (a number is a constant).
template <class S>
  requires std::is_arithmetic_v<S>
DUALCAST_HD DUALCAST_INLINE constexpr S partial(S, int) {
  return S(0);
}

// ---- unary plus and minus ------------------------------------------------------------------------

template <class T, int N>
DUALCAST_HD DUALCAST_INLINE constexpr Dual<T, N> operator+(const Dual<T, N>& a) {
  return a;
}
template <class T, int N>
DUALCAST_HD DUALCAST_INLINE constexpr Dual<T, N> operator-(const Dual<T, N>& a) {
  Dual<T, N> r;
  r.val = -a.val;
  DUALCAST_UNROLL
  for (int k = 0; k < N; ++k) r.d[k] = -a.d[k];
  return r;
}

// ---- binary arithmetic ---------------------------------------------------------------------------
// d(a + b) = da + db;  d(a - b) = da - db;  d(a * b) = da * b + a * db;
// d(a / b) = (da - (a / b) * db) / b.  A plain number s is a constant: ds = 0.

template <class T, int N>
DUALCAST_HD DUALCAST_INLINE constexpr Dual<T, N> operator+(const Dual<T, N>& a, const Dual<T, N>& b) {
  Dual<T, N> r;
  r.val = a.val + b.val;
  DUALCAST_UNROLL
  for (int k = 0; k < N; ++k) r.d[k] = a.d[k] + b.d[k];
  return r;
}
template <class T, int N, detail::dual_scalar S>
DUALCAST_HD DUALCAST_INLINE constexpr Dual<T, N> operator+(const Dual<T, N>& a, S s) {
  Dual<T, N> r = a;
  r.val += static_cast<T>(s);
  return r;
}
template <class T, int N, detail::dual_scalar S>
DUALCAST_HD DUALCAST_INLINE constexpr Dual<T, N> operator+(S s, const Dual<T, N>& a) {
  Dual<T, N> r = a;
  r.val = static_cast<T>(s) + a.val;
  return r;
}

template <class T, int N>
DUALCAST_HD DUALCAST_INLINE constexpr Dual<T, N> operator-(const Dual<T, N>& a, const Dual<T, N>& b) {
  Dual<T, N> r;
  r.val = a.val - b.val;
  DUALCAST_UNROLL
  for (int k = 0; k < N; ++k) r.d[k] = a.d[k] - b.d[k];
  return r;
}
template <class T, int N, detail::dual_scalar S>
DUALCAST_HD DUALCAST_INLINE constexpr Dual<T, N> operator-(const Dual<T, N>& a, S s) {
  Dual<T, N> r = a;
  r.val -= static_cast<T>(s);
  return r;
}
template <class T, int N, detail::dual_scalar S>
DUALCAST_HD DUALCAST_INLINE constexpr Dual<T, N> operator-(S s, const Dual<T, N>& a) {
  Dual<T, N> r;
  r.val = static_cast<T>(s) - a.val;
  DUALCAST_UNROLL
  for (int k = 0; k < N; ++k) r.d[k] = -a.d[k];
  return r;
}

template <class T, int N>
DUALCAST_HD DUALCAST_INLINE constexpr Dual<T, N> operator*(const Dual<T, N>& a, const Dual<T, N>& b) {
  Dual<T, N> r;
  r.val = a.val * b.val;
  DUALCAST_UNROLL
  for (int k = 0; k < N; ++k) r.d[k] = a.d[k] * b.val + a.val * b.d[k];
  return r;
}
template <class T, int N, detail::dual_scalar S>
DUALCAST_HD DUALCAST_INLINE constexpr Dual<T, N> operator*(const Dual<T, N>& a, S s) {
  const T c = static_cast<T>(s);
  Dual<T, N> r;
  r.val = a.val * c;
  DUALCAST_UNROLL
  for (int k = 0; k < N; ++k) r.d[k] = a.d[k] * c;
  return r;
}
template <class T, int N, detail::dual_scalar S>
DUALCAST_HD DUALCAST_INLINE constexpr Dual<T, N> operator*(S s, const Dual<T, N>& a) {
  return a * s;
}

/// a / b: the value is the correctly rounded quotient; the partials use one reciprocal of b.
template <class T, int N>
DUALCAST_HD DUALCAST_INLINE constexpr Dual<T, N> operator/(const Dual<T, N>& a, const Dual<T, N>& b) {
  const T q = a.val / b.val;
  const T inv = T(1) / b.val;
  Dual<T, N> r;
  r.val = q;
  DUALCAST_UNROLL
  for (int k = 0; k < N; ++k) r.d[k] = (a.d[k] - q * b.d[k]) * inv;
  return r;
}
template <class T, int N, detail::dual_scalar S>
DUALCAST_HD DUALCAST_INLINE constexpr Dual<T, N> operator/(const Dual<T, N>& a, S s) {
  const T c = static_cast<T>(s);
  const T inv = T(1) / c;
  Dual<T, N> r;
  r.val = a.val / c;
  DUALCAST_UNROLL
  for (int k = 0; k < N; ++k) r.d[k] = a.d[k] * inv;
  return r;
}
/// s / b: d = -(s / b) / b * db.
template <class T, int N, detail::dual_scalar S>
DUALCAST_HD DUALCAST_INLINE constexpr Dual<T, N> operator/(S s, const Dual<T, N>& b) {
  const T q = static_cast<T>(s) / b.val;
  const T g = -q / b.val;
  Dual<T, N> r;
  r.val = q;
  DUALCAST_UNROLL
  for (int k = 0; k < N; ++k) r.d[k] = g * b.d[k];
  return r;
}

// ---- compound assignment -------------------------------------------------------------------------

template <class T, int N>
DUALCAST_HD DUALCAST_INLINE constexpr Dual<T, N>& operator+=(Dual<T, N>& a, const Dual<T, N>& b) {
  return a = a + b;
}
template <class T, int N, detail::dual_scalar S>
DUALCAST_HD DUALCAST_INLINE constexpr Dual<T, N>& operator+=(Dual<T, N>& a, S s) {
  return a = a + s;
}
template <class T, int N>
DUALCAST_HD DUALCAST_INLINE constexpr Dual<T, N>& operator-=(Dual<T, N>& a, const Dual<T, N>& b) {
  return a = a - b;
}
template <class T, int N, detail::dual_scalar S>
DUALCAST_HD DUALCAST_INLINE constexpr Dual<T, N>& operator-=(Dual<T, N>& a, S s) {
  return a = a - s;
}
template <class T, int N>
DUALCAST_HD DUALCAST_INLINE constexpr Dual<T, N>& operator*=(Dual<T, N>& a, const Dual<T, N>& b) {
  return a = a * b;
}
template <class T, int N, detail::dual_scalar S>
DUALCAST_HD DUALCAST_INLINE constexpr Dual<T, N>& operator*=(Dual<T, N>& a, S s) {
  return a = a * s;
}
template <class T, int N>
DUALCAST_HD DUALCAST_INLINE constexpr Dual<T, N>& operator/=(Dual<T, N>& a, const Dual<T, N>& b) {
  return a = a / b;
}
template <class T, int N, detail::dual_scalar S>
DUALCAST_HD DUALCAST_INLINE constexpr Dual<T, N>& operator/=(Dual<T, N>& a, S s) {
  return a = a / s;
}

// ---- comparisons: values only --------------------------------------------------------------------
// Two duals with equal values compare equal whatever their partials; a dual compares with a plain
// number through its value. (Breaking ties by partials gave wrong gradients in Zygote's broadcast.)

#define DUALCAST_DUAL_COMPARISON(op)                                                           \
  template <class T, int N>                                                                    \
  DUALCAST_HD DUALCAST_INLINE constexpr bool operator op(const Dual<T, N>& a,                  \
                                                         const Dual<T, N>& b) {                \
    return a.val op b.val;                                                                     \
  }                                                                                            \
  template <class T, int N, detail::dual_scalar S>                                             \
  DUALCAST_HD DUALCAST_INLINE constexpr bool operator op(const Dual<T, N>& a, S s) {           \
    return a.val op static_cast<T>(s);                                                         \
  }                                                                                            \
  template <class T, int N, detail::dual_scalar S>                                             \
  DUALCAST_HD DUALCAST_INLINE constexpr bool operator op(S s, const Dual<T, N>& a) {           \
    return static_cast<T>(s) op a.val;                                                         \
  }

DUALCAST_DUAL_COMPARISON(==)
DUALCAST_DUAL_COMPARISON(!=)
DUALCAST_DUAL_COMPARISON(<)
DUALCAST_DUAL_COMPARISON(<=)
DUALCAST_DUAL_COMPARISON(>)
DUALCAST_DUAL_COMPARISON(>=)

#undef DUALCAST_DUAL_COMPARISON

}  // namespace dualcast
