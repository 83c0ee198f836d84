// blas.hpp (private): row-major GEMM on either backend. The CPU calls CBLAS (OpenBLAS, CblasRowMajor);
// CUDA devices call cuBLAS through one handle per device, created lazily and thread-safely on first
// use, bound to the device's dualcast stream (detail::stream) that every other dualcast kernel and copy
// uses, with a workspace of its own (so calls can be captured in a CUDA graph), in CUBLAS_DEFAULT_MATH
// mode. Float32 on CUDA follows set_float32_matmul_precision (precision.hpp): "highest" is
// cublasSgemm (no TF32 tensor-core rounding), "high" and "medium" are cublasGemmEx with
// CUBLAS_COMPUTE_32F_FAST_TF32 and CUBLAS_COMPUTE_32F_FAST_16BF. bfloat16 and float16 on CUDA are
// cublasGemm(StridedBatched)Ex with CUBLAS_COMPUTE_32F (tensor cores, float32 sums, float alpha and
// beta). On the CPU the setting is ignored (OpenBLAS float32 is exact, as PyTorch's CPU), and 16-bit
// operands are converted to float32 blocks, multiplied by sgemm and rounded back: an extra pass over
// each operand and the result, the price of having no 16-bit CPU GEMM.
#pragma once

#include <cstdint>
#include <functional>

#include "dualcast/device.hpp"
#include "dualcast/dtype.hpp"

namespace dualcast::detail {

/// Strided-batched row-major GEMM: for every b in [0, batch),
///   C_b = alpha * op(A_b) * op(B_b) + beta * C_b,   X_b = X + b * stride_x   (elements),
/// where op(A_b) is [m, k] (A_b stored [m, k] with row pitch lda, or [k, m] when trans_a) and
/// op(B_b) is [k, n] (stored [k, n] with pitch ldb, or [n, k] when trans_b); C_b is [m, n] with
/// pitch ldc. A stride of 0 shares one matrix across the batch (not allowed for C). `dtype` is
/// float32, float64, bfloat16 or float16 (A, B and C all of it) and every pointer lives on `device`.
/// Asynchronous on CUDA devices (dualcast's stream).
/// k == 0 is allowed (C_b = beta * C_b); m, n or batch of 0 do nothing.
void gemm(Device device, DType dtype, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
          std::int64_t k, double alpha, const void* a, std::int64_t lda, std::int64_t stride_a,
          const void* b, std::int64_t ldb, std::int64_t stride_b, double beta, void* c,
          std::int64_t ldc, std::int64_t stride_c, std::int64_t batch = 1);

/// C[m, n] (float32, pitch ldc) = op(A) op(B) with A and B of the 16-bit dtype b16 (bfloat16 or
/// float16), products summed in float32 and not rounded to 16 bits: cublasGemmEx with a float32 C on
/// CUDA; on the CPU both operands converted to float32 and one sgemm (exact products of the 16-bit
/// values). Layouts and flags as gemm's (batch 1, alpha 1, beta 0).
void gemm_16_to_32(Device device, DType b16, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                   std::int64_t k, const void* a, std::int64_t lda, const void* b, std::int64_t ldb, float* c,
                   std::int64_t ldc);

/// Number of cuBLAS handles created so far (one per device at most; for tests).
int cublas_handles_created();

/// Creates the device's cuBLAS handle and workspace now if they do not exist yet (Graph::capture
/// calls it first: creating them during a capture would allocate). No-op on the CPU.
void blas_prepare(Device device);

#if DUALCAST_WITH_CUDA
/// Row-major float32 GEMM (gemm's arguments, narrowed) with the fastest exact-float32 way for the
/// shape, searched once and cached (blas_lt.cpp; set_matmul_autotune): one of cuBLASLt's algorithms,
/// or cublasSgemm, which `sgemm(c)` runs into the given C for the search's timing. False when the
/// choice is cublasSgemm (nothing was computed: the caller runs it).
bool lt_sgemm(Device device, bool ta, bool tb, int M, int N, int K, float alpha, const float* a, int lda,
              std::int64_t sa, const float* b, int ldb, std::int64_t sb, float beta, float* c, int ldc,
              std::int64_t sc, int batch, const std::function<void(float*)>& sgemm);
/// Creates the device's cuBLASLt handle and workspace (before a capture).
void lt_prepare(Device device);
#endif
/// Shapes searched so far by the autotuned float32 path (for tests; 0 without CUDA).
std::int64_t matmul_autotune_searches();

}  // namespace dualcast::detail
