// conv.cu: conv2d on the tape: argument checks, the backend choice, the tape node, and the im2col +
// GEMM implementation that the CPU always uses and CUDA devices use without cuDNN (or with
// DUALCAST_CONV=gemm). The cuDNN backend is conv_cudnn.cpp.
//
// im2col + GEMM, for a chunk of nb samples starting at b0 (chunks bound the buffers), with one GEMM
// per group over all nb * OH * OW columns (a GEMM per sample would be too small to run well):
//   cols [C*KH*KW, nb*OH*OW]: row (c, kh, kw), column (b, oh, ow) holds x[b0+b, c, ih, iw] or 0
//   rows [O, nb*OH*OW]: the chunk's output (or output gradient) with the channel outermost
//   forward   rows[g] = W[g] [Og, Cg*KH*KW] x cols[g], scattered to y (NCHW)
//   dw        dW[g] += rows[g] x cols[g]^T, with rows = dy of the chunk
//   dx        dcols[g] = W[g]^T x rows[g]; dx gathers every column entry that read it (col2im)
// Row (c, kh, kw) with c = g * Cg + j puts each group's rows in one contiguous block of cols. On the
// CPU, im2col, col2im and the row copies run per plane on dualcast's thread pool with contiguous
// inner loops; the BLAS calls are made outside the pool.
//
// Channels last (ConvLayout::nhwc): cuDNN takes it directly (NHWC descriptors, conv_cudnn.cpp); the
// im2col + GEMM code and float64 see the NCHW convolution between permutes (the entry points).
//
// 16-bit dtypes (bfloat16, float16): cuDNN convolves them directly (float32 compute); im2col + GEMM
// does not, so there the entry points convolve float32 copies on the tape (cast(), like
// detail::via_float32) and round the result. Under Autocast the entry points first cast float32
// operands to the autocast dtype.
#include "dualcast/ops/conv.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "blas.hpp"
#include "conv_impl.hpp"
#include "dualcast/error.hpp"
#include "dualcast/ops/cast.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "dualcast/ops/reduce.hpp"
#include "dualcast/ops/shape.hpp"
#include "dualcast/parallel.hpp"
#include "dualcast/precision.hpp"

namespace dualcast {

std::string Size2::str() const { return detail::concat("(", h, ", ", w, ")"); }

namespace conv_detail {
namespace {

using detail::ConvGeometry;

// ---- backend choice -----------------------------------------------------------------------------

ConvBackend backend_from_env() {
  const char* env = std::getenv("DUALCAST_CONV");
  if (env && std::strcmp(env, "gemm") == 0) return ConvBackend::gemm;
  if (env && std::strcmp(env, "cudnn") == 0) return ConvBackend::cudnn;
  return ConvBackend::automatic;
}

std::atomic<int>& backend_state() {
  static std::atomic<int> state{static_cast<int>(backend_from_env())};
  return state;
}

bool use_cudnn(Device device) {
  if (device.is_cpu()) return false;
  switch (conv_backend()) {
    case ConvBackend::gemm: return false;
    case ConvBackend::cudnn: return true;  // an Error at the call when the build has no cuDNN
    default: return detail::cudnn_compiled();
  }
}

// ---- checks -------------------------------------------------------------------------------------

ConvGeometry geometry_of(const Shape& xs, const Shape& ws, const Conv2dOptions& o) {
  const bool nhwc = o.layout == ConvLayout::nhwc;
  const std::string shapes = detail::concat(" (x ", xs.str(), ", w ", ws.str(), nhwc ? ", layout nhwc)" : ")");
  DUALCAST_CHECK(xs.rank() == 4, "conv2d: x must be a 4-D ", nhwc ? "[N, H, W, C]" : "[N, C, H, W]",
                 " tensor, got shape ", xs.str(), " (rank ", xs.rank(), ") with w ", ws.str());
  DUALCAST_CHECK(ws.rank() == 4, "conv2d: w must be a 4-D ", nhwc ? "[O, KH, KW, C/groups]" : "[O, C/groups, KH, KW]",
                 " tensor, got shape ", ws.str(), " (rank ", ws.rank(), ") with x ", xs.str());
  DUALCAST_CHECK(o.layout == ConvLayout::nchw || nhwc, "conv2d: unknown layout ", static_cast<int>(o.layout),
                 shapes);
  DUALCAST_CHECK(o.groups >= 1, "conv2d: groups = ", o.groups, " must be >= 1", shapes);
  DUALCAST_CHECK(o.stride.h >= 1 && o.stride.w >= 1, "conv2d: stride ", o.stride.str(),
                 " must be >= 1 in both dimensions", shapes);
  DUALCAST_CHECK(o.dilation.h >= 1 && o.dilation.w >= 1, "conv2d: dilation ", o.dilation.str(),
                 " must be >= 1 in both dimensions", shapes);
  DUALCAST_CHECK(o.padding.h >= 0 && o.padding.w >= 0, "conv2d: padding ", o.padding.str(),
                 " must be >= 0 in both dimensions", shapes);
  ConvGeometry g;
  g.nhwc = nhwc;
  // Every size read in NCHW terms: channels at 3 (x) and 3 (w) in nhwc, at 1 in nchw.
  const int xc = nhwc ? 3 : 1, xh = nhwc ? 1 : 2, xw = nhwc ? 2 : 3;
  const int wc = nhwc ? 3 : 1, wh = nhwc ? 1 : 2, ww = nhwc ? 2 : 3;
  g.N = xs[0];
  g.C = xs[xc];
  g.H = xs[xh];
  g.W = xs[xw];
  g.O = ws[0];
  g.KH = ws[wh];
  g.KW = ws[ww];
  g.sh = o.stride.h;
  g.sw = o.stride.w;
  g.ph = o.padding.h;
  g.pw = o.padding.w;
  g.dh = o.dilation.h;
  g.dw = o.dilation.w;
  g.groups = o.groups;
  DUALCAST_CHECK(g.C >= 1 && g.O >= 1 && g.KH >= 1 && g.KW >= 1 && ws[wc] >= 1,
                 "conv2d: empty channel or kernel dimension", shapes);
  DUALCAST_CHECK(g.C % g.groups == 0, "conv2d: group mismatch: x has C = ", g.C,
                 " channels, which groups = ", g.groups, " does not divide", shapes);
  DUALCAST_CHECK(g.O % g.groups == 0, "conv2d: group mismatch: w has O = ", g.O,
                 " output channels, which groups = ", g.groups, " does not divide", shapes);
  DUALCAST_CHECK(ws[wc] * g.groups == g.C, "conv2d: channel mismatch: x has C = ", g.C,
                 " channels but w expects C/groups = ", ws[wc], " per group x groups = ", g.groups,
                 " = ", ws[wc] * g.groups, shapes);
  const std::int64_t eh = g.dh * (g.KH - 1) + 1, ew = g.dw * (g.KW - 1) + 1;
  DUALCAST_CHECK(eh <= g.H + 2 * g.ph && ew <= g.W + 2 * g.pw, "conv2d: the kernel ", g.KH, "x",
                 g.KW, " (dilation ", o.dilation.str(), ": ", eh, "x", ew,
                 ") is larger than the padded input ", g.H + 2 * g.ph, "x", g.W + 2 * g.pw,
                 " (padding ", o.padding.str(), ")", shapes);
  g.OH = (g.H + 2 * g.ph - eh) / g.sh + 1;
  g.OW = (g.W + 2 * g.pw - ew) / g.sw + 1;
  return g;
}

ConvGeometry check_conv(const Tensor& x, const Tensor& w, const Conv2dOptions& o) {
  check_defined(x, "conv2d", "x");
  check_defined(w, "conv2d", "w");
  const ConvGeometry g = geometry_of(x.shape(), w.shape(), o);
  check_same_device_dtype("conv2d", "x", x, "w", w);
  DUALCAST_CHECK(is_floating(x.dtype()), "conv2d: unsupported dtype ", dtype_name(x.dtype()),
                 " (x ", x.shape().str(), ", w ", w.shape().str(),
                 "; expected float32, float64, bfloat16 or float16)");
  return g;
}

/// Whether a checked convolution of this dtype must run on float32 copies: 16-bit data where the
/// backend is im2col + GEMM, whose kernels and CPU loops compute in the element type.
bool via_float32(const Tensor& x) { return is_half(x.dtype()) && !use_cudnn(x.device()); }

/// Whether a checked nhwc convolution runs as the NCHW one between permutes (ops/conv.hpp): where
/// cuDNN does not run it (the CPU, im2col + GEMM), in float64, whose NHWC support in cuDNN is not
/// documented for every algorithm (float64 is for accuracy, not speed), and where cuDNN lists no
/// NHWC algorithm that dualcast's rule accepts for the geometry (recorded in conv_algorithms_chosen).
bool nhwc_via_permutes(const ConvGeometry& g, const Tensor& x) {
  if (!g.nhwc) return false;
  if (g.N == 0) return false;  // nothing runs (forward and backward return first); cuDNN refuses N = 0
  if (!use_cudnn(x.device()) || x.dtype() == DType::float64) return true;
  return detail::cudnn_compiled() && !detail::cudnn_conv_nhwc_supported(x.device(), x.dtype(), g);
}

/// The options of the NCHW convolution an nhwc one runs as, and the permutes around it.
Conv2dOptions as_nchw(Conv2dOptions o) {
  o.layout = ConvLayout::nchw;
  return o;
}
const std::vector<int> kToNchw{0, 3, 1, 2};
const std::vector<int> kToNhwc{0, 2, 3, 1};

/// y's shape, and x's and w's, in the geometry's layout.
Shape output_shape(const ConvGeometry& g) { return g.nhwc ? Shape{g.N, g.OH, g.OW, g.O} : Shape{g.N, g.O, g.OH, g.OW}; }
Shape input_shape(const ConvGeometry& g) { return g.nhwc ? Shape{g.N, g.H, g.W, g.C} : Shape{g.N, g.C, g.H, g.W}; }
Shape weight_shape(const ConvGeometry& g) {
  return g.nhwc ? Shape{g.O, g.KH, g.KW, g.Cg()} : Shape{g.O, g.Cg(), g.KH, g.KW};
}

// ---- im2col + GEMM ------------------------------------------------------------------------------

DUALCAST_HD DUALCAST_INLINE std::int64_t div64(std::int64_t a, std::int64_t b) {
  if (a < 0x7fffffff && b < 0x7fffffff)
    return static_cast<std::int64_t>(static_cast<std::uint32_t>(a) / static_cast<std::uint32_t>(b));
  return a / b;
}

// Each step of a chunk is one functor: per element on a GPU (operator(); index arithmetic per
// element), per plane on the CPU (cpu_task; contiguous inner loops with the arithmetic hoisted,
// since the per-element form spends its time dividing). run_step picks the form.

/// cols[row, col] for the chunk [b0, b0 + nb): row (c, kh, kw), col (b, oh, ow). CPU task (c, b):
/// the KH*KW rows of channel c for sample b, a row segment of OH*OW at a time.
template <class T>
struct Im2col {
  const T* x;
  T* cols;
  ConvGeometry g;
  std::int64_t b0, nb;
  DUALCAST_HD void operator()(std::int64_t i) const {
    const std::int64_t L = nb * g.OH * g.OW;
    const std::int64_t row = div64(i, L), col = i - row * L;
    const std::int64_t b = div64(col, g.OH * g.OW), p = col - b * g.OH * g.OW;
    const std::int64_t oh = div64(p, g.OW), ow = p - oh * g.OW;
    const std::int64_t t = div64(row, g.KW), kw = row - t * g.KW;
    const std::int64_t c = div64(t, g.KH), kh = t - c * g.KH;
    const std::int64_t ih = oh * g.sh - g.ph + kh * g.dh, iw = ow * g.sw - g.pw + kw * g.dw;
    cols[i] = (ih >= 0 && ih < g.H && iw >= 0 && iw < g.W)
                  ? x[((b0 + b) * g.C + c) * g.H * g.W + ih * g.W + iw]
                  : T(0);
  }
  void cpu_task(std::int64_t task) const {
    const std::int64_t c = task / nb, b = task - c * nb;
    const std::int64_t L = nb * g.OH * g.OW;
    const T* plane = x + ((b0 + b) * g.C + c) * g.H * g.W;
    for (std::int64_t kh = 0; kh < g.KH; ++kh)
      for (std::int64_t kw = 0; kw < g.KW; ++kw) {
        T* row = cols + ((c * g.KH + kh) * g.KW + kw) * L + b * g.OH * g.OW;
        for (std::int64_t oh = 0; oh < g.OH; ++oh) {
          const std::int64_t ih = oh * g.sh - g.ph + kh * g.dh;
          T* out = row + oh * g.OW;
          if (ih < 0 || ih >= g.H) {
            for (std::int64_t ow = 0; ow < g.OW; ++ow) out[ow] = T(0);
            continue;
          }
          const T* in = plane + ih * g.W;
          const std::int64_t shift = kw * g.dw - g.pw;
          for (std::int64_t ow = 0; ow < g.OW; ++ow) {
            const std::int64_t iw = ow * g.sw + shift;
            out[ow] = (iw >= 0 && iw < g.W) ? in[iw] : T(0);
          }
        }
      }
  }
};

/// dx[b0 + b, c, ih, iw] (+)= the sum of every column entry that im2col filled from it. CPU task
/// (b, c): owns the plane dx[b0 + b, c] and adds the columns of its KH*KW rows into it (no other
/// task writes that plane).
template <class T>
struct Col2im {
  const T* dcols;
  T* dx;
  ConvGeometry g;
  std::int64_t b0, nb;
  bool accumulate;
  DUALCAST_HD void operator()(std::int64_t i) const {
    const std::int64_t t1 = div64(i, g.W), iw = i - t1 * g.W;
    const std::int64_t t2 = div64(t1, g.H), ih = t1 - t2 * g.H;
    const std::int64_t b = div64(t2, g.C), c = t2 - b * g.C;
    const std::int64_t L = nb * g.OH * g.OW;
    T acc = T(0);
    for (std::int64_t kh = 0; kh < g.KH; ++kh) {
      const std::int64_t th = ih + g.ph - kh * g.dh;
      if (th < 0) break;  // th only falls as kh grows
      const std::int64_t oh = div64(th, g.sh);
      if (oh * g.sh != th || oh >= g.OH) continue;
      for (std::int64_t kw = 0; kw < g.KW; ++kw) {
        const std::int64_t tw = iw + g.pw - kw * g.dw;
        if (tw < 0) break;
        const std::int64_t ow = div64(tw, g.sw);
        if (ow * g.sw != tw || ow >= g.OW) continue;
        acc += dcols[((c * g.KH + kh) * g.KW + kw) * L + b * g.OH * g.OW + oh * g.OW + ow];
      }
    }
    const std::int64_t idx = ((b0 + b) * g.C + c) * g.H * g.W + ih * g.W + iw;
    dx[idx] = (accumulate ? dx[idx] : T(0)) + acc;
  }
  void cpu_task(std::int64_t task) const {
    const std::int64_t b = task / g.C, c = task - b * g.C;
    const std::int64_t L = nb * g.OH * g.OW;
    T* plane = dx + ((b0 + b) * g.C + c) * g.H * g.W;
    if (!accumulate)
      for (std::int64_t i = 0; i < g.H * g.W; ++i) plane[i] = T(0);
    for (std::int64_t kh = 0; kh < g.KH; ++kh)
      for (std::int64_t kw = 0; kw < g.KW; ++kw) {
        const T* row = dcols + ((c * g.KH + kh) * g.KW + kw) * L + b * g.OH * g.OW;
        for (std::int64_t oh = 0; oh < g.OH; ++oh) {
          const std::int64_t ih = oh * g.sh - g.ph + kh * g.dh;
          if (ih < 0 || ih >= g.H) continue;
          const T* in = row + oh * g.OW;
          T* out = plane + ih * g.W;
          const std::int64_t shift = kw * g.dw - g.pw;
          for (std::int64_t ow = 0; ow < g.OW; ++ow) {
            const std::int64_t iw = ow * g.sw + shift;
            if (iw >= 0 && iw < g.W) out[iw] += in[ow];
          }
        }
      }
  }
};

/// Between the chunk's NCHW output [nb, O, OHW] (at sample b0) and the GEMM's [O, nb * OHW]:
/// to_rows copies dy into rows, otherwise rows are scattered back into y. CPU task (b, o): one
/// contiguous run of OHW.
template <class T>
struct OutputRows {
  T* nchw;
  T* rows;
  std::int64_t O, OHW, b0, nb;
  bool to_rows;
  DUALCAST_HD void operator()(std::int64_t i) const {
    const std::int64_t L = nb * OHW;
    const std::int64_t o = div64(i, L), r = i - o * L;
    const std::int64_t b = div64(r, OHW), p = r - b * OHW;
    T& a = nchw[((b0 + b) * O + o) * OHW + p];
    if (to_rows) rows[i] = a;
    else a = rows[i];
  }
  void cpu_task(std::int64_t task) const {
    const std::int64_t b = task / O, o = task - b * O;
    T* a = nchw + ((b0 + b) * O + o) * OHW;
    T* r = rows + o * nb * OHW + b * OHW;
    if (to_rows) std::copy(a, a + OHW, r);
    else std::copy(r, r + OHW, a);
  }
};

template <class Body>
void run_planes(const void* ctx, std::int64_t begin, std::int64_t end) {
  const Body& body = *static_cast<const Body*>(ctx);
  for (std::int64_t t = begin; t < end; ++t) body.cpu_task(t);
}

/// One step of a chunk: body.cpu_task over its `planes` tasks on the CPU, body over its n elements
/// on a GPU.
template <class Body>
void run_step(Device d, const Body& body, std::int64_t planes, std::int64_t n) {
  if (d.is_cpu()) detail::cpu_parallel_range(planes, 1, &run_planes<Body>, &body);
  else parallel_for(d, n, body);
}

template <class T>
void im2col(Device d, const T* x, T* cols, const ConvGeometry& g, std::int64_t b0, std::int64_t nb) {
  run_step(d, Im2col<T>{x, cols, g, b0, nb}, g.C * nb, g.C * g.KH * g.KW * nb * g.OHW());
}

template <class T>
void col2im(Device d, const T* dcols, T* dx, const ConvGeometry& g, std::int64_t b0, std::int64_t nb,
            bool accumulate) {
  run_step(d, Col2im<T>{dcols, dx, g, b0, nb, accumulate}, nb * g.C, nb * g.C * g.HW());
}

/// Samples per chunk: the column buffer stays under a budget (32M elements on a GPU, 4M on the CPU).
std::int64_t chunk_samples(Device d, const ConvGeometry& g) {
  const std::int64_t budget = d.is_cuda() ? (std::int64_t(1) << 25) : (std::int64_t(1) << 22);
  const std::int64_t per_sample = std::max<std::int64_t>(1, g.C * g.KH * g.KW * g.OHW());
  return std::clamp<std::int64_t>(budget / per_sample, 1, std::max<std::int64_t>(g.N, 1));
}

template <class T>
void output_rows(Device d, T* nchw, T* rows, const ConvGeometry& g, std::int64_t b0, std::int64_t nb,
                 bool to_rows) {
  run_step(d, OutputRows<T>{nchw, rows, g.O, g.OHW(), b0, nb, to_rows}, nb * g.O, g.O * nb * g.OHW());
}

/// Calls body(cols, rows, b0, nb, L) for each chunk of nb samples from b0 (L = nb * OHW columns),
/// with the cols and rows buffers sized for the largest chunk.
template <class T, class Body>
void for_each_chunk(Device d, const ConvGeometry& g, const Body& body) {
  const std::int64_t nbmax = chunk_samples(d, g);
  const std::int64_t CKK = g.C * g.KH * g.KW, OHW = g.OHW();
  Tensor cols = Tensor::empty(Shape{CKK * nbmax * OHW}, dtype_of<T>(), d);
  Tensor rows = Tensor::empty(Shape{g.O * nbmax * OHW}, dtype_of<T>(), d);
  for (std::int64_t b0 = 0; b0 < g.N; b0 += nbmax) {
    const std::int64_t nb = std::min(nbmax, g.N - b0);
    body(cols.data<T>(), rows.data<T>(), b0, nb, nb * OHW);
  }
}

/// Per chunk: cols = im2col(x); rows[g] = W[g] cols[g] (one GEMM per group over all nb*OHW columns);
/// y = rows scattered back to NCHW.
template <class T>
void gemm_forward(Device d, const ConvGeometry& g, const T* x, const T* w, T* y) {
  const std::int64_t Og = g.Og(), CgKK = g.CgKK();
  for_each_chunk<T>(d, g, [&](T* cp, T* rp, std::int64_t b0, std::int64_t nb, std::int64_t L) {
    im2col<T>(d, x, cp, g, b0, nb);
    for (std::int64_t grp = 0; grp < g.groups; ++grp)
      detail::gemm(d, dtype_of<T>(), false, false, Og, L, CgKK, 1.0, w + grp * Og * CgKK, CgKK, 0,
                   cp + grp * CgKK * L, L, 0, 0.0, rp + grp * Og * L, L, 0, 1);
    output_rows<T>(d, y, rp, g, b0, nb, /*to_rows=*/false);
  });
}

/// Per chunk: rows = dy as [O, nb*OHW]; dW[g] (+)= rows[g] cols[g]^T with cols = im2col(x);
/// dcols[g] = W[g]^T rows[g], gathered into dx. dx or dw may be null (not needed).
template <class T>
void gemm_backward(Device d, const ConvGeometry& g, const T* x, const T* w, T* dy, T* dx, bool accumulate,
                   T* dw) {
  const std::int64_t Og = g.Og(), CgKK = g.CgKK();
  for_each_chunk<T>(d, g, [&](T* cp, T* rp, std::int64_t b0, std::int64_t nb, std::int64_t L) {
    output_rows<T>(d, dy, rp, g, b0, nb, /*to_rows=*/true);
    if (dw) {
      im2col<T>(d, x, cp, g, b0, nb);
      for (std::int64_t grp = 0; grp < g.groups; ++grp)
        detail::gemm(d, dtype_of<T>(), false, true, Og, CgKK, L, 1.0, rp + grp * Og * L, L, 0,
                     cp + grp * CgKK * L, L, 0, b0 == 0 ? 0.0 : 1.0, dw + grp * Og * CgKK, CgKK, 0, 1);
    }
    if (dx) {
      for (std::int64_t grp = 0; grp < g.groups; ++grp)
        detail::gemm(d, dtype_of<T>(), true, false, CgKK, L, Og, 1.0, w + grp * Og * CgKK, CgKK, 0,
                     rp + grp * Og * L, L, 0, 0.0, cp + grp * CgKK * L, L, 0, 1);
      col2im<T>(d, cp, dx, g, b0, nb, accumulate);
    }
  });
}

// ---- the three directions, dispatched -------------------------------------------------------------

void forward(const ConvGeometry& g, const Tensor& x, const Tensor& w, Tensor& y, bool cudnn) {
  if (y.numel() == 0) return;
  const Device d = x.device();
  if (cudnn) {
    detail::cudnn_conv_forward(d, x.dtype(), g, x.raw_data(), w.raw_data(), y.raw_data());
    return;
  }
  DUALCAST_CHECK(!g.nhwc, "conv2d: an nhwc convolution reached the NCHW GEMM code");
  dispatch_floating(x.dtype(), "conv2d", [&](auto tag) {
    using T = decltype(tag);
    gemm_forward<T>(d, g, x.data<T>(), w.data<T>(), y.data<T>());
  });
}

/// dx (+)= and dw = the gradients of one convolution; an undefined dx or dw is not computed. cudnn:
/// where the forward ran (asked then, not now: a backend changed in between must not send an NHWC
/// geometry to the NCHW-only GEMM code).
void conv_backward(const ConvGeometry& g, const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx,
                   bool accumulate, Tensor* dw, bool cudnn) {
  const Device d = dy.device();
  if (dw && g.N == 0) dw->fill_(0.0);
  if (g.N == 0) return;
  if (cudnn) {
    if (dx)
      detail::cudnn_conv_backward_data(d, dy.dtype(), g, w.raw_data(), dy.raw_data(), dx->raw_data(),
                                       accumulate);
    if (dw) detail::cudnn_conv_backward_filter(d, dy.dtype(), g, x.raw_data(), dy.raw_data(), dw->raw_data());
    return;
  }
  DUALCAST_CHECK(!g.nhwc, "conv2d backward: an nhwc convolution reached the NCHW GEMM code");
  dispatch_floating(dy.dtype(), "conv2d backward", [&](auto tag) {
    using T = decltype(tag);
    gemm_backward<T>(d, g, dw ? x.data<T>() : nullptr, dx ? w.data<T>() : nullptr, dy.data<T>(),
                     dx ? dx->data<T>() : nullptr, accumulate, dw ? dw->data<T>() : nullptr);
  });
}

class Conv2dNode final : public Node {
 public:
  Conv2dNode(const ConvGeometry& g, bool cudnn) : g_(g), cudnn_(cudnn) {}
  [[nodiscard]] const char* name() const override { return "conv2d"; }
  void release_saved() override {
    x_ = Tensor();
    w_ = Tensor();
  }
  void backward(const std::vector<Tensor>& grad_outputs) override {
    if (!grad_outputs[0].defined()) return;
    const Tensor dy = detail::contiguous_copy(grad_outputs[0]);
    // The input's gradient is written in place when it already holds one of its own (a residual
    // input whose other consumer ran first): cuDNN adds with beta = 1, col2im adds as it gathers.
    VarState* in = inputs[0].get();
    const bool accumulate = in && in->grad.defined() && in->grad_owned;
    Tensor dx, dw;
    if (in) dx = accumulate ? in->grad : Tensor::empty(input_shape(g_), dy.dtype(), dy.device());
    if (inputs[1]) dw = Tensor::empty(weight_shape(g_), dy.dtype(), dy.device());
    conv_backward(g_, x_, w_, dy, in ? &dx : nullptr, accumulate, inputs[1] ? &dw : nullptr, cudnn_);
    if (in && !accumulate) detail::accumulate_grad(*in, std::move(dx), /*owned=*/true);
    if (inputs[1]) detail::accumulate_grad(*inputs[1], std::move(dw), /*owned=*/true);
  }

  Tensor x_;  ///< kept when w needs a gradient
  Tensor w_;  ///< kept when x needs a gradient

 private:
  ConvGeometry g_;
  bool cudnn_;  ///< where the forward ran
};

}  // namespace
}  // namespace conv_detail

void set_conv_backend(ConvBackend backend) {
  conv_detail::backend_state().store(static_cast<int>(backend));
}
ConvBackend conv_backend() { return static_cast<ConvBackend>(conv_detail::backend_state().load()); }
bool cudnn_available() { return detail::cudnn_compiled(); }
std::vector<std::string> conv_algorithms_chosen() { return detail::cudnn_chosen_algorithms(); }

std::string conv_backend_name(Device device) {
  if (device.is_cpu()) return "im2col + CPU BLAS GEMM";
  if (conv_detail::use_cudnn(device)) {
    if (!detail::cudnn_compiled()) return "cuDNN (not in this build: convolutions fail)";
    return detail::concat("cuDNN ", detail::cudnn_version_string(), " (algorithms: ",
                          detail::cudnn_algo_search_name(), ")");
  }
  return "im2col + cuBLAS GEMM";
}

Shape conv2d_output_shape(const Shape& x, const Shape& w, const Conv2dOptions& options) {
  return conv_detail::output_shape(conv_detail::geometry_of(x, w, options));
}

Tensor conv2d(const Tensor& x, const Tensor& w, const Conv2dOptions& options) {
  // Under Autocast the operands are cast first, so a 16-bit activation meets a float32 weight (the
  // cast operands are 16-bit, which autocast_target leaves alone: one level of recursion).
  if (autocast_enabled() && x.defined() && w.defined()) {
    const DType dx = detail::autocast_target(x.dtype()), dw = detail::autocast_target(w.dtype());
    if (dx != x.dtype() || dw != w.dtype()) return conv2d(x.to(dx), w.to(dw), options);
  }
  const detail::ConvGeometry g = conv_detail::check_conv(x, w, options);
  if (conv_detail::nhwc_via_permutes(g, x))
    return permute(conv2d(permute(x, conv_detail::kToNchw), permute(w, conv_detail::kToNchw),
                          conv_detail::as_nchw(options)),
                   conv_detail::kToNhwc);
  if (conv_detail::via_float32(x)) {
    const Autocast float32_inside(DType::bfloat16, /*enabled=*/false);  // else it casts them back
    return conv2d(x.to(DType::float32), w.to(DType::float32), options).to(x.dtype());
  }
  const Tensor xc = detail::contiguous_copy(x), wc = detail::contiguous_copy(w);
  Tensor y = Tensor::empty(conv_detail::output_shape(g), x.dtype(), x.device());
  conv_detail::forward(g, xc, wc, y, conv_detail::use_cudnn(x.device()));
  return y;
}

Var conv2d(const Var& x, const Var& w, const Conv2dOptions& options) {
  DUALCAST_CHECK(x.defined() && w.defined(), "conv2d: argument '", x.defined() ? "w" : "x",
                 "' is an undefined Var");
  if (autocast_enabled()) {
    // Cast first (a 16-bit activation may meet a float32 weight); the cast operands are 16-bit,
    // which autocast_target leaves alone: one level of recursion.
    const DType dx = detail::autocast_target(x.dtype()), dw = detail::autocast_target(w.dtype());
    if (dx != x.dtype() || dw != w.dtype()) return conv2d(cast(x, dx), cast(w, dw), options);
  }
  const detail::ConvGeometry g = conv_detail::check_conv(x.value(), w.value(), options);
  if (conv_detail::nhwc_via_permutes(g, x.value()))
    return permute(conv2d(permute(x, conv_detail::kToNchw), permute(w, conv_detail::kToNchw),
                          conv_detail::as_nchw(options)),
                   conv_detail::kToNhwc);
  if (conv_detail::via_float32(x.value())) {
    const Autocast float32_inside(DType::bfloat16, /*enabled=*/false);  // else it casts them back
    return cast(conv2d(cast(x, DType::float32), cast(w, DType::float32), options), x.dtype());
  }
  const Tensor xc = detail::contiguous_copy(x.value()), wc = detail::contiguous_copy(w.value());
  Tensor y = Tensor::empty(conv_detail::output_shape(g), xc.dtype(), xc.device());
  const bool cudnn = conv_detail::use_cudnn(xc.device());
  conv_detail::forward(g, xc, wc, y, cudnn);
  std::shared_ptr<conv_detail::Conv2dNode> node;
  if (detail::any_requires_grad({x, w})) {
    node = std::make_shared<conv_detail::Conv2dNode>(g, cudnn);
    if (w.requires_grad()) node->x_ = xc;
    if (x.requires_grad()) node->w_ = wc;
  }
  return detail::record1(std::move(node), {x, w}, std::move(y));
}

Var conv2d(const Var& x, const Var& w, const Var& bias, const Conv2dOptions& options) {
  DUALCAST_CHECK(bias.defined(), "conv2d: argument 'bias' is an undefined Var");
  Var y = conv2d(x, w, options);
  const bool nhwc = options.layout == ConvLayout::nhwc;
  const std::int64_t O = y.shape()[nhwc ? 3 : 1];
  const Shape along_channels = nhwc ? Shape{1, 1, 1, O} : Shape{1, O, 1, 1};
  DUALCAST_CHECK(bias.shape().rank() == 1 && bias.shape()[0] == O, "conv2d: bias has shape ",
                 bias.shape().str(), " but w ", w.shape().str(), " has O = ", O,
                 " output channels (expected [", O, "])");
  if (!is_half(y.dtype())) return y + reshape(bias, along_channels);
  // A 16-bit result (16-bit operands, or Autocast): the bias joins in y's dtype, cast like the
  // operands under Autocast (its gradient comes back in the bias's own dtype), so the add is one
  // 16-bit broadcast and the result stays 16-bit.
  const Var b = cast(bias, detail::autocast_target(bias.dtype()));
  DUALCAST_CHECK(b.dtype() == y.dtype(), "conv2d: bias ", bias.shape().str(), " is ",
                 dtype_name(bias.dtype()), " but x ", x.shape().str(), " and w ", w.shape().str(),
                 " give a ", dtype_name(y.dtype()), " result (cast the bias)");
  return y + reshape(b, along_channels);
}

}  // namespace dualcast
