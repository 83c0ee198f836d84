// parallel_for.cuh: the grid-stride CUDA kernel behind dualcast::parallel_for, and its launcher
// (a chained launch: launch.hpp).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "dualcast/device.hpp"
#include "dualcast/error.hpp"
#include "dualcast/launch.hpp"
#include "dualcast/stream.hpp"

namespace dualcast::detail {

inline constexpr int kBlockSize = 256;

template <class Body>
__global__ void __launch_bounds__(kBlockSize) parallel_for_kernel(std::int64_t n, Body body) {
  chain_wait();  // launched chained (launch.hpp): nothing is read or written before this
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    body(i);
}

/// Grid for a grid-stride loop over n items: enough blocks to fill every multiprocessor
/// `blocks_per_sm` times over, never more than the work needs.
inline unsigned grid_for(Device device, std::int64_t n, int blocks_per_sm = 8) {
  const std::int64_t needed = (n + kBlockSize - 1) / kBlockSize;
  const std::int64_t cap = static_cast<std::int64_t>(multiprocessor_count(device)) * blocks_per_sm;
  return static_cast<unsigned>(needed < cap ? needed : cap);
}

template <class Body>
void launch_parallel_for(Device device, std::int64_t n, const Body& body) {
  DeviceGuard guard(device);
  launch_chained(device, parallel_for_kernel<Body>, dim3(grid_for(device, n)), dim3(kBlockSize), 0, n, body);
}

}  // namespace dualcast::detail
