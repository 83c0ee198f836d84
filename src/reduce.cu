// reduce.cu: sum_to, sum, mean, amax (Tensor and tape forms) and the broadcast copy behind their
// gradients. The loops live in kernels/reduce.cuh (one engine for every reduction, CPU and CUDA).
// 16-bit tensors are read and written directly; every value passes through registers in its
// compute type (half.hpp's compute_t: float for bfloat16/float16), sums in double.
#include "dualcast/ops/reduce.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "dualcast/error.hpp"
#include "dualcast/indexing.hpp"
#include "dualcast/kernels/reduce.cuh"
#include "dualcast/parallel.hpp"

namespace dualcast {

namespace detail {

std::vector<bool> axes_mask(const char* op, const std::vector<int>& axes, const Shape& shape) {
  std::vector<bool> mask(static_cast<std::size_t>(shape.rank()), false);
  for (const int a : axes) {
    const int k = normalize_axis(op, a, shape);
    DUALCAST_CHECK(!mask[static_cast<std::size_t>(k)], op, ": axis ", a,
                   " is listed twice (as dimension ", k, ") for shape ", shape.str());
    mask[static_cast<std::size_t>(k)] = true;
  }
  return mask;
}

Shape reduced_shape(const Shape& shape, const std::vector<bool>& mask, bool keepdims) {
  Shape out;
  for (int d = 0; d < shape.rank(); ++d) {
    if (!mask[static_cast<std::size_t>(d)]) out.push_back(shape[d]);
    else if (keepdims) out.push_back(1);
  }
  return out;
}

namespace {

enum class ReduceKind { sum, mean, max };

// ---- kernels: named templates (nvcc forbids extended lambdas inside generic lambdas) ----------

template <class T>
void broadcast_copy_flat(Device d, T* out, const T* x, std::int64_t n, BroadcastIndexer<1> ix,
                         compute_t<T> scale) {
  parallel_for(d, n, [=] DUALCAST_HD(std::int64_t i) {
    std::int64_t off[1];
    ix.offsets(i, off);
    out[i] = static_cast<T>(x[off[0]] * scale);
  });
}

/// Row r of the row-wise broadcast copy: dst[c] = src[c * ls] * scale for c = c0, c0 + step, ... < L,
/// where the outer indexer places row r's source and rows of the output are contiguous.
template <class T, class I>
DUALCAST_HD DUALCAST_INLINE void copy_row(T* __restrict__ out, const T* __restrict__ x,
                                          const BroadcastIndexer<1>& outer, std::int64_t r, I L,
                                          std::int64_t ls, compute_t<T> scale, I c0, I step) {
  std::int64_t off[1];
  outer.offsets(r, off);
  const T* src = x + off[0];
  T* dst = out + r * L;
  for (I c = c0; c < L; c += step) dst[c] = static_cast<T>(src[c * ls] * scale);
}

#if defined(__CUDACC__)
/// Long rows (the innermost collapsed output dimension, L >= 64): the source offset of a row is
/// computed once per block and row (blockIdx.y strides over rows); the block's threads write at
/// least 8 elements each of it, adjacent threads adjacent addresses. Per-element index arithmetic
/// (a division per element) would make this integer-bound rather than memory-bound.
template <class T>
__global__ void __launch_bounds__(kReduceBlock)
    broadcast_rows_kernel(T* __restrict__ out, const T* __restrict__ x, std::int64_t rows,
                          std::int64_t L, std::int64_t ls, BroadcastIndexer<1> outer,
                          compute_t<T> scale) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    copy_row(out, x, outer, r, L, ls, scale,
             static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, step);
}

/// Short rows (L < 64): a thread per row.
template <class T>
__global__ void __launch_bounds__(kReduceBlock)
    broadcast_short_rows_kernel(T* __restrict__ out, const T* __restrict__ x, std::int64_t rows,
                                int L, std::int64_t ls, BroadcastIndexer<1> outer,
                                compute_t<T> scale) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += step)
    copy_row(out, x, outer, r, L, ls, scale, 0, 1);
}
#endif

/// out (contiguous, n elements) = x read through `ix` (one source argument) times scale.
template <class T>
void broadcast_copy_typed(Device d, T* out, const T* x, std::int64_t n, BroadcastIndexer<1> ix,
                          compute_t<T> scale) {
  if (n <= 0) return;
  if (ix.access[0] != Access::strided || ix.rank < 2) {  // a scaled copy, or a scalar source
    if (d.is_cpu()) {
      const bool scalar = ix.access[0] == Access::scalar;
      cpu_for(n, kCpuGrain, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t i = b; i < e; ++i) out[i] = static_cast<T>(x[scalar ? 0 : i] * scale);
      });
    } else {
      broadcast_copy_flat<T>(d, out, x, n, ix, scale);
    }
    return;
  }
  // Row-wise: the outer (collapsed) dimensions address rows, the innermost one runs along a row.
  const std::int64_t L = ix.dims[ix.rank - 1];
  const std::int64_t ls = ix.strides[0][ix.rank - 1];
  const std::int64_t rows = n / L;
  BroadcastIndexer<1> outer = ix;
  outer.rank = ix.rank - 1;
  if (d.is_cpu()) {
    cpu_for(rows, std::max<std::int64_t>(1, kCpuGrain / L), [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t r = b; r < e; ++r) copy_row<T, std::int64_t>(out, x, outer, r, L, ls, scale, 0, 1);
    });
    return;
  }
#if !defined(__CUDACC__)
  broadcast_copy_flat<T>(d, out, x, n, ix, scale);  // fails: no CUDA backend in this build
#else
  DeviceGuard guard(d);
  const std::int64_t sms = multiprocessor_count(d);
  if (L < 64) {
    const std::int64_t blocks =
        std::min<std::int64_t>((rows + kReduceBlock - 1) / kReduceBlock, sms * 16);
    broadcast_short_rows_kernel<T><<<static_cast<unsigned>(blocks), kReduceBlock, 0, stream(d)>>>(
        out, x, rows, static_cast<int>(L), ls, outer, scale);
  } else {
    const std::int64_t gx = std::max<std::int64_t>(1, L / (kReduceBlock * 8));
    const std::int64_t gy =
        std::min<std::int64_t>({rows, std::max<std::int64_t>(1, sms * 16 / gx), 65535});
    broadcast_rows_kernel<T><<<dim3(static_cast<unsigned>(std::min<std::int64_t>(gx, 65535)),
                                    static_cast<unsigned>(gy)),
                               kReduceBlock, 0, stream(d)>>>(out, x, rows, L, ls, outer, scale);
  }
  DUALCAST_CUDA_CHECK_LAUNCH();
#endif
}

template <class T>
void store_scaled_double_kernel(Device d, T* out, const double* v, double scale) {
  parallel_for(d, 1, [=] DUALCAST_HD(std::int64_t) { out[0] = static_cast<T>(v[0] * scale); });
}

/// d(amax)/dx: the adjoint of output o(i) split evenly over the tied maxima of that output. The
/// counts are in the compute type: a 16-bit count would stop being exact past 256 ties.
template <class T>
void amax_backward_kernel(Device d, T* gx, const T* x, const T* y, const T* g,
                          const compute_t<T>* count, std::int64_t n, BroadcastIndexer<1> ix) {
  using C = compute_t<T>;
  parallel_for(d, n, [=] DUALCAST_HD(std::int64_t i) {
    std::int64_t off[1];
    ix.offsets(i, off);
    const std::int64_t o = off[0];
    gx[i] = static_cast<C>(x[i]) == static_cast<C>(y[o])
                ? static_cast<T>(static_cast<C>(g[o]) / count[o])
                : T(0);
  });
}

/// Counts, per output o, the inputs equal to y[o] (the ties of a maximum), in the compute type.
template <class T>
struct TieLoad {
  using C = compute_t<T>;
  const T* x;
  const T* y;
  [[nodiscard]] DUALCAST_HD DUALCAST_INLINE C operator()(std::int64_t o, std::int64_t off) const {
    return static_cast<C>(x[off]) == static_cast<C>(y[o]) ? C(1) : C(0);
  }
};

// ---- the typed reduction ---------------------------------------------------------------------

template <class T>
void reduce_typed(const Tensor& x, const ReducePlan& p, Tensor& out, ReduceKind kind) {
  const Device dev = x.device();
  const T* xp = x.data<T>();
  T* op = out.data<T>();
  if (kind == ReduceKind::max) {
    using C = compute_t<T>;  // a maximum is exact in any type that holds T's values
    run_reduce<C>(dev, p, PlainLoad<T, C>{xp}, MaxOp<C>{}, CastStore<T, C>{op});
    return;
  }
  const double scale = kind == ReduceKind::mean ? 1.0 / static_cast<double>(p.n_red) : 1.0;
#if defined(__CUDACC__)
  if (dev.is_cuda() && p.n_out == 1 && p.n_red > 0 && x.is_contiguous()) {
    // A full sum: CUB's tuned device-wide reduction, accumulating in double.
    Tensor acc = Tensor::empty(Shape{}, DType::float64, dev);
    gpu_full_sum<T>(dev, xp, p.n_red, acc.data<double>());
    store_scaled_double_kernel<T>(dev, op, acc.data<double>(), scale);
    return;
  }
#endif
  run_reduce<double>(dev, p, PlainLoad<T, double>{xp}, SumOp<double>{},
                     ScaledStore<T, double>{op, scale});
}

/// Reduces x over mask into a new contiguous tensor of shape `out_shape` (whose numel is the
/// product of the kept dimensions).
Tensor reduce_impl(const char* opname, const Tensor& x, const std::vector<bool>& mask,
                   const Shape& out_shape, ReduceKind kind) {
  bool mb[kMaxRank] = {};
  for (int d = 0; d < x.rank(); ++d) mb[d] = mask[static_cast<std::size_t>(d)];
  if (kind == ReduceKind::max) {
    for (int d = 0; d < x.rank(); ++d)
      DUALCAST_CHECK(!(mb[d] && x.shape()[d] == 0), opname, ": cannot take the maximum over the "
                     "empty dimension ", d, " of shape ", x.shape().str());
  }
  const ReducePlan p = make_reduce_plan(x.shape(), x.strides(), mb);
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  dispatch_floating_storage(x.dtype(), opname, [&](auto tag) {
    using T = decltype(tag);
    reduce_typed<T>(x, p, out, kind);
  });
  return out;
}

void check_reducible(const Tensor& x, const char* op) {
  check_defined(x, op, "x");
  DUALCAST_CHECK(is_floating(x.dtype()), op, ": unsupported dtype ", dtype_name(x.dtype()),
                 " of shape ", x.shape().str(),
                 " (expected float32, float64, bfloat16 or float16)");
}

}  // namespace

/// Contiguous copy of a strided tensor (a reduction over no dimension); x itself when contiguous.
Tensor contiguous_copy(const Tensor& x) {
  check_defined(x, "contiguous_copy", "x");
  if (x.is_contiguous()) return x;
  return reduce_impl("contiguous_copy", x,
                     std::vector<bool>(static_cast<std::size_t>(x.rank()), false), x.shape(),
                     ReduceKind::sum);
}

Tensor broadcast_copy(const Tensor& x, const Shape& shape, double scale) {
  check_reducible(x, "broadcast_copy");
  const Shape b = broadcast_shapes("broadcast_copy", {{"x", x.shape()}, {"shape", shape}});
  DUALCAST_CHECK(b == shape, "broadcast_copy: shape ", x.shape().str(),
                 " does not broadcast to shape ", shape.str());
  const Tensor src = contiguous_copy(x);
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  const BroadcastIndexer<1> ix = make_indexer<1>(shape, {src.shape()});
  dispatch_floating_storage(x.dtype(), "broadcast_copy", [&](auto tag) {
    using T = decltype(tag);
    broadcast_copy_typed<T>(x.device(), out.data<T>(), src.data<T>(), out.numel(), ix,
                            static_cast<compute_t<T>>(scale));
  });
  return out;
}

}  // namespace detail

// ---- Tensor forms -------------------------------------------------------------------------------

namespace {

using detail::ReduceKind;

/// Mask of the dimensions of `x` that sum_to reduces to reach `target`; throws unless `target`
/// broadcasts to x's shape.
std::vector<bool> sum_to_mask(const Shape& xs, const Shape& target) {
  const auto fail = [&](const std::string& why) {
    DUALCAST_FAIL("sum_to: cannot reduce shape ", xs.str(), " to shape ", target.str(), ": ", why,
                  " (the target must broadcast to the input's shape)");
  };
  if (target.rank() > xs.rank())
    fail("the target has rank " + std::to_string(target.rank()) + " > " +
         std::to_string(xs.rank()));
  const int offset = xs.rank() - target.rank();
  std::vector<bool> mask(static_cast<std::size_t>(xs.rank()), false);
  for (int d = 0; d < xs.rank(); ++d) {
    if (d < offset) {
      mask[static_cast<std::size_t>(d)] = true;
      continue;
    }
    const std::int64_t t = target[d - offset];
    if (t == xs[d]) continue;
    if (t == 1) {
      mask[static_cast<std::size_t>(d)] = true;
      continue;
    }
    fail("dimension " + std::to_string(d - xs.rank()) + " has size " + std::to_string(t) +
         " in the target and " + std::to_string(xs[d]) + " in the input");
  }
  return mask;
}

Tensor reduce_axes(const char* op, const Tensor& x, const std::vector<int>& axes, bool keepdims,
                   ReduceKind kind) {
  detail::check_reducible(x, op);
  const std::vector<bool> mask = detail::axes_mask(op, axes, x.shape());
  if (axes.empty()) return x;
  return detail::reduce_impl(op, x, mask, detail::reduced_shape(x.shape(), mask, keepdims), kind);
}

Tensor reduce_all(const char* op, const Tensor& x, ReduceKind kind) {
  detail::check_reducible(x, op);
  return detail::reduce_impl(op, x, std::vector<bool>(static_cast<std::size_t>(x.rank()), true),
                             Shape{}, kind);
}

}  // namespace

Tensor sum_to(const Tensor& x, const Shape& target) {
  detail::check_reducible(x, "sum_to");
  (void)checked_numel("sum_to", "target", target);
  if (x.shape() == target) return x;
  const std::vector<bool> mask = sum_to_mask(x.shape(), target);
  return detail::reduce_impl("sum_to", x, mask, target, ReduceKind::sum);
}

Tensor sum(const Tensor& x) { return reduce_all("sum", x, ReduceKind::sum); }
Tensor sum(const Tensor& x, const std::vector<int>& axes, bool keepdims) {
  return reduce_axes("sum", x, axes, keepdims, ReduceKind::sum);
}
Tensor sum(const Tensor& x, int axis, bool keepdims) {
  return reduce_axes("sum", x, std::vector<int>{axis}, keepdims, ReduceKind::sum);
}

Tensor mean(const Tensor& x) { return reduce_all("mean", x, ReduceKind::mean); }
Tensor mean(const Tensor& x, const std::vector<int>& axes, bool keepdims) {
  return reduce_axes("mean", x, axes, keepdims, ReduceKind::mean);
}
Tensor mean(const Tensor& x, int axis, bool keepdims) {
  return reduce_axes("mean", x, std::vector<int>{axis}, keepdims, ReduceKind::mean);
}

Tensor amax(const Tensor& x) { return reduce_all("amax", x, ReduceKind::max); }
Tensor amax(const Tensor& x, const std::vector<int>& axes, bool keepdims) {
  return reduce_axes("amax", x, axes, keepdims, ReduceKind::max);
}
Tensor amax(const Tensor& x, int axis, bool keepdims) {
  return reduce_axes("amax", x, std::vector<int>{axis}, keepdims, ReduceKind::max);
}

// ---- tape forms ---------------------------------------------------------------------------------

namespace {

/// sum, mean and sum_to: the gradient is the adjoint (viewed with kept dimensions) broadcast back
/// to the input's shape, times 1/n for a mean. Holds two shapes and a number, no tensors.
class BroadcastBackNode final : public Node {
 public:
  BroadcastBackNode(const char* name, Shape in_shape, Shape keep_shape, double scale)
      : name_(name), in_shape_(in_shape), keep_shape_(keep_shape), scale_(scale) {}
  [[nodiscard]] const char* name() const override { return name_; }
  void backward(const std::vector<Tensor>& grad_outputs) override {
    const Tensor& g = grad_outputs[0];
    if (!g.defined() || !inputs[0]) return;
    const Tensor gk = detail::contiguous_copy(g).view(keep_shape_);
    detail::accumulate_grad(*inputs[0], detail::broadcast_copy(gk, in_shape_, scale_),
                            /*owned=*/true);
  }

 private:
  const char* name_;
  Shape in_shape_;
  Shape keep_shape_;
  double scale_;
};

/// amax: keeps the input and the (keepdims) maximum to find the arg-max positions and their ties.
class AmaxNode final : public Node {
 public:
  AmaxNode(Tensor x, Tensor y_keep, std::vector<bool> mask)
      : x_(std::move(x)), y_(std::move(y_keep)), mask_(std::move(mask)) {}
  [[nodiscard]] const char* name() const override { return "amax"; }
  void release_saved() override {
    x_ = Tensor();
    y_ = Tensor();
  }
  void backward(const std::vector<Tensor>& grad_outputs) override {
    const Tensor& g0 = grad_outputs[0];
    if (!g0.defined() || !inputs[0]) return;
    const Tensor g = detail::contiguous_copy(g0);
    const Device dev = x_.device();
    bool mb[kMaxRank] = {};
    for (int d = 0; d < x_.rank(); ++d) mb[d] = mask_[static_cast<std::size_t>(d)];
    const detail::ReducePlan p = detail::make_reduce_plan(x_.shape(), x_.strides(), mb);
    Tensor count = Tensor::empty(y_.shape(), compute_dtype(x_.dtype()), dev);
    Tensor gx = Tensor::empty(x_.shape(), x_.dtype(), dev);
    const BroadcastIndexer<1> ix = make_indexer<1>(x_.shape(), {y_.shape()});
    dispatch_floating_storage(x_.dtype(), "amax backward", [&](auto tag) {
      using T = decltype(tag);
      using C = compute_t<T>;
      detail::run_reduce<C>(dev, p, detail::TieLoad<T>{x_.data<T>(), y_.data<T>()},
                            detail::SumOp<C>{}, detail::CastStore<C, C>{count.data<C>()});
      detail::amax_backward_kernel<T>(dev, gx.data<T>(), x_.data<T>(), y_.data<T>(), g.data<T>(),
                                      count.data<C>(), gx.numel(), ix);
    });
    detail::accumulate_grad(*inputs[0], std::move(gx), /*owned=*/true);
  }

 private:
  Tensor x_;
  Tensor y_;
  std::vector<bool> mask_;
};

Var record_broadcast_back(const char* name, const Var& x, Tensor out, const Shape& keep_shape,
                          double scale) {
  if (!detail::any_requires_grad({x})) return Var(std::move(out));
  return detail::record1(std::make_shared<BroadcastBackNode>(name, x.shape(), keep_shape, scale),
                         {x}, std::move(out));
}

Var sum_or_mean_var(const char* op, const Var& x, const std::vector<bool>& mask, bool keepdims,
                    ReduceKind kind) {
  const Tensor& xv = x.value();
  const Shape keep = detail::reduced_shape(xv.shape(), mask, true);
  const Shape out_shape = detail::reduced_shape(xv.shape(), mask, keepdims);
  Tensor out = detail::reduce_impl(op, xv, mask, out_shape, kind);
  double scale = 1.0;
  if (kind == ReduceKind::mean) {
    std::int64_t n = 1;
    for (int d = 0; d < xv.rank(); ++d)
      if (mask[static_cast<std::size_t>(d)]) n *= xv.shape()[d];
    scale = 1.0 / static_cast<double>(n);
  }
  return record_broadcast_back(op, x, std::move(out), keep, scale);
}

Var amax_var(const Var& x, const std::vector<bool>& mask, bool keepdims) {
  const Tensor& xv = x.value();
  const Shape keep = detail::reduced_shape(xv.shape(), mask, true);
  const Shape out_shape = detail::reduced_shape(xv.shape(), mask, keepdims);
  Tensor out = detail::reduce_impl("amax", xv, mask, keep, ReduceKind::max);
  if (!detail::any_requires_grad({x})) return Var(out.view(out_shape));
  const Tensor xc = detail::contiguous_copy(xv);
  return detail::record1(std::make_shared<AmaxNode>(xc, out, mask), {x}, out.view(out_shape));
}

Var var_axes(const char* op, const Var& x, const std::vector<int>& axes, bool keepdims,
             ReduceKind kind) {
  detail::check_reducible(x.value(), op);
  const std::vector<bool> mask = detail::axes_mask(op, axes, x.shape());
  if (axes.empty()) return x;
  if (kind == ReduceKind::max) return amax_var(x, mask, keepdims);
  return sum_or_mean_var(op, x, mask, keepdims, kind);
}

Var var_all(const char* op, const Var& x, ReduceKind kind) {
  detail::check_reducible(x.value(), op);
  const std::vector<bool> mask(static_cast<std::size_t>(x.value().rank()), true);
  if (kind == ReduceKind::max) return amax_var(x, mask, false);
  return sum_or_mean_var(op, x, mask, false, kind);
}

}  // namespace

Var sum_to(const Var& x, const Shape& target) {
  const Tensor& xv = x.value();
  detail::check_reducible(xv, "sum_to");
  if (xv.shape() == target) return x;
  Tensor out = sum_to(xv, target);
  // The adjoint has the target's shape; aligned at the back it broadcasts to x's shape directly.
  return record_broadcast_back("sum_to", x, std::move(out), target, 1.0);
}

Var sum(const Var& x) { return var_all("sum", x, ReduceKind::sum); }
Var sum(const Var& x, const std::vector<int>& axes, bool keepdims) {
  return var_axes("sum", x, axes, keepdims, ReduceKind::sum);
}
Var sum(const Var& x, int axis, bool keepdims) {
  return var_axes("sum", x, std::vector<int>{axis}, keepdims, ReduceKind::sum);
}

Var mean(const Var& x) { return var_all("mean", x, ReduceKind::mean); }
Var mean(const Var& x, const std::vector<int>& axes, bool keepdims) {
  return var_axes("mean", x, axes, keepdims, ReduceKind::mean);
}
Var mean(const Var& x, int axis, bool keepdims) {
  return var_axes("mean", x, std::vector<int>{axis}, keepdims, ReduceKind::mean);
}

Var amax(const Var& x) { return var_all("amax", x, ReduceKind::max); }
Var amax(const Var& x, const std::vector<int>& axes, bool keepdims) {
  return var_axes("amax", x, axes, keepdims, ReduceKind::max);
}
Var amax(const Var& x, int axis, bool keepdims) {
  return var_axes("amax", x, std::vector<int>{axis}, keepdims, ReduceKind::max);
}

}  // namespace dualcast
