// channel_broadcast.cuh: the element bodies of channel_broadcast (include/dualcast/channel_broadcast.hpp),
// the mixed-mode broadcast over NCHW tensors whose per-channel arguments get their gradients reduced
// inside the backward kernel.
//
// Layout: every full-size operand is a contiguous [N, C, inner] tensor (inner = H*W); element i lies in
// channel c = (i / inner) % C. A per-channel operand holds C values read at c; a number is the same
// everywhere. The forward body runs f on plain numbers (or on duals when f takes nothing else) in
// chunks of V consecutive elements (16 bytes: all in one channel when inner % V == 0). The backward is
// organised by channel: task (c, s) walks the s-th of S slices of channel c's N*inner elements,
// re-evaluates f on duals, writes adj * df/dx for full-size arguments and sums adj * df/dp for
// per-channel ones; the S partial sums of each channel are added in a fixed order afterwards, so the
// result does not depend on thread timing. Same code on CPU threads and in a CUDA grid. Tensors are
// stored as S (float, double, bfloat16, float16) and computed on T = compute_t<S>: a 16-bit call
// has float32's chunks (8-byte packets), and its per-channel partial sums are kept in float.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "dualcast/config.hpp"
#include "dualcast/dual.hpp"
#include "dualcast/half.hpp"
#include "dualcast/parallel.hpp"
#include "dualcast/kernels/call_args.cuh"

#if defined(__CUDACC__)
#include <cuda_runtime.h>

#include "dualcast/stream.hpp"
#endif

namespace dualcast::detail {

/// How an operand is read: one value per element, one per channel, or a number.
enum class ChannelAccess : int { full = 0, channel = 1, number = 2 };

/// Whether a GPU runs the per-channel reductions of [N, C] data (inner = 1: channels last, as an
/// NHWC activation viewed as [N*H*W, C]) in columns: a block of 32 consecutive channels x
/// kColumnRows rows, so that a warp reads 32 neighbouring elements of one row. The one-block-per-
/// channel kernels would read a channel's elements C apart, one memory transaction per element.
inline constexpr int kColumnRows = 8;
DUALCAST_HD DUALCAST_INLINE bool channel_columns(std::int64_t C, std::int64_t inner) {
  return inner == 1 && C >= 8;
}

/// 32-bit division where both fit (several times cheaper on the GPU).
DUALCAST_HD DUALCAST_INLINE std::int64_t cb_div(std::int64_t a, std::int64_t b) {
  if (a < 0x7fffffff && b < 0x7fffffff)
    return static_cast<std::int64_t>(static_cast<std::uint32_t>(a) / static_cast<std::uint32_t>(b));
  return a / b;
}

/// V values moved as one aligned 16-byte load/store.
template <class T, int V>
struct alignas(sizeof(T) * V) CbPacket {
  T v[V];
};

/// Elements per chunk: 16 bytes of T; 8 bytes in the backward of wide functions (K > 6 partials), so
/// a chunk's gradients stay in registers.
template <class T, int K = 1>
inline constexpr int cb_width = (K <= 6 ? 16 : 8) / static_cast<int>(sizeof(T)) > 0
                                    ? (K <= 6 ? 16 : 8) / static_cast<int>(sizeof(T))
                                    : 1;

template <class T, int NA, class S = T>
struct ChannelOperands {
  static constexpr int NN = NA > 0 ? NA : 1;
  const S* in[NN] = {};    ///< a full-size operand's data (stored as S); null otherwise
  const T* chan[NN] = {};  ///< a per-channel operand's C values, in the compute type; null otherwise
  T scal[NN] = {};         ///< the number
  int access[NN] = {};   ///< ChannelAccess
  std::int64_t n = 0, C = 1, inner = 1;
  /// chunks of 16 bytes are aligned and lie in one channel (inner % V == 0), or, with `rows`, in one
  /// row of channels (C % V == 0)
  bool vec = false;
  /// inner == 1 ([N, C]: channels last): a chunk's V elements are V consecutive channels, each with
  /// its own per-channel values (the forward only: the backward's per-channel sums walk channels)
  bool rows = false;

  [[nodiscard]] DUALCAST_HD DUALCAST_INLINE std::int64_t channel_of(std::int64_t i) const {
    const std::int64_t q = cb_div(i, inner);
    return q - cb_div(q, C) * C;
  }
  DUALCAST_HD DUALCAST_INLINE void load(std::int64_t i, std::int64_t c, T* x) const {
    DUALCAST_UNROLL
    for (int a = 0; a < NA; ++a)
      x[a] = access[a] == static_cast<int>(ChannelAccess::full)      ? static_cast<T>(in[a][i])
             : access[a] == static_cast<int>(ChannelAccess::channel) ? chan[a][c]
                                                                     : scal[a];
  }
  /// Arguments of the V elements base..base+V-1 of channel c (vec only).
  template <int V>
  DUALCAST_HD DUALCAST_INLINE void load_chunk(std::int64_t base, std::int64_t c, T (&x)[V][NN]) const {
    DUALCAST_UNROLL
    for (int a = 0; a < NA; ++a) {
      if (access[a] == static_cast<int>(ChannelAccess::full)) {
        const CbPacket<S, V> p = *reinterpret_cast<const CbPacket<S, V>*>(in[a] + base);
        DUALCAST_UNROLL
        for (int e = 0; e < V; ++e) x[e][a] = p.v[e];
      } else if (rows && access[a] == static_cast<int>(ChannelAccess::channel)) {
        DUALCAST_UNROLL
        for (int e = 0; e < V; ++e) x[e][a] = chan[a][c + e];
      } else {
        const T v = access[a] == static_cast<int>(ChannelAccess::channel) ? chan[a][c] : scal[a];
        DUALCAST_UNROLL
        for (int e = 0; e < V; ++e) x[e][a] = v;
      }
    }
  }
};

// ---- forward ---------------------------------------------------------------------------------------

/// out[i] = value(f(args at i)); DUAL=false evaluates f on plain numbers.
template <class S, int K, bool DUAL, class F, class Slots>
struct ChannelForwardBody;

template <class S, int K, bool DUAL, class F, int... Slots>
struct ChannelForwardBody<S, K, DUAL, F, std::integer_sequence<int, Slots...>> {
  using T = compute_t<S>;
  static constexpr int NA = sizeof...(Slots);
  static constexpr int NN = NA > 0 ? NA : 1;
  static constexpr int V = cb_width<T>;
  F f;
  ChannelOperands<T, NA, S> ops{};
  S* out = nullptr;

  [[nodiscard]] DUALCAST_HD DUALCAST_INLINE T eval(const T* x) const {
    return static_cast<T>(value(invoke_at<T, (K > 0 ? K : 1), DUAL>(
        f, x, std::integer_sequence<int, Slots...>{}, std::make_index_sequence<NA>{})));
  }

  DUALCAST_HD void operator()(std::int64_t chunk) const {
    const std::int64_t base = chunk * V;
    if (ops.vec) {  // n is a multiple of V here
      const std::int64_t c = ops.channel_of(base);
      T x[V][NN];
      ops.template load_chunk<V>(base, c, x);
      CbPacket<S, V> y;
      DUALCAST_UNROLL
      for (int e = 0; e < V; ++e) y.v[e] = static_cast<S>(eval(x[e]));
      *reinterpret_cast<CbPacket<S, V>*>(out + base) = y;
      return;
    }
    for (int e = 0; e < V; ++e) {
      const std::int64_t i = base + e;
      if (i >= ops.n) return;
      T x[NN];
      ops.load(i, ops.channel_of(i), x);
      out[i] = static_cast<S>(eval(x));
    }
  }
};

// ---- backward --------------------------------------------------------------------------------------

/// Task (c, s) of the backward pass: for the s-th slice of channel c, with g = adj * df/d(arg k),
///   gout[k][i] = (gold[k] ? gout[k][i] : 0) + g     for full-size arguments with a destination,
///   partial[(k * C + c) * S + s] = sum of g           for per-channel arguments that need a gradient.
template <class St, int K, class F, class Slots>
struct ChannelBackwardBody;

template <class St, int K, class F, int... Slots>
struct ChannelBackwardBody<St, K, F, std::integer_sequence<int, Slots...>> {
  using T = compute_t<St>;
  static constexpr int NA = sizeof...(Slots);
  static constexpr int NN = NA > 0 ? NA : 1;
  static constexpr int V = cb_width<T, K>;
  F f;
  ChannelOperands<T, NA, St> ops{};
  const St* adj = nullptr;
  St* gout[K] = {};
  bool gold[K] = {};
  bool reduce[K] = {};
  T* partial = nullptr;  ///< per-channel partial sums, in the compute type
  std::int64_t S = 1;  ///< slices per channel
  std::int64_t M = 0;  ///< elements per channel (N * inner)

  /// Element index of in-channel position j of channel c.
  [[nodiscard]] DUALCAST_HD DUALCAST_INLINE std::int64_t index(std::int64_t c, std::int64_t j) const {
    const std::int64_t n = cb_div(j, ops.inner);
    return (n * ops.C + c) * ops.inner + (j - n * ops.inner);
  }
  /// First in-channel position of slice s (a multiple of V when vectorised).
  [[nodiscard]] DUALCAST_HD DUALCAST_INLINE std::int64_t slice_begin(std::int64_t s) const {
    if (ops.vec) return (M / V) * s / S * V;
    return M * s / S;
  }

  /// Per-element gradients g[k] of the element with arguments x and adjoint a.
  DUALCAST_HD DUALCAST_INLINE void grads(const T* x, T a, T* g) const {
    const auto r = invoke_at<T, K, true>(f, x, std::integer_sequence<int, Slots...>{},
                                         std::make_index_sequence<NA>{});
    DUALCAST_UNROLL
    for (int k = 0; k < K; ++k) g[k] = a * static_cast<T>(dualcast::partial(r, k));
  }

  /// One element: writes full-size gradients, adds per-channel ones to acc.
  DUALCAST_HD DUALCAST_INLINE void element(std::int64_t i, std::int64_t c, T* acc) const {
    T x[NN];
    ops.load(i, c, x);
    T g[K];
    grads(x, adj[i], g);
    DUALCAST_UNROLL
    for (int k = 0; k < K; ++k) {
      if (gout[k]) gout[k][i] = static_cast<St>((gold[k] ? static_cast<T>(gout[k][i]) : T(0)) + g[k]);
      if (reduce[k]) acc[k] += g[k];
    }
  }

  /// V consecutive elements starting at i (one channel, aligned).
  DUALCAST_HD DUALCAST_INLINE void chunk(std::int64_t i, std::int64_t c, T* acc) const {
    T x[V][NN];
    ops.template load_chunk<V>(i, c, x);
    const CbPacket<St, V> pa = *reinterpret_cast<const CbPacket<St, V>*>(adj + i);
    T g[K][V];
    DUALCAST_UNROLL
    for (int e = 0; e < V; ++e) {
      T ge[K];
      grads(x[e], pa.v[e], ge);
      DUALCAST_UNROLL
      for (int k = 0; k < K; ++k) {
        g[k][e] = ge[k];
        if (reduce[k]) acc[k] += ge[k];
      }
    }
    DUALCAST_UNROLL
    for (int k = 0; k < K; ++k) {
      if (!gout[k]) continue;
      CbPacket<St, V> p;
      if (gold[k]) p = *reinterpret_cast<const CbPacket<St, V>*>(gout[k] + i);
      DUALCAST_UNROLL
      for (int e = 0; e < V; ++e) p.v[e] = static_cast<St>((gold[k] ? static_cast<T>(p.v[e]) : T(0)) + g[k][e]);
      *reinterpret_cast<CbPacket<St, V>*>(gout[k] + i) = p;
    }
  }

  /// Positions [j0, j1) of channel c, visited with step `step` (in elements) from j0 + offset;
  /// the per-channel sums go to acc.
  DUALCAST_HD DUALCAST_INLINE void walk(std::int64_t c, std::int64_t j0, std::int64_t j1,
                                        std::int64_t offset, std::int64_t step, T* acc) const {
    if (ops.vec) {
      for (std::int64_t j = j0 + offset * V; j < j1; j += step * V) chunk(index(c, j), c, acc);
    } else {
      for (std::int64_t j = j0 + offset; j < j1; j += step) element(index(c, j), c, acc);
    }
  }

  /// The whole task t = c * S + s on one CPU thread.
  void run_task(std::int64_t t) const {
    const std::int64_t c = t / S, s = t - (t / S) * S;
    T acc[K] = {};
    walk(c, slice_begin(s), slice_begin(s + 1), 0, 1, acc);
    for (int k = 0; k < K; ++k)
      if (reduce[k]) partial[(k * ops.C + c) * S + s] = acc[k];
  }
};

template <class Body>
void cb_run_tasks(const void* ctx, std::int64_t begin, std::int64_t end) {
  const Body& body = *static_cast<const Body*>(ctx);
  for (std::int64_t t = begin; t < end; ++t) body.run_task(t);
}

/// out[r][c] = sum over s of partial[(slot_of[r] * C + c) * S + s], added in order, in double;
/// partials of type T, gradients stored as O.
template <class T, class O = T>
struct ChannelPartialSum {
  const T* partial = nullptr;
  O* out[16] = {};
  int slot_of[16] = {};
  std::int64_t C = 1, S = 1;
  DUALCAST_HD void operator()(std::int64_t i) const {
    const std::int64_t r = cb_div(i, C), c = i - r * C;
    const T* p = partial + (static_cast<std::int64_t>(slot_of[r]) * C + c) * S;
    double acc = 0.0;
    for (std::int64_t s = 0; s < S; ++s) acc += static_cast<double>(p[s]);
    out[r][c] = static_cast<O>(acc);
  }
};

#if defined(__CUDACC__)
inline constexpr int kChannelBlock = 256;

/// Block t = c * S + s runs task (c, s): its threads stride over the slice, then the block sums
/// each reduced slot (warp shuffles, then one warp over the warps' sums).
template <class Body, int K, class T>
__global__ void __launch_bounds__(kChannelBlock) channel_backward_kernel(Body body) {
  const std::int64_t t = blockIdx.x;
  const std::int64_t c = t / body.S, s = t - c * body.S;
  T acc[K];
  DUALCAST_UNROLL
  for (int k = 0; k < K; ++k) acc[k] = T(0);
  body.walk(c, body.slice_begin(s), body.slice_begin(s + 1), threadIdx.x, blockDim.x, acc);
  __shared__ T warp_sums[K][kChannelBlock / 32];
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  DUALCAST_UNROLL
  for (int k = 0; k < K; ++k) {
    if (!body.reduce[k]) continue;
    T v = acc[k];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if (lane == 0) warp_sums[k][warp] = v;
  }
  __syncthreads();
  if (warp == 0) {
    DUALCAST_UNROLL
    for (int k = 0; k < K; ++k) {
      if (!body.reduce[k]) continue;
      T v = lane < static_cast<int>(blockDim.x >> 5) ? warp_sums[k][lane] : T(0);
      for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
      if (lane == 0) body.partial[(k * body.ops.C + c) * body.S + s] = v;
    }
  }
}
#endif

#if defined(__CUDACC__)
/// The same tasks in columns (channel_columns): block (x, s) runs tasks (c, s) for the 32 channels
/// c = 32 x + threadIdx.x, its kColumnRows rows of threads each walking every kColumnRows-th position
/// of the slice; each channel's kColumnRows sums are then added in row order (no atomics: the same
/// result every run).
template <class Body, int K, class T>
__global__ void __launch_bounds__(32 * kColumnRows) channel_backward_columns_kernel(Body body) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * 32 + threadIdx.x, s = blockIdx.y;
  const bool live = c < body.ops.C;
  T acc[K];
  DUALCAST_UNROLL
  for (int k = 0; k < K; ++k) acc[k] = T(0);
  if (live) body.walk(c, body.slice_begin(s), body.slice_begin(s + 1), threadIdx.y, kColumnRows, acc);
  __shared__ T rows[K][kColumnRows][32];
  DUALCAST_UNROLL
  for (int k = 0; k < K; ++k)
    if (body.reduce[k]) rows[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y != 0 || !live) return;
  DUALCAST_UNROLL
  for (int k = 0; k < K; ++k) {
    if (!body.reduce[k]) continue;
    T v = T(0);
    for (int r = 0; r < kColumnRows; ++r) v += rows[k][r][threadIdx.x];
    body.partial[(k * body.ops.C + c) * body.S + s] = v;
  }
}
#endif

/// Runs the C * S tasks of a backward body on `device`.
template <class T, int K, class Body>
void launch_channel_backward(Device device, const Body& body) {
  const std::int64_t tasks = body.ops.C * body.S;
  if (tasks <= 0) return;
  if (device.is_cpu()) {
    cpu_parallel_range(tasks, 1, &cb_run_tasks<Body>, &body);
    return;
  }
#if defined(__CUDACC__)
  DeviceGuard guard(device);
  if (channel_columns(body.ops.C, body.ops.inner)) {
    const dim3 grid(static_cast<unsigned>((body.ops.C + 31) / 32), static_cast<unsigned>(body.S));
    channel_backward_columns_kernel<Body, K, T><<<grid, dim3(32, kColumnRows), 0, stream(device)>>>(body);
  } else {
    channel_backward_kernel<Body, K, T>
        <<<static_cast<unsigned>(tasks), kChannelBlock, 0, stream(device)>>>(body);
  }
  DUALCAST_CUDA_CHECK_LAUNCH();
#else
  DUALCAST_FAIL("channel_broadcast on ", device.str(),
                ": this translation unit was compiled by a host compiler; compile it with nvcc "
                "(a .cu file in a CUDA-enabled build) to run it on the GPU");
#endif
}

}  // namespace dualcast::detail
