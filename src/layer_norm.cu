// layer_norm.cu: layer normalisation over the last axis (ops/layer_norm.hpp), forward and backward.
//
// The row bodies are DUALCAST_HD functions of (lane, G): G cooperating threads handle elements lane,
// lane + G, ... of one row, so the CPU (G = 1, rows over the thread pool) and the GPU (G = 32, a warp
// per row, partial sums combined by shuffles) run the same arithmetic. dgamma and dbeta are column
// sums over rows: each of `chunks` groups of rows writes a partial [chunks, C] (a thread per column
// of a chunk: coalesced on the GPU), then dualcast::sum reduces the chunks. A 16-bit x is normalised
// on a float32 copy (the public forms at the end).
#include "dualcast/ops/layer_norm.hpp"

#include <math.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "dualcast/error.hpp"
#include "dualcast/kernels/reduce.cuh"
#include "dualcast/ops/cast.hpp"
#include "dualcast/ops/reduce.hpp"
#include "dualcast/parallel.hpp"
#include "row_groups.cuh"

namespace dualcast {
namespace layer_norm_detail {
namespace {


DUALCAST_HD DUALCAST_INLINE float rsqrt_of(float v) { return 1.0f / ::sqrtf(v); }
DUALCAST_HD DUALCAST_INLINE double rsqrt_of(double v) { return 1.0 / ::sqrt(v); }

/// Pointers and sizes of one call. gamma/beta may be null (no scale / no shift).
template <class T>
struct LnArgs {
  const T* x = nullptr;
  const T* gamma = nullptr;
  const T* beta = nullptr;
  T* y = nullptr;
  T* mean = nullptr;
  T* rstd = nullptr;
  const T* g = nullptr;   // backward: the adjoint of y
  T* gx = nullptr;        // backward: the gradient of x
  std::int64_t rows = 0, C = 0;
  T eps = T(0);
};

// ---- row bodies (lane of G); `reduce` combines a value over the G threads of the row ----------

template <class T, class Reduce>
DUALCAST_HD DUALCAST_INLINE void forward_row(const LnArgs<T>& a, std::int64_t r, int lane, int G,
                                             const Reduce& reduce) {
  const T* x = a.x + r * a.C;
  // Summed relative to the row's first element: a large common offset (1e4 + N(0, 1)) would
  // otherwise cost float32 its digits in the running sum.
  const T shift = x[0];
  T s = T(0);
  for (std::int64_t c = lane; c < a.C; c += G) s += x[c] - shift;
  const T mean = shift + reduce(s) / static_cast<T>(a.C);
  T q = T(0);
  for (std::int64_t c = lane; c < a.C; c += G) {
    const T d = x[c] - mean;
    q += d * d;
  }
  const T rstd = rsqrt_of(reduce(q) / static_cast<T>(a.C) + a.eps);
  T* y = a.y + r * a.C;
  for (std::int64_t c = lane; c < a.C; c += G) {
    T v = (x[c] - mean) * rstd;
    if (a.gamma) v *= a.gamma[c];
    if (a.beta) v += a.beta[c];
    y[c] = v;
  }
  if (lane == 0) {
    a.mean[r] = mean;
    a.rstd[r] = rstd;
  }
}

template <class T, class Reduce>
DUALCAST_HD DUALCAST_INLINE void backward_row(const LnArgs<T>& a, std::int64_t r, int lane, int G,
                                              const Reduce& reduce) {
  const T* x = a.x + r * a.C;
  const T* g = a.g + r * a.C;
  const T mean = a.mean[r], rstd = a.rstd[r];
  T s1 = T(0), s2 = T(0);
  for (std::int64_t c = lane; c < a.C; c += G) {
    const T gy = a.gamma ? g[c] * a.gamma[c] : g[c];
    s1 += gy;
    s2 += gy * (x[c] - mean) * rstd;
  }
  const T inv_c = T(1) / static_cast<T>(a.C);
  const T m1 = reduce(s1) * inv_c, m2 = reduce(s2) * inv_c;
  T* gx = a.gx + r * a.C;
  for (std::int64_t c = lane; c < a.C; c += G) {
    const T gy = a.gamma ? g[c] * a.gamma[c] : g[c];
    const T xhat = (x[c] - mean) * rstd;
    gx[c] = rstd * (gy - m1 - xhat * m2);
  }
}

struct NoReduce {
  template <class T>
  DUALCAST_HD DUALCAST_INLINE T operator()(T v) const { return v; }
};

/// Column partial sums of g * xhat (dgamma) and g (dbeta) over the rows of one chunk: one index per
/// (chunk, column), adjacent indices adjacent columns.
template <class T>
struct ColumnPartials {
  const T* x;
  const T* g;
  const T* mean;
  const T* rstd;
  T* pg;  // [chunks, C] or null
  T* pb;  // [chunks, C] or null
  std::int64_t rows, C, chunk_rows;
  DUALCAST_HD void operator()(std::int64_t i) const {
    const std::int64_t ch = i / C, c = i - ch * C;
    const std::int64_t r0 = ch * chunk_rows;
    const std::int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
    T sg = T(0), sb = T(0);
    for (std::int64_t r = r0; r < r1; ++r) {
      const T gv = g[r * C + c];
      sg += gv * (x[r * C + c] - mean[r]) * rstd[r];
      sb += gv;
    }
    if (pg) pg[i] = sg;
    if (pb) pb[i] = sb;
  }
};

// ---- drivers --------------------------------------------------------------------------------

#if defined(__CUDACC__)
inline constexpr int kLnBlock = 256;

using detail::WarpSum;

template <class T>
__global__ void __launch_bounds__(kLnBlock) layer_norm_forward_kernel(LnArgs<T> a) {
  detail::for_each_group_row<32, kLnBlock>(
      a.rows, [&](std::int64_t r, int lane) { forward_row(a, r, lane, 32, WarpSum{}); });
}

template <class T>
__global__ void __launch_bounds__(kLnBlock) layer_norm_backward_kernel(LnArgs<T> a) {
  detail::for_each_group_row<32, kLnBlock>(
      a.rows, [&](std::int64_t r, int lane) { backward_row(a, r, lane, 32, WarpSum{}); });
}
#endif

/// The forward (BACKWARD false) or the backward of every row: a CPU thread or a GPU warp per row.
template <bool BACKWARD, class T>
void run_rows(Device dev, const LnArgs<T>& a) {
  if (dev.is_cpu()) {
    detail::cpu_rows(a.rows, a.C, [&](std::int64_t r) {
      if constexpr (BACKWARD) backward_row(a, r, 0, 1, NoReduce{});
      else forward_row(a, r, 0, 1, NoReduce{});
    });
    return;
  }
#if defined(__CUDACC__)
  detail::DeviceGuard guard(dev);
  const unsigned blocks = detail::warp_row_blocks<kLnBlock>(dev, a.rows);
  if constexpr (BACKWARD) layer_norm_backward_kernel<T><<<blocks, kLnBlock, 0, detail::stream(dev)>>>(a);
  else layer_norm_forward_kernel<T><<<blocks, kLnBlock, 0, detail::stream(dev)>>>(a);
  DUALCAST_CUDA_CHECK_LAUNCH();
#else
  DUALCAST_FAIL("layer_norm", BACKWARD ? " backward" : "", " on ", dev.str(),
                ": dualcast was built without its CUDA backend");
#endif
}

// ---- checks and the tape node -------------------------------------------------------------------

void check_args(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
  const char* op = "layer_norm";
  check_defined(x, op, "x");
  DUALCAST_CHECK(is_floating(x.dtype()), op, ": argument 'x' has unsupported dtype ",
                 dtype_name(x.dtype()), " (shape ", x.shape().str(), "; expected float32 or float64)");
  DUALCAST_CHECK(x.rank() >= 1, op, ": argument 'x' has shape ", x.shape().str(),
                 "; expected at least one dimension (normalised over the last)");
  DUALCAST_CHECK(std::isfinite(eps) && eps >= 0.0, op, ": eps = ", eps,
                 " must be finite and >= 0");
  const std::int64_t C = x.shape()[x.rank() - 1];
  const auto check_param = [&](const Tensor& p, const char* name) {
    if (!p.defined()) return;
    check_same_device_dtype(op, "x", x, name, p);
    DUALCAST_CHECK(p.rank() == 1 && p.shape()[0] == C, op, ": argument '", name, "' has shape ",
                   p.shape().str(), "; expected [", C, "] (the last dimension of x ",
                   x.shape().str(), ")");
  };
  check_param(gamma, "gamma");
  check_param(beta, "beta");
}

struct ForwardResult {
  Tensor y, x, gamma, mean, rstd;
};

ForwardResult forward(const Tensor& x0, const Tensor& gamma0, const Tensor& beta0, double eps) {
  check_args(x0, gamma0, beta0, eps);
  ForwardResult r;
  r.x = detail::contiguous_copy(x0);
  r.gamma = gamma0.defined() ? detail::contiguous_copy(gamma0) : Tensor();
  const Tensor beta = beta0.defined() ? detail::contiguous_copy(beta0) : Tensor();
  const std::int64_t C = r.x.shape()[r.x.rank() - 1];
  const std::int64_t rows = C == 0 ? 0 : r.x.numel() / C;
  const Device dev = r.x.device();
  r.y = Tensor::empty(r.x.shape(), r.x.dtype(), dev);
  r.mean = Tensor::empty(Shape{rows}, r.x.dtype(), dev);
  r.rstd = Tensor::empty(Shape{rows}, r.x.dtype(), dev);
  if (rows == 0) return r;
  dispatch_floating(r.x.dtype(), "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    LnArgs<T> a;
    a.x = r.x.data<T>();
    a.gamma = r.gamma.defined() ? r.gamma.data<T>() : nullptr;
    a.beta = beta.defined() ? beta.data<T>() : nullptr;
    a.y = r.y.data<T>();
    a.mean = r.mean.data<T>();
    a.rstd = r.rstd.data<T>();
    a.rows = rows;
    a.C = C;
    a.eps = static_cast<T>(eps);
    run_rows<false>(dev, a);
  });
  return r;
}

class LayerNormNode final : public Node {
 public:
  LayerNormNode(Tensor x, Tensor gamma, Tensor mean, Tensor rstd)
      : x_(std::move(x)), gamma_(std::move(gamma)), mean_(std::move(mean)), rstd_(std::move(rstd)) {}
  [[nodiscard]] const char* name() const override { return "layer_norm"; }
  void release_saved() override {
    x_ = gamma_ = mean_ = rstd_ = Tensor();
  }

  void backward(const std::vector<Tensor>& grad_outputs) override {
    if (!grad_outputs[0].defined()) return;
    const Tensor g = detail::contiguous_copy(grad_outputs[0]);
    const std::int64_t C = x_.shape()[x_.rank() - 1];
    const std::int64_t rows = C == 0 ? 0 : x_.numel() / C;
    const Device dev = x_.device();
    dispatch_floating(x_.dtype(), "layer_norm backward", [&](auto tag) {
      using T = decltype(tag);
      if (inputs[0]) {
        Tensor gx = Tensor::empty(x_.shape(), x_.dtype(), dev);
        LnArgs<T> a;
        a.x = x_.data<T>();
        a.gamma = gamma_.defined() ? gamma_.data<T>() : nullptr;
        a.mean = mean_.data<T>();
        a.rstd = rstd_.data<T>();
        a.g = g.data<T>();
        a.gx = gx.data<T>();
        a.rows = rows;
        a.C = C;
        if (rows > 0) run_rows<true>(dev, a);
        detail::accumulate_grad(*inputs[0], std::move(gx), /*owned=*/true);
      }
      const bool want_g = inputs.size() > 1 && inputs[1];
      const bool want_b = inputs.size() > 2 && inputs[2];
      if (!want_g && !want_b) return;
      // Chunks of rows: enough (chunk, column) threads to fill a GPU, rows per chunk >= 16.
      const std::int64_t target = dev.is_cpu() ? 64 : 65536;
      const std::int64_t chunks = std::clamp<std::int64_t>(target / std::max<std::int64_t>(1, C), 1,
                                                           std::max<std::int64_t>(1, rows / 16));
      const std::int64_t chunk_rows = std::max<std::int64_t>(1, (rows + chunks - 1) / chunks);
      const std::int64_t n_chunks = rows == 0 ? 1 : (rows + chunk_rows - 1) / chunk_rows;
      Tensor pg = want_g ? Tensor::empty(Shape{n_chunks, C}, x_.dtype(), dev) : Tensor();
      Tensor pb = want_b ? Tensor::empty(Shape{n_chunks, C}, x_.dtype(), dev) : Tensor();
      ColumnPartials<T> body{x_.data<T>(),  g.data<T>(),
                             mean_.data<T>(), rstd_.data<T>(),
                             want_g ? pg.data<T>() : nullptr, want_b ? pb.data<T>() : nullptr,
                             rows,          C,
                             chunk_rows};
      parallel_for(dev, n_chunks * C, body, /*cpu_grain=*/std::max<std::int64_t>(1, 4096 / chunk_rows));
      if (want_g) detail::accumulate_grad(*inputs[1], sum(pg, 0), /*owned=*/true);
      if (want_b) detail::accumulate_grad(*inputs[2], sum(pb, 0), /*owned=*/true);
    });
  }

 private:
  Tensor x_, gamma_, mean_, rstd_;
};

}  // namespace
}  // namespace layer_norm_detail

namespace layer_norm_detail {
namespace {
/// The checks of a 16-bit x before it is widened: gamma and beta are float32 or x's dtype.
void check_half_params(const Tensor& x, const Tensor& gamma, const Tensor& beta) {
  if (gamma.defined()) detail::check_parameter_of_half("layer_norm", x, "gamma", gamma);
  if (beta.defined()) detail::check_parameter_of_half("layer_norm", x, "beta", beta);
}
Tensor widened(const Tensor& t) { return t.defined() ? t.to(DType::float32) : t; }
Var widened(const Var& v) { return v.defined() ? cast(v, DType::float32) : v; }
}  // namespace
}  // namespace layer_norm_detail

Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
  using namespace layer_norm_detail;
  if (x.defined() && is_half(x.dtype())) {
    check_half_params(x, gamma, beta);
    return forward(x.to(DType::float32), widened(gamma), widened(beta), eps).y.to(x.dtype());
  }
  return forward(x, gamma, beta, eps).y;
}

Var layer_norm(const Var& x, const Var& gamma, const Var& beta, double eps) {
  using namespace layer_norm_detail;
  DUALCAST_CHECK(x.defined(), "layer_norm: argument 'x' is an undefined Var");
  if (is_half(x.dtype())) {
    check_half_params(x.value(), gamma.defined() ? gamma.value() : Tensor(),
                      beta.defined() ? beta.value() : Tensor());
    return cast(layer_norm(cast(x, DType::float32), widened(gamma), widened(beta), eps),
                x.dtype());
  }
  const Tensor gv = gamma.defined() ? gamma.value() : Tensor();
  const Tensor bv = beta.defined() ? beta.value() : Tensor();
  auto r = layer_norm_detail::forward(x.value(), gv, bv, eps);
  if (!detail::any_requires_grad({x, gamma, beta})) return Var(std::move(r.y));
  auto node = std::make_shared<layer_norm_detail::LayerNormNode>(r.x, r.gamma, r.mean, r.rstd);
  return detail::record1(std::move(node), {x, gamma, beta}, std::move(r.y));
}

}  // namespace dualcast
