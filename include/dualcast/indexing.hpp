// indexing.hpp: maps an output element of a broadcast to the element of each argument it reads.
// Built once on the host (dimensions collapsed where every argument is contiguous across them).
// Two evaluators: BroadcastIndexer, per element with 64-bit arithmetic (any shape, any size), and
// ChunkIndexer, once per chunk of V elements with 32-bit multiply-shift division (the fast path:
// fewer than 2^31 elements and chunks that never straddle an innermost row).
#pragma once

#include <cstdint>
#include <vector>

#include "dualcast/config.hpp"
#include "dualcast/shape.hpp"

namespace dualcast {

/// How an argument is addressed: the output's own index, always element 0, or through strides.
enum class Access : std::uint8_t { contiguous, scalar, strided };

/// Unsigned 32-bit division by a run-time constant as a multiply-high and a shift (Granlund and
/// Montgomery): q = umulhi(n, m) >> s with m = ceil(2^p / d), p = 31 + ceil(log2 d). Exact for every
/// n < 2^31, which the fast path guarantees.
struct FastDivmod {
  std::uint32_t divisor = 1;
  std::uint32_t multiplier = 0;
  std::uint32_t shift = 0;

  FastDivmod() = default;
  explicit FastDivmod(std::uint32_t d) : divisor(d) {
    if (d > 1) {
      std::uint32_t p = 31;
      while ((std::uint64_t{1} << (p - 31)) < d) ++p;
      multiplier = static_cast<std::uint32_t>(((std::uint64_t{1} << p) + d - 1) / d);
      shift = p - 32;
    }
  }
  DUALCAST_HD DUALCAST_INLINE std::uint32_t div(std::uint32_t n) const {
#if defined(__CUDA_ARCH__)
    return divisor == 1 ? n : __umulhi(n, multiplier) >> shift;
#else
    return divisor == 1 ? n
                        : static_cast<std::uint32_t>((std::uint64_t{n} * multiplier) >> 32) >> shift;
#endif
  }
};

/// How the fast path reads one argument over a chunk of V consecutive output elements.
enum class ChunkRead : std::uint8_t {
  packet,          ///< contiguous with the output: V values at the chunk's own index
  splat,           ///< one value for the whole call (a number, or a one-element tensor)
  strided_packet,  ///< broadcast, but contiguous along the innermost dimension: V values at its offset
  strided_splat,   ///< broadcast along the innermost dimension: one value at its offset
};

/// The fast path's indexer: offsets once per chunk, in 32-bit arithmetic. Valid only when the
/// output has fewer than 2^31 elements and, where any argument is strided, the innermost collapsed
/// dimension is a multiple of the chunk width (so a chunk lies in one innermost row).
template <int NARGS>
struct ChunkIndexer {
  static constexpr int NAX = NARGS > 0 ? NARGS : 1;
  int rank = 0;  ///< collapsed rank
  bool any_strided = false;
  FastDivmod dims[kMaxRank];                 ///< collapsed output dimensions
  std::uint32_t strides[NAX][kMaxRank] = {};  ///< element strides, 0 = broadcast
  std::uint32_t own[NAX] = {};               ///< 1 for an argument read at the output's own index
  ChunkRead read[NAX] = {};

  /// Offset of every argument's first element for the chunk starting at output element `base`.
  DUALCAST_HD DUALCAST_INLINE void offsets(std::uint32_t base, std::uint32_t (&off)[NAX]) const {
DUALCAST_UNROLL
    for (int a = 0; a < NARGS; ++a) off[a] = base * own[a];
    if (!any_strided) return;
    if (rank == 2) {  // the common case ([B,1] or [1,H] against [B,H]): one division, no loop
      const std::uint32_t q = dims[1].div(base);
      const std::uint32_t c = base - q * dims[1].divisor;
DUALCAST_UNROLL
      for (int a = 0; a < NARGS; ++a) off[a] += q * strides[a][0] + c * strides[a][1];
      return;
    }
    std::uint32_t rem = base;
    for (int d = rank - 1; d > 0; --d) {
      const std::uint32_t q = dims[d].div(rem);
      const std::uint32_t c = rem - q * dims[d].divisor;
DUALCAST_UNROLL
      for (int a = 0; a < NARGS; ++a) off[a] += c * strides[a][d];
      rem = q;
    }
DUALCAST_UNROLL
    for (int a = 0; a < NARGS; ++a) off[a] += rem * strides[a][0];
  }
};

/// Offsets of NARGS arguments for output element i. Plain data, copied into kernels by value.
template <int NARGS>
struct BroadcastIndexer {
  int rank = 0;                              ///< collapsed rank
  std::int64_t dims[kMaxRank] = {};          ///< collapsed output dimensions
  std::int64_t strides[NARGS > 0 ? NARGS : 1][kMaxRank] = {};  ///< element strides, 0 = broadcast
  Access access[NARGS > 0 ? NARGS : 1] = {};
  bool any_strided = false;
  std::int64_t inner_dim = 1;                               ///< dims[rank - 1] (1 at rank 0)
  std::int64_t inner_stride[NARGS > 0 ? NARGS : 1] = {};   ///< strides[a][rank - 1]

  /// Fills off[a] for every argument a of output element i.
  DUALCAST_HD DUALCAST_INLINE void offsets(std::int64_t i, std::int64_t (&off)[NARGS > 0 ? NARGS : 1]) const {
DUALCAST_UNROLL
    for (int a = 0; a < NARGS; ++a) off[a] = access[a] == Access::contiguous ? i : 0;
    if (!any_strided) return;
    if (rank == 2) {  // the common case ([B,1] or [1,H] against [B,H]): one division, no loop
      std::int64_t q, r;
      if (i < 0x7fffffff && dims[1] < 0x7fffffff) {
        const auto ii = static_cast<std::uint32_t>(i), dd = static_cast<std::uint32_t>(dims[1]);
        const std::uint32_t qq = ii / dd;
        q = qq;
        r = ii - qq * dd;
      } else {
        q = i / dims[1];
        r = i - q * dims[1];
      }
      DUALCAST_UNROLL
      for (int a = 0; a < NARGS; ++a)
        if (access[a] == Access::strided) off[a] += q * strides[a][0] + r * strides[a][1];
      return;
    }
    std::int64_t rem = i;
    for (int d = rank - 1; d >= 0; --d) {
      std::int64_t q, r;
      if (rem < 0x7fffffff && dims[d] < 0x7fffffff) {  // 32-bit division is several times cheaper
        const auto rr = static_cast<std::uint32_t>(rem), dd = static_cast<std::uint32_t>(dims[d]);
        q = rr / dd;
        r = rr - static_cast<std::uint32_t>(q) * dd;
      } else {
        q = rem / dims[d];
        r = rem - q * dims[d];
      }
      rem = q;
DUALCAST_UNROLL
      for (int a = 0; a < NARGS; ++a)
        if (access[a] == Access::strided) off[a] += r * strides[a][d];
    }
  }
};

/// Builds the indexer for arguments of shapes `args` read as broadcast to `out` (row-major,
/// contiguous arguments). Adjacent dimensions are merged when every argument spans them contiguously
/// or broadcasts over both, so [B,1] against [B,H] needs one division per element.
template <int NARGS>
BroadcastIndexer<NARGS> make_indexer(const Shape& out, const std::vector<Shape>& args) {
  BroadcastIndexer<NARGS> ix;
  const int r = out.rank();
  // Aligned per-argument strides (0 where the argument has size 1 or lacks the dimension).
  std::int64_t st[NARGS > 0 ? NARGS : 1][kMaxRank] = {};
  for (int a = 0; a < NARGS; ++a) {
    const Shape& s = args[static_cast<std::size_t>(a)];
    const int offset = r - s.rank();
    std::int64_t stride = 1;
    for (int d = s.rank() - 1; d >= 0; --d) {
      st[a][offset + d] = s[d] == 1 ? 0 : stride;
      stride *= s[d];
    }
    if (s.numel() == out.numel()) ix.access[a] = Access::contiguous;
    else if (s.numel() == 1) ix.access[a] = Access::scalar;
    else {
      ix.access[a] = Access::strided;
      ix.any_strided = true;
    }
  }
  // Collapse: drop size-1 output dims, merge d into the previous kept dim when every argument's
  // strides chain (stride[prev] == stride[d] * dims[d]).
  int kept = 0;
  for (int d = 0; d < r; ++d) {
    if (out[d] == 1) continue;
    bool merge = kept > 0;
    for (int a = 0; a < NARGS && merge; ++a)
      merge = st[a][d] * out[d] == ix.strides[a][kept - 1];
    if (merge) {
      ix.dims[kept - 1] *= out[d];
      for (int a = 0; a < NARGS; ++a) ix.strides[a][kept - 1] = st[a][d];
    } else {
      ix.dims[kept] = out[d];
      for (int a = 0; a < NARGS; ++a) ix.strides[a][kept] = st[a][d];
      ++kept;
    }
  }
  ix.rank = kept;
  ix.inner_dim = kept > 0 ? ix.dims[kept - 1] : 1;
  for (int a = 0; a < NARGS; ++a) ix.inner_stride[a] = kept > 0 ? ix.strides[a][kept - 1] : 0;
  return ix;
}

/// The fast path's indexer for a collapsed BroadcastIndexer, or false when the fast path does not
/// apply: n >= 2^31 elements, or a strided argument with an innermost dimension that is not a
/// multiple of the chunk width V. `present[a]` is false for a plain-number argument.
template <int NARGS>
bool make_chunk_indexer(const BroadcastIndexer<NARGS>& ix, std::int64_t n, int V,
                        const bool* present, ChunkIndexer<NARGS>& out) {
  if (n >= (std::int64_t{1} << 31)) return false;
  if (ix.any_strided && ix.inner_dim % V != 0) return false;
  out.rank = ix.rank;
  out.any_strided = ix.any_strided;
  for (int d = 0; d < ix.rank; ++d) out.dims[d] = FastDivmod(static_cast<std::uint32_t>(ix.dims[d]));
  for (int a = 0; a < NARGS; ++a) {
    for (int d = 0; d < ix.rank; ++d)
      out.strides[a][d] = static_cast<std::uint32_t>(ix.access[a] == Access::strided ? ix.strides[a][d] : 0);
    out.own[a] = present[a] && ix.access[a] == Access::contiguous ? 1u : 0u;
    if (!present[a] || ix.access[a] == Access::scalar) out.read[a] = ChunkRead::splat;
    else if (ix.access[a] == Access::contiguous) out.read[a] = ChunkRead::packet;
    else if (ix.inner_stride[a] == 0) out.read[a] = ChunkRead::strided_splat;
    else if (ix.inner_stride[a] == 1) out.read[a] = ChunkRead::strided_packet;
    else return false;  // not produced by row-major broadcasting today; the general path copes
  }
  return true;
}

}  // namespace dualcast
