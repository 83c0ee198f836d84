// gates.cu: LayerGates (gates.hpp): the HM-LSTM's gate products with a stacked weight gradient.
// Compiled by nvcc in CUDA builds and as C++ otherwise; the one hand-written kernel (the gate inputs'
// backward, which needs two row sums) has a plain loop twin on the CPU.
#include "gates.hpp"

#include <algorithm>
#include <array>
#include <utility>

#include "dualcast/error.hpp"
#include "dualcast/launch.hpp"
#include "dualcast/ops/linalg.hpp"
#include "dualcast/ops/shape.hpp"
#include "dualcast/precision.hpp"
#include "dualcast/parallel.hpp"
#include "network.hpp"  // HmCell (cell.hpp), BoundarySte, BoundarySoft

#if defined(__CUDACC__)
#include "dualcast/stream.hpp"
#endif

namespace hmlstm {

using namespace dualcast;

struct LayerGates::Stack {
  /// [T*B, Ks]: block t holds step t's gate inputs. Ks = K and the layer's dtype, or under Autocast
  /// the autocast dtype with Ks = K rounded up to 8 (more zero columns after the column of ones), as
  /// dS below: the products round X anyway, and 16-byte rows are copied in 16-byte chunks.
  Tensor x;
  /// [T*B, Gs]: block t holds step t's gate adjoints (written by backward). Gs = G and the layer's
  /// dtype, or under Autocast the autocast dtype with Gs = G rounded up to 8 (columns past G stay
  /// zero): the products round dS to that dtype anyway, and 16-byte rows let the skinny kernel
  /// copy dS_t in 16-byte chunks (at G = 2049 float32 rows it could only take 4).
  Tensor ds;
  std::vector<char> written, deposited;
  /// Per step, the inputs (below, zb, h, z, above) an earlier cell_step's kernel wrote its gate
  /// inputs from (all undefined: not written ahead). Held, not just their addresses: while they are
  /// held no other tensor can take their memory and pass for them.
  std::vector<std::array<Tensor, 5>> packed_from;
  std::int64_t B = 0, G = 0, K = 0;
  DType low = DType::float32;  // the products' autocast dtype (float32: plain matmul)
};

namespace {

// ---- kernels (named templates: nvcc rejects extended lambdas inside generic lambdas) ------------

/// X = [zb*below, h, z*above, 1, 0, ...] for B rows of K columns (`above` null for the top layer; TX:
/// the stack's dtype).
template <class T, class TX>
void gate_inputs(Device d, TX* x, std::int64_t B, std::int64_t H, std::int64_t K, const T* below,
                 const T* zb, const T* h, const T* z, const T* above) {
  const std::int64_t kx = above ? 3 * H : 2 * H;  // the column of ones
  parallel_for(d, B * K, [=] DUALCAST_HD(std::int64_t i) {
    const std::int64_t b = i / K, c = i - b * K;
    T v;
    if (c < H) v = zb ? zb[b] * below[b * H + c] : below[b * H + c];
    else if (c < 2 * H) v = h[b * H + (c - H)];
    else if (c < kx) v = z[b] * above[b * H + (c - 2 * H)];
    else v = c == kx ? T(1) : T(0);
    x[i] = TX(v);
  });
}

/// Packs the five gate adjoints (f, i, o, g: [B, H]; s_z: [B, 1]; null = zero) into dS [B, gs]
/// (TS: the stack's dtype; the columns past 4H+1 of a padded stack get zeros).
template <class T, class TS>
void pack_adjoints(Device d, TS* ds, std::int64_t gs, std::int64_t B, std::int64_t H, const T* a0, const T* a1,
                   const T* a2, const T* a3, const T* a4) {
  const std::int64_t G = 4 * H + 1;
  parallel_for(d, B * gs, [=] DUALCAST_HD(std::int64_t i) {
    const std::int64_t b = i / gs, c = i - b * gs;
    const std::int64_t piece = c / H < 4 ? c / H : 4;
    const T* a = piece == 0 ? a0 : piece == 1 ? a1 : piece == 2 ? a2 : piece == 3 ? a3 : a4;
    ds[i] = TS(a && c < G ? (piece < 4 ? a[b * H + (c - piece * H)] : a[b]) : T(0));
  });
}

/// From dX [B, K]: d_below = zb * dX[:, 0:H], d_zb = rowsum(dX[:, 0:H] * below), d_h = dX[:, H:2H],
/// d_above = z * dX[:, 2H:3H], d_z = rowsum(dX[:, 2H:3H] * above). Null outputs are skipped; the
/// row sums accumulate in double (as dualcast's reductions do for float). Each output starts from
/// its `old_` gradient when that is not null (it may be the output itself): the kernel accumulates,
/// so no add kernel runs after it.
struct GateInputGrads {
  const void* dx;
  const void* below;
  const void* zb;
  const void* z;
  const void* above;
  void* d_below;
  void* d_zb;
  void* d_h;
  void* d_above;
  void* d_z;
  const void* old_below = nullptr;
  const void* old_zb = nullptr;
  const void* old_h = nullptr;
  const void* old_above = nullptr;
  const void* old_z = nullptr;
};

/// old[i] + v, or v where there is no earlier gradient: the same rounding as adding afterwards.
template <class T>
DUALCAST_HD inline T plus_old(const void* old, std::int64_t i, T v) {
  return old ? static_cast<const T*>(old)[i] + v : v;
}

template <class T>
void cpu_gate_input_backward(const GateInputGrads& a, std::int64_t B, std::int64_t H, std::int64_t K) {
  const T* dx = static_cast<const T*>(a.dx);
  const T* below = static_cast<const T*>(a.below);
  const T* zb = static_cast<const T*>(a.zb);
  const T* z = static_cast<const T*>(a.z);
  const T* above = static_cast<const T*>(a.above);
  for (std::int64_t b = 0; b < B; ++b) {
    const T* row = dx + b * K;
    const T zbv = zb ? zb[b] : T(1);
    double acc_zb = 0.0, acc_z = 0.0;
    for (std::int64_t j = 0; j < H; ++j) {
      const std::int64_t e = b * H + j;
      if (a.d_below) static_cast<T*>(a.d_below)[e] = plus_old<T>(a.old_below, e, zbv * row[j]);
      if (a.d_zb) acc_zb += static_cast<double>(row[j]) * static_cast<double>(below[e]);
      if (a.d_h) static_cast<T*>(a.d_h)[e] = plus_old<T>(a.old_h, e, row[H + j]);
      if (above) {
        const T g = row[2 * H + j];
        if (a.d_above) static_cast<T*>(a.d_above)[e] = plus_old<T>(a.old_above, e, z[b] * g);
        if (a.d_z) acc_z += static_cast<double>(g) * static_cast<double>(above[e]);
      }
    }
    if (a.d_zb) static_cast<T*>(a.d_zb)[b] = plus_old<T>(a.old_zb, b, static_cast<T>(acc_zb));
    if (a.d_z) static_cast<T*>(a.d_z)[b] = plus_old<T>(a.old_z, b, static_cast<T>(acc_z));
  }
}

#if defined(__CUDACC__)
constexpr int kRowThreads = 256;

/// One block per row b: the elementwise gradients, then the two row sums (warp shuffles, then the
/// warps' partials in order: deterministic).
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    gate_input_backward_kernel(GateInputGrads a, std::int64_t H, std::int64_t K) {
  detail::chain_wait();  // launched chained (dualcast/launch.hpp): nothing is touched before this
  const std::int64_t b = blockIdx.x;
  const T* row = static_cast<const T*>(a.dx) + b * K;
  const T* below = static_cast<const T*>(a.below);
  const T* above = static_cast<const T*>(a.above);
  const T zbv = a.zb ? static_cast<const T*>(a.zb)[b] : T(1);
  const T zv = a.z ? static_cast<const T*>(a.z)[b] : T(0);
  double acc_zb = 0.0, acc_z = 0.0;
  for (std::int64_t j = threadIdx.x; j < H; j += kRowThreads) {
    const std::int64_t e = b * H + j;
    const T g0 = row[j];
    if (a.d_below) static_cast<T*>(a.d_below)[e] = plus_old<T>(a.old_below, e, zbv * g0);
    if (a.d_zb) acc_zb += static_cast<double>(g0) * static_cast<double>(below[e]);
    if (a.d_h) static_cast<T*>(a.d_h)[e] = plus_old<T>(a.old_h, e, row[H + j]);
    if (above) {
      const T g2 = row[2 * H + j];
      if (a.d_above) static_cast<T*>(a.d_above)[e] = plus_old<T>(a.old_above, e, zv * g2);
      if (a.d_z) acc_z += static_cast<double>(g2) * static_cast<double>(above[e]);
    }
  }
  if (!a.d_zb && !a.d_z) return;  // uniform across the block
  for (int off = 16; off > 0; off /= 2) {
    acc_zb += __shfl_down_sync(0xffffffffu, acc_zb, off);
    acc_z += __shfl_down_sync(0xffffffffu, acc_z, off);
  }
  __shared__ double part[2][kRowThreads / 32];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (lane == 0) {
    part[0][warp] = acc_zb;
    part[1][warp] = acc_z;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double s0 = 0.0, s1 = 0.0;
    for (int w = 0; w < kRowThreads / 32; ++w) {
      s0 += part[0][w];
      s1 += part[1][w];
    }
    if (a.d_zb) static_cast<T*>(a.d_zb)[b] = plus_old<T>(a.old_zb, b, static_cast<T>(s0));
    if (a.d_z) static_cast<T*>(a.d_z)[b] = plus_old<T>(a.old_z, b, static_cast<T>(s1));
  }
}
#endif

template <class T>
void gate_input_backward(Device d, const GateInputGrads& a, std::int64_t B, std::int64_t H,
                         std::int64_t K) {
  if (d.is_cpu()) return cpu_gate_input_backward<T>(a, B, H, K);
#if defined(__CUDACC__)
  detail::DeviceGuard guard(d);
  detail::launch_chained(d, gate_input_backward_kernel<T>, dim3(static_cast<unsigned>(B)), dim3(kRowThreads), 0, a,
                         H, K);
#else
  DUALCAST_FAIL("hmlstm gates on ", d.str(), ": this file was compiled without nvcc");
#endif
}

const void* ptr_or_null(const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }

/// Calls f(T{}, TS{}) with T the layer's type and TS a stack's (Stack: the same, or under Autocast a
/// 16-bit one next to float).
template <class F>
void with_stack_types(DType layer, DType stack, F&& f) {
  if (stack == DType::bfloat16) f(float{}, bfloat16{});
  else if (stack == DType::float16) f(float{}, float16{});
  else if (layer == DType::float32) f(float{}, float{});
  else f(double{}, double{});
}

// ---- the two nodes ------------------------------------------------------------------------------

/// Where one input's gradient goes. The backward kernels accumulate (the broadcast node's scheme): into
/// the buffer the input owns, or into a fresh one that starts from a gradient it does not own. Per
/// layer and step that saves the 3-5 add kernels accumulate_grad would launch (h, for one, has five
/// readers). An input met twice, or whose gradient is a strided view, gets a fresh buffer and
/// accumulate_grad afterwards.
struct Target {
  Tensor buf;
  const void* old = nullptr;
  bool adopt = false;      // the fresh buffer becomes the input's gradient
  bool add_after = false;  // accumulate_grad(buf) after the kernel
  [[nodiscard]] void* out() const { return buf.defined() ? buf.raw_data() : nullptr; }
};

/// (index into Node::inputs, shape) of the inputs a backward writes.
using Slots = std::vector<std::pair<std::size_t, Shape>>;

/// The gate inputs below, zb, h, z, above (z and above only with a layer above).
Slots gate_input_slots(std::int64_t B, std::int64_t H, bool has_above) {
  Slots s = {{0, Shape{B, H}}, {1, Shape{B, 1}}, {2, Shape{B, H}}};
  if (has_above) {
    s.emplace_back(3, Shape{B, 1});
    s.emplace_back(4, Shape{B, H});
  }
  return s;
}

/// One Target per input index (up to the largest slot); inputs that need no gradient get none.
std::vector<Target> make_targets(const Node& n, const Slots& slots, DType dt, Device d) {
  std::vector<Target> tg(n.inputs.size());
  for (const auto& [k, shape] : slots) {
    if (!n.inputs[k]) continue;
    const VarState& st = *n.inputs[k];
    bool dup = false;
    for (std::size_t j = 0; j < k; ++j) dup = dup || n.inputs[j].get() == &st;
    const bool usable = !dup && st.grad.defined() && st.grad.is_contiguous();
    Target& t = tg[k];
    if (usable && st.grad_owned) {
      t.buf = st.grad;
      t.old = st.grad.raw_data();
      continue;
    }
    t.buf = Tensor::empty(shape, dt, d);
    if (usable) t.old = st.grad.raw_data();
    t.adopt = !dup && (usable || !st.grad.defined());
    t.add_after = !t.adopt;
  }
  return tg;
}

void finish_targets(Node& n, const Slots& slots, std::vector<Target>& tg) {
  for (const auto& [k, shape] : slots) {
    Target& t = tg[k];
    if (t.adopt) {
      n.inputs[k]->grad = t.buf;
      n.inputs[k]->grad_owned = true;
    } else if (t.add_after) {
      detail::accumulate_grad(*n.inputs[k], t.buf, /*owned=*/true);
    }
  }
}

/// The gate inputs' share of a gate node's backward: dX = dS_t Wcat^T (one product), then one kernel
/// for the gradients of below, zb, h, z and above (targets tg by input index: make_targets).
void gate_inputs_backward(const Tensor& ds, const Tensor& w, const Tensor& below, const Tensor& zb, const Tensor& z,
                          const Tensor& above, std::vector<Target>& tg, std::int64_t B, std::int64_t H) {
  // Under Autocast w is Wcat^T [G, K] in the autocast dtype (gates.hpp): dS_t (Wcat^T) as stored.
  const Tensor dx = is_half(w.dtype()) ? matmul_rounded(ds, w, w.dtype())
                                       : matmul(ds, w, /*trans_a=*/false, /*trans_b=*/true);  // [B, K]
  const std::int64_t K = dx.shape()[1];
  GateInputGrads a{dx.raw_data(), below.raw_data(), ptr_or_null(zb), ptr_or_null(z), ptr_or_null(above),
                   tg[0].out(), tg[1].out(), tg[2].out(), tg[4].out(), tg[3].out(),
                   tg[0].old, tg[1].old, tg[2].old, tg[4].old, tg[3].old};
  if (dx.dtype() == DType::float32) gate_input_backward<float>(ds.device(), a, B, H, K);
  else gate_input_backward<double>(ds.device(), a, B, H, K);
}

/// Owns the layer's stacks; its backward is the one weight-gradient product (see gates.hpp).
class StackNode final : public Node {
 public:
  explicit StackNode(std::shared_ptr<LayerGates::Stack> s) : s_(std::move(s)) {}
  [[nodiscard]] const char* name() const override { return "hmlstm_stacked_weights"; }
  void backward(const std::vector<Tensor>& grad_outputs) override {
    if (!inputs[0] || !s_) return;
    LayerGates::Stack& s = *s_;
    // A step whose forward or backward never ran contributes nothing (zero blocks, never garbage).
    for (std::size_t t = 0; t < s.written.size(); ++t) {
      const auto r0 = static_cast<std::int64_t>(t) * s.B;
      if (!s.written[t]) s.x.narrow(r0, s.B).fill_(0.0);
      if (!s.deposited[t]) s.ds.narrow(r0, s.B).fill_(0.0);
    }
    Tensor dw = is_half(s.low) ? matmul_rounded(s.x, s.ds, s.low, /*trans_a=*/true)
                               : matmul(s.x, s.ds, /*trans_a=*/true, /*trans_b=*/false);
    // A padded X or dS (Stack) adds zero rows or columns: [Ks, Gs] -> [K, G].
    if (dw.shape()[0] != s.K) dw = dw.narrow(0, s.K);
    if (dw.shape()[1] != s.G) dw = slice(dw, 1, 0, s.G);
    detail::accumulate_grad(*inputs[0], std::move(dw), /*owned=*/true);
    if (grad_outputs[0].defined()) detail::accumulate_grad(*inputs[0], grad_outputs[0], false);
  }
  void release_saved() override { s_.reset(); }

 private:
  std::shared_ptr<LayerGates::Stack> s_;
};

/// Step t of one layer: inputs (below, zb, h, z, above, w), outputs (f, i, o, g, s_z).
class GateNode final : public Node {
 public:
  GateNode(std::shared_ptr<LayerGates::Stack> s, std::int64_t t, std::int64_t H, Tensor below,
           Tensor zb, Tensor z, Tensor above, Tensor w)
      : s_(std::move(s)), t_(t), H_(H), below_(std::move(below)), zb_(std::move(zb)), z_(std::move(z)),
        above_(std::move(above)), w_(std::move(w)) {}
  [[nodiscard]] const char* name() const override { return "hmlstm_gates"; }
  void backward(const std::vector<Tensor>& g) override {
    LayerGates::Stack& s = *s_;
    const std::int64_t B = s.B, H = H_;
    Tensor ds = s.ds.narrow(t_ * B, B);
    const Device d = ds.device();
    const DType dt = below_.dtype();  // the layer's dtype (the stack's may be the autocast one)
    auto p = [&](std::size_t m) { return g[m].defined() ? g[m].raw_data() : nullptr; };
    auto pack = [&](auto tag, auto stag) {
      using T = decltype(tag);
      using TS = decltype(stag);
      pack_adjoints<T, TS>(d, static_cast<TS*>(ds.raw_data()), ds.shape()[1], B, H, static_cast<const T*>(p(0)),
                           static_cast<const T*>(p(1)), static_cast<const T*>(p(2)), static_cast<const T*>(p(3)),
                           static_cast<const T*>(p(4)));
    };
    with_stack_types(dt, ds.dtype(), pack);
    s.deposited[static_cast<std::size_t>(t_)] = 1;
    bool any = false;
    for (std::size_t k = 0; k < 5; ++k) any = any || inputs[k] != nullptr;
    if (!any) return;
    const Slots slots = gate_input_slots(B, H, above_.defined());
    std::vector<Target> tg = make_targets(*this, slots, dt, d);
    gate_inputs_backward(ds, w_, below_, zb_, z_, above_, tg, B, H);
    finish_targets(*this, slots, tg);
  }
  void release_saved() override {
    s_.reset();
    below_ = zb_ = z_ = above_ = w_ = Tensor();
  }

 private:
  std::shared_ptr<LayerGates::Stack> s_;
  std::int64_t t_, H_;
  Tensor below_, zb_, z_, above_, w_;
};


// ---- the fused layer-step (mixed mode, recomputed partials) ------------------------------------

/// What the cell and boundary kernels read and write. s: the gates [B, G] (f, i, o, g, s_z by
/// columns); c, h: the state [B, H]; zflag, zbflag: [B, 1] flags (zbflag null: 1); slope: one number.
struct CellArgs {
  const void* s;
  const void* c;
  const void* h;
  const void* zflag;
  const void* zbflag;
  const void* slope;
  bool soft;
};

template <class T>
DUALCAST_HD inline auto boundary(bool soft, auto sz, T a) {
  // if/else, not ?: : two different return types would then fail to compile instead of converting.
  if (soft) return BoundarySoft{}(sz, a);
  return BoundarySte{}(sz, a);
}

/// Another layer-step's gate inputs for the cell kernel to write (NextInputs): x [B, K] in that
/// layer's stack (of the stack's dtype), `below` null for this cell's own h' times its own z',
/// `above` null for a top layer.
struct NextPack {
  void* x = nullptr;  // null: nothing to write
  std::int64_t K = 0;
  const void* below = nullptr;
  const void* zb = nullptr;
  const void* h = nullptr;
  const void* z = nullptr;
  const void* above = nullptr;
};

/// Forward: c', h' [B, H] from HmCell on plain numbers, z' [B, 1] from the boundary detector; with
/// n.x, also the row block X = [zb*below, h, z*above, 1, 0, 0, 0] of the next layer-step, the same
/// numbers gate_inputs writes (a thread recomputes z' where it is the multiplier: the same function
/// of the same numbers as the boundary column's).
template <class T, class TX>
void cell_forward(Device d, const CellArgs& a, const NextPack& n, T* c_out, T* h_out, T* z_out, std::int64_t B,
                  std::int64_t H) {
  const std::int64_t G = 4 * H + 1, W = H + 1;  // W: H cell columns and one boundary column per row
  const std::int64_t kx = n.above ? 3 * H : 2 * H;  // the next inputs' column of ones
  parallel_for(d, B * W, [=] DUALCAST_HD(std::int64_t i) {
    const std::int64_t b = i / W, j = i - b * W;
    const T* s = static_cast<const T*>(a.s) + b * G;
    TX* x = n.x ? static_cast<TX*>(n.x) + b * n.K : nullptr;
    if (j == H) {
      z_out[b] = boundary<T>(a.soft, s[4 * H], *static_cast<const T*>(a.slope));
      if (x)
        for (std::int64_t col = kx; col < n.K; ++col) x[col] = TX(col == kx ? T(1) : T(0));
      return;
    }
    const std::int64_t e = b * H + j;
    const T zb = a.zbflag ? static_cast<const T*>(a.zbflag)[b] : T(1);
    const auto r = HmCell{}(static_cast<const T*>(a.zflag)[b], zb, static_cast<const T*>(a.c)[e],
                            static_cast<const T*>(a.h)[e], s[j], s[H + j], s[2 * H + j], s[3 * H + j]);
    const T hn = std::get<1>(r);
    c_out[e] = std::get<0>(r);
    h_out[e] = hn;
    if (!x) return;
    if (!n.below) {
      const T zn = boundary<T>(a.soft, s[4 * H], *static_cast<const T*>(a.slope));
      x[j] = TX(zn * hn);
    } else {
      const T v = static_cast<const T*>(n.below)[e];
      x[j] = TX(n.zb ? static_cast<const T*>(n.zb)[b] * v : v);
    }
    x[H + j] = TX(static_cast<const T*>(n.h)[e]);
    if (n.above) x[2 * H + j] = TX(static_cast<const T*>(n.z)[b] * static_cast<const T*>(n.above)[e]);
  });
}

/// Backward: the same evaluated on dual numbers (partials by c, h, f, i, o, g; by s_z), times the
/// incoming adjoints (null: zero). Writes the gate adjoints into ds [B, G] and c's and h's gradients
/// (each starting from its `old`, which may be the output itself).
template <class T, class TS>
void cell_backward(Device d, const CellArgs& a, const T* gc, const T* gh, const T* gz, TS* ds, std::int64_t gs, T* dc,
                   const T* old_c, T* dh, const T* old_h, std::int64_t B, std::int64_t H) {
  const std::int64_t G = 4 * H + 1, W = H + 1;
  parallel_for(d, B * W, [=] DUALCAST_HD(std::int64_t i) {
    using dualcast::Dual;
    const std::int64_t b = i / W, j = i - b * W;
    const T* s = static_cast<const T*>(a.s) + b * G;
    TS* dsr = ds + b * gs;
    if (j == H) {
      const auto zt = boundary<T>(a.soft, Dual<T, 1>::variable(s[4 * H], 0), *static_cast<const T*>(a.slope));
      dsr[4 * H] = TS(gz ? gz[b] * zt.d[0] : T(0));
      for (std::int64_t col = G; col < gs; ++col) dsr[col] = TS(0);  // a padded stack's zero columns
      return;
    }
    const std::int64_t e = b * H + j;
    const T zb = a.zbflag ? static_cast<const T*>(a.zbflag)[b] : T(1);
    using D = Dual<T, 6>;
    const auto r = HmCell{}(static_cast<const T*>(a.zflag)[b], zb, D::variable(static_cast<const T*>(a.c)[e], 0),
                            D::variable(static_cast<const T*>(a.h)[e], 1), D::variable(s[j], 2),
                            D::variable(s[H + j], 3), D::variable(s[2 * H + j], 4), D::variable(s[3 * H + j], 5));
    const T ac = gc ? gc[e] : T(0), ah = gh ? gh[e] : T(0);
    T g[6];
    for (int k = 0; k < 6; ++k) g[k] = ac * std::get<0>(r).d[k] + ah * std::get<1>(r).d[k];
    dsr[j] = TS(g[2]);
    dsr[H + j] = TS(g[3]);
    dsr[2 * H + j] = TS(g[4]);
    dsr[3 * H + j] = TS(g[5]);
    if (dc) dc[e] = old_c ? old_c[e] + g[0] : g[0];
    if (dh) dh[e] = old_h ? old_h[e] + g[1] : g[1];
  });
}

/// Step t of one layer, fused: inputs (below, zb, h, z, above, w, c), outputs (c', h', z').
class FusedCellNode final : public Node {
 public:
  FusedCellNode(std::shared_ptr<LayerGates::Stack> s, std::int64_t t, std::int64_t H, Tensor gates, CellArgs cell,
                std::vector<Tensor> keep, Tensor below, Tensor zb, Tensor z, Tensor above, Tensor w)
      : s_(std::move(s)), t_(t), H_(H), gates_(std::move(gates)), cell_(cell), keep_(std::move(keep)),
        below_(std::move(below)), zb_(std::move(zb)), z_(std::move(z)), above_(std::move(above)), w_(std::move(w)) {}
  [[nodiscard]] const char* name() const override { return "hmlstm_fused_cell"; }
  void backward(const std::vector<Tensor>& g) override {
    LayerGates::Stack& s = *s_;
    const std::int64_t B = s.B, H = H_;
    Tensor ds = s.ds.narrow(t_ * B, B);
    const Device d = ds.device();
    const DType dt = gates_.dtype();  // the layer's dtype (the stack's may be the autocast one)
    const bool has_above = above_.defined();
    Slots slots = gate_input_slots(B, H, has_above);
    slots.emplace_back(6, Shape{B, H});  // c
    std::vector<Target> tg = make_targets(*this, slots, dt, d);
    auto run = [&](auto tag, auto stag) {
      using T = decltype(tag);
      using TS = decltype(stag);
      auto p = [&](std::size_t m) { return g[m].defined() ? g[m].template data<T>() : nullptr; };
      cell_backward<T, TS>(d, cell_, p(0), p(1), p(2), static_cast<TS*>(ds.raw_data()), ds.shape()[1],
                           static_cast<T*>(tg[6].out()), static_cast<const T*>(tg[6].old), static_cast<T*>(tg[2].out()),
                           static_cast<const T*>(tg[2].old), B, H);
    };
    with_stack_types(dt, ds.dtype(), run);
    s.deposited[static_cast<std::size_t>(t_)] = 1;
    if (tg[2].buf.defined()) tg[2].old = tg[2].buf.raw_data();  // h's gradient now holds the cell's part
    bool any = false;
    for (std::size_t k = 0; k < 5; ++k) any = any || inputs[k] != nullptr;
    if (any) {
      gate_inputs_backward(ds, w_, below_, zb_, z_, above_, tg, B, H);
    }
    finish_targets(*this, slots, tg);
  }
  void release_saved() override {
    s_.reset();
    gates_ = below_ = zb_ = z_ = above_ = w_ = Tensor();
    keep_.clear();
  }

 private:
  std::shared_ptr<LayerGates::Stack> s_;
  std::int64_t t_, H_;
  Tensor gates_;  // [B, G]: what the backward evaluates the cell on again
  CellArgs cell_;
  std::vector<Tensor> keep_;  // c, h, the flags and the slope that cell_ points into
  Tensor below_, zb_, z_, above_, w_;
};

}  // namespace

Var stacked_gate_weights(const Var& W, const Var& U, const Var& Td, const Var& b) {
  const std::int64_t G = W.shape()[1];
  std::vector<Var> rows{W, U};
  if (Td.defined()) rows.push_back(Td);
  rows.push_back(reshape(b, {std::int64_t{1}, G}));
  rows.push_back(Var(Tensor::zeros({3, G}, W.dtype(), W.device())));
  return concat(rows, 0);
}

LayerGates::LayerGates(const Var& wcat, std::int64_t T, std::int64_t B, std::int64_t H, bool has_above)
    : T_(T), B_(B), H_(H), has_above_(has_above) {
  const std::int64_t K = (has_above ? 3 : 2) * H + 4, G = 4 * H + 1;
  DUALCAST_CHECK(wcat.shape() == (Shape{K, G}), "LayerGates: weights of shape ", wcat.shape().str(),
                 " do not match H=", H, " (expected [", K, ", ", G, "])");
  // Under Autocast the adjoint stack is 16-bit with rows padded to 16 bytes (Stack::ds), and so the
  // backward's weight Wcat^T gets as many zero rows.
  const bool autocast = autocast_enabled() && wcat.dtype() == DType::float32;
  const std::int64_t gs = autocast ? (G + 7) / 8 * 8 : G, ks = autocast ? (K + 7) / 8 * 8 : K;
  xtype_ = autocast ? autocast_dtype() : wcat.dtype();
  if (grad_enabled() && wcat.requires_grad()) {
    stack_ = std::make_shared<Stack>();
    stack_->x = Tensor::empty({T * B, ks}, xtype_, wcat.device());
    stack_->ds = Tensor::empty({T * B, gs}, gs == G ? wcat.dtype() : autocast_dtype(), wcat.device());
    stack_->written.assign(static_cast<std::size_t>(T), 0);
    stack_->deposited.assign(static_cast<std::size_t>(T), 0);
    stack_->packed_from.assign(static_cast<std::size_t>(T), {});
    stack_->B = B;
    stack_->G = G;
    stack_->K = K;
    w_ = detail::record1(std::make_shared<StackNode>(stack_), {wcat}, wcat.value());
  } else {
    w_ = Var(wcat.value());
  }
  if (autocast) {
    low_ = autocast_dtype();
    Tensor wt = transpose(wcat.value().to(low_));  // [G, K]: rounded once for the T steps
    if (ks != K) wt = concat({wt, Tensor::zeros({G, ks - K}, low_, wt.device())}, 1);
    wlow_ = gs == G ? wt : concat({wt, Tensor::zeros({gs - G, ks}, low_, wt.device())}, 0);  // [gs, ks]
    if (stack_) stack_->low = low_;
  }
}

namespace {

/// A gate or cell input must be a contiguous [rows, cols] tensor of the layer's dtype and device.
void check_input(const char* what, const Tensor& v, std::int64_t rows, std::int64_t cols, const Tensor& w) {
  DUALCAST_CHECK(v.defined() && v.shape() == (Shape{rows, cols}) && v.is_contiguous() && v.dtype() == w.dtype() &&
                     v.device() == w.device(),
                 "LayerGates: ", what, " must be a contiguous [", rows, ", ", cols, "] ", dtype_name(w.dtype()),
                 " tensor on ", w.device().str(), "; got ", v.defined() ? v.str() : std::string("an undefined one"));
}

}  // namespace

LayerGates::StepValues LayerGates::products(std::int64_t t, const Var& below, const Var& zb, const Var& h,
                                            const Var& z, const Var& h_above) {
  DUALCAST_CHECK(t >= 0 && t < T_, "LayerGates::step: step ", t, " outside [0, ", T_, ")");
  const Tensor& w = w_.value();
  const std::int64_t K = w.shape()[0], B = B_, H = H_;
  const Device d = w.device();
  StepValues v;
  v.below = below.value();
  check_input("below", v.below, B, H, w);
  check_input("h", h.value(), B, H, w);
  if (zb.defined()) {
    v.zb = zb.value();
    check_input("zb", v.zb, B, 1, w);
  }
  if (has_above_) {
    v.z = z.value();
    v.above = h_above.value();
    check_input("z", v.z, B, 1, w);
    check_input("h_above", v.above, B, H, w);
  }
  const bool track = stack_ != nullptr && grad_enabled();
  const std::int64_t ks = is_half(low_) ? wlow_.shape()[1] : K;  // X's row length (Stack::x)
  Tensor x = track ? stack_->x.narrow(t * B, B) : Tensor::empty({B, ks}, xtype_, d);
  // Written ahead by the cell kernel before (cell_step's NextInputs) from these very inputs: done.
  bool packed = false;
  if (track) {
    std::array<Tensor, 5>& held = stack_->packed_from[static_cast<std::size_t>(t)];
    const std::array<const Tensor*, 5> now = {&v.below, &v.zb, &h.value(), &v.z, &v.above};
    packed = held[2].defined();
    for (std::size_t k = 0; k < 5; ++k) packed = packed && ptr_or_null(held[k]) == ptr_or_null(*now[k]);
    held = {};  // used once: no stale match later, and the inputs are let go
  }
  auto run = [&](auto tag, auto xtag) {
    using T = decltype(tag);
    using TX = decltype(xtag);
    auto p = [](const Tensor& u) { return u.defined() ? u.template data<T>() : nullptr; };
    gate_inputs<T, TX>(d, static_cast<TX*>(x.raw_data()), B, H, ks, v.below.data<T>(), p(v.zb), h.value().data<T>(),
                       p(v.z), p(v.above));
  };
  if (!packed) with_stack_types(w.dtype(), xtype_, run);
  if (track) stack_->written[static_cast<std::size_t>(t)] = 1;
  v.s = is_half(low_) ? matmul_rounded(x, wlow_.narrow(0, 4 * H + 1), low_, false, /*trans_b=*/true)
                      : matmul(x, w);  // [B, G]
  return v;
}

std::vector<Var> LayerGates::step(std::int64_t t, const Var& below, const Var& zb, const Var& h,
                                  const Var& z, const Var& h_above) {
  const StepValues v = products(t, below, zb, h, z, h_above);
  const std::int64_t H = H_;
  std::vector<Tensor> gates = split(v.s, 1, {H, H, H, H, std::int64_t{1}});
  if (stack_ == nullptr || !grad_enabled()) return {gates.begin(), gates.end()};
  auto node = std::make_shared<GateNode>(stack_, t, H, v.below, v.zb, v.z, v.above, is_half(low_) ? wlow_ : w_.value());
  return detail::record(std::move(node), {below, zb, h, has_above_ ? z : Var(), has_above_ ? h_above : Var(), w_},
                        std::move(gates));
}

std::vector<Var> LayerGates::cell_step(std::int64_t t, const Var& below, const Var& zb, const Var& h, const Var& z,
                                       const Var& h_above, const Var& c, const Tensor& zflag, const Tensor& zbflag,
                                       const Tensor& slope, bool soft, const NextInputs& next) {
  const std::int64_t B = B_, H = H_;
  const Tensor& w = w_.value();
  check_input("c", c.value(), B, H, w);
  check_input("zflag", zflag, B, 1, w);
  if (zbflag.defined()) check_input("zbflag", zbflag, B, 1, w);
  check_input("slope", slope, 1, 1, w);
  // The next layer-step's gate inputs, for this kernel to write (NextInputs): into a stack that
  // records them, of this layer's dtype, device and sizes, from inputs checked as that step checks
  // them, before any work is issued.
  LayerGates* nl = next.layer != nullptr && next.layer->stack_ != nullptr && grad_enabled() ? next.layer : nullptr;
  Tensor nb, nzb, nh, nz, na;
  if (nl != nullptr) {
    const Tensor& nw = nl->w_.value();
    DUALCAST_CHECK(nw.dtype() == w.dtype() && nl->low_ == low_ && nw.device() == w.device() && nl->B_ == B &&
                       nl->H_ == H && next.t >= 0 && next.t < nl->T_,
                   "LayerGates::cell_step: the next layer-step (step ", next.t, " of a layer of ", dtype_name(nw.dtype()),
                   " on ", nw.device().str(), ", B=", nl->B_, ", H=", nl->H_, ", T=", nl->T_,
                   ", products in ", dtype_name(nl->low_), ") does not match this one (", dtype_name(w.dtype()),
                   " on ", w.device().str(), ", B=", B, ", H=", H, ", products in ", dtype_name(low_), ")");
    // Its stack block is read again by the weight gradient: a step that ran already keeps its inputs.
    DUALCAST_CHECK(!nl->stack_->written[static_cast<std::size_t>(next.t)], "LayerGates::cell_step: the next ",
                   "layer-step (step ", next.t, ") has run already; its gate inputs cannot be written again");
    if (!next.from_this_cell) {
      nb = next.below.value();
      check_input("the next step's below", nb, B, H, nw);
      if (next.zb.defined()) {
        nzb = next.zb.value();
        check_input("the next step's zb", nzb, B, 1, nw);
      }
    }
    nh = next.h.value();
    check_input("the next step's h", nh, B, H, nw);
    if (nl->has_above_) {
      nz = next.z.value();
      na = next.h_above.value();
      check_input("the next step's z", nz, B, 1, nw);
      check_input("the next step's h_above", na, B, H, nw);
    }
  }
  const StepValues v = products(t, below, zb, h, z, h_above);
  const Device d = v.s.device();
  const DType dt = v.s.dtype();
  const CellArgs args{v.s.raw_data(), c.value().raw_data(), h.value().raw_data(), zflag.raw_data(),
                      zbflag.defined() ? zbflag.raw_data() : nullptr, slope.raw_data(), soft};
  std::vector<Tensor> outs = {Tensor::empty({B, H}, dt, d), Tensor::empty({B, H}, dt, d), Tensor::empty({B, 1}, dt, d)};
  NextPack pack;
  if (nl != nullptr) {
    const Tensor own_h = next.from_this_cell ? outs[1] : nb;
    const Tensor own_z = next.from_this_cell ? outs[2] : nzb;
    pack.x = nl->stack_->x.narrow(next.t * B, B).raw_data();
    pack.K = nl->stack_->x.shape()[1];
    pack.below = next.from_this_cell ? nullptr : nb.raw_data();
    pack.zb = next.from_this_cell ? nullptr : ptr_or_null(nzb);
    pack.h = nh.raw_data();
    pack.z = ptr_or_null(nz);
    pack.above = ptr_or_null(na);
    nl->stack_->packed_from[static_cast<std::size_t>(next.t)] = {own_h, own_z, nh, nz, na};
  }
  with_stack_types(dt, xtype_, [&](auto tag, auto xtag) {  // the next layer's X is of this type (checked)
    using T = decltype(tag);
    cell_forward<T, decltype(xtag)>(d, args, pack, outs[0].data<T>(), outs[1].data<T>(), outs[2].data<T>(), B, H);
  });
  if (stack_ == nullptr || !grad_enabled()) return {outs.begin(), outs.end()};
  // The node keeps what `args` points into: the gates, c, h, the flags and the slope.
  auto node = std::make_shared<FusedCellNode>(stack_, t, H, v.s, args,
                                              std::vector<Tensor>{c.value(), h.value(), zflag, zbflag, slope}, v.below,
                                              v.zb, v.z, v.above, is_half(low_) ? wlow_ : w);
  return detail::record(std::move(node),
                        {below, zb, h, has_above_ ? z : Var(), has_above_ ? h_above : Var(), w_, c}, std::move(outs));
}

}  // namespace hmlstm
