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
/// The parameter check of the normalisation layers (gamma, beta of batch_norm and layer_norm):
/// `param` lives on x's device and has x's dtype, or float32 when x is 16-bit (the float32 parameters
/// a mixed-precision network keeps, as PyTorch's autocast leaves them). An Error naming op, both
/// arguments, their shapes and dtypes otherwise.
void check_parameter_of_half(const char* op, const Tensor& x, const char* name, const Tensor& param);

/// Whether a KeepPrecisionGuard is alive on this thread.
bool keeping_precision();
}  // namespace detail

/// While alive on this thread, cast(Var) of a float64 Var to a narrower floating dtype (float32,
/// bfloat16, float16) returns it unchanged, so a function of float64 inputs that rounds to 16 bits
/// inside (and perhaps widens to float32 again) stays in float64. check_gradients holds one while it
/// evaluates the finite differences, which are then those of the float64 function; the tape's
/// gradients it compares them with come from the real 16-bit run. Other casts are unaffected, and so
/// are Tensor::to and Tensors a function creates in another dtype. Guards nest; each thread has its
/// own.
class KeepPrecisionGuard {
 public:
  KeepPrecisionGuard();
  ~KeepPrecisionGuard();
  KeepPrecisionGuard(const KeepPrecisionGuard&) = delete;
  KeepPrecisionGuard& operator=(const KeepPrecisionGuard&) = delete;
};

}  // namespace dualcast
