// blas.cpp: the row-major GEMM behind matmul. CBLAS on the CPU, cuBLAS on CUDA devices.
//
// cuBLAS is column-major. A row-major [r, c] buffer with pitch ld is, read column-major, the [c, r]
// transpose with the same pitch. So the row-major product C = op(A) op(B) is computed as the
// column-major product C^T = op(B)^T op(A)^T: swap the operands (B first), swap m and n, and keep each
// operand's own transpose flag (the buffer of B read column-major already is B^T).
//
// Precision (blas.hpp): float32 "highest" keeps the cublasSgemm calls exactly as they were before
// the setting existed, so its results are unchanged; every other cuBLAS product goes through the Ex
// API, which names the data and compute types.
#include "blas.hpp"

#include <atomic>
#include <climits>
#include <mutex>
#include <type_traits>

#include <cblas.h>

#include <vector>

#include "dualcast/error.hpp"
#include "dualcast/precision.hpp"
#include "dualcast/stream.hpp"
#include "gemm_skinny.hpp"
#include "per_device.hpp"

#if DUALCAST_WITH_CUDA
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#endif

namespace dualcast::detail {

namespace {

std::atomic<int> g_handles_created{0};

void check_int_range(const char* what, std::int64_t v) {
  DUALCAST_CHECK(v >= 0 && v <= INT_MAX, "matmul: ", what, " = ", v,
                 " exceeds the 32-bit range the BLAS interface accepts");
}

/// The sizes of a (batched) GEMM: non-negative, within BLAS's int, and every leading dimension at
/// least 1 (BLAS requires it even for empty operands), which it clamps in place.
void check_dims(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch, std::int64_t& lda,
                std::int64_t& ldb, std::int64_t& ldc) {
  DUALCAST_CHECK(m > 0 && n > 0 && k >= 0 && batch > 0, "gemm: negative size m=", m, " n=", n,
                 " k=", k, " batch=", batch);
  check_int_range("m", m);
  check_int_range("n", n);
  check_int_range("k", k);
  check_int_range("batch", batch);
  lda = lda < 1 ? 1 : lda;
  ldb = ldb < 1 ? 1 : ldb;
  ldc = ldc < 1 ? 1 : ldc;
  check_int_range("lda", lda);
  check_int_range("ldb", ldb);
  check_int_range("ldc", ldc);
}

template <class T>
void cpu_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
              const T* a, std::int64_t lda, std::int64_t sa, const T* b, std::int64_t ldb,
              std::int64_t sb, double beta, T* c, std::int64_t ldc, std::int64_t sc,
              std::int64_t batch) {
  const auto opa = ta ? CblasTrans : CblasNoTrans;
  const auto opb = tb ? CblasTrans : CblasNoTrans;
  for (std::int64_t i = 0; i < batch; ++i) {
    const T* ai = a + i * sa;
    const T* bi = b + i * sb;
    T* ci = c + i * sc;
    if constexpr (std::is_same_v<T, float>) {
      cblas_sgemm(CblasRowMajor, opa, opb, static_cast<int>(m), static_cast<int>(n),
                  static_cast<int>(k), static_cast<float>(alpha), ai, static_cast<int>(lda), bi,
                  static_cast<int>(ldb), static_cast<float>(beta), ci, static_cast<int>(ldc));
    } else {
      cblas_dgemm(CblasRowMajor, opa, opb, static_cast<int>(m), static_cast<int>(n),
                  static_cast<int>(k), alpha, ai, static_cast<int>(lda), bi, static_cast<int>(ldb),
                  beta, ci, static_cast<int>(ldc));
    }
  }
}

/// The used [rows, cols] block of a 16-bit matrix with pitch ld, as a compact float32 matrix.
template <class T>
void block_to_float(const T* src, std::int64_t rows, std::int64_t cols, std::int64_t ld, float* dst) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < cols; ++j) dst[r * cols + j] = static_cast<float>(src[r * ld + j]);
}

/// The 16-bit product on the CPU: per batch entry, A, B (and C when beta != 0) converted to
/// float32, one sgemm, C rounded back. A shared operand (stride 0) is converted once.
template <class T>
void cpu_gemm_half(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
                   const T* a, std::int64_t lda, std::int64_t sa, const T* b, std::int64_t ldb,
                   std::int64_t sb, double beta, T* c, std::int64_t ldc, std::int64_t sc,
                   std::int64_t batch) {
  const std::int64_t ar = ta ? k : m, ac = ta ? m : k;  // A as stored: ar rows of ac used columns
  const std::int64_t br = tb ? n : k, bc = tb ? k : n;
  std::vector<float> fa(static_cast<std::size_t>(ar * ac)), fb(static_cast<std::size_t>(br * bc)),
      fc(static_cast<std::size_t>(m * n), 0.0f);
  for (std::int64_t i = 0; i < batch; ++i) {
    if (i == 0 || sa != 0) block_to_float(a + i * sa, ar, ac, lda, fa.data());
    if (i == 0 || sb != 0) block_to_float(b + i * sb, br, bc, ldb, fb.data());
    T* ci = c + i * sc;
    if (beta != 0.0) block_to_float(ci, m, n, ldc, fc.data());
    cpu_gemm<float>(ta, tb, m, n, k, alpha, fa.data(), ac, 0, fb.data(), bc, 0, beta, fc.data(), n, 0, 1);
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t j = 0; j < n; ++j) ci[r * ldc + j] = T(fc[static_cast<std::size_t>(r * n + j)]);
  }
}

template <class T>
void cpu_scale(std::int64_t m, std::int64_t n, double beta, T* c, std::int64_t ldc, std::int64_t sc,
               std::int64_t batch) {
  for (std::int64_t i = 0; i < batch; ++i)
    for (std::int64_t r = 0; r < m; ++r) {
      T* row = c + i * sc + r * ldc;
      for (std::int64_t j = 0; j < n; ++j) row[j] = beta == 0.0 ? T(0) : static_cast<T>(beta * row[j]);
    }
}

#if DUALCAST_WITH_CUDA
/// One handle per device (see PerDevice: created on first use, never destroyed).
cublasHandle_t cublas_handle(Device device) {
  static PerDevice<cublasHandle_t> handles;
  return handles.get(device, "matmul", [&] {
    DeviceGuard guard(device);
    cublasHandle_t h = nullptr;
    DUALCAST_CUBLAS_CHECK(cublasCreate(&h));
    // dualcast's stream, like every other dualcast kernel and copy: the caching allocator may hand a
    // freed block to the next op as soon as it is released, which is safe only when all work is
    // ordered on one stream.
    DUALCAST_CUBLAS_CHECK(cublasSetStream(h, stream(device)));
    // Full fp32 for cublasSgemm: no TF32 tensor-core rounding (CUBLAS_DEFAULT_MATH never down-converts
    // fp32); the Ex calls for the other precisions name their compute type instead.
    DUALCAST_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    DUALCAST_CUBLAS_CHECK(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));
    // A workspace of our own, set once: without it cuBLAS allocates its workspace itself, which under
    // stream capture becomes memory nodes in the graph (cuBLAS docs, "CUDA Graphs Support"). The
    // same workspace in eager and captured calls also keeps their algorithm choices, and so their
    // results, identical. Size: cuBLAS's recommendation (32 MiB on Hopper and newer, 4 MiB before).
    // Like the handle it lives until the process ends; it is outside the caching allocator, whose
    // statistics count tensor memory.
    int major = 0;
    DUALCAST_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device.index));
    const std::size_t ws_bytes = major >= 9 ? (std::size_t{32} << 20) : (std::size_t{4} << 20);
    void* ws = nullptr;
    DUALCAST_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
    DUALCAST_CUBLAS_CHECK(cublasSetWorkspace(h, ws, ws_bytes));
    ++g_handles_created;
    return h;
  });
}

template <class T>
void cuda_gemm(Device device, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
               double alpha_d, const T* a, std::int64_t lda, std::int64_t sa, const T* b,
               std::int64_t ldb, std::int64_t sb, double beta_d, T* c, std::int64_t ldc,
               std::int64_t sc, std::int64_t batch) {
  cublasHandle_t h = cublas_handle(device);
  DeviceGuard guard(device);
  const T alpha = static_cast<T>(alpha_d), beta = static_cast<T>(beta_d);
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
  const int LDA = static_cast<int>(lda), LDB = static_cast<int>(ldb), LDC = static_cast<int>(ldc);
  // Column-major C^T[n, m] = op(B)^T[n, k] * op(A)^T[k, m].
  if (batch == 1) {
    if constexpr (std::is_same_v<T, float>)
      DUALCAST_CUBLAS_CHECK(cublasSgemm(h, opb, opa, N, M, K, &alpha, b, LDB, a, LDA, &beta, c, LDC));
    else
      DUALCAST_CUBLAS_CHECK(cublasDgemm(h, opb, opa, N, M, K, &alpha, b, LDB, a, LDA, &beta, c, LDC));
  } else {
    const int nb = static_cast<int>(batch);
    if constexpr (std::is_same_v<T, float>)
      DUALCAST_CUBLAS_CHECK(cublasSgemmStridedBatched(h, opb, opa, N, M, K, &alpha, b, LDB, sb, a,
                                                      LDA, sa, &beta, c, LDC, sc, nb));
    else
      DUALCAST_CUBLAS_CHECK(cublasDgemmStridedBatched(h, opb, opa, N, M, K, &alpha, b, LDB, sb, a,
                                                      LDA, sa, &beta, c, LDC, sc, nb));
  }
}

/// cuBLAS's name of a storage type.
template <class T>
cudaDataType cuda_type() {
  if constexpr (std::is_same_v<T, bfloat16>) return CUDA_R_16BF;
  else if constexpr (std::is_same_v<T, float16>) return CUDA_R_16F;
  else return CUDA_R_32F;
}

/// The Ex form of cuda_gemm: A, B and C of type T (16-bit or float32), float alpha and beta, the
/// given compute type (CUBLAS_COMPUTE_32F for 16-bit data; a FAST_ mode for float32 at "high" or
/// "medium"). Same operand swap as cuda_gemm.
template <class T>
void cuda_gemm_ex(Device device, cublasComputeType_t compute, bool ta, bool tb, std::int64_t m,
                  std::int64_t n, std::int64_t k, double alpha_d, const T* a, std::int64_t lda,
                  std::int64_t sa, const T* b, std::int64_t ldb, std::int64_t sb, double beta_d, T* c,
                  std::int64_t ldc, std::int64_t sc, std::int64_t batch) {
  cublasHandle_t h = cublas_handle(device);
  DeviceGuard guard(device);
  // With a 32F compute type the scalars are float (cuBLAS docs, cublasGemmEx: "alpha ... of type
  // float for CUBLAS_COMPUTE_32F*"), whatever the data type.
  const float alpha = static_cast<float>(alpha_d), beta = static_cast<float>(beta_d);
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
  const int LDA = static_cast<int>(lda), LDB = static_cast<int>(ldb), LDC = static_cast<int>(ldc);
  const cudaDataType t = cuda_type<T>();
  if (batch == 1) {
    DUALCAST_CUBLAS_CHECK(cublasGemmEx(h, opb, opa, N, M, K, &alpha, b, t, LDB, a, t, LDA, &beta, c, t,
                                       LDC, compute, CUBLAS_GEMM_DEFAULT));
  } else {
    DUALCAST_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, opb, opa, N, M, K, &alpha, b, t, LDB, sb, a, t,
                                                     LDA, sa, &beta, c, t, LDC, sc,
                                                     static_cast<int>(batch), compute,
                                                     CUBLAS_GEMM_DEFAULT));
  }
}
#endif

}  // namespace

int cublas_handles_created() { return g_handles_created.load(); }

#if !DUALCAST_WITH_CUDA
std::int64_t matmul_autotune_searches() { return 0; }
#endif

void blas_prepare(Device device) {
#if DUALCAST_WITH_CUDA
  if (device.is_cuda()) (void)cublas_handle(device);
  skinny_prepare(device);
  if (device.is_cuda() && matmul_autotune()) lt_prepare(device);
#else
  (void)device;
#endif
}

void gemm(Device device, DType dtype, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
          std::int64_t k, double alpha, const void* a, std::int64_t lda, std::int64_t stride_a,
          const void* b, std::int64_t ldb, std::int64_t stride_b, double beta, void* c,
          std::int64_t ldc, std::int64_t stride_c, std::int64_t batch) {
  if (m == 0 || n == 0 || batch == 0) return;
  check_dims(m, n, k, batch, lda, ldb, ldc);

  dispatch_floating_storage(dtype, "matmul", [&](auto tag) {
    using T = decltype(tag);
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    T* pc = static_cast<T*>(c);
    if (device.is_cpu()) {
      if (k == 0) cpu_scale<T>(m, n, beta, pc, ldc, stride_c, batch);
      else if constexpr (is_half_v<T>)
        cpu_gemm_half<T>(trans_a, trans_b, m, n, k, alpha, pa, lda, stride_a, pb, ldb, stride_b, beta,
                         pc, ldc, stride_c, batch);
      else cpu_gemm<T>(trans_a, trans_b, m, n, k, alpha, pa, lda, stride_a, pb, ldb, stride_b, beta,
                       pc, ldc, stride_c, batch);
      return;
    }
#if DUALCAST_WITH_CUDA
    if (k == 0 && beta == 0.0 && ldc == n && (batch == 1 || stride_c == m * n)) {
      DeviceGuard guard(device);
      DUALCAST_CUDA_CHECK(cudaMemsetAsync(pc, 0, static_cast<std::size_t>(batch * m * n) * sizeof(T),
                                          stream(device)));
      return;
    }
    if constexpr (is_half_v<T>) {
      cuda_gemm_ex<T>(device, CUBLAS_COMPUTE_32F, trans_a, trans_b, m, n, k, alpha, pa, lda, stride_a,
                      pb, ldb, stride_b, beta, pc, ldc, stride_c, batch);
      return;
    } else if constexpr (std::is_same_v<T, float>) {
      const Float32Precision p = float32_precision();
      if (p != Float32Precision::highest) {
        cuda_gemm_ex<T>(device,
                        p == Float32Precision::high ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                    : CUBLAS_COMPUTE_32F_FAST_16BF,
                        trans_a, trans_b, m, n, k, alpha, pa, lda, stride_a, pb, ldb, stride_b, beta, pc,
                        ldc, stride_c, batch);
        return;
      }
      // k == 0 (C = beta C) stays with cublasSgemm; so does a shape whose search chose it.
      if (matmul_autotune() && k > 0 &&
          lt_sgemm(device, trans_a, trans_b, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                   static_cast<float>(alpha), pa, static_cast<int>(lda), stride_a, pb, static_cast<int>(ldb),
                   stride_b, static_cast<float>(beta), pc, static_cast<int>(ldc), stride_c,
                   static_cast<int>(batch), [&](float* into) {
                     cuda_gemm<float>(device, trans_a, trans_b, m, n, k, alpha, pa, lda, stride_a, pb, ldb,
                                      stride_b, beta, into, ldc, stride_c, batch);
                   }))
        return;
    }
    if constexpr (!is_half_v<T>)
      cuda_gemm<T>(device, trans_a, trans_b, m, n, k, alpha, pa, lda, stride_a, pb, ldb, stride_b,
                   beta, pc, ldc, stride_c, batch);
#else
    DUALCAST_FAIL("matmul on ", device.str(), ": this dualcast was built without CUDA");
#endif
  });
}

void gemm_16_to_32(Device device, DType b16, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                   std::int64_t k, const void* a, std::int64_t lda, const void* b, std::int64_t ldb, float* c,
                   std::int64_t ldc) {
  DUALCAST_CHECK(b16 == DType::bfloat16 || b16 == DType::float16, "matmul_rounded: operand dtype ",
                 dtype_name(b16), " is not bfloat16 or float16");
  if (m == 0 || n == 0) return;
  check_dims(m, n, k, 1, lda, ldb, ldc);
  dispatch_floating_storage(b16, "matmul_rounded", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (is_half_v<T>) {
      const T* pa = static_cast<const T*>(a);
      const T* pb = static_cast<const T*>(b);
      if (device.is_cpu()) {
        if (k == 0) return cpu_scale<float>(m, n, 0.0, c, ldc, 0, 1);
        const std::int64_t ar = trans_a ? k : m, ac = trans_a ? m : k;
        const std::int64_t br = trans_b ? n : k, bc = trans_b ? k : n;
        std::vector<float> fa(static_cast<std::size_t>(ar * ac)), fb(static_cast<std::size_t>(br * bc));
        block_to_float(pa, ar, ac, lda, fa.data());
        block_to_float(pb, br, bc, ldb, fb.data());
        cpu_gemm<float>(trans_a, trans_b, m, n, k, 1.0, fa.data(), ac, 0, fb.data(), bc, 0, 0.0, c, ldc, 0, 1);
        return;
      }
#if DUALCAST_WITH_CUDA
      cublasHandle_t h = cublas_handle(device);
      DeviceGuard guard(device);
      const float alpha = 1.0f, beta = 0.0f;
      const cudaDataType t = cuda_type<T>();
      // Column-major C^T = op(B)^T op(A)^T, as cuda_gemm; only C's type differs from the operands'.
      DUALCAST_CUBLAS_CHECK(cublasGemmEx(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                         static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, pb,
                                         t, static_cast<int>(ldb), pa, t, static_cast<int>(lda), &beta, c,
                                         CUDA_R_32F, static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
#else
      DUALCAST_FAIL("matmul_rounded on ", device.str(), ": this dualcast was built without CUDA");
#endif
    }
  });
}

}  // namespace dualcast::detail
