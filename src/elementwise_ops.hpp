// elementwise_ops.hpp (private): the one-primitive functors behind ops/elementwise.hpp. Each is a
// broadcast function in its own right (numbers and duals alike), so the reverse-mode baseline's
// derivative rules are math.hpp's.
#pragma once

#include "dualcast/broadcast.hpp"
#include "dualcast/math.hpp"
#include "dualcast/ops/elementwise.hpp"

namespace dualcast::detail::ew {

struct Add { DUALCAST_HD auto operator()(auto a, auto b) const { return a + b; } };
struct Sub { DUALCAST_HD auto operator()(auto a, auto b) const { return a - b; } };
struct Mul { DUALCAST_HD auto operator()(auto a, auto b) const { return a * b; } };
struct Div { DUALCAST_HD auto operator()(auto a, auto b) const { return a / b; } };
struct Neg { DUALCAST_HD auto operator()(auto a) const { return -a; } };
struct Pow { DUALCAST_HD auto operator()(auto a, auto b) const { return pow(a, b); } };
struct Min { DUALCAST_HD auto operator()(auto a, auto b) const { return min(a, b); } };
struct Max { DUALCAST_HD auto operator()(auto a, auto b) const { return max(a, b); } };
struct Hypot { DUALCAST_HD auto operator()(auto a, auto b) const { return hypot(a, b); } };
struct Fma { DUALCAST_HD auto operator()(auto a, auto b, auto c) const { return fma(a, b, c); } };
struct Clamp { DUALCAST_HD auto operator()(auto x, auto lo, auto hi) const { return clamp(x, lo, hi); } };
/// mask arrives as a number of the element type (0 or 1).
struct Select {
  DUALCAST_HD auto operator()(auto mask, auto a, auto b) const { return select(mask != 0, a, b); }
};

#define DUALCAST_UNARY_FUNCTOR(Name, fn) \
  struct Name {                          \
    DUALCAST_HD auto operator()(auto x) const { return fn(x); } \
  };
DUALCAST_UNARY_FUNCTOR(Exp, exp)
DUALCAST_UNARY_FUNCTOR(Expm1, expm1)
DUALCAST_UNARY_FUNCTOR(Log, log)
DUALCAST_UNARY_FUNCTOR(Log1p, log1p)
DUALCAST_UNARY_FUNCTOR(Sqrt, sqrt)
DUALCAST_UNARY_FUNCTOR(Cbrt, cbrt)
DUALCAST_UNARY_FUNCTOR(Sin, sin)
DUALCAST_UNARY_FUNCTOR(Cos, cos)
DUALCAST_UNARY_FUNCTOR(Tan, tan)
DUALCAST_UNARY_FUNCTOR(Tanh, tanh)
DUALCAST_UNARY_FUNCTOR(Sigmoid, sigmoid)
DUALCAST_UNARY_FUNCTOR(Softplus, softplus)
DUALCAST_UNARY_FUNCTOR(Erf, erf)
DUALCAST_UNARY_FUNCTOR(Gelu, gelu)
DUALCAST_UNARY_FUNCTOR(Abs, abs)
DUALCAST_UNARY_FUNCTOR(Relu, relu)
#undef DUALCAST_UNARY_FUNCTOR

/// Every elementwise op is recorded with recompute: nothing but the inputs is saved, like eager
/// frameworks that save an op's inputs.
template <class F, class... Args>
auto apply(const F& f, const Args&... args) {
  return broadcast_impl</*kStorable=*/false>(Partials::recompute, f, args...);
}

}  // namespace dualcast::detail::ew
