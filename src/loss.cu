// loss.cu: softmax, log_softmax, cross_entropy and mse as dedicated kernels (forward and backward).
//
// softmax-like ops work on "lines": a tensor viewed as [outer, C, inner] has outer * inner lines of
// C elements (stride `inner`). On the GPU a line along the contiguous axis (inner == 1) belongs to a
// warp (C < 1024) or a block (longer lines), which read it coalesced; lines along another axis
// belong to one thread each, adjacent threads reading adjacent addresses. On the CPU lines are
// spread over the thread pool. Each line is read twice: an online max-and-sum pass (the running
// sum is rescaled whenever the maximum grows, so no exp ever overflows), then a write pass.
#include "dualcast/ops/loss.hpp"

#include <math.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "dualcast/error.hpp"
#include "dualcast/graph.hpp"
#include "dualcast/kernels/reduce.cuh"
#include "dualcast/ops/reduce.hpp"
#include "dualcast/parallel.hpp"
#include "line_stats.hpp"

namespace dualcast {
namespace detail {
namespace {

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

Lines make_lines(const Shape& s, int axis) {
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
  cpu_for(L.lines, std::max<std::int64_t>(1, kCpuGrain / std::max<std::int64_t>(1, L.C)),
          [&](std::int64_t b, std::int64_t e) {
            for (std::int64_t l = b; l < e; ++l) {
              const std::int64_t base = L.base(l);
              T m, s;
              line_stats(x, base, L.inner, L.C, 0, 1, m, s);
              line_write<OP>(x, y, base, L.inner, L.C, 0, 1, m, s);
            }
          });
}

template <LineOp OP, class T>
void cpu_softmax_backward(const Lines& L, const T* y, const T* g, T* gx) {
  cpu_for(L.lines, std::max<std::int64_t>(1, kCpuGrain / std::max<std::int64_t>(1, L.C)),
          [&](std::int64_t b, std::int64_t e) {
            for (std::int64_t l = b; l < e; ++l) {
              const std::int64_t base = L.base(l);
              const T dot = line_dot<OP>(y, g, base, L.inner, L.C, 0, 1);
              line_grad<OP>(y, g, gx, base, L.inner, L.C, 0, 1, dot);
            }
          });
}

template <class T, class Lab>
void cpu_ce_forward(std::int64_t N, std::int64_t C, const T* x, const Lab* labels, T* row_loss,
                    T* stats) {
  cpu_for(N, std::max<std::int64_t>(1, kCpuGrain / std::max<std::int64_t>(1, C)),
          [&](std::int64_t b, std::int64_t e) {
            for (std::int64_t r = b; r < e; ++r) {
              T m, s;
              line_stats(x, r * C, 1, C, 0, 1, m, s);
              row_loss[r] = ce_row_finish(x, r, C, static_cast<std::int64_t>(labels[r]), m, s, stats);
            }
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
  constexpr int kGroups = kLineBlock / G;
  const int lane = static_cast<int>(threadIdx.x) % G;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * kGroups;
  // G == block: the loop bound is uniform over the block (one line per block per iteration).
  for (std::int64_t l = static_cast<std::int64_t>(blockIdx.x) * kGroups + threadIdx.x / G;
       l < L.lines; l += step) {
    const std::int64_t base = L.base(l);
    T m, s;
    line_stats(x, base, L.inner, L.C, lane, G, m, s);
    group_allreduce<G>(m, s, MergeMaxSum{});
    line_write<OP>(x, y, base, L.inner, L.C, lane, G, m, s);
  }
}

template <int G, LineOp OP, class T>
__global__ void __launch_bounds__(kLineBlock)
    softmax_backward_kernel(Lines L, const T* __restrict__ y, const T* __restrict__ g,
                            T* __restrict__ gx) {
  constexpr int kGroups = kLineBlock / G;
  const int lane = static_cast<int>(threadIdx.x) % G;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * kGroups;
  for (std::int64_t l = static_cast<std::int64_t>(blockIdx.x) * kGroups + threadIdx.x / G;
       l < L.lines; l += step) {
    const std::int64_t base = L.base(l);
    T dot = line_dot<OP>(y, g, base, L.inner, L.C, lane, G), unused = T(0);
    group_allreduce<G>(dot, unused, MergeSum{});
    line_grad<OP>(y, g, gx, base, L.inner, L.C, lane, G, dot);
  }
}

template <int G, class T, class Lab>
__global__ void __launch_bounds__(kLineBlock)
    ce_forward_kernel(std::int64_t N, std::int64_t C, const T* __restrict__ x,
                      const Lab* __restrict__ labels, T* __restrict__ row_loss,
                      T* __restrict__ stats, unsigned* __restrict__ bad) {
  constexpr int kGroups = kLineBlock / G;
  const int lane = static_cast<int>(threadIdx.x) % G;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * kGroups;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kGroups + threadIdx.x / G; r < N;
       r += step) {
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
  }
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

template <LineOp OP, class T>
void gpu_softmax_forward(Device dev, const Lines& L, const T* x, T* y) {
  DeviceGuard guard(dev);
  const LineLaunch ll = line_launch(dev, L);
  if (ll.group == 1) softmax_forward_kernel<1, OP, T><<<ll.blocks, kLineBlock, 0, stream(dev)>>>(L, x, y);
  else if (ll.group == 32) softmax_forward_kernel<32, OP, T><<<ll.blocks, kLineBlock, 0, stream(dev)>>>(L, x, y);
  else softmax_forward_kernel<kLineBlock, OP, T><<<ll.blocks, kLineBlock, 0, stream(dev)>>>(L, x, y);
  DUALCAST_CUDA_CHECK_LAUNCH();
}

template <LineOp OP, class T>
void gpu_softmax_backward(Device dev, const Lines& L, const T* y, const T* g, T* gx) {
  DeviceGuard guard(dev);
  const LineLaunch ll = line_launch(dev, L);
  if (ll.group == 1) softmax_backward_kernel<1, OP, T><<<ll.blocks, kLineBlock, 0, stream(dev)>>>(L, y, g, gx);
  else if (ll.group == 32) softmax_backward_kernel<32, OP, T><<<ll.blocks, kLineBlock, 0, stream(dev)>>>(L, y, g, gx);
  else softmax_backward_kernel<kLineBlock, OP, T><<<ll.blocks, kLineBlock, 0, stream(dev)>>>(L, y, g, gx);
  DUALCAST_CUDA_CHECK_LAUNCH();
}

template <class T, class Lab>
void gpu_ce_forward(Device dev, std::int64_t N, std::int64_t C, const T* x, const Lab* labels,
                    T* row_loss, T* stats, unsigned* bad) {
  DeviceGuard guard(dev);
  Lines L;
  L.lines = N;
  L.C = C;
  const LineLaunch ll = line_launch(dev, L);
  if (ll.group == 1)
    ce_forward_kernel<1, T, Lab><<<ll.blocks, kLineBlock, 0, stream(dev)>>>(N, C, x, labels, row_loss, stats, bad);
  else if (ll.group == 32)
    ce_forward_kernel<32, T, Lab><<<ll.blocks, kLineBlock, 0, stream(dev)>>>(N, C, x, labels, row_loss, stats, bad);
  else
    ce_forward_kernel<kLineBlock, T, Lab><<<ll.blocks, kLineBlock, 0, stream(dev)>>>(N, C, x, labels, row_loss, stats,
                                                                    bad);
  DUALCAST_CUDA_CHECK_LAUNCH();
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
  DUALCAST_FAIL("cross_entropy on ", dev.str(), ": dualcast was built without its CUDA backend");
#endif
}

/// (pred - target)^2 in double.
template <class T>
struct SquaredDiffLoad {
  const T* p;
  const T* t;
  [[nodiscard]] DUALCAST_HD DUALCAST_INLINE double operator()(std::int64_t, std::int64_t off) const {
    const double d = static_cast<double>(p[off]) - static_cast<double>(t[off]);
    return d * d;
  }
};

// Elementwise backward kernels (named templates: extended lambdas may not sit in generic lambdas).

/// gx[r, c] = g * (exp(x[r, c] - m[r] - log s[r]) - [c == label[r]]) / N (stats: see ce_row_finish).
template <class T, class Lab>
void ce_backward_kernel(Device d, T* gx, const T* x, const Lab* labels, const T* stats, const T* g,
                        std::int64_t N, std::int64_t C) {
  const T inv_n = T(1) / static_cast<T>(N);
  parallel_for(d, N * C, [=] DUALCAST_HD(std::int64_t i) {
    std::int64_t r, c;
    divmod_fast(i, C, r, c);
    const T onehot = static_cast<std::int64_t>(labels[r]) == c ? T(1) : T(0);
    gx[i] = g[0] * inv_n * (lexp((x[i] - stats[2 * r]) - stats[2 * r + 1]) - onehot);
  });
}

/// gp = g * 2 (p - t) / n (sign -1 for the target's gradient).
template <class T>
void mse_backward_kernel(Device d, T* gx, const T* p, const T* t, const T* g, std::int64_t n,
                         T sign) {
  const T k = sign * T(2) / static_cast<T>(n);
  parallel_for(d, n, [=] DUALCAST_HD(std::int64_t i) { gx[i] = g[0] * k * (p[i] - t[i]); });
}

// ---- typed operations -------------------------------------------------------------------------

void check_floating(const Tensor& x, const char* op, const char* arg) {
  check_defined(x, op, arg);
  DUALCAST_CHECK(is_floating(x.dtype()), op, ": argument '", arg, "' has unsupported dtype ",
                 dtype_name(x.dtype()), " (shape ", x.shape().str(),
                 "; expected float32 or float64)");
}

Tensor softmax_impl(const char* op, LineOp kind, const Tensor& x0, int axis) {
  check_floating(x0, op, "x");
  const int ax = normalize_axis(op, axis, x0.shape());
  const Tensor x = contiguous_copy(x0);
  const Lines L = make_lines(x.shape(), ax);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (x.numel() == 0) return y;
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    if (kind == LineOp::softmax)
      softmax_forward<LineOp::softmax, T>(x.device(), L, x.data<T>(), y.data<T>());
    else
      softmax_forward<LineOp::log_softmax, T>(x.device(), L, x.data<T>(), y.data<T>());
  });
  return y;
}

Tensor softmax_grad(LineOp kind, const Tensor& y, const Tensor& g0, int axis) {
  const Tensor g = contiguous_copy(g0);
  const Lines L = make_lines(y.shape(), axis);
  Tensor gx = Tensor::empty(y.shape(), y.dtype(), y.device());
  if (y.numel() == 0) return gx;
  dispatch_floating(y.dtype(), "softmax backward", [&](auto tag) {
    using T = decltype(tag);
    if (kind == LineOp::softmax)
      softmax_backward<LineOp::softmax, T>(y.device(), L, y.data<T>(), g.data<T>(), gx.data<T>());
    else
      softmax_backward<LineOp::log_softmax, T>(y.device(), L, y.data<T>(), g.data<T>(),
                                               gx.data<T>());
  });
  return gx;
}

/// The whole-batch reduction plan of a 1-d tensor of n elements.
ReducePlan full_plan(std::int64_t n) {
  const Shape s{n};
  const bool all[kMaxRank] = {true};
  return make_reduce_plan(s, contiguous_strides(s), all);
}

Tensor labels_contiguous(const Tensor& labels) {
  if (labels.is_contiguous() || !is_floating(labels.dtype())) {
    DUALCAST_CHECK(labels.is_contiguous(), "cross_entropy: uint8 labels must be contiguous");
    return labels;
  }
  return contiguous_copy(labels);
}

/// Shape, device and dtype checks of cross_entropy's arguments (no data read).
void check_label_shapes(const Tensor& logits, const Tensor& labels) {
  const char* op = "cross_entropy";
  DUALCAST_CHECK(logits.rank() == 2, op, ": logits must be [N, C], got shape ",
                 logits.shape().str());
  check_defined(labels, op, "labels");
  DUALCAST_CHECK(labels.rank() == 1 && labels.shape()[0] == logits.shape()[0], op,
                 ": labels must be [N] = [", logits.shape()[0], "] class indices for logits of shape ",
                 logits.shape().str(), ", got shape ", labels.shape().str());
  DUALCAST_CHECK(labels.device() == logits.device(), op, ": labels on ", labels.device().str(),
                 " but logits on ", logits.device().str());
}

/// Throws naming the first label that is not a class index (reads the labels on the host).
void throw_first_bad_label(const Tensor& labels, const Shape& logits_shape) {
  const std::int64_t C = logits_shape[1];
  const std::vector<double> v = labels.to_vector<double>();
  for (std::size_t i = 0; i < v.size(); ++i)
    DUALCAST_CHECK(label_ok(v[i], C), "cross_entropy: label ", v[i], " at position ", i,
                   " is not a class index in [0, ", C, ") for logits of shape ",
                   logits_shape.str());
}

}  // namespace
}  // namespace detail

// ---- public forms ------------------------------------------------------------------------------

namespace {

using detail::LineOp;

struct CrossEntropyResult {
  Tensor loss;    ///< 0-d
  Tensor logits;  ///< contiguous
  Tensor labels;  ///< contiguous
  Tensor stats;   ///< [N, 2]: each row's maximum and log-sum-exp of (x - max), for backward
};

CrossEntropyResult cross_entropy_impl(const Tensor& logits0, const Tensor& labels0) {
  detail::check_floating(logits0, "cross_entropy", "logits");
  detail::check_label_shapes(logits0, labels0);
  CrossEntropyResult r;
  r.logits = detail::contiguous_copy(logits0);
  r.labels = detail::labels_contiguous(labels0);
  const std::int64_t N = r.logits.shape()[0], C = r.logits.shape()[1];
  const Device dev = r.logits.device();
  // Labels are checked on the host before any work on the CPU; on a GPU the forward kernel raises a
  // flag that is read back once at the end (the one synchronisation cross_entropy costs there).
  if (dev.is_cpu()) {
    bool all_ok = true;
    dispatch_all(r.labels.dtype(), "cross_entropy", [&](auto ltag) {
      using L = decltype(ltag);
      const L* lab = r.labels.data<L>();
      for (std::int64_t i = 0; i < N && all_ok; ++i)
        all_ok = detail::label_ok(static_cast<double>(lab[i]), C);
    });
    if (!all_ok) detail::throw_first_bad_label(r.labels, r.logits.shape());
  }
  Tensor bad_flag;
  unsigned* bad = nullptr;
  if (dev.is_cuda() && N > 0) {
    bad_flag = Tensor::zeros(Shape{4}, DType::uint8, dev);
    bad = static_cast<unsigned*>(bad_flag.raw_data());
  }
  r.stats = Tensor::empty(Shape{N, 2}, r.logits.dtype(), dev);
  r.loss = Tensor::empty(Shape{}, r.logits.dtype(), dev);
  Tensor row_loss = Tensor::empty(Shape{N}, r.logits.dtype(), dev);
  dispatch_floating(r.logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    if (N > 0) {
      dispatch_all(r.labels.dtype(), "cross_entropy", [&](auto ltag) {
        using L = decltype(ltag);
        detail::ce_forward<T, L>(dev, N, C, r.logits.data<T>(), r.labels.data<L>(),
                                 row_loss.data<T>(), r.stats.data<T>(), bad);
      });
    }
    detail::run_reduce<double>(dev, detail::full_plan(N),
                               detail::PlainLoad<T, double>{row_loss.data<T>()},
                               detail::SumOp<double>{},
                               detail::ScaledStore<T, double>{r.loss.data<T>(),
                                                              1.0 / static_cast<double>(N)});
  });
  // Under graph capture the flag cannot be read back (the step only records); a bad label then
  // yields a NaN loss and NaN gradients at every replay instead of an Error.
  if (bad_flag.defined() && !capturing(dev)) {
    const std::vector<std::uint8_t> f = bad_flag.to_vector<std::uint8_t>();
    if (f[0] || f[1] || f[2] || f[3]) detail::throw_first_bad_label(r.labels, r.logits.shape());
  }
  return r;
}

void check_mse(const Tensor& pred, const Tensor& target) {
  detail::check_floating(pred, "mse", "pred");
  detail::check_floating(target, "mse", "target");
  check_same_device_dtype("mse", "pred", pred, "target", target);
  DUALCAST_CHECK(pred.shape() == target.shape(), "mse: pred of shape ", pred.shape().str(),
                 " and target of shape ", target.shape().str(),
                 " differ (mse does not broadcast; reshape one of them)");
}

Tensor mse_impl(const Tensor& p, const Tensor& t) {
  const Device dev = p.device();
  Tensor loss = Tensor::empty(Shape{}, p.dtype(), dev);
  const std::int64_t n = p.numel();
  dispatch_floating(p.dtype(), "mse", [&](auto tag) {
    using T = decltype(tag);
    detail::run_reduce<double>(dev, detail::full_plan(n),
                               detail::SquaredDiffLoad<T>{p.data<T>(), t.data<T>()},
                               detail::SumOp<double>{},
                               detail::ScaledStore<T, double>{loss.data<T>(),
                                                              1.0 / static_cast<double>(n)});
  });
  return loss;
}

class SoftmaxNode final : public Node {
 public:
  SoftmaxNode(LineOp kind, Tensor y, int axis) : kind_(kind), y_(std::move(y)), axis_(axis) {}
  [[nodiscard]] const char* name() const override {
    return kind_ == LineOp::softmax ? "softmax" : "log_softmax";
  }
  void release_saved() override { y_ = Tensor(); }
  void backward(const std::vector<Tensor>& grad_outputs) override {
    if (!grad_outputs[0].defined() || !inputs[0]) return;
    detail::accumulate_grad(*inputs[0], detail::softmax_grad(kind_, y_, grad_outputs[0], axis_),
                            /*owned=*/true);
  }

 private:
  LineOp kind_;
  Tensor y_;  // the output: all that either backward needs
  int axis_;
};

class CrossEntropyNode final : public Node {
 public:
  CrossEntropyNode(Tensor logits, Tensor labels, Tensor stats)
      : logits_(std::move(logits)), labels_(std::move(labels)), stats_(std::move(stats)) {}
  [[nodiscard]] const char* name() const override { return "cross_entropy"; }
  void release_saved() override {
    logits_ = Tensor();
    labels_ = Tensor();
    stats_ = Tensor();
  }
  void backward(const std::vector<Tensor>& grad_outputs) override {
    const Tensor& g = grad_outputs[0];
    if (!g.defined() || !inputs[0]) return;
    const std::int64_t N = logits_.shape()[0], C = logits_.shape()[1];
    Tensor gx = Tensor::empty(logits_.shape(), logits_.dtype(), logits_.device());
    dispatch_floating(logits_.dtype(), "cross_entropy backward", [&](auto tag) {
      using T = decltype(tag);
      dispatch_all(labels_.dtype(), "cross_entropy backward", [&](auto ltag) {
        using L = decltype(ltag);
        detail::ce_backward_kernel<T, L>(logits_.device(), gx.data<T>(), logits_.data<T>(),
                                         labels_.data<L>(), stats_.data<T>(), g.data<T>(), N, C);
      });
    });
    detail::accumulate_grad(*inputs[0], std::move(gx), /*owned=*/true);
  }

 private:
  Tensor logits_;
  Tensor labels_;
  Tensor stats_;
};

class MseNode final : public Node {
 public:
  MseNode(Tensor p, Tensor t) : p_(std::move(p)), t_(std::move(t)) {}
  [[nodiscard]] const char* name() const override { return "mse"; }
  void release_saved() override {
    p_ = Tensor();
    t_ = Tensor();
  }
  void backward(const std::vector<Tensor>& grad_outputs) override {
    const Tensor& g = grad_outputs[0];
    if (!g.defined()) return;
    for (int k = 0; k < 2; ++k) {
      if (!inputs[static_cast<std::size_t>(k)]) continue;
      Tensor gx = Tensor::empty(p_.shape(), p_.dtype(), p_.device());
      dispatch_floating(p_.dtype(), "mse backward", [&](auto tag) {
        using T = decltype(tag);
        detail::mse_backward_kernel<T>(p_.device(), gx.data<T>(), p_.data<T>(), t_.data<T>(),
                                       g.data<T>(), p_.numel(), k == 0 ? T(1) : T(-1));
      });
      detail::accumulate_grad(*inputs[static_cast<std::size_t>(k)], std::move(gx), /*owned=*/true);
    }
  }

 private:
  Tensor p_;
  Tensor t_;
};

Var softmax_var(const char* op, LineOp kind, const Var& x, int axis) {
  Tensor y = detail::softmax_impl(op, kind, x.value(), axis);
  if (!detail::any_requires_grad({x})) return Var(std::move(y));
  const int ax = normalize_axis(op, axis, x.shape());
  return detail::record1(std::make_shared<SoftmaxNode>(kind, y, ax), {x}, y);
}

}  // namespace

Tensor softmax(const Tensor& x, int axis) {
  return detail::softmax_impl("softmax", LineOp::softmax, x, axis);
}
Var softmax(const Var& x, int axis) { return softmax_var("softmax", LineOp::softmax, x, axis); }

Tensor log_softmax(const Tensor& x, int axis) {
  return detail::softmax_impl("log_softmax", LineOp::log_softmax, x, axis);
}
Var log_softmax(const Var& x, int axis) {
  return softmax_var("log_softmax", LineOp::log_softmax, x, axis);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& labels) {
  return cross_entropy_impl(logits, labels).loss;
}
Var cross_entropy(const Var& logits, const Tensor& labels) {
  CrossEntropyResult r = cross_entropy_impl(logits.value(), labels);
  if (!detail::any_requires_grad({logits})) return Var(std::move(r.loss));
  return detail::record1(std::make_shared<CrossEntropyNode>(r.logits, r.labels, r.stats), {logits},
                         r.loss);
}

Tensor mse(const Tensor& pred, const Tensor& target) {
  check_mse(pred, target);
  return mse_impl(detail::contiguous_copy(pred), detail::contiguous_copy(target));
}
Var mse(const Var& pred, const Var& target) {
  check_mse(pred.value(), target.value());
  const Tensor p = detail::contiguous_copy(pred.value());
  const Tensor t = detail::contiguous_copy(target.value());
  Tensor loss = mse_impl(p, t);
  if (!detail::any_requires_grad({pred, target})) return Var(std::move(loss));
  return detail::record1(std::make_shared<MseNode>(p, t), {pred, target}, loss);
}

}  // namespace dualcast
