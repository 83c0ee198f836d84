// attention_fused.cu: the fused attention kernels (FlashAttention-2's structure, written for SIMT
// FFMA: fp32 without tensor cores, and fp64) and their launchers. Compiled as plain C++ in a
// CPU-only build, where only fused_supported() (false) and failing stubs remain.
//
// Forward: a block of 4 warps owns BR = 16 * TM query rows of one (batch, head) and sweeps the key
// tiles (64 keys): S = Q K^T, online softmax (running max m and sum l per row, O rescaled when m
// grows), O += P V. Only O and each row's log-sum-exp (log2 domain) are written: nothing of size
// Sq x Sk ever reaches device memory. Causal blocks stop at the diagonal tile.
// Backward: a block owns BC = 16 * TK keys and sweeps the query tiles (64 rows): it recomputes
// S^T = K Q^T and P^T = 2^(S^T - lse), forms dP^T = V dO^T and dS^T = P^T (dP^T - rowsum(dO o O)),
// accumulates dV += P^T dO and dK += dS^T Q in registers, and adds its share of dQ = dS K to a
// zeroed dQ with atomic adds (float4 atomics on sm_90). Atomics were chosen over a second pass over
// the keys for dQ (which would recompute S and dP once more: +40% FLOPs): blocks of one head start
// their query sweep at staggered tiles so they rarely add to the same rows at once.
//
// Register tiling (the lane layout of every product): lane = 8 * ri + ci (ri 0..3, ci 0..7). In a
// product over the head dimension the lane owns TM (or TK) consecutive rows of its warp's slice,
// which every lane of its quarter-warp reads at once (a shared-memory broadcast), and the 8 strided
// columns ci + 8j, whose rows the quarter-warp reads as 8 consecutive 16-byte rows. Tiles are
// row-major in shared memory with a pitch of D_PAD + 16 bytes, so those 8 rows fall in 8 distinct
// 16-byte bank groups (no conflicts) and every operand moves as a 16-byte load (ld4); products over
// keys or queries read a row of P (or dS) at a time. Each lane does 4 * TM * 8 FMAs per TM + 8
// 16-byte loads (S) and per TM + 2 * D_PAD / 32 loads per four keys (P V).
#include "attention_internal.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <mutex>
#include <string>
#include <type_traits>

#include "dualcast/error.hpp"

#if defined(__CUDACC__)
#include <cuda_runtime.h>

#include "dualcast/stream.hpp"
#endif

namespace dualcast::attention_detail {

bool fused_supported(Device device, const Dims& dims) {
#if defined(__CUDACC__)
  return device.is_cuda() && dims.D == dims.Dv && dims.D >= 1 && dims.D <= 128;
#else
  (void)device;
  (void)dims;
  return false;
#endif
}

#if defined(__CUDACC__)
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kKeyTile = 64;    ///< forward: keys per tile
constexpr int kQueryTile = 64;  ///< backward: query rows per tile

/// Shared-memory row padding: 16 bytes.
template <class T>
constexpr int kPad = 16 / static_cast<int>(sizeof(T));

// ---- 16-byte moves of 4 elements (2 x 16 bytes for double) -------------------------------------

__device__ __forceinline__ void ld4(const float* p, float (&v)[4]) {
  const float4 t = *reinterpret_cast<const float4*>(p);
  v[0] = t.x;
  v[1] = t.y;
  v[2] = t.z;
  v[3] = t.w;
}
__device__ __forceinline__ void ld4(const double* p, double (&v)[4]) {
  const double2 a = *reinterpret_cast<const double2*>(p);
  const double2 b = *reinterpret_cast<const double2*>(p + 2);
  v[0] = a.x;
  v[1] = a.y;
  v[2] = b.x;
  v[3] = b.y;
}
__device__ __forceinline__ void st4(float* p, const float (&v)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void st4(double* p, const double (&v)[4]) {
  *reinterpret_cast<double2*>(p) = make_double2(v[0], v[1]);
  *reinterpret_cast<double2*>(p + 2) = make_double2(v[2], v[3]);
}

__device__ __forceinline__ float exp2_of(float x) { return exp2f(x); }
__device__ __forceinline__ double exp2_of(double x) { return exp2(x); }
__device__ __forceinline__ float log2_of(float x) { return log2f(x); }
__device__ __forceinline__ double log2_of(double x) { return log2(x); }

template <class T>
__device__ __forceinline__ T neg_inf() {
  return -std::numeric_limits<T>::infinity();
}

/// Sum over the 8 lanes of a quarter-warp row group (lanes 8 ri .. 8 ri + 7).
template <class T>
__device__ __forceinline__ T group8_sum(T v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  return v;
}
template <class T>
__device__ __forceinline__ T group8_max(T v) {
  v = fmax(v, __shfl_xor_sync(0xffffffffu, v, 1));
  v = fmax(v, __shfl_xor_sync(0xffffffffu, v, 2));
  v = fmax(v, __shfl_xor_sync(0xffffffffu, v, 4));
  return v;
}

/// Copies rows [row0, row0 + ROWS) of a row-major [n_rows, D] matrix into shared memory (pitch LD),
/// times `mul`, zero-filling rows >= n_rows and columns D .. D_PAD - 1. vec: D % 4 == 0 (16-byte
/// global loads).
template <class T, int D_PAD, int ROWS>
__device__ __forceinline__ void load_rows(T* __restrict__ sm, const T* __restrict__ g, std::int64_t row0,
                                          std::int64_t n_rows, std::int64_t D, bool vec, T mul) {
  constexpr int kGroups = D_PAD / 4;
  constexpr int LD = D_PAD + kPad<T>;
#pragma unroll 4
  for (int idx = static_cast<int>(threadIdx.x); idx < ROWS * kGroups; idx += kThreads) {
    const int r = idx / kGroups, d = (idx % kGroups) * 4;
    T v[4] = {T(0), T(0), T(0), T(0)};
    const std::int64_t gr = row0 + r;
    if (gr < n_rows && d < D) {
      const T* src = g + gr * D + d;
      if (vec) {
        ld4(src, v);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = d + e < D ? src[e] : T(0);
      }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] *= mul;
    st4(sm + r * LD + d, v);
  }
}

/// Applies the causal rule and the mask to a log2-domain score x of (row, col); -inf where masked.
/// Callers guarantee row < Sq and col < Sk.
template <class T>
__device__ __forceinline__ T apply_mask(const MaskView& m, std::int64_t moff_bh, bool causal,
                                        std::int64_t row, std::int64_t col, T x, T mask_mul) {
  if (causal && col > row) return neg_inf<T>();
  if (m.kind != MaskKind::none) {
    const std::int64_t off = moff_bh + row * m.si + col * m.sj;
    if (m.kind == MaskKind::boolean) {
      if (static_cast<const std::uint8_t*>(m.data)[off] == 0) return neg_inf<T>();
    } else {
      x += mask_mul * static_cast<const T*>(m.data)[off];
    }
  }
  return x;
}

// =================================================================================================
// forward
// =================================================================================================

template <class T>
struct FwdParams {
  const T* q;
  const T* k;
  const T* v;
  T* o;
  T* lse;
  MaskView mask;
  std::int64_t heads, H, Sq, Sk, D;
  int q_tiles;
  bool causal;
  bool vec;    ///< D % 4 == 0 and 16-byte aligned rows: 16-byte global loads and stores
  T qmul;      ///< scale * log2(e), folded into Q as it is loaded
  T mask_mul;  ///< log2(e), for additive masks
};

template <class T, int D_PAD, int TM>
constexpr int fwd_smem_bytes() {
  constexpr int BR = kWarps * 4 * TM, LD = D_PAD + kPad<T>, LDP = kKeyTile + kPad<T>;
  return static_cast<int>(sizeof(T)) * ((BR + 2 * kKeyTile) * LD + BR * LDP);
}

/// Blocks per multiprocessor that shared memory allows (228 KB per SM on sm_90, 1 KB of it reserved
/// per block); given to __launch_bounds__ so that ptxas budgets registers for that occupancy and
/// no more (left alone, it aims at more blocks than shared memory admits and spills).
constexpr int blocks_per_sm(int smem_bytes) {
  const int b = 233472 / (smem_bytes + 1024);
  return b < 1 ? 1 : (b > 3 ? 3 : b);
}

template <class T, int D_PAD, int TM>
__global__ void __launch_bounds__(kThreads, blocks_per_sm(fwd_smem_bytes<T, D_PAD, TM>()))
    attention_forward_kernel(const FwdParams<T> p) {
  constexpr int BR = kWarps * 4 * TM;
  constexpr int LD = D_PAD + kPad<T>;
  constexpr int LDP = kKeyTile + kPad<T>;
  constexpr int NG = D_PAD / 32;  // 16-byte groups of a lane's O columns: 4 ci + 32 g + (0..3)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* Qs = reinterpret_cast<T*>(smem_raw);
  T* Ks = Qs + BR * LD;
  T* Vs = Ks + kKeyTile * LD;
  T* Ps = Vs + kKeyTile * LD;  // per warp: 4 TM rows x LDP

  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int ri = lane >> 3, ci = lane & 7;
  // The last query tiles first: with causal masking they have the most key tiles.
  const std::int64_t bh = static_cast<std::int64_t>(blockIdx.x) % p.heads;
  const int qt = p.q_tiles - 1 - static_cast<int>(static_cast<std::int64_t>(blockIdx.x) / p.heads);
  const std::int64_t q0 = static_cast<std::int64_t>(qt) * BR;
  const std::int64_t b = bh / p.H, h = bh - b * p.H;
  const std::int64_t moff_bh = b * p.mask.sb + h * p.mask.sh;
  const bool vec = p.vec;
  const T* qg = p.q + bh * p.Sq * p.D;
  const T* kg = p.k + bh * p.Sk * p.D;
  const T* vg = p.v + bh * p.Sk * p.D;

  load_rows<T, D_PAD, BR>(Qs, qg, q0, p.Sq, p.D, vec, p.qmul);

  const int row_l0 = warp * 4 * TM + ri * TM;  // this lane's first row in the block
  T* Pw = Ps + (warp * 4 * TM + ri * TM) * LDP;
  T m[TM], l[TM], acc[TM][4 * NG];
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    m[i] = neg_inf<T>();
    l[i] = T(0);
#pragma unroll
    for (int c = 0; c < 4 * NG; ++c) acc[i][c] = T(0);
  }

  const std::int64_t kv_end = p.causal ? std::min<std::int64_t>(p.Sk, q0 + BR) : p.Sk;
  const int n_tiles = static_cast<int>((kv_end + kKeyTile - 1) / kKeyTile);
  for (int t = 0; t < n_tiles; ++t) {
    const std::int64_t k0 = static_cast<std::int64_t>(t) * kKeyTile;
    __syncthreads();  // the previous tile's reads of Ks, Vs and Ps are done
    load_rows<T, D_PAD, kKeyTile>(Ks, kg, k0, p.Sk, p.D, vec, T(1));
    load_rows<T, D_PAD, kKeyTile>(Vs, vg, k0, p.Sk, p.D, vec, T(1));
    __syncthreads();

    // S = Q K^T for rows row_l0 + i, columns ci + 8 j (log2 domain: Q carries scale * log2 e).
    T s[TM][8];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) s[i][j] = T(0);
#pragma unroll 1
    for (int d = 0; d < D_PAD; d += 4) {
      T qv[TM][4];
#pragma unroll
      for (int i = 0; i < TM; ++i) ld4(Qs + (row_l0 + i) * LD + d, qv[i]);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        T kv[4];
        ld4(Ks + (ci + 8 * j) * LD + d, kv);
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[i][j] = fma(qv[i][e], kv[e], s[i][j]);
      }
    }

    // Masks, then the online softmax; P goes to this warp's rows of Ps.
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      const std::int64_t row = q0 + row_l0 + i;
      T mx = neg_inf<T>();
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const std::int64_t col = k0 + ci + 8 * j;
        T x = s[i][j];
        if (col >= p.Sk) x = neg_inf<T>();
        else if (row < p.Sq) x = apply_mask(p.mask, moff_bh, p.causal, row, col, x, p.mask_mul);
        s[i][j] = x;
        mx = fmax(mx, x);
      }
      mx = group8_max(mx);
      const T m_new = fmax(m[i], mx);
      const T m_use = m_new == neg_inf<T>() ? T(0) : m_new;  // all masked so far: no -inf - -inf
      const T alpha = exp2_of(m[i] - m_use);
      m[i] = m_new;
      l[i] *= alpha;
#pragma unroll
      for (int c = 0; c < 4 * NG; ++c) acc[i][c] *= alpha;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const T pj = exp2_of(s[i][j] - m_use);
        l[i] += pj;  // this lane's share of the row sum (combined at the end)
        Pw[i * LDP + ci + 8 * j] = pj;
      }
    }
    __syncwarp();

    // O += P V: four keys at a time; a P row of this lane is a broadcast, V rows 16-byte groups.
#pragma unroll 1
    for (int c = 0; c < kKeyTile; c += 4) {
      T pv[TM][4];
#pragma unroll
      for (int i = 0; i < TM; ++i) ld4(Pw + i * LDP + c, pv[i]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
#pragma unroll
        for (int g = 0; g < NG; ++g) {
          T vv[4];
          ld4(Vs + (c + e) * LD + 4 * ci + 32 * g, vv);
#pragma unroll
          for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int x = 0; x < 4; ++x) acc[i][4 * g + x] = fma(pv[i][e], vv[x], acc[i][4 * g + x]);
        }
      }
    }
  }

  // Normalise and store; a fully masked row (l = 0) is written as zeros with lse = -inf.
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const T lt = group8_sum(l[i]);
    const std::int64_t row = q0 + row_l0 + i;
    if (row >= p.Sq) continue;
    const T inv = lt > T(0) ? T(1) / lt : T(0);
    T* orow = p.o + (bh * p.Sq + row) * p.D;
#pragma unroll
    for (int g = 0; g < NG; ++g) {
      const int d = 4 * ci + 32 * g;
      T w[4];
#pragma unroll
      for (int x = 0; x < 4; ++x) w[x] = acc[i][4 * g + x] * inv;
      if (vec) {
        if (d < p.D) st4(orow + d, w);
      } else {
#pragma unroll
        for (int x = 0; x < 4; ++x)
          if (d + x < p.D) orow[d + x] = w[x];
      }
    }
    if (ci == 0) p.lse[bh * p.Sq + row] = lt > T(0) ? m[i] + log2_of(lt) : neg_inf<T>();
  }
}

// =================================================================================================
// backward
// =================================================================================================

template <class T>
struct BwdParams {
  const T* q;
  const T* k;
  const T* v;
  const T* dout;
  const T* lse;
  const T* delta;  ///< rowsum(dout * out) per query row
  T* dq;           ///< zeroed; accumulated with atomics
  T* dk;
  T* dv;
  MaskView mask;
  std::int64_t heads, H, Sq, Sk, D;
  int k_tiles;
  bool causal;
  bool vec;    ///< D % 4 == 0 and 16-byte aligned rows: 16-byte loads, stores and float4 atomics
  T smul;      ///< scale * log2(e)
  T mask_mul;  ///< log2(e)
  T scale;
};

/// delta[r] = sum_d dout[r, d] * out[r, d]: a warp per row.
template <class T>
__global__ void __launch_bounds__(256)
    attention_backward_delta_kernel(const T* __restrict__ out, const T* __restrict__ dout,
                                    T* __restrict__ delta, std::int64_t rows, std::int64_t D) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * 8;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * 8 + threadIdx.x / 32; r < rows; r += step) {
    T s = T(0);
    for (std::int64_t d = lane; d < D; d += 32) s += out[r * D + d] * dout[r * D + d];
#pragma unroll
    for (int w = 16; w > 0; w >>= 1) s += __shfl_xor_sync(0xffffffffu, s, w);
    if (lane == 0) delta[r] = s;
  }
}

template <class T, int D_PAD, int TK>
constexpr int bwd_smem_bytes() {
  constexpr int BC = kWarps * 4 * TK, LD = D_PAD + kPad<T>, LDC = BC + kPad<T>;
  return static_cast<int>(sizeof(T)) * ((2 * BC + 2 * kQueryTile) * LD + 2 * kQueryTile * LDC + 2 * kQueryTile);
}

/// TK consecutive elements from shared memory (16-byte loads when TK is a multiple of 4).
template <int TK, class T>
__device__ __forceinline__ void ld_tk(const T* p, T (&v)[TK]) {
  if constexpr (TK % 4 == 0) {
#pragma unroll
    for (int a = 0; a < TK; a += 4) {
      T w[4];
      ld4(p + a, w);
#pragma unroll
      for (int e = 0; e < 4; ++e) v[a + e] = w[e];
    }
  } else {
#pragma unroll
    for (int a = 0; a < TK; ++a) v[a] = p[a];
  }
}
template <int TK, class T>
__device__ __forceinline__ void st_tk(T* p, const T (&v)[TK]) {
  if constexpr (TK % 4 == 0) {
#pragma unroll
    for (int a = 0; a < TK; a += 4) {
      const T w[4] = {v[a], v[a + 1], v[a + 2], v[a + 3]};
      st4(p + a, w);
    }
  } else {
#pragma unroll
    for (int a = 0; a < TK; ++a) p[a] = v[a];
  }
}

__device__ __forceinline__ void atomic_add4(float* p, const float (&v)[4], bool vec) {
#if __CUDA_ARCH__ >= 900
  if (vec) {
    // red (no return value) rather than atomicAdd(float4*), whose returned float4 costs a stack frame.
    asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v[0]), "f"(v[1]),
                 "f"(v[2]), "f"(v[3])
                 : "memory");
    return;
  }
#endif
  (void)vec;
#pragma unroll
  for (int x = 0; x < 4; ++x) atomicAdd(p + x, v[x]);
}
__device__ __forceinline__ void atomic_add4(double* p, const double (&v)[4], bool) {
#pragma unroll
  for (int x = 0; x < 4; ++x) atomicAdd(p + x, v[x]);
}

/// S^T (or dP^T) for this lane's TK keys and query rows ci + 8 j: the product of A (keys, pitch LD)
/// and B (query rows, pitch LD) over the head dimension.
template <class T, int D_PAD, int TK>
__device__ __forceinline__ void keys_by_rows(const T* __restrict__ A, const T* __restrict__ B, int key_l0,
                                             int ci, T (&out)[TK][8]) {
  constexpr int LD = D_PAD + kPad<T>;
#pragma unroll
  for (int i = 0; i < TK; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) out[i][j] = T(0);
#pragma unroll 1
  for (int d = 0; d < D_PAD; d += 4) {
    T a[TK][4];
#pragma unroll
    for (int i = 0; i < TK; ++i) ld4(A + (key_l0 + i) * LD + d, a[i]);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      T bv[4];
      ld4(B + (ci + 8 * j) * LD + d, bv);
#pragma unroll
      for (int i = 0; i < TK; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) out[i][j] = fma(a[i][e], bv[e], out[i][j]);
    }
  }
}

template <class T, int D_PAD, int TK>
__global__ void __launch_bounds__(kThreads, blocks_per_sm(bwd_smem_bytes<T, D_PAD, TK>()))
    attention_backward_kernel(const BwdParams<T> p) {
  constexpr int BC = kWarps * 4 * TK;
  constexpr int LD = D_PAD + kPad<T>;
  constexpr int LDC = BC + kPad<T>;
  constexpr int NG = D_PAD / 32;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* Ks = reinterpret_cast<T*>(smem_raw);
  T* Vs = Ks + BC * LD;
  T* Qs = Vs + BC * LD;
  T* dOs = Qs + kQueryTile * LD;
  T* Pt = dOs + kQueryTile * LD;   // [query row][key]
  T* dSt = Pt + kQueryTile * LDC;  // [query row][key]
  T* lse_s = dSt + kQueryTile * LDC;
  T* delta_s = lse_s + kQueryTile;

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int ri = lane >> 3, ci = lane & 7;
  // The first key tiles first: with causal masking they meet the most query tiles.
  const std::int64_t bh = static_cast<std::int64_t>(blockIdx.x) % p.heads;
  const int kt = static_cast<int>(static_cast<std::int64_t>(blockIdx.x) / p.heads);
  const std::int64_t k0 = static_cast<std::int64_t>(kt) * BC;
  const std::int64_t b = bh / p.H, h = bh - b * p.H;
  const std::int64_t moff_bh = b * p.mask.sb + h * p.mask.sh;
  const bool vec = p.vec;
  const T* qg = p.q + bh * p.Sq * p.D;
  const T* dog = p.dout + bh * p.Sq * p.D;

  load_rows<T, D_PAD, BC>(Ks, p.k + bh * p.Sk * p.D, k0, p.Sk, p.D, vec, T(1));
  load_rows<T, D_PAD, BC>(Vs, p.v + bh * p.Sk * p.D, k0, p.Sk, p.D, vec, T(1));

  const int key_l0 = warp * 4 * TK + ri * TK;  // this lane's first key in the block
  const int qr0 = warp * 16 + ri * 4;          // this lane's first query row of dQ
  T dk[TK][4 * NG], dv[TK][4 * NG];
#pragma unroll
  for (int i = 0; i < TK; ++i)
#pragma unroll
    for (int c = 0; c < 4 * NG; ++c) dk[i][c] = dv[i][c] = T(0);

  const int nq = static_cast<int>((p.Sq + kQueryTile - 1) / kQueryTile);
  const int qt_first = p.causal ? static_cast<int>(k0 / kQueryTile) : 0;  // rows < k0 see no key here
  const int n_iter = nq - qt_first;
  for (int it = 0; it < n_iter; ++it) {
    const int qt = qt_first + (it + kt) % n_iter;  // staggered start: fewer atomics on the same rows
    const std::int64_t q0 = static_cast<std::int64_t>(qt) * kQueryTile;
    __syncthreads();  // the previous tile's reads are done
    load_rows<T, D_PAD, kQueryTile>(Qs, qg, q0, p.Sq, p.D, vec, T(1));
    load_rows<T, D_PAD, kQueryTile>(dOs, dog, q0, p.Sq, p.D, vec, T(1));
    for (int r = tid; r < kQueryTile; r += kThreads) {
      const std::int64_t gr = q0 + r;
      lse_s[r] = gr < p.Sq ? p.lse[bh * p.Sq + gr] : neg_inf<T>();
      delta_s[r] = gr < p.Sq ? p.delta[bh * p.Sq + gr] : T(0);
    }
    __syncthreads();

    // P^T = 2^(S^T - lse) for keys key_l0 + i, query rows ci + 8 j (0 where masked).
    T pt[TK][8];
    keys_by_rows<T, D_PAD, TK>(Ks, Qs, key_l0, ci, pt);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int rl = ci + 8 * j;
      const std::int64_t row = q0 + rl;
      const T L = lse_s[rl];
      T w[TK];
#pragma unroll
      for (int i = 0; i < TK; ++i) {
        const std::int64_t key = k0 + key_l0 + i;
        T x = neg_inf<T>();
        if (key < p.Sk && row < p.Sq && L != neg_inf<T>())
          x = apply_mask(p.mask, moff_bh, p.causal, row, key, pt[i][j] * p.smul, p.mask_mul);
        w[i] = pt[i][j] = x == neg_inf<T>() ? T(0) : exp2_of(x - L);
      }
      st_tk<TK>(Pt + rl * LDC + key_l0, w);
    }

    // dS^T = P^T o (dP^T - delta), dP^T = V dO^T.
    T ds[TK][8];
    keys_by_rows<T, D_PAD, TK>(Vs, dOs, key_l0, ci, ds);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int rl = ci + 8 * j;
      const T dl = delta_s[rl];
      T w[TK];
#pragma unroll
      for (int i = 0; i < TK; ++i) w[i] = ds[i][j] = pt[i][j] * (ds[i][j] - dl);
      st_tk<TK>(dSt + rl * LDC + key_l0, w);
    }
    __syncthreads();  // dQ reads every warp's dS

    // dV += P^T dO and dK += dS^T Q: one query row at a time.
#pragma unroll 1
    for (int r = 0; r < kQueryTile; ++r) {
      T pr[TK], sr[TK];
      ld_tk<TK>(Pt + r * LDC + key_l0, pr);
      ld_tk<TK>(dSt + r * LDC + key_l0, sr);
#pragma unroll
      for (int g = 0; g < NG; ++g) {
        T o4[4], q4[4];
        ld4(dOs + r * LD + 4 * ci + 32 * g, o4);
        ld4(Qs + r * LD + 4 * ci + 32 * g, q4);
#pragma unroll
        for (int i = 0; i < TK; ++i)
#pragma unroll
          for (int x = 0; x < 4; ++x) {
            dv[i][4 * g + x] = fma(pr[i], o4[x], dv[i][4 * g + x]);
            dk[i][4 * g + x] = fma(sr[i], q4[x], dk[i][4 * g + x]);
          }
      }
    }

    // dQ[rows qr0 + i] += scale * dS K over this block's keys, added to device memory atomically.
    T dq[4][4 * NG];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int c = 0; c < 4 * NG; ++c) dq[i][c] = T(0);
#pragma unroll 1
    for (int c = 0; c < BC; c += 4) {
      T sv[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i) ld4(dSt + (qr0 + i) * LDC + c, sv[i]);
#pragma unroll
      for (int e = 0; e < 4; ++e)
#pragma unroll
        for (int g = 0; g < NG; ++g) {
          T k4[4];
          ld4(Ks + (c + e) * LD + 4 * ci + 32 * g, k4);
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int x = 0; x < 4; ++x) dq[i][4 * g + x] = fma(sv[i][e], k4[x], dq[i][4 * g + x]);
        }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const std::int64_t row = q0 + qr0 + i;
      if (row >= p.Sq) continue;
      T* dqrow = p.dq + (bh * p.Sq + row) * p.D;
#pragma unroll
      for (int g = 0; g < NG; ++g) {
        const int d = 4 * ci + 32 * g;
        if (d >= p.D) continue;
        T w[4];
#pragma unroll
        for (int x = 0; x < 4; ++x) w[x] = dq[i][4 * g + x] * p.scale;
        if (vec) {
          atomic_add4(dqrow + d, w, true);
        } else {
#pragma unroll
          for (int x = 0; x < 4; ++x)
            if (d + x < p.D) atomicAdd(dqrow + d + x, w[x]);
        }
      }
    }
  }

  // dK = scale * sum dS^T Q, dV = sum P^T dO for this block's keys.
#pragma unroll
  for (int i = 0; i < TK; ++i) {
    const std::int64_t key = k0 + key_l0 + i;
    if (key >= p.Sk) continue;
    T* dkrow = p.dk + (bh * p.Sk + key) * p.D;
    T* dvrow = p.dv + (bh * p.Sk + key) * p.D;
#pragma unroll
    for (int g = 0; g < NG; ++g) {
      const int d = 4 * ci + 32 * g;
      T wk[4], wv[4];
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        wk[x] = dk[i][4 * g + x] * p.scale;
        wv[x] = dv[i][4 * g + x];
      }
      if (vec) {
        if (d < p.D) {
          st4(dkrow + d, wk);
          st4(dvrow + d, wv);
        }
      } else {
#pragma unroll
        for (int x = 0; x < 4; ++x)
          if (d + x < p.D) {
            dkrow[d + x] = wk[x];
            dvrow[d + x] = wv[x];
          }
      }
    }
  }
}

// =================================================================================================
// launchers
// =================================================================================================

/// Whether every pointer is 16-byte aligned (rows then are too when D % 4 == 0).
bool aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* ptr : ptrs)
    if (reinterpret_cast<std::uintptr_t>(ptr) % 16 != 0) return false;
  return true;
}

/// Tile shapes per element type and padded head dimension (each checked with -Xptxas -v: no spills).
template <class T, int D_PAD>
struct Config {
  static constexpr bool kFloat = std::is_same_v<T, float>;
  static constexpr int TM = kFloat ? (D_PAD == 64 ? 8 : 4) : (D_PAD <= 64 ? 4 : 2);
  static constexpr int TK = kFloat ? (D_PAD <= 64 ? 4 : 2) : (D_PAD <= 64 ? 2 : 1);
};

/// Raises a kernel's dynamic shared-memory limit once per device (needed above 48 KB).
template <class Kernel>
void allow_smem(Device dev, Kernel kernel, int bytes, std::once_flag (&flags)[64]) {
  DUALCAST_CHECK(dev.index >= 0 && dev.index < 64, "scaled_dot_product_attention: device index ",
                 dev.index, " out of range");
  std::call_once(flags[dev.index], [&] {
    DUALCAST_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  });
}

template <class T, int D_PAD, int TM>
void launch_forward(const Dims& d, const MaskView& mask, const Tensor& q, const Tensor& k, const Tensor& v,
                    Tensor& o, Tensor& lse) {
  constexpr int BR = kWarps * 4 * TM;
  constexpr int smem = fwd_smem_bytes<T, D_PAD, TM>();
  static std::once_flag flags[64];
  const Device dev = q.device();
  auto kernel = attention_forward_kernel<T, D_PAD, TM>;
  allow_smem(dev, kernel, smem, flags);
  FwdParams<T> p{};
  p.q = q.data<T>();
  p.k = k.data<T>();
  p.v = v.data<T>();
  p.o = o.data<T>();
  p.lse = lse.data<T>();
  p.mask = mask;
  p.heads = d.heads();
  p.H = d.H;
  p.Sq = d.Sq;
  p.Sk = d.Sk;
  p.D = d.D;
  p.q_tiles = static_cast<int>((d.Sq + BR - 1) / BR);
  p.causal = d.causal;
  p.vec = d.D % 4 == 0 && aligned16({p.q, p.k, p.v, p.o});
  p.qmul = static_cast<T>(d.scale * kLog2e);
  p.mask_mul = static_cast<T>(kLog2e);
  const std::int64_t blocks = p.heads * p.q_tiles;
  DUALCAST_CHECK(blocks < (std::int64_t(1) << 31), "scaled_dot_product_attention: ", blocks,
                 " blocks exceed the grid limit");
  kernel<<<static_cast<unsigned>(blocks), kThreads, smem, detail::stream(dev)>>>(p);
  DUALCAST_CUDA_CHECK_LAUNCH();
}

template <class T, int D_PAD>
void launch_backward(const Dims& d, const MaskView& mask, const Tensor& q, const Tensor& k,
                     const Tensor& v, const Tensor& o, const Tensor& lse, const Tensor& dout, Tensor& dq,
                     Tensor& dk, Tensor& dv) {
  constexpr int TK = Config<T, D_PAD>::TK;
  constexpr int BC = kWarps * 4 * TK;
  constexpr int smem = bwd_smem_bytes<T, D_PAD, TK>();
  static std::once_flag flags[64];
  const Device dev = q.device();
  auto kernel = attention_backward_kernel<T, D_PAD, TK>;
  allow_smem(dev, kernel, smem, flags);

  const std::int64_t rows = d.heads() * d.Sq;
  Tensor delta = Tensor::empty(Shape{rows}, q.dtype(), dev);
  {
    const std::int64_t cap = static_cast<std::int64_t>(multiprocessor_count(dev)) * 16;
    const auto blocks = static_cast<unsigned>(std::max<std::int64_t>(1, std::min((rows + 7) / 8, cap)));
    attention_backward_delta_kernel<T><<<blocks, 256, 0, detail::stream(dev)>>>(o.data<T>(), dout.data<T>(),
                                                                                 delta.data<T>(), rows, d.D);
    DUALCAST_CUDA_CHECK_LAUNCH();
  }
  BwdParams<T> p{};
  p.q = q.data<T>();
  p.k = k.data<T>();
  p.v = v.data<T>();
  p.dout = dout.data<T>();
  p.lse = lse.data<T>();
  p.delta = delta.data<T>();
  p.dq = dq.data<T>();
  p.dk = dk.data<T>();
  p.dv = dv.data<T>();
  p.mask = mask;
  p.heads = d.heads();
  p.H = d.H;
  p.Sq = d.Sq;
  p.Sk = d.Sk;
  p.D = d.D;
  p.k_tiles = static_cast<int>((d.Sk + BC - 1) / BC);
  p.causal = d.causal;
  p.vec = d.D % 4 == 0 && aligned16({p.q, p.k, p.v, p.dout, p.dq, p.dk, p.dv});
  p.smul = static_cast<T>(d.scale * kLog2e);
  p.mask_mul = static_cast<T>(kLog2e);
  p.scale = static_cast<T>(d.scale);
  const std::int64_t blocks = p.heads * p.k_tiles;
  DUALCAST_CHECK(blocks < (std::int64_t(1) << 31), "scaled_dot_product_attention: ", blocks,
                 " blocks exceed the grid limit");
  kernel<<<static_cast<unsigned>(blocks), kThreads, smem, detail::stream(dev)>>>(p);
  DUALCAST_CUDA_CHECK_LAUNCH();
}

/// The float32, head_dim 64 forward comes in two tile shapes: 8 rows per lane (128 query rows per
/// block, 2 blocks per SM; the default) or 4 (64 rows, 3 blocks per SM). DUALCAST_ATTENTION_FWD_TM=4
/// selects the second, for benchmarks that compare them; read once.
int forward_rows_per_lane() {
  static const int tm = [] {
    const char* e = std::getenv("DUALCAST_ATTENTION_FWD_TM");
    return e && std::string(e) == "4" ? 4 : 8;
  }();
  return tm;
}

/// Calls fn.template operator()<T, D_PAD>() for q's dtype and the padded head dimension.
template <class Fn>
void dispatch(DType dt, std::int64_t D, Fn&& fn) {
  dispatch_floating(dt, "scaled_dot_product_attention", [&](auto tag) {
    using T = decltype(tag);
    if (D <= 32) fn.template operator()<T, 32>();
    else if (D <= 64) fn.template operator()<T, 64>();
    else fn.template operator()<T, 128>();
  });
}

}  // namespace

void fused_forward(const Dims& d, const MaskView& mask, const Tensor& q, const Tensor& k, const Tensor& v,
                   Tensor& o, Tensor& lse) {
  DUALCAST_CHECK(fused_supported(q.device(), d), "scaled_dot_product_attention: the fused kernels do not "
                 "take head_dim ", d.D, " / ", d.Dv, " on ", q.device().str());
  if (d.heads() == 0 || d.Sq == 0) return;
  if (d.Sk == 0) {  // no key at all: every row is fully masked
    o.fill_(0.0);
    lse.fill_(-INFINITY);
    return;
  }
  detail::DeviceGuard guard(q.device());
  dispatch(q.dtype(), d.D, [&]<class T, int D_PAD>() {
    if constexpr (std::is_same_v<T, float> && D_PAD == 64) {
      if (forward_rows_per_lane() == 4) return launch_forward<T, D_PAD, 4>(d, mask, q, k, v, o, lse);
    }
    launch_forward<T, D_PAD, Config<T, D_PAD>::TM>(d, mask, q, k, v, o, lse);
  });
}

void fused_backward(const Dims& d, const MaskView& mask, const Tensor& q, const Tensor& k, const Tensor& v,
                    const Tensor& o, const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,
                    Tensor& dv) {
  dq = Tensor::zeros(q.shape(), q.dtype(), q.device());
  dk = Tensor::empty(k.shape(), k.dtype(), k.device());
  dv = Tensor::empty(v.shape(), v.dtype(), v.device());
  if (d.heads() == 0 || d.Sk == 0) return;
  if (d.Sq == 0) {
    dk.fill_(0.0);
    dv.fill_(0.0);
    return;
  }
  detail::DeviceGuard guard(q.device());
  dispatch(q.dtype(), d.D, [&]<class T, int D_PAD>() {
    launch_backward<T, D_PAD>(d, mask, q, k, v, o, lse, dout, dq, dk, dv);
  });
}

#else  // no CUDA backend: never called (fused_supported is false)

void fused_forward(const Dims&, const MaskView&, const Tensor&, const Tensor&, const Tensor&, Tensor&,
                   Tensor&) {
  DUALCAST_FAIL("scaled_dot_product_attention: the fused kernels need dualcast's CUDA backend");
}
void fused_backward(const Dims&, const MaskView&, const Tensor&, const Tensor&, const Tensor&,
                    const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&, Tensor&) {
  DUALCAST_FAIL("scaled_dot_product_attention: the fused kernels need dualcast's CUDA backend");
}

#endif

}  // namespace dualcast::attention_detail
