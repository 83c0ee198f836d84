// optim.cu: SGD and Adam. Each update is one parallel_for over a parameter's elements (gradient,
// weight decay, state and parameter in one pass), so the CPU and the GPU run the same body. The
// bodies are lambdas inside named function templates: nvcc rejects extended __host__ __device__
// lambdas inside generic lambdas such as dispatch_floating's.
#include "dualcast/optim.hpp"

#include <math.h>

#include <cmath>
#include <unordered_set>

#include "dualcast/error.hpp"
#include "dualcast/parallel.hpp"

namespace dualcast::optim {

namespace detail {

DUALCAST_HD inline float opt_sqrt(float x) { return ::sqrtf(x); }
DUALCAST_HD inline double opt_sqrt(double x) { return ::sqrt(x); }

// Optimizer state decays geometrically wherever gradients stop (momentum * buf, beta1 * m, beta2 * v:
// pixels that are nearly always 0, dead ReLUs) and ends up subnormal after a few hundred steps. x86
// arithmetic on subnormals is 15-20x slower (an Adam step of a 784x256 parameter went from ~4 ms to
// 55-75 ms), so state values below the smallest normal number are stored as 0, on both backends
// alike. The select is branch-free: a branchy version made the CPU step 2.6x slower.
DUALCAST_HD inline float flush_subnormal(float x) {
  return ::fabsf(x) < 1.17549435e-38f ? 0.0f : x;  // NaN stays NaN
}
DUALCAST_HD inline double flush_subnormal(double x) {
  return ::fabs(x) < 2.2250738585072014e-308 ? 0.0 : x;
}

template <class T>
void sgd_plain(Device device, T* p, const T* g, std::int64_t n, T lr, T wd) {
  parallel_for(device, n, [=] DUALCAST_HD(std::int64_t i) {
    const T d = g[i] + wd * p[i];
    p[i] = p[i] - lr * d;
  });
}

template <class T>
void sgd_momentum(Device device, T* p, const T* g, T* buf, std::int64_t n, T lr, T momentum, T wd) {
  parallel_for(device, n, [=] DUALCAST_HD(std::int64_t i) {
    const T d = g[i] + wd * p[i];
    const T b = flush_subnormal(momentum * buf[i] + d);
    buf[i] = b;
    p[i] = p[i] - lr * b;
  });
}

// PyTorch's form: p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps).
template <class T>
void adam_update(Device device, T* p, const T* g, T* m, T* v, std::int64_t n, T step_size, T beta1,
                 T beta2, T inv_sqrt_bc2, T eps, T wd) {
  const T one_minus_beta1 = T(1) - beta1, one_minus_beta2 = T(1) - beta2;
  parallel_for(device, n, [=] DUALCAST_HD(std::int64_t i) {
    const T d = g[i] + wd * p[i];
    const T mi = flush_subnormal(beta1 * m[i] + one_minus_beta1 * d);
    const T vi = flush_subnormal(beta2 * v[i] + one_minus_beta2 * d * d);
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] - step_size * mi / (opt_sqrt(vi) * inv_sqrt_bc2 + eps);
  });
}

template <class T>
void run_sgd(const Tensor& p, const Tensor& g, const Tensor* buf, double lr, double momentum,
             double wd) {
  if (buf != nullptr)
    sgd_momentum<T>(p.device(), p.data<T>(), g.data<T>(), buf->data<T>(), p.numel(),
                    static_cast<T>(lr), static_cast<T>(momentum), static_cast<T>(wd));
  else
    sgd_plain<T>(p.device(), p.data<T>(), g.data<T>(), p.numel(), static_cast<T>(lr),
                 static_cast<T>(wd));
}

template <class T>
void run_adam(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, double step_size,
              double beta1, double beta2, double inv_sqrt_bc2, double eps, double wd) {
  adam_update<T>(p.device(), p.data<T>(), g.data<T>(), m.data<T>(), v.data<T>(), p.numel(),
                 static_cast<T>(step_size), static_cast<T>(beta1), static_cast<T>(beta2),
                 static_cast<T>(inv_sqrt_bc2), static_cast<T>(eps), static_cast<T>(wd));
}

}  // namespace detail

namespace {
void check_lr(double lr, const char* who) {
  DUALCAST_CHECK(std::isfinite(lr) && lr > 0.0, who, ": learning rate ", lr,
                 " is invalid (it must be a finite number > 0)");
}
}  // namespace

Optimizer::Optimizer(std::vector<Var> params, double lr, const char* who)
    : params_(std::move(params)), lr_(lr), who_(who) {
  check_lr(lr, who);
  DUALCAST_CHECK(!params_.empty(), who, ": the parameter list is empty");
  std::unordered_set<const VarState*> seen;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Var& p = params_[i];
    DUALCAST_CHECK(p.defined(), who, ": parameter ", i, " is an undefined Var");
    DUALCAST_CHECK(p.requires_grad() && p.is_leaf(), who, ": parameter ", i, " of shape ",
                   p.shape().str(),
                   " is not a leaf that requires a gradient (create parameters with Var::param)");
    DUALCAST_CHECK(is_floating(p.dtype()), who, ": parameter ", i, " has dtype ",
                   dtype_name(p.dtype()), " (expected float32 or float64)");
    DUALCAST_CHECK(p.value().is_contiguous(), who, ": parameter ", i, " of shape ",
                   p.shape().str(), " is not contiguous");
    DUALCAST_CHECK(seen.insert(p.state().get()).second, who, ": parameter ", i, " of shape ",
                   p.shape().str(), " appears twice in the list (it would be updated twice)");
  }
}

void Optimizer::set_lr(double lr) {
  check_lr(lr, who_);
  lr_ = lr;
}

void Optimizer::zero_grad() {
  for (Var& p : params_) p.zero_grad();
}

Tensor Optimizer::grad_of(std::size_t i) const {
  const Var& p = params_[i];
  if (!p.has_grad()) return Tensor();
  Tensor g = p.grad();
  const Tensor& v = p.value();
  DUALCAST_CHECK(g.shape() == v.shape() && g.dtype() == v.dtype() && g.device() == v.device(),
                 who_, ": the gradient of parameter ", i, " (", g.str(),
                 ") does not match the parameter (", v.str(), ")");
  DUALCAST_CHECK(g.is_contiguous(), who_, ": the gradient of parameter ", i, " is not contiguous");
  return g;
}

// ---- SGD ----------------------------------------------------------------------------------------

SGD::SGD(std::vector<Var> params, double lr, double momentum, double weight_decay)
    : Optimizer(std::move(params), lr, "SGD"), momentum_(momentum), weight_decay_(weight_decay) {
  DUALCAST_CHECK(std::isfinite(momentum) && momentum >= 0.0 && momentum < 1.0,
                 "SGD: momentum ", momentum, " is outside [0, 1)");
  DUALCAST_CHECK(std::isfinite(weight_decay) && weight_decay >= 0.0, "SGD: weight_decay ",
                 weight_decay, " must be a finite number >= 0");
  buffers_.resize(params_.size());
  if (momentum_ > 0.0)
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const Tensor& v = params_[i].value();
      buffers_[i] = Tensor::zeros(v.shape(), v.dtype(), v.device());
    }
}

void SGD::step() {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Tensor g = grad_of(i);
    if (!g.defined()) continue;
    const Tensor& p = params_[i].value();
    const Tensor* buf = momentum_ > 0.0 ? &buffers_[i] : nullptr;
    if (p.dtype() == DType::float32)
      detail::run_sgd<float>(p, g, buf, lr_, momentum_, weight_decay_);
    else
      detail::run_sgd<double>(p, g, buf, lr_, momentum_, weight_decay_);
  }
  ++steps_;
}

// ---- Adam ---------------------------------------------------------------------------------------

Adam::Adam(std::vector<Var> params, double lr, double beta1, double beta2, double eps,
           double weight_decay)
    : Optimizer(std::move(params), lr, "Adam"), beta1_(beta1), beta2_(beta2), eps_(eps),
      weight_decay_(weight_decay) {
  DUALCAST_CHECK(std::isfinite(beta1) && beta1 >= 0.0 && beta1 < 1.0, "Adam: beta1 ", beta1,
                 " is outside [0, 1)");
  DUALCAST_CHECK(std::isfinite(beta2) && beta2 >= 0.0 && beta2 < 1.0, "Adam: beta2 ", beta2,
                 " is outside [0, 1)");
  DUALCAST_CHECK(std::isfinite(eps) && eps > 0.0, "Adam: eps ", eps,
                 " must be a finite number > 0");
  DUALCAST_CHECK(std::isfinite(weight_decay) && weight_decay >= 0.0, "Adam: weight_decay ",
                 weight_decay, " must be a finite number >= 0");
  m_.reserve(params_.size());
  v_.reserve(params_.size());
  t_.assign(params_.size(), 0);
  for (const Var& p : params_) {
    const Tensor& v = p.value();
    m_.push_back(Tensor::zeros(v.shape(), v.dtype(), v.device()));
    v_.push_back(Tensor::zeros(v.shape(), v.dtype(), v.device()));
  }
}

void Adam::step() {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Tensor g = grad_of(i);
    if (!g.defined()) continue;
    const std::int64_t t = ++t_[i];
    const double bc1 = 1.0 - std::pow(beta1_, static_cast<double>(t));
    const double bc2 = 1.0 - std::pow(beta2_, static_cast<double>(t));
    const double step_size = lr_ / bc1;
    const double inv_sqrt_bc2 = 1.0 / std::sqrt(bc2);
    const Tensor& p = params_[i].value();
    if (p.dtype() == DType::float32)
      detail::run_adam<float>(p, g, m_[i], v_[i], step_size, beta1_, beta2_, inv_sqrt_bc2, eps_,
                              weight_decay_);
    else
      detail::run_adam<double>(p, g, m_[i], v_[i], step_size, beta1_, beta2_, inv_sqrt_bc2, eps_,
                               weight_decay_);
  }
  ++steps_;
}

}  // namespace dualcast::optim
