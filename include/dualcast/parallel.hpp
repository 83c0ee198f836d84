// parallel.hpp: parallel_for(device, n, body), the one primitive that runs every elementwise body,
// on CPU threads or as a grid-stride CUDA kernel, so the two backends share their code.
#pragma once

#include <cstdint>
#include <type_traits>

#include "dualcast/config.hpp"
#include "dualcast/device.hpp"
#include "dualcast/error.hpp"

#if defined(__CUDACC__)
#include "dualcast/kernels/parallel_for.cuh"
#endif

namespace dualcast {

namespace detail {
using RangeFn = void (*)(const void* ctx, std::int64_t begin, std::int64_t end);
/// Splits [0, n) into chunks of at least `grain` indices over the CPU thread pool (inline when
/// small or when called from inside a pool thread, so nested parallel_for never deadlocks).
void cpu_parallel_range(std::int64_t n, std::int64_t grain, RangeFn fn, const void* ctx);
/// Number of CPU threads parallel_for uses (DUALCAST_NUM_THREADS overrides the hardware count).
int cpu_thread_count();

template <class Body>
void run_range(const void* ctx, std::int64_t begin, std::int64_t end) {
  const Body& body = *static_cast<const Body*>(ctx);
  for (std::int64_t i = begin; i < end; ++i) body(i);
}

// nvcc's extended __device__ lambdas cannot be called from host code; they are told apart here.
#if defined(__CUDACC__) && defined(__NVCC__)
template <class F>
inline constexpr bool is_device_only_lambda = __nv_is_extended_device_lambda_closure_type(F);
#else
template <class F>
inline constexpr bool is_device_only_lambda = false;
#endif

/// A body that cannot run on the host: a __device__ lambda itself, or a body that wraps one and says
/// so with `static constexpr bool device_only = true`.
template <class Body>
concept declares_device_only = requires { Body::device_only; };
template <class Body>
constexpr bool body_is_device_only() {
  if constexpr (declares_device_only<Body>) return Body::device_only || is_device_only_lambda<Body>;
  else return is_device_only_lambda<Body>;
}
}  // namespace detail

/// Below this many indices the CPU runs a loop on the calling thread: spawning work costs more.
inline constexpr std::int64_t kCpuGrain = 16384;

namespace detail {
/// parallel_for on the CPU alone, for bodies that only ever run there: under nvcc, parallel_for would
/// also compile a GPU kernel of the body that is never launched.
template <class Body>
void cpu_parallel_for(std::int64_t n, const Body& body, std::int64_t cpu_grain = kCpuGrain) {
  if constexpr (body_is_device_only<Body>()) {
    DUALCAST_FAIL("parallel_for: a __device__ lambda cannot run on the CPU; write the body as a "
                  "functor with a DUALCAST_HD operator() or as a DUALCAST_HD lambda");
  } else if (n > 0) {
    cpu_parallel_range(n, cpu_grain, &run_range<Body>, &body);
  }
}
}  // namespace detail

/// Runs body(i) for every i in [0, n) on `device`. `body` must be a copyable DUALCAST_HD callable
/// (a functor or a DUALCAST_HD lambda); on a CUDA device it is copied into a grid-stride kernel
/// sized from the multiprocessor count. Calls on a CUDA device need this translation unit to be
/// compiled by nvcc; a host-compiled caller gets a dualcast::Error saying so. The GPU launch is
/// asynchronous (stream-ordered on the device's stream); its launch error is checked here.
template <class Body>
void parallel_for(Device device, std::int64_t n, const Body& body,
                  std::int64_t cpu_grain = kCpuGrain) {
  if (n <= 0) return;
  if (device.is_cpu()) {
    detail::cpu_parallel_for(n, body, cpu_grain);
    return;
  }
#if defined(__CUDACC__)
  detail::launch_parallel_for(device, n, body);
#else
  DUALCAST_FAIL("parallel_for on ", device.str(),
                ": this translation unit was compiled by a host compiler; compile it with nvcc "
                "(a .cu file in a CUDA-enabled build) to run user code on the GPU");
#endif
}

}  // namespace dualcast
