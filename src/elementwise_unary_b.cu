// elementwise_unary_b.cu: the second half of the listed unary functions on Var and Tensor
// (DUALCAST_UNARY_FUNCTIONS_B in ops/elementwise.hpp; see elementwise_unary.cu).
#include "elementwise_ops.hpp"

namespace dualcast {
using namespace detail::ew;

DUALCAST_UNARY_FUNCTIONS_B(DUALCAST_DEFINE_UNARY)

}  // namespace dualcast
