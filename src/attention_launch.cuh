// attention_launch.cuh (private): what the fused attention kernels' two launcher files
// (attention_fused.cu: float32 and float64; attention_tensor_core.cu: 16-bit) share. CUDA only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attention_tiles.cuh"
#include "dualcast/error.hpp"
#include "dualcast/stream.hpp"
#include "per_device.hpp"

namespace dualcast::attention_detail {

/// Raises kernel's dynamic shared-memory limit once per device (needed above 48 KB).
template <auto kernel>
void allow_smem(Device dev, int bytes) {
  static detail::PerDevice<bool> raised;
  raised.get(dev, "scaled_dot_product_attention", [&] {
    DUALCAST_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    return true;
  });
}

/// Launches `blocks` blocks of kernels::kThreads (one per (head, tile)) with `smem` bytes of shared
/// memory on the device's current stream.
template <class Kernel, class Params>
void launch_blocks(Kernel kernel, std::int64_t blocks, int smem, Device dev, const Params& p) {
  DUALCAST_CHECK(blocks < (std::int64_t(1) << 31), "scaled_dot_product_attention: ", blocks,
                 " blocks exceed the grid limit");
  kernel<<<static_cast<unsigned>(blocks), kernels::kThreads, smem, detail::stream(dev)>>>(p);
  DUALCAST_CUDA_CHECK_LAUNCH();
}

}  // namespace dualcast::attention_detail
