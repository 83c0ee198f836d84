// ops/cast.hpp: dtype conversion on the tape. Mixed precision is built from it: Autocast casts
// float32 parameters to a 16-bit type for the tensor-core ops, and an op without a 16-bit kernel of
// its own computes on a float32 copy, and in both cases the gradient flows back converted to the
// dtype of the variable it belongs to (float32 master weights get float32 gradients).
#pragma once

#include "dualcast/tape.hpp"
#include "dualcast/tensor.hpp"

namespace dualcast {

/// x converted to `dtype` (round to nearest even), recorded on the tape: the backward converts the
/// incoming gradient to x's dtype. Returns x itself when it already has that dtype. A Var that
/// requires a gradient cannot be cast to uint8 (a dualcast::Error naming the shapes).
Var cast(const Var& x, DType dtype);
/// The same conversion of a Tensor (Tensor::to(DType)), recording nothing.
Tensor cast(const Tensor& x, DType dtype);

namespace detail {
/// op(x) computed in float32 when x has a 16-bit dtype, the result converted back to x's dtype
/// (op(x) itself otherwise). For operations whose kernels read float32 and float64 only: the
/// conversion passes are their price, named in each operation's documentation.
template <class Op>
Var via_float32(const Var& x, Op&& op) {
  if (!is_half(x.dtype())) return op(x);
  return cast(op(cast(x, DType::float32)), x.dtype());
}
}  // namespace detail

}  // namespace dualcast
