// broadcast.cuh: the element bodies of a mixed-mode broadcast. ForwardBody evaluates the user's f
// on dual numbers (one partial per differentiated argument) and writes the outputs (and, under
// Partials::store, the partials); BackwardBody turns adjoints into per-argument gradients, from stored
// partials or by re-evaluating f on duals. Both are parallel_for bodies: the CPU threads and the CUDA
// grid run exactly this code. Each body handles a chunk of V consecutive elements so that contiguous
// operands move as 16-byte vectors on the GPU.
#pragma once

#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "dualcast/config.hpp"
#include "dualcast/dual.hpp"
#include "dualcast/indexing.hpp"
#include "dualcast/parallel.hpp"

namespace dualcast::detail {

/// V values of T moved as one aligned load/store (16 bytes for float x4 or double x2).
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

/// Argument a of f: a dual seeded with unit partial `Slot` for a differentiated argument, else T.
template <class T, int K, bool DUAL, int Slot>
DUALCAST_HD DUALCAST_INLINE auto make_arg(T v) {
  if constexpr (DUAL && Slot >= 0) return Dual<T, K>::variable(v, Slot);
  else return v;
}

template <class T, int K, bool DUAL, class F, int... Slots, std::size_t... A>
DUALCAST_HD DUALCAST_INLINE auto invoke_at(const F& f, const T* x, std::integer_sequence<int, Slots...>,
                                           std::index_sequence<A...>) {
  return f(make_arg<T, K, DUAL, Slots>(x[A])...);
}

template <int... Is, class Fn>
DUALCAST_HD DUALCAST_INLINE void static_for(std::integer_sequence<int, Is...>, Fn&& fn) {
  (fn(std::integral_constant<int, Is>{}), ...);
}

/// Elements per chunk: 16 bytes of T, fewer for wide functions so partials stay in registers.
template <class T, int K>
inline constexpr int chunk_width = (K <= 6 ? 16 : 8) / static_cast<int>(sizeof(T)) > 0
                                       ? (K <= 6 ? 16 : 8) / static_cast<int>(sizeof(T))
                                       : 1;

/// Operands shared by the forward and backward bodies.
template <class T, int NA>
struct BroadcastOperands {
  BroadcastIndexer<NA> ix;
  const T* in[NA > 0 ? NA : 1];  ///< argument data, null for a plain number
  T scal[NA > 0 ? NA : 1];       ///< the number, for plain-number arguments
  std::int64_t n = 0;            ///< output elements
  bool vec = false;              ///< every contiguous operand is 16-byte aligned

  /// Arguments of element i.
  DUALCAST_HD DUALCAST_INLINE void load(std::int64_t i, T* x) const {
    std::int64_t off[NA > 0 ? NA : 1];
    ix.offsets(i, off);
DUALCAST_UNROLL
    for (int a = 0; a < NA; ++a) x[a] = in[a] ? in[a][off[a]] : scal[a];
  }

  /// Arguments of the V elements base..base+V-1 (a full, aligned chunk).
  template <int V>
  DUALCAST_HD DUALCAST_INLINE void load_chunk(std::int64_t base, T (&x)[V][NA > 0 ? NA : 1]) const {
DUALCAST_UNROLL
    for (int a = 0; a < NA; ++a) {
      if (in[a] && ix.access[a] == Access::contiguous) {
        const Packet<T, V> p = *reinterpret_cast<const Packet<T, V>*>(in[a] + base);
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
    std::int64_t off[NA > 0 ? NA : 1];
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
};

template <class T, int V>
DUALCAST_HD DUALCAST_INLINE void store_chunk(T* p, std::int64_t base, const T (&v)[V]) {
  Packet<T, V> pk;
DUALCAST_UNROLL
  for (int e = 0; e < V; ++e) pk.v[e] = v[e];
  *reinterpret_cast<Packet<T, V>*>(p + base) = pk;
}
template <class T, int V>
DUALCAST_HD DUALCAST_INLINE Packet<T, V> load_packet(const T* p, std::int64_t base) {
  return *reinterpret_cast<const Packet<T, V>*>(p + base);
}

/// Forward: out[m][i] = value(f(args at i))[m]; under STORE also part[m][k][i] = partial k.
/// DUAL=false evaluates f on plain numbers (nothing to differentiate).
template <class T, int K, int M, bool DUAL, bool STORE, class F, class Slots>
struct ForwardBody;

template <class T, int K, int M, bool DUAL, bool STORE, class F, int... Slots>
struct ForwardBody<T, K, M, DUAL, STORE, F, std::integer_sequence<int, Slots...>> {
  static constexpr int NA = sizeof...(Slots);
  static constexpr int KK = K > 0 ? K : 1;
  static constexpr int V = chunk_width<T, K>;
  static constexpr bool device_only = is_device_only_lambda<F>;
  F f;
  BroadcastOperands<T, NA> ops;
  T* out[M];
  T* part[M][KK];  ///< STORE only; null where that argument needs no gradient

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

  DUALCAST_HD void operator()(std::int64_t chunk) const {
    const std::int64_t base = chunk * V;
    if (ops.vec && base + V <= ops.n) {
      T x[V][NA > 0 ? NA : 1];
      ops.template load_chunk<V>(base, x);
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
        store_chunk<T, V>(out[m], base, y[m]);
        if constexpr (STORE) {
DUALCAST_UNROLL
          for (int k = 0; k < K; ++k)
            if (part[m][k]) store_chunk<T, V>(part[m][k], base, p[m][k]);
        }
      }
      return;
    }
    for (int e = 0; e < V; ++e) {
      const std::int64_t i = base + e;
      if (i >= ops.n) return;
      T x[NA > 0 ? NA : 1];
      ops.load(i, x);
      T y[M];
      T p[M][KK];
      eval(x, y, p);
DUALCAST_UNROLL
      for (int m = 0; m < M; ++m) {
        out[m][i] = y[m];
        if constexpr (STORE) {
DUALCAST_UNROLL
          for (int k = 0; k < K; ++k)
            if (part[m][k]) part[m][k][i] = p[m][k];
        }
      }
    }
  }
};

/// Backward: for every differentiated argument k with a destination,
///   gout[k][i] = gold[k][i] (or 0) + sum_m adj[m][i] * d out_m / d arg_k (at element i),
/// the partials read back (STORE) or recomputed by evaluating f on duals (recompute).
template <class T, int K, int M, bool STORE, class F, class Slots>
struct BackwardBody;

template <class T, int K, int M, bool STORE, class F, int... Slots>
struct BackwardBody<T, K, M, STORE, F, std::integer_sequence<int, Slots...>> {
  static constexpr int NA = sizeof...(Slots);
  static constexpr int V = chunk_width<T, K>;
  static constexpr bool device_only = is_device_only_lambda<F>;
  F f;
  BroadcastOperands<T, NA> ops;
  const T* part[M][K];  ///< STORE only
  const T* adj[M];      ///< null: nothing flowed into output m
  T* gout[K];           ///< null: argument k needs no gradient
  const T* gold[K];     ///< null: no earlier gradient to add to

  /// d[m][k] at element i (x: the arguments of element i, used when recomputing).
  DUALCAST_HD DUALCAST_INLINE void partials_at(std::int64_t i, const T* x, T (*d)[K]) const {
    if constexpr (STORE) {
      (void)x;
DUALCAST_UNROLL
      for (int m = 0; m < M; ++m)
DUALCAST_UNROLL
        for (int k = 0; k < K; ++k) d[m][k] = part[m][k] ? part[m][k][i] : T(0);
    } else {
      (void)i;
      const auto r = invoke_at<T, K, true>(f, x, std::integer_sequence<int, Slots...>{},
                                           std::make_index_sequence<NA>{});
      using R = std::remove_cvref_t<decltype(r)>;
      static_for(std::make_integer_sequence<int, M>{}, [&](auto m) {
        const auto& o = OutputTraits<R>::template get<decltype(m)::value>(r);
DUALCAST_UNROLL
        for (int k = 0; k < K; ++k) d[m][k] = static_cast<T>(partial(o, k));
      });
    }
  }

  DUALCAST_HD DUALCAST_INLINE void grads_at(const T* a, const T (*d)[K], T* g) const {
DUALCAST_UNROLL
    for (int k = 0; k < K; ++k) {
      T s = T(0);
DUALCAST_UNROLL
      for (int m = 0; m < M; ++m)
        if (adj[m]) s += a[m] * d[m][k];
      g[k] = s;
    }
  }

  DUALCAST_HD void operator()(std::int64_t chunk) const {
    const std::int64_t base = chunk * V;
    if (ops.vec && base + V <= ops.n) {
      T x[V][NA > 0 ? NA : 1];
      if constexpr (!STORE) ops.template load_chunk<V>(base, x);
      T a[V][M];
DUALCAST_UNROLL
      for (int m = 0; m < M; ++m) {
        if (adj[m]) {
          const Packet<T, V> pa = load_packet<T, V>(adj[m], base);
DUALCAST_UNROLL
          for (int e = 0; e < V; ++e) a[e][m] = pa.v[e];
        } else {
DUALCAST_UNROLL
          for (int e = 0; e < V; ++e) a[e][m] = T(0);
        }
      }
      T g[K][V];
DUALCAST_UNROLL
      for (int e = 0; e < V; ++e) {
        T d[M][K];
        partials_at(base + e, x[e], d);
        T ge[K];
        grads_at(a[e], d, ge);
DUALCAST_UNROLL
        for (int k = 0; k < K; ++k) g[k][e] = ge[k];
      }
DUALCAST_UNROLL
      for (int k = 0; k < K; ++k) {
        if (!gout[k]) continue;
        if (gold[k]) {
          const Packet<T, V> po = load_packet<T, V>(gold[k], base);
DUALCAST_UNROLL
          for (int e = 0; e < V; ++e) g[k][e] += po.v[e];
        }
        store_chunk<T, V>(gout[k], base, g[k]);
      }
      return;
    }
    for (int e = 0; e < V; ++e) {
      const std::int64_t i = base + e;
      if (i >= ops.n) return;
      T x[NA > 0 ? NA : 1];
      if constexpr (!STORE) ops.load(i, x);
      T a[M];
DUALCAST_UNROLL
      for (int m = 0; m < M; ++m) a[m] = adj[m] ? adj[m][i] : T(0);
      T d[M][K];
      partials_at(i, x, d);
      T g[K];
      grads_at(a, d, g);
DUALCAST_UNROLL
      for (int k = 0; k < K; ++k)
        if (gout[k]) gout[k][i] = (gold[k] ? gold[k][i] : T(0)) + g[k];
    }
  }
};

}  // namespace dualcast::detail
