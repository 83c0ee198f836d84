// loss_lines.cuh (private to src/loss.cu): the line kernels behind softmax, log_softmax and
// cross_entropy, on both backends.
//
// A tensor viewed as [outer, C, inner] has outer * inner lines of C elements (stride `inner`). On the
// GPU a line along the contiguous axis (inner == 1) belongs to a warp (C < 1024) or a block (longer
// lines), which read it coalesced; lines along another axis belong to one thread each, adjacent
// threads reading adjacent addresses. On the CPU lines are spread over the thread pool. Each line is
// read twice: an online max-and-sum pass (the running sum is rescaled whenever the maximum grows, so
// no exp ever overflows), then a write pass.
#pragma once

#include <math.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "dualcast/device.hpp"
#include "dualcast/error.hpp"
#include "dualcast/kernels/reduce.cuh"  // divmod_fast
#include "dualcast/parallel.hpp"
#include "dualcast/shape.hpp"
#include "line_stats.hpp"
#include "row_groups.cuh"

namespace dualcast::detail::loss_lines {

/// A tensor viewed as [outer, C, inner]: line l = (o, i) starts at o * C * inner + i, stride inner.
struct Lines {
  std::int64_t lines = 0, C = 0, inner = 1;
  [[nodiscard]] DUALCAST_HD DUALCAST_INLINE std::int64_t base(std::int64_t l) const {
    if (inner == 1) return l * C;
    std::int64_t q, r;
    divmod_fast(l, inner, q, r);
    return q * C * inner + r;
  }
};

inline Lines make_lines(const Shape& s, int axis) {
  Lines L;
  std::int64_t outer = 1;
  for (int d = 0; d < axis; ++d) outer *= s[d];
  L.C = s[axis];
  for (int d = axis + 1; d < s.rank(); ++d) L.inner *= s[d];
  L.lines = outer * L.inner;
  return L;
}

/// Whether a label value is a class index: an integer in [0, C) (NaN is not).
DUALCAST_HD DUALCAST_INLINE bool label_ok(double v, std::int64_t C) {
  return v >= 0.0 && v < static_cast<double>(C) && v == ::floor(v);
}

// ---- per-line bodies: `lane` of `G` cooperating threads handles elements lane, lane + G, ... --

enum class LineOp { softmax, log_softmax };

template <LineOp OP, class T>
DUALCAST_HD DUALCAST_INLINE void line_write(const T* x, T* y, std::int64_t base,
                                            std::int64_t stride, std::int64_t C, int lane, int G,
                                            T m, T s) {
  if constexpr (OP == LineOp::softmax) {
    const T inv = T(1) / s;
    for (std::int64_t c = lane; c < C; c += G) {
      const std::int64_t k = base + c * stride;
      y[k] = lexp(x[k] - m) * inv;
    }
  } else {
    const T lse = llog(s);
    for (std::int64_t c = lane; c < C; c += G) {
      const std::int64_t k = base + c * stride;
      y[k] = (x[k] - m) - lse;
    }
  }
}

/// Backward partial sum: softmax sum(g * y), log_softmax sum(g).
template <LineOp OP, class T>
DUALCAST_HD DUALCAST_INLINE T line_dot(const T* y, const T* g, std::int64_t base,
                                       std::int64_t stride, std::int64_t C, int lane, int G) {
  T a0 = T(0), a1 = T(0);
  std::int64_t c = lane;
  for (; c + G < C; c += 2 * G) {
    const std::int64_t k0 = base + c * stride, k1 = base + (c + G) * stride;
    a0 += OP == LineOp::softmax ? g[k0] * y[k0] : g[k0];
    a1 += OP == LineOp::softmax ? g[k1] * y[k1] : g[k1];
  }
  if (c < C) {
    const std::int64_t k = base + c * stride;
    a0 += OP == LineOp::softmax ? g[k] * y[k] : g[k];
  }
  return a0 + a1;
}

template <LineOp OP, class T>
DUALCAST_HD DUALCAST_INLINE void line_grad(const T* y, const T* g, T* gx, std::int64_t base,
                                           std::int64_t stride, std::int64_t C, int lane, int G,
                                           T dot) {
  for (std::int64_t c = lane; c < C; c += G) {
    const std::int64_t k = base + c * stride;
    if constexpr (OP == LineOp::softmax) gx[k] = y[k] * (g[k] - dot);
    else gx[k] = g[k] - lexp(y[k]) * dot;
  }
}

/// Cross-entropy of row r (logits x[r * C ...]): returns the row's loss (m - x[label]) + log(s) and
/// keeps (m, log s) in stats[2r], stats[2r + 1]. The two are never added: m + log(s) rounded would
/// cost all precision for large logits (at 1e5 a float's spacing is 1/128), while m - x[label] and
/// x - m are exact there.
template <class T>
DUALCAST_HD DUALCAST_INLINE T ce_row_finish(const T* x, std::int64_t r, std::int64_t C,
                                            std::int64_t label, T m, T s, T* stats) {
  const T ls = llog(s);
  stats[2 * r] = m;
  stats[2 * r + 1] = ls;
  return (m - x[r * C + label]) + ls;
}

// ---- CPU drivers ------------------------------------------------------------------------------

template <LineOp OP, class T>
void cpu_softmax_forward(const Lines& L, const T* x, T* y) {
  cpu_rows(L.lines, L.C, [&](std::int64_t l) {
    const std::int64_t base = L.base(l);
    T m, s;
    line_stats(x, base, L.inner, L.C, 0, 1, m, s);
    line_write<OP>(x, y, base, L.inner, L.C, 0, 1, m, s);
  });
}

template <LineOp OP, class T>
void cpu_softmax_backward(const Lines& L, const T* y, const T* g, T* gx) {
  cpu_rows(L.lines, L.C, [&](std::int64_t l) {
    const std::int64_t base = L.base(l);
    const T dot = line_dot<OP>(y, g, base, L.inner, L.C, 0, 1);
    line_grad<OP>(y, g, gx, base, L.inner, L.C, 0, 1, dot);
  });
}

template <class T, class Lab>
void cpu_ce_forward(std::int64_t N, std::int64_t C, const T* x, const Lab* labels, T* row_loss,
                    T* stats) {
  cpu_rows(N, C, [&](std::int64_t r) {
    T m, s;
    line_stats(x, r * C, 1, C, 0, 1, m, s);
    row_loss[r] = ce_row_finish(x, r, C, static_cast<std::int64_t>(labels[r]), m, s, stats);
  });
}

// ---- CUDA drivers -----------------------------------------------------------------------------
#if defined(__CUDACC__)

inline constexpr int kLineBlock = 256;

/// Combines a per-thread value over a group of G threads (1, 32 or the block); every thread of
/// the group gets the result. For G == block all threads must call it (uniform control flow).
template <int G, class T, class Merge>
__device__ DUALCAST_INLINE void group_allreduce(T& a, T& b, const Merge& merge) {
  if constexpr (G >= 32) {
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
      const T a2 = __shfl_xor_sync(0xffffffffu, a, d);
      const T b2 = __shfl_xor_sync(0xffffffffu, b, d);
      merge(a, b, a2, b2);
    }
  }
  if constexpr (G > 32) {
    __shared__ T sa[G / 32], sb[G / 32];
    const int warp = static_cast<int>(threadIdx.x) / 32;
    if (threadIdx.x % 32 == 0) {
      sa[warp] = a;
      sb[warp] = b;
    }
    __syncthreads();
    a = sa[0];
    b = sb[0];
    for (int w = 1; w < G / 32; ++w) merge(a, b, sa[w], sb[w]);
    __syncthreads();  // the shared slots are reused by the next line
  }
}

struct MergeMaxSum {
  template <class T>
  __device__ DUALCAST_INLINE void operator()(T& m, T& s, T m2, T s2) const {
    online_merge(m, s, m2, s2);
  }
};
struct MergeSum {
  template <class T>
  __device__ DUALCAST_INLINE void operator()(T& a, T&, T a2, T) const {
    a += a2;
  }
};

template <int G, LineOp OP, class T>
__global__ void __launch_bounds__(kLineBlock)
    softmax_forward_kernel(Lines L, const T* __restrict__ x, T* __restrict__ y) {
  for_each_group_row<G, kLineBlock>(L.lines, [&](std::int64_t l, int lane) {
    const std::int64_t base = L.base(l);
    T m, s;
    line_stats(x, base, L.inner, L.C, lane, G, m, s);
    group_allreduce<G>(m, s, MergeMaxSum{});
    line_write<OP>(x, y, base, L.inner, L.C, lane, G, m, s);
  });
}

template <int G, LineOp OP, class T>
__global__ void __launch_bounds__(kLineBlock)
    softmax_backward_kernel(Lines L, const T* __restrict__ y, const T* __restrict__ g,
                            T* __restrict__ gx) {
  for_each_group_row<G, kLineBlock>(L.lines, [&](std::int64_t l, int lane) {
    const std::int64_t base = L.base(l);
    T dot = line_dot<OP>(y, g, base, L.inner, L.C, lane, G), unused = T(0);
    group_allreduce<G>(dot, unused, MergeSum{});
    line_grad<OP>(y, g, gx, base, L.inner, L.C, lane, G, dot);
  });
}

template <int G, class T, class Lab>
__global__ void __launch_bounds__(kLineBlock)
    ce_forward_kernel(std::int64_t N, std::int64_t C, const T* __restrict__ x,
                      const Lab* __restrict__ labels, T* __restrict__ row_loss,
                      T* __restrict__ stats, unsigned* __restrict__ bad) {
  for_each_group_row<G, kLineBlock>(N, [&](std::int64_t r, int lane) {
    T m, s;
    line_stats(x, r * C, 1, C, lane, G, m, s);
    group_allreduce<G>(m, s, MergeMaxSum{});
    if (lane == 0) {
      // An invalid label raises the flag (reported by the host) and makes the row's loss and
      // statistics NaN, so its loss and gradient are NaN: under graph capture, where the host cannot
      // read the flag, a bad label is poisoned output rather than a plausible wrong answer.
      const double lv = static_cast<double>(labels[r]);
      const bool ok = label_ok(lv, C);
      if (!ok) atomicOr(bad, 1u);
      const T loss = ce_row_finish(x, r, C, ok ? static_cast<std::int64_t>(lv) : 0, m, s, stats);
      if (ok) {
        row_loss[r] = loss;
      } else {
        const T nan = static_cast<T>(NAN);
        row_loss[r] = nan;
        stats[2 * r] = nan;
        stats[2 * r + 1] = nan;
      }
    }
  });
}

/// Launch shape of a line kernel: threads per line and blocks.
struct LineLaunch {
  int group;
  unsigned blocks;
};
inline LineLaunch line_launch(Device dev, const Lines& L) {
  // A thread per line along another axis or for very short lines (a warp would idle), a warp per
  // line up to 1023 elements, a block beyond.
  const int group = (L.inner != 1 || L.C <= 16) ? 1 : (L.C >= 1024 ? kLineBlock : 32);
  const std::int64_t per_block = kLineBlock / group;
  const std::int64_t cap = static_cast<std::int64_t>(multiprocessor_count(dev)) * 16;
  const std::int64_t blocks = std::min<std::int64_t>((L.lines + per_block - 1) / per_block, cap);
  return {group, static_cast<unsigned>(std::max<std::int64_t>(1, blocks))};
}

/// Runs `launch(group, blocks)` with the group size as a compile-time constant (the kernels are
/// instantiated per group size), then checks the launch.
template <class Launch>
void launch_lines(Device dev, const Lines& L, Launch&& launch) {
  DeviceGuard guard(dev);
  const LineLaunch ll = line_launch(dev, L);
  if (ll.group == 1) launch(std::integral_constant<int, 1>{}, ll.blocks);
  else if (ll.group == 32) launch(std::integral_constant<int, 32>{}, ll.blocks);
  else launch(std::integral_constant<int, kLineBlock>{}, ll.blocks);
  DUALCAST_CUDA_CHECK_LAUNCH();
}

template <LineOp OP, class T>
void gpu_softmax_forward(Device dev, const Lines& L, const T* x, T* y) {
  launch_lines(dev, L, [&](auto group, unsigned blocks) {
    softmax_forward_kernel<decltype(group)::value, OP, T><<<blocks, kLineBlock, 0, stream(dev)>>>(L, x, y);
  });
}

template <LineOp OP, class T>
void gpu_softmax_backward(Device dev, const Lines& L, const T* y, const T* g, T* gx) {
  launch_lines(dev, L, [&](auto group, unsigned blocks) {
    softmax_backward_kernel<decltype(group)::value, OP, T><<<blocks, kLineBlock, 0, stream(dev)>>>(L, y, g, gx);
  });
}

template <class T, class Lab>
void gpu_ce_forward(Device dev, std::int64_t N, std::int64_t C, const T* x, const Lab* labels,
                    T* row_loss, T* stats, unsigned* bad) {
  Lines L;
  L.lines = N;
  L.C = C;
  launch_lines(dev, L, [&](auto group, unsigned blocks) {
    ce_forward_kernel<decltype(group)::value, T, Lab><<<blocks, kLineBlock, 0, stream(dev)>>>(
        N, C, x, labels, row_loss, stats, bad);
  });
}

#endif  // __CUDACC__

// ---- device-independent entry points ----------------------------------------------------------

template <LineOp OP, class T>
void softmax_forward(Device dev, const Lines& L, const T* x, T* y) {
  if (dev.is_cpu()) return cpu_softmax_forward<OP>(L, x, y);
#if defined(__CUDACC__)
  gpu_softmax_forward<OP>(dev, L, x, y);
#else
  DUALCAST_FAIL("softmax on ", dev.str(), ": dualcast was built without its CUDA backend");
#endif
}

template <LineOp OP, class T>
void softmax_backward(Device dev, const Lines& L, const T* y, const T* g, T* gx) {
  if (dev.is_cpu()) return cpu_softmax_backward<OP>(L, y, g, gx);
#if defined(__CUDACC__)
  gpu_softmax_backward<OP>(dev, L, y, g, gx);
#else
  DUALCAST_FAIL("softmax backward on ", dev.str(), ": dualcast was built without its CUDA backend");
#endif
}

template <class T, class Lab>
void ce_forward(Device dev, std::int64_t N, std::int64_t C, const T* x, const Lab* labels,
                T* row_loss, T* stats, unsigned* bad) {
  if (dev.is_cpu()) return cpu_ce_forward(N, C, x, labels, row_loss, stats);  // labels pre-checked
#if defined(__CUDACC__)
  gpu_ce_forward(dev, N, C, x, labels, row_loss, stats, bad);
#else
  (void)bad;  // the CPU checks labels before the kernel; only the GPU kernel raises the flag
  DUALCAST_FAIL("cross_entropy on ", dev.str(), ": dualcast was built without its CUDA backend");
#endif
}

}  // namespace dualcast::detail::loss_lines
