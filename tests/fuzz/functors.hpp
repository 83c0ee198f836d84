// functors.hpp: the broadcast functions the fuzzer draws from: namespace-scope functors of any arity
// (README "Writing broadcast functions"), with data-dependent branches, early returns and a loop with
// a data-dependent exit, one, two or three outputs. reference_functions.hpp holds their values and
// derivatives, written by hand; the two must change together.
//
// Every branch tests raw argument values against each other or against dyadic constants (exact in
// float and double), so float32 and the double reference always take the same branch.
#pragma once

#include <tuple>
#include <type_traits>
#include <utility>

#include "dualcast/dual.hpp"
#include "dualcast/math.hpp"

namespace fuzz {

/// The type every argument is lifted to: the arguments' common Dual<T, K>, or T when f is called
/// on plain numbers (the forward pass without stored partials).
template <class X0, class... X>
struct Lifted {
  using T = dualcast::scalar_t<X0>;
  using D = typename dualcast::detail::common_dual<X0, X...>::type;
  using R = std::conditional_t<std::is_void_v<D>, T, D>;
};

template <class R, class X>
DUALCAST_HD DUALCAST_INLINE R lift(const X& x) {
  if constexpr (dualcast::is_dual_v<R> && !dualcast::is_dual_v<X>) return R::constant(x);
  else return x;
}

struct BranchChain {
  template <class... X>
  DUALCAST_HD auto operator()(X... xs) const {
    using namespace dualcast;
    using L = Lifted<X...>;
    using R = typename L::R;
    using T = typename L::T;
    constexpr int n = static_cast<int>(sizeof...(X));
    const R a[n] = {lift<R>(xs)...};
    R acc = a[0] * T(0.5);
    for (int i = 0; i < n; ++i) {
      const R x = a[i], y = a[(i + 1) % n];
      if (x > y) acc = acc + tanh(x) * y;
      else if (x < T(-0.5)) acc = acc - sigmoid(y) * x;
      else acc = acc + x * x * T(0.25) - sin(y);
    }
    return acc;
  }
};

struct EarlyExit {
  template <class... X>
  DUALCAST_HD auto operator()(X... xs) const {
    using namespace dualcast;
    using L = Lifted<X...>;
    using R = typename L::R;
    using T = typename L::T;
    constexpr int n = static_cast<int>(sizeof...(X));
    const R a[n] = {lift<R>(xs)...};
    if (a[0] > T(1.5)) return a[n - 1] * T(2) - relu(a[0]);
    R s = lift<R>(T(0));
    for (int i = 0; i < n; ++i) {
      if (a[i] < T(-1.25)) return s + abs(a[i]) * T(0.5);
      s = s + softplus(a[i]) * T(0.125 * (i + 1)) + max(a[i], a[(i + 1) % n]) * T(0.25);
    }
    const R& l = a[n - 1];
    const R& h = a[n / 2];
    return s * clamp(l, T(-0.5), T(0.75)) + hypot(a[0], l) + relu(h) - fma(a[0], l, h);
  }
};

struct PairOut {
  template <class... X>
  DUALCAST_HD auto operator()(X... xs) const {
    using namespace dualcast;
    using L = Lifted<X...>;
    using R = typename L::R;
    using T = typename L::T;
    constexpr int n = static_cast<int>(sizeof...(X));
    const R a[n] = {lift<R>(xs)...};
    R m = a[0];
    for (int i = 1; i < n; ++i)
      if (a[i] > m) m = a[i];
    R p = lift<R>(T(1));
    for (int i = 0; i < n; ++i) p = p * (T(1) + sin(a[i]) * T(0.25));
    if (a[0] > T(0.25)) return std::pair<R, R>(m * p, p - a[n - 1]);
    return std::pair<R, R>(p + m * T(0.5), expm1(a[n - 1] * T(0.5)));
  }
};

struct TripleOut {
  template <class... X>
  DUALCAST_HD auto operator()(X... xs) const {
    using namespace dualcast;
    using L = Lifted<X...>;
    using R = typename L::R;
    using T = typename L::T;
    constexpr int n = static_cast<int>(sizeof...(X));
    const R a[n] = {lift<R>(xs)...};
    R o0 = lift<R>(T(0));
    for (int i = 0; i < n; ++i) o0 = o0 + tanh(a[i]) * T(i % 2 == 0 ? 0.5 : -0.25);
    R r = a[0];
    for (int i = 1; i < n; ++i) r = min(r, a[i]);
    const R q = T(1) + a[0] * a[0];
    const R o2 = a[n - 1] >= a[0] ? a[n - 1] / q : log1p(a[0] * a[0]);
    return std::tuple<R, R, R>(o0, r, o2);
  }
};

}  // namespace fuzz
