// broadcast_cpu.cuh: the CPU runner of a broadcast's fast path in SIMD lanes (issue 10, item 3).
// CpuTiles hands parallel_for tiles of W consecutive output elements (B chunks of the body's V); a
// tile gathers its arguments chunk by chunk (the body's own fast-path loads), transposes them so
// that each argument is a row of W lanes, and evaluates the user's functor in one loop over the
// lanes that GCC vectorises (AVX2, 8 floats or 4 doubles a vector) with libmvec's vector exp, tanh,
// ... (include/dualcast/vector_math.hpp). Outputs, partials, adjoints and gradients are contiguous
// over the tile, so they are read and written as whole rows.
//
// The functor's data-dependent if/else is if-converted: every lane evaluates each branch and keeps
// the one it takes (GCC never speculates what may fault, such as loads or integer division; those
// keep the loop scalar). That needs the translation unit compiled with -fno-trapping-math (CMake
// adds it with DUALCAST_CPU_SIMD; values, inf, NaN and signed zeros are unaffected: only the
// floating-point exception flags are no longer kept exact). A functor that does not vectorise
// still runs correctly, element after element, in the same loop.
//
// Only the AVX2 code is compiled as tiles (one extra instantiation per body, not two): a CPU
// without AVX2, a build without DUALCAST_CPU_SIMD, or DUALCAST_CPU_SIMD=0 in the
// environment runs the scalar chunks (FastChunks), as before. The GPU never sees any of this.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "dualcast/config.hpp"
#include "dualcast/vector_math.hpp"

#if DUALCAST_LIBMVEC
#define DUALCAST_CPU_TILES 1
// flatten: the functor and everything it calls are inlined into the lane loop whatever their size
// (a call in the loop would keep it scalar). AVX2 without FMA: a tile rounds every + and * as the
// scalar chunks do (contracting a*b+c differently in the plain and dual forms of one functor
// changed results by ~100 ulp where they cancel); only libmvec's exp, tanh, ... differ (<= 4 ulp).
#define DUALCAST_TILE_FN __attribute__((target("avx2"), flatten, noinline))
#else
#define DUALCAST_CPU_TILES 0
#endif

namespace dualcast::detail {

#if DUALCAST_CPU_TILES

/// Whether fast-path calls on the CPU run as SIMD tiles: the CPU has AVX2, and the
/// environment does not say DUALCAST_CPU_SIMD=0. Tests set it to compare with the scalar chunks.
inline bool& cpu_simd_tiles() {
  static bool on = [] {
    const char* env = std::getenv("DUALCAST_CPU_SIMD");
    if (env && std::strcmp(env, "0") == 0) return false;
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return on;
}

/// Lanes per tile: two AVX2 vectors of T (a multiple of every chunk width).
template <class T>
inline constexpr int cpu_tile_width = 64 / static_cast<int>(sizeof(T));

/// The arguments of the tile starting at chunk `first`, one row of W lanes per argument.
template <class Body, int W>
inline void gather_tile(const Body& b, std::uint32_t first,
                                             typename Body::scalar (&xs)[Body::NAX][W]) {
  using T = typename Body::scalar;
  constexpr int V = Body::V;
DUALCAST_UNROLL
  for (int j = 0; j < W / V; ++j) {
    T x[V][Body::NAX];
    b.load_args((first + static_cast<std::uint32_t>(j)) * V, x);
DUALCAST_UNROLL
    for (int a = 0; a < Body::NA; ++a)
DUALCAST_UNROLL
      for (int e = 0; e < V; ++e) xs[a][j * V + e] = x[e][a];
  }
}

/// Forward over one full tile: the outputs and (under STORE) the partials of W elements.
template <class Body>
DUALCAST_TILE_FN void forward_tile(const Body& b, std::uint32_t first) {
  using T = typename Body::scalar;
  constexpr int W = cpu_tile_width<T>, M = Body::outputs, K = Body::partials, KK = Body::KK;
  const std::uint32_t base = first * Body::V;
  T xs[Body::NAX][W];
  gather_tile<Body, W>(b, first, xs);
  // A compiler barrier: without it GCC's PRE forwards the gathered values into the first lanes of
  // the loop below and leaves it in a shape the vectoriser refuses (seen with STORE bodies).
  asm volatile("" : : "r"(&xs[0][0]) : "memory");
  T r[M][1 + K][W];  // per output: the value, then the partials
  for (int e = 0; e < W; ++e) {  // the lanes: vectorised
    T xe[Body::NAX];
DUALCAST_UNROLL
    for (int a = 0; a < Body::NA; ++a) xe[a] = xs[a][e];
    T ye[M];
    T pe[M][KK];
    b.eval(xe, ye, pe);
DUALCAST_UNROLL
    for (int m = 0; m < M; ++m) {
      r[m][0][e] = ye[m];
DUALCAST_UNROLL
      for (int k = 0; k < K; ++k) r[m][1 + k][e] = pe[m][k];
    }
  }
DUALCAST_UNROLL
  for (int m = 0; m < M; ++m) {
    T* o = b.out[m] + base;
    for (int e = 0; e < W; ++e) o[e] = r[m][0][e];
    if constexpr (Body::stores) {
DUALCAST_UNROLL
      for (int k = 0; k < K; ++k) {
        if (T* q = b.part[m][k]) {
          q += base;
          for (int e = 0; e < W; ++e) q[e] = r[m][1 + k][e];
        }
      }
    }
  }
}

/// Backward (recompute) over one full tile: the gradients of W elements, summed over the outputs
/// in the order of BackwardBody::finish_chunk (sum over m, then the earlier gradient).
template <class Body>
DUALCAST_TILE_FN void backward_tile(const Body& b, std::uint32_t first) {
  using T = typename Body::scalar;
  constexpr int W = cpu_tile_width<T>, M = Body::outputs, K = Body::partials;
  const std::uint32_t base = first * Body::V;
  T xs[Body::NAX][W];
  gather_tile<Body, W>(b, first, xs);
  asm volatile("" : : "r"(&xs[0][0]) : "memory");  // as in forward_tile
  T d[M][K][W];
  for (int e = 0; e < W; ++e) {  // the lanes: vectorised (nothing else in this loop, so it can be)
    T xe[Body::NAX];
DUALCAST_UNROLL
    for (int i = 0; i < Body::NA; ++i) xe[i] = xs[i][e];
    T de[M][K];
    b.recompute(xe, de);
DUALCAST_UNROLL
    for (int m = 0; m < M; ++m)
DUALCAST_UNROLL
      for (int k = 0; k < K; ++k) d[m][k][e] = de[m][k];
  }
  T g[K][W];
DUALCAST_UNROLL
  for (int k = 0; k < K; ++k) {
    for (int e = 0; e < W; ++e) g[k][e] = T(0);
DUALCAST_UNROLL
    for (int m = 0; m < M; ++m) {
      const T* adj = b.adj[m];
      if (!adj) continue;  // nothing flowed into output m
      adj += base;
      for (int e = 0; e < W; ++e) g[k][e] += adj[e] * d[m][k][e];
    }
  }
DUALCAST_UNROLL
  for (int k = 0; k < K; ++k) {
    T* o = b.gout[k];
    if (!o) continue;
    o += base;
    if (const T* old = b.gold[k]) {
      old += base;
      for (int e = 0; e < W; ++e) o[e] = g[k][e] + old[e];
    } else {
      for (int e = 0; e < W; ++e) o[e] = g[k][e];
    }
  }
}

/// parallel_for's body over tiles: full tiles in SIMD lanes, the call's last (partial) tile as
/// scalar chunks.
template <class Body>
struct CpuTiles {
  static constexpr bool device_only = Body::device_only;
  static constexpr int W = cpu_tile_width<typename Body::scalar>;
  static constexpr int B = W / Body::V;  ///< chunks per tile
  Body body;
  std::uint32_t chunks = 0;  ///< chunks of the call
  void operator()(std::int64_t tile) const {
    const auto first = static_cast<std::uint32_t>(tile) * B;
    const std::uint32_t end = first + B < chunks ? first + B : chunks;
    if (end - first == B && static_cast<std::int64_t>(end) * Body::V <= body.ops.n) {
      if constexpr (Body::forward) forward_tile(body, first);
      else backward_tile(body, first);
      return;
    }
    for (std::uint32_t c = first; c < end; ++c) body.fast_chunk(c);
  }
};

/// Whether a body runs as CpuTiles: every forward, and the recomputing backward (the storing
/// backward multiplies stored partials by adjoints: nothing to gain).
template <class Body>
inline constexpr bool cpu_tiles_apply = Body::forward || !Body::stores;

#endif  // DUALCAST_CPU_TILES

}  // namespace dualcast::detail
