// reduce.cuh (internal): the reduction engine behind sum_to, sum, mean, amax and the losses.
//
// A reduction of a contiguous tensor over a set of its dimensions is described by a ReducePlan:
// adjacent dimensions of the same kind (kept or reduced) are merged and size-1 dimensions dropped,
// so the input offset of (output o, reduced element j) is base(o) + roff(j), each a short
// mixed-radix decomposition (one division in the common cases). Output o enumerates the kept
// dimensions in row-major order, which is exactly the layout of the (keepdims) result.
//
// The engine is generic over three small functors, so every reduction shares the same loops:
//   Load : Acc operator()(int64 o, int64 off) const   -- the value of input offset `off` for output o
//   Op   : Acc identity() const; Acc operator()(Acc, Acc) const   -- an associative combine
//   Store: void operator()(int64 o, Acc v) const      -- writes the result of output o
// The host part (plan + CPU engine) is plain C++; the CUDA part is compiled only under nvcc.
//
// Strategies. CPU: parallel over outputs; rows (the contiguous dimension is reduced) loop each row
// with four independent accumulators; columns (the contiguous dimension is kept) sweep tiles of
// adjacent outputs so every load is a unit-stride read; with fewer outputs than threads the reduced
// range is split into per-thread partial results combined in a fixed order (deterministic).
// GPU: rows use a warp (short rows) or a block (long rows) per output; columns use a thread per
// output with coalesced loads across the warp (or a warp/block per output with strided lanes when
// the outputs are very few); when there are too few outputs to fill the device the reduced range is
// split over more groups (blockIdx.y) into a partial buffer [S, n_out] that is reduced again by the
// same engine. Plain full sums go through CUB (cub::DeviceReduce::TransformReduce in double).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "dualcast/config.hpp"
#include "dualcast/device.hpp"
#include "dualcast/error.hpp"
#include "dualcast/parallel.hpp"
#include "dualcast/shape.hpp"
#include "dualcast/tensor.hpp"

#if defined(__CUDACC__)
#include <cub/block/block_reduce.cuh>
#include <cub/device/device_reduce.cuh>
#include <cuda_runtime.h>

#include "dualcast/kernels/parallel_for.cuh"
#endif

namespace dualcast::detail {

// ---- the plan ---------------------------------------------------------------------------------

/// Division-based decomposition with a 32-bit fast path (several times cheaper on the GPU).
DUALCAST_HD DUALCAST_INLINE void divmod_fast(std::int64_t a, std::int64_t b, std::int64_t& q,
                                             std::int64_t& r) {
  if (a < 0x7fffffff && b < 0x7fffffff) {
    const auto aa = static_cast<std::uint32_t>(a), bb = static_cast<std::uint32_t>(b);
    const std::uint32_t qq = aa / bb;
    q = qq;
    r = aa - qq * bb;
  } else {
    q = a / b;
    r = a - q * b;
  }
}

struct ReducePlan {
  std::int64_t n_out = 1;  ///< number of outputs (product of kept dimensions)
  std::int64_t n_red = 1;  ///< reduced elements per output (product of reduced dimensions)
  int kept_rank = 0;
  std::int64_t kept_dims[kMaxRank] = {};
  std::int64_t kept_strides[kMaxRank] = {};
  int red_rank = 0;
  std::int64_t red_dims[kMaxRank] = {};
  std::int64_t red_strides[kMaxRank] = {};
  /// The innermost (stride-1) non-trivial dimension is reduced: outputs own contiguous rows.
  bool inner_reduced = false;
  /// Length of the innermost kept dimension (columns: outputs o..o+k in one run have adjacent bases).
  std::int64_t inner_kept_run = 1;

  /// Offset of index i (0 <= i < product of dims[0..rank)) decomposed in row-major order over
  /// dims[0..rank) with element strides `strides`: no division for rank 0 or 1.
  [[nodiscard]] static DUALCAST_HD DUALCAST_INLINE std::int64_t radix_off(
      std::int64_t i, const std::int64_t* dims, const std::int64_t* strides, int rank) {
    if (rank == 1) return i * strides[0];
    std::int64_t off = 0;
    for (int d = rank - 1; d >= 0; --d) {
      std::int64_t q, r;
      divmod_fast(i, dims[d], q, r);
      off += r * strides[d];
      i = q;
    }
    return off;
  }
  /// Input offset of the first element of output o.
  [[nodiscard]] DUALCAST_HD DUALCAST_INLINE std::int64_t base(std::int64_t o) const {
    return radix_off(o, kept_dims, kept_strides, kept_rank);
  }
  /// Offset of the outer reduced index q (all reduced dimensions but the innermost).
  [[nodiscard]] DUALCAST_HD DUALCAST_INLINE std::int64_t roff_outer(std::int64_t q) const {
    return radix_off(q, red_dims, red_strides, red_rank - 1);
  }
  /// Offset of reduced element j relative to base(o).
  [[nodiscard]] DUALCAST_HD DUALCAST_INLINE std::int64_t roff(std::int64_t j) const {
    return radix_off(j, red_dims, red_strides, red_rank);
  }
};

/// Walks reduced elements j, j + step, ... without a division per element: the offset is split into
/// the innermost reduced dimension (position t, stride ls) and the rest (recomputed only when t
/// wraps). Used where there are two or more reduced dimensions.
struct RedCursor {
  std::int64_t t = 0, q = 0, outer = 0;
  DUALCAST_HD DUALCAST_INLINE RedCursor(const ReducePlan& p, std::int64_t j) {
    divmod_fast(j, p.red_dims[p.red_rank - 1], q, t);
    outer = p.roff_outer(q);
  }
  [[nodiscard]] DUALCAST_HD DUALCAST_INLINE std::int64_t off(const ReducePlan& p) const {
    return outer + t * p.red_strides[p.red_rank - 1];
  }
  DUALCAST_HD DUALCAST_INLINE void advance(const ReducePlan& p, std::int64_t step) {
    t += step;
    const std::int64_t L = p.red_dims[p.red_rank - 1];
    if (t >= L) {
      if (step <= L) {  // t < L before the step: exactly one wrap, no division
        t -= L;
        ++q;
      } else {
        std::int64_t dq;
        divmod_fast(t, L, dq, t);
        q += dq;
      }
      outer = p.red_rank == 2 ? q * p.red_strides[0] : p.roff_outer(q);
    }
  }
};

/// Plan for reducing a tensor of shape `in` with element strides `strides` (row-major order of
/// dimensions; contiguous or a strided view) over the dimensions with reduced[d] true.
inline ReducePlan make_reduce_plan(const Shape& in, const Shape& strides, const bool* reduced) {
  ReducePlan p;
  int last_kind = -1;  // 0 kept, 1 reduced: kind of the last non-trivial dimension pushed
  for (int d = 0; d < in.rank(); ++d) {
    if (in[d] == 1) continue;
    const int kind = reduced[d] ? 1 : 0;
    std::int64_t* dims = kind ? p.red_dims : p.kept_dims;
    std::int64_t* st = kind ? p.red_strides : p.kept_strides;
    int& rank = kind ? p.red_rank : p.kept_rank;
    if (kind == last_kind && st[rank - 1] == strides[d] * in[d]) {  // merge with the previous dim
      dims[rank - 1] *= in[d];
      st[rank - 1] = strides[d];
    } else {
      dims[rank] = in[d];
      st[rank] = strides[d];
      ++rank;
    }
    last_kind = kind;
  }
  p.inner_reduced = last_kind == 1;
  for (int d = 0; d < p.kept_rank; ++d) p.n_out *= p.kept_dims[d];
  for (int d = 0; d < p.red_rank; ++d) p.n_red *= p.red_dims[d];
  // Columns sweep runs of adjacent outputs: only where the innermost kept dimension is unit-stride.
  p.inner_kept_run =
      (p.kept_rank > 0 && p.kept_strides[p.kept_rank - 1] == 1) ? p.kept_dims[p.kept_rank - 1] : 1;
  return p;
}

/// Plan for a [S, n] buffer reduced over its first dimension (the partial results of a split).
inline ReducePlan make_partial_plan(std::int64_t n_out, std::int64_t splits) {
  ReducePlan p;
  p.n_out = n_out;
  p.n_red = splits;
  p.kept_rank = 1;
  p.kept_dims[0] = n_out;
  p.kept_strides[0] = 1;
  p.red_rank = 1;
  p.red_dims[0] = splits;
  p.red_strides[0] = n_out;
  p.inner_reduced = false;
  p.inner_kept_run = n_out;
  return p;
}

// ---- functors ---------------------------------------------------------------------------------

template <class Acc>
struct SumOp {
  [[nodiscard]] DUALCAST_HD DUALCAST_INLINE Acc identity() const { return Acc(0); }
  [[nodiscard]] DUALCAST_HD DUALCAST_INLINE Acc operator()(Acc a, Acc b) const { return a + b; }
};

/// Maximum that propagates NaN (like NumPy and PyTorch).
template <class Acc>
struct MaxOp {
  [[nodiscard]] DUALCAST_HD DUALCAST_INLINE Acc identity() const {
    return -std::numeric_limits<Acc>::infinity();
  }
  [[nodiscard]] DUALCAST_HD DUALCAST_INLINE Acc operator()(Acc a, Acc b) const {
    return (a > b || a != a) ? a : b;
  }
};

/// Reads input element `off` converted to Acc.
template <class T, class Acc>
struct PlainLoad {
  const T* x;
  [[nodiscard]] DUALCAST_HD DUALCAST_INLINE Acc operator()(std::int64_t, std::int64_t off) const {
    return static_cast<Acc>(x[off]);
  }
};

/// Writes T(v * scale) to out[o] (scale 1 for sums and maxima, 1/n for means).
template <class T, class Acc>
struct ScaledStore {
  T* out;
  Acc scale;
  DUALCAST_HD DUALCAST_INLINE void operator()(std::int64_t o, Acc v) const {
    out[o] = static_cast<T>(v * scale);
  }
};

/// Writes T(v) to out[o].
template <class T, class Acc>
struct CastStore {
  T* out;
  DUALCAST_HD DUALCAST_INLINE void operator()(std::int64_t o, Acc v) const {
    out[o] = static_cast<T>(v);
  }
};

// ---- CPU engine -------------------------------------------------------------------------------

/// cpu_parallel_range over a host lambda (usable in .cu files: no kernel is instantiated).
template <class F>
void cpu_for(std::int64_t n, std::int64_t grain, const F& f) {
  if (n <= 0) return;
  cpu_parallel_range(
      n, grain < 1 ? 1 : grain,
      [](const void* ctx, std::int64_t b, std::int64_t e) { (*static_cast<const F*>(ctx))(b, e); },
      &f);
}

/// Reduces reduced elements [j0, j1) of output o, one run of the innermost reduced dimension at a
/// time (no division per element), with four independent accumulators.
template <class Acc, class Load, class Op>
Acc cpu_reduce_range(const ReducePlan& p, const Load& load, const Op& op, std::int64_t o,
                     std::int64_t j0, std::int64_t j1) {
  const std::int64_t b = p.base(o);
  Acc a0 = op.identity(), a1 = op.identity(), a2 = op.identity(), a3 = op.identity();
  const std::int64_t L = p.red_rank == 0 ? 1 : p.red_dims[p.red_rank - 1];
  const std::int64_t rs = p.red_rank == 0 ? 0 : p.red_strides[p.red_rank - 1];
  std::int64_t j = j0;
  while (j < j1) {
    std::int64_t q, t;
    divmod_fast(j, L, q, t);
    const std::int64_t start = b + (p.red_rank >= 2 ? p.roff_outer(q) : 0) + t * rs;
    const std::int64_t n = std::min(L - t, j1 - j);
    std::int64_t k = 0;
    for (; k + 4 <= n; k += 4) {
      const std::int64_t off = start + k * rs;
      a0 = op(a0, load(o, off));
      a1 = op(a1, load(o, off + rs));
      a2 = op(a2, load(o, off + 2 * rs));
      a3 = op(a3, load(o, off + 3 * rs));
    }
    for (; k < n; ++k) a0 = op(a0, load(o, start + k * rs));
    j += n;
  }
  return op(op(a0, a1), op(a2, a3));
}

/// Columns: outputs [o0, o0 + n) lie in one innermost kept run (adjacent bases); accumulates the
/// reduced elements [j0, j1) of each into acc[0..n).
template <class Acc, class Load, class Op>
void cpu_reduce_tile(const ReducePlan& p, const Load& load, const Op& op, std::int64_t o0,
                     std::int64_t n, std::int64_t j0, std::int64_t j1, Acc* acc) {
  const std::int64_t b = p.base(o0);
  for (std::int64_t t = 0; t < n; ++t) acc[t] = op.identity();
  for (std::int64_t j = j0; j < j1; ++j) {
    const std::int64_t off = b + p.roff(j);
    for (std::int64_t t = 0; t < n; ++t) acc[t] = op(acc[t], load(o0 + t, off + t));
  }
}

inline constexpr std::int64_t kCpuTile = 64;

template <class Acc, class Load, class Op, class Store>
void cpu_reduce(const ReducePlan& p, const Load& load, const Op& op, const Store& store) {
  if (p.n_out <= 0) return;
  if (p.n_red <= 0) {
    for (std::int64_t o = 0; o < p.n_out; ++o) store(o, op.identity());
    return;
  }
  const std::int64_t threads = cpu_thread_count();
  const std::int64_t total = p.n_out * p.n_red;
  // Work items: rows -> one output each; columns -> a tile of up to kCpuTile adjacent outputs.
  const bool rows = p.inner_reduced || p.inner_kept_run == 1;
  const std::int64_t tiles_per_run =
      rows ? 1 : (p.inner_kept_run + kCpuTile - 1) / kCpuTile;
  const std::int64_t runs = rows ? p.n_out : p.n_out / p.inner_kept_run;
  const std::int64_t items = runs * tiles_per_run;
  auto tile_of = [&](std::int64_t item, std::int64_t& o0, std::int64_t& n) {
    if (rows) {
      o0 = item;
      n = 1;
      return;
    }
    const std::int64_t run = item / tiles_per_run, k = item % tiles_per_run;
    o0 = run * p.inner_kept_run + k * kCpuTile;
    n = std::min<std::int64_t>(kCpuTile, p.inner_kept_run - k * kCpuTile);
  };
  // Split the reduced range when there are fewer work items than threads and enough work.
  std::int64_t splits = 1;
  if (threads > 1 && items < 4 * threads && total >= 2 * kCpuGrain) {
    splits = (4 * threads + items - 1) / items;
    splits = std::min<std::int64_t>(splits, std::max<std::int64_t>(1, total / kCpuGrain));
    splits = std::min<std::int64_t>(splits, p.n_red);
  }
  const std::int64_t per_item = std::max<std::int64_t>(1, total / std::max<std::int64_t>(1, items));
  const std::int64_t grain = std::max<std::int64_t>(1, kCpuGrain / per_item);
  if (splits == 1) {
    cpu_for(items, grain, [&](std::int64_t b, std::int64_t e) {
      Acc acc[kCpuTile];
      for (std::int64_t item = b; item < e; ++item) {
        std::int64_t o0, n;
        tile_of(item, o0, n);
        if (rows) {
          store(o0, cpu_reduce_range<Acc>(p, load, op, o0, 0, p.n_red));
        } else {
          cpu_reduce_tile<Acc>(p, load, op, o0, n, 0, p.n_red, acc);
          for (std::int64_t t = 0; t < n; ++t) store(o0 + t, acc[t]);
        }
      }
    });
    return;
  }
  // partial[s * n_out + o]: split s of output o; combined below in a fixed order.
  std::vector<Acc> partial(static_cast<std::size_t>(splits * p.n_out));
  cpu_for(items * splits, 1, [&](std::int64_t b, std::int64_t e) {
    Acc acc[kCpuTile];
    for (std::int64_t w = b; w < e; ++w) {
      const std::int64_t item = w / splits, s = w % splits;
      const std::int64_t j0 = p.n_red * s / splits, j1 = p.n_red * (s + 1) / splits;
      std::int64_t o0, n;
      tile_of(item, o0, n);
      Acc* dst = partial.data() + s * p.n_out;
      if (rows) {
        dst[o0] = cpu_reduce_range<Acc>(p, load, op, o0, j0, j1);
      } else {
        cpu_reduce_tile<Acc>(p, load, op, o0, n, j0, j1, acc);
        for (std::int64_t t = 0; t < n; ++t) dst[o0 + t] = acc[t];
      }
    }
  });
  for (std::int64_t o = 0; o < p.n_out; ++o) {
    Acc a = op.identity();
    for (std::int64_t s = 0; s < splits; ++s) a = op(a, partial[static_cast<std::size_t>(s * p.n_out + o)]);
    store(o, a);
  }
}

// ---- CUDA engine ------------------------------------------------------------------------------
#if defined(__CUDACC__)

inline constexpr int kReduceBlock = 256;

/// Reads partial results of a split.
template <class Acc>
struct PartialLoad {
  const Acc* p;
  [[nodiscard]] DUALCAST_HD DUALCAST_INLINE Acc operator()(std::int64_t, std::int64_t off) const {
    return p[off];
  }
};

template <class Acc, class Op>
__device__ DUALCAST_INLINE Acc warp_reduce(Acc v, const Op& op) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, d));
  return v;
}

/// One thread's share of output o in the kernels below: the reduced elements j, j + Step, ... below
/// j1, in four independent accumulators, combined at the end. Where the reduced elements form one
/// strided run (red_rank <= 1) Loads loads are in flight per thread (Loads = 8: eight at a time, then
/// four; Loads = 4: four at a time), the rest go to a0. With two or more reduced dimensions a
/// RedCursor computes Loads / 2 offsets first, then issues their loads; the rest go to the next
/// accumulator the unrolled loop leaves unused (a0 when it uses all four).
template <int Step, int Loads, class Acc, class Load, class Op>
__device__ DUALCAST_INLINE Acc reduce_thread(const ReducePlan& p, const Load& load, const Op& op,
                                             std::int64_t o, std::int64_t j, std::int64_t j1) {
  static_assert(Loads == 8 || Loads == 4, "reduce_thread: Loads is 8 or 4");
  const std::int64_t b = p.base(o);
  Acc a[4] = {op.identity(), op.identity(), op.identity(), op.identity()};
  if (p.red_rank <= 1) {
    const std::int64_t rs = p.red_rank == 1 ? p.red_strides[0] : 0;
    if constexpr (Loads == 8) {
      for (; j + 7 * Step < j1; j += 8 * Step) {
        Acc v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) v[u] = load(o, b + (j + u * Step) * rs);
#pragma unroll
        for (int u = 0; u < 4; ++u) a[u] = op(op(a[u], v[u]), v[u + 4]);
      }
    }
    for (; j + 3 * Step < j1; j += 4 * Step) {
#pragma unroll
      for (int u = 0; u < 4; ++u) a[u] = op(a[u], load(o, b + (j + u * Step) * rs));
    }
    for (; j < j1; j += Step) a[0] = op(a[0], load(o, b + j * rs));
  } else if (j < j1) {
    constexpr int kOffs = Loads / 2, kRest = kOffs % 4;
    RedCursor cur(p, j);
    for (; j + (kOffs - 1) * Step < j1; j += kOffs * Step) {
      std::int64_t f[kOffs];
#pragma unroll
      for (int u = 0; u < kOffs; ++u) {
        f[u] = cur.off(p);
        cur.advance(p, Step);
      }
#pragma unroll
      for (int u = 0; u < kOffs; ++u) a[u] = op(a[u], load(o, b + f[u]));
    }
    for (; j < j1; j += Step) {
      a[kRest] = op(a[kRest], load(o, b + cur.off(p)));
      cur.advance(p, Step);
    }
  }
  return op(op(a[0], a[1]), op(a[2], a[3]));
}

/// A thread's place in a block cut into groups of N threads: (index in its group, group).
template <int N>
__device__ DUALCAST_INLINE void place_in_group(int& in_group, int& group) {
  in_group = static_cast<int>(threadIdx.x) % N;
  group = static_cast<int>(threadIdx.x) / N;
}

/// What a block of the kernels below sweeps: split s = blockIdx.y, whose reduced elements are
/// [j0, j1), and the outputs first, first + stride, ... (PerBlock of them per block, blocks strided).
struct ReduceSweep {
  std::int64_t s, j0, j1, first, stride;
};

template <int PerBlock>
__device__ DUALCAST_INLINE ReduceSweep block_sweep(const ReducePlan& p, std::int64_t splits,
                                                   int offset) {
  const std::int64_t s = blockIdx.y;
  return {s, p.n_red * s / splits, p.n_red * (s + 1) / splits,
          static_cast<std::int64_t>(blockIdx.x) * PerBlock + offset,
          static_cast<std::int64_t>(gridDim.x) * PerBlock};
}

/// The result of output o in split w.s: to the partial buffer of a split reduction, else stored.
template <class Acc, class Store>
__device__ DUALCAST_INLINE void put_result(const ReducePlan& p, const ReduceSweep& w,
                                           const Store& store, Acc* partial, std::int64_t o,
                                           Acc a) {
  if (partial) partial[w.s * p.n_out + o] = a;
  else store(o, a);
}

/// Rows: a group of G threads (G = 32: one warp per row; G = kReduceBlock: one block per row) per
/// (output, split); lanes stride over the reduced elements. blockIdx.y is the split; groups stride
/// over outputs.
template <int G, class Acc, class Load, class Op, class Store>
__global__ void __launch_bounds__(kReduceBlock)
    reduce_rows_kernel(ReducePlan p, Load load, Op op, Store store, Acc* partial,
                       std::int64_t splits) {
  int lane, group;
  place_in_group<G>(lane, group);
  const ReduceSweep w = block_sweep<kReduceBlock / G>(p, splits, group);
  __shared__ Acc warp_acc[kReduceBlock / 32];
  // For G = block the loop bound is uniform over the block, so the barriers below are too.
  for (std::int64_t o = w.first; o < p.n_out; o += w.stride) {
    Acc a = warp_reduce(reduce_thread<G, 8, Acc>(p, load, op, o, w.j0 + lane, w.j1), op);
    if constexpr (G > 32) {
      const int warp = static_cast<int>(threadIdx.x) / 32;
      if (threadIdx.x % 32 == 0) warp_acc[warp] = a;
      __syncthreads();
      if (warp == 0) {
        a = static_cast<int>(threadIdx.x) < G / 32 ? warp_acc[threadIdx.x] : op.identity();
        a = warp_reduce(a, op);
      }
      __syncthreads();
    }
    if (lane == 0) put_result(p, w, store, partial, o, a);
  }
}

/// Columns: a block covers kReduceBlock / R adjacent outputs (one per thread column, so each warp
/// reads adjacent addresses) and R threads per output stride over the reduced elements; the R
/// partial results are combined through shared memory. blockIdx.y is the split.
template <int R, class Acc, class Load, class Op, class Store>
__global__ void __launch_bounds__(kReduceBlock)
    reduce_cols_kernel(ReducePlan p, Load load, Op op, Store store, Acc* partial,
                       std::int64_t splits) {
  constexpr int kCols = kReduceBlock / R;
  int tx, ty;
  place_in_group<kCols>(tx, ty);
  const ReduceSweep w = block_sweep<kCols>(p, splits, 0);
  __shared__ Acc sh[R > 1 ? R : 1][kCols + 1];
  // The loop bound is uniform over the block (o0), so the barriers are too.
  for (std::int64_t o0 = w.first; o0 < p.n_out; o0 += w.stride) {
    const std::int64_t o = o0 + tx;
    // (a thread past the last output only takes part in the barriers; its value is never used)
    Acc a = o < p.n_out ? reduce_thread<R, 4, Acc>(p, load, op, o, w.j0 + ty, w.j1) : op.identity();
    if constexpr (R > 1) {
      sh[ty][tx] = a;
      __syncthreads();
      if (ty == 0) {
#pragma unroll
        for (int k = 1; k < R; ++k) a = op(a, sh[k][tx]);
      }
      __syncthreads();
    }
    if (ty == 0 && o < p.n_out) put_result(p, w, store, partial, o, a);
  }
}

/// Threads in flight that saturate the device's memory system (a full multiprocessor each).
inline std::int64_t reduce_target_threads(Device device) {
  return static_cast<std::int64_t>(multiprocessor_count(device)) * 2048;
}

template <class Acc, class Load, class Op, class Store>
void gpu_reduce(Device device, const ReducePlan& p, const Load& load, const Op& op,
                const Store& store) {
  if (p.n_out <= 0) return;
  DeviceGuard guard(device);
  const std::int64_t target = reduce_target_threads(device);
  // Rows (a warp or a block per output, lanes striding over the reduced elements) where the reduced
  // elements are contiguous; also for columns with fewer outputs than a warp (a thread column per
  // output would idle most of each block) or few outputs with a short reduction (the second pass
  // over split partials, which sits in L2).
  const bool rows = p.n_red > 1 &&
                    (p.inner_reduced || p.n_out < 32 || (p.n_red <= 4096 && p.n_out <= 64));
  // Columns: 8 threads per output when the reduction is long enough to share, else 1.
  const int col_r = p.n_red >= 64 ? 8 : 1;
  // A block per output for long rows, and for the few outputs of a short final pass (each thread
  // then loads a handful of values at once instead of a warp looping serially).
  const int per_out =
      rows ? ((p.n_red >= 2048 || (p.n_out < 32 && p.n_red >= 512)) ? kReduceBlock : 32) : col_r;
  // Split the reduced range when the outputs alone cannot fill the device and the problem is big
  // enough to pay for a second pass; each thread of a split still gets at least ~16 elements.
  std::int64_t splits = 1;
  const std::int64_t busy = p.n_out * per_out;
  if (busy < target && p.n_red >= 32 * per_out && p.n_out * p.n_red >= (1 << 16)) {
    splits = (target + busy - 1) / busy;
    splits = std::min<std::int64_t>(splits, std::max<std::int64_t>(1, p.n_red / (16 * per_out)));
    splits = std::min<std::int64_t>(splits, 65535);
  }
  Tensor partial_buf;
  Acc* partial = nullptr;
  if (splits > 1) {
    partial_buf = Tensor::empty(Shape{static_cast<std::int64_t>(splits * p.n_out * sizeof(Acc))},
                                DType::uint8, device);
    partial = static_cast<Acc*>(partial_buf.raw_data());
  }
  const std::int64_t cap = std::max<std::int64_t>(
      1, static_cast<std::int64_t>(multiprocessor_count(device)) * 16 / splits);
  const auto grid = [&](std::int64_t per_block) {
    const std::int64_t bx = std::min<std::int64_t>((p.n_out + per_block - 1) / per_block, cap);
    return dim3(static_cast<unsigned>(bx), static_cast<unsigned>(splits));
  };
  if (rows) {
    if (per_out == kReduceBlock)
      reduce_rows_kernel<kReduceBlock, Acc><<<grid(1), kReduceBlock, 0, stream(device)>>>(p, load, op, store, partial,
                                                                      splits);
    else
      reduce_rows_kernel<32, Acc><<<grid(kReduceBlock / 32), kReduceBlock, 0, stream(device)>>>(p, load, op, store,
                                                                            partial, splits);
  } else if (col_r == 8) {
    reduce_cols_kernel<8, Acc><<<grid(kReduceBlock / 8), kReduceBlock, 0, stream(device)>>>(p, load, op, store,
                                                                        partial, splits);
  } else {
    reduce_cols_kernel<1, Acc><<<grid(kReduceBlock), kReduceBlock, 0, stream(device)>>>(p, load, op, store, partial,
                                                                    splits);
  }
  DUALCAST_CUDA_CHECK_LAUNCH();
  if (splits > 1)
    gpu_reduce<Acc>(device, make_partial_plan(p.n_out, splits), PartialLoad<Acc>{partial}, op, store);
}

/// Full sum of n contiguous elements into a device double via CUB (accumulating in double).
template <class T>
struct ToDouble {
  DUALCAST_HD DUALCAST_INLINE double operator()(T v) const { return static_cast<double>(v); }
};
struct PlusDouble {
  DUALCAST_HD DUALCAST_INLINE double operator()(double a, double b) const { return a + b; }
};

template <class T>
void gpu_full_sum(Device device, const T* x, std::int64_t n, double* out) {
  DeviceGuard guard(device);
  std::size_t bytes = 0;
  DUALCAST_CUDA_CHECK(cub::DeviceReduce::TransformReduce(nullptr, bytes, x, out, n, PlusDouble{},
                                                         ToDouble<T>{}, 0.0, stream(device)));
  Tensor tmp = Tensor::empty(Shape{static_cast<std::int64_t>(bytes > 0 ? bytes : 1)}, DType::uint8,
                             device);
  DUALCAST_CUDA_CHECK(cub::DeviceReduce::TransformReduce(tmp.raw_data(), bytes, x, out, n,
                                                         PlusDouble{}, ToDouble<T>{}, 0.0,
                                                         stream(device)));
}

#endif  // __CUDACC__

/// Runs the reduction on `device` (CPU engine, or the CUDA engine when compiled by nvcc).
template <class Acc, class Load, class Op, class Store>
void run_reduce(Device device, const ReducePlan& p, const Load& load, const Op& op,
                const Store& store) {
  if (device.is_cpu()) {
    cpu_reduce<Acc>(p, load, op, store);
    return;
  }
#if defined(__CUDACC__)
  gpu_reduce<Acc>(device, p, load, op, store);
#else
  DUALCAST_FAIL("reduce on ", device.str(), ": dualcast was built without its CUDA backend");
#endif
}

}  // namespace dualcast::detail
