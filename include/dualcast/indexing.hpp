// indexing.hpp: maps an output element of a broadcast to the element of each argument it reads.
// Built once on the host (dimensions collapsed where every argument is contiguous across them),
// evaluated per element in kernels with one division per remaining dimension.
#pragma once

#include <cstdint>
#include <vector>

#include "dualcast/config.hpp"
#include "dualcast/shape.hpp"

namespace dualcast {

/// How an argument is addressed: the output's own index, always element 0, or through strides.
enum class Access : std::uint8_t { contiguous, scalar, strided };

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

}  // namespace dualcast
