// attention_mma.cuh (private): the fused attention kernels for 16-bit q, k, v (bfloat16, float16)
// on tensor cores, included by attention_tensor_core.cu (their launchers). FlashAttention-2's
// structure, as the SIMT kernels of attention_kernels.cuh, with every product an mma.sync m16n8k16
// (16-bit operands, float32 sums) fed by ldmatrix from shared memory; softmax, masks, the running
// maximum and sum, lse and the backward's delta stay float32.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .row.col; g = lane / 4, c = lane % 4):
//   A 16x16: a0 (row g, cols 2c, 2c+1), a1 (row g+8, same cols), a2 (row g, cols 2c+8, 2c+9), a3 (row
//            g+8, cols 2c+8, 2c+9); each register two 16-bit values, the lower column in the low half;
//   B 16x8:  b0 (rows 2c, 2c+1 of column g), b1 (rows 2c+8, 2c+9 of column g);
//   C 16x8:  c0, c1 (row g, cols 2c, 2c+1), c2, c3 (row g+8, cols 2c, 2c+1), float32.
// The C fragments of two adjacent 8-column tiles are, value for value, the A fragment of their
// 16 columns: P (forward) and P^T, dS^T (backward) go from one product to the next in registers.
// Operands stored row-major along the reduction (Q, K for S = Q K^T) load with plain ldmatrix;
// those stored across it (V for P V; dO, Q and K in the backward's P^T dO, dS^T Q, dS K) with
// ldmatrix.trans. Shared-memory rows are padded by 16 bytes so that the 8 rows one 8x8 matrix reads
// fall in 8 distinct bank groups.
//
// Forward: a block of 4 warps owns BR = 64 MA query rows of one (batch, head); each warp 16 MA rows,
// whose Q fragments it keeps in registers. Key tiles of 64: S = Q K^T, masks, online softmax, O +=
// P V; K of tile t + 1 lands while P V of tile t runs, V of tile t + 1 while S of tile t + 1 runs.
// Backward: a block owns 64 keys (16 per warp, whose K and V fragments stay in registers at head
// dims up to 64) and sweeps query tiles of QT rows (from a tile staggered by key block, wrapping
// around, as the SIMT kernel does): S^T = K Q^T and dP^T = V dO^T per warp; P^T and
// dS^T = P^T (dP^T - delta) in registers; dV += P^T dO and dK += dS^T Q; dS^T goes to shared memory
// once, and the four warps form dQ += dS K for the tile (float32, added to a float32 buffer with
// vector atomics) while the next Q and dO tiles land.
#pragma once

#include <cstdint>
#include <type_traits>

#include "attention_tiles.cuh"
#include "dualcast/half.hpp"

namespace dualcast::attention_detail::kernels {

// ---- tensor-core primitives --------------------------------------------------------------------

/// Two floats as one register of two 16-bit values (lo in the low half), rounded to nearest even.
template <class T16>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
#if defined(DUALCAST_ATTENTION_EMULATION)
  if constexpr (std::is_same_v<T16, bfloat16>)
    return std::uint32_t(dualcast::detail::float_to_bf16_bits(lo)) |
           (std::uint32_t(dualcast::detail::float_to_bf16_bits(hi)) << 16);
  else
    return std::uint32_t(dualcast::detail::float_to_fp16_bits(lo)) |
           (std::uint32_t(dualcast::detail::float_to_fp16_bits(hi)) << 16);
#else
  std::uint32_t r;
  if constexpr (std::is_same_v<T16, bfloat16>)
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#endif
}

/// ldmatrix .x4: lane L gives the address of row L % 8 of 8x8 matrix L / 8 (16 bytes, 16-byte
/// aligned, in shared memory); r[j] receives row L / 4 of matrix j, elements 2 (L % 4) and
/// 2 (L % 4) + 1, or with TRANS the same of the transposed matrix.
template <bool TRANS>
__device__ __forceinline__ void ldsm_x4(std::uint32_t (&r)[4], const void* row) {
#if defined(DUALCAST_ATTENTION_EMULATION)
  emulation::ldmatrix_x4(r, row, TRANS);
#else
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
#endif
}

/// d += A B for one m16n8k16 tile (fragments as in the note at the top).
template <class T16>
__device__ __forceinline__ void mma16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                         std::uint32_t b1) {
#if defined(DUALCAST_ATTENTION_EMULATION)
  emulation::mma_m16n8k16(d, a, b0, b1, std::is_same_v<T16, bfloat16>);
#else
  if constexpr (std::is_same_v<T16, bfloat16>)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

/// The two 8-column tiles of one x4 B load: c0 += A B[0:2], c1 += A B[2:4] (load_b_rows/load_b_cols).
template <class T16>
__device__ __forceinline__ void mma_pair(float (&c0)[4], float (&c1)[4], const std::uint32_t (&a)[4],
                                         const std::uint32_t (&b)[4]) {
  mma16816<T16>(c0, a, b[0], b[1]);
  mma16816<T16>(c1, a, b[2], b[3]);
}

/// 2^x by the special function unit alone (ex2.approx.ftz: about 2 ulp, denormal results flushed to
/// zero, 2^-inf = 0). exp2f adds a range test and two multiplies around it to keep denormals, which
/// took a third of the forward's instructions; P is rounded to 16 bits anyway.
__device__ __forceinline__ float fast_exp2(float x) {
#if defined(DUALCAST_ATTENTION_EMULATION)
  return std::exp2(x);
#else
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
#endif
}

/// Two float32 adds to consecutive addresses (8-byte aligned), without a returned value.
__device__ __forceinline__ void atomic_add2(float* p, float a, float b) {
#if !defined(DUALCAST_ATTENTION_EMULATION) && __CUDA_ARCH__ >= 900
  asm volatile("red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
#endif
}

/// One 32-bit store of two 16-bit values.
template <class T16>
__device__ __forceinline__ void store2(T16* p, std::uint32_t v) {
  *reinterpret_cast<std::uint32_t*>(p) = v;
}

/// Shared-memory pitch of a tile of 16-bit rows, in elements: 16 bytes of padding.
template <int COLS>
constexpr int kLd16 = COLS + 8;

/// cp.async of rows [row0, row0 + ROWS) of a row-major [n_rows, D] 16-bit matrix (rows 16-byte
/// aligned: D % 8 == 0) into shared memory of pitch kLd16<D_PAD>; rows >= n_rows and columns >= D
/// are zero-filled. The caller commits.
template <class T16, int D_PAD, int ROWS>
__device__ __forceinline__ void load_tile16(T16* __restrict__ sm, const T16* __restrict__ g, std::int64_t row0,
                                            std::int64_t n_rows, std::int64_t D) {
  constexpr int kChunks = D_PAD / 8;
  constexpr int LD = kLd16<D_PAD>;
#pragma unroll
  for (int idx = static_cast<int>(threadIdx.x); idx < ROWS * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = (idx % kChunks) * 8;
    const std::int64_t gr = row0 + r;
    const bool in = gr < n_rows && c < D;
    cp_async16(sm + r * LD + c, in ? g + gr * D + c : g, in ? 16 : 0);
  }
}

/// A fragments of the 16 x D_PAD row-major tile at `tile` (pitch LD): frag[ks] covers columns
/// 16 ks .. 16 ks + 15.
template <int D_PAD, int LD, class T16>
__device__ __forceinline__ void load_a_rows(std::uint32_t (&frag)[D_PAD / 16][4], const T16* tile, int lane) {
#pragma unroll
  for (int ks = 0; ks < D_PAD / 16; ++ks)
    ldsm_x4<false>(frag[ks], tile + ((lane & 7) + 8 * ((lane >> 3) & 1)) * LD + 16 * ks + 8 * (lane >> 4));
}

/// B fragments of two 8-column tiles of B = X^T for X row-major along the reduction (K in S = Q K^T):
/// rows n0 .. n0 + 15 of X, reduction columns k0 .. k0 + 15. b[0], b[1]: columns n0 .. n0 + 7 of
/// B; b[2], b[3]: n0 + 8 .. n0 + 15.
template <int LD, class T16>
__device__ __forceinline__ void load_b_rows(std::uint32_t (&b)[4], const T16* X, int n0, int k0, int lane) {
  ldsm_x4<false>(b, X + (n0 + (lane & 7) + 8 * (lane >> 4)) * LD + k0 + 8 * ((lane >> 3) & 1));
}

/// B fragments of two 8-column tiles of B = X for X row-major across the reduction (V in P V):
/// reduction rows k0 .. k0 + 15 of X, columns n0 .. n0 + 15.
template <int LD, class T16>
__device__ __forceinline__ void load_b_cols(std::uint32_t (&b)[4], const T16* X, int k0, int n0, int lane) {
  ldsm_x4<true>(b, X + (k0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * LD + n0 + 8 * (lane >> 4));
}

/// The A fragment of columns 16 kk .. 16 kk + 15 of a 16-row block held as C fragments (8-column
/// tiles 2 kk and 2 kk + 1), rounded to 16 bits.
template <class T16, int N>
__device__ __forceinline__ void c_to_a(std::uint32_t (&a)[4], const float (&c)[N][4], int kk) {
  a[0] = pack2<T16>(c[2 * kk][0], c[2 * kk][1]);
  a[1] = pack2<T16>(c[2 * kk][2], c[2 * kk][3]);
  a[2] = pack2<T16>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = pack2<T16>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

// =================================================================================================
// forward
// =================================================================================================

/// What the forward's and the backward's parameters share: the inputs, sizes, mask and constants.
template <class T16>
struct MmaCommon {
  const T16* q;
  const T16* k;
  const T16* v;
  MaskView mask;  ///< an additive mask is float32 here
  std::int64_t heads, H, Sq, Sk, D;
  bool causal;
  float smul;      ///< scale * log2(e)
  float mask_mul;  ///< log2(e)
  float scale;
};

/// The common parameters of a call (q, k, v as the kernels read them: contiguous 16-bit rows).
template <class T16>
MmaCommon<T16> mma_common(const Dims& d, const MaskView& mask, const T16* q, const T16* k, const T16* v) {
  MmaCommon<T16> c{};
  c.q = q;
  c.k = k;
  c.v = v;
  c.mask = mask;
  c.heads = d.heads();
  c.H = d.H;
  c.Sq = d.Sq;
  c.Sk = d.Sk;
  c.D = d.D;
  c.causal = d.causal;
  c.smul = static_cast<float>(d.scale * kLog2e);
  c.mask_mul = static_cast<float>(kLog2e);
  c.scale = static_cast<float>(d.scale);
  return c;
}

template <class T16>
struct MmaFwdParams : MmaCommon<T16> {
  T16* o;
  float* lse;  ///< [heads, Sq], log2 domain
  int q_tiles;
};

constexpr int kMmaKeyTile = 64;

/// Query rows per warp in the forward: 32 (two 16-row fragments share each K and V fragment) up to
/// head dim 64, 16 at 128 (the O accumulator alone is 64 registers there).
template <int D_PAD>
constexpr int kFwdAtoms = D_PAD <= 64 ? 2 : 1;

template <int D_PAD>
constexpr int mma_fwd_smem_bytes() {
  return 2 * (kWarps * 16 * kFwdAtoms<D_PAD> + 2 * kMmaKeyTile) * kLd16<D_PAD>;
}

template <class T16, int D_PAD>
__global__ void __launch_bounds__(kThreads, 2) attention_forward_mma_kernel(const MmaFwdParams<T16> p) {
  constexpr int MA = kFwdAtoms<D_PAD>;
  constexpr int BR = kWarps * 16 * MA;
  constexpr int KT = kMmaKeyTile;
  constexpr int LD = kLd16<D_PAD>;
  constexpr int KS = D_PAD / 16;  // reduction steps over the head dimension
  constexpr int NS = KT / 8;      // 8-key tiles of S
  constexpr int NO = D_PAD / 8;   // 8-column tiles of O
  T16* Qs = dynamic_smem<T16>();
  T16* Ks = Qs + BR * LD;
  T16* Vs = Ks + KT * LD;

  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int g = lane >> 2, c2 = 2 * (lane & 3);
  // The last query tiles first: with causal masking they have the most key tiles.
  const std::int64_t bh = static_cast<std::int64_t>(blockIdx.x) % p.heads;
  const int qt = p.q_tiles - 1 - static_cast<int>(static_cast<std::int64_t>(blockIdx.x) / p.heads);
  const std::int64_t q0 = static_cast<std::int64_t>(qt) * BR;
  const std::int64_t b = bh / p.H, h = bh - b * p.H;
  const std::int64_t moff_bh = b * p.mask.sb + h * p.mask.sh;
  const T16* qg = p.q + bh * p.Sq * p.D;
  const T16* kg = p.k + bh * p.Sk * p.D;
  const T16* vg = p.v + bh * p.Sk * p.D;
  const int wr0 = warp * 16 * MA;         // the warp's first row in the block
  const std::int64_t wq0 = q0 + wr0;      // ... in the sequence

  const std::int64_t kv_end = p.causal ? std::min<std::int64_t>(p.Sk, q0 + BR) : p.Sk;
  const int n_tiles = static_cast<int>((kv_end + KT - 1) / KT);
  // Groups in flight at the top of iteration t: K_t (with Q when t = 0), V_t.
  load_tile16<T16, D_PAD, BR>(Qs, qg, q0, p.Sq, p.D);
  load_tile16<T16, D_PAD, KT>(Ks, kg, 0, p.Sk, p.D);
  cp_async_commit();
  load_tile16<T16, D_PAD, KT>(Vs, vg, 0, p.Sk, p.D);
  cp_async_commit();

  float m[MA][2], l[MA][2], acc[MA][NO][4];
  std::uint32_t qf[MA][KS][4];
#pragma unroll
  for (int a = 0; a < MA; ++a) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      m[a][r] = neg_inf<float>();
      l[a][r] = 0.f;
    }
#pragma unroll
    for (int n = 0; n < NO; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[a][n][e] = 0.f;
  }

  for (int t = 0; t < n_tiles; ++t) {
    const std::int64_t k0 = static_cast<std::int64_t>(t) * KT;
    cp_async_wait<1>();  // K_t has landed (V_t may still be in flight)
    __syncthreads();     // ... for every thread; Q too, the first time
    if (t == 0) {
#pragma unroll
      for (int a = 0; a < MA; ++a) load_a_rows<D_PAD, LD>(qf[a], Qs + (wr0 + 16 * a) * LD, lane);
    }
    // With causal masking, a tile whose first key follows the warp's last row adds nothing to it.
    const bool skip = p.causal && k0 > wq0 + 16 * MA - 1;
    std::uint32_t pf[MA][KT / 16][4];  // P as A fragments for O += P V
    if (!skip) {
      float s[MA][NS][4];
#pragma unroll
      for (int a = 0; a < MA; ++a)
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[a][n][e] = 0.f;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks)
#pragma unroll
        for (int np = 0; np < NS / 2; ++np) {
          std::uint32_t kb[4];
          load_b_rows<LD>(kb, Ks, 16 * np, 16 * ks, lane);
#pragma unroll
          for (int a = 0; a < MA; ++a) {
            mma_pair<T16>(s[a][2 * np], s[a][2 * np + 1], qf[a][ks], kb);
          }
        }
      // The interior test outside the element loops: inside them it cost a branch per score.
      if (interior_tile(p.mask, p.causal, wq0, 16 * MA, p.Sq, k0, KT, p.Sk)) {
#pragma unroll
        for (int a = 0; a < MA; ++a)
#pragma unroll
          for (int n = 0; n < NS; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[a][n][e] *= p.smul;
      } else {
#pragma unroll
        for (int a = 0; a < MA; ++a)
#pragma unroll
          for (int n = 0; n < NS; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              float x = s[a][n][e] * p.smul;
              const std::int64_t row = wq0 + 16 * a + g + 8 * (e >> 1);
              const std::int64_t col = k0 + 8 * n + c2 + (e & 1);
              if (col >= p.Sk) x = neg_inf<float>();
              else if (row < p.Sq) x = apply_mask(p.mask, moff_bh, p.causal, row, col, x, p.mask_mul);
              s[a][n][e] = x;
            }
      }
      // Online softmax of the warp's rows: a row's 64 scores sit in the 4 lanes of one quad.
#pragma unroll
      for (int a = 0; a < MA; ++a)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float mx = neg_inf<float>();
#pragma unroll
          for (int n = 0; n < NS; ++n) mx = fmax(mx, fmax(s[a][n][2 * r], s[a][n][2 * r + 1]));
          mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float m_new = fmax(m[a][r], mx);
          const float m_use = m_new == neg_inf<float>() ? 0.f : m_new;  // all masked so far: no -inf - -inf
          const float alpha = fast_exp2(m[a][r] - m_use);
          m[a][r] = m_new;
          l[a][r] *= alpha;
#pragma unroll
          for (int n = 0; n < NO; ++n) {
            acc[a][n][2 * r] *= alpha;
            acc[a][n][2 * r + 1] *= alpha;
          }
#pragma unroll
          for (int n = 0; n < NS; ++n)
#pragma unroll
            for (int e = 2 * r; e < 2 * r + 2; ++e) {
              const float pe = fast_exp2(s[a][n][e] - m_use);
              l[a][r] += pe;  // this lane's share of the row sum (the quad's are added at the end)
              s[a][n][e] = pe;
            }
        }
#pragma unroll
      for (int a = 0; a < MA; ++a)
#pragma unroll
        for (int kk = 0; kk < KT / 16; ++kk) c_to_a<T16>(pf[a][kk], s[a], kk);
    }
    cp_async_wait<0>();  // V_t has landed
    __syncthreads();     // ... for every thread; every read of Ks is done
    if (t + 1 < n_tiles) {
      load_tile16<T16, D_PAD, KT>(Ks, kg, k0 + KT, p.Sk, p.D);
      cp_async_commit();
    }
    if (!skip) {
#pragma unroll
      for (int kk = 0; kk < KT / 16; ++kk)
#pragma unroll
        for (int dp = 0; dp < NO / 2; ++dp) {
          std::uint32_t vb[4];
          load_b_cols<LD>(vb, Vs, 16 * kk, 16 * dp, lane);
#pragma unroll
          for (int a = 0; a < MA; ++a) {
            mma_pair<T16>(acc[a][2 * dp], acc[a][2 * dp + 1], pf[a][kk], vb);
          }
        }
    }
    __syncthreads();  // every read of Vs is done
    if (t + 1 < n_tiles) {
      load_tile16<T16, D_PAD, KT>(Vs, vg, k0 + KT, p.Sk, p.D);
      cp_async_commit();
    }
  }
  cp_async_wait<0>();  // nothing may be in flight at exit

  // Normalise and store; a fully masked row (l = 0) is written as zeros with lse = -inf.
#pragma unroll
  for (int a = 0; a < MA; ++a)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float lt = l[a][r];
      lt += __shfl_xor_sync(0xffffffffu, lt, 1);
      lt += __shfl_xor_sync(0xffffffffu, lt, 2);
      const std::int64_t row = wq0 + 16 * a + g + 8 * r;
      if (row >= p.Sq) continue;
      const float inv = lt > 0.f ? 1.f / lt : 0.f;
      T16* orow = p.o + (bh * p.Sq + row) * p.D;
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        const int col = 8 * n + c2;
        if (col < p.D) store2(orow + col, pack2<T16>(acc[a][n][2 * r] * inv, acc[a][n][2 * r + 1] * inv));
      }
      if ((lane & 3) == 0) p.lse[bh * p.Sq + row] = lt > 0.f ? m[a][r] + log2_of(lt) : neg_inf<float>();
    }
}

// =================================================================================================
// backward
// =================================================================================================

/// delta[r] = sum_d dout[r, d] * out[r, d] in float32 from 16-bit rows: a warp per row.
template <class T16>
__global__ void __launch_bounds__(256)
    attention_delta16_kernel(const T16* __restrict__ out, const T16* __restrict__ dout, float* __restrict__ delta,
                             std::int64_t rows, std::int64_t D) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * 8;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * 8 + threadIdx.x / 32; r < rows; r += step) {
    float s = 0.f;
    for (std::int64_t d = lane; d < D; d += 32)
      s += static_cast<float>(out[r * D + d]) * static_cast<float>(dout[r * D + d]);
#pragma unroll
    for (int w = 16; w > 0; w >>= 1) s += __shfl_xor_sync(0xffffffffu, s, w);
    if (lane == 0) delta[r] = s;
  }
}

template <class T16>
struct MmaBwdParams : MmaCommon<T16> {
  const T16* dout;
  const float* lse;
  const float* delta;
  float* dq;  ///< float32, zeroed; accumulated with atomics
  T16* dk;
  T16* dv;
  int k_tiles;
};

constexpr int kMmaKeysPerBlock = kWarps * 16;
/// Query rows per backward tile: 64, or 32 at head dim 128 (registers: dK and dV take 128 there).
template <int D_PAD>
constexpr int kBwdQueryTile = D_PAD <= 64 ? 64 : 32;
/// Whether a warp keeps its K and V fragments in registers (else it reads them again per tile).
template <int D_PAD>
constexpr bool kBwdKvInRegs = D_PAD <= 64;

template <int D_PAD>
constexpr int mma_bwd_smem_bytes() {
  constexpr int QT = kBwdQueryTile<D_PAD>;
  return 2 * ((2 * kMmaKeysPerBlock + 2 * QT) * kLd16<D_PAD> + kMmaKeysPerBlock * kLd16<QT>) + 2 * 4 * QT;
}

template <class T16, int D_PAD>
__global__ void __launch_bounds__(kThreads, 2) attention_backward_mma_kernel(const MmaBwdParams<T16> p) {
  constexpr int BC = kMmaKeysPerBlock;
  constexpr int QT = kBwdQueryTile<D_PAD>;
  constexpr int LD = kLd16<D_PAD>, LDS = kLd16<QT>;
  constexpr int KS = D_PAD / 16;  // reduction steps over the head dimension
  constexpr int NQ = QT / 8;      // 8-query tiles of S^T
  constexpr int NO = D_PAD / 8;   // 8-column tiles of dK, dV
  constexpr int WQ = QT / 16;     // dQ: 16-row slices of the query tile ...
  constexpr int WD = kWarps / WQ;  // ... times column slices, one per warp
  constexpr int NOQ = NO / WD;    // 8-column tiles of a warp's dQ slice
  constexpr bool kKvRegs = kBwdKvInRegs<D_PAD>;
  T16* Ks = dynamic_smem<T16>();
  T16* Vs = Ks + BC * LD;
  T16* Qs = Vs + BC * LD;
  T16* dOs = Qs + QT * LD;
  T16* dSs = dOs + QT * LD;  // dS^T: [key][query]
  float* lse_s = reinterpret_cast<float*>(dSs + BC * LDS);
  float* delta_s = lse_s + QT;

  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int g = lane >> 2, c2 = 2 * (lane & 3);
  const std::int64_t bh = static_cast<std::int64_t>(blockIdx.x) % p.heads;
  const int kt = static_cast<int>(static_cast<std::int64_t>(blockIdx.x) / p.heads);
  const std::int64_t k0 = static_cast<std::int64_t>(kt) * BC;
  const std::int64_t b = bh / p.H, h = bh - b * p.H;
  const std::int64_t moff_bh = b * p.mask.sb + h * p.mask.sh;
  const T16* qg = p.q + bh * p.Sq * p.D;
  const T16* kg = p.k + bh * p.Sk * p.D;
  const T16* vg = p.v + bh * p.Sk * p.D;
  const T16* dog = p.dout + bh * p.Sq * p.D;
  const float* lseg = p.lse + bh * p.Sq;
  const float* deltag = p.delta + bh * p.Sq;
  const int wk0 = warp * 16;              // the warp's first key in the block
  const std::int64_t wkey0 = k0 + wk0;    // ... in the sequence

  // With causal masking, queries before the block's first key see none of its keys.
  const int t_begin = p.causal ? static_cast<int>(k0 / QT) : 0;
  const int t_end = static_cast<int>((p.Sq + QT - 1) / QT);
  // The blocks of one head start their sweep at staggered tiles (and wrap around), so that they
  // rarely add to the same dq rows at once: started together, every key block's atomics met on one
  // query tile at a time.
  const int n_t = std::max(0, t_end - t_begin);
  const int t_shift = n_t > 0 ? kt % n_t : 0;
  const auto tile_at = [&](int i) {
    const int j = i + t_shift;
    return t_begin + (j >= n_t ? j - n_t : j);
  };

  // A tile's lse (+inf for rows past Sq and fully masked rows: P = 0 there) and delta, fetched into
  // registers by the first 2 QT threads and stored once the previous tile's are no longer read.
  auto fetch_row_stats = [&](int t) {
    const int i = static_cast<int>(threadIdx.x);
    const std::int64_t row = static_cast<std::int64_t>(t) * QT + (i % QT);
    float x = 0.f;
    if (i < QT) {
      x = std::numeric_limits<float>::infinity();
      if (row < p.Sq) {
        const float lv = lseg[row];
        if (lv != neg_inf<float>()) x = lv;
      }
    } else if (i < 2 * QT) {
      if (row < p.Sq) x = deltag[row];
    }
    return x;
  };
  auto store_row_stats = [&](float x) {
    const int i = static_cast<int>(threadIdx.x);
    if (i < QT) lse_s[i] = x;
    else if (i < 2 * QT) delta_s[i - QT] = x;
  };

  load_tile16<T16, D_PAD, BC>(Ks, kg, k0, p.Sk, p.D);
  load_tile16<T16, D_PAD, BC>(Vs, vg, k0, p.Sk, p.D);
  if (n_t > 0) {
    const int t0 = tile_at(0);
    load_tile16<T16, D_PAD, QT>(Qs, qg, static_cast<std::int64_t>(t0) * QT, p.Sq, p.D);
    load_tile16<T16, D_PAD, QT>(dOs, dog, static_cast<std::int64_t>(t0) * QT, p.Sq, p.D);
    store_row_stats(fetch_row_stats(t0));
  }
  cp_async_commit();

  float dk[NO][4], dv[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.f;
  std::uint32_t kf[kKvRegs ? KS : 1][4], vf[kKvRegs ? KS : 1][4];

  for (int i = 0; i < n_t; ++i) {
    const int t = tile_at(i);
    const bool more = i + 1 < n_t;
    const std::int64_t q_next = more ? static_cast<std::int64_t>(tile_at(i + 1)) * QT : 0;
    const std::int64_t q0 = static_cast<std::int64_t>(t) * QT;
    cp_async_wait<0>();  // Q_t and dO_t (K and V the first time) have landed
    __syncthreads();     // ... for every thread, and the row statistics are stored
    if constexpr (kKvRegs) {
      if (i == 0) {
        load_a_rows<D_PAD, LD>(kf, Ks + wk0 * LD, lane);
        load_a_rows<D_PAD, LD>(vf, Vs + wk0 * LD, lane);
      }
    }
    // With causal masking, a warp whose first key follows the tile's last query gets P = 0.
    const bool skip = p.causal && wkey0 > q0 + QT - 1;
    float s[NQ][4], dp[NQ][4];
#pragma unroll
    for (int n = 0; n < NQ; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.f;
    if (!skip) {
      // S^T = K Q^T and dP^T = V dO^T for the warp's 16 keys.
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        std::uint32_t ka[4], va[4];
        if constexpr (kKvRegs) {
#pragma unroll
          for (int x = 0; x < 4; ++x) {
            ka[x] = kf[ks][x];
            va[x] = vf[ks][x];
          }
        } else {
          ldsm_x4<false>(ka, Ks + (wk0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * LD + 16 * ks + 8 * (lane >> 4));
          ldsm_x4<false>(va, Vs + (wk0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * LD + 16 * ks + 8 * (lane >> 4));
        }
#pragma unroll
        for (int np = 0; np < NQ / 2; ++np) {
          std::uint32_t qb[4], ob[4];
          load_b_rows<LD>(qb, Qs, 16 * np, 16 * ks, lane);
          load_b_rows<LD>(ob, dOs, 16 * np, 16 * ks, lane);
          mma_pair<T16>(s[2 * np], s[2 * np + 1], ka, qb);
          mma_pair<T16>(dp[2 * np], dp[2 * np + 1], va, ob);
        }
      }
      // P^T = 2^(S^T smul - lse) (masked entries 0) and dS^T = P^T (dP^T - delta), in place.
      if (interior_tile(p.mask, p.causal, q0, QT, p.Sq, wkey0, 16, p.Sk)) {
#pragma unroll
        for (int n = 0; n < NQ; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[n][e] *= p.smul;
      } else {
#pragma unroll
        for (int n = 0; n < NQ; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float x = s[n][e] * p.smul;
            const std::int64_t key = wkey0 + g + 8 * (e >> 1);
            const std::int64_t row = q0 + 8 * n + c2 + (e & 1);
            if (key >= p.Sk) x = neg_inf<float>();
            else if (row < p.Sq) x = apply_mask(p.mask, moff_bh, p.causal, row, key, x, p.mask_mul);
            s[n][e] = x;
          }
      }
#pragma unroll
      for (int n = 0; n < NQ; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qi = 8 * n + c2 + (e & 1);
          const float pe = fast_exp2(s[n][e] - lse_s[qi]);
          s[n][e] = pe;
          dp[n][e] = pe * (dp[n][e] - delta_s[qi]);
        }
      // dV += P^T dO and dK += dS^T Q (the scale is applied at the store).
#pragma unroll
      for (int kk = 0; kk < QT / 16; ++kk) {
        std::uint32_t pa[4], sa[4];
        c_to_a<T16>(pa, s, kk);
        c_to_a<T16>(sa, dp, kk);
#pragma unroll
        for (int np = 0; np < NO / 2; ++np) {
          std::uint32_t ob[4], qb[4];
          load_b_cols<LD>(ob, dOs, 16 * kk, 16 * np, lane);
          load_b_cols<LD>(qb, Qs, 16 * kk, 16 * np, lane);
          mma_pair<T16>(dv[2 * np], dv[2 * np + 1], pa, ob);
          mma_pair<T16>(dk[2 * np], dk[2 * np + 1], sa, qb);
        }
      }
    }
    // dS^T (zeros for a skipped warp) to shared memory for dQ.
#pragma unroll
    for (int n = 0; n < NQ; ++n)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        store2(dSs + (wk0 + g + 8 * r) * LDS + 8 * n + c2, pack2<T16>(dp[n][2 * r], dp[n][2 * r + 1]));
    __syncthreads();  // dS^T complete; every read of Qs, dOs and the row statistics is done
    float next_stats = 0.f;
    if (more) {
      load_tile16<T16, D_PAD, QT>(Qs, qg, q_next, p.Sq, p.D);
      load_tile16<T16, D_PAD, QT>(dOs, dog, q_next, p.Sq, p.D);
      cp_async_commit();
      next_stats = fetch_row_stats(static_cast<int>(q_next / QT));
    }
    // dQ[q0 + 16 wq .. + 15][column slice wd] += dS K over the block's 64 keys.
    {
      const int wq = warp % WQ, wd = warp / WQ;
      const int col0 = wd * (D_PAD / WD);
      float dq[NOQ][4];
#pragma unroll
      for (int n = 0; n < NOQ; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) dq[n][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk) {
        std::uint32_t a[4];  // dS rows 16 wq.., keys 16 kk..: dS^T read transposed
        ldsm_x4<true>(a, dSs + (16 * kk + 8 * (lane >> 4) + (lane & 7)) * LDS + 16 * wq + 8 * ((lane >> 3) & 1));
#pragma unroll
        for (int np = 0; np < NOQ / 2; ++np) {
          std::uint32_t kb[4];
          load_b_cols<LD>(kb, Ks, 16 * kk, col0 + 16 * np, lane);
          mma_pair<T16>(dq[2 * np], dq[2 * np + 1], a, kb);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const std::int64_t row = q0 + 16 * wq + g + 8 * r;
        if (row >= p.Sq) continue;
        float* dqrow = p.dq + (bh * p.Sq + row) * p.D;
#pragma unroll
        for (int n = 0; n < NOQ; ++n) {
          const int col = col0 + 8 * n + c2;
          if (col < p.D) atomic_add2(dqrow + col, p.scale * dq[n][2 * r], p.scale * dq[n][2 * r + 1]);
        }
      }
    }
    if (more) store_row_stats(next_stats);
  }
  cp_async_wait<0>();  // nothing may be in flight at exit (no query tile at all: K and V's group)

  // dK (times the scale) and dV of the warp's keys.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const std::int64_t key = wkey0 + g + 8 * r;
    if (key >= p.Sk) continue;
    T16* dkrow = p.dk + (bh * p.Sk + key) * p.D;
    T16* dvrow = p.dv + (bh * p.Sk + key) * p.D;
#pragma unroll
    for (int n = 0; n < NO; ++n) {
      const int col = 8 * n + c2;
      if (col >= p.D) continue;
      store2(dkrow + col, pack2<T16>(p.scale * dk[n][2 * r], p.scale * dk[n][2 * r + 1]));
      store2(dvrow + col, pack2<T16>(dv[n][2 * r], dv[n][2 * r + 1]));
    }
  }
}

}  // namespace dualcast::attention_detail::kernels
