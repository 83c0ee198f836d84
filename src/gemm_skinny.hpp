// gemm_skinny.hpp (private): dualcast's own product for few rows on tensor cores, and the measured
// choice between it and cuBLAS (gemm_skinny.cu).
//
// Why: a product of m <= 64 rows (the HM-LSTM's per-step gate products: [64, 1540] x [1540, 2049])
// gives cuBLAS about 17 output tiles for 132 SMs. Measured on an H200 (product_probe.py, PyTorch's
// cuBLAS in a CUDA graph), such a product takes 16 us in bfloat16 and 17 us in float32: the tensor
// cores change nothing, because most SMs idle. This kernel splits the inner dimension over enough
// blocks to fill the GPU (64 x 64 output tiles, mma.sync m16n8k16 with float32 sums) and adds the
// slices in a fixed order on chip (a thread-block cluster per tile), so a path's results do not
// depend on timing. Which path runs a shape is measured per process (choose_skinny): the two sum in
// different orders, so results agree between processes to float32 rounding of the sums.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "dualcast/device.hpp"
#include "dualcast/dtype.hpp"

namespace dualcast::detail {

/// The most rows the skinny kernel takes.
inline constexpr std::int64_t kSkinnyMaxRows = 64;

/// Whether skinny_gemm can compute C[m, n] = A[m, k] op(B) on `device` for these operand dtypes:
/// a CUDA build and device of compute capability 9.0 or newer (thread-block clusters), 1 <= m <= 64,
/// A not transposed, A float32 or `b16`, B `b16` (bfloat16 or float16), n and k within the grid.
bool skinny_gemm_fits(Device device, std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a, DType a_dtype,
                      DType b16);

/// C[m, n] (float32, pitch ldc) = A[m, k] x op(B) with A's and B's values rounded to b16 (A may be
/// float32: rounded as it is loaded), products summed in float32. op(B) is [k, n]: B is stored [n, k]
/// (pitch ldb) when trans_b, else [k, n]. Asynchronous on the device's dualcast stream; the split-K
/// slices are summed on chip (no workspace). Requires skinny_gemm_fits.
void skinny_gemm(Device device, DType a_dtype, DType b16, bool trans_b, std::int64_t m, std::int64_t n,
                 std::int64_t k, const void* a, std::int64_t lda, const void* b, std::int64_t ldb, float* c,
                 std::int64_t ldc);

/// Reads the device's SM count and cluster support now (Graph::capture, through blas_prepare: the
/// first query must not happen under a capture). No-op on the CPU and in a CPU-only build.
void skinny_prepare(Device device);

/// Which of two ways to run one product shape: DUALCAST_SKINNY_GEMM=1 always `ours`, =0 never;
/// otherwise both are timed on first use of `key` (GPU time of back-to-back calls: median_ms in
/// gemm_skinny.cu) and the faster is kept for the process. A shape first met during a stream capture
/// (where nothing can be timed) takes `ours`, and keeps it. Returns whether `ours` is used;
/// DUALCAST_MATMUL_LOG=1 prints each decision with its times to stderr.
bool choose_skinny(Device device, const std::string& key, const std::function<void()>& ours,
                   const std::function<void()>& library);

/// For tests: overrides DUALCAST_SKINNY_GEMM in this process (1: the kernel wherever it fits; 0:
/// cuBLAS; -1: the measured choice; -2: back to the environment's setting).
void force_skinny(int mode);

}  // namespace dualcast::detail
