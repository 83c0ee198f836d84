// elementwise_unary.cu: the first half of the listed unary functions on Var and Tensor
// (DUALCAST_UNARY_FUNCTIONS_A in ops/elementwise.hpp; the second half is elementwise_unary_b.cu,
// the binary functions elementwise_binary.cu: three translation units that compile side by side).
// Each is one broadcast of its functor, whose derivative is math.hpp's rule on dual numbers.
#include "elementwise_ops.hpp"

namespace dualcast {
using namespace detail::ew;

DUALCAST_UNARY_FUNCTIONS_A(DUALCAST_DEFINE_UNARY)

}  // namespace dualcast
