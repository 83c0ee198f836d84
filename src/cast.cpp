// cast.cpp: cast(), the tape node of a dtype conversion, the guard that suspends 16-bit casts
// (check_gradients' float64 differencing) and the parameter check of 16-bit normalisation layers.
#include "dualcast/ops/cast.hpp"

#include <memory>

#include "dualcast/error.hpp"

namespace dualcast {

namespace {
/// Holds only the source dtype: the backward converts the adjoint back to it.
class CastNode final : public Node {
 public:
  explicit CastNode(DType from) : from_(from) {}
  [[nodiscard]] const char* name() const override { return "cast"; }
  void backward(const std::vector<Tensor>& grad_outputs) override {
    const Tensor& g = grad_outputs[0];
    if (g.defined() && inputs[0]) detail::accumulate_grad(*inputs[0], g.to(from_), /*owned=*/true);
  }

 private:
  DType from_;
};
}  // namespace

namespace {
thread_local int keep_precision_depth = 0;
}  // namespace

namespace detail {
bool keeping_precision() { return keep_precision_depth > 0; }

void check_parameter_of_half(const char* op, const Tensor& x, const char* name, const Tensor& param) {
  if (is_half(x.dtype()) && param.defined() && param.dtype() == DType::float32) {
    DUALCAST_CHECK(x.device() == param.device(), op, ": arguments on different devices: 'x' ",
                   x.shape().str(), " on ", x.device().str(), ", '", name, "' ",
                   param.shape().str(), " on ", param.device().str());
    return;
  }
  check_same_device_dtype(op, "x", x, name, param);
}
}  // namespace detail

KeepPrecisionGuard::KeepPrecisionGuard() { ++keep_precision_depth; }
KeepPrecisionGuard::~KeepPrecisionGuard() { --keep_precision_depth; }

Tensor cast(const Tensor& x, DType dtype) {
  check_defined(x, "cast", "x");
  return x.to(dtype);
}

Var cast(const Var& x, DType dtype) {
  DUALCAST_CHECK(x.defined(), "cast: argument 'x' is an undefined Var");
  if (x.dtype() == dtype) return x;
  if (detail::keeping_precision() && x.dtype() == DType::float64 && is_floating(dtype)) return x;
  const bool differentiate = detail::any_requires_grad({x});
  DUALCAST_CHECK(!differentiate || is_floating(dtype), "cast: a Var of shape ", x.shape().str(),
                 " that requires a gradient cannot become ", dtype_name(dtype),
                 " (only floating dtypes carry gradients; detach() it first)");
  Tensor out = x.value().to(dtype);
  std::shared_ptr<Node> node;
  if (differentiate) node = std::make_shared<CastNode>(x.dtype());
  return detail::record1(std::move(node), {x}, std::move(out));
}

}  // namespace dualcast
