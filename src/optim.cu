// optim.cu: SGD and Adam. Each update is one parallel_for over a parameter's elements (gradient,
// weight decay, state and parameter in one pass), so the CPU and the GPU run the same body. The
// bodies are lambdas inside named function templates: nvcc rejects extended __host__ __device__
// lambdas inside generic lambdas such as dispatch_floating's.
//
// The kernels are templates of the parameter's storage type P and compute in C = compute_t<P>: for
// float32 and float64 parameters C is P and the arithmetic is what it always was; a bfloat16 or
// float16 parameter is read into float, updated in float with float32 state, and rounded once on the
// store. Every kernel honours an optional device flag (skip): nonzero leaves everything unchanged.
#include "dualcast/optim.hpp"

#include <math.h>

#include <cmath>
#include <unordered_set>

#include "dualcast/error.hpp"
#include "dualcast/graph.hpp"
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

// The learning rate (and Adam's bias corrections) are read from device scalars in float64 and
// rounded to T in the kernel: the same value the host computed and passed before, so eager results
// are unchanged, and a captured step reads the values current at each replay.
/// Whether a step is to be skipped (GradScaler found an inf or NaN gradient).
DUALCAST_HD DUALCAST_INLINE bool skipped(const float* skip) { return skip != nullptr && *skip != 0.0f; }

template <class P>
void sgd_plain(Device device, P* p, const P* g, std::int64_t n, const double* lr_dev,
               compute_t<P> wd, const float* skip) {
  using T = compute_t<P>;
  parallel_for(device, n, [=] DUALCAST_HD(std::int64_t i) {
    if (skipped(skip)) return;
    const T lr = static_cast<T>(*lr_dev);
    const T pi = static_cast<T>(p[i]);
    const T d = static_cast<T>(g[i]) + wd * pi;
    p[i] = static_cast<P>(pi - lr * d);
  });
}

template <class P>
void sgd_momentum(Device device, P* p, const P* g, compute_t<P>* buf, std::int64_t n,
                  const double* lr_dev, compute_t<P> momentum, compute_t<P> wd, const float* skip) {
  using T = compute_t<P>;
  parallel_for(device, n, [=] DUALCAST_HD(std::int64_t i) {
    if (skipped(skip)) return;
    const T lr = static_cast<T>(*lr_dev);
    const T pi = static_cast<T>(p[i]);
    const T d = static_cast<T>(g[i]) + wd * pi;
    const T b = flush_subnormal(momentum * buf[i] + d);
    buf[i] = b;
    p[i] = static_cast<P>(pi - lr * b);
  });
}

/// Advances Adam's step count of `n` consecutive schedule rows (t, step size, 1/sqrt(bc2)) and
/// recomputes their bias corrections from it, in double as the host did: bc = 1 - beta^t.
inline void adam_schedule(Device device, double* rows, std::int64_t n, const double* lr_dev,
                          double beta1, double beta2, const float* skip) {
  parallel_for(device, n, [=] DUALCAST_HD(std::int64_t r) {
    if (skipped(skip)) return;  // a skipped step does not count (PyTorch does not call step())
    double* row = rows + 3 * r;
    const double t = row[0] + 1.0;
    row[0] = t;
    const double bc1 = 1.0 - ::pow(beta1, t);
    const double bc2 = 1.0 - ::pow(beta2, t);
    row[1] = *lr_dev / bc1;
    row[2] = 1.0 / ::sqrt(bc2);
  });
}

// PyTorch's form: p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps).
template <class P>
void adam_update(Device device, P* p, const P* g, compute_t<P>* m, compute_t<P>* v, std::int64_t n,
                 const double* row, compute_t<P> beta1, compute_t<P> beta2, compute_t<P> eps,
                 compute_t<P> wd, const float* skip) {
  using T = compute_t<P>;
  const T one_minus_beta1 = T(1) - beta1, one_minus_beta2 = T(1) - beta2;
  parallel_for(device, n, [=] DUALCAST_HD(std::int64_t i) {
    if (skipped(skip)) return;
    const T step_size = static_cast<T>(row[1]);
    const T inv_sqrt_bc2 = static_cast<T>(row[2]);
    const T pi = static_cast<T>(p[i]);
    const T d = static_cast<T>(g[i]) + wd * pi;
    const T mi = flush_subnormal(beta1 * m[i] + one_minus_beta1 * d);
    const T vi = flush_subnormal(beta2 * v[i] + one_minus_beta2 * d * d);
    m[i] = mi;
    v[i] = vi;
    p[i] = static_cast<P>(pi - step_size * mi / (opt_sqrt(vi) * inv_sqrt_bc2 + eps));
  });
}

template <class P>
void run_sgd(const Tensor& p, const Tensor& g, const Tensor* buf, const double* lr, double momentum,
             double wd, const float* skip) {
  using T = compute_t<P>;
  if (buf != nullptr)
    sgd_momentum<P>(p.device(), p.data<P>(), g.data<P>(), buf->data<T>(), p.numel(), lr,
                    static_cast<T>(momentum), static_cast<T>(wd), skip);
  else
    sgd_plain<P>(p.device(), p.data<P>(), g.data<P>(), p.numel(), lr, static_cast<T>(wd), skip);
}

template <class P>
void run_adam(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const double* row,
              double beta1, double beta2, double eps, double wd, const float* skip) {
  using T = compute_t<P>;
  adam_update<P>(p.device(), p.data<P>(), g.data<P>(), m.data<T>(), v.data<T>(), p.numel(), row,
                 static_cast<T>(beta1), static_cast<T>(beta2), static_cast<T>(eps),
                 static_cast<T>(wd), skip);
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
                   dtype_name(p.dtype()), " (expected float32, float64, bfloat16 or float16)");
    DUALCAST_CHECK(p.value().is_contiguous(), who, ": parameter ", i, " of shape ",
                   p.shape().str(), " is not contiguous");
    DUALCAST_CHECK(seen.insert(p.state().get()).second, who, ": parameter ", i, " of shape ",
                   p.shape().str(), " appears twice in the list (it would be updated twice)");
  }
  group_of_.resize(params_.size());
  slot_of_.resize(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Device d = params_[i].device();
    std::size_t k = 0;
    while (k < groups_.size() && groups_[k].device != d) ++k;
    if (k == groups_.size()) {
      dualcast::detail::check_not_capturing(
          d, "constructing an optimizer (it initialises device state)");
      groups_.push_back(DeviceGroup{d, Tensor::full(Shape{1}, lr, DType::float64, d), {}});
    }
    group_of_[i] = k;
    slot_of_[i] = groups_[k].members.size();
    groups_[k].members.push_back(i);
  }
}

void Optimizer::set_lr(double lr) {
  check_lr(lr, who_);
  if (lr == lr_) return;
  for (const DeviceGroup& g : groups_)
    dualcast::detail::check_not_capturing(
        g.device, "Optimizer::set_lr with a new value (the learning rate is a device scalar that "
                  "a captured step reads; set it between replays)");
  for (DeviceGroup& g : groups_) g.lr.fill_(lr);
  lr_ = lr;
}

const double* Optimizer::lr_on_device(std::size_t i) const {
  return groups_[group_of_[i]].lr.data<double>();
}

void Optimizer::step_unless(const Tensor& found_inf) {
  check_defined(found_inf, who_, "found_inf");
  DUALCAST_CHECK(found_inf.dtype() == DType::float32 && found_inf.numel() == 1, who_,
                 ": step_unless takes a float32 flag of one element, got ", found_inf.str());
  for (const DeviceGroup& g : groups_)
    DUALCAST_CHECK(g.device == found_inf.device(), who_, ": step_unless: the flag lives on ",
                   found_inf.device().str(), " but parameters live on ", g.device.str(),
                   " (the update kernels read it there)");
  struct Reset {
    const float*& flag;
    ~Reset() { flag = nullptr; }
  } reset{skip_};
  skip_ = static_cast<const float*>(found_inf.raw_data());
  step();
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
      buffers_[i] = Tensor::zeros(v.shape(), compute_dtype(v.dtype()), v.device());
    }
}

void SGD::step() {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Tensor g = grad_of(i);
    if (!g.defined()) continue;
    const Tensor& p = params_[i].value();
    const Tensor* buf = momentum_ > 0.0 ? &buffers_[i] : nullptr;
    dispatch_floating_storage(p.dtype(), "SGD", [&](auto tag) {
      detail::run_sgd<decltype(tag)>(p, g, buf, lr_on_device(i), momentum_, weight_decay_, skip_);
    });
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
  for (const Var& p : params_) {
    const Tensor& v = p.value();
    m_.push_back(Tensor::zeros(v.shape(), compute_dtype(v.dtype()), v.device()));
    v_.push_back(Tensor::zeros(v.shape(), compute_dtype(v.dtype()), v.device()));
  }
  for (const DeviceGroup& g : groups_)
    schedule_.push_back(Tensor::zeros(
        Shape{static_cast<std::int64_t>(g.members.size()), 3}, DType::float64, g.device));
}

std::int64_t Adam::param_steps(std::size_t i) const {
  DUALCAST_CHECK(i < params_.size(), "Adam::param_steps: parameter index ", i, " out of range (",
                 params_.size(), " parameters)");
  const std::vector<double> rows = schedule_[group_of_[i]].to_vector<double>();
  return static_cast<std::int64_t>(rows[3 * slot_of_[i]]);
}

void Adam::step() {
  std::vector<Tensor> grads(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) grads[i] = grad_of(i);
  // Advance t and the bias corrections of the parameters that are updated: one kernel per device
  // when all of its parameters have a gradient (the usual case), else one per parameter.
  for (std::size_t k = 0; k < groups_.size(); ++k) {
    const DeviceGroup& grp = groups_[k];
    double* rows = schedule_[k].data<double>();
    const double* lr = grp.lr.data<double>();
    bool all = true;
    for (std::size_t i : grp.members) all = all && grads[i].defined();
    if (all) {
      detail::adam_schedule(grp.device, rows, static_cast<std::int64_t>(grp.members.size()), lr,
                            beta1_, beta2_, skip_);
    } else {
      for (std::size_t s = 0; s < grp.members.size(); ++s)
        if (grads[grp.members[s]].defined())
          detail::adam_schedule(grp.device, rows + 3 * s, 1, lr, beta1_, beta2_, skip_);
    }
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Tensor& g = grads[i];
    if (!g.defined()) continue;
    const double* row = schedule_[group_of_[i]].data<double>() + 3 * slot_of_[i];
    const Tensor& p = params_[i].value();
    dispatch_floating_storage(p.dtype(), "Adam", [&](auto tag) {
      detail::run_adam<decltype(tag)>(p, g, m_[i], v_[i], row, beta1_, beta2_, eps_, weight_decay_,
                                      skip_);
    });
  }
  ++steps_;
}

}  // namespace dualcast::optim
