// loss.cu: softmax, log_softmax, cross_entropy and mse on the tape: argument checks, the typed
// operations, their nodes and the public forms. The line kernels they run (softmax-like lines, on
// both backends) are in loss_lines.cuh. 16-bit inputs are computed on a float32 copy and the result
// rounded back (the public forms at the end; the line kernels read float32 and float64 only).
#include "dualcast/ops/loss.hpp"

#include <math.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "dualcast/error.hpp"
#include "dualcast/graph.hpp"
#include "dualcast/kernels/reduce.cuh"
#include "dualcast/ops/cast.hpp"
#include "dualcast/ops/reduce.hpp"
#include "dualcast/parallel.hpp"
#include "loss_lines.cuh"

namespace dualcast {
namespace detail {
namespace {

using namespace loss_lines;  // NOLINT(google-build-using-namespace): this file is their one user

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

using detail::loss_lines::LineOp;

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

namespace {
/// f(x) on a float32 copy of a 16-bit x, the result rounded back to x's dtype; f(x) otherwise.
template <class F>
Tensor tensor_via_float32(const Tensor& x, F&& f) {
  if (!x.defined() || !is_half(x.dtype())) return f(x);
  return f(x.to(DType::float32)).to(x.dtype());
}
}  // namespace

Tensor softmax(const Tensor& x, int axis) {
  return tensor_via_float32(x, [&](const Tensor& v) {
    return detail::softmax_impl("softmax", LineOp::softmax, v, axis);
  });
}
Var softmax(const Var& x, int axis) {
  DUALCAST_CHECK(x.defined(), "softmax: argument 'x' is an undefined Var");
  return detail::via_float32(
      x, [&](const Var& v) { return softmax_var("softmax", LineOp::softmax, v, axis); });
}

Tensor log_softmax(const Tensor& x, int axis) {
  return tensor_via_float32(x, [&](const Tensor& v) {
    return detail::softmax_impl("log_softmax", LineOp::log_softmax, v, axis);
  });
}
Var log_softmax(const Var& x, int axis) {
  DUALCAST_CHECK(x.defined(), "log_softmax: argument 'x' is an undefined Var");
  return detail::via_float32(
      x, [&](const Var& v) { return softmax_var("log_softmax", LineOp::log_softmax, v, axis); });
}

Tensor cross_entropy(const Tensor& logits, const Tensor& labels) {
  return tensor_via_float32(
      logits, [&](const Tensor& l) { return cross_entropy_impl(l, labels).loss; });
}
Var cross_entropy(const Var& logits, const Tensor& labels) {
  DUALCAST_CHECK(logits.defined(), "cross_entropy: argument 'logits' is an undefined Var");
  return detail::via_float32(logits, [&](const Var& lv) {
    CrossEntropyResult r = cross_entropy_impl(lv.value(), labels);
    if (!detail::any_requires_grad({lv})) return Var(std::move(r.loss));
    return detail::record1(std::make_shared<CrossEntropyNode>(r.logits, r.labels, r.stats), {lv},
                           r.loss);
  });
}

Tensor mse(const Tensor& pred, const Tensor& target) {
  check_mse(pred, target);
  if (is_half(pred.dtype()))
    return mse(pred.to(DType::float32), target.to(DType::float32)).to(pred.dtype());
  return mse_impl(detail::contiguous_copy(pred), detail::contiguous_copy(target));
}
Var mse(const Var& pred, const Var& target) {
  DUALCAST_CHECK(pred.defined() && target.defined(), "mse: argument '",
                 pred.defined() ? "target" : "pred", "' is an undefined Var");
  check_mse(pred.value(), target.value());
  if (is_half(pred.dtype()))
    return cast(mse(cast(pred, DType::float32), cast(target, DType::float32)), pred.dtype());
  const Tensor p = detail::contiguous_copy(pred.value());
  const Tensor t = detail::contiguous_copy(target.value());
  Tensor loss = mse_impl(p, t);
  if (!detail::any_requires_grad({pred, target})) return Var(std::move(loss));
  return detail::record1(std::make_shared<MseNode>(p, t), {pred, target}, loss);
}

}  // namespace dualcast
