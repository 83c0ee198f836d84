// blas_lt.cpp: float32 "highest" products through cuBLASLt with a per-shape algorithm search
// (set_matmul_autotune, precision.hpp; issue 31).
//
// Why: the HM-LSTM's gate products have M = 64 rows, and cublasSgemm's heuristic does not always pick
// well for them: for the top layer's [64, 1028] x [1028, 2049] it runs a kernel without split-K at
// 27 us, where cuBLASLt's own split-K algorithm takes 16 (experiments/hmlstm/lt_search_probe.cu on an
// H200, 2026-11-29). cuBLASLt offers the same exact-float32 kernels (compute type CUBLAS_COMPUTE_32F:
// no TF32) with split-K and other tilings. Which one is fastest depends on the shape and the GPU, so,
// as cuDNN's Find does for the convolutions, each new shape times the candidates once and keeps the
// fastest: cublasSgemm itself (so a search never makes a shape slower than the default), cuBLASLt's
// heuristic list and split-K variants of its best few. Each candidate is timed as throughput, bursts
// of back-to-back calls (a step runs its products back to back; a single call from an idle stream
// favours different kernels: the search of 2026-11-28 timed single calls and lost 1.2% in the step).
// Split-K changes the order of the sums, not the precision: results are float32 sums of exact float32
// products, equal to cublasSgemm's within float32 rounding; a shape's choice is fixed once made, so
// eager and captured steps give identical bits.
//
// A shape first met inside a Graph capture cannot be timed (nothing may synchronise): it keeps
// cublasSgemm, cached like a searched choice so that later eager calls give the captured bits (run a
// step eagerly before capturing it, as the drivers do, to have it searched). Two threads meeting a
// new shape at once may both search it; the first result is kept. The descriptors of a shape are
// made once and kept with its choice (eager steps pay a map lookup per product, not four descriptor
// constructions).
#include "blas.hpp"

#if DUALCAST_WITH_CUDA

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
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
constexpr int kBursts = 3;      // per candidate, after one untimed call; the median burst is kept
constexpr int kBurstCalls = 8;  // back-to-back calls per burst
constexpr float kLongCallMs = 0.25f;
// cuBLASLt is chosen only when it beats cublasSgemm by more than timing noise: where they tie (often
// the same kernel), the default path's bits are kept, and two processes agree more often.
constexpr float kLtMargin = 0.97f;

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

/// Everything an algorithm's validity and speed depend on.
using Key = std::tuple<int, bool, bool, int, int, int, int, int, int, std::int64_t, std::int64_t, std::int64_t,
                       int, bool, int>;

/// A shape's choice: cuBLASLt's algorithm with the shape's descriptors, or cublasSgemm (lt false).
struct Choice {
  bool lt = false;
  cublasLtMatmulAlgo_t algo{};
  std::shared_ptr<const Problem> problem;
};

std::mutex g_mu;
std::map<Key, Choice>& cache() {
  static auto* c = new std::map<Key, Choice>();  // never destroyed (see PerDevice)
  return *c;
}
std::int64_t g_searches = 0;

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

/// Milliseconds per call of `call` (which returns false when the candidate refuses the problem) run
/// back to back: one untimed call, then the median of kBursts bursts of kBurstCalls calls (one burst
/// for a product that takes longer than kLongCallMs, where launch effects no longer matter and the
/// search would take seconds); negative when it refused.
template <class F>
float burst_ms(const EventPair& ev, cudaStream_t s, F&& call) {
  if (!call()) return -1.f;
  float times[kBursts];
  int bursts = 0;
  while (bursts < kBursts) {
    float& t = times[bursts++];
    DUALCAST_CUDA_CHECK(cudaEventRecord(ev.start, s));
    for (int i = 0; i < kBurstCalls; ++i)
      if (!call()) return -1.f;
    DUALCAST_CUDA_CHECK(cudaEventRecord(ev.stop, s));
    DUALCAST_CUDA_CHECK(cudaEventSynchronize(ev.stop));
    DUALCAST_CUDA_CHECK(cudaEventElapsedTime(&t, ev.start, ev.stop));
    t /= kBurstCalls;
    if (t > kLongCallMs) return t;
  }
  std::sort(times, times + kBursts);
  return times[kBursts / 2];
}

/// The descriptors of a row-major product (see lt_sgemm for the operand swap).
std::shared_ptr<const Problem> make_problem(bool ta, bool tb, int M, int N, int K, int lda, std::int64_t sa,
                                            int ldb, std::int64_t sb, int ldc, std::int64_t sc, int batch) {
  auto p = std::make_shared<Problem>();
  const cublasOperation_t opx = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opy = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  DUALCAST_LT_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  DUALCAST_LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opx, sizeof opx));
  DUALCAST_LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opy, sizeof opy));
  layout(&p->a, tb ? K : N, tb ? N : K, ldb, batch, sb);
  layout(&p->b, ta ? M : K, ta ? K : M, lda, batch, sa);
  layout(&p->c, N, M, ldc, batch, sc);
  return p;
}

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
              std::int64_t sc, int batch, const std::function<void(float*)>& sgemm) {
  const Lt lt = lt_of(device);
  DeviceGuard guard(device);
  const cudaStream_t s = stream(device);
  // Column-major C^T[N, M] = op(B)^T[N, K] op(A)^T[K, M], as cuda_gemm (blas.cpp): cuBLASLt's first
  // operand is B's buffer with B's transpose flag, its second A's.
  const int align = std::min({alignment(a), alignment(b), alignment(c)});
  const Key key{device.index, ta, tb, M, N, K, lda, ldb, ldc, sa, sb, sc, batch, beta == 0.f, align};
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = cache().find(key);
    if (it != cache().end()) {
      if (!it->second.lt) return false;
      DUALCAST_LT_CHECK(run(lt, *it->second.problem, &it->second.algo, alpha, b, a, beta, c, s));
      return true;
    }
  }
  auto keep = [&](Choice choice, bool searched) {
    std::lock_guard<std::mutex> lock(g_mu);
    const bool added = cache().emplace(key, std::move(choice)).second;
    g_searches += added && searched ? 1 : 0;
    return cache().at(key);  // another thread's search may have won
  };
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  DUALCAST_CUDA_CHECK(cudaStreamIsCapturing(s, &capturing));
  if (capturing != cudaStreamCaptureStatusNone) {  // nothing may be timed: cublasSgemm, for good
    const Choice kept = keep(Choice{}, false);
    if (!kept.lt) return false;
    DUALCAST_LT_CHECK(run(lt, *kept.problem, &kept.algo, alpha, b, a, beta, c, s));
    return true;
  }

  const std::shared_ptr<const Problem> problem = make_problem(ta, tb, M, N, K, lda, sa, ldb, sb, ldc, sc, batch);
  const std::vector<Candidate> cands = candidates(lt.handle, *problem, align);
  // Time each candidate, cublasSgemm first, on a scratch copy of C (beta != 0 reads it; the real C is
  // written once, by the winner, below). The scratch comes from dualcast's caching allocator, ordered
  // on its stream.
  const std::int64_t c_elems = (sc > 0 ? sc * (batch - 1) : 0) + std::int64_t{ldc} * (M - 1) + N;
  Tensor scratch_t = Tensor::empty({c_elems}, DType::float32, device);
  float* scratch = scratch_t.data<float>();
  auto fresh_scratch = [&] {
    if (beta != 0.f)
      DUALCAST_CUDA_CHECK(cudaMemcpyAsync(scratch, c, static_cast<std::size_t>(c_elems) * sizeof(float),
                                          cudaMemcpyDeviceToDevice, s));
  };
  const EventPair ev;
  fresh_scratch();
  const float sgemm_ms = burst_ms(ev, s, [&] {
    sgemm(scratch);
    return true;
  });
  float best_ms = kLtMargin * sgemm_ms;
  int best = -1;  // cublasSgemm
  for (std::size_t i = 0; i < cands.size(); ++i) {
    fresh_scratch();
    const float ms = burst_ms(ev, s, [&] {
      return run(lt, *problem, &cands[i].algo, alpha, b, a, beta, scratch, s) == CUBLAS_STATUS_SUCCESS;
    });
    if (ms < 0.f) {
      (void)cudaGetLastError();  // a refused candidate must not be blamed on the next launch
      continue;
    }
    if (ms < best_ms) {
      best_ms = ms;
      best = static_cast<int>(i);
    }
  }
  Choice choice;
  if (best >= 0) choice = Choice{true, cands[static_cast<std::size_t>(best)].algo, problem};
  const Choice kept = keep(std::move(choice), true);
  if (!kept.lt) return false;
  DUALCAST_LT_CHECK(run(lt, *kept.problem, &kept.algo, alpha, b, a, beta, c, s));
  return true;
}

}  // namespace dualcast::detail

#endif  // DUALCAST_WITH_CUDA
