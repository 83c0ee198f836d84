// attention_kernels.cuh (private): the fused attention kernels themselves (forward, the backward's
// rowsum(dO o O), backward), built from attention_tiles.cuh and included by attention_fused.cu
// (which holds their launchers and the design notes). Kept apart so that the kernels' code depends
// on nothing but a handful of CUDA primitives (thread and block indices, barriers, warp shuffles,
// atomics, cp.async, 16-byte vector types): tests/emulation (see cuda_emulation.hpp) runs these
// very kernels on the CPU by supplying those.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "attention_internal.hpp"
#include "attention_tiles.cuh"

namespace dualcast::attention_detail::kernels {

// Unroll factors of the reduction loops of the tile products. Unrolled, ptxas issues the next
// steps' shared-memory loads while the current FMAs run, so a warp hides its own load latency (two
// or three warps per scheduler cannot hide it for one another). Measured on an H200 at seq 1024-4096
// (experiments/transformer/README.md): the forward 4-5 % faster, the backward 7-10 %; more unrolling
// (full) spills or slows the forward.
constexpr int kUnrollHeadDim = 4;    ///< rows_by_rows: steps of 4 along the head dimension
constexpr int kUnrollKeys = 4;       ///< rows_times_groups (O += P V): steps of 4 keys
constexpr int kUnrollRowsDkDv = 8;   ///< backward dK, dV: query rows
constexpr int kUnrollKeysDq = 4;     ///< backward dQ: steps of 4 keys

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
  T smul;      ///< scale * log2(e): S = Q K^T times this is the log2-domain score
  T mask_mul;  ///< log2(e), for additive masks
};

template <class T, int D_PAD, int TM>
constexpr int fwd_smem_bytes() {
  constexpr int BR = kWarps * 4 * TM, LD = D_PAD + kPad<T>, LDP = kKeyTile + kPad<T>;
  return static_cast<int>(sizeof(T)) * ((BR + 2 * kKeyTile) * LD + BR * LDP);
}

/// Blocks per multiprocessor that shared memory allows (228 KB per SM on sm_90, 1 KB of it reserved
/// per block), at most 3; given to __launch_bounds__ so that ptxas budgets registers for that
/// occupancy and no more (left alone, it aims at more blocks than shared memory admits and spills).
/// (Smaller tiles for more blocks per SM were measured slower: 32-key forward tiles at 4 blocks, 32-row
/// backward tiles at 3; paper/measured/h200-2026-11-26b/.)
constexpr int blocks_per_sm(int smem_bytes) {
  const int b = 233472 / (smem_bytes + 1024);
  return b < 1 ? 1 : (b > 3 ? 3 : b);
}

/// A lane's TR x NJ block of A B^T over the head dimension: rows r0 + i of A and rows ci + 8 j of B
/// (both pitch LD). S = Q K^T in the forward; S^T = K Q^T and dP^T = V dO^T in the backward, whose
/// S^T is thus the forward's S bit for bit (the same FMAs in the same order).
template <class T, int D_PAD, int TR, int NJ>
__device__ __forceinline__ void rows_by_rows(const T* __restrict__ A, const T* __restrict__ B, int r0,
                                             int ci, T (&out)[TR][NJ]) {
  constexpr int LD = D_PAD + kPad<T>;
#pragma unroll
  for (int i = 0; i < TR; ++i)
#pragma unroll
    for (int j = 0; j < NJ; ++j) out[i][j] = T(0);
#pragma unroll kUnrollHeadDim
  for (int d = 0; d < D_PAD; d += 4) {
    // Every operand of the step first, then the TR x NJ independent FMAs of each e: no FMA waits
    // for the one before it (an e-innermost order chains four per output).
    T a[TR][4], bv[NJ][4];
#pragma unroll
    for (int i = 0; i < TR; ++i) ld4(A + (r0 + i) * LD + d, a[i]);
#pragma unroll
    for (int j = 0; j < NJ; ++j) ld4(B + (ci + 8 * j) * LD + d, bv[j]);
#pragma unroll
    for (int e = 0; e < 4; ++e)
#pragma unroll
      for (int i = 0; i < TR; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j) out[i][j] = fma(a[i][e], bv[j][e], out[i][j]);
  }
}

/// acc[i][4 g + x] += sum over c < N of A[i][c] B[c][4 ci + 32 g + x]: a lane's ROWS rows of A
/// (pitch LDA, each read four columns at a time as a broadcast; column c stored at c ^ swz) times the
/// 16-byte groups of B's rows (pitch LD) that it owns: O += P V in the forward.
template <int ROWS, int NG, int N, int LDA, int LD, class T>
__device__ __forceinline__ void rows_times_groups(const T* A, const T* B, int ci, int swz, T (&acc)[ROWS][4 * NG]) {
#pragma unroll kUnrollKeys
  for (int c = 0; c < N; c += 4) {
    T a[ROWS][4];
#pragma unroll
    for (int i = 0; i < ROWS; ++i) ld4(A + i * LDA + (c ^ swz), a[i]);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
#pragma unroll
      for (int g = 0; g < NG; ++g) {
        T b4[4];
        ld4(B + (c + e) * LD + 4 * ci + 32 * g, b4);
#pragma unroll
        for (int i = 0; i < ROWS; ++i)
#pragma unroll
          for (int x = 0; x < 4; ++x) acc[i][4 * g + x] = fma(a[i][e], b4[x], acc[i][4 * g + x]);
      }
    }
  }
}

template <class T, int D_PAD, int TM>
__global__ void __launch_bounds__(kThreads, blocks_per_sm(fwd_smem_bytes<T, D_PAD, TM>()))
    attention_forward_kernel(const FwdParams<T> p) {
  constexpr int KT = kKeyTile;
  constexpr int BR = kWarps * 4 * TM;
  constexpr int LD = D_PAD + kPad<T>;
  constexpr int LDP = KT + kPad<T>;
  constexpr int NJ = KT / 8;  // a lane's key columns: ci + 8 j
  constexpr int NG = D_PAD / 32;  // 16-byte groups of a lane's O columns: 4 ci + 32 g + (0..3)
  T* Qs = dynamic_smem<T>();
  T* Ks = Qs + BR * LD;
  T* Vs = Ks + KT * LD;
  T* Ps = Vs + KT * LD;  // per warp: 4 TM rows x LDP

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


  const int row_l0 = warp * 4 * TM + ri * TM;  // this lane's first row in the block
  T* Pw = Ps + (warp * 4 * TM + ri * TM) * LDP;
  // P's columns are XOR-swizzled by 8 ri (groups of 8 keys trade places): the quarter-warps' rows
  // start in the same bank or two (their pitch is TM LDP), and unswizzled the four quarter-warps'
  // stores of one column conflict 2 ways (TM 4) or 4 ways (TM 8).
  const int pswz = 8 * ri;
  T m[TM], l[TM], acc[TM][4 * NG];
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    m[i] = neg_inf<T>();
    l[i] = T(0);
#pragma unroll
    for (int c = 0; c < 4 * NG; ++c) acc[i][c] = T(0);
  }

  const std::int64_t kv_end = p.causal ? std::min<std::int64_t>(p.Sk, q0 + BR) : p.Sk;
  const int n_tiles = static_cast<int>((kv_end + KT - 1) / KT);
  // Pipeline (one K and one V buffer): K of tile t + 1 lands while P V of tile t runs, V of tile
  // t + 1 while S of tile t + 1 runs. Groups in flight at the top of iteration t: K_t, V_t.
  load_rows_async<T, D_PAD, BR>(Qs, qg, q0, p.Sq, p.D, vec);
  if (n_tiles > 0) {
    load_rows_async<T, D_PAD, KT>(Ks, kg, 0, p.Sk, p.D, vec);
    cp_async_commit();  // with Q
    load_rows_async<T, D_PAD, KT>(Vs, vg, 0, p.Sk, p.D, vec);
    cp_async_commit();
  }
  for (int t = 0; t < n_tiles; ++t) {
    const std::int64_t k0 = static_cast<std::int64_t>(t) * KT;
    cp_async_wait<1>();  // K_t has landed (V_t may still be in flight)
    __syncthreads();     // ... for every thread; Q too, the first time

    // S = Q K^T for rows row_l0 + i, columns ci + 8 j.
    T s[TM][NJ];
    rows_by_rows<T, D_PAD, TM, NJ>(Qs, Ks, row_l0, ci, s);

    // The raw scores times one constant (the backward recomputes exactly these values), masked
    // where the tile reaches past Sk or Sq, meets the diagonal or a mask applies; then the online
    // softmax, whose P goes to this warp's rows of Ps.
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < NJ; ++j) s[i][j] *= p.smul;
    if (!interior_tile(p.mask, p.causal, q0, BR, p.Sq, k0, KT, p.Sk)) {
#pragma unroll
      for (int i = 0; i < TM; ++i) {
        const std::int64_t row = q0 + row_l0 + i;
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
          const std::int64_t col = k0 + ci + 8 * j;
          if (col >= p.Sk) s[i][j] = neg_inf<T>();
          else if (row < p.Sq) s[i][j] = apply_mask(p.mask, moff_bh, p.causal, row, col, s[i][j], p.mask_mul);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      T mx = neg_inf<T>();
#pragma unroll
      for (int j = 0; j < NJ; ++j) mx = fmax(mx, s[i][j]);
      mx = group8_max(mx);
      const T m_new = fmax(m[i], mx);
      const T m_use = m_new == neg_inf<T>() ? T(0) : m_new;  // all masked so far: no -inf - -inf
      const T alpha = exp2_of(m[i] - m_use);
      m[i] = m_new;
      l[i] *= alpha;
#pragma unroll
      for (int c = 0; c < 4 * NG; ++c) acc[i][c] *= alpha;
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        const T pj = exp2_of(s[i][j] - m_use);
        l[i] += pj;  // this lane's share of the row sum (combined at the end)
        Pw[i * LDP + ((ci + 8 * j) ^ pswz)] = pj;
      }
    }
    cp_async_wait<0>();  // V_t has landed
    __syncthreads();     // ... for every thread; every read of Ks is done, every P is written
    if (t + 1 < n_tiles) {
      load_rows_async<T, D_PAD, KT>(Ks, kg, k0 + KT, p.Sk, p.D, vec);
      cp_async_commit();
    }

    // O += P V: four keys at a time; a P row of this lane is a broadcast, V rows 16-byte groups.
    rows_times_groups<TM, NG, KT, LDP, LD>(Pw, Vs, ci, pswz, acc);
    __syncthreads();  // every read of Vs and Ps is done
    if (t + 1 < n_tiles) {
      load_rows_async<T, D_PAD, KT>(Vs, vg, k0 + KT, p.Sk, p.D, vec);
      cp_async_commit();
    }
  }

  cp_async_wait<0>();  // nothing may be in flight at exit

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
  constexpr int QT = kQueryTile;
  constexpr int BC = kWarps * 4 * TK, LD = D_PAD + kPad<T>, LDC = BC + kPad<T>;
  return static_cast<int>(sizeof(T)) * ((2 * BC + 2 * QT) * LD + 2 * QT * LDC + 2 * QT);
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
    DUALCAST_ATTENTION_ALIGNED16(p);
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

template <class T, int D_PAD, int TK>
__global__ void __launch_bounds__(kThreads, blocks_per_sm(bwd_smem_bytes<T, D_PAD, TK>()))
    attention_backward_kernel(const BwdParams<T> p) {
  constexpr int QT = kQueryTile;
  static_assert(QT % 16 == 0, "query rows per tile: a multiple of 16");
  constexpr int BC = kWarps * 4 * TK;
  constexpr int NJ = QT / 8;   // a lane's query columns of S^T: ci + 8 j
  constexpr int QR = QT / 16;  // a lane's rows of dQ
  constexpr int LD = D_PAD + kPad<T>;
  constexpr int LDC = BC + kPad<T>;
  constexpr int NG = D_PAD / 32;
  T* Ks = dynamic_smem<T>();
  T* Vs = Ks + BC * LD;
  T* Qs = Vs + BC * LD;
  T* dOs = Qs + QT * LD;
  T* Pt = dOs + QT * LD;   // [query row][key]
  T* dSt = Pt + QT * LDC;  // [query row][key]
  T* lse_s = dSt + QT * LDC;
  T* delta_s = lse_s + QT;

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

  load_rows_async<T, D_PAD, BC>(Ks, p.k + bh * p.Sk * p.D, k0, p.Sk, p.D, vec);
  load_rows_async<T, D_PAD, BC>(Vs, p.v + bh * p.Sk * p.D, k0, p.Sk, p.D, vec);

  const int key_l0 = warp * 4 * TK + ri * TK;  // this lane's first key in the block
  const int qr0 = warp * 4 * QR + ri * QR;     // this lane's first query row of dQ
  T dk[TK][4 * NG], dv[TK][4 * NG];
#pragma unroll
  for (int i = 0; i < TK; ++i)
#pragma unroll
    for (int c = 0; c < 4 * NG; ++c) dk[i][c] = dv[i][c] = T(0);

  const int nq = static_cast<int>((p.Sq + QT - 1) / QT);
  const int qt_first = p.causal ? static_cast<int>(k0 / QT) : 0;  // rows < k0 see no key here
  const int n_iter = nq - qt_first;
  // Query tile `it` of the sweep: staggered starts, so that blocks of one head rarely add to the same
  // dQ rows at once.
  const auto tile_start = [&](int it) {
    return static_cast<std::int64_t>(qt_first + (it + kt) % n_iter) * QT;
  };
  // Q, dO (asynchronous) and lse, delta (plain) of the tile at q0; the copies of tile it + 1 land
  // while dQ of tile it runs.
  const auto fetch = [&](std::int64_t q0) {
    load_rows_async<T, D_PAD, QT>(Qs, qg, q0, p.Sq, p.D, vec);
    load_rows_async<T, D_PAD, QT>(dOs, dog, q0, p.Sq, p.D, vec);
    for (int r = tid; r < QT; r += kThreads) {
      const std::int64_t gr = q0 + r;
      lse_s[r] = gr < p.Sq ? p.lse[bh * p.Sq + gr] : neg_inf<T>();
      delta_s[r] = gr < p.Sq ? p.delta[bh * p.Sq + gr] : T(0);
    }
  };
  if (n_iter > 0) fetch(tile_start(0));
  cp_async_commit();  // K, V and the first Q, dO
  for (int it = 0; it < n_iter; ++it) {
    const std::int64_t q0 = tile_start(it);
    cp_async_wait<0>();  // this tile's Q and dO (and K, V the first time) have landed
    __syncthreads();     // ... for every thread; the previous tile's reads are done

    // P^T = 2^(S^T - lse) for keys key_l0 + i, query rows ci + 8 j (0 where masked).
    T pt[TK][NJ];
    rows_by_rows<T, D_PAD, TK, NJ>(Ks, Qs, key_l0, ci, pt);
#pragma unroll
    for (int i = 0; i < TK; ++i)
#pragma unroll
      for (int j = 0; j < NJ; ++j) pt[i][j] *= p.smul;
    if (!interior_tile(p.mask, p.causal, q0, QT, p.Sq, k0, BC, p.Sk)) {
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        const std::int64_t row = q0 + ci + 8 * j;
        const bool live_row = row < p.Sq && lse_s[ci + 8 * j] != neg_inf<T>();
#pragma unroll
        for (int i = 0; i < TK; ++i) {
          const std::int64_t key = k0 + key_l0 + i;
          pt[i][j] = key < p.Sk && live_row
                         ? apply_mask(p.mask, moff_bh, p.causal, row, key, pt[i][j], p.mask_mul)
                         : neg_inf<T>();
        }
      }
    }
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      const int rl = ci + 8 * j;
      const T L = lse_s[rl];
      T w[TK];
#pragma unroll
      for (int i = 0; i < TK; ++i) w[i] = pt[i][j] = pt[i][j] == neg_inf<T>() ? T(0) : exp2_of(pt[i][j] - L);
      st_tk<TK>(Pt + rl * LDC + key_l0, w);
    }

    // dS^T = P^T o (dP^T - delta), dP^T = V dO^T.
    T ds[TK][NJ];
    rows_by_rows<T, D_PAD, TK, NJ>(Vs, dOs, key_l0, ci, ds);
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      const int rl = ci + 8 * j;
      const T dl = delta_s[rl];
      T w[TK];
#pragma unroll
      for (int i = 0; i < TK; ++i) w[i] = ds[i][j] = pt[i][j] * (ds[i][j] - dl);
      st_tk<TK>(dSt + rl * LDC + key_l0, w);
    }
    __syncthreads();  // dQ reads every warp's dS

    // dV += P^T dO and dK += dS^T Q: one query row at a time.
#pragma unroll kUnrollRowsDkDv
    for (int r = 0; r < QT; ++r) {
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
    __syncthreads();  // every read of Qs, dOs, lse_s and delta_s is done: fetch the next tile
    if (it + 1 < n_iter) {
      fetch(tile_start(it + 1));
      cp_async_commit();
    }

    // dQ[rows qr0 + i] += scale * dS K over this block's keys, added to device memory atomically.
    T dq[QR][4 * NG];
#pragma unroll
    for (int i = 0; i < QR; ++i)
#pragma unroll
      for (int c = 0; c < 4 * NG; ++c) dq[i][c] = T(0);
    // (Written out rather than through rows_times_groups: that form costs the float64 kernels a
    // register, and at head_dim 128 an 8-byte stack frame.)
#pragma unroll kUnrollKeysDq
    for (int c = 0; c < BC; c += 4) {
      T sv[QR][4];
#pragma unroll
      for (int i = 0; i < QR; ++i) ld4(dSt + (qr0 + i) * LDC + c, sv[i]);
#pragma unroll
      for (int e = 0; e < 4; ++e)
#pragma unroll
        for (int g = 0; g < NG; ++g) {
          T k4[4];
          ld4(Ks + (c + e) * LD + 4 * ci + 32 * g, k4);
#pragma unroll
          for (int i = 0; i < QR; ++i)
#pragma unroll
            for (int x = 0; x < 4; ++x) dq[i][4 * g + x] = fma(sv[i][e], k4[x], dq[i][4 * g + x]);
        }
    }
#pragma unroll
    for (int i = 0; i < QR; ++i) {
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

  cp_async_wait<0>();  // nothing may be in flight at exit (n_iter = 0: K and V)

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


}  // namespace dualcast::attention_detail::kernels
