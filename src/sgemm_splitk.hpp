// sgemm_splitk.hpp (private): dualcast's own exact-float32 product for matrices of few rows (the
// HM-LSTM's gate products: M = 64 rows against K ~ 1500 and N ~ 2000; issue 31), and the per-shape
// measured choice between it and cublasSgemm.
//
// Why a kernel of our own: for M = 64, cublasSgemm's kernels run at about a quarter of the float32 FMA
// peak (the 2026-11-28 breakdown: 15-23 µs per product, two or three kernels each, for 4-6 µs of FMA
// work), because 64 x 64 output tiles give 33 blocks for 132 SMs and its split-K needs a second
// kernel. This one splits K so that the grid is two blocks per SM, and the last block of each output
// tile to finish sums the tile's partials in a fixed order (no atomics on data: the result is the
// same bits on every run, eager or captured). Plain FFMA on float32: exact float32, no TF32.
//
// Which one runs is measured, as cuDNN's benchmark mode does: the first product of a shape (outside a
// capture) times both on a scratch output and keeps the faster for the process (DUALCAST_MATMUL_LOG=1
// prints each decision). A shape first met inside a Graph capture cannot be timed: it gets cuBLAS for
// the rest of the process, so that eager calls after the capture give the graph's bits (the drivers
// run a step eagerly before capturing it, and decide there). DUALCAST_SPLITK_GEMM=0 in the environment keeps cuBLAS everywhere, =1 takes
// the own kernel wherever it applies without timing (tests, profiles); anything else, or unset: measured.
#pragma once

#include <cstdint>
#include <type_traits>

#include "dualcast/device.hpp"

namespace dualcast::detail {

enum class SplitKMode { off, measured, always };

/// The process-wide mode (initially from DUALCAST_SPLITK_GEMM, see above). For tests and benchmarks.
void set_splitk_mode(SplitKMode mode);
[[nodiscard]] SplitKMode splitk_mode();

/// Shapes decided by measurement so far: how many went to the own kernel and how many to cuBLAS.
struct SplitKDecisions {
  std::int64_t own = 0, cublas = 0;
};
[[nodiscard]] SplitKDecisions splitk_decisions();

#if DUALCAST_WITH_CUDA
/// A non-owning reference to a callable `void(float* out)`: passed per product, so no allocation.
class ProductRef {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, ProductRef>>>
  ProductRef(const F& f)  // NOLINT(google-explicit-constructor): a lambda converts where one is asked for
      : obj_(&f), call_([](const void* o, float* out) { (*static_cast<const F*>(o))(out); }) {}
  void operator()(float* out) const { call_(obj_, out); }

 private:
  const void* obj_;
  void (*call_)(const void*, float*);
};

/// Whether the own kernel can compute the row-major float32 product C[M, N] = alpha A op(B) + beta C
/// (A [M, K] not transposed, pitch lda; B [K, N], or [N, K] when tb; pitch ldb) on `device`: a few
/// rows, enough columns and depth, and a split that fits the device's workspace.
[[nodiscard]] bool splitk_applies(Device device, bool tb, int M, int N, int K);

/// Runs the own kernel (splitk_applies must hold). Asynchronous on dualcast's stream; capturable.
void splitk_sgemm(Device device, bool tb, int M, int N, int K, float alpha, const float* a, int lda,
                  const float* b, int ldb, float beta, float* c, int ldc);

/// True when this product should run the own kernel: the mode, then the shape's cached decision, or a
/// measurement now. `cublas(out)` and `own(out)` compute the product into `out` (a scratch buffer
/// shaped as C while timing). Requires splitk_applies.
[[nodiscard]] bool splitk_chosen(Device device, bool tb, int M, int N, int K, int lda, int ldb, int ldc,
                                 float beta, const float* c, ProductRef cublas, ProductRef own);

/// Allocates the device's workspace and tile counters now (before a capture; blas_prepare calls it).
void splitk_prepare(Device device);
#endif

}  // namespace dualcast::detail
