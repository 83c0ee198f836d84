// norm.cu: batch-norm statistics (forward: one per-channel reduction pass and a finishing kernel that
// also updates the running statistics; backward: one elementwise pass) and batch_norm itself, whose
// apply is a channel_broadcast of BatchNormApply.
//
// The reduction is organised like channel_broadcast's backward: task (c, s) sums the s-th slice of
// channel c's N * inner elements (shifted by the channel's first element, so the variance does not
// cancel for data far from zero) into double partials [2, C, S], which the finishing kernel adds in a
// fixed order. CPU threads run the tasks; on the GPU a block runs each.
//
// A 16-bit x: batch_norm_stats reads it as it is (summing in double, as for every dtype) and gives
// float32 statistics and running statistics; batch_norm normalises a float32 copy and rounds the result
// back to x's dtype (a channel_broadcast with ChannelOptions::keep_activation_dtype avoids the copy).
#include "dualcast/ops/norm.hpp"

#include <cmath>
#include <memory>
#include <string>

#include "dualcast/error.hpp"
#include "dualcast/ops/cast.hpp"
#include "dualcast/parallel.hpp"

#if defined(__CUDACC__)
#include <cuda_runtime.h>

#include "dualcast/stream.hpp"
#endif

namespace dualcast {

namespace norm_detail {
namespace {

using detail::cb_div;
using detail::cb_width;
using detail::CbPacket;

/// Sums of (x - shift_c) and (x - shift_c)^2 over slices of each channel.
template <class T>
struct StatsBody {
  const T* x = nullptr;
  double* partial = nullptr;  ///< [2, C, S]
  std::int64_t C = 1, inner = 1, M = 0, S = 1;
  bool vec = false;

  [[nodiscard]] DUALCAST_HD DUALCAST_INLINE std::int64_t index(std::int64_t c, std::int64_t j) const {
    const std::int64_t n = cb_div(j, inner);
    return (n * C + c) * inner + (j - n * inner);
  }
  [[nodiscard]] DUALCAST_HD DUALCAST_INLINE std::int64_t slice_begin(std::int64_t s) const {
    constexpr int V = cb_width<T>;
    return vec ? (M / V) * s / S * V : M * s / S;
  }
  DUALCAST_HD DUALCAST_INLINE void walk(std::int64_t c, std::int64_t offset, std::int64_t step,
                                        std::int64_t s, double& a, double& b) const {
    constexpr int V = cb_width<T>;
    const double shift = static_cast<double>(x[c * inner]);
    const std::int64_t j0 = slice_begin(s), j1 = slice_begin(s + 1);
    if (vec) {
      for (std::int64_t j = j0 + offset * V; j < j1; j += step * V) {
        const CbPacket<T, V> p = *reinterpret_cast<const CbPacket<T, V>*>(x + index(c, j));
        DUALCAST_UNROLL
        for (int e = 0; e < V; ++e) {
          const double d = static_cast<double>(p.v[e]) - shift;
          a += d;
          b += d * d;
        }
      }
    } else {
      for (std::int64_t j = j0 + offset; j < j1; j += step) {
        const double d = static_cast<double>(x[index(c, j)]) - shift;
        a += d;
        b += d * d;
      }
    }
  }
  void run_task(std::int64_t t) const {
    const std::int64_t c = t / S, s = t - (t / S) * S;
    double a = 0, b = 0;
    walk(c, 0, 1, s, a, b);
    partial[c * S + s] = a;
    partial[(C + c) * S + s] = b;
  }
};

template <class T>
void stats_tasks(const void* ctx, std::int64_t begin, std::int64_t end) {
  const auto& body = *static_cast<const StatsBody<T>*>(ctx);
  for (std::int64_t t = begin; t < end; ++t) body.run_task(t);
}

#if defined(__CUDACC__)
constexpr int kStatsBlock = 256;

template <class T>
__global__ void __launch_bounds__(kStatsBlock) stats_kernel(StatsBody<T> body) {
  const std::int64_t t = blockIdx.x;
  const std::int64_t c = t / body.S, s = t - c * body.S;
  double a = 0, b = 0;
  body.walk(c, threadIdx.x, blockDim.x, s, a, b);
  __shared__ double sa[kStatsBlock / 32], sb[kStatsBlock / 32];
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_down_sync(0xffffffffu, a, o);
    b += __shfl_down_sync(0xffffffffu, b, o);
  }
  if (lane == 0) {
    sa[warp] = a;
    sb[warp] = b;
  }
  __syncthreads();
  if (warp == 0) {
    const bool live = lane < static_cast<int>(blockDim.x >> 5);
    a = live ? sa[lane] : 0.0;
    b = live ? sb[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) {
      a += __shfl_down_sync(0xffffffffu, a, o);
      b += __shfl_down_sync(0xffffffffu, b, o);
    }
    if (lane == 0) {
      body.partial[c * body.S + s] = a;
      body.partial[(body.C + c) * body.S + s] = b;
    }
  }
}

/// The same sums in columns for [N, C] data (detail::channel_columns): block (x, s) sums slice s of
/// the 32 channels 32 x + threadIdx.x, each row of threads every kColumnRows-th position, and the
/// rows' sums are added in row order.
template <class T>
__global__ void __launch_bounds__(32 * detail::kColumnRows) stats_columns_kernel(StatsBody<T> body) {
  constexpr int R = detail::kColumnRows;
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * 32 + threadIdx.x, s = blockIdx.y;
  const bool live = c < body.C;
  double a = 0, b = 0;
  if (live) body.walk(c, threadIdx.y, R, s, a, b);
  __shared__ double sa[R][32], sb[R][32];
  sa[threadIdx.y][threadIdx.x] = a;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y != 0 || !live) return;
  a = 0;
  b = 0;
  for (int r = 0; r < R; ++r) {
    a += sa[r][threadIdx.x];
    b += sb[r][threadIdx.x];
  }
  body.partial[c * body.S + s] = a;
  body.partial[(body.C + c) * body.S + s] = b;
}
#endif

/// mean, rstd from the partials; the running statistics updated in place (when given). x is stored
/// as X, the statistics as T (float32 for a 16-bit x).
template <class X, class T>
struct StatsFinish {
  const X* x;
  const double* partial;
  T* mean;
  T* rstd;
  T* running_mean;  ///< null: not tracked
  T* running_var;
  std::int64_t C, inner, M, S;
  double momentum, eps;
  DUALCAST_HD void operator()(std::int64_t c) const {
    double a = 0, b = 0;
    for (std::int64_t s = 0; s < S; ++s) {
      a += partial[c * S + s];
      b += partial[(C + c) * S + s];
    }
    const double m = static_cast<double>(M);
    const double d = a / m;
    double var = b / m - d * d;
    var = var > 0 ? var : 0.0;
    const double mu = static_cast<double>(x[c * inner]) + d;
    mean[c] = static_cast<T>(mu);
    rstd[c] = static_cast<T>(1.0 / ::sqrt(var + eps));
    if (running_mean)
      running_mean[c] = static_cast<T>((1.0 - momentum) * static_cast<double>(running_mean[c]) + momentum * mu);
    if (running_var)
      running_var[c] = static_cast<T>((1.0 - momentum) * static_cast<double>(running_var[c]) +
                                      momentum * var * m / (m - 1.0));
  }
};

/// rstd = 1 / sqrt(var + eps) of the running variance (evaluation).
template <class T>
struct RstdOf {
  const T* var;
  T* rstd;
  double eps;
  DUALCAST_HD void operator()(std::int64_t c) const {
    rstd[c] = static_cast<T>(1.0 / ::sqrt(static_cast<double>(var[c]) + eps));
  }
};

/// gx[i] (+)= a_c + b_c * x[i] with a_c = dmean/M + drstd * rstd^3 * mean / M and
/// b_c = -drstd * rstd^3 / M: the gradient through the batch's mean and rstd. x and gx are stored as
/// S, the statistics and their adjoints as T = compute_t<S>, in which the arithmetic runs.
template <class S, class T = compute_t<S>>
struct StatsBackward {
  const S* x;
  const T* dmean;  ///< null: no adjoint
  const T* drstd;
  const T* mean;
  const T* rstd;
  S* gx;
  bool accumulate;
  std::int64_t n, C, inner, M;
  bool vec;
  bool rows = false;  ///< inner == 1 (channels last): a chunk holds V consecutive channels
  static constexpr int V = cb_width<T>;

  DUALCAST_HD DUALCAST_INLINE void coefficients(std::int64_t c, T& a, T& b) const {
    const T inv_m = T(1) / static_cast<T>(M);
    const T dm = dmean ? dmean[c] : T(0);
    const T dr = drstd ? drstd[c] : T(0);
    const T r3 = rstd[c] * rstd[c] * rstd[c];
    b = -dr * r3 * inv_m;
    a = dm * inv_m - b * mean[c];
  }
  DUALCAST_HD void operator()(std::int64_t chunk) const {
    const std::int64_t base = chunk * V;
    if (vec) {
      const std::int64_t q = cb_div(base, inner);
      const std::int64_t c = q - cb_div(q, C) * C;
      // One channel's coefficients for the chunk, or with `rows` (channels last: V consecutive
      // channels of one row) each element's own.
      T a[V], b[V];
      coefficients(c, a[0], b[0]);
      DUALCAST_UNROLL
      for (int e = 1; e < V; ++e) {
        if (rows) {
          coefficients(c + e, a[e], b[e]);
        } else {
          a[e] = a[0];
          b[e] = b[0];
        }
      }
      const CbPacket<S, V> px = *reinterpret_cast<const CbPacket<S, V>*>(x + base);
      CbPacket<S, V> pg;
      if (accumulate) pg = *reinterpret_cast<const CbPacket<S, V>*>(gx + base);
      DUALCAST_UNROLL
      for (int e = 0; e < V; ++e)
        pg.v[e] = static_cast<S>((accumulate ? static_cast<T>(pg.v[e]) : T(0)) + a[e] + b[e] * static_cast<T>(px.v[e]));
      *reinterpret_cast<CbPacket<S, V>*>(gx + base) = pg;
      return;
    }
    for (int e = 0; e < V; ++e) {
      const std::int64_t i = base + e;
      if (i >= n) return;
      const std::int64_t q = cb_div(i, inner);
      const std::int64_t c = q - cb_div(q, C) * C;
      T a, b;
      coefficients(c, a, b);
      gx[i] = static_cast<S>((accumulate ? static_cast<T>(gx[i]) : T(0)) + a + b * static_cast<T>(x[i]));
    }
  }
};

bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

struct Geometry {
  std::int64_t N, C, inner, M;
};

Geometry check_stats_args(const Tensor& x, const Tensor& rm, const Tensor& rv, bool training,
                          double momentum, double eps) {
  const char* op = "batch_norm";
  check_defined(x, op, "x");
  DUALCAST_CHECK(is_floating(x.dtype()), op, ": x has unsupported dtype ", dtype_name(x.dtype()),
                 " (shape ", x.shape().str(), "; expected float32, float64, bfloat16 or float16)");
  DUALCAST_CHECK(x.rank() >= 2, op, ": x has shape ", x.shape().str(),
                 "; expected [N, C] or [N, C, H, W] (rank >= 2)");
  Geometry g{x.shape()[0], x.shape()[1], 1, 0};
  for (int d = 2; d < x.rank(); ++d) g.inner *= x.shape()[d];
  g.M = g.N * g.inner;
  auto check_stat = [&](const Tensor& t, const char* name) {
    if (!t.defined()) {
      DUALCAST_CHECK(training, op, ": '", name, "' is undefined; evaluation (training=false) "
                     "normalises with the running statistics, so they are required (x ",
                     x.shape().str(), ")");
      return;
    }
    DUALCAST_CHECK(t.rank() == 1 && t.shape()[0] == g.C, op, ": '", name, "' has shape ",
                   t.shape().str(), " but x ", x.shape().str(), " has ", g.C,
                   " channels (expected [", g.C, "])");
    // A 16-bit x keeps float32 running statistics (check_half_running_stats said so already).
    if (!is_half(x.dtype())) check_same_device_dtype(op, "x", x, name, t);
    DUALCAST_CHECK(t.device() == x.device(), op, ": '", name, "' is on ", t.device().str(), " but x ",
                   x.shape().str(), " is on ", x.device().str());
  };
  check_stat(rm, "running_mean");
  check_stat(rv, "running_var");
  DUALCAST_CHECK(std::isfinite(momentum) && momentum >= 0 && momentum <= 1, op, ": momentum ",
                 momentum, " is outside [0, 1] (x ", x.shape().str(), ")");
  DUALCAST_CHECK(std::isfinite(eps) && eps >= 0, op, ": eps ", eps, " must be a finite number >= 0");
  if (training)
    DUALCAST_CHECK(g.M > 1, op, ": expected more than 1 value per channel when training, got x of "
                   "shape ", x.shape().str());
  return g;
}

class StatsNode final : public Node {
 public:
  StatsNode(Tensor x, Tensor mean, Tensor rstd, Geometry g)
      : x_(std::move(x)), mean_(std::move(mean)), rstd_(std::move(rstd)), g_(g) {}
  [[nodiscard]] const char* name() const override { return "batch_norm_stats"; }
  void release_saved() override {
    x_ = Tensor();
    mean_ = Tensor();
    rstd_ = Tensor();
  }
  void backward(const std::vector<Tensor>& grad_outputs) override {
    const Tensor& dm = grad_outputs[0];
    const Tensor& dr = grad_outputs[1];
    if ((!dm.defined() && !dr.defined()) || !inputs[0]) return;
    VarState& in = *inputs[0];
    const bool in_place = in.grad.defined() && in.grad_owned;
    Tensor gx = in_place ? in.grad : Tensor::empty(x_.shape(), x_.dtype(), x_.device());
    const Tensor dmc = dm.defined() ? detail::contiguous_copy(dm) : Tensor();
    const Tensor drc = dr.defined() ? detail::contiguous_copy(dr) : Tensor();
    dispatch_floating_storage(x_.dtype(), "batch_norm backward", [&](auto tag) {
      using St = decltype(tag);  // x's storage type
      using T = compute_t<St>;
      StatsBackward<St> body{x_.data<St>(),
                            dmc.defined() ? dmc.template data<T>() : nullptr,
                            drc.defined() ? drc.template data<T>() : nullptr,
                            mean_.data<T>(),
                            rstd_.data<T>(),
                            gx.data<St>(),
                            in_place,
                            x_.numel(),
                            g_.C,
                            g_.inner,
                            g_.M,
                            false};
      constexpr int V = StatsBackward<St>::V;
      body.rows = g_.inner == 1;
      body.vec = (body.rows ? g_.C % V == 0 : g_.inner % V == 0) && aligned(body.x) && aligned(body.gx);
      parallel_for(x_.device(), (x_.numel() + V - 1) / V, body, kCpuGrain / V);
    });
    if (!in_place) detail::accumulate_grad(in, std::move(gx), /*owned=*/true);
  }

 private:
  Tensor x_, mean_, rstd_;
  Geometry g_;
};

}  // namespace
}  // namespace norm_detail

namespace norm_detail {
namespace {
/// The checks a 16-bit x adds: its running statistics are float32 (they are updated in place by the
/// float32 computation, and a 16-bit running average would stop moving once its updates fall below
/// one rounding step).
void check_half_running_stats(const Var& x, const Tensor& rm, const Tensor& rv) {
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"running_mean", &rm},
                                {"running_var", &rv}}) {
    if (!t->defined()) continue;
    DUALCAST_CHECK(t->dtype() == DType::float32, "batch_norm: '", name, "' ", t->shape().str(),
                   " has dtype ", dtype_name(t->dtype()), " but x ", x.shape().str(), " is ",
                   dtype_name(x.dtype()), "; a 16-bit x keeps float32 running statistics");
  }
}
}  // namespace
}  // namespace norm_detail

BatchNormStats batch_norm_stats(const Var& x, const Tensor& running_mean, const Tensor& running_var,
                                bool training, double momentum, double eps) {
  using namespace norm_detail;
  DUALCAST_CHECK(x.defined(), "batch_norm: argument 'x' is an undefined Var");
  // A 16-bit x is read as it is, summed in double like any other, and gives float32 statistics
  // (its running statistics are float32 too): no float32 copy of x is written.
  if (is_half(x.dtype())) check_half_running_stats(x, running_mean, running_var);
  const Geometry g = check_stats_args(x.value(), running_mean, running_var, training, momentum, eps);
  const Device dev = x.device();
  const DType dt = is_half(x.dtype()) ? DType::float32 : x.dtype();  // the statistics' dtype
  if (!training) {
    Tensor rstd = Tensor::empty(Shape{g.C}, dt, dev);
    dispatch_floating(dt, "batch_norm", [&](auto tag) {
      using T = decltype(tag);
      parallel_for(dev, g.C, RstdOf<T>{running_var.data<T>(), rstd.data<T>(), eps});
    });
    return {Var(running_mean), Var(std::move(rstd))};
  }
  const Tensor xv = detail::contiguous_copy(x.value());
  Tensor mean = Tensor::empty(Shape{g.C}, dt, dev);
  Tensor rstd = Tensor::empty(Shape{g.C}, dt, dev);
  const std::int64_t S = detail::channel_slices(dev, g.C, g.M, g.inner);
  Tensor partial = Tensor::empty(Shape{2 * g.C * S}, DType::float64, dev);
  dispatch_floating_storage(x.dtype(), "batch_norm", [&](auto tag) {
    using St = decltype(tag);  // x's storage type
    using T = compute_t<St>;
    StatsBody<St> body;
    body.x = xv.data<St>();
    body.partial = partial.data<double>();
    body.C = g.C;
    body.inner = g.inner;
    body.M = g.M;
    body.S = S;
    body.vec = g.inner % cb_width<St> == 0 && aligned(body.x);
    if (dev.is_cpu()) {
      detail::cpu_parallel_range(g.C * S, 1, &stats_tasks<St>, &body);
    } else {
#if defined(__CUDACC__)
      detail::DeviceGuard guard(dev);
      if (detail::channel_columns(g.C, g.inner)) {
        const dim3 grid(static_cast<unsigned>((g.C + 31) / 32), static_cast<unsigned>(S));
        stats_columns_kernel<St><<<grid, dim3(32, detail::kColumnRows), 0, detail::stream(dev)>>>(body);
      } else {
        stats_kernel<St><<<static_cast<unsigned>(g.C * S), kStatsBlock, 0, detail::stream(dev)>>>(body);
      }
      DUALCAST_CUDA_CHECK_LAUNCH();
#else
      DUALCAST_FAIL("batch_norm on ", dev.str(), ": dualcast was built without its CUDA backend");
#endif
    }
    StatsFinish<St, T> fin{body.x,
                       body.partial,
                       mean.data<T>(),
                       rstd.data<T>(),
                       running_mean.defined() ? running_mean.data<T>() : nullptr,
                       running_var.defined() ? running_var.data<T>() : nullptr,
                       g.C,
                       g.inner,
                       g.M,
                       S,
                       momentum,
                       eps};
    parallel_for(dev, g.C, fin);
  });
  std::shared_ptr<StatsNode> node;
  if (detail::any_requires_grad({x})) node = std::make_shared<StatsNode>(xv, mean, rstd, g);
  std::vector<Var> out = detail::record(std::move(node), {x}, {mean, rstd});
  return {out[0], out[1]};
}

Var batch_norm(const Var& x, const Var& gamma, const Var& beta, const Tensor& running_mean,
               const Tensor& running_var, bool training, double momentum, double eps) {
  DUALCAST_CHECK(x.defined() && gamma.defined() && beta.defined(), "batch_norm: argument '",
                 !x.defined() ? "x" : (!gamma.defined() ? "gamma" : "beta"), "' is an undefined Var");
  DUALCAST_CHECK(x.shape().rank() >= 2, "batch_norm: x has shape ", x.shape().str(),
                 "; expected [N, C] or [N, C, H, W] (rank >= 2)");
  const std::int64_t C = x.shape()[1];
  const bool half = is_half(x.dtype());
  for (const auto& [name, v] : {std::pair<const char*, const Var*>{"gamma", &gamma}, {"beta", &beta}}) {
    DUALCAST_CHECK(v->shape().rank() == 1 && v->shape()[0] == C, "batch_norm: '", name, "' has shape ",
                   v->shape().str(), " but x ", x.shape().str(), " has ", C,
                   " channels (expected [", C, "])");
    detail::check_parameter_of_half("batch_norm", x.value(), name, v->value());
  }
  if (half) {
    norm_detail::check_half_running_stats(x, running_mean, running_var);
    return cast(batch_norm(cast(x, DType::float32), cast(gamma, DType::float32),
                           cast(beta, DType::float32), running_mean, running_var, training,
                           momentum, eps),
                x.dtype());
  }
  const BatchNormStats st = batch_norm_stats(x, running_mean, running_var, training, momentum, eps);
  return channel_broadcast(BatchNormApply{}, x, st.mean, st.rstd, gamma, beta);
}

}  // namespace dualcast
