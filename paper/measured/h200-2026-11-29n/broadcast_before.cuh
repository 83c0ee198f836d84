// broadcast.cuh: the element bodies of a mixed-mode broadcast and their launcher. ForwardBody
// evaluates the user's f (on plain numbers when nothing is stored, else on dual numbers with one
// partial per differentiated argument) and writes the outputs (and, under Partials::store, the
// partials); BackwardBody turns adjoints into per-argument gradients, from stored partials or by
// re-evaluating f on duals. The CPU threads and the CUDA grid run exactly this code.
//
// Each body handles chunks of V consecutive elements, so that contiguous operands move as aligned
// 16-byte packets. Two ways to find a chunk's operands:
//  * the fast path (ChunkIndexer): fewer than 2^31 elements and chunks inside one innermost row;
//    offsets once per chunk in 32-bit arithmetic, every load of a chunk issued before its arithmetic;
//  * the general path (BroadcastIndexer): anything else, 64-bit offsets per element.
// The launcher picks one per call; the arithmetic of an element is shared by both. On the CPU the
// fast path runs as SIMD tiles where the build and the CPU allow (broadcast_cpu.cuh), else as
// scalar chunks.
#pragma once

#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "dualcast/config.hpp"
#include "dualcast/dual.hpp"
#include "dualcast/half.hpp"
#include "dualcast/indexing.hpp"
#include "dualcast/launch.hpp"
#include "dualcast/parallel.hpp"
#include "dualcast/kernels/call_args.cuh"
#include "dualcast/kernels/broadcast_cpu.cuh"

#if defined(__CUDACC__)
#include <cuda_runtime.h>

#include "dualcast/stream.hpp"
#endif

namespace dualcast::detail {

/// V values of T moved as one aligned load/store (16 bytes for float x4 or double x2, 8 bytes for
/// bfloat16 x4).
template <class T, int V>
struct alignas(sizeof(T) * V) Packet {
  T v[V];
};

/// How many outputs f returns, and output m of a result.
template <class R>
struct OutputTraits {
  static constexpr int count = 1;
  template <int m>
  DUALCAST_HD static constexpr const R& get(const R& r) { return r; }
};
template <class... Rs>
struct OutputTraits<std::tuple<Rs...>> {
  static constexpr int count = sizeof...(Rs);
  template <int m>
  DUALCAST_HD static constexpr const auto& get(const std::tuple<Rs...>& r) { return std::get<m>(r); }
};
template <class A, class B>
struct OutputTraits<std::pair<A, B>> {
  static constexpr int count = 2;
  template <int m>
  DUALCAST_HD static constexpr const auto& get(const std::pair<A, B>& r) { return std::get<m>(r); }
};

/// Whether one output value is something a broadcast can store: a number or a dual number.
template <class X>
inline constexpr bool is_output_value_v =
    std::is_arithmetic_v<std::remove_cvref_t<X>> || is_dual_v<X>;

template <class R, class Seq = std::make_index_sequence<OutputTraits<R>::count>>
struct ValidOutput;
template <class R, std::size_t... m>
struct ValidOutput<R, std::index_sequence<m...>> {
  static constexpr bool value = (is_output_value_v<decltype(OutputTraits<R>::template get<m>(
                                     std::declval<const R&>()))> && ...);
};

template <int... Is, class Fn>
DUALCAST_HD DUALCAST_INLINE void static_for(std::integer_sequence<int, Is...>, Fn&& fn) {
  (fn(std::integral_constant<int, Is>{}), ...);
}

/// Elements per chunk: 16 bytes of T, fewer for wide functions so partials stay in registers. T is
/// the compute type: a 16-bit call has float32's chunks (the same registers per chunk, whose
/// budget was tuned for float32), so its packets are 8 bytes.
template <class T, int K>
inline constexpr int chunk_width = (K <= 6 ? 16 : 8) / static_cast<int>(sizeof(T)) > 0
                                       ? (K <= 6 ? 16 : 8) / static_cast<int>(sizeof(T))
                                       : 1;

/// Elements per chunk of the recomputing backward: one from K = 10 on. Evaluating f on Dual<T, K>
/// keeps K partials of every intermediate live per element, so two elements a chunk put the float
/// K = 10 backward of workload c (prod_k tanh) at 76 registers (36.5% achieved occupancy, issue slots
/// busy 46% of the time); one element a chunk needs 48. The price is 14-20% more instructions per
/// element (loads, index arithmetic and guarded stores paid per element; scripts/sass-broadcast).
/// Measured with Nsight Compute on an H200, workload c at 2048^2 (experiments/bench/NOTES.md): K = 10
/// went from 166.1 to 126.9 us (occupancy 52.7%); K = 9 went from 98.4 to 114.2 us (56 -> 40
/// registers did not pay for 18% more instructions), so K = 9 keeps two elements a chunk.
template <class T, int K>
inline constexpr int recompute_chunk_width = K >= 10 ? 1 : chunk_width<T, K>;

// ---- packets -----------------------------------------------------------------------------------

/// A read-only packet load (the non-coherent path on the GPU: every input of a broadcast is
/// read-only while its kernel runs).
template <class T, int V, class Idx>
DUALCAST_HD DUALCAST_INLINE Packet<T, V> load_packet(const T* p, Idx base) {
  const auto* src = reinterpret_cast<const Packet<T, V>*>(p + base);
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(Packet<T, V>) == 16) {
    const float4 r = __ldg(reinterpret_cast<const float4*>(src));
    Packet<T, V> out;
    static_assert(sizeof(out) == sizeof(r));
    __builtin_memcpy(&out, &r, sizeof(r));
    return out;
  } else if constexpr (sizeof(Packet<T, V>) == 8) {
    const float2 r = __ldg(reinterpret_cast<const float2*>(src));
    Packet<T, V> out;
    __builtin_memcpy(&out, &r, sizeof(r));
    return out;
  }
#endif
  return *src;
}

/// One read-only value (non-coherent on the GPU; a 16-bit value through its bits).
template <class T>
DUALCAST_HD DUALCAST_INLINE T load_one(const T* p) {
#if defined(__CUDA_ARCH__)
  if constexpr (is_half_v<T>) return T::from_bits(__ldg(reinterpret_cast<const unsigned short*>(p)));
  else return __ldg(p);
#else
  return *p;
#endif
}

/// A packet store of V computed values, each rounded to the storage type T. `streaming` marks data
/// nobody re-reads soon (gradients, stored partials): on the GPU it is written evict-first, so it
/// does not push inputs out of L2.
template <class T, int V, class Idx, class C>
DUALCAST_HD DUALCAST_INLINE void store_packet(T* p, Idx base, const C (&v)[V], bool streaming = false) {
  Packet<T, V> pk;
DUALCAST_UNROLL
  for (int e = 0; e < V; ++e) pk.v[e] = static_cast<T>(v[e]);
  auto* dst = reinterpret_cast<Packet<T, V>*>(p + base);
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(Packet<T, V>) == 16) {
    if (streaming) {
      float4 r;
      __builtin_memcpy(&r, &pk, sizeof(r));
      __stcs(reinterpret_cast<float4*>(dst), r);
      return;
    }
  }
#else
  (void)streaming;
#endif
  *dst = pk;
}

// ---- operands ----------------------------------------------------------------------------------

/// Operands shared by the forward and backward bodies: tensors stored as S, loaded as T (S itself,
/// or float for a 16-bit S).
template <class T, int NA, class S = T>
struct BroadcastOperands {
  static constexpr int NAX = NA > 0 ? NA : 1;
  BroadcastIndexer<NA> ix;   ///< general path
  ChunkIndexer<NA> cix;      ///< fast path (valid when `fast`)
  const S* in[NAX];          ///< argument data, null for a plain number
  T scal[NAX];               ///< the number, for plain-number arguments
  std::int64_t n = 0;        ///< output elements
  bool vec = false;          ///< every contiguous operand is 16-byte aligned
  bool fast = false;         ///< the fast path applies (vec, cix valid)

  // -- general path: 64-bit offsets per element ----------------------------------------------
  /// Arguments of element i.
  DUALCAST_HD DUALCAST_INLINE void load(std::int64_t i, T* x) const {
    std::int64_t off[NAX];
    ix.offsets(i, off);
DUALCAST_UNROLL
    for (int a = 0; a < NA; ++a) x[a] = in[a] ? in[a][off[a]] : scal[a];
  }

  /// Arguments of the V elements base..base+V-1 (a full, aligned chunk).
  template <int V>
  DUALCAST_HD DUALCAST_INLINE void load_chunk(std::int64_t base, T (&x)[V][NAX]) const {
DUALCAST_UNROLL
    for (int a = 0; a < NA; ++a) {
      if (in[a] && ix.access[a] == Access::contiguous) {
        const Packet<S, V> p = load_packet<S, V>(in[a], base);
DUALCAST_UNROLL
        for (int e = 0; e < V; ++e) x[e][a] = p.v[e];
      }
    }
    if (!ix.any_strided && NA > 0) {
DUALCAST_UNROLL
      for (int a = 0; a < NA; ++a)
        if (!(in[a] && ix.access[a] == Access::contiguous)) {
DUALCAST_UNROLL
          for (int e = 0; e < V; ++e) x[e][a] = in[a] ? in[a][0] : scal[a];
        }
      return;
    }
    std::int64_t off[NAX];
    ix.offsets(base, off);
    if (ix.inner_dim % V == 0) {
      // The chunk lies in one innermost row: its elements differ only in the last coordinate.
DUALCAST_UNROLL
      for (int e = 0; e < V; ++e)
DUALCAST_UNROLL
        for (int a = 0; a < NA; ++a)
          if (!(in[a] && ix.access[a] == Access::contiguous))
            x[e][a] = in[a] ? in[a][off[a] + e * ix.inner_stride[a]] : scal[a];
      return;
    }
DUALCAST_UNROLL
    for (int e = 0; e < V; ++e) {
      if (e > 0) ix.offsets(base + e, off);
DUALCAST_UNROLL
      for (int a = 0; a < NA; ++a)
        if (!(in[a] && ix.access[a] == Access::contiguous)) x[e][a] = in[a] ? in[a][off[a]] : scal[a];
    }
  }

  // -- fast path: 32-bit offsets once per chunk ---------------------------------------------
  /// Arguments of the full chunk base..base+V-1; every load is issued before any is used. Slots
  /// tell plain numbers (kNumberSlot) apart at compile time; a tensor argument costs one uniform
  /// branch (a packet, or one value for the chunk).
  template <int V, int... Slots>
  DUALCAST_HD DUALCAST_INLINE void load_fast(std::uint32_t base, T (&x)[V][NAX]) const {
    std::uint32_t off[NAX];
    cix.offsets(base, off);
    load_fast_args<V>(off, x, std::integer_sequence<int, Slots...>{}, std::make_index_sequence<NA>{});
  }

  template <int V, int... Slots, std::size_t... A>
  DUALCAST_HD DUALCAST_INLINE void load_fast_args(const std::uint32_t (&off)[NAX], T (&x)[V][NAX],
                                                  std::integer_sequence<int, Slots...>,
                                                  std::index_sequence<A...>) const {
    (load_fast_arg<V, static_cast<int>(A), Slots>(off[A], x), ...);
  }

  template <int V, int a, int Slot>
  DUALCAST_HD DUALCAST_INLINE void load_fast_arg(std::uint32_t off, T (&x)[V][NAX]) const {
    if constexpr (Slot == kNumberSlot) {
      (void)off;
DUALCAST_UNROLL
      for (int e = 0; e < V; ++e) x[e][a] = scal[a];
    } else if (cix.read[a] == ChunkRead::packet || cix.read[a] == ChunkRead::strided_packet) {
      const Packet<S, V> p = load_packet<S, V>(in[a], off);
DUALCAST_UNROLL
      for (int e = 0; e < V; ++e) x[e][a] = p.v[e];
    } else {
      const T v = load_one(in[a] + off);
DUALCAST_UNROLL
      for (int e = 0; e < V; ++e) x[e][a] = v;
    }
  }

  /// Arguments of element i on the fast path (only the tail of a call without strided operands
  /// needs it: with strided operands n is a multiple of V).
  DUALCAST_HD DUALCAST_INLINE void load_fast_one(std::uint32_t i, T* x) const {
DUALCAST_UNROLL
    for (int a = 0; a < NA; ++a) x[a] = !in[a] ? scal[a] : in[a][i * cix.own[a]];
  }
};

// ---- the chunk loops of every body -------------------------------------------------------------

/// General path of a body (ForwardBody, BackwardBody): chunk `chunk` of any call, a full chunk in
/// vector loads where ops.vec allows, else element by element. LOAD false: the body reads no
/// argument (x is left unset; a backward reading its stored partials).
template <bool LOAD, class Body>
DUALCAST_HD DUALCAST_INLINE void general_chunk(const Body& b, std::int64_t chunk) {
  constexpr int V = Body::V, NAX = Body::NAX;
  using T = typename Body::scalar;
  const std::int64_t base = chunk * V;
  if (b.ops.vec && base + V <= b.ops.n) {
    T x[V][NAX];
    if constexpr (LOAD) b.ops.template load_chunk<V>(base, x);
    b.finish_chunk(base, x);
    return;
  }
  for (std::int64_t i = base; i < base + V && i < b.ops.n; ++i) {
    T x[NAX];
    if constexpr (LOAD) b.ops.load(i, x);
    b.finish_one(i, x);
  }
}

/// Fast path of a body: chunk `chunk` of a call with ops.fast (32-bit indices).
template <bool LOAD, class Body>
DUALCAST_HD DUALCAST_INLINE void fast_path_chunk(const Body& b, std::uint32_t chunk) {
  constexpr int V = Body::V, NAX = Body::NAX;
  using T = typename Body::scalar;
  const std::uint32_t base = chunk * V;
  const auto n = static_cast<std::uint32_t>(b.ops.n);
  if (base + V <= n) {
    T x[V][NAX];
    if constexpr (LOAD) b.load_args(base, x);
    b.finish_chunk(base, x);
    return;
  }
  for (std::uint32_t i = base; i < n; ++i) {
    T x[NAX];
    if constexpr (LOAD) b.ops.load_fast_one(i, x);
    b.finish_one(i, x);
  }
}

// ---- forward -----------------------------------------------------------------------------------

/// Forward: out[m][i] = value(f(args at i))[m]; under STORE also part[m][k][i] = partial k.
/// DUAL=false evaluates f on plain numbers (nothing to differentiate, or nothing stored).
/// S is the storage type of every tensor of the call; f runs on T = compute_t<S>.
template <class S, int K, int M, bool DUAL, bool STORE, class F, class Slots>
struct ForwardBody;

template <class S, int K, int M, bool DUAL, bool STORE, class F, int... Slots>
struct ForwardBody<S, K, M, DUAL, STORE, F, std::integer_sequence<int, Slots...>> {
  using T = compute_t<S>;
  static constexpr int NA = sizeof...(Slots);
  static constexpr int NAX = NA > 0 ? NA : 1;
  static constexpr int KK = K > 0 ? K : 1;
  static constexpr int V = chunk_width<T, K>;
  static constexpr bool device_only = is_device_only_lambda<F>;
  using scalar = T;   // what the CPU tiles (broadcast_cpu.cuh) need to know of a body
  using storage = S;
  static constexpr int outputs = M;
  static constexpr int partials = K;
  static constexpr bool stores = STORE;
  static constexpr bool forward = true;
  F f;
  BroadcastOperands<T, NA, S> ops;
  S* out[M];
  S* part[M][KK];  ///< STORE only; null where that argument needs no gradient

  DUALCAST_HD DUALCAST_INLINE void eval(const T* x, T* y, T (*p)[KK]) const {
    const auto r = invoke_at<T, K, DUAL>(f, x, std::integer_sequence<int, Slots...>{},
                                         std::make_index_sequence<NA>{});
    using R = std::remove_cvref_t<decltype(r)>;
    static_for(std::make_integer_sequence<int, M>{}, [&](auto m) {
      const auto& o = OutputTraits<R>::template get<decltype(m)::value>(r);
      y[m] = static_cast<T>(value(o));
      if constexpr (STORE) {
DUALCAST_UNROLL
        for (int k = 0; k < K; ++k) p[m][k] = static_cast<T>(partial(o, k));
      }
    });
  }

  /// A full chunk whose arguments are loaded: evaluate and store.
  template <class Idx>
  DUALCAST_HD DUALCAST_INLINE void finish_chunk(Idx base, const T (&x)[V][NAX]) const {
    T y[M][V];
    T p[M][KK][V];
DUALCAST_UNROLL
    for (int e = 0; e < V; ++e) {
      T ye[M];
      T pe[M][KK];
      eval(x[e], ye, pe);
DUALCAST_UNROLL
      for (int m = 0; m < M; ++m) {
        y[m][e] = ye[m];
        if constexpr (STORE) {
DUALCAST_UNROLL
          for (int k = 0; k < K; ++k) p[m][k][e] = pe[m][k];
        }
      }
    }
DUALCAST_UNROLL
    for (int m = 0; m < M; ++m) {
      store_packet<S, V>(out[m], base, y[m]);
      if constexpr (STORE) {
DUALCAST_UNROLL
        for (int k = 0; k < K; ++k)
          if (part[m][k]) store_packet<S, V>(part[m][k], base, p[m][k], /*streaming=*/true);
      }
    }
  }

  template <class Idx>
  DUALCAST_HD DUALCAST_INLINE void finish_one(Idx i, const T* x) const {
    T y[M];
    T p[M][KK];
    eval(x, y, p);
DUALCAST_UNROLL
    for (int m = 0; m < M; ++m) {
      out[m][i] = static_cast<S>(y[m]);
      if constexpr (STORE) {
DUALCAST_UNROLL
        for (int k = 0; k < K; ++k)
          if (part[m][k]) part[m][k][i] = static_cast<S>(p[m][k]);
      }
    }
  }

  /// General path: chunk `chunk` of any call.
  DUALCAST_HD void operator()(std::int64_t chunk) const { general_chunk<true>(*this, chunk); }

  /// The arguments of the full chunk at base on the fast path (the CPU tiles gather through it).
  DUALCAST_HD DUALCAST_INLINE void load_args(std::uint32_t base, T (&x)[V][NAX]) const {
    ops.template load_fast<V, Slots...>(base, x);
  }

  /// Fast path: chunk `chunk` of a call with ops.fast.
  DUALCAST_HD DUALCAST_INLINE void fast_chunk(std::uint32_t chunk) const {
    fast_path_chunk<true>(*this, chunk);
  }
};

// ---- backward ----------------------------------------------------------------------------------

/// Backward: for every differentiated argument k with a destination,
///   gout[k][i] = gold[k][i] (or 0) + sum_m adj[m][i] * d out_m / d arg_k (at element i),
/// the partials read back (STORE) or recomputed by evaluating f on duals (recompute).
/// S is the storage type of every tensor of the call (adjoints and gradients included); the
/// products and sums run on T = compute_t<S>.
template <class S, int K, int M, bool STORE, class F, class Slots>
struct BackwardBody;

template <class S, int K, int M, bool STORE, class F, int... Slots>
struct BackwardBody<S, K, M, STORE, F, std::integer_sequence<int, Slots...>> {
  using T = compute_t<S>;
  static constexpr int NA = sizeof...(Slots);
  static constexpr int NAX = NA > 0 ? NA : 1;
  static constexpr int V = STORE ? chunk_width<T, K> : recompute_chunk_width<T, K>;
  static constexpr bool device_only = is_device_only_lambda<F>;
  using scalar = T;
  using storage = S;
  static constexpr int outputs = M;
  static constexpr int partials = K;
  static constexpr bool stores = STORE;
  static constexpr bool forward = false;
  F f;
  BroadcastOperands<T, NA, S> ops;
  const S* part[M][K];  ///< STORE only
  const S* adj[M];      ///< null: nothing flowed into output m
  S* gout[K];           ///< null: argument k needs no gradient
  const S* gold[K];     ///< null: no earlier gradient to add to
  bool stream_out[K];   ///< gout[k] is nobody's input soon (a gradient, not a buffer to reduce)

  /// d[m][k] of f at one element whose arguments are x (recompute).
  DUALCAST_HD DUALCAST_INLINE void recompute(const T* x, T (*d)[K]) const {
    const auto r = invoke_at<T, K, true>(f, x, std::integer_sequence<int, Slots...>{},
                                         std::make_index_sequence<NA>{});
    using R = std::remove_cvref_t<decltype(r)>;
    static_for(std::make_integer_sequence<int, M>{}, [&](auto m) {
      const auto& o = OutputTraits<R>::template get<decltype(m)::value>(r);
DUALCAST_UNROLL
      for (int k = 0; k < K; ++k) d[m][k] = static_cast<T>(partial(o, k));
    });
  }

  /// A full chunk whose arguments are loaded (recompute; STORE ignores x): gradients, stored.
  template <class Idx>
  DUALCAST_HD DUALCAST_INLINE void finish_chunk(Idx base, const T (&x)[V][NAX]) const {
    T a[M][V];
DUALCAST_UNROLL
    for (int m = 0; m < M; ++m) {
      if (adj[m]) {
        const Packet<S, V> pa = load_packet<S, V>(adj[m], base);
DUALCAST_UNROLL
        for (int e = 0; e < V; ++e) a[m][e] = pa.v[e];
      } else {
DUALCAST_UNROLL
        for (int e = 0; e < V; ++e) a[m][e] = T(0);
      }
    }
    T g[K][V];
    if constexpr (STORE) {
      (void)x;
DUALCAST_UNROLL
      for (int k = 0; k < K; ++k) {
DUALCAST_UNROLL
        for (int e = 0; e < V; ++e) g[k][e] = T(0);
DUALCAST_UNROLL
        for (int m = 0; m < M; ++m) {
          if (!part[m][k] || !adj[m]) continue;
          const Packet<S, V> pp = load_packet<S, V>(part[m][k], base);
DUALCAST_UNROLL
          for (int e = 0; e < V; ++e) g[k][e] += a[m][e] * pp.v[e];
        }
      }
    } else {
DUALCAST_UNROLL
      for (int e = 0; e < V; ++e) {
        T d[M][K];
        recompute(x[e], d);
DUALCAST_UNROLL
        for (int k = 0; k < K; ++k) {
          T s = T(0);
DUALCAST_UNROLL
          for (int m = 0; m < M; ++m)
            if (adj[m]) s += a[m][e] * d[m][k];
          g[k][e] = s;
        }
      }
    }
DUALCAST_UNROLL
    for (int k = 0; k < K; ++k) {
      if (!gout[k]) continue;
      if (gold[k]) {
        const Packet<S, V> po = load_packet<S, V>(gold[k], base);
DUALCAST_UNROLL
        for (int e = 0; e < V; ++e) g[k][e] += po.v[e];
      }
      store_packet<S, V>(gout[k], base, g[k], stream_out[k]);
    }
  }

  template <class Idx>
  DUALCAST_HD DUALCAST_INLINE void finish_one(Idx i, const T* x) const {
    T a[M];
DUALCAST_UNROLL
    for (int m = 0; m < M; ++m) a[m] = adj[m] ? adj[m][i] : T(0);
    T d[M][K];
    if constexpr (STORE) {
      (void)x;
DUALCAST_UNROLL
      for (int m = 0; m < M; ++m)
DUALCAST_UNROLL
        for (int k = 0; k < K; ++k) d[m][k] = part[m][k] ? part[m][k][i] : T(0);
    } else {
      recompute(x, d);
    }
DUALCAST_UNROLL
    for (int k = 0; k < K; ++k) {
      if (!gout[k]) continue;
      T s = gold[k] ? gold[k][i] : T(0);
DUALCAST_UNROLL
      for (int m = 0; m < M; ++m)
        if (adj[m]) s += a[m] * d[m][k];
      gout[k][i] = static_cast<S>(s);
    }
  }

  /// General path: chunk `chunk` of any call. (STORE reads no argument.)
  DUALCAST_HD void operator()(std::int64_t chunk) const { general_chunk<!STORE>(*this, chunk); }

  /// The arguments of the full chunk at base on the fast path (the CPU tiles gather through it).
  DUALCAST_HD DUALCAST_INLINE void load_args(std::uint32_t base, T (&x)[V][NAX]) const {
    ops.template load_fast<V, Slots...>(base, x);
  }

  /// Fast path: chunk `chunk` of a call with ops.fast.
  DUALCAST_HD DUALCAST_INLINE void fast_chunk(std::uint32_t chunk) const {
    fast_path_chunk<!STORE>(*this, chunk);
  }
};

// ---- launch ------------------------------------------------------------------------------------

/// Adapts a body's fast path to parallel_for's index type on the CPU.
template <class Body>
struct FastChunks {
  static constexpr bool device_only = Body::device_only;
  Body body;
  DUALCAST_HD DUALCAST_INLINE void operator()(std::int64_t chunk) const {
    body.fast_chunk(static_cast<std::uint32_t>(chunk));
  }
};

#if defined(__CUDACC__)
inline constexpr int kBroadcastThreads = 256;

/// The fast path's kernel: a grid-stride loop over chunks with 32-bit indices.
template <class Body>
__global__ void __launch_bounds__(kBroadcastThreads)
    broadcast_fast_kernel(const Body body, std::uint32_t chunks) {
  chain_wait();  // launched chained (launch.hpp): nothing is read or written before this
  const std::uint32_t stride = gridDim.x * kBroadcastThreads;
  for (std::uint32_t c = blockIdx.x * kBroadcastThreads + threadIdx.x; c < chunks; c += stride)
    body.fast_chunk(c);
}

/// Blocks of broadcast_fast_kernel<Body> that fit on one multiprocessor (asked once per body type).
template <class Body>
int broadcast_blocks_per_sm() {
  static const int blocks = [] {
    int b = 0;
    DUALCAST_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &b, broadcast_fast_kernel<Body>, kBroadcastThreads, 0));
    return b > 0 ? b : 1;
  }();
  return blocks;
}
#endif

#if DUALCAST_CPU_TILES
/// The fast path of a CPU call as SIMD tiles of instruction set I.
template <class Body, TileIsa I>
void run_cpu_tiles(const Body& body, std::int64_t chunks) {
  using Tiles = CpuTiles<Body, I>;
  const std::int64_t tiles = (chunks + Tiles::B - 1) / Tiles::B;
  cpu_parallel_for(tiles, Tiles{body, static_cast<std::uint32_t>(chunks)},
                   /*cpu_grain=*/kCpuGrain / Tiles::W);
}
#endif

/// Runs `body` over the n output elements of its call: the fast path when ops.fast, else the
/// general one. One resident wave of blocks on the GPU, each thread looping over chunks.
template <class Body>
void launch_broadcast(Device device, const Body& body) {
  const std::int64_t n = body.ops.n;
  const std::int64_t chunks = (n + Body::V - 1) / Body::V;
  if (chunks <= 0) return;
  if (!body.ops.fast) {
    parallel_for(device, chunks, body, /*cpu_grain=*/kCpuGrain / Body::V);
    return;
  }
  if (device.is_cpu()) {
#if DUALCAST_CPU_TILES
    if constexpr (cpu_tiles_apply<Body>) {
      if (cpu_simd_tiles()) {
        if (cpu_tile_isa() == TileIsa::avx512) run_cpu_tiles<Body, TileIsa::avx512>(body, chunks);
        else run_cpu_tiles<Body, TileIsa::avx2>(body, chunks);
        return;
      }
    }
#endif
    // cpu_parallel_for: the GPU runs the fast path as broadcast_fast_kernel, never as FastChunks.
    cpu_parallel_for(chunks, FastChunks<Body>{body}, /*cpu_grain=*/kCpuGrain / Body::V);
    return;
  }
#if defined(__CUDACC__)
  DeviceGuard guard(device);
  const std::int64_t needed = (chunks + kBroadcastThreads - 1) / kBroadcastThreads;
  const std::int64_t wave =
      static_cast<std::int64_t>(multiprocessor_count(device)) * broadcast_blocks_per_sm<Body>();
  const auto blocks = static_cast<unsigned>(needed < wave ? needed : wave);
  launch_chained(device, broadcast_fast_kernel<Body>, dim3(blocks), dim3(kBroadcastThreads), 0, body,
                 static_cast<std::uint32_t>(chunks));
#else
  parallel_for(device, chunks, FastChunks<Body>{body});  // fails with the host-compiler message
#endif
}

}  // namespace dualcast::detail
