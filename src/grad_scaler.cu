// grad_scaler.cu: GradScaler (grad_scaler.hpp). Every decision is a kernel reading device state, so
// a scaled step can be captured in a Graph; the host keeps only the call-order bookkeeping.
#include "dualcast/grad_scaler.hpp"

#include <math.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "dualcast/error.hpp"
#include "dualcast/graph.hpp"
#include "dualcast/parallel.hpp"

namespace dualcast {

namespace grad_scaler_detail {

/// Raises the found-inf flag. Many threads may raise it at once; they all write the same value,
/// which CUDA makes well defined and the CPU backend makes an atomic store (no data race).
DUALCAST_HD DUALCAST_INLINE void raise_flag(float* flag) {
#if defined(__CUDA_ARCH__)
  *flag = 1.0f;
#else
  float one = 1.0f;
  __atomic_store(flag, &one, __ATOMIC_RELAXED);
#endif
}

/// |v| <= the largest double: false for inf and NaN (the comparison with NaN is false).
template <class C>
DUALCAST_HD DUALCAST_INLINE bool finite(C v) {
  return ::fabs(static_cast<double>(v)) <= 1.7976931348623157e308;
}

/// out = x * S (S read on the device), in T's compute type, rounded once to T.
template <class T>
void multiply_by_scale(Device d, T* out, const T* x, std::int64_t n, const float* scale) {
  using C = compute_t<T>;
  parallel_for(d, n, [=] DUALCAST_HD(std::int64_t i) {
    out[i] = static_cast<T>(static_cast<C>(x[i]) * static_cast<C>(*scale));
  });
}

/// g *= 1/S in place; raises the flag where the unscaled value is inf or NaN.
template <class T>
void unscale_and_check(Device d, T* g, std::int64_t n, const float* scale, float* found) {
  using C = compute_t<T>;
  parallel_for(d, n, [=] DUALCAST_HD(std::int64_t i) {
    // 1/S in double, rounded once (as PyTorch's scale.double().reciprocal().float())
    const C inv = static_cast<C>(static_cast<float>(1.0 / static_cast<double>(*scale)));
    const C v = static_cast<C>(g[i]) * inv;
    if (!finite(v)) raise_flag(found);
    g[i] = static_cast<T>(v);
  });
}

/// One thread: S backs off after an overflow, grows after `interval` clean steps (unless that would
/// make it infinite); the flag is cleared for the next step and remembered in tracker[1].
inline void update_scale(Device d, float* scale, float* found, double* tracker, float growth,
                         float backoff, double interval) {
  parallel_for(d, 1, [=] DUALCAST_HD(std::int64_t) {
    const bool overflow = *found != 0.0f;
    tracker[1] = overflow ? 1.0 : 0.0;
    if (overflow) {
      *scale = *scale * backoff;
      tracker[0] = 0.0;
    } else if (tracker[0] + 1.0 >= interval) {
      const float grown = *scale * growth;
      if (finite(grown)) *scale = grown;
      tracker[0] = 0.0;
    } else {
      tracker[0] = tracker[0] + 1.0;
    }
    *found = 0.0f;
  });
}

/// The tape node of scale(): the adjoint times S.
class ScaleNode final : public Node {
 public:
  explicit ScaleNode(Tensor scale) : scale_(std::move(scale)) {}
  [[nodiscard]] const char* name() const override { return "GradScaler::scale"; }
  void backward(const std::vector<Tensor>& grad_outputs) override {
    const Tensor& g0 = grad_outputs[0];
    if (!g0.defined() || !inputs[0]) return;
    const Tensor g = g0.is_contiguous() ? g0 : g0.clone();
    Tensor gx = Tensor::empty(g.shape(), g.dtype(), g.device());
    dispatch_floating_storage(g.dtype(), "GradScaler::scale backward", [&](auto tag) {
      using T = decltype(tag);
      multiply_by_scale<T>(g.device(), gx.data<T>(), g.data<T>(), g.numel(),
                           scale_.data<float>());
    });
    detail::accumulate_grad(*inputs[0], std::move(gx), /*owned=*/true);
  }

 private:
  Tensor scale_;  ///< the scaler's S (shared, not a copy: a replayed step reads the current one)
};

bool contains(const std::vector<const Optimizer*>& v, const Optimizer* o) {
  return std::find(v.begin(), v.end(), o) != v.end();
}

}  // namespace grad_scaler_detail

using namespace grad_scaler_detail;

GradScaler::GradScaler(Device device, GradScalerOptions options)
    : device_(device), options_(options) {
  const GradScalerOptions& o = options_;
  DUALCAST_CHECK(std::isfinite(o.init_scale) && o.init_scale > 0.0 &&
                     o.init_scale <= 3.4028234663852886e38,
                 "GradScaler: init_scale ", o.init_scale, " must be a finite float32 > 0");
  DUALCAST_CHECK(std::isfinite(o.growth_factor) && o.growth_factor > 1.0,
                 "GradScaler: growth_factor ", o.growth_factor, " must be a finite number > 1");
  DUALCAST_CHECK(o.backoff_factor > 0.0 && o.backoff_factor < 1.0, "GradScaler: backoff_factor ",
                 o.backoff_factor, " must lie in (0, 1)");
  DUALCAST_CHECK(o.growth_interval >= 1, "GradScaler: growth_interval ", o.growth_interval,
                 " must be >= 1");
  detail::check_not_capturing(device, "constructing a GradScaler (it initialises device state)");
  scale_ = Tensor::full(Shape{1}, o.init_scale, DType::float32, device);
  found_ = Tensor::zeros(Shape{1}, DType::float32, device);
  tracker_ = Tensor::zeros(Shape{2}, DType::float64, device);
}

Var GradScaler::scale(const Var& loss) const {
  DUALCAST_CHECK(loss.defined(), "GradScaler::scale: argument 'loss' is an undefined Var");
  if (!options_.enabled) return loss;
  const Tensor& v = loss.value();
  DUALCAST_CHECK(is_floating(v.dtype()), "GradScaler::scale: the loss ", v.str(),
                 " is not floating");
  DUALCAST_CHECK(v.device() == device_, "GradScaler::scale: the loss ", v.shape().str(), " lives on ",
                 v.device().str(), " but the scaler on ", device_.str());
  const Tensor x = v.is_contiguous() ? v : v.clone();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_floating_storage(x.dtype(), "GradScaler::scale", [&](auto tag) {
    using T = decltype(tag);
    multiply_by_scale<T>(device_, out.data<T>(), x.data<T>(), x.numel(), scale_.data<float>());
  });
  std::shared_ptr<Node> node;
  if (detail::any_requires_grad({loss})) node = std::make_shared<ScaleNode>(scale_);
  return detail::record1(std::move(node), {loss}, std::move(out));
}

void GradScaler::unscale_(Optimizer& opt) {
  if (!options_.enabled) return;
  DUALCAST_CHECK(!contains(unscaled_, &opt),
                 "GradScaler::unscale_: already called for this optimizer since the last update()");
  DUALCAST_CHECK(!contains(stepped_, &opt),
                 "GradScaler::unscale_: called after step() for this optimizer (unscale_ comes "
                 "before step, and step unscales by itself)");
  const std::vector<Var>& params = opt.params();
  for (std::size_t i = 0; i < params.size(); ++i)
    DUALCAST_CHECK(params[i].device() == device_, "GradScaler::unscale_: parameter ", i, " of shape ",
                   params[i].shape().str(), " lives on ", params[i].device().str(),
                   " but the scaler on ", device_.str());
  for (const Var& p : params) {
    if (!p.has_grad()) continue;
    VarState& st = *p.state();
    // In place only in storage of the parameter's own; a shared adjoint is copied first.
    if (!st.grad_owned || !st.grad.is_contiguous()) {
      st.grad = st.grad.clone();
      st.grad_owned = true;
    }
    Tensor& g = st.grad;
    dispatch_floating_storage(g.dtype(), "GradScaler::unscale_", [&](auto tag) {
      using T = decltype(tag);
      unscale_and_check<T>(device_, g.data<T>(), g.numel(), scale_.data<float>(),
                           found_.data<float>());
    });
  }
  unscaled_.push_back(&opt);
}

void GradScaler::step(Optimizer& opt) {
  if (!options_.enabled) {
    opt.step();
    return;
  }
  DUALCAST_CHECK(!contains(stepped_, &opt),
                 "GradScaler::step: already called for this optimizer since the last update()");
  if (!contains(unscaled_, &opt)) unscale_(opt);
  opt.step_unless(found_);
  stepped_.push_back(&opt);
}

void GradScaler::update() {
  if (!options_.enabled) return;
  DUALCAST_CHECK(!unscaled_.empty(), "GradScaler::update: no optimizer was unscaled or stepped "
                 "since the last update() (nothing tells whether the gradients overflowed)");
  update_scale(device_, scale_.data<float>(), found_.data<float>(), tracker_.data<double>(),
               static_cast<float>(options_.growth_factor),
               static_cast<float>(options_.backoff_factor),
               static_cast<double>(options_.growth_interval));
  unscaled_.clear();
  stepped_.clear();
}

double GradScaler::get_scale() const {
  if (!options_.enabled) return 1.0;
  detail::check_not_capturing(device_, "GradScaler::get_scale (it reads the device's scale)");
  return scale_.item();
}

bool GradScaler::last_step_skipped() const {
  if (!options_.enabled) return false;
  detail::check_not_capturing(device_, "GradScaler::last_step_skipped (it reads the device)");
  return tracker_.to_vector<double>()[1] != 0.0;
}

std::int64_t GradScaler::growth_tracker() const {
  if (!options_.enabled) return 0;
  detail::check_not_capturing(device_, "GradScaler::growth_tracker (it reads the device)");
  return static_cast<std::int64_t>(tracker_.to_vector<double>()[0]);
}

}  // namespace dualcast
