// attention_tiles.cuh (private): the building blocks of the fused attention kernels
// (attention_kernels.cuh): tile constants, 16-byte moves of four elements, cp.async, row loads
// into padded shared-memory tiles, quarter-warp reductions and the mask rule. Like the kernels it
// needs nothing but a handful of CUDA primitives, which tests/emulation supplies on the CPU.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "attention_internal.hpp"

namespace dualcast::attention_detail::kernels {

/// The block's dynamic shared memory (the emulation supplies its own).
template <class T>
__device__ __forceinline__ T* dynamic_smem() {
#if defined(DUALCAST_ATTENTION_EMULATION)
  return reinterpret_cast<T*>(emulation::shared_memory());
#else
  extern __shared__ __align__(16) unsigned char smem_raw[];
  return reinterpret_cast<T*>(smem_raw);
#endif
}

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kKeyTile = 64;    ///< forward: keys per tile
constexpr int kQueryTile = 64;  ///< backward: query rows per tile

/// Shared-memory row padding: 16 bytes.
template <class T>
constexpr int kPad = 16 / static_cast<int>(sizeof(T));

// ---- 16-byte moves of 4 elements (2 x 16 bytes for double) -------------------------------------

#if defined(DUALCAST_ATTENTION_EMULATION)
#define DUALCAST_ATTENTION_ALIGNED16(p) emulation::check_aligned16(p)
#else
#define DUALCAST_ATTENTION_ALIGNED16(p) ((void)0)
#endif

__device__ __forceinline__ void ld4(const float* p, float (&v)[4]) {
  DUALCAST_ATTENTION_ALIGNED16(p);
  const float4 t = *reinterpret_cast<const float4*>(p);
  v[0] = t.x;
  v[1] = t.y;
  v[2] = t.z;
  v[3] = t.w;
}
__device__ __forceinline__ void ld4(const double* p, double (&v)[4]) {
  DUALCAST_ATTENTION_ALIGNED16(p);
  const double2 a = *reinterpret_cast<const double2*>(p);
  const double2 b = *reinterpret_cast<const double2*>(p + 2);
  v[0] = a.x;
  v[1] = a.y;
  v[2] = b.x;
  v[3] = b.y;
}
__device__ __forceinline__ void st4(float* p, const float (&v)[4]) {
  DUALCAST_ATTENTION_ALIGNED16(p);
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void st4(double* p, const double (&v)[4]) {
  DUALCAST_ATTENTION_ALIGNED16(p);
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

// ---- asynchronous global -> shared copies (cp.async, sm_80 and later) ----------------------------
// A tile's copies are issued without staging registers and land while the block computes; each
// thread waits for its own groups (cp_async_wait) and a barrier then makes them visible to all.

/// 16 bytes from global to shared memory; src_bytes < 16 zero-fills the rest (0: no read at all).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  DUALCAST_ATTENTION_ALIGNED16(smem);
  DUALCAST_ATTENTION_ALIGNED16(gmem);
#if defined(DUALCAST_ATTENTION_EMULATION)
  emulation::cp_async16(smem, gmem, src_bytes);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  // No cp.async before sm_80: a plain copy (src_bytes is 0 or 16 here).
  *static_cast<int4*>(smem) = src_bytes ? *static_cast<const int4*>(gmem) : make_int4(0, 0, 0, 0);
#else
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
#endif
}
/// Closes the group of copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() {
#if defined(DUALCAST_ATTENTION_EMULATION)
  emulation::cp_async_commit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#else
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
/// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(DUALCAST_ATTENTION_EMULATION)
  emulation::cp_async_wait(N);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/// load_rows without scaling, asynchronous where it can be (vec: 16-byte aligned rows, D % 4 == 0;
/// otherwise the copies are plain loads and stores, complete when this returns). Zero-fills rows
/// >= n_rows and columns >= D like load_rows.
template <class T, int D_PAD, int ROWS>
__device__ __forceinline__ void load_rows_async(T* __restrict__ sm, const T* __restrict__ g, std::int64_t row0,
                                                std::int64_t n_rows, std::int64_t D, bool vec) {
  if (!vec) {
    load_rows<T, D_PAD, ROWS>(sm, g, row0, n_rows, D, false, T(1));
    return;
  }
  constexpr int kGroups = D_PAD / 4;
  constexpr int LD = D_PAD + kPad<T>;
  constexpr int kChunks = 4 * static_cast<int>(sizeof(T)) / 16;  // 16-byte copies per group of 4
#pragma unroll
  for (int idx = static_cast<int>(threadIdx.x); idx < ROWS * kGroups; idx += kThreads) {
    const int r = idx / kGroups, d = (idx % kGroups) * 4;
    const std::int64_t gr = row0 + r;
    const bool in = gr < n_rows && d < D;
    const T* src = in ? g + gr * D + d : g;
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
      cp_async16(sm + r * LD + d + c * (16 / static_cast<int>(sizeof(T))), src + (in ? c * (16 / static_cast<int>(sizeof(T))) : 0),
                 in ? 16 : 0);
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

/// Whether no score of the tile [q0, q0 + rows) x [k0, k0 + cols) is masked: the tile lies inside
/// Sq x Sk, no mask is given and, with causal masking, every key precedes every row. Such tiles
/// (most of them at long sequences) skip the per-element checks.
__device__ __forceinline__ bool interior_tile(const MaskView& m, bool causal, std::int64_t q0, int rows,
                                              std::int64_t Sq, std::int64_t k0, int cols, std::int64_t Sk) {
  return m.kind == MaskKind::none && q0 + rows <= Sq && k0 + cols <= Sk && (!causal || k0 + cols - 1 <= q0);
}

}  // namespace dualcast::attention_detail::kernels
