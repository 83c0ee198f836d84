// gemm_skinny.cu: the skinny tensor-core product (gemm_skinny.hpp says why) and the measured choice
// between it and cuBLAS. Compiled as plain C++ in a CPU-only build, where skinny_gemm_fits is false.
//
// Kernel layout. A block of 4 warps owns the 64 x 64 tile of C at columns [64 bx, 64 bx + 64) and
// one slice of the inner dimension, [by * kc, (by + 1) * kc), walked 64 at a time. The slice's steps
// stream through a ring of 4 shared-memory stages by cp.async, all issued before the first product,
// so a block waits about one memory round trip, not one per step. The copies are as wide as the
// operand's address and pitch allow (16, 8 or 4 bytes, chosen per launch; 16-bit data at an odd
// pitch is loaded without cp.async), and the partial tiles at the edges are zero-filled by the
// copies themselves (cp.async's source size). Why so: the first version staged one step in
// registers with per-row checks and pair loads; ncu showed 8.5 warp cycles per instruction and
// about 2400 instructions per warp for 128 mma, i.e. bound by instruction issue at 11.5% occupancy.
//
// Warp w multiplies the 16 rows [16 w, 16 w + 16) by all 64 columns (mma.sync m16n8k16, float32
// sums, 32 accumulators per lane), so each A fragment is read, and a float32 A rounded (one cvt per
// pair), by one warp only. Fragments come from ldmatrix: B stored [n, k] is kept as [n][k] and read
// plainly, B stored [k, n] is kept as [k][n] and read with .trans. 16-bit tiles have a pitch of 72
// halves and a float32 A one of 72 floats, so a fragment load touches 32 distinct banks.
//
// Split-K on a thread-block cluster (Hopper). The slices of one column tile, at most 8, are one
// cluster. Each block leaves its partial 64 x 64 tile in its own shared memory; after a cluster
// barrier, block r adds up the r-th share of the tile's elements over the slices in the order 0, 1,
// ... (reading the others' shared memory) and writes C, and a second barrier keeps every block's
// partial alive until all have read it. So the sum is on chip, needs no workspace or counters, and
// does not depend on which block finishes first. The split aims at about 2 blocks per SM.
#include "gemm_skinny.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "dualcast/error.hpp"
#include "dualcast/launch.hpp"

#if defined(__CUDACC__)
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "dualcast/half.hpp"
#include "dualcast/stream.hpp"
#include "per_device.hpp"
#endif

namespace dualcast::detail {

#if defined(__CUDACC__)
namespace {

constexpr int kTile = 64;      // rows (all of m), columns and inner-dimension step of a block
constexpr int kThreads = 128;  // 4 warps, one per 16 rows
constexpr int kStages = 4;     // shared-memory stages: the whole slice in flight when it is <= 256 deep
constexpr int kPitch = 72;     // elements per shared-memory row of a tile (16-bit or float32 A)
constexpr int kMaxSlices = 8;  // the portable cluster size

template <class SA>
constexpr int kStageA = kTile * kPitch * static_cast<int>(sizeof(SA));  // bytes of A in a stage
constexpr int kStageB = kTile * kPitch * 2;
template <class SA>
constexpr int kStage = kStageA<SA> + kStageB;
template <class SA>
constexpr int kSmem = kStages * kStage<SA>;  // 110.6 KB with a float32 A, 73.7 KB with a 16-bit one
static_assert(kTile * kPitch * sizeof(float) <= kSmem<std::uint16_t>, "the partial tile must fit in the stages");

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

/// Copies V bytes from global src to shared dst, of which the first `bytes` are read and the rest
/// zero-filled (0 reads nothing). 16-byte copies bypass L1: nothing a block copies is read twice.
template <int V>
__device__ __forceinline__ void cp_async(void* dst, const void* src, int bytes) {
  if constexpr (V == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes)
                 : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_addr(dst)), "l"(src), "n"(V),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/// Four 8 x 8 16-bit matrices from shared memory, lane 8 q + r giving row r of matrix q (ldmatrix).
template <bool kTrans>
__device__ __forceinline__ void ldsm4(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, const void* p) {
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_addr(p))
                 : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_addr(p))
                 : "memory");
}

/// Two floats rounded to nearest even as a 16-bit pair, `lo` in the low half (one cvt).
template <class B16>
__device__ __forceinline__ unsigned pack_pair(float lo, float hi) {
  unsigned r;
  if constexpr (std::is_same_v<B16, bfloat16>) asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  else asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

/// d += a b for one m16n8k16 fragment (float32 accumulators).
template <class B16>
__device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  if constexpr (std::is_same_v<B16, bfloat16>)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Copies all V bytes (a chunk inside the operand).
template <int V>
__device__ __forceinline__ void cp_async_full(void* dst, const void* src) {
  if constexpr (V == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(smem_addr(dst)), "l"(src), "n"(V) : "memory");
}

/// Issues the copies of one 64 x 64 tile of ES-byte elements at src (row-major, pitch ld elements;
/// rows < rows_ok and columns < cols_ok are read, the rest zero-filled) into dst (pitch kPitch), in
/// V-byte chunks. Thread i takes the chunk column i % (chunks per row) of every (128 / that)-th row,
/// so its column, and with it how many of its bytes are valid, is fixed. A tile wholly inside the
/// operand (all but the last step and column tile) takes copies without a source size: counted in
/// the SASS, the size selects made a copy about 17 instructions and the copies 60% of a warp's work.
/// V == ES == 2 (16-bit data at an odd pitch) cannot use cp.async: plain loads, correct and slow.
template <int V, int ES>
__device__ __forceinline__ void copy_tile(unsigned char* dst, const unsigned char* src, std::int64_t ld, int rows_ok,
                                          int cols_ok) {
  constexpr int E = V / ES;              // elements per chunk
  constexpr int kPerRow = kTile / E;     // chunks per row
  constexpr int kRowStep = kThreads / kPerRow;
  constexpr int kIters = kTile / kRowStep;
  const int r0 = static_cast<int>(threadIdx.x) / kPerRow, col = (static_cast<int>(threadIdx.x) % kPerRow) * E;
  const unsigned char* g = src + (r0 * ld + col) * ES;
  const std::int64_t g_step = kRowStep * ld * ES;
  unsigned char* d = dst + (r0 * kPitch + col) * ES;
  if (V != 2 && rows_ok >= kTile && cols_ok >= kTile) {  // uniform over the block
#pragma unroll
    for (int q = 0; q < kIters; ++q) cp_async_full<V == 2 ? 4 : V>(d + q * kRowStep * kPitch * ES, g + q * g_step);
    return;
  }
  const int col_bytes = min(max(cols_ok - col, 0), E) * ES;
#pragma unroll
  for (int q = 0; q < kIters; ++q) {
    const int bytes = r0 + q * kRowStep < rows_ok ? col_bytes : 0;
    unsigned char* dq = d + q * kRowStep * kPitch * ES;
    if constexpr (V == ES && ES == 2) {
      *reinterpret_cast<std::uint16_t*>(dq) = bytes ? *reinterpret_cast<const std::uint16_t*>(g) : 0;
    } else {
      cp_async<V>(dq, bytes ? g : src, bytes);
    }
    g += g_step;
  }
}

/// copy_tile with the chunk width `v` chosen at launch (uniform over the grid).
template <int ES>
__device__ __forceinline__ void copy_tile_v(int v, void* dst, const void* src, std::int64_t ld, int rows_ok,
                                            int cols_ok) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  if (v == 16) copy_tile<16, ES>(d, s, ld, rows_ok, cols_ok);
  else if (v == 8) copy_tile<8, ES>(d, s, ld, rows_ok, cols_ok);
  else if (ES == 4 || v == 4) copy_tile<4, ES>(d, s, ld, rows_ok, cols_ok);
  else copy_tile<ES, ES>(d, s, ld, rows_ok, cols_ok);
}

struct SkinnyArgs {
  const void* a;
  const void* b;
  float* c;
  std::int64_t lda, ldb, ldc;
  int m, n, k, kc, slices;
  int va, vb;    // copy widths in bytes for A's and B's tiles (16, 8, 4; 2 for 16-bit at an odd pitch)
  bool c_vec4;   // C's rows take float4 stores (ldc % 4 == 0 and c 16-byte aligned)
};

template <class B16, class SA, bool kTransB>
__global__ void __launch_bounds__(kThreads) skinny_gemm_kernel(SkinnyArgs p) {
  extern __shared__ __align__(16) unsigned char smem[];
  chain_wait();  // launched chained (dualcast/launch.hpp): nothing is read or written before this
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;  // the mma fragment's group and thread in group
  const int lq = lane / 8, lr = lane % 8;  // the ldmatrix matrix and row this lane addresses
  const int n0 = blockIdx.x * kTile;
  const int k_begin = blockIdx.y * p.kc, k_end = min(p.k, k_begin + p.kc);
  const int steps = (k_end - k_begin + kTile - 1) / kTile;
  const auto* A = static_cast<const SA*>(p.a);
  const auto* B = static_cast<const std::uint16_t*>(p.b);

  auto issue = [&](int s) {  // the copies of step s into stage s % kStages
    unsigned char* st = smem + (s % kStages) * kStage<SA>;
    const int k0 = k_begin + s * kTile, kn = min(kTile, k_end - k0);
    copy_tile_v<sizeof(SA)>(p.va, st, A + k0, p.lda, p.m, kn);
    if constexpr (kTransB)
      copy_tile_v<2>(p.vb, st + kStageA<SA>, B + static_cast<std::int64_t>(n0) * p.ldb + k0, p.ldb, p.n - n0, kn);
    else
      copy_tile_v<2>(p.vb, st + kStageA<SA>, B + static_cast<std::int64_t>(k0) * p.ldb + n0, p.ldb, kn, p.n - n0);
  };
  // One commit group per stage, empty ones included, so that "all but the newest kStages - 1 groups
  // have landed" always means "step s has landed".
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    if (s < steps) issue(s);
    cp_async_commit();
  }

  float acc[8][4] = {};
  const bool active = warp * 16 < p.m;  // uniform over the warp: rows beyond m are not multiplied
  for (int s = 0; s < steps; ++s) {
    cp_async_wait<kStages - 1>();
    __syncthreads();  // every thread's copies of step s are visible
    const unsigned char* st = smem + (s % kStages) * kStage<SA>;
    const auto* bs = reinterpret_cast<const std::uint16_t*>(st + kStageA<SA>);
    if (active) {
#pragma unroll
      for (int kk = 0; kk < kTile; kk += 16) {
        unsigned a[4];
        if constexpr (sizeof(SA) == 4) {
          const float* r0 = reinterpret_cast<const float*>(st) + (warp * 16 + g) * kPitch + kk + 2 * t;
          const float2 x0 = *reinterpret_cast<const float2*>(r0);
          const float2 x1 = *reinterpret_cast<const float2*>(r0 + 8 * kPitch);
          const float2 x2 = *reinterpret_cast<const float2*>(r0 + 8);
          const float2 x3 = *reinterpret_cast<const float2*>(r0 + 8 * kPitch + 8);
          a[0] = pack_pair<B16>(x0.x, x0.y);
          a[1] = pack_pair<B16>(x1.x, x1.y);
          a[2] = pack_pair<B16>(x2.x, x2.y);
          a[3] = pack_pair<B16>(x3.x, x3.y);
        } else {
          const auto* as = reinterpret_cast<const std::uint16_t*>(st);
          ldsm4<false>(a[0], a[1], a[2], a[3], as + (warp * 16 + lr + 8 * (lq % 2)) * kPitch + kk + 8 * (lq / 2));
        }
        unsigned b[8][2];
#pragma unroll
        for (int j = 0; j < 8; j += 2) {
          if constexpr (kTransB)
            ldsm4<false>(b[j][0], b[j][1], b[j + 1][0], b[j + 1][1],
                         bs + (8 * (j + lq / 2) + lr) * kPitch + kk + 8 * (lq % 2));
          else
            ldsm4<true>(b[j][0], b[j][1], b[j + 1][0], b[j + 1][1],
                        bs + (kk + 8 * (lq % 2) + lr) * kPitch + 8 * (j + lq / 2));
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) mma<B16>(acc[j], a, b[j][0], b[j][1]);
      }
    }
    if (s + kStages < steps) {
      __syncthreads();  // every warp is done with the stage before it is refilled
      issue(s + kStages);
    }
    cp_async_commit();
  }
  cp_async_wait<0>();  // only empty groups remain; nothing may land in the partial tile below
  __syncthreads();     // every warp is done with the stages before they become the partial tile

  // Accumulator (j, e) is C's row 16 warp + g + 8 (e / 2), tile column 8 j + 2 t + e % 2.
  if (p.slices == 1) {
    if (!active) return;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = warp * 16 + g + 8 * (e / 2), col = n0 + j * 8 + 2 * t + e % 2;
        if (row < p.m && col < p.n) p.c[row * p.ldc + col] = acc[j][e];
      }
    return;
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  float* part = reinterpret_cast<float*>(smem);  // [64][kPitch]: rows beyond m are never read
  if (active) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int row = warp * 16 + g, col = j * 8 + 2 * t;
      *reinterpret_cast<float2*>(part + row * kPitch + col) = make_float2(acc[j][0], acc[j][1]);
      *reinterpret_cast<float2*>(part + (row + 8) * kPitch + col) = make_float2(acc[j][2], acc[j][3]);
    }
  }
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  // Every slice's partial is in its block's shared memory (release by each block, acquire by all).
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
  const int rank = static_cast<int>(cluster.block_rank());
  const int rows = min(kTile, p.m), cols = min(kTile, p.n - n0);
  // Block `rank` sums the rank-th share of the tile's float4 groups (4 consecutive columns), a
  // multiple of 8 groups so that a warp's reads start on a row of banks. All slices' loads are issued
  // before the first add; the adds run in slice order.
  const int groups = rows * (kTile / 4), share = ((groups + p.slices - 1) / p.slices + 7) / 8 * 8;
  const int g_end = min(groups, (rank + 1) * share);
  for (int q = rank * share + threadIdx.x; q < g_end; q += kThreads) {
    const int row = q / (kTile / 4), col = 4 * (q % (kTile / 4));
    if (col >= cols) continue;
    float4 v[kMaxSlices];
#pragma unroll
    for (int z = 0; z < kMaxSlices; ++z)
      if (z < p.slices) v[z] = *reinterpret_cast<const float4*>(cluster.map_shared_rank(part, z) + row * kPitch + col);
    float4 s = v[0];
#pragma unroll
    for (int z = 1; z < kMaxSlices; ++z)
      if (z < p.slices) {
        s.x += v[z].x;
        s.y += v[z].y;
        s.z += v[z].z;
        s.w += v[z].w;
      }
    float* out = p.c + row * p.ldc + n0 + col;
    if (p.c_vec4 && col + 3 < cols) {
      *reinterpret_cast<float4*>(out) = s;
    } else {
      out[0] = s.x;
      if (col + 1 < cols) out[1] = s.y;
      if (col + 2 < cols) out[2] = s.z;
      if (col + 3 < cols) out[3] = s.w;
    }
  }
  // No block leaves while another may still read its partial. Relaxed: nothing written here needs
  // ordering for the others (cluster.sync's default would also wait for the C stores: a MEMBAR.GPU).
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
#else
  __trap();  // code built for a GPU without clusters never reaches here (skinny_gemm_fits)
#endif
}

/// Per device: the SM count and whether clusters exist (compute capability 9.0 or newer).
struct SkinnyDevice {
  int sms = 0;
  bool clusters = false;
};

SkinnyDevice skinny_device(Device device) {
  static PerDevice<SkinnyDevice> devices;
  return devices.get(device, "matmul_rounded", [&] {
    SkinnyDevice s;
    int major = 0;
    DUALCAST_CUDA_CHECK(cudaDeviceGetAttribute(&s.sms, cudaDevAttrMultiProcessorCount, device.index));
    DUALCAST_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device.index));
    s.clusters = major >= 9;
    return s;
  });
}

/// Raises a kernel's dynamic shared-memory limit to what it uses, once per device.
template <class B16, class SA, bool kTransB>
void allow_smem(Device device) {
  static PerDevice<bool> raised;
  raised.get(device, "matmul_rounded", [] {
    DUALCAST_CUDA_CHECK(cudaFuncSetAttribute(skinny_gemm_kernel<B16, SA, kTransB>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem<SA>));
    return true;
  });
}

template <class B16, class SA, bool kTransB>
void launch(Device device, dim3 grid, const SkinnyArgs& args, cudaStream_t s) {
  allow_smem<B16, SA, kTransB>(device);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmem<SA>;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = grid.y;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = static_cast<unsigned>(add_chain_attribute(device, attr, 1));
  DUALCAST_CUDA_CHECK(cudaLaunchKernelEx(&cfg, skinny_gemm_kernel<B16, SA, kTransB>, args));
}

template <class B16, class SA>
void launch(Device device, bool trans_b, dim3 grid, const SkinnyArgs& args, cudaStream_t s) {
  if (trans_b) launch<B16, SA, true>(device, grid, args, s);
  else launch<B16, SA, false>(device, grid, args, s);
}

/// How many clusters of each size (1..8) of one kernel the device keeps resident at once, with the
/// kernel's shared memory (cudaOccupancyMaxActiveClusters). The split keeps a launch within that, so
/// that it runs in one wave: on an H200, 33 clusters of 7 blocks of 110.6 KB took 16.1 us for the
/// forward gate product (K = 1540), while 33 clusters of 6 took 9.2 us at K = 1028.
struct ClusterFit {
  int max_clusters[kMaxSlices + 1] = {};
};

template <class B16, class SA, bool kTransB>
ClusterFit cluster_fit(Device device) {
  static PerDevice<ClusterFit> fits;
  return fits.get(device, "matmul_rounded", [&] {
    allow_smem<B16, SA, kTransB>(device);
    ClusterFit f;
    for (int size = 1; size <= kMaxSlices; ++size) {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(1, static_cast<unsigned>(size));
      cfg.blockDim = dim3(kThreads);
      cfg.dynamicSmemBytes = kSmem<SA>;
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim.x = 1;
      attr[0].val.clusterDim.y = static_cast<unsigned>(size);
      attr[0].val.clusterDim.z = 1;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      DUALCAST_CUDA_CHECK(
          cudaOccupancyMaxActiveClusters(&f.max_clusters[size], skinny_gemm_kernel<B16, SA, kTransB>, &cfg));
    }
    return f;
  });
}

ClusterFit cluster_fit(Device device, DType a_dtype, DType b16, bool trans_b) {
  const bool a32 = a_dtype == DType::float32;
  if (b16 == DType::bfloat16) {
    if (a32) return trans_b ? cluster_fit<bfloat16, float, true>(device) : cluster_fit<bfloat16, float, false>(device);
    return trans_b ? cluster_fit<bfloat16, bfloat16, true>(device) : cluster_fit<bfloat16, bfloat16, false>(device);
  }
  if (a32) return trans_b ? cluster_fit<float16, float, true>(device) : cluster_fit<float16, float, false>(device);
  return trans_b ? cluster_fit<float16, float16, true>(device) : cluster_fit<float16, float16, false>(device);
}

/// The widest cp.async chunk (16, 8 or 4 bytes) that every row of an operand's tiles starts on: the
/// tiles start at multiples of 64 elements, so the base address and the pitch decide. 16-bit data at
/// an odd pitch gives 2 (no cp.async).
int copy_width(const void* p, std::int64_t ld, int elem) {
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  for (int v : {16, 8, 4})
    if (addr % v == 0 && (ld * elem) % v == 0) return v;
  return elem;
}

/// Blocks per SM the split aims at: 2 by default (what fits with a float32 A's 110.6 KB of stages;
/// more slices also mean more partial tiles to add), or DUALCAST_SKINNY_BLOCKS_PER_SM (1..16), for
/// measuring others.
std::int64_t blocks_per_sm() {
  static const std::int64_t v = [] {
    const char* e = std::getenv("DUALCAST_SKINNY_BLOCKS_PER_SM");
    if (e == nullptr || *e == '\0') return std::int64_t{2};
    const long x = std::strtol(e, nullptr, 10);
    DUALCAST_CHECK(x >= 1 && x <= 16, "DUALCAST_SKINNY_BLOCKS_PER_SM must be 1..16, not '", e, "'");
    return static_cast<std::int64_t>(x);
  }();
  return v;
}

/// Keeps the GPU busy for about `ns` nanoseconds, so that the launches queued behind it are timed
/// back to back, without the host's time to issue them.
__global__ void spin_kernel(long long ns) {
  long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

}  // namespace

void skinny_prepare(Device device) {
  if (!device.is_cuda() || !skinny_device(device).clusters) return;
  DeviceGuard guard(device);
  for (DType b16 : {DType::bfloat16, DType::float16})
    for (DType a : {DType::float32, b16})
      for (bool trans_b : {false, true}) (void)cluster_fit(device, a, b16, trans_b);
}

bool skinny_gemm_fits(Device device, std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a, DType a_dtype,
                      DType b16) {
  const bool half = b16 == DType::bfloat16 || b16 == DType::float16;
  return device.is_cuda() && half && !trans_a && (a_dtype == b16 || a_dtype == DType::float32) && m >= 1 &&
         m <= kSkinnyMaxRows && n >= 1 && k >= 1 && (n + kTile - 1) / kTile < (std::int64_t{1} << 20) &&
         k < (std::int64_t{1} << 30) && skinny_device(device).clusters;
}

void skinny_gemm(Device device, DType a_dtype, DType b16, bool trans_b, std::int64_t m, std::int64_t n,
                 std::int64_t k, const void* a, std::int64_t lda, const void* b, std::int64_t ldb, float* c,
                 std::int64_t ldc) {
  DUALCAST_CHECK(skinny_gemm_fits(device, m, n, k, false, a_dtype, b16), "matmul_rounded: the skinny kernel cannot take m=",
                 m, " n=", n, " k=", k, " on ", device.str());
  DUALCAST_CHECK(lda >= k && ldb >= (trans_b ? k : n) && ldc >= n, "matmul_rounded: pitches lda=", lda, " ldb=", ldb,
                 " ldc=", ldc, " too small for m=", m, " n=", n, " k=", k);
  const SkinnyDevice sd = skinny_device(device);
  DeviceGuard guard(device);
  // Slices of a multiple of 64 inner-dimension elements: enough for about 2 blocks per SM (or
  // DUALCAST_SKINNY_BLOCKS_PER_SM), at most a cluster's 8, and fewer while the column tiles' clusters
  // would not all be resident at once.
  const ClusterFit fit = cluster_fit(device, a_dtype, b16, trans_b);
  const std::int64_t tiles = (n + kTile - 1) / kTile;
  const std::int64_t steps = (k + kTile - 1) / kTile;
  std::int64_t want = std::clamp<std::int64_t>((blocks_per_sm() * sd.sms + tiles - 1) / tiles, 1, kMaxSlices);
  std::int64_t kc = 0, slices = 0;
  for (;; --want) {
    kc = ((steps + want - 1) / want) * kTile;
    slices = (k + kc - 1) / kc;
    if (want == 1 || tiles <= fit.max_clusters[slices]) break;
  }
  const int a_elem = a_dtype == DType::float32 ? 4 : 2;
  SkinnyArgs args{a,
                  b,
                  c,
                  lda,
                  ldb,
                  ldc,
                  static_cast<int>(m),
                  static_cast<int>(n),
                  static_cast<int>(k),
                  static_cast<int>(kc),
                  static_cast<int>(slices),
                  copy_width(a, lda, a_elem),
                  copy_width(b, ldb, 2),
                  ldc % 4 == 0 && reinterpret_cast<std::uintptr_t>(c) % 16 == 0};
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(slices));
  const cudaStream_t s = stream(device);
  if (b16 == DType::bfloat16) {
    if (a_dtype == DType::float32) launch<bfloat16, float>(device, trans_b, grid, args, s);
    else launch<bfloat16, bfloat16>(device, trans_b, grid, args, s);
  } else {
    if (a_dtype == DType::float32) launch<float16, float>(device, trans_b, grid, args, s);
    else launch<float16, float16>(device, trans_b, grid, args, s);
  }
  DUALCAST_CUDA_CHECK_LAUNCH();
}

namespace {

/// DUALCAST_SKINNY_GEMM: -1 unset (measure), 0 never, 1 always.
int skinny_env() {
  static const int v = [] {
    const char* e = std::getenv("DUALCAST_SKINNY_GEMM");
    if (e == nullptr || *e == '\0') return -1;
    DUALCAST_CHECK((e[0] == '0' || e[0] == '1') && e[1] == '\0', "DUALCAST_SKINNY_GEMM must be 0 or 1, not '",
                   e, "'");
    return e[0] - '0';
  }();
  return v;
}

bool matmul_log() {
  const char* e = std::getenv("DUALCAST_MATMUL_LOG");
  return e != nullptr && e[0] == '1';
}

/// GPU time in ms of one call of f: the median over 3 rounds of 10 calls queued behind a spin kernel
/// (so the host's time to issue them is hidden, as in a captured graph), after one warm-up call.
float median_ms(Device device, const std::function<void()>& f) {
  const cudaStream_t s = stream(device);
  struct Events {
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    ~Events() {
      if (e0) cudaEventDestroy(e0);
      if (e1) cudaEventDestroy(e1);
    }
  } ev;
  DUALCAST_CUDA_CHECK(cudaEventCreate(&ev.e0));
  DUALCAST_CUDA_CHECK(cudaEventCreate(&ev.e1));
  constexpr int kCalls = 10;
  std::vector<float> ms;
  f();
  for (int round = 0; round < 3; ++round) {
    spin_kernel<<<1, 1, 0, s>>>(200000);  // 200 us: more than issuing kCalls calls takes
    DUALCAST_CUDA_CHECK_LAUNCH();
    DUALCAST_CUDA_CHECK(cudaEventRecord(ev.e0, s));
    for (int i = 0; i < kCalls; ++i) f();
    DUALCAST_CUDA_CHECK(cudaEventRecord(ev.e1, s));
    DUALCAST_CUDA_CHECK(cudaEventSynchronize(ev.e1));
    float t = 0.0f;
    DUALCAST_CUDA_CHECK(cudaEventElapsedTime(&t, ev.e0, ev.e1));
    ms.push_back(t / kCalls);
  }
  std::sort(ms.begin(), ms.end());
  return ms[1];
}

std::atomic<int> g_forced{-2};

}  // namespace

void force_skinny(int mode) { g_forced.store(mode); }

bool choose_skinny(Device device, const std::string& key, const std::function<void()>& ours,
                   const std::function<void()>& library) {
  const int forced = g_forced.load();
  const int mode = forced >= -1 ? forced : skinny_env();
  if (mode >= 0) return mode == 1;
  // One lock for the lookup, the timing and the record: two threads meeting a new shape at once
  // would time on the same stream and spoil each other's numbers.
  static std::mutex mu;
  static std::map<std::string, bool> chosen;
  const std::string full = device.str() + " " + key;
  std::lock_guard<std::mutex> lock(mu);
  auto it = chosen.find(full);
  if (it != chosen.end()) return it->second;
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  DUALCAST_CUDA_CHECK(cudaStreamIsCapturing(stream(device), &cs));
  if (cs != cudaStreamCaptureStatusNone) {
    // Nothing can be timed inside a capture: the kernel, kept for the eager calls too, so that a
    // shape sums in one order in a process.
    chosen.emplace(full, true);
    if (matmul_log())
      std::fprintf(stderr, "dualcast: matmul_rounded %s: first met under a capture: skinny kernel, untimed\n",
                   full.c_str());
    return true;
  }
  const float t_ours = median_ms(device, ours), t_lib = median_ms(device, library);
  const bool pick = t_ours < t_lib;
  if (matmul_log())
    std::fprintf(stderr, "dualcast: matmul_rounded %s: skinny kernel %.2f us, cuBLAS %.2f us: %s\n", full.c_str(),
                 1000.0 * t_ours, 1000.0 * t_lib, pick ? "skinny kernel" : "cuBLAS");
  chosen.emplace(full, pick);
  return pick;
}

#else  // a CPU-only build

void skinny_prepare(Device) {}

bool skinny_gemm_fits(Device, std::int64_t, std::int64_t, std::int64_t, bool, DType, DType) { return false; }

void skinny_gemm(Device device, DType, DType, bool, std::int64_t, std::int64_t, std::int64_t, const void*,
                 std::int64_t, const void*, std::int64_t, float*, std::int64_t) {
  DUALCAST_FAIL("matmul_rounded on ", device.str(), ": this dualcast was built without CUDA");
}

bool choose_skinny(Device, const std::string&, const std::function<void()>&, const std::function<void()>&) {
  return false;
}

void force_skinny(int) {}

#endif

}  // namespace dualcast::detail
