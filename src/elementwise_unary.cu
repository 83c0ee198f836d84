// elementwise_unary.cu: the unary functions on Var and Tensor.
#include "elementwise_ops.hpp"

namespace dualcast {
using namespace detail::ew;

#define DUALCAST_DEFINE_UNARY(name, F)                           \
  Var name(const Var& x) { return apply(F{}, x); }               \
  Tensor name(const Tensor& x) { return apply(F{}, Var(x)).value(); }
DUALCAST_DEFINE_UNARY(exp, Exp)
DUALCAST_DEFINE_UNARY(expm1, Expm1)
DUALCAST_DEFINE_UNARY(log, Log)
DUALCAST_DEFINE_UNARY(log1p, Log1p)
DUALCAST_DEFINE_UNARY(sqrt, Sqrt)
DUALCAST_DEFINE_UNARY(cbrt, Cbrt)
DUALCAST_DEFINE_UNARY(sin, Sin)
DUALCAST_DEFINE_UNARY(cos, Cos)
DUALCAST_DEFINE_UNARY(tan, Tan)
DUALCAST_DEFINE_UNARY(tanh, Tanh)
DUALCAST_DEFINE_UNARY(sigmoid, Sigmoid)
DUALCAST_DEFINE_UNARY(softplus, Softplus)
DUALCAST_DEFINE_UNARY(erf, Erf)
DUALCAST_DEFINE_UNARY(gelu, Gelu)
DUALCAST_DEFINE_UNARY(abs, Abs)
DUALCAST_DEFINE_UNARY(relu, Relu)
#undef DUALCAST_DEFINE_UNARY

}  // namespace dualcast
