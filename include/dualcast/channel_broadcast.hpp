// channel_broadcast.hpp: channel_broadcast(f, args...), the mixed-mode broadcast of convolutional
// networks. Like broadcast(f, args...) (broadcast.hpp), f is written once for numbers and duals and runs
// as ONE fused kernel forward and ONE backward, recorded as one tape node; here the arguments follow
// the NCHW pattern of a network's elementwise layers:
//   * full-size tensors of the output's shape [N, C, *] (activations, residuals),
//   * per-channel tensors [C] or [1, C, 1, ..] (batch-norm statistics, scale and shift, biases),
//   * plain numbers.
// The gradient of a per-channel Var is a sum over N and the spatial positions. broadcast() would
// write it as a full-size buffer and reduce it afterwards (two extra passes per argument);
// channel_broadcast sums it inside the backward kernel, which visits each channel's elements in
// slices, re-evaluates f on duals and accumulates adj * df/dp in registers. So batch-norm apply,
// ReLU and a residual add are one kernel forward and one backward, whatever the number of
// per-channel parameters:
//
//   struct BnAddRelu {  // relu((x - mean) * rstd * gamma + beta + residual)
//     DUALCAST_HD auto operator()(auto x, auto mean, auto rstd, auto gamma, auto beta, auto r) const {
//       return relu((x - mean) * rstd * gamma + beta + r);
//     }
//   };
//   Var y = channel_broadcast(BnAddRelu{}, x, st.mean, st.rstd, gamma, beta, residual);
//
// f's forms are broadcast()'s host-device ones: a namespace-scope functor with
// `DUALCAST_HD auto operator()(auto...) const`, or a DUALCAST_HD lambda with explicit types (Dual<T, K>
// for each Var, T for each Tensor or number). One output. Partials are always recomputed (nothing is
// stored); the node keeps its arguments. Per-channel sums are added in a fixed order (per slice, then
// the slices in order), so results do not depend on thread timing. Shapes, devices and dtypes are
// checked once, with messages that name the argument and the shapes.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "dualcast/call_args.hpp"
#include "dualcast/dual.hpp"
#include "dualcast/error.hpp"
#include "dualcast/math.hpp"
#include "dualcast/ops/reduce.hpp"
#include "dualcast/parallel.hpp"
#include "dualcast/tape.hpp"
#include "dualcast/kernels/channel_broadcast.cuh"

namespace dualcast {

namespace detail {

/// One argument of a call, as the plan sees it.
struct ChannelArg : ArgInfo {
  int access = static_cast<int>(ChannelAccess::number);  ///< filled in by the plan
};

template <class A>
ChannelArg describe_channel_arg(const A& a) {
  // channel_broadcast has always reported an undefined Var through Var::value's own message.
  if constexpr (arg_kind_v<A> == kVarArg) (void)a.value();
  return ChannelArg{describe_arg(a)};
}

/// Checks of a call: one device, one floating dtype (uint8 masks are converted), the output shape
/// [N, C, *] (the largest tensor argument, rank >= 2), each tensor full-size or per-channel. Tensors
/// are made contiguous; full-size ones are stored in the call's dtype, per-channel ones in its compute
/// type (float32 for a 16-bit call: their C values cost nothing to convert, and a 16-bit statistic
/// would lose what the float32 one holds). With keep_activation_dtype (ChannelOptions) only the
/// full-size arguments decide the dtype.
struct ChannelPlan {
  Shape out_shape;
  DType dtype = DType::float32;
  Device device{};
  std::int64_t N = 0, C = 0, inner = 1;
  std::vector<ChannelArg> args;
};
ChannelPlan plan_channel_broadcast(std::vector<ChannelArg> args, bool keep_activation_dtype = false);
/// Slices per channel of the backward pass: enough tasks to fill the device, none shorter than a few
/// thousand elements (on a GPU in columns, channel_columns: enough blocks of 32 channels, none
/// shorter than 64 rows).
std::int64_t channel_slices(Device device, std::int64_t C, std::int64_t M, std::int64_t inner);

/// Operands of a call whose tensors are stored as S.
template <class S, int NA>
ChannelOperands<compute_t<S>, NA, S> make_channel_operands(const ChannelPlan& plan) {
  using T = compute_t<S>;
  ChannelOperands<T, NA, S> ops;
  ops.n = plan.out_shape.numel();
  ops.C = plan.C;
  ops.inner = plan.inner;
  ops.rows = plan.inner == 1;
  ops.vec = ops.rows ? plan.C % cb_width<T> == 0 : plan.inner % cb_width<T> == 0;
  for (int a = 0; a < NA; ++a) {
    const ChannelArg& info = plan.args[static_cast<std::size_t>(a)];
    ops.access[a] = info.access;
    // The plan stores full-size tensors as S and per-channel ones in the compute type T.
    if (info.access == static_cast<int>(ChannelAccess::full)) ops.in[a] = info.tensor.template data<S>();
    if (info.access == static_cast<int>(ChannelAccess::channel)) ops.chan[a] = info.tensor.template data<T>();
    ops.scal[a] = static_cast<T>(info.number);
    if (info.access == static_cast<int>(ChannelAccess::full) &&
        reinterpret_cast<std::uintptr_t>(ops.in[a]) % 16 != 0)
      ops.vec = false;
  }
  return ops;
}

/// T is the storage type of the call's tensors.
template <class F, class T, int K, class Slots>
class ChannelBroadcastNode final : public Node {
 public:
  static constexpr int NA = static_cast<int>(Slots::size());
  static_assert(K >= 1 && K <= 16, "channel_broadcast: between 1 and 16 Var arguments");
  ChannelBroadcastNode(const F& f, ChannelPlan plan) : f_(f), plan_(std::move(plan)) {}
  [[nodiscard]] const char* name() const override { return "channel_broadcast"; }
  void release_saved() override { plan_.args.clear(); }

  void backward(const std::vector<Tensor>& grad_outputs) override {
    if (!grad_outputs[0].defined()) return;
    const Tensor g = contiguous_copy(grad_outputs[0]);
    const Device dev = plan_.device;
    ChannelBackwardBody<T, K, F, Slots> body{f_};
    body.ops = make_channel_operands<T, NA>(plan_);
    body.adj = g.template data<T>();
    body.M = plan_.N * plan_.inner;
    body.S = channel_slices(dev, plan_.C, body.M, plan_.inner);
    // Channels-last rows take the element path here: a chunk would span V channels, and each
    // element's per-channel gradients go to its own channel's sums.
    if (!aligned16(body.adj) || body.ops.rows) body.ops.vec = false;

    // Slot k -> argument index.
    std::array<int, K> arg_of{};
    for (int a = 0, k = 0; a < NA; ++a)
      if (plan_.args[static_cast<std::size_t>(a)].kind == kVarArg) arg_of[static_cast<std::size_t>(k++)] = a;

    std::array<Tensor, K> buffers;
    std::array<int, K> mode{};  // 0 none, 1 fresh -> becomes the gradient, 2 in place, 3 accumulate
    std::vector<const VarState*> seen;
    int reduced = 0;
    int slot_of[16] = {};
    for (int k = 0; k < K; ++k) {
      const auto& in = inputs[static_cast<std::size_t>(k)];
      if (!in) continue;
      const ChannelArg& arg = plan_.args[static_cast<std::size_t>(arg_of[static_cast<std::size_t>(k)])];
      if (arg.access == static_cast<int>(ChannelAccess::channel)) {
        body.reduce[k] = true;
        slot_of[reduced++] = k;
        continue;
      }
      bool dup = false;
      for (const VarState* s : seen) dup = dup || s == in.get();
      seen.push_back(in.get());
      auto& buf = buffers[static_cast<std::size_t>(k)];
      const bool own_dtype = in->value.dtype() == plan_.dtype;  // else a promoted 16-bit Var
      if (!dup && own_dtype && in->grad.defined() && in->grad_owned) {
        buf = in->grad;
        mode[static_cast<std::size_t>(k)] = 2;
        body.gold[k] = true;
      } else {
        buf = Tensor::empty(plan_.out_shape, plan_.dtype, dev);
        mode[static_cast<std::size_t>(k)] = (!dup && own_dtype && !in->grad.defined()) ? 1 : 3;
      }
      body.gout[k] = buf.template data<T>();
      if (!aligned16(body.gout[k])) body.ops.vec = false;
    }
    using Acc = compute_t<T>;  // partial sums of per-channel gradients: never 16-bit
    Tensor partial;
    if (reduced > 0) {
      partial = Tensor::empty(Shape{K * plan_.C * body.S}, dtype_of<Acc>(), dev);
      body.partial = partial.template data<Acc>();
    }
    launch_channel_backward<Acc, K>(dev, body);

    if (reduced > 0) {
      // Summed in Acc and converted once to each Var's own dtype (a float32 parameter of a 16-bit
      // call gets float32 sums, never 16-bit ones).
      std::array<Tensor, 16> sums;
      ChannelPartialSum<Acc, Acc> fin;
      fin.partial = body.partial;
      fin.C = plan_.C;
      fin.S = body.S;
      for (int r = 0; r < reduced; ++r) {
        const int k = slot_of[r];
        const ChannelArg& arg = plan_.args[static_cast<std::size_t>(arg_of[static_cast<std::size_t>(k)])];
        sums[static_cast<std::size_t>(r)] = Tensor::empty(arg.tensor.shape(), dtype_of<Acc>(), dev);
        fin.out[r] = sums[static_cast<std::size_t>(r)].template data<Acc>();
        fin.slot_of[r] = k;
      }
      parallel_for(dev, reduced * plan_.C, fin);
      for (int r = 0; r < reduced; ++r)
        accumulate_grad(*inputs[static_cast<std::size_t>(slot_of[r])],
                        sums[static_cast<std::size_t>(r)].to(inputs[static_cast<std::size_t>(slot_of[r])]->value.dtype()),
                        /*owned=*/true);
    }
    for (int k = 0; k < K; ++k) {
      const auto& in = inputs[static_cast<std::size_t>(k)];
      const int m = mode[static_cast<std::size_t>(k)];
      if (m == 1) {
        in->grad = buffers[static_cast<std::size_t>(k)];
        in->grad_owned = true;
      } else if (m == 3) {
        accumulate_grad(*in, buffers[static_cast<std::size_t>(k)].to(in->value.dtype()), /*owned=*/true);
      }
    }
  }

 private:
  F f_;
  ChannelPlan plan_;
};

template <class T, class F, class... Args>
Var channel_broadcast_typed(const F& f, ChannelPlan plan, const std::vector<Var>& vars) {
  using List = ArgList<Args...>;
  constexpr int K = List::vars;
  constexpr int NA = List::count;
  using Slots = typename List::Slots;
  constexpr bool plain_ok = callable_v<F, compute_t<T>, K, false, Args...>;

  Tensor out = Tensor::empty(plan.out_shape, plan.dtype, plan.device);
  const std::int64_t n = out.numel();
  if (n > 0) {
    constexpr int V = cb_width<compute_t<T>>;
    ChannelForwardBody<T, K, !plain_ok, F, Slots> body{f};
    body.ops = make_channel_operands<T, NA>(plan);
    body.out = out.template data<T>();
    if (!aligned16(body.out)) body.ops.vec = false;
    parallel_for(plan.device, (n + V - 1) / V, body, kCpuGrain / V);
  }
  std::shared_ptr<Node> node;
  if constexpr (K > 0) {
    if (any_requires_grad(vars) && n > 0)
      node = std::make_shared<ChannelBroadcastNode<F, T, K, Slots>>(f, std::move(plan));
  }
  return record1(std::move(node), vars, std::move(out));
}

}  // namespace detail

/// How channel_broadcast types its result.
struct ChannelOptions {
  /// false (the default): every tensor argument takes part in type promotion, as in broadcast(): a
  /// 16-bit activation with float32 per-channel arguments gives a float32 result.
  /// true: the full-size arguments alone decide the dtype, as PyTorch's batch_norm does under
  /// autocast (a bfloat16 activation normalised with float32 statistics and parameters stays
  /// bfloat16). The per-channel arguments are read in the compute type (float32 for 16-bit
  /// activations) and their gradients come back in their own dtype; the full-size arguments'
  /// gradients are in theirs. So a 16-bit network moves 16 bits per element through its
  /// normalisations, where the default would write and read a float32 copy.
  bool keep_activation_dtype = false;
};

namespace detail {

template <class F, class... Args>
Var channel_broadcast_impl(const ChannelOptions& options, const F& f, const Args&... args) {
  static_assert(((detail::arg_kind_v<Args> != detail::kBadArg) && ...),
                "channel_broadcast: every argument must be a dualcast::Var (differentiated), a "
                "dualcast::Tensor (constant) or a plain number");
  using List = detail::ArgList<Args...>;
  constexpr int K = List::vars;
  static_assert(K <= 16, "channel_broadcast: at most 16 Var arguments");
  static_assert(!detail::is_device_only_lambda<F>,
                "channel_broadcast: f must run on the host too (a functor with a DUALCAST_HD "
                "operator() or a DUALCAST_HD lambda with explicit parameter types)");
  constexpr bool float_ok = detail::callable_v<F, float, K, (K > 0), Args...>;
  constexpr bool double_ok = detail::callable_v<F, double, K, (K > 0), Args...>;
  static_assert(float_ok || double_ok,
                "channel_broadcast: f cannot be called with these arguments. Each Var argument is "
                "passed as Dual<T, K> (K = number of Var arguments) and each Tensor or number as T "
                "(float or double): write f as a functor with `DUALCAST_HD auto operator()(auto...) "
                "const`, or as a DUALCAST_HD lambda with exactly those parameter types");

  detail::ChannelPlan plan =
      detail::plan_channel_broadcast({detail::describe_channel_arg(args)...}, options.keep_activation_dtype);
  std::vector<Var> vars;
  (detail::collect_var(vars, args), ...);
  if constexpr (float_ok) {
    switch (plan.dtype) {
      case DType::float32: return detail::channel_broadcast_typed<float, F, Args...>(f, std::move(plan), vars);
      case DType::bfloat16: return detail::channel_broadcast_typed<bfloat16, F, Args...>(f, std::move(plan), vars);
      case DType::float16: return detail::channel_broadcast_typed<float16, F, Args...>(f, std::move(plan), vars);
      default: break;
    }
  }
  if constexpr (double_ok) {
    if (plan.dtype == DType::float64)
      return detail::channel_broadcast_typed<double, F, Args...>(f, std::move(plan), vars);
  }
  DUALCAST_FAIL("channel_broadcast: f cannot be called with ", dtype_name(plan.dtype),
                " arguments (its parameter types fix the other element type)");
}

}  // namespace detail

/// Applies f elementwise over NCHW arguments (full-size [N, C, *], per-channel [C] / [1, C, 1, ..],
/// or numbers; see the top of this header), differentiating with respect to every Var argument in
/// one fused forward kernel and one fused backward kernel that also reduces the per-channel
/// gradients. Returns the output, of the full-size arguments' shape.
template <class F, class... Args>
Var channel_broadcast(const F& f, const Args&... args) {
  return detail::channel_broadcast_impl(ChannelOptions{}, f, args...);
}

/// The same, typed as `options` says (ChannelOptions::keep_activation_dtype).
template <class F, class... Args>
Var channel_broadcast(const ChannelOptions& options, const F& f, const Args&... args) {
  return detail::channel_broadcast_impl(options, f, args...);
}

}  // namespace dualcast
