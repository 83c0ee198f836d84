// elementwise_unary.cu: the listed unary and binary functions on Var and Tensor
// (DUALCAST_UNARY_FUNCTIONS and DUALCAST_BINARY_FUNCTIONS in ops/elementwise.hpp): each is one
// broadcast of its functor, whose derivative is math.hpp's rule on dual numbers.
#include "elementwise_ops.hpp"

namespace dualcast {
using namespace detail::ew;

#define DUALCAST_DEFINE_UNARY(fn)                               \
  Var fn(const Var& x) { return apply(op_##fn{}, x); }           \
  Tensor fn(const Tensor& x) { return apply(op_##fn{}, Var(x)).value(); }
DUALCAST_UNARY_FUNCTIONS(DUALCAST_DEFINE_UNARY)
#undef DUALCAST_DEFINE_UNARY

#define DUALCAST_DEFINE_BINARY(fn, a, b)                                      \
  Var fn(const Var& a, const Var& b) { return apply(op_##fn{}, a, b); }       \
  Var fn(const Var& a, double b) { return apply(op_##fn{}, a, b); }           \
  Var fn(double a, const Var& b) { return apply(op_##fn{}, a, b); }
DUALCAST_BINARY_FUNCTIONS(DUALCAST_DEFINE_BINARY)
#undef DUALCAST_DEFINE_BINARY

Tensor pow(const Tensor& x, double p) { return apply(op_pow{}, Var(x), p).value(); }

}  // namespace dualcast
