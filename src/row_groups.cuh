// row_groups.cuh (private): the loops of the row-wise ops (attention.cu's masked softmax,
// layer_norm.cu, loss_lines.cuh's softmax and cross-entropy lines), whose row bodies run on the CPU
// with a thread per row (cpu_rows) and on the GPU with a group of G threads per row (a warp, or the
// whole block for long rows), groups striding over the rows (for_each_group_row).
#pragma once

#include <algorithm>
#include <cstdint>

#include "dualcast/device.hpp"
#include "dualcast/kernels/reduce.cuh"  // cpu_for
#include "dualcast/parallel.hpp"

namespace dualcast::detail {

/// row(r) for every row r < rows on the thread pool, in grains of about kCpuGrain elements (rows of
/// n elements).
template <class Row>
void cpu_rows(std::int64_t rows, std::int64_t n, const Row& row) {
  cpu_for(rows, std::max<std::int64_t>(1, kCpuGrain / std::max<std::int64_t>(1, n)),
          [&](std::int64_t b, std::int64_t e) {
            for (std::int64_t r = b; r < e; ++r) row(r);
          });
}

#if defined(__CUDACC__)

/// row(r, lane) for every row r < rows that this thread's group owns: groups of G threads, Block / G
/// per block, blocks strided over the rows. For G == Block the loop bound is uniform over the block,
/// so row may use barriers.
template <int G, int Block, class Row>
__device__ DUALCAST_INLINE void for_each_group_row(std::int64_t rows, const Row& row) {
  constexpr int kGroups = Block / G;
  const int lane = static_cast<int>(threadIdx.x) % G;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * kGroups;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kGroups + threadIdx.x / G; r < rows;
       r += step)
    row(r, lane);
}

/// The sum of v over the 32 lanes of a warp, in every lane.
struct WarpSum {
  template <class T>
  __device__ DUALCAST_INLINE T operator()(T v) const {
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
    return v;
  }
};

/// Blocks of Block threads for a warp per row: enough for every row, at most 16 per multiprocessor.
template <int Block>
unsigned warp_row_blocks(Device dev, std::int64_t rows) {
  const std::int64_t need = (rows + Block / 32 - 1) / (Block / 32);
  const std::int64_t cap = static_cast<std::int64_t>(multiprocessor_count(dev)) * 16;
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min(need, cap)));
}

#endif  // __CUDACC__

}  // namespace dualcast::detail
