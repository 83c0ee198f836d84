// precision.hpp: how products are computed: the float32 matmul precision (process-wide, as PyTorch's
// torch.set_float32_matmul_precision) and Autocast (scoped and per thread, as torch.autocast).
//
// Both govern the ops built on products: matmul (plain and batched) and conv2d, and what is built on
// them. Attention is not: its fused kernels are SIMT float32 and the composed path stays float32
// under Autocast too (tensor-core attention is future work). What each setting does per backend:
//
//   float32 precision  CUDA matmul (cuBLAS)                       CUDA conv2d (cuDNN)
//   "highest"          cublasSgemm, CUBLAS_DEFAULT_MATH: exact    CUDNN_FMA_MATH: no TF32
//   "high"             cublasGemmEx, CUBLAS_COMPUTE_32F_FAST_TF32 CUDNN_DEFAULT_MATH: TF32 allowed
//   "medium"           cublasGemmEx, CUBLAS_COMPUTE_32F_FAST_16BF CUDNN_DEFAULT_MATH: TF32 allowed
// cuDNN has no bfloat16-product mode for float32 data, so "medium" convolutions are "high" ones (as
// in PyTorch, where "medium" only changes matmul). The CPU ignores the setting (as PyTorch's CPU
// does): OpenBLAS computes float32 exactly. The im2col + GEMM convolution follows the matmul column.
#pragma once

#include <string>

#include "dualcast/dtype.hpp"

namespace dualcast {

/// Sets the precision of float32 matrix products and convolutions for the whole process: "highest"
/// (the default: plain float32), "high" (TF32 tensor cores: 10-bit mantissa products, float32 sums)
/// or "medium" (bfloat16 products, float32 sums). Throws dualcast::Error naming the bad name and the
/// accepted ones (the setting is then unchanged). Read at each call: set it outside a captured step.
void set_float32_matmul_precision(const std::string& name);
/// The current setting: "highest", "high" or "medium".
std::string get_float32_matmul_precision();

/// Autotuned float32 products on CUDA devices (at "highest"): each new product shape times, once,
/// cublasSgemm and cuBLASLt's exact-float32 algorithms (its heuristic's candidates and split-K
/// variants, compute type CUBLAS_COMPUTE_32F: no TF32) as bursts of back-to-back calls, and keeps
/// cuBLASLt's fastest where it beats cublasSgemm by more than 3%, as the convolutions' algorithms
/// are found. Sums may be ordered differently from
/// cublasSgemm's (split-K), so results agree with the untuned path to float32 rounding, not bit for
/// bit, and two processes may choose differently; within a process a shape's choice is fixed, and
/// eager and captured steps give identical bits. A shape first met inside a Graph capture keeps
/// cublasSgemm for good (nothing can be timed there). Process-wide; on by default,
/// DUALCAST_MATMUL_AUTOTUNE=0 in the environment (or set_matmul_autotune(false)) turns it off for
/// cublasSgemm's choices everywhere. The CPU ignores it.
void set_matmul_autotune(bool on);
[[nodiscard]] bool matmul_autotune();

/// Autocast to a 16-bit dtype for this thread while the guard lives:
///
///   { Autocast ac(DType::bfloat16); Var y = matmul(x, w); }  // y is bfloat16, w.grad() float32
///
/// matmul and conv2d (with its bias) convert their float32 operands to `dtype` with cast() (so
/// gradients flow back to float32 parameters as float32) and return a `dtype` result; float64 and
/// 16-bit operands are left as they are. Nestable: the destructor restores the state the guard found
/// (Autocast(dtype, false) switches autocasting off inside an outer guard). Per thread, like
/// NoGradGuard: another thread's ops are unaffected. dtype must be bfloat16 or float16 (else
/// dualcast::Error), also when disabled.
class Autocast {
 public:
  explicit Autocast(DType dtype, bool enabled = true);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  bool prev_enabled_;
  DType prev_dtype_;
};

/// Whether an Autocast guard is active (and enabled) on this thread: what op implementations ask.
[[nodiscard]] bool autocast_enabled();
/// The dtype of the innermost Autocast guard on this thread (bfloat16 when there is none).
[[nodiscard]] DType autocast_dtype();

namespace detail {
/// The float32 matmul precision as a number, for the BLAS and cuDNN backends.
enum class Float32Precision { highest, high, medium };
Float32Precision float32_precision();
/// The dtype a product operand of dtype t is computed in on this thread: the autocast dtype for a
/// float32 operand inside an enabled Autocast, t otherwise.
DType autocast_target(DType t);
}  // namespace detail

}  // namespace dualcast
