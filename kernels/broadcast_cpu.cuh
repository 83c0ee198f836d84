// broadcast_cpu.cuh: the CPU runner of a broadcast's fast path in SIMD lanes (issue 10, item 3).
// CpuTiles hands parallel_for tiles of W consecutive output elements (two vectors' worth); a tile
// gathers its arguments so that each argument is a row of W lanes, and evaluates the user's functor
// in one loop over the lanes that GCC vectorises with libmvec's vector exp, tanh, ...
// (include/dualcast/vector_math.hpp). Outputs, partials, adjoints and gradients are contiguous over
// the tile, so they are read and written as whole rows. Where a tile lies in one innermost row of
// the output (every call whose innermost dimension is a multiple of W, and every call without
// broadcast arguments) each argument is W consecutive values or one value, read with one offset;
// otherwise the tile gathers chunk by chunk through the body's own fast-path loads.
//
// Two instruction sets, chosen at run time: AVX-512 (16 floats or 8 doubles a vector, libmvec's
// _ZGVeN16v_ variants) where the CPU has it, else AVX2 (8 floats or 4 doubles). Both are compiled
// without contracting a*b+c into a fused multiply-add (AVX-512 brings FMA with it: fp-contract=off),
// so a tile rounds every + and * as the scalar chunks do (contracting differently in the plain and
// dual forms of one functor changed results by ~100 ulp where they cancel); only libmvec's exp,
// tanh, ... differ (<= 4 ulp).
//
// The functor's data-dependent if/else is if-converted: every lane evaluates each branch and keeps
// the one it takes (GCC never speculates what may fault, such as loads or integer division; those
// keep the loop scalar). That needs the translation unit compiled with -fno-trapping-math (CMake
// adds it with DUALCAST_CPU_SIMD; values, inf, NaN and signed zeros are unaffected: only the
// floating-point exception flags are no longer kept exact). A functor that does not vectorise
// still runs correctly, element after element, in the same loop.
//
// A CPU without AVX2, a build without DUALCAST_CPU_SIMD, or DUALCAST_CPU_SIMD=0 in the environment
// runs the scalar chunks (FastChunks), as before; DUALCAST_CPU_SIMD=avx2 keeps a CPU with AVX-512
// on AVX2. The GPU never sees any of this.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "dualcast/config.hpp"
#include "dualcast/vector_math.hpp"

#if DUALCAST_LIBMVEC
#define DUALCAST_CPU_TILES 1
// flatten: the functor and everything it calls are inlined into the lane loop whatever their size
// (a call in the loop would keep it scalar). AVX2 as GCC means it has no FMA; AVX-512F implies FMA,
// so contraction is turned off for those functions.
#define DUALCAST_TILE_AVX2 __attribute__((target("avx2"), flatten, noinline))
#define DUALCAST_TILE_AVX512                                                                   \
  __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,prefer-vector-width=512"),          \
                 optimize("fp-contract=off"), flatten, noinline))
#else
#define DUALCAST_CPU_TILES 0
#endif

namespace dualcast::detail {

#if DUALCAST_CPU_TILES

/// The instruction sets of the tiles.
enum class TileIsa { avx2, avx512 };

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

/// Whether this CPU can run the AVX-512 tiles (F, DQ, VL and BW, what they are compiled for).
inline bool cpu_has_avx512_tiles() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
  return has;
}

/// The tiles' instruction set: AVX-512 where the CPU has it, unless DUALCAST_CPU_SIMD=avx2. Tests set
/// it (only to an ISA the CPU has) to compare both with the scalar chunks.
inline TileIsa& cpu_tile_isa() {
  static TileIsa isa = [] {
    const char* env = std::getenv("DUALCAST_CPU_SIMD");
    if (env && std::strcmp(env, "avx2") == 0) return TileIsa::avx2;
    return cpu_has_avx512_tiles() ? TileIsa::avx512 : TileIsa::avx2;
  }();
  return isa;
}

/// v rounded to the storage type S (bfloat16 and float16 round to nearest even, in the lanes:
/// half.hpp's conversions are branch-free after if-conversion), or v itself when S is T.
template <class S, class T>
DUALCAST_INLINE S to_storage(T v) {
  if constexpr (std::is_same_v<S, T>) return v;
  else return S(v);
}

/// Lanes per tile: two vectors of T (the compute type: float for the 16-bit types).
template <class T, TileIsa I>
inline constexpr int cpu_tile_width = (I == TileIsa::avx512 ? 128 : 64) / static_cast<int>(sizeof(T));

/// The arguments of the tile starting at chunk `first`, one row of W lanes per argument.
template <class Body, int W>
inline void gather_tile(const Body& b, std::uint32_t first,
                                             typename Body::scalar (&xs)[Body::NAX][W]) {
  using T = typename Body::scalar;
  constexpr int V = Body::V;
  // Not unrolled by g++ (nvcc's host pass does not ask to): each chunk's load_args is long (an
  // offset per argument and access kind), and W / V copies of it in every tile of both instruction
  // sets cost compile time and buy nothing next to the loads themselves.
#if !defined(__CUDACC__)
#pragma GCC unroll 1
#endif
  for (int j = 0; j < W / V; ++j) {
    T x[V][Body::NAX];
    b.load_args((first + static_cast<std::uint32_t>(j)) * V, x);
DUALCAST_UNROLL
    for (int a = 0; a < Body::NA; ++a)
DUALCAST_UNROLL
      for (int e = 0; e < V; ++e) xs[a][j * V + e] = x[e][a];
  }
}

/// The arguments of the tile starting at output element `base` when the tile lies in one innermost
/// row of the output (CpuTiles::in_row): then every argument is W consecutive values or one value
/// over the whole tile, so one offset per argument suffices and the rows are filled by whole-vector
/// loads and broadcasts, where gather_tile computes offsets and transposes chunk by chunk.
template <class Body, int W>
inline void gather_tile_in_row(const Body& b, std::uint32_t base,
                               typename Body::scalar (&xs)[Body::NAX][W]) {
  using T = typename Body::scalar;
  using S = typename Body::storage;
  const auto& o = b.ops;
  std::uint32_t off[Body::NAX];
  o.cix.offsets(base, off);
DUALCAST_UNROLL
  for (int a = 0; a < Body::NA; ++a) {
    const S* p = o.in[a];
    if (p && (o.cix.read[a] == ChunkRead::packet || o.cix.read[a] == ChunkRead::strided_packet)) {
      p += off[a];
      for (int e = 0; e < W; ++e) xs[a][e] = static_cast<T>(p[e]);
    } else {
      const T v = p ? static_cast<T>(p[off[a]]) : o.scal[a];  // a number, a one-element tensor, or a row's value
      for (int e = 0; e < W; ++e) xs[a][e] = v;
    }
  }
}

/// Forward over one full tile: the outputs and (under STORE) the partials of W elements.
template <class Body, int W>
inline void forward_tile(const Body& b, std::uint32_t first, bool in_row) {
  using T = typename Body::scalar;
  using S = typename Body::storage;
  constexpr int M = Body::outputs, K = Body::partials, KK = Body::KK;
  const std::uint32_t base = first * Body::V;
  T xs[Body::NAX][W];
  if (in_row) gather_tile_in_row<Body, W>(b, base, xs);
  else gather_tile<Body, W>(b, first, xs);
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
    S* o = b.out[m] + base;
    for (int e = 0; e < W; ++e) o[e] = to_storage<S>(r[m][0][e]);
    if constexpr (Body::stores) {
DUALCAST_UNROLL
      for (int k = 0; k < K; ++k) {
        if (S* q = b.part[m][k]) {
          q += base;
          for (int e = 0; e < W; ++e) q[e] = to_storage<S>(r[m][1 + k][e]);
        }
      }
    }
  }
}

/// Backward (recompute) over one full tile: the gradients of W elements, summed over the outputs
/// in the order of BackwardBody::finish_chunk (sum over m, then the earlier gradient).
template <class Body, int W>
inline void backward_tile(const Body& b, std::uint32_t first, bool in_row) {
  using T = typename Body::scalar;
  using S = typename Body::storage;
  constexpr int M = Body::outputs, K = Body::partials;
  const std::uint32_t base = first * Body::V;
  T xs[Body::NAX][W];
  if (in_row) gather_tile_in_row<Body, W>(b, base, xs);
  else gather_tile<Body, W>(b, first, xs);
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
      const S* adj = b.adj[m];
      if (!adj) continue;  // nothing flowed into output m
      adj += base;
      for (int e = 0; e < W; ++e) g[k][e] += static_cast<T>(adj[e]) * d[m][k][e];
    }
  }
DUALCAST_UNROLL
  for (int k = 0; k < K; ++k) {
    S* o = b.gout[k];
    if (!o) continue;
    o += base;
    if (const S* old = b.gold[k]) {
      old += base;
      for (int e = 0; e < W; ++e) o[e] = to_storage<S>(g[k][e] + static_cast<T>(old[e]));
    } else {
      for (int e = 0; e < W; ++e) o[e] = to_storage<S>(g[k][e]);
    }
  }
}

/// One full tile in the instruction set's lanes: the functions GCC compiles for AVX2 and for
/// AVX-512 (each inlines the tile and the functor whole).
template <class Body>
DUALCAST_TILE_AVX2 void run_tile_avx2(const Body& b, std::uint32_t first, bool in_row) {
  constexpr int W = cpu_tile_width<typename Body::scalar, TileIsa::avx2>;
  if constexpr (Body::forward) forward_tile<Body, W>(b, first, in_row);
  else backward_tile<Body, W>(b, first, in_row);
}
template <class Body>
DUALCAST_TILE_AVX512 void run_tile_avx512(const Body& b, std::uint32_t first, bool in_row) {
  constexpr int W = cpu_tile_width<typename Body::scalar, TileIsa::avx512>;
  if constexpr (Body::forward) forward_tile<Body, W>(b, first, in_row);
  else backward_tile<Body, W>(b, first, in_row);
}

/// The call's last, partial tile as scalar chunks: out of line, one copy for both instruction sets.
template <class Body>
__attribute__((noinline)) void scalar_chunks(const Body& b, std::uint32_t first, std::uint32_t end) {
  for (std::uint32_t c = first; c < end; ++c) b.fast_chunk(c);
}

/// parallel_for's body over tiles: full tiles in SIMD lanes, the call's last (partial) tile as
/// scalar chunks.
template <class Body, TileIsa I>
struct CpuTiles {
  static constexpr bool device_only = Body::device_only;
  static constexpr int W = cpu_tile_width<typename Body::scalar, I>;
  static constexpr int B = W / Body::V;  ///< chunks per tile
  Body body;
  std::uint32_t chunks = 0;  ///< chunks of the call
  /// Every tile lies in one innermost row of the output (no strided argument, or an innermost
  /// dimension that is a multiple of W): gather_tile_in_row applies.
  bool in_row = false;

  CpuTiles(const Body& b, std::uint32_t chunks_of_call)
      : body(b),
        chunks(chunks_of_call),
        in_row(!b.ops.cix.any_strided || b.ops.cix.dims[b.ops.cix.rank - 1].divisor % W == 0) {}

  void operator()(std::int64_t tile) const {
    const auto first = static_cast<std::uint32_t>(tile) * B;
    const std::uint32_t end = first + B < chunks ? first + B : chunks;
    if (end - first == B && static_cast<std::int64_t>(end) * Body::V <= body.ops.n) {
      if constexpr (I == TileIsa::avx512) run_tile_avx512(body, first, in_row);
      else run_tile_avx2(body, first, in_row);
      return;
    }
    scalar_chunks(body, first, end);
  }
};

/// Whether a body runs as CpuTiles: every forward, and the recomputing backward (the storing
/// backward multiplies stored partials by adjoints: nothing to gain), in every storage type.
template <class Body>
inline constexpr bool cpu_tiles_apply = Body::forward || !Body::stores;

#endif  // DUALCAST_CPU_TILES

}  // namespace dualcast::detail
