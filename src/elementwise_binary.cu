// elementwise_binary.cu: the listed binary functions (DUALCAST_BINARY_FUNCTIONS in
// ops/elementwise.hpp) for two Vars and for a Var with a number on either side, and pow on Tensors.
// Each is one broadcast of its functor, whose derivatives are math.hpp's rules on dual numbers.
#include "elementwise_ops.hpp"

namespace dualcast {
using namespace detail::ew;

#define DUALCAST_DEFINE_BINARY(fn, a, b)                                      \
  Var fn(const Var& a, const Var& b) { return apply(op_##fn{}, a, b); }       \
  Var fn(const Var& a, double b) { return apply(op_##fn{}, a, b); }           \
  Var fn(double a, const Var& b) { return apply(op_##fn{}, a, b); }
DUALCAST_BINARY_FUNCTIONS(DUALCAST_DEFINE_BINARY)
#undef DUALCAST_DEFINE_BINARY

Tensor pow(const Tensor& x, double p) { return apply(op_pow{}, Var(x), p).value(); }

}  // namespace dualcast
