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
#define DUALCAST_DECLARE_UNARY(name) \
  Var name(const Var& x);            \
  Tensor name(const Tensor& x);
DUALCAST_DECLARE_UNARY(exp)
DUALCAST_DECLARE_UNARY(expm1)
DUALCAST_DECLARE_UNARY(log)
DUALCAST_DECLARE_UNARY(log1p)
DUALCAST_DECLARE_UNARY(sqrt)
DUALCAST_DECLARE_UNARY(cbrt)
DUALCAST_DECLARE_UNARY(sin)
DUALCAST_DECLARE_UNARY(cos)
DUALCAST_DECLARE_UNARY(tan)
DUALCAST_DECLARE_UNARY(tanh)
DUALCAST_DECLARE_UNARY(sigmoid)
DUALCAST_DECLARE_UNARY(softplus)
DUALCAST_DECLARE_UNARY(erf)
DUALCAST_DECLARE_UNARY(gelu)  // exact erf form: x Phi(x) (math.hpp)
DUALCAST_DECLARE_UNARY(abs)
DUALCAST_DECLARE_UNARY(relu)
#undef DUALCAST_DECLARE_UNARY

// ---- binary and ternary functions ----------------------------------------------------------------
Var pow(const Var& x, const Var& p);
Var pow(const Var& x, double p);
Var pow(double x, const Var& p);
Tensor pow(const Tensor& x, double p);
/// Elementwise minimum/maximum; ties split the gradient evenly (as in PyTorch).
Var min(const Var& a, const Var& b);
Var max(const Var& a, const Var& b);
Var min(const Var& a, double b);
Var max(const Var& a, double b);
Var min(double a, const Var& b);
Var max(double a, const Var& b);
Var hypot(const Var& a, const Var& b);
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
