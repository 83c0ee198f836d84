// broadcast.hpp: broadcast(f, args...), the mixed-mode front end. f is evaluated elementwise on dual
// numbers, one partial per Var argument, in ONE fused kernel; the call records ONE tape node whose
// backward turns the per-element partials into gradients (summed over broadcast dimensions).
//
// f may be written three ways (nvcc rejects generic __host__ __device__ lambdas):
//  * a namespace-scope functor with `DUALCAST_HD auto operator()(auto...) const` (CPU and GPU;
//    also runs on plain numbers, and in select-form on Vars);
//  * a DUALCAST_HD lambda with explicit types: Dual<T, K> for every Var argument, T for every Tensor
//    or number argument (K = number of Var arguments; CPU and GPU);
//  * a generic __device__ lambda (GPU only; a single output).
// f may use if/else, early returns, loops and locals: only values steer control flow.
//
// dtypes: float32, float64, bfloat16, float16. A 16-bit call moves 16 bits per element and computes
// in float: f runs on float and Dual<float, K> (write f for float, or generically), outputs,
// gradients and stored partials are rounded once to the 16-bit type. float32 and 16-bit arguments
// promote to float32 as in PyTorch (the 16-bit ones are converted first, their gradients converted
// back); plain numbers never promote; float64 mixes with nothing.
//
// Every call site compiles its f for each storage type it can take: float32, float64, and (f being
// callable with float) bfloat16 and float16, twice the kernels of float alone. A translation unit
// that never sees 16-bit tensors may define DUALCAST_BROADCAST_HALF=0 (before including dualcast)
// to compile float32 and float64 only; a 16-bit call there is a dualcast::Error saying so. Define it
// alike in every translation unit that instantiates the same functor with the same argument types.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dualcast/call_args.hpp"
#include "dualcast/dual.hpp"
#include "dualcast/error.hpp"
#include "dualcast/indexing.hpp"
#include "dualcast/math.hpp"
#include "dualcast/ops/reduce.hpp"
#include "dualcast/parallel.hpp"
#include "dualcast/tape.hpp"
#include "dualcast/kernels/broadcast.cuh"

#ifndef DUALCAST_BROADCAST_HALF
#define DUALCAST_BROADCAST_HALF 1
#endif

namespace dualcast {

/// Where the backward pass gets f's partials from.
enum class Partials {
  automatic,  ///< the measured default (recompute; see experiments/broadcast/NOTES.md)
  store,      ///< forward writes K partials per output element; backward reads them (Revels 2018)
  recompute,  ///< nothing extra stored; backward re-evaluates f on duals from the saved inputs
};

inline const char* partials_name(Partials p) {
  switch (p) {
    case Partials::store: return "store";
    case Partials::recompute: return "recompute";
    default: return "automatic";
  }
}

namespace detail {

// ---- compile-time description of the argument list -----------------------------------------------
// ArgList, arg_kind_v, arg_type_t and callable_v: call_args.hpp.

template <class F, class T, int K, bool DUAL, class... Args>
struct ResultOf {
  using type = std::invoke_result_t<const F&, arg_type_t<T, K, DUAL, Args>...>;
};

/// f's result type, asked lazily: the host cannot see a __device__ lambda's result type, and such a
/// lambda is taken to return a single value.
template <bool kDeviceLambda, class F, class T, int K, class... Args>
struct ResultFor {
  using type = T;
};
template <class F, class T, int K, class... Args>
struct ResultFor<false, F, T, K, Args...> {
  using type = typename ResultOf<F, T, K, (K > 0), Args...>::type;
};

// ---- runtime description of one call ---------------------------------------------------------------
// ArgInfo and describe_arg: call_args.hpp.

/// Shape checks, dtype and device of a broadcast call; converts uint8 masks, and 16-bit arguments of
/// a call that promotes to float32, to the call's dtype.
struct CallPlan {
  Shape out_shape;
  DType dtype = DType::float32;
  Device device{};
  std::vector<ArgInfo> args;
};
CallPlan plan_broadcast(std::vector<ArgInfo> args);

/// The operands of a call whose tensors are stored as S, and which path (fast or general) can run
/// it with chunks of V elements.
template <class S, int NA>
BroadcastOperands<compute_t<S>, NA, S> make_operands(const CallPlan& plan, int V) {
  using T = compute_t<S>;
  BroadcastOperands<T, NA, S> ops;
  std::vector<Shape> shapes(static_cast<std::size_t>(NA));
  bool present[NA > 0 ? NA : 1] = {};
  for (int a = 0; a < NA; ++a) {
    const auto& t = plan.args[static_cast<std::size_t>(a)].tensor;
    if (t.defined()) shapes[static_cast<std::size_t>(a)] = t.shape();
    present[a] = t.defined();
  }
  ops.ix = make_indexer<NA>(plan.out_shape, shapes);
  ops.n = plan.out_shape.numel();
  ops.vec = true;
  for (int a = 0; a < NA; ++a) {
    const auto& info = plan.args[static_cast<std::size_t>(a)];
    ops.in[a] = info.tensor.defined() ? info.tensor.template data<S>() : nullptr;
    ops.scal[a] = static_cast<T>(info.number);
    if (!ops.in[a]) ops.ix.access[a] = Access::scalar;
    if (ops.in[a] && ops.ix.access[a] != Access::scalar && !aligned16(ops.in[a])) ops.vec = false;
  }
  ops.fast = ops.vec && make_chunk_indexer(ops.ix, ops.n, V, present, ops.cix);
  return ops;
}

/// Clears the fast and vector paths when an extra packet operand (output, adjoint, gradient,
/// partials) is not 16-byte aligned.
template <class Ops>
void require_aligned(Ops& ops, const void* p) {
  if (p && !aligned16(p)) ops.vec = ops.fast = false;
}

/// Where the gradient of one differentiated argument goes in a backward launch.
struct GradTarget {
  std::shared_ptr<VarState> state;
  Tensor buffer;      ///< written by the kernel (full output size)
  bool direct = false;  ///< buffer becomes the variable's gradient (same shape as the output)
};

// ---- the tape node ------------------------------------------------------------------------------
/// kStorable=false compiles only the recompute kernels (the op library's one-primitive nodes, which
/// never store partials), halving what nvcc instantiates for them. T is the storage type of the
/// call's tensors (bfloat16 and float16 compute in float).
template <class F, class T, int K, int M, class Slots, bool kStorable>
class BroadcastNode final : public Node {
 public:
  static constexpr int NA = static_cast<int>(Slots::size());
  BroadcastNode(const F& f, CallPlan plan, Partials policy, std::vector<Tensor> partials)
      : f_(f), plan_(std::move(plan)), policy_(policy), partials_(std::move(partials)) {}

  [[nodiscard]] const char* name() const override { return "broadcast"; }

  void release_saved() override {
    plan_.args.clear();
    partials_.clear();
  }

  void backward(const std::vector<Tensor>& grad_outputs) override {
    const Device dev = plan_.device;
    const Shape& out_shape = plan_.out_shape;
    // Argument shapes by slot (the Var arguments, in order).
    std::vector<Shape> var_shapes;
    for (const auto& a : plan_.args)
      if (a.kind == kVarArg) var_shapes.push_back(a.tensor.shape());
    if (out_shape.numel() == 0) {
      // Nothing was computed, so nothing flows back: each input's gradient is zeros of its shape
      // (empty, or zeros for a non-empty argument broadcast against an empty one).
      for (int k = 0; k < K; ++k)
        if (const auto& in = inputs[static_cast<std::size_t>(k)])
          accumulate_grad(*in, Tensor::zeros(var_shapes[static_cast<std::size_t>(k)], in->value.dtype(), dev),
                          /*owned=*/true);
      return;
    }

    std::array<GradTarget, K> targets;
    std::vector<const VarState*> direct_seen;
    for (int k = 0; k < K; ++k) {
      const auto& in = inputs[static_cast<std::size_t>(k)];
      if (!in) continue;
      GradTarget& t = targets[static_cast<std::size_t>(k)];
      t.state = in;
      bool dup = false;
      for (const VarState* s : direct_seen) dup = dup || s == in.get();
      // A gradient of the output's shape is written in place (or fresh) by the kernel; a broadcast
      // argument, or one appearing twice, gets a full-size buffer reduced or added afterwards.
      t.direct = !dup && var_shapes[static_cast<std::size_t>(k)] == out_shape &&
                 in->value.dtype() == plan_.dtype;
      if (t.direct) {
        direct_seen.push_back(in.get());
        if (in->grad.defined() && in->grad_owned) t.buffer = in->grad;
      }
      if (!t.buffer.defined()) t.buffer = Tensor::empty(out_shape, plan_.dtype, dev);
    }

    // Bodies are built around f (extended lambdas are copyable but neither default-constructible
    // nor assignable).
    BackwardBody<T, K, M, false, F, Slots> rb{f_};
    BackwardBody<T, K, M, true, F, Slots> sb{f_};
    auto fill = [&](auto& body) {
      body.ops = make_operands<T, NA>(plan_, std::remove_cvref_t<decltype(body)>::V);
      for (int m = 0; m < M; ++m) {
        const Tensor& g = grad_outputs[static_cast<std::size_t>(m)];
        body.adj[m] = g.defined() ? g.template data<T>() : nullptr;
        require_aligned(body.ops, body.adj[m]);
      }
      for (int k = 0; k < K; ++k) {
        GradTarget& t = targets[static_cast<std::size_t>(k)];
        body.gout[k] = t.state ? t.buffer.template data<T>() : nullptr;
        body.gold[k] = (t.state && t.direct && t.state->grad.defined())
                           ? t.state->grad.template data<T>()
                           : nullptr;
        // A direct gradient waits for the optimizer; a broadcast argument's buffer is reduced
        // by sum_to at once and should stay in cache.
        body.stream_out[k] = t.state && t.direct;
        require_aligned(body.ops, body.gout[k]);
        require_aligned(body.ops, body.gold[k]);
      }
    };
    if constexpr (kStorable) {
      if (policy_ == Partials::store) {
        fill(sb);
        for (int m = 0; m < M; ++m)
          for (int k = 0; k < K; ++k) {
            const Tensor& p = partials_[static_cast<std::size_t>(m * K + k)];
            sb.part[m][k] = p.defined() ? p.template data<T>() : nullptr;
            require_aligned(sb.ops, sb.part[m][k]);
          }
        launch_broadcast(dev, sb);
      }
    }
    if (policy_ != Partials::store) {
      fill(rb);
      launch_broadcast(dev, rb);
    }

    for (int k = 0; k < K; ++k) {
      GradTarget& t = targets[static_cast<std::size_t>(k)];
      if (!t.state) continue;
      if (t.direct) {
        t.state->grad = t.buffer;
        t.state->grad_owned = true;
      } else {
        // A promoted argument (a 16-bit Var in a float32 call) gets its gradient in its own dtype.
        accumulate_grad(*t.state,
                        sum_to(t.buffer, var_shapes[static_cast<std::size_t>(k)]).to(t.state->value.dtype()),
                        /*owned=*/true);
      }
    }
  }

 private:
  F f_;
  CallPlan plan_;
  Partials policy_;
  std::vector<Tensor> partials_;  ///< [m * K + k], store policy only
};

template <class R>
using output_array_t = std::array<Var, OutputTraits<R>::count>;

/// Runs the forward pass for tensors stored as S (f computing on compute_t<S>) and records the node.
template <class S, bool kStorable, class F, class... Args>
auto broadcast_typed(Partials policy, const F& f, CallPlan plan, const std::vector<Var>& vars) {
  using T = compute_t<S>;
  using List = ArgList<Args...>;
  constexpr int K = List::vars;
  constexpr int NA = List::count;
  using Slots = typename List::Slots;
  constexpr bool device_lambda = is_device_only_lambda<F>;
  constexpr bool plain_ok = !device_lambda && callable_v<F, T, K, false, Args...>;
  using R = typename ResultFor<device_lambda, F, T, K, Args...>::type;
  constexpr int M = OutputTraits<R>::count;

  const std::int64_t n = plan.out_shape.numel();
  std::vector<Tensor> outs;
  for (int m = 0; m < M; ++m) outs.push_back(Tensor::empty(plan.out_shape, plan.dtype, plan.device));
  const bool differentiate = K > 0 && any_requires_grad(vars);  // size 0 too: empty gradients
  if (policy == Partials::automatic || !kStorable) policy = Partials::recompute;

  std::vector<Tensor> partials;
  auto set_outputs = [&](auto& body) {
    body.ops = make_operands<S, NA>(plan, std::remove_cvref_t<decltype(body)>::V);
    for (int m = 0; m < M; ++m) {
      body.out[m] = outs[static_cast<std::size_t>(m)].template data<S>();
      require_aligned(body.ops, body.out[m]);
    }
  };
  const bool store = kStorable && differentiate && policy == Partials::store;
  if (n > 0 && store) {
    if constexpr (kStorable) {
      ForwardBody<S, K, M, true, true, F, Slots> body{f};
      set_outputs(body);
      partials.resize(static_cast<std::size_t>(M * K));
      for (int k = 0; k < K; ++k) {
        if (!vars[static_cast<std::size_t>(k)].requires_grad()) continue;
        for (int m = 0; m < M; ++m) {
          Tensor p = Tensor::empty(plan.out_shape, plan.dtype, plan.device);
          body.part[m][k] = p.template data<S>();
          require_aligned(body.ops, body.part[m][k]);
          partials[static_cast<std::size_t>(m * K + k)] = std::move(p);
        }
      }
      launch_broadcast(plan.device, body);
    }
  } else if (n > 0) {
    // Without stored partials the forward needs values only: plain numbers where f accepts them
    // (duals otherwise, whose unused partials the compiler drops).
    if constexpr (plain_ok) {
      ForwardBody<S, K, M, false, false, F, Slots> body{f};
      set_outputs(body);
      launch_broadcast(plan.device, body);
    } else {
      ForwardBody<S, K, M, true, false, F, Slots> body{f};
      set_outputs(body);
      launch_broadcast(plan.device, body);
    }
  }

  std::shared_ptr<Node> node;
  if (differentiate) {
    if constexpr (K > 0)
      node = std::make_shared<BroadcastNode<F, S, K, M, Slots, kStorable>>(f, std::move(plan), policy,
                                                                std::move(partials));
  }
  std::vector<Var> results = record(std::move(node), vars, std::move(outs));
  if constexpr (M == 1) {
    return results[0];
  } else {
    output_array_t<R> arr;
    for (int m = 0; m < M; ++m) arr[static_cast<std::size_t>(m)] = results[static_cast<std::size_t>(m)];
    return arr;
  }
}

/// kHalf: whether this call site compiles 16-bit bodies (DUALCAST_BROADCAST_HALF); part of the
/// specialisation, so that translation units that differ in it never share one.
template <bool kStorable, bool kHalf = (DUALCAST_BROADCAST_HALF != 0), class F, class... Args>
auto broadcast_impl(Partials policy, const F& f, const Args&... args) {
  static_assert(((arg_kind_v<Args> != kBadArg) && ...),
                "broadcast: every argument must be a dualcast::Var (differentiated), a "
                "dualcast::Tensor (constant) or a plain number");
  using List = ArgList<Args...>;
  constexpr int K = List::vars;
  constexpr bool device_lambda = is_device_only_lambda<F>;
  if constexpr (!device_lambda) {
    constexpr bool float_ok = callable_v<F, float, K, (K > 0), Args...>;
    constexpr bool double_ok = callable_v<F, double, K, (K > 0), Args...>;
    static_assert(float_ok || double_ok,
                  "broadcast: f cannot be called with these arguments. Each Var argument is passed "
                  "as Dual<T, K> (K = number of Var arguments) and each Tensor or number as T (float "
                  "or double): write f as a functor with `DUALCAST_HD auto operator()(auto...) "
                  "const`, or as a DUALCAST_HD lambda with exactly those parameter types, one per "
                  "argument");
    if constexpr (float_ok) {
      using R = typename ResultOf<F, float, K, (K > 0), Args...>::type;
      static_assert(ValidOutput<R>::value,
                    "broadcast: f must return a number or a Dual (or a std::tuple/std::pair of "
                    "them); make every branch return the same numeric type");
    } else if constexpr (double_ok) {
      using R = typename ResultOf<F, double, K, (K > 0), Args...>::type;
      static_assert(ValidOutput<R>::value,
                    "broadcast: f must return a number or a Dual (or a std::tuple/std::pair of "
                    "them); make every branch return the same numeric type");
    }
  }

  CallPlan plan = plan_broadcast({describe_arg(args)...});
  if constexpr (device_lambda) {
    DUALCAST_CHECK(plan.device.is_cuda(),
                   "broadcast: a __device__ lambda runs only on the GPU, and these arguments are on "
                   "the CPU; write f as a functor with `DUALCAST_HD auto operator()(auto...) const` "
                   "or as a DUALCAST_HD lambda with explicit parameter types");
  }
  std::vector<Var> vars;
  (collect_var(vars, args), ...);

  if constexpr (device_lambda || callable_v<F, float, K, (K > 0), Args...>) {
    switch (plan.dtype) {
      case DType::float32:
        return broadcast_typed<float, kStorable, F, Args...>(policy, f, std::move(plan), vars);
      case DType::bfloat16:
      case DType::float16:
        if constexpr (kHalf) {
          if (plan.dtype == DType::bfloat16)
            return broadcast_typed<bfloat16, kStorable, F, Args...>(policy, f, std::move(plan), vars);
          return broadcast_typed<float16, kStorable, F, Args...>(policy, f, std::move(plan), vars);
        } else {
          DUALCAST_FAIL("broadcast: arguments of dtype ", dtype_name(plan.dtype), " ",
                        plan.out_shape.str(), ", but this call site was compiled with "
                        "DUALCAST_BROADCAST_HALF=0 (float32 and float64 only); compile it without "
                        "that definition to broadcast 16-bit tensors");
        }
      default: break;
    }
  }
  if constexpr (device_lambda || callable_v<F, double, K, (K > 0), Args...>) {
    if (plan.dtype == DType::float64)
      return broadcast_typed<double, kStorable, F, Args...>(policy, f, std::move(plan), vars);
  }
  DUALCAST_FAIL("broadcast: f cannot be called with ", dtype_name(plan.dtype),
                " arguments (its parameter types fix the other element type)");
}
}  // namespace detail

/// Applies f elementwise over the NumPy broadcast of args, differentiating with respect to every
/// Var argument in one fused forward kernel (and one fused backward kernel). Returns a Var, or a
/// std::array<Var, M> when f returns a std::tuple/std::pair of M values. `policy` chooses how the
/// backward obtains the partials.
template <class F, class... Args>
auto broadcast(Partials policy, const F& f, const Args&... args) {
  return detail::broadcast_impl<true>(policy, f, args...);
}

template <class F, class... Args>
auto broadcast(const F& f, const Args&... args) {
  return broadcast(Partials::automatic, f, args...);
}

}  // namespace dualcast
