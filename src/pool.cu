// pool.cu: max, average and adaptive average pooling (forward: a thread per output; backward: a
// thread per input element gathering from the windows that contain it) and flatten. 16-bit tensors
// are read and written directly, windows accumulated in float (compute_t).
#include "dualcast/ops/pool.hpp"

#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "dualcast/error.hpp"
#include "dualcast/ops/reduce.hpp"
#include "dualcast/ops/shape.hpp"
#include "dualcast/parallel.hpp"

namespace dualcast {

namespace pool_detail {
namespace {

DUALCAST_HD DUALCAST_INLINE std::int64_t div64(std::int64_t a, std::int64_t b) {
  if (a < 0x7fffffff && b < 0x7fffffff)
    return static_cast<std::int64_t>(static_cast<std::uint32_t>(a) / static_cast<std::uint32_t>(b));
  return a / b;
}

enum class Kind { max, avg, adaptive };

const char* op_name(Kind k) {
  return k == Kind::max ? "max_pool2d" : (k == Kind::avg ? "avg_pool2d" : "adaptive_avg_pool2d");
}

struct PoolGeometry {
  std::int64_t NC = 0, H = 0, W = 0, OH = 0, OW = 0;
  std::int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0;
  bool include_pad = true;
};

/// Checks x and returns the input half of its geometry: N*C planes of H x W.
PoolGeometry input_geometry(const Tensor& x, Kind k) {
  const char* op = op_name(k);
  check_defined(x, op, "x");
  DUALCAST_CHECK(x.rank() == 4, op, ": x must be a 4-D [N, C, H, W] tensor, got shape ",
                 x.shape().str(), " (rank ", x.rank(), ")");
  DUALCAST_CHECK(is_floating(x.dtype()), op, ": unsupported dtype ", dtype_name(x.dtype()),
                 " of x ", x.shape().str(), " (expected float32, float64, bfloat16 or float16)");
  const Shape& s = x.shape();
  PoolGeometry g;
  g.NC = s[0] * s[1];
  g.H = s[2];
  g.W = s[3];
  return g;
}

PoolGeometry window_geometry(const Tensor& x, Kind k, Size2 kernel, Size2 stride, Size2 padding,
                             bool include_pad) {
  PoolGeometry g = input_geometry(x, k);
  const char* op = op_name(k);
  const Shape& s = x.shape();
  DUALCAST_CHECK(kernel.h >= 1 && kernel.w >= 1, op, ": kernel ", kernel.str(),
                 " must be >= 1 in both dimensions (x ", s.str(), ")");
  DUALCAST_CHECK(stride.h >= 1 && stride.w >= 1, op, ": stride ", stride.str(),
                 " must be >= 1 in both dimensions (x ", s.str(), ", kernel ", kernel.str(), ")");
  DUALCAST_CHECK(padding.h >= 0 && padding.w >= 0 && 2 * padding.h <= kernel.h &&
                     2 * padding.w <= kernel.w,
                 op, ": padding ", padding.str(), " must be >= 0 and at most half the kernel ",
                 kernel.str(), " (x ", s.str(), ")");
  g.kh = kernel.h;
  g.kw = kernel.w;
  g.sh = stride.h;
  g.sw = stride.w;
  g.ph = padding.h;
  g.pw = padding.w;
  g.include_pad = include_pad;
  DUALCAST_CHECK(g.kh <= g.H + 2 * g.ph && g.kw <= g.W + 2 * g.pw, op, ": the kernel ",
                 kernel.str(), " is larger than the padded input ", g.H + 2 * g.ph, "x",
                 g.W + 2 * g.pw, " (x ", s.str(), ", padding ", padding.str(), ")");
  g.OH = (g.H + 2 * g.ph - g.kh) / g.sh + 1;
  g.OW = (g.W + 2 * g.pw - g.kw) / g.sw + 1;
  return g;
}

PoolGeometry adaptive_geometry(const Tensor& x, Size2 output) {
  PoolGeometry g = input_geometry(x, Kind::adaptive);
  const Shape& s = x.shape();
  DUALCAST_CHECK(output.h >= 1 && output.w >= 1, "adaptive_avg_pool2d: output size ", output.str(),
                 " must be >= 1 in both dimensions (x ", s.str(), ")");
  DUALCAST_CHECK(s[2] >= 1 && s[3] >= 1, "adaptive_avg_pool2d: x ", s.str(),
                 " has an empty spatial dimension");
  g.OH = output.h;
  g.OW = output.w;
  return g;
}

/// Window [start, end) of output o along a dimension of `in` inputs split into `out` parts.
DUALCAST_HD DUALCAST_INLINE std::int64_t adaptive_start(std::int64_t o, std::int64_t in, std::int64_t out) {
  return div64(o * in, out);
}
DUALCAST_HD DUALCAST_INLINE std::int64_t adaptive_end(std::int64_t o, std::int64_t in, std::int64_t out) {
  return div64((o + 1) * in + out - 1, out);
}

/// Element i of an [NC, n1, n2] tensor as (plane nc, i1, i2).
DUALCAST_HD DUALCAST_INLINE void split_plane_index(std::int64_t i, std::int64_t n1, std::int64_t n2,
                                                   std::int64_t& nc, std::int64_t& i1, std::int64_t& i2) {
  const std::int64_t t = div64(i, n2);
  i2 = i - t * n2;
  nc = div64(t, n1);
  i1 = t - nc * n1;
}

/// The window of output (oh, ow) clipped to the input: rows [h0, h1), columns [w0, w1).
DUALCAST_HD DUALCAST_INLINE void clipped_window(const PoolGeometry& g, std::int64_t oh, std::int64_t ow,
                                                std::int64_t& h0, std::int64_t& h1, std::int64_t& w0,
                                                std::int64_t& w1) {
  h0 = oh * g.sh - g.ph;
  w0 = ow * g.sw - g.pw;
  h1 = h0 + g.kh < g.H ? h0 + g.kh : g.H;
  w1 = w0 + g.kw < g.W ? w0 + g.kw : g.W;
  h0 = h0 < 0 ? 0 : h0;
  w0 = w0 < 0 ? 0 : w0;
}

template <class T>
struct MaxForward {
  const T* x;
  T* y;
  std::int32_t* arg;
  PoolGeometry g;
  DUALCAST_HD void operator()(std::int64_t i) const {
    std::int64_t nc, oh, ow, h0, h1, w0, w1;
    split_plane_index(i, g.OH, g.OW, nc, oh, ow);
    clipped_window(g, oh, ow, h0, h1, w0, w1);
    using C = compute_t<T>;
    const T* plane = x + nc * g.H * g.W;
    std::int64_t best_at = h0 * g.W + w0;
    C best = -std::numeric_limits<C>::infinity();
    for (std::int64_t h = h0; h < h1; ++h)
      for (std::int64_t w = w0; w < w1; ++w) {
        const C v = static_cast<C>(plane[h * g.W + w]);
        if (v > best || v != v) {  // first maximum; a NaN wins
          best = v;
          best_at = h * g.W + w;
        }
      }
    y[i] = static_cast<T>(best);
    arg[i] = static_cast<std::int32_t>(best_at);
  }
};

/// Outputs whose window contains input position ih: [lo, hi] (empty when lo > hi).
DUALCAST_HD DUALCAST_INLINE void window_range(std::int64_t i, std::int64_t p, std::int64_t k,
                                              std::int64_t s, std::int64_t n_out, std::int64_t& lo,
                                              std::int64_t& hi) {
  const std::int64_t a = i + p - k + 1;  // o * s >= a
  lo = a <= 0 ? 0 : div64(a + s - 1, s);
  hi = div64(i + p, s);
  hi = hi < n_out - 1 ? hi : n_out - 1;
}

template <class T>
struct MaxBackward {
  const T* gy;
  const std::int32_t* arg;
  T* gx;
  PoolGeometry g;
  bool accumulate;
  DUALCAST_HD void operator()(std::int64_t i) const {
    std::int64_t nc, ih, iw, oh0, oh1, ow0, ow1;
    split_plane_index(i, g.H, g.W, nc, ih, iw);
    window_range(ih, g.ph, g.kh, g.sh, g.OH, oh0, oh1);
    window_range(iw, g.pw, g.kw, g.sw, g.OW, ow0, ow1);
    const auto me = static_cast<std::int32_t>(ih * g.W + iw);
    using C = compute_t<T>;
    const std::int64_t base = nc * g.OH * g.OW;
    C acc = C(0);
    for (std::int64_t oh = oh0; oh <= oh1; ++oh)
      for (std::int64_t ow = ow0; ow <= ow1; ++ow) {
        const std::int64_t o = base + oh * g.OW + ow;
        if (arg[o] == me) acc += static_cast<C>(gy[o]);
      }
    gx[i] = static_cast<T>((accumulate ? static_cast<C>(gx[i]) : C(0)) + acc);
  }
};

template <class T>
struct AvgForward {
  const T* x;
  T* y;
  PoolGeometry g;
  bool adaptive;
  DUALCAST_HD void operator()(std::int64_t i) const {
    std::int64_t nc, oh, ow, h0, h1, w0, w1, divisor;
    split_plane_index(i, g.OH, g.OW, nc, oh, ow);
    if (adaptive) {
      h0 = adaptive_start(oh, g.H, g.OH);
      h1 = adaptive_end(oh, g.H, g.OH);
      w0 = adaptive_start(ow, g.W, g.OW);
      w1 = adaptive_end(ow, g.W, g.OW);
      divisor = (h1 - h0) * (w1 - w0);
    } else {
      clipped_window(g, oh, ow, h0, h1, w0, w1);
      divisor = g.include_pad ? g.kh * g.kw : (h1 - h0) * (w1 - w0);
    }
    using C = compute_t<T>;
    const T* plane = x + nc * g.H * g.W;
    C acc = C(0);
    for (std::int64_t h = h0; h < h1; ++h)
      for (std::int64_t w = w0; w < w1; ++w) acc += static_cast<C>(plane[h * g.W + w]);
    y[i] = static_cast<T>(acc / static_cast<C>(divisor));
  }
};

template <class T>
struct AvgBackward {
  const T* gy;
  T* gx;
  PoolGeometry g;
  bool adaptive;
  bool accumulate;
  DUALCAST_HD void operator()(std::int64_t i) const {
    std::int64_t nc, ih, iw;
    split_plane_index(i, g.H, g.W, nc, ih, iw);
    using C = compute_t<T>;
    const std::int64_t base = nc * g.OH * g.OW;
    C acc = C(0);
    if (adaptive) {
      const std::int64_t oh0 = div64(ih * g.OH, g.H), ow0 = div64(iw * g.OW, g.W);
      for (std::int64_t oh = oh0; oh < g.OH && adaptive_start(oh, g.H, g.OH) <= ih; ++oh) {
        const std::int64_t h0 = adaptive_start(oh, g.H, g.OH), h1 = adaptive_end(oh, g.H, g.OH);
        if (ih < h0 || ih >= h1) continue;
        for (std::int64_t ow = ow0; ow < g.OW && adaptive_start(ow, g.W, g.OW) <= iw; ++ow) {
          const std::int64_t w0 = adaptive_start(ow, g.W, g.OW), w1 = adaptive_end(ow, g.W, g.OW);
          if (iw < w0 || iw >= w1) continue;
          acc += static_cast<C>(gy[base + oh * g.OW + ow]) / static_cast<C>((h1 - h0) * (w1 - w0));
        }
      }
    } else {
      std::int64_t oh0, oh1, ow0, ow1;
      window_range(ih, g.ph, g.kh, g.sh, g.OH, oh0, oh1);
      window_range(iw, g.pw, g.kw, g.sw, g.OW, ow0, ow1);
      for (std::int64_t oh = oh0; oh <= oh1; ++oh)
        for (std::int64_t ow = ow0; ow <= ow1; ++ow) {
          std::int64_t divisor = g.kh * g.kw;
          if (!g.include_pad) {
            std::int64_t h0, h1, w0, w1;
            clipped_window(g, oh, ow, h0, h1, w0, w1);
            divisor = (h1 - h0) * (w1 - w0);
          }
          acc += static_cast<C>(gy[base + oh * g.OW + ow]) / static_cast<C>(divisor);
        }
    }
    gx[i] = static_cast<T>((accumulate ? static_cast<C>(gx[i]) : C(0)) + acc);
  }
};

Shape out_shape(const Tensor& x, const PoolGeometry& g) {
  return Shape{x.shape()[0], x.shape()[1], g.OH, g.OW};
}

/// The input's gradient buffer: its own (added to in place) when it holds one, else a new one.
struct GradTarget {
  Tensor buffer;
  bool accumulate = false;
};
GradTarget grad_target(VarState& in, const Shape& shape, DType dt, Device d) {
  if (in.grad.defined() && in.grad_owned) return {in.grad, true};
  return {Tensor::empty(shape, dt, d), false};
}
void finish_grad(VarState& in, GradTarget& t) {
  if (!t.accumulate) detail::accumulate_grad(in, std::move(t.buffer), /*owned=*/true);
}

class MaxPoolNode final : public Node {
 public:
  MaxPoolNode(Tensor arg, Shape in_shape, DType dt, PoolGeometry g)
      : arg_(std::move(arg)), in_shape_(in_shape), dt_(dt), g_(g) {}
  [[nodiscard]] const char* name() const override { return "max_pool2d"; }
  void release_saved() override { arg_ = Tensor(); }
  void backward(const std::vector<Tensor>& grad_outputs) override {
    if (!grad_outputs[0].defined() || !inputs[0]) return;
    const Tensor gy = detail::contiguous_copy(grad_outputs[0]);
    GradTarget t = grad_target(*inputs[0], in_shape_, dt_, gy.device());
    const auto* arg = static_cast<const std::int32_t*>(arg_.raw_data());
    dispatch_floating_storage(dt_, "max_pool2d backward", [&](auto tag) {
      using T = decltype(tag);
      parallel_for(gy.device(), in_shape_.numel(),
                   MaxBackward<T>{gy.data<T>(), arg, t.buffer.data<T>(), g_, t.accumulate});
    });
    finish_grad(*inputs[0], t);
  }

 private:
  Tensor arg_;  ///< int32 positions within the input plane, in a uint8 tensor of 4 bytes each
  Shape in_shape_;
  DType dt_;
  PoolGeometry g_;
};

class AvgPoolNode final : public Node {
 public:
  AvgPoolNode(Kind kind, Shape in_shape, DType dt, PoolGeometry g)
      : kind_(kind), in_shape_(in_shape), dt_(dt), g_(g) {}
  [[nodiscard]] const char* name() const override { return op_name(kind_); }
  void backward(const std::vector<Tensor>& grad_outputs) override {
    if (!grad_outputs[0].defined() || !inputs[0]) return;
    const Tensor gy = detail::contiguous_copy(grad_outputs[0]);
    GradTarget t = grad_target(*inputs[0], in_shape_, dt_, gy.device());
    dispatch_floating_storage(dt_, "avg_pool2d backward", [&](auto tag) {
      using T = decltype(tag);
      parallel_for(gy.device(), in_shape_.numel(),
                   AvgBackward<T>{gy.data<T>(), t.buffer.data<T>(), g_, kind_ == Kind::adaptive,
                                  t.accumulate});
    });
    finish_grad(*inputs[0], t);
  }

 private:
  Kind kind_;
  Shape in_shape_;
  DType dt_;
  PoolGeometry g_;
};

struct MaxResult {
  Tensor y;
  Tensor arg;
};

MaxResult max_forward(const Tensor& x0, const PoolGeometry& g) {
  const Tensor x = detail::contiguous_copy(x0);
  DUALCAST_CHECK(g.H * g.W <= 0x7fffffff, "max_pool2d: an input plane of ", g.H, "x", g.W,
                 " is too large for 32-bit positions");
  MaxResult r;
  r.y = Tensor::empty(out_shape(x, g), x.dtype(), x.device());
  r.arg = Tensor::empty(Shape{4 * r.y.numel()}, DType::uint8, x.device());
  auto* arg = static_cast<std::int32_t*>(r.arg.raw_data());
  dispatch_floating_storage(x.dtype(), "max_pool2d", [&](auto tag) {
    using T = decltype(tag);
    parallel_for(x.device(), r.y.numel(), MaxForward<T>{x.data<T>(), r.y.data<T>(), arg, g});
  });
  return r;
}

Tensor avg_forward(const Tensor& x0, const PoolGeometry& g, bool adaptive) {
  const Tensor x = detail::contiguous_copy(x0);
  Tensor y = Tensor::empty(out_shape(x, g), x.dtype(), x.device());
  dispatch_floating_storage(x.dtype(), adaptive ? "adaptive_avg_pool2d" : "avg_pool2d", [&](auto tag) {
    using T = decltype(tag);
    parallel_for(x.device(), y.numel(), AvgForward<T>{x.data<T>(), y.data<T>(), g, adaptive});
  });
  return y;
}

Var record_avg(const Var& x, Kind kind, const PoolGeometry& g) {
  Tensor y = avg_forward(x.value(), g, kind == Kind::adaptive);
  std::shared_ptr<Node> node;
  if (detail::any_requires_grad({x})) node = std::make_shared<AvgPoolNode>(kind, x.shape(), x.dtype(), g);
  return detail::record1(std::move(node), {x}, std::move(y));
}

Var undefined_check(const Var& x, Kind k) {
  DUALCAST_CHECK(x.defined(), op_name(k), ": argument 'x' is an undefined Var");
  return x;
}

}  // namespace
}  // namespace pool_detail

using pool_detail::Kind;

Var max_pool2d(const Var& x, Size2 kernel, Size2 stride, Size2 padding) {
  pool_detail::undefined_check(x, Kind::max);
  const auto g = pool_detail::window_geometry(x.value(), Kind::max, kernel, stride, padding, true);
  pool_detail::MaxResult r = pool_detail::max_forward(x.value(), g);
  std::shared_ptr<Node> node;
  if (detail::any_requires_grad({x}))
    node = std::make_shared<pool_detail::MaxPoolNode>(std::move(r.arg), x.shape(), x.dtype(), g);
  return detail::record1(std::move(node), {x}, std::move(r.y));
}
Var max_pool2d(const Var& x, Size2 kernel) { return max_pool2d(x, kernel, kernel, Size2(0)); }
Tensor max_pool2d(const Tensor& x, Size2 kernel, Size2 stride, Size2 padding) {
  const auto g = pool_detail::window_geometry(x, Kind::max, kernel, stride, padding, true);
  return pool_detail::max_forward(x, g).y;
}

Tensor max_pool2d(const Tensor& x, Size2 kernel) { return max_pool2d(x, kernel, kernel, Size2(0)); }

Var avg_pool2d(const Var& x, Size2 kernel, Size2 stride, Size2 padding, bool count_include_pad) {
  pool_detail::undefined_check(x, Kind::avg);
  const auto g = pool_detail::window_geometry(x.value(), Kind::avg, kernel, stride, padding,
                                              count_include_pad);
  return pool_detail::record_avg(x, Kind::avg, g);
}
Var avg_pool2d(const Var& x, Size2 kernel) { return avg_pool2d(x, kernel, kernel, Size2(0), true); }
Tensor avg_pool2d(const Tensor& x, Size2 kernel, Size2 stride, Size2 padding, bool count_include_pad) {
  const auto g = pool_detail::window_geometry(x, Kind::avg, kernel, stride, padding, count_include_pad);
  return pool_detail::avg_forward(x, g, false);
}

Tensor avg_pool2d(const Tensor& x, Size2 kernel) { return avg_pool2d(x, kernel, kernel, Size2(0), true); }

Var adaptive_avg_pool2d(const Var& x, Size2 output) {
  pool_detail::undefined_check(x, Kind::adaptive);
  return pool_detail::record_avg(x, Kind::adaptive, pool_detail::adaptive_geometry(x.value(), output));
}
Tensor adaptive_avg_pool2d(const Tensor& x, Size2 output) {
  return pool_detail::avg_forward(x, pool_detail::adaptive_geometry(x, output), true);
}

namespace {
std::vector<std::int64_t> flat_shape(const Shape& s, int start_dim, int end_dim) {
  if (s.rank() == 0) return {1};
  const int a = normalize_axis("flatten", start_dim, s);
  const int b = normalize_axis("flatten", end_dim, s);
  DUALCAST_CHECK(a <= b, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim,
                 " for shape ", s.str());
  std::vector<std::int64_t> out;
  for (int d = 0; d < a; ++d) out.push_back(s[d]);
  std::int64_t merged = 1;
  for (int d = a; d <= b; ++d) merged *= s[d];
  out.push_back(merged);
  for (int d = b + 1; d < s.rank(); ++d) out.push_back(s[d]);
  return out;
}
}  // namespace

Var flatten(const Var& x, int start_dim, int end_dim) {
  DUALCAST_CHECK(x.defined(), "flatten: argument 'x' is an undefined Var");
  return reshape(x, flat_shape(x.shape(), start_dim, end_dim));
}
Tensor flatten(const Tensor& x, int start_dim, int end_dim) {
  check_defined(x, "flatten", "x");
  return reshape(x, flat_shape(x.shape(), start_dim, end_dim));
}

}  // namespace dualcast
