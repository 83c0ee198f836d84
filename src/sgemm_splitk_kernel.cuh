// sgemm_splitk_kernel.cuh (private): the kernel of dualcast's split-K float32 product for few rows
// (sgemm_splitk.cu has the launcher and says how it works). A header of its own so that its very code
// also runs on the CPU under tests/emulation/cuda_emulation.hpp (DUALCAST_SGEMM_EMULATION), as the
// fused attention kernels do: that is how CI, which has no GPU, checks its logic.
#pragma once

#include <cstddef>

namespace dualcast::detail::sgemm_kernels {

constexpr int kBM = 64, kBN = 64, kBK = 16, kStages = 3, kThreads = 128;
constexpr int kPitch = kBM + 4;  // floats per shared row (kBM == kBN)
constexpr int kTile = kBM * kBN;
constexpr int kBlocksPerSm = 2;  // the grid the split aims at
constexpr int kMaxTiles = 4096;  // tile counters in the workspace
constexpr int kMaxRows = 256;    // "few rows"

struct Args {
  const float* a;
  const float* b;
  float* c;
  float* ws;
  unsigned* counters;
  int M, N, K, lda, ldb, ldc;
  int chunk;   // K per split, a multiple of kBK
  int splits;  // gridDim.z
  float alpha, beta;
};

/// The operands' shared-memory stages, k-major; 16-byte aligned for the fragments' float4 reads.
struct alignas(16) Stages {
  float a[kStages][kBK][kPitch];
  float b[kStages][kBK][kPitch];
};

struct Plan {
  int tiles_n = 0, tiles_m = 0, chunk = 0, splits = 0;
};

/// The grid: the split of K that gives about kBlocksPerSm blocks per SM, in whole kBK slices, shrunk
/// until the partial tiles fit the workspace (of workspace_floats). splits == 0: not for this kernel.
inline Plan plan(int sms, int M, int N, int K, std::size_t workspace_floats) {
  Plan pl;
  if (M < 1 || M > kMaxRows || N < 2 * kBN || K < 4 * kBK) return pl;
  pl.tiles_n = (N + kBN - 1) / kBN;
  pl.tiles_m = (M + kBM - 1) / kBM;
  const int tiles = pl.tiles_n * pl.tiles_m;
  if (tiles > kMaxTiles) return pl;
  const int slices = (K + kBK - 1) / kBK;
  int want = kBlocksPerSm * sms / tiles;
  want = want < 1 ? 1 : (want > slices ? slices : want);
  while (want > 1 && static_cast<std::size_t>(want) * tiles * kTile > workspace_floats) --want;
  pl.chunk = (slices + want - 1) / want * kBK;
  pl.splits = (K + pl.chunk - 1) / pl.chunk;
  return pl;
}

/// cp.async of 4 bytes; src-size 0 copies nothing and zero-fills: the tile's edges past M, N or K
/// read as zeros.
__device__ __forceinline__ void copy4(float* dst, const float* src, bool pred) {
#if defined(DUALCAST_SGEMM_EMULATION)
  emu::cp_async(dst, src, 4, pred ? 4 : 0);
#else
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(src), "r"(pred ? 4 : 0));
#endif
}
__device__ __forceinline__ void commit() {
#if defined(DUALCAST_SGEMM_EMULATION)
  emu::cp_async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ __forceinline__ void wait_pending() {
#if defined(DUALCAST_SGEMM_EMULATION)
  emu::cp_async_wait(N);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

/// Stage <- the k-slice [k0, k0 + kBK) of the tile: A's rows m0.., op(B)'s columns n0... Thread t copies
/// rows t/16 + 8i at column t%16 of each [rows][k] operand (16 consecutive threads read 64 contiguous
/// bytes), and for B stored [K, N] rows t/64 + 2i at column t%64.
template <bool TB>
__device__ __forceinline__ void load_stage(const Args& p, float (*As)[kPitch], float (*Bs)[kPitch], int m0, int n0,
                                           int k0) {
  const int t = static_cast<int>(threadIdx.x);
  constexpr int kCopies = kBM * kBK / kThreads;  // 8 per operand
  {
    const int row = t / kBK, kk = t % kBK, gk = k0 + kk;
    const float* src = p.a + static_cast<std::size_t>(m0 + row) * p.lda + gk;
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const bool ok = m0 + row + i * (kThreads / kBK) < p.M && gk < p.K;
      copy4(&As[kk][row + i * (kThreads / kBK)], ok ? src + static_cast<std::size_t>(i) * (kThreads / kBK) * p.lda : p.a, ok);
    }
  }
  if constexpr (TB) {  // B stored [N, K]: read along k, as A
    const int row = t / kBK, kk = t % kBK, gk = k0 + kk;
    const float* src = p.b + static_cast<std::size_t>(n0 + row) * p.ldb + gk;
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const bool ok = n0 + row + i * (kThreads / kBK) < p.N && gk < p.K;
      copy4(&Bs[kk][row + i * (kThreads / kBK)], ok ? src + static_cast<std::size_t>(i) * (kThreads / kBK) * p.ldb : p.b, ok);
    }
  } else {  // B stored [K, N]: read along n
    const int kk = t / kBN, n = t % kBN, gn = n0 + n;
    const float* src = p.b + static_cast<std::size_t>(k0 + kk) * p.ldb + gn;
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const int step = i * (kThreads / kBN);  // rows kk + 2i
      const bool ok = gn < p.N && k0 + kk + step < p.K;
      copy4(&Bs[kk + step][n], ok ? src + static_cast<std::size_t>(step) * p.ldb : p.b, ok);
    }
  }
}

/// C's element (gm, gn) <- alpha v + beta C (C not read when beta is 0: it may hold anything).
__device__ __forceinline__ void store_c(const Args& p, int gm, int gn, float v) {
  if (gm >= p.M || gn >= p.N) return;
  float* cp = p.c + static_cast<std::size_t>(gm) * p.ldc + gn;
  *cp = p.beta == 0.f ? p.alpha * v : p.alpha * v + p.beta * *cp;
}

template <bool TB>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) splitk_kernel(const Args p) {
  __shared__ Stages sm;  // the alignment in the type: the emulation's __shared__ is `static`
  float(*As)[kBK][kPitch] = sm.a;
  float(*Bs)[kBK][kPitch] = sm.b;
  __shared__ bool last_block;

  const int t = static_cast<int>(threadIdx.x);
  const int tm = t / 16, tn = t % 16;  // rows tm*8 .. +8, columns tn*4 .. +4 of the tile
  const int m0 = static_cast<int>(blockIdx.y) * kBM, n0 = static_cast<int>(blockIdx.x) * kBN;
  const int k_begin = static_cast<int>(blockIdx.z) * p.chunk;
  const int k_end = p.K < k_begin + p.chunk ? p.K : k_begin + p.chunk;
  const int ktiles = (k_end - k_begin + kBK - 1) / kBK;

  float acc[8][4];
#pragma unroll
  for (int r = 0; r < 8; ++r)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[r][j] = 0.f;

  // One commit per stage slot even when there is nothing to load, so that wait_pending's count of
  // outstanding groups means the same in every iteration.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ktiles) load_stage<TB>(p, As[s], Bs[s], m0, n0, k_begin + s * kBK);
    commit();
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    wait_pending<kStages - 2>();
    __syncthreads();  // stage kt is in for every thread, and stage kt-1 is no longer being read
    const int next = kt + kStages - 1;
    if (next < ktiles) load_stage<TB>(p, As[next % kStages], Bs[next % kStages], m0, n0, k_begin + next * kBK);
    commit();
    const int st = kt % kStages;
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      const float4 a0 = *reinterpret_cast<const float4*>(&As[st][kk][tm * 8]);
      const float4 a1 = *reinterpret_cast<const float4*>(&As[st][kk][tm * 8 + 4]);
      const float4 b0 = *reinterpret_cast<const float4*>(&Bs[st][kk][tn * 4]);
      const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
      const float bv[4] = {b0.x, b0.y, b0.z, b0.w};
#pragma unroll
      for (int r = 0; r < 8; ++r)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[r][j] = fmaf(av[r], bv[j], acc[r][j]);
    }
  }
  wait_pending<0>();

  if (p.splits == 1) {
#pragma unroll
    for (int r = 0; r < 8; ++r)
#pragma unroll
      for (int j = 0; j < 4; ++j) store_c(p, m0 + tm * 8 + r, n0 + tn * 4 + j, acc[r][j]);
    return;
  }

  // Split K: publish this chunk's partial tile, then the last of the tile's blocks sums them.
  const int tile = static_cast<int>(blockIdx.y * gridDim.x + blockIdx.x);
  const int tiles = static_cast<int>(gridDim.x * gridDim.y);
  const auto slot = [&](int z) { return p.ws + (static_cast<std::size_t>(z) * tiles + tile) * kTile; };
  float* mine = slot(static_cast<int>(blockIdx.z));
#pragma unroll
  for (int r = 0; r < 8; ++r)
    *reinterpret_cast<float4*>(&mine[(tm * 8 + r) * kBN + tn * 4]) =
        make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
  __threadfence();  // the partial is visible device-wide before the counter says so
  __syncthreads();
  if (t == 0) last_block = atomicAdd(&p.counters[tile], 1u) == static_cast<unsigned>(p.splits - 1);
  __syncthreads();
  if (!last_block) return;
  __threadfence();

  float sum[8][4];
#pragma unroll
  for (int r = 0; r < 8; ++r)
#pragma unroll
    for (int j = 0; j < 4; ++j) sum[r][j] = 0.f;
  for (int z = 0; z < p.splits; ++z) {
    const float* part = slot(z);
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      // Own chunk from registers (the same bits as stored); the others through L2 (__ldcg: this SM's
      // L1 never held them, and must not serve a stale line).
      const float4 v = z == static_cast<int>(blockIdx.z)
                           ? make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3])
                           : __ldcg(reinterpret_cast<const float4*>(&part[(tm * 8 + r) * kBN + tn * 4]));
      sum[r][0] += v.x;
      sum[r][1] += v.y;
      sum[r][2] += v.z;
      sum[r][3] += v.w;
    }
  }
#pragma unroll
  for (int r = 0; r < 8; ++r)
#pragma unroll
    for (int j = 0; j < 4; ++j) store_c(p, m0 + tm * 8 + r, n0 + tn * 4 + j, sum[r][j]);
  if (t == 0) p.counters[tile] = 0u;  // ready for the next launch (and graph replay)
}

}  // namespace dualcast::detail::sgemm_kernels
