// attention.cu: scaled_dot_product_attention (ops/attention.hpp): argument checks, the mask plan,
// the composed path (matmul, masked softmax, matmul on the tape) with its masked-softmax kernels,
// and the tape node of the fused path (whose kernels are in attention_fused.cu).
//
// The masked softmax works on rows of the scores [B*H*Sq, Sk]: element j of row (b, h, i) is
// scale * s + additive mask, or -inf where the causal rule or a boolean mask removes it. One online
// max-and-sum pass (rescaled when the maximum grows, so nothing overflows), then a write pass; a row
// whose maximum is -inf (every key masked) is written as zeros. Backward from the saved
// probabilities: ds = scale * p * (g - sum(g * p)). A row belongs to one thread on the CPU and to a
// warp on the GPU, through the same DUALCAST_HD row bodies.
#include "dualcast/ops/attention.hpp"

#include <math.h>

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include "attention_internal.hpp"
#include "dualcast/error.hpp"
#include "dualcast/kernels/reduce.cuh"
#include "dualcast/ops/cast.hpp"
#include "dualcast/ops/linalg.hpp"
#include "dualcast/ops/reduce.hpp"
#include "dualcast/ops/shape.hpp"
#include "dualcast/parallel.hpp"
#include "dualcast/precision.hpp"
#include "line_stats.hpp"
#include "row_groups.cuh"

namespace dualcast {
namespace attention_detail {
namespace {

// ---- masked softmax: row bodies ---------------------------------------------------------------

using detail::lexp;
using detail::neg_inf;

template <class T>
struct SoftmaxArgs {
  const T* s = nullptr;  // scores [B*H*Sq, Sk]
  T* p = nullptr;        // probabilities (forward output; backward input)
  const T* g = nullptr;  // backward: adjoint of p
  T* gs = nullptr;       // backward: gradient of s
  MaskView mask;
  std::int64_t H = 1, Sq = 1, Sk = 0, rows = 0;
  bool causal = false;
  T scale = T(1);
};

/// The masked, scaled score of column j of row r given the raw score (-inf where masked).
template <class T>
DUALCAST_HD DUALCAST_INLINE T masked_score(const SoftmaxArgs<T>& a, std::int64_t moff, std::int64_t i,
                                           std::int64_t j, T raw) {
  if (a.causal && j > i) return neg_inf<T>();
  const std::int64_t at = moff + j * a.mask.sj;
  if (a.mask.kind == MaskKind::boolean) {
    if (static_cast<const std::uint8_t*>(a.mask.data)[at] == 0) return neg_inf<T>();
  } else if (a.mask.kind == MaskKind::additive) {
    return raw * a.scale + static_cast<const T*>(a.mask.data)[at];
  }
  return raw * a.scale;
}

/// Row r's query index i and the mask offset of its column 0.
template <class T>
DUALCAST_HD DUALCAST_INLINE void row_coords(const SoftmaxArgs<T>& a, std::int64_t r, std::int64_t& i,
                                            std::int64_t& moff) {
  const std::int64_t bh = r / a.Sq;
  i = r - bh * a.Sq;
  const std::int64_t b = bh / a.H, h = bh - b * a.H;
  moff = b * a.mask.sb + h * a.mask.sh + i * a.mask.si;
}

/// Adds v to a running (max m, sum of exp(x - m) s).
template <class T>
DUALCAST_HD DUALCAST_INLINE void online_add(T& m, T& s, T v) {
  if (v > m) {
    s = s * lexp(m - v) + T(1);  // m = -inf at first: exp(-inf) = 0
    m = v;
  } else if (!(v == m && m == neg_inf<T>())) {
    s += lexp(v - m);  // NaN propagates
  }
}

template <class T, class Reduce>
DUALCAST_HD DUALCAST_INLINE void softmax_row(const SoftmaxArgs<T>& a, std::int64_t r, int lane, int G,
                                             const Reduce& reduce) {
  std::int64_t i, moff;
  row_coords(a, r, i, moff);
  const T* s = a.s + r * a.Sk;
  T* p = a.p + r * a.Sk;
  T m = neg_inf<T>(), sum = T(0);
  for (std::int64_t j = lane; j < a.Sk; j += G) online_add(m, sum, masked_score(a, moff, i, j, s[j]));
  reduce.max_sum(m, sum);
  if (m == neg_inf<T>()) {  // every key masked: a zero row, not 0/0
    for (std::int64_t j = lane; j < a.Sk; j += G) p[j] = T(0);
    return;
  }
  const T inv = T(1) / sum;
  for (std::int64_t j = lane; j < a.Sk; j += G) p[j] = lexp(masked_score(a, moff, i, j, s[j]) - m) * inv;
}

template <class T, class Reduce>
DUALCAST_HD DUALCAST_INLINE void softmax_backward_row(const SoftmaxArgs<T>& a, std::int64_t r, int lane,
                                                      int G, const Reduce& reduce) {
  const T* p = a.p + r * a.Sk;
  const T* g = a.g + r * a.Sk;
  T dot = T(0);
  for (std::int64_t j = lane; j < a.Sk; j += G) dot += g[j] * p[j];
  dot = reduce.sum(dot);
  T* gs = a.gs + r * a.Sk;
  for (std::int64_t j = lane; j < a.Sk; j += G) gs[j] = a.scale * p[j] * (g[j] - dot);
}

struct NoReduce {
  template <class T>
  DUALCAST_HD DUALCAST_INLINE void max_sum(T&, T&) const {}
  template <class T>
  DUALCAST_HD DUALCAST_INLINE T sum(T v) const { return v; }
};

#if defined(__CUDACC__)
inline constexpr int kRowBlock = 256;

struct WarpReduce {
  template <class T>
  __device__ DUALCAST_INLINE void max_sum(T& m, T& s) const {
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
      const T m2 = __shfl_xor_sync(0xffffffffu, m, d);
      const T s2 = __shfl_xor_sync(0xffffffffu, s, d);
      const T mm = m > m2 ? m : m2;
      const T a = m == neg_inf<T>() ? T(0) : s * lexp(m - mm);
      const T b = m2 == neg_inf<T>() ? T(0) : s2 * lexp(m2 - mm);
      m = (m != m || m2 != m2) ? (m != m ? m : m2) : mm;
      s = a + b;
    }
  }
  template <class T>
  __device__ DUALCAST_INLINE T sum(T v) const {
    return detail::WarpSum{}(v);
  }
};

template <class T>
__global__ void __launch_bounds__(kRowBlock) masked_softmax_kernel(SoftmaxArgs<T> a) {
  detail::for_each_group_row<32, kRowBlock>(
      a.rows, [&](std::int64_t r, int lane) { softmax_row(a, r, lane, 32, WarpReduce{}); });
}

template <class T>
__global__ void __launch_bounds__(kRowBlock) masked_softmax_backward_kernel(SoftmaxArgs<T> a) {
  detail::for_each_group_row<32, kRowBlock>(
      a.rows, [&](std::int64_t r, int lane) { softmax_backward_row(a, r, lane, 32, WarpReduce{}); });
}
#endif

template <class T>
void run_softmax(Device dev, const SoftmaxArgs<T>& a, bool backward) {
  if (a.rows == 0) return;
  if (dev.is_cpu()) {
    detail::cpu_rows(a.rows, a.Sk, [&](std::int64_t r) {
      if (backward) softmax_backward_row(a, r, 0, 1, NoReduce{});
      else softmax_row(a, r, 0, 1, NoReduce{});
    });
    return;
  }
#if defined(__CUDACC__)
  detail::DeviceGuard guard(dev);
  const unsigned blocks = detail::warp_row_blocks<kRowBlock>(dev, a.rows);
  if (backward) masked_softmax_backward_kernel<T><<<blocks, kRowBlock, 0, detail::stream(dev)>>>(a);
  else masked_softmax_kernel<T><<<blocks, kRowBlock, 0, detail::stream(dev)>>>(a);
  DUALCAST_CUDA_CHECK_LAUNCH();
#else
  DUALCAST_FAIL("scaled_dot_product_attention on ", dev.str(),
                ": dualcast was built without its CUDA backend");
#endif
}

// ---- argument checks and the mask plan ------------------------------------------------------------

/// A checked call: sizes, the mask (converted and kept alive) and the implementation to run.
struct Plan {
  Dims dims;
  Tensor mask;  ///< contiguous, uint8 or q's dtype (float32 for 16-bit q); undefined without a mask
  MaskView view;
  AttentionImpl impl = AttentionImpl::composed;
};

/// The checked plan of a call whose inputs run in dtype `run` (q's dtype, or what run_dtype chose:
/// the caller casts them); `checks_only` skips the mask's conversion (no copy), for callers that
/// only want the checks and the implementation.
Plan make_plan(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opt, DType run,
               bool checks_only = false) {
  const char* op = "scaled_dot_product_attention";
  check_defined(q, op, "q");
  check_defined(k, op, "k");
  check_defined(v, op, "v");
  DUALCAST_CHECK(is_floating(q.dtype()), op, ": argument 'q' has unsupported dtype ",
                 dtype_name(q.dtype()), " (shape ", q.shape().str(),
                 "; expected float32, float64, bfloat16 or float16)");
  check_same_device_dtype(op, "q", q, "k", k);
  check_same_device_dtype(op, "q", q, "v", v);
  const auto rank4 = [&](const Tensor& t, const char* name) {
    DUALCAST_CHECK(t.rank() == 4, op, ": argument '", name, "' has shape ", t.shape().str(),
                   "; expected [batch, heads, seq, head_dim] (q ", q.shape().str(), ", k ",
                   k.shape().str(), ", v ", v.shape().str(), ")");
  };
  rank4(q, "q");
  rank4(k, "k");
  rank4(v, "v");
  const Shape &qs = q.shape(), &ks = k.shape(), &vs = v.shape();
  DUALCAST_CHECK(ks[0] == qs[0] && ks[1] == qs[1] && vs[0] == qs[0] && vs[1] == qs[1], op,
                 ": batch and head dimensions differ: q ", qs.str(), ", k ", ks.str(), ", v ",
                 vs.str());
  DUALCAST_CHECK(ks[3] == qs[3], op, ": head_dim of 'k' ", ks.str(), " differs from that of 'q' ",
                 qs.str());
  DUALCAST_CHECK(vs[2] == ks[2], op, ": 'v' ", vs.str(), " and 'k' ", ks.str(),
                 " have different key counts (dimension 2)");
  DUALCAST_CHECK(std::isfinite(opt.scale), op, ": scale = ", opt.scale, " is not finite");

  Plan p;
  Dims& d = p.dims;
  d.B = qs[0];
  d.H = qs[1];
  d.Sq = qs[2];
  d.Sk = ks[2];
  d.D = qs[3];
  d.Dv = vs[3];
  d.causal = opt.causal;
  d.scale = opt.scale != 0.0 ? opt.scale : (d.D > 0 ? 1.0 / std::sqrt(static_cast<double>(d.D)) : 1.0);

  if (opt.mask.defined()) {
    const Tensor& m = opt.mask;
    DUALCAST_CHECK(m.device() == q.device(), op, ": 'mask' ", m.str(), " is on another device than 'q' ",
                   q.str());
    DUALCAST_CHECK(m.rank() <= 4, op, ": 'mask' has shape ", m.shape().str(),
                   "; it must broadcast to [B, H, Sq, Sk] = [", d.B, ", ", d.H, ", ", d.Sq, ", ", d.Sk, "]");
    const std::int64_t full[4] = {d.B, d.H, d.Sq, d.Sk};
    const int off = 4 - m.rank();
    for (int i = 0; i < m.rank(); ++i)
      DUALCAST_CHECK(m.shape()[i] == full[off + i] || m.shape()[i] == 1, op, ": 'mask' of shape ",
                     m.shape().str(), " does not broadcast to [B, H, Sq, Sk] = [", d.B, ", ", d.H, ", ",
                     d.Sq, ", ", d.Sk, "] (dimension ", i, ")");
    if (m.dtype() == DType::uint8) {
      if (!checks_only) p.mask = detail::contiguous_copy(m);
      p.view.kind = MaskKind::boolean;
    } else {
      // The tensor-core kernels (16-bit q) read an additive mask in float32.
      if (!checks_only) p.mask = detail::contiguous_copy(m.to(is_half(run) ? DType::float32 : run));
      p.view.kind = MaskKind::additive;
    }
    p.view.data = p.mask.defined() ? p.mask.raw_data() : nullptr;
    std::int64_t st[4] = {0, 0, 0, 0};
    std::int64_t stride = 1;
    for (int i = m.rank() - 1; i >= 0; --i) {
      if (m.shape()[i] != 1) st[off + i] = stride;
      stride *= m.shape()[i];
    }
    p.view.sb = st[0];
    p.view.sh = st[1];
    p.view.si = st[2];
    p.view.sj = st[3];
  }

  const bool fused_ok = is_half(run) ? tensor_core_supported(q.device(), d) : fused_supported(q.device(), d);
  switch (opt.impl) {
    case AttentionImpl::composed: p.impl = AttentionImpl::composed; break;
    case AttentionImpl::fused:
      DUALCAST_CHECK(fused_ok, op, ": the fused implementation runs on CUDA devices with head_dim of "
                     "'q'/'k' equal to that of 'v' and at most ", kFusedAttentionMaxHeadDim, "; got q ",
                     qs.str(), ", v ", vs.str(), " on ", q.device().str(),
                     " (use AttentionImpl::composed or automatic)");
      p.impl = AttentionImpl::fused;
      break;
    default: p.impl = fused_ok ? AttentionImpl::fused : AttentionImpl::composed; break;
  }
  return p;
}

// ---- masked softmax on tensors and on the tape --------------------------------------------------

template <class T>
SoftmaxArgs<T> softmax_args(const Plan& p) {
  SoftmaxArgs<T> a;
  a.mask = p.view;
  a.H = p.dims.H;
  a.Sq = p.dims.Sq;
  a.Sk = p.dims.Sk;
  a.rows = p.dims.heads() * p.dims.Sq;
  a.causal = p.dims.causal;
  a.scale = static_cast<T>(p.dims.scale);
  return a;
}

/// P = masked softmax of the raw scores s [B*H, Sq, Sk] (contiguous).
Tensor masked_softmax(const Plan& p, const Tensor& s) {
  Tensor out = Tensor::empty(s.shape(), s.dtype(), s.device());
  dispatch_floating(s.dtype(), "scaled_dot_product_attention", [&](auto tag) {
    using T = decltype(tag);
    SoftmaxArgs<T> a = softmax_args<T>(p);
    a.s = s.data<T>();
    a.p = out.data<T>();
    run_softmax(s.device(), a, /*backward=*/false);
  });
  return out;
}

class MaskedSoftmaxNode final : public Node {
 public:
  MaskedSoftmaxNode(Plan plan, Tensor prob) : plan_(std::move(plan)), p_(std::move(prob)) {}
  [[nodiscard]] const char* name() const override { return "masked_softmax"; }
  void release_saved() override {
    p_ = Tensor();
    plan_.mask = Tensor();
  }
  void backward(const std::vector<Tensor>& grad_outputs) override {
    if (!grad_outputs[0].defined() || !inputs[0]) return;
    const Tensor g = detail::contiguous_copy(grad_outputs[0]);
    Tensor gs = Tensor::empty(p_.shape(), p_.dtype(), p_.device());
    dispatch_floating(p_.dtype(), "scaled_dot_product_attention backward", [&](auto tag) {
      using T = decltype(tag);
      SoftmaxArgs<T> a = softmax_args<T>(plan_);
      a.p = p_.data<T>();
      a.g = g.data<T>();
      a.gs = gs.data<T>();
      run_softmax(p_.device(), a, /*backward=*/true);
    });
    detail::accumulate_grad(*inputs[0], std::move(gs), /*owned=*/true);
  }

 private:
  Plan plan_;
  Tensor p_;
};

Var masked_softmax(const Plan& p, const Var& s) {
  Tensor prob = masked_softmax(p, s.value());
  if (!detail::any_requires_grad({s})) return Var(std::move(prob));
  return detail::record1(std::make_shared<MaskedSoftmaxNode>(p, prob), {s}, prob);
}

// ---- the two paths ----------------------------------------------------------------------------

template <class X>
X composed(const Plan& p, const X& q, const X& k, const X& v) {
  const Dims& d = p.dims;
  const std::int64_t bh = d.heads();
  const X s = matmul(reshape(q, {bh, d.Sq, d.D}), reshape(k, {bh, d.Sk, d.D}), false, true);
  const X prob = masked_softmax(p, s);
  return reshape(matmul(prob, reshape(v, {bh, d.Sk, d.Dv})), {d.B, d.H, d.Sq, d.Dv});
}

struct FusedResult {
  Tensor q, k, v, o, lse;
};

/// A contiguous copy whose data is 16-byte aligned (a view into a larger tensor may not be), as the
/// kernels' vector loads want; t itself when it already is.
Tensor aligned_contiguous(const Tensor& t) {
  Tensor c = detail::contiguous_copy(t);
  if (reinterpret_cast<std::uintptr_t>(c.raw_data()) % 16 != 0) c = c.clone();
  return c;
}

FusedResult fused(const Plan& p, const Tensor& q, const Tensor& k, const Tensor& v) {
  FusedResult r;
  const bool half = is_half(q.dtype());
  r.q = half ? aligned_contiguous(q) : detail::contiguous_copy(q);
  r.k = half ? aligned_contiguous(k) : detail::contiguous_copy(k);
  r.v = half ? aligned_contiguous(v) : detail::contiguous_copy(v);
  const Dims& d = p.dims;
  r.o = Tensor::empty(Shape{d.B, d.H, d.Sq, d.Dv}, q.dtype(), q.device());
  r.lse = Tensor::empty(Shape{d.B, d.H, d.Sq}, half ? DType::float32 : q.dtype(), q.device());
  if (half) tensor_core_forward(d, p.view, r.q, r.k, r.v, r.o, r.lse);
  else fused_forward(d, p.view, r.q, r.k, r.v, r.o, r.lse);
  return r;
}

class FusedAttentionNode final : public Node {
 public:
  FusedAttentionNode(Plan plan, FusedResult saved) : plan_(std::move(plan)), s_(std::move(saved)) {}
  [[nodiscard]] const char* name() const override { return "scaled_dot_product_attention"; }
  void release_saved() override {
    s_ = FusedResult();
    plan_.mask = Tensor();
  }
  void backward(const std::vector<Tensor>& grad_outputs) override {
    if (!grad_outputs[0].defined()) return;
    Tensor dq, dk, dv;
    if (is_half(s_.q.dtype())) {
      const Tensor g = aligned_contiguous(grad_outputs[0]);
      tensor_core_backward(plan_.dims, plan_.view, s_.q, s_.k, s_.v, s_.o, s_.lse, g, dq, dk, dv);
    } else {
      const Tensor g = detail::contiguous_copy(grad_outputs[0]);
      fused_backward(plan_.dims, plan_.view, s_.q, s_.k, s_.v, s_.o, s_.lse, g, dq, dk, dv);
    }
    if (inputs[0]) detail::accumulate_grad(*inputs[0], std::move(dq), /*owned=*/true);
    if (inputs[1]) detail::accumulate_grad(*inputs[1], std::move(dk), /*owned=*/true);
    if (inputs[2]) detail::accumulate_grad(*inputs[2], std::move(dv), /*owned=*/true);
  }

 private:
  Plan plan_;
  FusedResult s_;
};

}  // namespace
}  // namespace attention_detail

namespace ad = attention_detail;

// Both entry points first choose the dtype the attention runs in (run_dtype): 16-bit q, k, v run as
// they are on the tensor-core kernels where those apply, else on float32 copies; float32 inputs run
// in the autocast dtype inside an Autocast where the tensor-core kernels apply, else as they are.
// The composed path and the CPU never autocast (their matmuls run with autocasting off).
namespace attention_detail {
namespace {
/// Whether the tensor-core kernels take q, k, v (of any dtype: the shapes and options only; the full
/// argument checks come in make_plan).
bool tensor_core_path(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opt) {
  if (opt.impl == AttentionImpl::composed || !k.defined() || !v.defined()) return false;
  if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4) return false;
  Dims d;
  d.D = q.shape()[3];
  d.Dv = v.shape()[3];
  return k.shape()[3] == d.D && tensor_core_supported(q.device(), d);
}

DType run_dtype(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opt) {
  const char* op = "scaled_dot_product_attention";
  check_defined(q, op, "q");
  if (is_half(q.dtype())) {
    check_same_device_dtype(op, "q", q, "k", k);
    check_same_device_dtype(op, "q", q, "v", v);
    return tensor_core_path(q, k, v, opt) ? q.dtype() : DType::float32;
  }
  if (q.dtype() == DType::float32 && autocast_enabled() && k.defined() && v.defined() &&
      k.dtype() == DType::float32 && v.dtype() == DType::float32 && tensor_core_path(q, k, v, opt))
    return autocast_dtype();
  return q.dtype();
}
}  // namespace
}  // namespace attention_detail

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options) {
  const DType run = ad::run_dtype(q, k, v, options);
  const Autocast no_autocast(DType::bfloat16, /*enabled=*/false);
  if (run != q.dtype()) {
    (void)ad::make_plan(q, k, v, options, run, /*checks_only=*/true);  // errors name the caller's tensors
    const Tensor o = scaled_dot_product_attention(q.to(run), k.to(run), v.to(run), options);
    return run == DType::float32 ? o.to(q.dtype()) : o;  // 16-bit inputs on float32 copies: rounded back
  }
  const ad::Plan p = ad::make_plan(q, k, v, options, q.dtype());
  if (p.impl == AttentionImpl::fused) return ad::fused(p, q, k, v).o;
  return ad::composed(p, q, k, v);
}

Var scaled_dot_product_attention(const Var& q, const Var& k, const Var& v,
                                 const AttentionOptions& options) {
  DUALCAST_CHECK(q.defined() && k.defined() && v.defined(),
                 "scaled_dot_product_attention: argument '", !q.defined() ? "q" : (!k.defined() ? "k" : "v"),
                 "' is an undefined Var");
  const DType run = ad::run_dtype(q.value(), k.value(), v.value(), options);
  const Autocast no_autocast(DType::bfloat16, /*enabled=*/false);
  if (run != q.dtype()) {
    (void)ad::make_plan(q.value(), k.value(), v.value(), options, run, /*checks_only=*/true);
    const Var o = scaled_dot_product_attention(cast(q, run), cast(k, run), cast(v, run), options);
    return run == DType::float32 ? cast(o, q.dtype()) : o;
  }
  ad::Plan p = ad::make_plan(q.value(), k.value(), v.value(), options, q.dtype());
  if (p.impl == AttentionImpl::composed) return ad::composed(p, q, k, v);
  ad::FusedResult r = ad::fused(p, q.value(), k.value(), v.value());
  Tensor o = r.o;
  if (!detail::any_requires_grad({q, k, v})) return Var(std::move(o));
  return detail::record1(std::make_shared<ad::FusedAttentionNode>(std::move(p), std::move(r)), {q, k, v},
                         std::move(o));
}

AttentionImpl attention_impl_for(const Tensor& q, const Tensor& k, const Tensor& v,
                                 const AttentionOptions& options) {
  return ad::make_plan(q, k, v, options, ad::run_dtype(q, k, v, options), /*checks_only=*/true).impl;
}

const char* attention_impl_name(AttentionImpl impl) {
  switch (impl) {
    case AttentionImpl::fused: return "fused";
    case AttentionImpl::composed: return "composed";
    default: return "automatic";
  }
}

}  // namespace dualcast
