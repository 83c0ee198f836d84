// broadcast.cpp: the non-template half of broadcast(): argument checks (devices, dtypes, shapes)
// with messages naming the arguments, type promotion, and the conversion of mask and promoted
// arguments.
#include "dualcast/broadcast.hpp"

#include <string>

namespace dualcast::detail {

CallPlan plan_broadcast(std::vector<ArgInfo> args) {
  CallPlan plan;
  const ArgInfo* first = nullptr;      // first tensor argument: fixes the device
  const ArgInfo* first_var = nullptr;  // first differentiated one: fixes the dtype
  const ArgInfo* first_float = nullptr;
  for (const auto& a : args) {
    if (a.kind == kNumberArg) continue;
    DUALCAST_CHECK(a.tensor.defined(), "broadcast: argument #", &a - args.data(),
                   " is an undefined ", a.kind == kVarArg ? "Var" : "Tensor");
    if (!first) first = &a;
    if (!first_var && a.kind == kVarArg) first_var = &a;
    if (!first_float && is_floating(a.tensor.dtype())) first_float = &a;
  }
  DUALCAST_CHECK(first != nullptr,
                 "broadcast: needs at least one Var or Tensor argument (all ", args.size(),
                 " arguments are plain numbers)");
  plan.device = first->tensor.device();
  const ArgInfo* type_source = first_var ? first_var : first_float;
  plan.dtype = type_source ? type_source->tensor.dtype() : DType::float32;
  // float32 and the 16-bit types promote as in PyTorch (to float32 when they mix); float64 mixes
  // with nothing, so a float32 model never silently runs a step in double.
  for (const auto& a : args)
    if (a.kind != kNumberArg && is_floating(a.tensor.dtype()) && promotable(plan.dtype, a.tensor.dtype()))
      plan.dtype = promote_types(plan.dtype, a.tensor.dtype());

  std::vector<NamedShape> shapes;
  std::vector<std::string> names;
  names.reserve(args.size());
  for (std::size_t a = 0; a < args.size(); ++a) names.push_back("#" + std::to_string(a));
  for (std::size_t a = 0; a < args.size(); ++a) {
    ArgInfo& info = args[a];
    if (info.kind == kNumberArg) continue;
    const Tensor& t = info.tensor;
    DUALCAST_CHECK(t.device() == plan.device, "broadcast: arguments on different devices: argument #",
                   a, " ", t.shape().str(), " is on ", t.device().str(), " but argument #",
                   first - args.data(), " ", first->tensor.shape().str(), " is on ",
                   plan.device.str());
    if (t.dtype() != plan.dtype) {
      const bool promoted = is_half(t.dtype()) && plan.dtype == DType::float32;
      DUALCAST_CHECK(promoted || (t.dtype() == DType::uint8 && info.kind == kTensorArg),
                     "broadcast: arguments of different dtypes: argument #", a, " ",
                     t.shape().str(), " is ", dtype_name(t.dtype()), " but argument #",
                     type_source - args.data(), " ", type_source->tensor.shape().str(), " is ",
                     dtype_name(plan.dtype), " (convert with Tensor::to(DType))");
      // Masks become 0/1 numbers of the element type; a promoted 16-bit argument a float32 copy (its
      // gradient goes back converted: BroadcastNode).
      info.tensor = t.to(plan.dtype);
    }
    shapes.push_back({names[a].c_str(), info.tensor.shape()});
  }
  plan.out_shape = broadcast_shapes("broadcast", shapes);
  plan.args = std::move(args);
  return plan;
}

}  // namespace dualcast::detail
