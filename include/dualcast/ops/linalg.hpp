// ops/linalg.hpp: matrix products on the tape (CPU: OpenBLAS via CBLAS; CUDA: cuBLAS).
//
// Every function takes Vars; a Tensor converts implicitly to a constant Var, so Tensors and Vars mix
// freely. The Tensor overloads are for pure-Tensor code: they record nothing and skip the tape.
#pragma once

#include "dualcast/tape.hpp"
#include "dualcast/tensor.hpp"

namespace dualcast {

/// Matrix product C = op(A) op(B), op(X) = X^T when the flag is set (the last two dimensions).
///   a [m, k] x b [k, n]              -> [m, n]
///   a [B, m, k] x b [B, k, n]        -> [B, m, n]   (batched; equal batch sizes)
///   a [B, m, k] x b [k, n]           -> [B, m, n]   (b shared by every batch entry)
///   a [m, k] x b [B, k, n]           -> [B, m, n]   (a shared by every batch entry)
/// With trans_a, a is stored [.., k, m]; with trans_b, b is stored [.., n, k]. float32, float64,
/// bfloat16 or float16, both operands on the same device with the same dtype (no promotion: a
/// bfloat16 x float32 product is an Error, as in PyTorch; cast() one side). Gradients: dA = dC op(B)^T
/// and dB = op(A)^T dC, transposed back to each operand's storage layout, in the operands' dtype; a
/// shared 2-D operand's gradient is summed over the batch.
/// Precision: float32 on a GPU follows set_float32_matmul_precision (precision.hpp; "highest", the
/// default, is exact float32 without TF32); 16-bit products sum in float32 (cuBLAS tensor cores; on
/// the CPU through float32 copies of the operands) and round the result once. Under Autocast float32
/// operands are cast() to the autocast dtype first and the result has that dtype (float32 parameters
/// still get float32 gradients). Throws dualcast::Error naming the arguments and shapes on a rank,
/// batch, inner-dimension, device or dtype mismatch.
Var matmul(const Var& a, const Var& b, bool trans_a = false, bool trans_b = false);
/// The same product of two Tensors, recording nothing.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

}  // namespace dualcast
