// ops/elementwise.hpp: elementwise operations on Var and Tensor with NumPy broadcasting. Each call is
// its own kernel and its own tape node, as in PyTorch eager: this is the pure reverse-mode baseline.
// Every function that exists for Dual exists here with the same name, so one functor written with
// select() instead of if runs on Vars (one kernel per primitive) and on duals (one fused kernel).
//
// Each op is a broadcast of a one-primitive functor with Partials::recompute: its backward kernel
// re-evaluates the primitive on a dual number from the saved inputs, so the derivative rule is the
// one written beside the value rule in math.hpp. Functions on Tensors alone compute without a tape.
#pragma once

#include "dualcast/tape.hpp"
#include "dualcast/tensor.hpp"

namespace dualcast {

// ---- arithmetic (Var, Tensor and numbers mix; a Tensor is a constant) ----------------------------
Var operator+(const Var& a, const Var& b);
Var operator-(const Var& a, const Var& b);
Var operator*(const Var& a, const Var& b);
Var operator/(const Var& a, const Var& b);
Var operator+(const Var& a, double b);
Var operator-(const Var& a, double b);
Var operator*(const Var& a, double b);
Var operator/(const Var& a, double b);
Var operator+(double a, const Var& b);
Var operator-(double a, const Var& b);
Var operator*(double a, const Var& b);
Var operator/(double a, const Var& b);
Var operator-(const Var& a);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);
Tensor operator-(const Tensor& a);

// ---- unary functions ----------------------------------------------------------------------------
/// Every unary function, one X(name) each: the list declares `Var name(const Var&)` and
/// `Tensor name(const Tensor&)` here, defines them and their functors (src/elementwise_unary*.cu),
/// and drives the device test of tests/test_math.cu and the fuzzer (tests/fuzz), so adding a
/// function is its value and derivative rule in math.hpp, its name in one of the two halves here
/// and one test line (docs/design.md, "How an elementwise op is added"). gelu is the exact erf
/// form, x Phi(x). The halves are defined in two translation units that compile side by side.
#define DUALCAST_UNARY_FUNCTIONS_A(X) X(exp) X(expm1) X(log) X(log1p) X(sqrt) X(cbrt) X(sin) X(cos)
#define DUALCAST_UNARY_FUNCTIONS_B(X) \
  X(tan) X(tanh) X(sigmoid) X(softplus) X(erf) X(gelu) X(abs) X(relu)
#define DUALCAST_UNARY_FUNCTIONS(X) DUALCAST_UNARY_FUNCTIONS_A(X) DUALCAST_UNARY_FUNCTIONS_B(X)

#define DUALCAST_DECLARE_UNARY(name) \
  Var name(const Var& x);            \
  Tensor name(const Tensor& x);
DUALCAST_UNARY_FUNCTIONS(DUALCAST_DECLARE_UNARY)
#undef DUALCAST_DECLARE_UNARY

// ---- binary and ternary functions ----------------------------------------------------------------
/// Every binary function, one X(name, first argument's name, second's) each, declared for two Vars
/// and for a Var with a number on either side, and used like DUALCAST_UNARY_FUNCTIONS. min and max
/// split the gradient evenly on ties (as in PyTorch); pow(x, p) is x^p with p differentiable too.
#define DUALCAST_BINARY_FUNCTIONS(X) X(pow, x, p) X(min, a, b) X(max, a, b) X(hypot, a, b)

#define DUALCAST_DECLARE_BINARY(name, a, b) \
  Var name(const Var& a, const Var& b);     \
  Var name(const Var& a, double b);         \
  Var name(double a, const Var& b);
DUALCAST_BINARY_FUNCTIONS(DUALCAST_DECLARE_BINARY)
#undef DUALCAST_DECLARE_BINARY
Tensor pow(const Tensor& x, double p);
Var fma(const Var& a, const Var& b, const Var& c);
/// Clamps to [lo, hi]; the gradient passes where lo <= x <= hi.
Var clamp(const Var& x, double lo, double hi);
Tensor clamp(const Tensor& x, double lo, double hi);

/// mask ? a : b elementwise (mask: uint8 or 0/1 floats, broadcast with a and b). Not
/// differentiable in mask; a gets the adjoint where mask holds, b elsewhere.
Var select(const Tensor& mask, const Var& a, const Var& b);
Var select(const Tensor& mask, const Var& a, double b);
Var select(const Tensor& mask, double a, const Var& b);
Tensor select(const Tensor& mask, const Tensor& a, const Tensor& b);

// ---- comparisons: masks (uint8 tensors), never differentiable; they compare values only -------
#define DUALCAST_DECLARE_COMPARISON(op)              \
  Tensor operator op(const Tensor& a, const Tensor& b); \
  Tensor operator op(const Tensor& a, double b);        \
  Tensor operator op(double a, const Tensor& b);        \
  Tensor operator op(const Var& a, const Var& b);       \
  Tensor operator op(const Var& a, double b);           \
  Tensor operator op(double a, const Var& b);
DUALCAST_DECLARE_COMPARISON(==)
DUALCAST_DECLARE_COMPARISON(!=)
DUALCAST_DECLARE_COMPARISON(<)
DUALCAST_DECLARE_COMPARISON(<=)
DUALCAST_DECLARE_COMPARISON(>)
DUALCAST_DECLARE_COMPARISON(>=)
#undef DUALCAST_DECLARE_COMPARISON

/// Logical operations on masks.
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_not(const Tensor& a);

}  // namespace dualcast
