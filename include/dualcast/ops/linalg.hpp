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

/// The product Autocast computes, with its float32 sums kept: op(a) op(b) of 2-D a and b, both
/// rounded to `dtype` (bfloat16 or float16; each operand float32 or `dtype`, contiguous), products
/// summed in float32, returned as float32 [m, n] without rounding to 16 bits (PyTorch's
/// torch.mm(a16, b16, out_dtype=torch.float32)). Records nothing: for tape nodes that write their own
/// backward with it (the HM-LSTM's gate products under Autocast). CPU: exact float32 products of the
/// rounded values (OpenBLAS). CUDA: cuBLAS (cublasGemmEx, float32 output), or for op(a) of at most
/// 64 rows without trans_a dualcast's split-K tensor-core kernel (src/gemm_skinny.cu), which reads
/// a float32 `a` without a separate rounding pass; which of the two runs a shape is timed once per
/// process and shape (DUALCAST_SKINNY_GEMM=0 or 1 forces cuBLAS or the kernel; DUALCAST_MATMUL_LOG=1
/// prints each choice). Both sum in float32 in different orders: they agree to float32 rounding of
/// the sums, not bit for bit. Errors name the argument and shapes (dtype, rank, device, inner size).
Tensor matmul_rounded(const Tensor& a, const Tensor& b, DType dtype, bool trans_a = false, bool trans_b = false);

}  // namespace dualcast
