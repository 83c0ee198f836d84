// gemm_skinny.cu: the skinny tensor-core product (gemm_skinny.hpp says why) and the measured choice
// between it and cuBLAS. Compiled as plain C++ in a CPU-only build, where skinny_gemm_fits is false.
//
// Kernel layout. A block of 4 warps owns the 64 x 64 tile of C at columns [64 bx, 64 bx + 64) and
// one slice of the inner dimension, [by * kc, (by + 1) * kc), walked 64 at a time: each step stores
// A's 64 x 64 block and B's 64 x 64 block in shared memory as 16-bit values (A rounded from float32
// if need be; rows beyond m and columns beyond n or k as zeros), then warp w multiplies the rows of
// its four 16-row tiles by columns [16 w, 16 w + 16) with mma.sync m16n8k16 (float32 sums: 32
// accumulators per lane). The next step's blocks are loaded into registers (all 32 loads of a lane
// issued at once) while the tensor cores work on this one. Both tiles are stored with a pitch of 72
// halves (36 words), so the eight rows a fragment load touches fall in distinct banks. B stored
// [n, k] is kept as [n][k] and read in 32-bit pairs along k; B stored [k, n] is kept as [k][n] (its
// global rows are then contiguous) and a fragment's pairs are gathered from two 16-bit loads.
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
constexpr int kPitch = 72;     // halves per shared-memory row (kTile + 8: conflict-free fragments)
constexpr int kThreads = 128;  // 4 warps
constexpr int kRowsPerWarp = kTile / (kThreads / 32);  // rows of a 64 x 64 block one warp loads
constexpr int kMaxSlices = 8;  // the portable cluster size

/// What a lane holds of one 64 x 64 block between its global load and its shared-memory store: for
/// row warp + 4 i, columns 2 lane and 2 lane + 1 (raw: a float32 pair, or a 16-bit pair in 32 bits).
template <class S>
struct Staged {
  using Pair = std::conditional_t<sizeof(S) == 4, float2, unsigned>;
  Pair v[kRowsPerWarp];
};

/// A float or 16-bit value as the 16 bits of B16 (bfloat16 or float16), rounded to nearest even.
template <class B16, class S>
__device__ __forceinline__ unsigned to_bits(S v) {
  if constexpr (std::is_same_v<S, B16>) return v.bits;
  else return B16(static_cast<float>(v)).bits;
}

/// Loads the lane's share of the block at src (row-major, pitch ld; rows < rows_ok and columns <
/// cols_ok valid, the rest zero): all loads first, nothing waits on them here. A pair is one load
/// when both columns are valid and it is aligned, else two (or one, or none).
template <class S>
__device__ __forceinline__ void fetch(Staged<S>& st, const S* src, std::int64_t ld, int rows_ok, int cols_ok,
                                      int warp, int lane) {
  const int c = 2 * lane;
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp + 4 * i;
    const S* p = src + r * ld + c;
    const bool row_ok = r < rows_ok;
    const bool pair = row_ok && c + 1 < cols_ok && reinterpret_cast<std::uintptr_t>(p) % (2 * sizeof(S)) == 0;
    if constexpr (sizeof(S) == 4) {
      float2 v = make_float2(0.0f, 0.0f);
      if (pair) {
        v = __ldg(reinterpret_cast<const float2*>(p));
      } else if (row_ok && c < cols_ok) {
        v.x = __ldg(p);
        if (c + 1 < cols_ok) v.y = __ldg(p + 1);
      }
      st.v[i] = v;
    } else {
      unsigned v = 0u;
      const auto* q = reinterpret_cast<const unsigned short*>(p);
      if (pair) {
        v = __ldg(reinterpret_cast<const unsigned*>(p));
      } else if (row_ok && c < cols_ok) {
        v = __ldg(q);
        if (c + 1 < cols_ok) v |= static_cast<unsigned>(__ldg(q + 1)) << 16;
      }
      st.v[i] = v;
    }
  }
}

/// Stores a fetched block into dst[64][kPitch] as 16-bit B16 values (rounding float32 here).
template <class B16, class S>
__device__ __forceinline__ void stash(std::uint16_t* dst, const Staged<S>& st, int warp, int lane) {
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    unsigned pair;
    if constexpr (sizeof(S) == 4) pair = to_bits<B16>(st.v[i].x) | (to_bits<B16>(st.v[i].y) << 16);
    else pair = st.v[i];
    *reinterpret_cast<unsigned*>(dst + (warp + 4 * i) * kPitch + 2 * lane) = pair;
  }
}

/// d += a b for one m16n8k16 fragment (float32 accumulators).
template <class B16>
__device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  if constexpr (std::is_same_v<B16, bfloat16>)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

struct SkinnyArgs {
  const void* a;
  const void* b;
  float* c;
  std::int64_t lda, ldb, ldc;
  int m, n, k, kc, slices;
};

template <class B16, class SA, bool kTransB>
__global__ void __launch_bounds__(kThreads) skinny_gemm_kernel(SkinnyArgs p) {
  // The two 16-bit blocks, and after the main loop the block's float32 partial tile [64][64].
  __shared__ __align__(16) std::uint16_t smem[2 * kTile * kPitch];
  static_assert(sizeof(smem) >= sizeof(float) * kTile * kTile, "the partial tile must fit");
  std::uint16_t* as = smem;
  std::uint16_t* bs = smem + kTile * kPitch;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;  // the mma fragment's group and thread in group
  const int n0 = blockIdx.x * kTile;
  const int k_begin = blockIdx.y * p.kc, k_end = min(p.k, k_begin + p.kc);
  const int m_tiles = (p.m + 15) / 16;
  const SA* A = static_cast<const SA*>(p.a);
  const B16* B = static_cast<const B16*>(p.b);

  Staged<SA> sa;
  Staged<B16> sb;
  auto fetch_step = [&](int k0) {
    const int kn = min(kTile, k_end - k0);
    fetch(sa, A + k0, p.lda, p.m, kn, warp, lane);
    if constexpr (kTransB) fetch(sb, B + static_cast<std::int64_t>(n0) * p.ldb + k0, p.ldb, p.n - n0, kn, warp, lane);
    else fetch(sb, B + static_cast<std::int64_t>(k0) * p.ldb + n0, p.ldb, kn, p.n - n0, warp, lane);
  };

  float acc[4][2][4] = {};
  fetch_step(k_begin);
  for (int k0 = k_begin; k0 < k_end; k0 += kTile) {
    stash<B16>(as, sa, warp, lane);
    stash<B16>(bs, sb, warp, lane);
    __syncthreads();
    if (k0 + kTile < k_end) fetch_step(k0 + kTile);  // in flight during the products below
#pragma unroll
    for (int kk = 0; kk < kTile; kk += 16) {
      unsigned bf[2][2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int col = warp * 16 + j * 8 + g;
        if constexpr (kTransB) {
          bf[j][0] = *reinterpret_cast<const unsigned*>(bs + col * kPitch + kk + 2 * t);
          bf[j][1] = *reinterpret_cast<const unsigned*>(bs + col * kPitch + kk + 8 + 2 * t);
        } else {
          const std::uint16_t* q = bs + (kk + 2 * t) * kPitch + col;
          bf[j][0] = static_cast<unsigned>(q[0]) | (static_cast<unsigned>(q[kPitch]) << 16);
          bf[j][1] = static_cast<unsigned>(q[8 * kPitch]) | (static_cast<unsigned>(q[9 * kPitch]) << 16);
        }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (i >= m_tiles) break;  // uniform over the block
        const std::uint16_t* r0 = as + (i * 16 + g) * kPitch + kk + 2 * t;
        const unsigned af[4] = {*reinterpret_cast<const unsigned*>(r0),
                                *reinterpret_cast<const unsigned*>(r0 + 8 * kPitch),
                                *reinterpret_cast<const unsigned*>(r0 + 8),
                                *reinterpret_cast<const unsigned*>(r0 + 8 * kPitch + 8)};
        mma<B16>(acc[i][0], af, bf[0]);
        mma<B16>(acc[i][1], af, bf[1]);
      }
    }
    __syncthreads();
  }

  // Accumulator (i, j, e) is C's row 16 i + g + 8 (e / 2), tile column 16 warp + 8 j + 2 t + e % 2.
  if (p.slices == 1) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = i * 16 + g + 8 * (e / 2), col = n0 + warp * 16 + j * 8 + 2 * t + e % 2;
          if (row < p.m && col < p.n) p.c[row * p.ldc + col] = acc[i][j][e];
        }
    return;
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  float* part = reinterpret_cast<float*>(smem);  // [64][64]; the last __syncthreads freed the blocks
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int row = i * 16 + g, col = warp * 16 + j * 8 + 2 * t;
      *reinterpret_cast<float2*>(part + row * kTile + col) = make_float2(acc[i][j][0], acc[i][j][1]);
      *reinterpret_cast<float2*>(part + (row + 8) * kTile + col) = make_float2(acc[i][j][2], acc[i][j][3]);
    }
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every slice's partial is in its block's shared memory
  const int rank = static_cast<int>(cluster.block_rank());
  const int rows = min(kTile, p.m), cols = min(kTile, p.n - n0);
  // Block `rank` sums the rank-th share of the tile's float4 groups (4 consecutive columns).
  const int groups = rows * (kTile / 4), share = (groups + p.slices - 1) / p.slices;
  const int g_end = min(groups, (rank + 1) * share);
  for (int q = rank * share + threadIdx.x; q < g_end; q += kThreads) {
    const int row = q / (kTile / 4), col = 4 * (q % (kTile / 4));
    if (col >= cols) continue;
    float4 s = *reinterpret_cast<const float4*>(cluster.map_shared_rank(part, 0) + row * kTile + col);
    for (int z = 1; z < p.slices; ++z) {
      const float4 v = *reinterpret_cast<const float4*>(cluster.map_shared_rank(part, z) + row * kTile + col);
      s.x += v.x;
      s.y += v.y;
      s.z += v.z;
      s.w += v.w;
    }
    float* out = p.c + row * p.ldc + n0 + col;
    out[0] = s.x;
    if (col + 1 < cols) out[1] = s.y;
    if (col + 2 < cols) out[2] = s.z;
    if (col + 3 < cols) out[3] = s.w;
  }
  cluster.sync();  // no block leaves while another may still read its partial
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

template <class B16, class SA>
void launch(bool trans_b, dim3 grid, int cluster_y, const SkinnyArgs& args, cudaStream_t s) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = static_cast<unsigned>(cluster_y);
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  if (trans_b) DUALCAST_CUDA_CHECK(cudaLaunchKernelEx(&cfg, skinny_gemm_kernel<B16, SA, true>, args));
  else DUALCAST_CUDA_CHECK(cudaLaunchKernelEx(&cfg, skinny_gemm_kernel<B16, SA, false>, args));
}

/// Blocks per SM the split aims at: 2 by default (each block keeps its next step's loads in flight,
/// and more slices mean more partial tiles to add), or DUALCAST_SKINNY_BLOCKS_PER_SM (1..16), for
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
  if (device.is_cuda()) (void)skinny_device(device);
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
  // DUALCAST_SKINNY_BLOCKS_PER_SM), at most a cluster's 8.
  const std::int64_t tiles = (n + kTile - 1) / kTile;
  const std::int64_t want =
      std::clamp<std::int64_t>((blocks_per_sm() * sd.sms + tiles - 1) / tiles, 1, kMaxSlices);
  const std::int64_t steps = (k + kTile - 1) / kTile;
  const std::int64_t kc = ((steps + want - 1) / want) * kTile;
  const std::int64_t slices = (k + kc - 1) / kc;
  SkinnyArgs args{a, b, c, lda, ldb, ldc, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                  static_cast<int>(kc), static_cast<int>(slices)};
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(slices));
  const int cy = static_cast<int>(slices);
  const cudaStream_t s = stream(device);
  if (b16 == DType::bfloat16) {
    if (a_dtype == DType::float32) launch<bfloat16, float>(trans_b, grid, cy, args, s);
    else launch<bfloat16, bfloat16>(trans_b, grid, cy, args, s);
  } else {
    if (a_dtype == DType::float32) launch<float16, float>(trans_b, grid, cy, args, s);
    else launch<float16, float16>(trans_b, grid, cy, args, s);
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
