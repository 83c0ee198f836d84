// sgemm_splitk.cu: dualcast's split-K float32 product for matrices of few rows, its launcher, and the
// per-shape measured choice against cublasSgemm (sgemm_splitk.hpp says why).
//
// The kernel: C[M, N] = alpha A[M, K] op(B)[K, N] + beta C, row-major. A block computes one 64 x 64
// output tile over one chunk of K (blockIdx.z), 128 threads of 8 x 4 outputs each, the operands
// staged through shared memory 16 deep in a three-stage cp.async pipeline. Copies are 4 bytes wide:
// the HM-LSTM's rows are 2049 floats long, so no row after the first is 16-byte aligned; the copies are
// a few percent of the instructions (8 + 8 per thread per stage against 512 FFMA). Both operands sit
// in shared memory k-major ([k][m] and [k][n]), so a thread's fragments are float4 reads; the rows
// are 68 floats so that the transposing stores conflict 2-way, not 16-way.
// With more than one chunk, each block stores its partial tile in the workspace, and the last block
// of the tile to arrive (an atomic counter per tile, reset by that block for the next launch) sums
// the partials in chunk order and applies alpha and beta: the same sums in the same order on every
// run, whichever block is last.
#include "sgemm_splitk.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "dualcast/error.hpp"

#if DUALCAST_WITH_CUDA
#include <cuda_runtime_api.h>

#include "dualcast/stream.hpp"
#include "dualcast/tensor.hpp"
#include "per_device.hpp"
#include "sgemm_splitk_kernel.cuh"
#endif

namespace dualcast::detail {

namespace {

int env_mode() {
  const char* e = std::getenv("DUALCAST_SPLITK_GEMM");
  if (e && std::strcmp(e, "0") == 0) return static_cast<int>(SplitKMode::off);
  if (e && std::strcmp(e, "1") == 0) return static_cast<int>(SplitKMode::always);
  return static_cast<int>(SplitKMode::measured);
}
std::atomic<int> g_mode{env_mode()};

/// What a measured decision depends on: the device, the shape, the pitches and whether C is read.
using Key = std::tuple<int, bool, int, int, int, int, int, int, bool>;
std::mutex g_mu;
std::map<Key, bool>& decisions() {
  static auto* d = new std::map<Key, bool>();  // never destroyed (see PerDevice)
  return *d;
}
SplitKDecisions g_counts;

}  // namespace

void set_splitk_mode(SplitKMode mode) { g_mode = static_cast<int>(mode); }
SplitKMode splitk_mode() { return static_cast<SplitKMode>(g_mode.load()); }

SplitKDecisions splitk_decisions() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_counts;
}

#if DUALCAST_WITH_CUDA
namespace {

constexpr std::size_t kWorkspaceFloats = std::size_t{4} << 20;  // 16 MiB of partial tiles
using namespace sgemm_kernels;

struct Workspace {
  float* partials = nullptr;
  unsigned* counters = nullptr;
  int sms = 0;
};

Workspace workspace(Device device) {
  static PerDevice<Workspace> spaces;
  return spaces.get(device, "matmul", [&] {
    DeviceGuard guard(device);
    Workspace w;
    DUALCAST_CUDA_CHECK(cudaDeviceGetAttribute(&w.sms, cudaDevAttrMultiProcessorCount, device.index));
    // Outside the caching allocator, like cuBLAS's workspace (blas.cpp): lives until the process ends.
    DUALCAST_CUDA_CHECK(cudaMalloc(&w.partials, kWorkspaceFloats * sizeof(float)));
    DUALCAST_CUDA_CHECK(cudaMalloc(&w.counters, kMaxTiles * sizeof(unsigned)));
    DUALCAST_CUDA_CHECK(cudaMemset(w.counters, 0, kMaxTiles * sizeof(unsigned)));
    DUALCAST_CUDA_CHECK(cudaDeviceSynchronize());  // the zeroed counters before any kernel reads them
    return w;
  });
}


/// Two timing events, destroyed however the measurement ends.
struct Events {
  cudaEvent_t start = nullptr, stop = nullptr;
  Events() {
    DUALCAST_CUDA_CHECK(cudaEventCreate(&start));
    DUALCAST_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~Events() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
};

constexpr int kTimedReps = 5;  // per path, alternating, after one untimed run each; medians compared

}  // namespace

void splitk_prepare(Device device) {
  if (device.is_cuda()) (void)workspace(device);
}

bool splitk_applies(Device device, bool tb, int M, int N, int K) {
  (void)tb;
  if (splitk_mode() == SplitKMode::off) return false;
  // The shape first: most products are not for this kernel and need not make its workspace.
  if (M > kMaxRows || N < 2 * kBN || K < 4 * kBK) return false;
  return plan(workspace(device).sms, M, N, K, kWorkspaceFloats).splits > 0;
}

void splitk_sgemm(Device device, bool tb, int M, int N, int K, float alpha, const float* a, int lda,
                  const float* b, int ldb, float beta, float* c, int ldc) {
  const Workspace w = workspace(device);
  const Plan pl = plan(w.sms, M, N, K, kWorkspaceFloats);
  DUALCAST_CHECK(pl.splits > 0, "matmul: the split-K kernel does not apply to M=", M, " N=", N, " K=", K);
  DUALCAST_CHECK(lda >= K && ldb >= (tb ? K : N) && ldc >= N, "matmul: split-K kernel: pitches lda=", lda,
                 " ldb=", ldb, " ldc=", ldc, " too small for M=", M, " N=", N, " K=", K);
  const Args p{a, b, c, w.partials, w.counters, M, N, K, lda, ldb, ldc, pl.chunk, pl.splits, alpha, beta};
  DeviceGuard guard(device);
  const dim3 grid(static_cast<unsigned>(pl.tiles_n), static_cast<unsigned>(pl.tiles_m),
                  static_cast<unsigned>(pl.splits));
  if (tb) splitk_kernel<true><<<grid, kThreads, 0, stream(device)>>>(p);
  else splitk_kernel<false><<<grid, kThreads, 0, stream(device)>>>(p);
  DUALCAST_CUDA_CHECK_LAUNCH();
}

bool splitk_chosen(Device device, bool tb, int M, int N, int K, int lda, int ldb, int ldc, float beta,
                   const float* c, ProductRef cublas, ProductRef own) {
  const SplitKMode mode = splitk_mode();
  if (mode != SplitKMode::measured) return mode == SplitKMode::always;
  const Key key{device.index, tb, M, N, K, lda, ldb, ldc, beta == 0.f};
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = decisions().find(key);
    if (it != decisions().end()) return it->second;
  }
  DeviceGuard guard(device);
  const cudaStream_t s = stream(device);
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  DUALCAST_CUDA_CHECK(cudaStreamIsCapturing(s, &capturing));
  if (capturing != cudaStreamCaptureStatusNone) {
    // Nothing may be timed here: cuBLAS, and kept, so that later eager calls of the shape give the
    // captured graph's bits (a driver that runs a step eagerly before capturing decides there).
    std::lock_guard<std::mutex> lock(g_mu);
    const auto [it, added] = decisions().emplace(key, false);
    if (added) g_counts.cublas += 1;
    return it->second;
  }

  // Both on a scratch copy of C (beta != 0 reads it); the real C is written once, by the caller.
  const std::int64_t c_elems = std::int64_t{ldc} * (M - 1) + N;
  Tensor scratch_t = Tensor::empty({c_elems}, DType::float32, device);
  float* scratch = scratch_t.data<float>();
  const auto reset = [&] {
    if (beta != 0.f)
      DUALCAST_CUDA_CHECK(cudaMemcpyAsync(scratch, c, static_cast<std::size_t>(c_elems) * sizeof(float),
                                          cudaMemcpyDeviceToDevice, s));
  };
  const Events ev;
  float times[2][kTimedReps];
  const ProductRef paths[2] = {cublas, own};
  for (const ProductRef& f : paths) {
    reset();
    f(scratch);
  }
  for (int r = 0; r < kTimedReps; ++r)
    for (int i = 0; i < 2; ++i) {
      reset();
      DUALCAST_CUDA_CHECK(cudaEventRecord(ev.start, s));
      paths[i](scratch);
      DUALCAST_CUDA_CHECK(cudaEventRecord(ev.stop, s));
      DUALCAST_CUDA_CHECK(cudaEventSynchronize(ev.stop));
      DUALCAST_CUDA_CHECK(cudaEventElapsedTime(&times[i][r], ev.start, ev.stop));
    }
  for (auto& t : times) std::sort(t, t + kTimedReps);
  const float cublas_ms = times[0][kTimedReps / 2], own_ms = times[1][kTimedReps / 2];
  const bool pick_own = own_ms < cublas_ms;
  if (const char* log = std::getenv("DUALCAST_MATMUL_LOG"); log && std::strcmp(log, "1") == 0)
    std::fprintf(stderr, "dualcast: matmul float32 [%d x %d] x [%d x %d]%s on cuda:%d: split-K kernel %.2f us, "
                 "cublasSgemm %.2f us -> %s\n", M, K, K, N, tb ? " (B transposed)" : "", device.index,
                 own_ms * 1e3f, cublas_ms * 1e3f, pick_own ? "split-K kernel" : "cuBLAS");
  std::lock_guard<std::mutex> lock(g_mu);
  const auto [it, added] = decisions().emplace(key, pick_own);
  if (added) (it->second ? g_counts.own : g_counts.cublas) += 1;
  return it->second;  // another thread's measurement may have come first
}

#endif  // DUALCAST_WITH_CUDA

}  // namespace dualcast::detail
