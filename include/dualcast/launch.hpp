// launch.hpp: chained kernel launches (Hopper's programmatic dependent launch) and the one device call
// a kernel launched that way makes.
//
// Why: the HM-LSTM step is a chain of about 1800 dependent kernels of 2-15 us each, and between two
// of them the GPU drains the first, then launches and places the second's blocks. A chained launch
// lets the driver place the next kernel's blocks while the current one is still running; they run up
// to chain_wait(), which returns once the kernel before has finished and its writes are visible. So
// the launch and block placement overlap the previous kernel's tail instead of following it.
//
// The contract, for every kernel launched chained: chain_wait() comes before the kernel's first read
// or write of global memory, executed by every thread. Then the kernel before it has completed (and
// so, transitively, everything before that), and the kernel lets the next one begin launching, whose
// blocks in turn wait before touching memory. A kernel launched plainly (not chained) treats
// chain_wait() as a no-op, so the same kernel serves both launches.
#pragma once

#include <cstddef>
#include <utility>

#include "dualcast/device.hpp"
#include "dualcast/error.hpp"
#include "dualcast/stream.hpp"

#if DUALCAST_WITH_CUDA || defined(__CUDACC__)
#include <cuda_runtime_api.h>
#endif

namespace dualcast {

/// Whether dualcast launches its elementwise, parallel_for and skinny-product kernels chained on
/// `device`: a CUDA device of compute capability 9.0 or newer, unless turned off by
/// set_chained_launches(false) or the environment (DUALCAST_CHAINED_LAUNCH=0). False on the CPU.
bool chained_launches(Device device);

/// Turns chained launches on (where the device has them) or off for this process, overriding
/// DUALCAST_CHAINED_LAUNCH; for measuring both and for tests. A Graph records the launches as they
/// were when it was captured.
void set_chained_launches(bool on);

namespace detail {

/// Drops set_chained_launches' override: back to what DUALCAST_CHAINED_LAUNCH says. For tests that
/// must leave the process as they found it.
void reset_chained_launches();

#if DUALCAST_WITH_CUDA || defined(__CUDACC__)
/// Appends the chained-launch attribute to `attrs` (which has room for it) when chained_launches
/// holds; returns the new attribute count.
int add_chain_attribute(Device device, cudaLaunchAttribute* attrs, int count);
#endif

#if defined(__CUDACC__)
/// The call a chained kernel makes before touching global memory (see the file comment): waits for
/// the kernel before it in the stream, then lets the next one start launching.
__device__ __forceinline__ void chain_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/// Launches `kernel` on the device's dualcast stream, chained when chained_launches(device) holds.
/// The kernel must call chain_wait() first (file comment). Checks the launch.
template <class... Params, class... Args>
void launch_chained(Device device, void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem,
                    Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream(device);
  cudaLaunchAttribute attr[1];
  cfg.attrs = attr;
  cfg.numAttrs = static_cast<unsigned>(add_chain_attribute(device, attr, 0));
  DUALCAST_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}
#endif

}  // namespace detail
}  // namespace dualcast
