// blas_lt.cpp: float32 "highest" products through cuBLASLt with a per-shape algorithm search
// (set_matmul_autotune, precision.hpp; issue 31).
//
// Why: the HM-LSTM's gate products have M = 64 rows. cublasSgemm's heuristic picks output tiles that
// give ~17 thread blocks for 132 SMs; cuBLASLt offers the same exact-float32 kernels (compute type
// CUBLAS_COMPUTE_32F: no TF32) with split-K and other tilings that fill the GPU. Which one is fastest
// depends on the shape and the GPU, so, as cuDNN's benchmark mode does for convolutions, each new
// shape times the candidates once (cuBLASLt's heuristic list, plus split-K variants of its best few)
// and keeps the fastest. Split-K changes the order of the sums, not the precision: results are float32
// sums of exact float32 products, equal to cublasSgemm's within float32 rounding; a shape's choice is
// fixed once made, so eager and captured steps give identical bits.
//
// A shape first met inside a Graph capture cannot be timed (nothing may synchronise): it gets the
// heuristic's first choice, not cached, and the next eager call searches (and may choose another
// algorithm: run a step eagerly before capturing it, as the drivers do, for identical bits). Two
// threads meeting a new shape at once may both search it; the first result is kept.
#include "blas.hpp"

#if DUALCAST_WITH_CUDA

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "dualcast/error.hpp"
#include "dualcast/stream.hpp"
#include "dualcast/tensor.hpp"
#include "per_device.hpp"

namespace dualcast::detail {

namespace {

constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;  // cuBLAS's recommendation on Hopper
constexpr int kHeuristicCandidates = 24;
constexpr int kSplitKBase = 4;  // split-K variants are tried for this many of the heuristic's best
constexpr int kSplitKs[] = {2, 3, 4, 6, 8, 12, 16};
constexpr int kTimedReps = 3;  // per candidate, after one untimed run; the median is kept

#define DUALCAST_LT_CHECK(expr)                                                                      \
  do {                                                                                               \
    const cublasStatus_t dualcast_lt_st_ = (expr);                                                   \
    DUALCAST_CHECK(dualcast_lt_st_ == CUBLAS_STATUS_SUCCESS, "matmul (cuBLASLt): ", #expr, " failed: ", \
                   cublasGetStatusString(dualcast_lt_st_));                                          \
  } while (0)

struct Lt {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};

/// One handle and workspace per device, made on first use (before any capture: blas_prepare).
Lt lt_of(Device device) {
  static PerDevice<Lt> lts;
  return lts.get(device, "matmul", [&] {
    DeviceGuard guard(device);
    Lt lt;
    DUALCAST_LT_CHECK(cublasLtCreate(&lt.handle));
    DUALCAST_CUDA_CHECK(cudaMalloc(&lt.workspace, kWorkspaceBytes));
    return lt;
  });
}

/// Everything an algorithm's validity and speed depend on.
using Key = std::tuple<int, bool, bool, int, int, int, int, int, int, std::int64_t, std::int64_t, std::int64_t,
                       int, bool, int>;

std::mutex g_mu;
std::map<Key, cublasLtMatmulAlgo_t>& cache() {
  static auto* c = new std::map<Key, cublasLtMatmulAlgo_t>();  // never destroyed (see PerDevice)
  return *c;
}
std::int64_t g_searches = 0;

int alignment(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  return v % 16 == 0 ? 16 : v % 8 == 0 ? 8 : 4;
}

/// The descriptors of one product, released with it.
struct Problem {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  Problem() = default;
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;
  ~Problem() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

void layout(cublasLtMatrixLayout_t* l, int rows, int cols, int ld, int batch, std::int64_t stride) {
  DUALCAST_LT_CHECK(cublasLtMatrixLayoutCreate(l, CUDA_R_32F, static_cast<std::uint64_t>(rows),
                                               static_cast<std::uint64_t>(cols), ld));
  if (batch > 1) {
    DUALCAST_LT_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
    DUALCAST_LT_CHECK(
        cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
}

struct Candidate {
  cublasLtMatmulAlgo_t algo;
  float ms = 0.f;
};

/// cuBLASLt's heuristic list for the problem, and split-K variants of its first kSplitKBase entries
/// that cublasLtMatmulAlgoCheck accepts.
std::vector<Candidate> candidates(cublasLtHandle_t h, const Problem& p, int align) {
  cublasLtMatmulPreference_t pref = nullptr;
  DUALCAST_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const std::uint64_t ws = kWorkspaceBytes;
  const std::uint32_t al = static_cast<std::uint32_t>(align);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof al);
  cublasLtMatmulHeuristicResult_t res[kHeuristicCandidates] = {};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(h, p.op, p.a, p.b, p.c, p.c, pref, kHeuristicCandidates, res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  std::vector<Candidate> out;
  if (st != CUBLAS_STATUS_SUCCESS) return out;
  for (int i = 0; i < found; ++i)
    if (res[i].state == CUBLAS_STATUS_SUCCESS && res[i].workspaceSize <= kWorkspaceBytes) out.push_back({res[i].algo});
  const std::size_t base = std::min<std::size_t>(out.size(), kSplitKBase);
  for (std::size_t i = 0; i < base; ++i) {
    for (int split : kSplitKs) {
      cublasLtMatmulAlgo_t algo = out[i].algo;
      const std::uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof split) !=
              CUBLAS_STATUS_SUCCESS ||
          cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                               sizeof scheme) != CUBLAS_STATUS_SUCCESS)
        continue;
      cublasLtMatmulHeuristicResult_t check = {};
      if (cublasLtMatmulAlgoCheck(h, p.op, p.a, p.b, p.c, p.c, &algo, &check) == CUBLAS_STATUS_SUCCESS &&
          check.workspaceSize <= kWorkspaceBytes)
        out.push_back({algo});
    }
  }
  return out;
}

cublasStatus_t run(const Lt& lt, const Problem& p, const cublasLtMatmulAlgo_t* algo, float alpha, const float* x,
                   const float* y, float beta, float* c, cudaStream_t s) {
  return cublasLtMatmul(lt.handle, p.op, &alpha, x, p.a, y, p.b, &beta, c, p.c, c, p.c, algo, lt.workspace,
                        kWorkspaceBytes, s);
}

/// Two timing events, destroyed however the search ends.
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    DUALCAST_CUDA_CHECK(cudaEventCreate(&start));
    DUALCAST_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~EventPair() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};

}  // namespace

std::int64_t matmul_autotune_searches() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_searches;
}

void lt_prepare(Device device) {
  if (device.is_cuda()) (void)lt_of(device);
}

bool lt_sgemm(Device device, bool ta, bool tb, int M, int N, int K, float alpha, const float* a, int lda,
              std::int64_t sa, const float* b, int ldb, std::int64_t sb, float beta, float* c, int ldc,
              std::int64_t sc, int batch) {
  const Lt lt = lt_of(device);
  DeviceGuard guard(device);
  const cudaStream_t s = stream(device);
  // Column-major C^T[N, M] = op(B)^T[N, K] op(A)^T[K, M], as cuda_gemm (blas.cpp): cuBLASLt's first
  // operand is B's buffer with B's transpose flag, its second A's.
  const cublasOperation_t opx = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opy = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  Problem p;
  DUALCAST_LT_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  DUALCAST_LT_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opx, sizeof opx));
  DUALCAST_LT_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opy, sizeof opy));
  layout(&p.a, tb ? K : N, tb ? N : K, ldb, batch, sb);
  layout(&p.b, ta ? M : K, ta ? K : M, lda, batch, sa);
  layout(&p.c, N, M, ldc, batch, sc);
  const int align = std::min({alignment(a), alignment(b), alignment(c)});
  const Key key{device.index, ta, tb, M, N, K, lda, ldb, ldc, sa, sb, sc, batch, beta == 0.f, align};

  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = cache().find(key);
    if (it != cache().end()) {
      DUALCAST_LT_CHECK(run(lt, p, &it->second, alpha, b, a, beta, c, s));
      return true;
    }
  }
  std::vector<Candidate> cands = candidates(lt.handle, p, align);
  if (cands.empty()) return false;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  DUALCAST_CUDA_CHECK(cudaStreamIsCapturing(s, &capturing));
  if (capturing != cudaStreamCaptureStatusNone)  // nothing may be timed: the heuristic's choice
    return run(lt, p, &cands[0].algo, alpha, b, a, beta, c, s) == CUBLAS_STATUS_SUCCESS;

  // Time each candidate on a scratch copy of C (beta != 0 reads it; the real C is written once, by
  // the winner, below). The scratch comes from dualcast's caching allocator, ordered on its stream.
  const std::int64_t c_elems = (sc > 0 ? sc * (batch - 1) : 0) + std::int64_t{ldc} * (M - 1) + N;
  Tensor scratch_t = Tensor::empty({c_elems}, DType::float32, device);
  float* scratch = scratch_t.data<float>();
  const EventPair ev;
  std::size_t best = 0;
  float best_ms = -1.f;
  for (std::size_t i = 0; i < cands.size(); ++i) {
    if (beta != 0.f)
      DUALCAST_CUDA_CHECK(cudaMemcpyAsync(scratch, c, static_cast<std::size_t>(c_elems) * sizeof(float),
                                          cudaMemcpyDeviceToDevice, s));
    bool ok = run(lt, p, &cands[i].algo, alpha, b, a, beta, scratch, s) == CUBLAS_STATUS_SUCCESS;
    float times[kTimedReps];
    for (int r = 0; r < kTimedReps && ok; ++r) {
      DUALCAST_CUDA_CHECK(cudaEventRecord(ev.start, s));
      ok = run(lt, p, &cands[i].algo, alpha, b, a, beta, scratch, s) == CUBLAS_STATUS_SUCCESS;
      DUALCAST_CUDA_CHECK(cudaEventRecord(ev.stop, s));
      DUALCAST_CUDA_CHECK(cudaEventSynchronize(ev.stop));
      DUALCAST_CUDA_CHECK(cudaEventElapsedTime(&times[r], ev.start, ev.stop));
    }
    if (!ok) {
      (void)cudaGetLastError();  // a refused candidate must not be blamed on the next launch
      continue;
    }
    std::sort(times, times + kTimedReps);
    if (best_ms < 0.f || times[kTimedReps / 2] < best_ms) {
      best_ms = times[kTimedReps / 2];
      best = i;
    }
  }
  if (best_ms < 0.f) return false;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    const bool added = cache().emplace(key, cands[best].algo).second;
    g_searches += added ? 1 : 0;
    const cublasLtMatmulAlgo_t kept = cache().at(key);  // another thread's search may have won
    DUALCAST_LT_CHECK(run(lt, p, &kept, alpha, b, a, beta, c, s));
  }
  return true;
}

}  // namespace dualcast::detail

#endif  // DUALCAST_WITH_CUDA
