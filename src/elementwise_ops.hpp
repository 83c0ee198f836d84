// elementwise_ops.hpp (private): the one-primitive functors behind ops/elementwise.hpp. Each is a
// broadcast function in its own right (numbers and duals alike), so the reverse-mode baseline's
// derivative rules are math.hpp's.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "dualcast/broadcast.hpp"
#include "dualcast/error.hpp"
#include "dualcast/math.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "dualcast/shape.hpp"

namespace dualcast::detail::ew {

// Each functor carries the name of its op and of its arguments, for error messages.
#define DUALCAST_OP_NAMES(op, ...)                \
  static constexpr const char* name = op;       \
  static constexpr const char* arg_names[] = {__VA_ARGS__};

struct Add {
  DUALCAST_OP_NAMES("operator+", "a", "b")
  DUALCAST_HD auto operator()(auto a, auto b) const { return a + b; }
};
struct Sub {
  DUALCAST_OP_NAMES("operator-", "a", "b")
  DUALCAST_HD auto operator()(auto a, auto b) const { return a - b; }
};
struct Mul {
  DUALCAST_OP_NAMES("operator*", "a", "b")
  DUALCAST_HD auto operator()(auto a, auto b) const { return a * b; }
};
struct Div {
  DUALCAST_OP_NAMES("operator/", "a", "b")
  DUALCAST_HD auto operator()(auto a, auto b) const { return a / b; }
};
struct Neg {
  DUALCAST_OP_NAMES("operator-", "a")
  DUALCAST_HD auto operator()(auto a) const { return -a; }
};
struct Fma {
  DUALCAST_OP_NAMES("fma", "a", "b", "c")
  DUALCAST_HD auto operator()(auto a, auto b, auto c) const { return fma(a, b, c); }
};
struct Clamp {
  DUALCAST_OP_NAMES("clamp", "x", "lo", "hi")
  DUALCAST_HD auto operator()(auto x, auto lo, auto hi) const { return clamp(x, lo, hi); }
};
/// mask arrives as a number of the element type (0 or 1).
struct Select {
  DUALCAST_OP_NAMES("select", "mask", "a", "b")
  DUALCAST_HD auto operator()(auto mask, auto a, auto b) const { return select(mask != 0, a, b); }
};

// The functors of the listed functions (ops/elementwise.hpp): op_exp, ..., op_pow, op_hypot.
#define DUALCAST_UNARY_FUNCTOR(fn)                              \
  struct op_##fn {                                              \
    DUALCAST_OP_NAMES(#fn, "x")                                 \
    DUALCAST_HD auto operator()(auto x) const { return fn(x); } \
  };
DUALCAST_UNARY_FUNCTIONS(DUALCAST_UNARY_FUNCTOR)
#undef DUALCAST_UNARY_FUNCTOR

#define DUALCAST_BINARY_FUNCTOR(fn, a, b)                                  \
  struct op_##fn {                                                         \
    DUALCAST_OP_NAMES(#fn, #a, #b)                                         \
    DUALCAST_HD auto operator()(auto x, auto y) const { return fn(x, y); } \
  };
DUALCAST_BINARY_FUNCTIONS(DUALCAST_BINARY_FUNCTOR)
#undef DUALCAST_BINARY_FUNCTOR

#undef DUALCAST_OP_NAMES

/// One argument of an elementwise op, for the checks below: a Var, a Tensor (a select mask) or a
/// number (no tensor).
struct EwOperand {
  const char* name;
  const Tensor* tensor = nullptr;
  bool undefined_var = false;
  bool mask = false;
};

template <class A>
EwOperand ew_operand(const char* name, const A& a) {
  EwOperand o{name};
  if constexpr (std::is_same_v<A, Var>) {
    o.undefined_var = !a.defined();
    if (!o.undefined_var) o.tensor = &a.value();
  } else if constexpr (std::is_same_v<A, Tensor>) {
    o.tensor = &a;
    o.mask = true;
  }
  return o;
}

/// Whether the arguments pass broadcast()'s checks (defined, one device, dtypes that promote or a
/// uint8 mask, shapes that broadcast), found without allocating: the common case costs a few compares.
inline bool ew_operands_ok(const EwOperand* args, std::size_t n) {
  const Tensor* ref = nullptr;
  int rank = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const EwOperand& a = args[i];
    if (a.undefined_var || (a.tensor && !a.tensor->defined())) return false;
    if (!a.tensor) continue;
    rank = a.tensor->rank() > rank ? a.tensor->rank() : rank;
    if (a.mask && a.tensor->dtype() == DType::uint8) continue;
    if (!ref) ref = a.tensor;
    else if (a.tensor->device() != ref->device() || !promotable(a.tensor->dtype(), ref->dtype()))
      return false;
  }
  for (std::size_t i = 0; ref && i < n; ++i)
    if (args[i].tensor && args[i].tensor->device() != ref->device()) return false;
  for (int j = 0; j < rank; ++j) {  // dimension j from the back: sizes equal or 1
    std::int64_t out = 1;
    for (std::size_t i = 0; i < n; ++i) {
      if (!args[i].tensor || args[i].tensor->rank() <= j) continue;
      const std::int64_t d = args[i].tensor->shape()[args[i].tensor->rank() - 1 - j];
      if (d == 1 || d == out) continue;
      if (out != 1) return false;
      out = d;
    }
  }
  return true;
}

/// broadcast()'s argument checks in the op's own name and with its arguments' names (broadcast()
/// would name itself and call the arguments #0, #1, ...); throws on the first problem.
inline void report_ew_operands(const char* op, const EwOperand* args, std::size_t n) {
  const EwOperand* ref = nullptr;
  std::vector<NamedShape> shapes;
  for (std::size_t i = 0; i < n; ++i) {
    const EwOperand& a = args[i];
    DUALCAST_CHECK(!a.undefined_var, op, ": argument '", a.name, "' is an undefined Var");
    if (!a.tensor) continue;
    check_defined(*a.tensor, op, a.name);
    shapes.push_back({a.name, a.tensor->shape()});
    if (a.mask) continue;
    if (!ref) ref = &a;
    else if (a.tensor->device() != ref->tensor->device() ||
             !promotable(a.tensor->dtype(), ref->tensor->dtype()))
      check_same_device_dtype(op, ref->name, *ref->tensor, a.name, *a.tensor);
  }
  for (std::size_t i = 0; ref && i < n; ++i) {
    const EwOperand& a = args[i];
    if (!a.mask) continue;
    DUALCAST_CHECK(a.tensor->device() == ref->tensor->device(), op, ": arguments on different "
                   "devices: '", a.name, "' ", a.tensor->shape().str(), " on ",
                   a.tensor->device().str(), ", '", ref->name, "' ", ref->tensor->shape().str(),
                   " on ", ref->tensor->device().str());
    DUALCAST_CHECK(a.tensor->dtype() == DType::uint8 || promotable(a.tensor->dtype(), ref->tensor->dtype()), op,
                   ": argument '", a.name, "' ", a.tensor->shape().str(), " is ",
                   dtype_name(a.tensor->dtype()), "; expected uint8 or ",
                   dtype_name(ref->tensor->dtype()), " like '", ref->name, "'");
  }
  if (!shapes.empty()) (void)broadcast_shapes(op, shapes);
}

/// Every elementwise op is recorded with recompute: nothing but the inputs is saved, like eager
/// frameworks that save an op's inputs.
template <class F, class... Args>
auto apply(const F& f, const Args&... args) {
  std::size_t i = 0;
  const std::array<EwOperand, sizeof...(Args)> ops{ew_operand(F::arg_names[i++], args)...};
  if (!ew_operands_ok(ops.data(), ops.size())) report_ew_operands(F::name, ops.data(), ops.size());
  return broadcast_impl</*kStorable=*/false>(Partials::recompute, f, args...);
}

}  // namespace dualcast::detail::ew

/// Defines a listed unary function on Var and Tensor as one broadcast of its functor (used with
/// DUALCAST_UNARY_FUNCTIONS_A and _B, each half in its own translation unit).
#define DUALCAST_DEFINE_UNARY(fn)                     \
  Var fn(const Var& x) { return apply(op_##fn{}, x); } \
  Tensor fn(const Tensor& x) { return apply(op_##fn{}, Var(x)).value(); }
