// stream.hpp: the one CUDA stream per device that orders all of dualcast's work there (kernels,
// copies, cuBLAS and CUB calls). One stream keeps the caching allocator simple (a freed block is
// reusable by the next op at once) and makes a whole training step capturable as a CUDA graph,
// which the legacy default stream is not.
#pragma once

#include "dualcast/device.hpp"

#if DUALCAST_WITH_CUDA || defined(__CUDACC__)
#include <cuda_runtime_api.h>

namespace dualcast::detail {

/// The stream dualcast issues all work on `device` to (created on first use, lives until the process
/// ends). It is a blocking stream: work on the legacy default stream (a user's own kernels, plain
/// cudaMemcpy) stays ordered with it.
cudaStream_t stream(Device device);

}  // namespace dualcast::detail
#endif
