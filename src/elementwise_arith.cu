// elementwise_arith.cu: + - * / and unary minus on Var and Tensor.
#include "elementwise_ops.hpp"

namespace dualcast {
using namespace detail::ew;

#define DUALCAST_DEFINE_BINARY_OP(op, F)                                                       \
  Var operator op(const Var& a, const Var& b) { return apply(F{}, a, b); }                     \
  Var operator op(const Var& a, double b) { return apply(F{}, a, b); }                         \
  Var operator op(double a, const Var& b) { return apply(F{}, a, b); }                         \
  Tensor operator op(const Tensor& a, const Tensor& b) { return apply(F{}, Var(a), Var(b)).value(); } \
  Tensor operator op(const Tensor& a, double b) { return apply(F{}, Var(a), b).value(); }       \
  Tensor operator op(double a, const Tensor& b) { return apply(F{}, a, Var(b)).value(); }
DUALCAST_DEFINE_BINARY_OP(+, Add)
DUALCAST_DEFINE_BINARY_OP(-, Sub)
DUALCAST_DEFINE_BINARY_OP(*, Mul)
DUALCAST_DEFINE_BINARY_OP(/, Div)
#undef DUALCAST_DEFINE_BINARY_OP

Var operator-(const Var& a) { return apply(Neg{}, a); }
Tensor operator-(const Tensor& a) { return apply(Neg{}, Var(a)).value(); }

}  // namespace dualcast
