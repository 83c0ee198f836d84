// channel_broadcast.cpp: the non-template half of channel_broadcast(): argument checks (devices,
// dtypes, the NCHW shape pattern) with messages naming the arguments, the call's dtype (with or
// without ChannelOptions::keep_activation_dtype), and the slicing of the backward.
#include "dualcast/channel_broadcast.hpp"

#include <algorithm>
#include <string>

namespace dualcast::detail {

namespace {

const char* kind_name(int kind) { return kind == kVarArg ? "Var" : "Tensor"; }

/// Whether `s` is the per-channel form of C channels for an output of rank `rank`: [C], or
/// [1, C, 1, ..] of the output's rank.
bool per_channel_shape(const Shape& s, std::int64_t C, int rank) {
  if (s.rank() == 1) return s[0] == C;
  if (s.rank() != rank) return false;
  for (int d = 0; d < s.rank(); ++d)
    if (s[d] != (d == 1 ? C : 1)) return false;
  return true;
}

}  // namespace

ChannelPlan plan_channel_broadcast(std::vector<ChannelArg> args, bool keep_activation_dtype) {
  ChannelPlan plan;
  const ChannelArg* largest = nullptr;
  for (const auto& a : args) {
    if (a.kind == kNumberArg) continue;
    DUALCAST_CHECK(a.tensor.defined(), "channel_broadcast: argument #", &a - args.data(),
                   " is an undefined ", kind_name(a.kind));
    if (!largest || a.tensor.numel() > largest->tensor.numel()) largest = &a;
  }
  DUALCAST_CHECK(largest != nullptr, "channel_broadcast: needs at least one Var or Tensor argument (all ",
                 args.size(), " arguments are plain numbers)");
  const Shape out = largest->tensor.shape();
  DUALCAST_CHECK(out.rank() >= 2, "channel_broadcast: the largest argument, #",
                 largest - args.data(), ", has shape ", out.str(),
                 "; expected an [N, C, ...] tensor of rank >= 2 (NCHW activations)");
  plan.out_shape = out;
  plan.device = largest->tensor.device();
  plan.N = out[0];
  plan.C = out[1];
  plan.inner = 1;
  for (int d = 2; d < out.rank(); ++d) plan.inner *= out[d];

  // Each tensor is full-size or per-channel (the largest is full-size).
  for (std::size_t a = 0; a < args.size(); ++a) {
    ChannelArg& info = args[a];
    if (info.kind == kNumberArg) {
      info.access = static_cast<int>(ChannelAccess::number);
      continue;
    }
    const Tensor& t = info.tensor;
    DUALCAST_CHECK(t.device() == plan.device, "channel_broadcast: arguments on different devices: "
                   "argument #", a, " ", t.shape().str(), " is on ", t.device().str(),
                   " but argument #", largest - args.data(), " ", out.str(), " is on ",
                   plan.device.str());
    if (t.shape() == out) {
      info.access = static_cast<int>(ChannelAccess::full);
    } else if (per_channel_shape(t.shape(), plan.C, out.rank())) {
      info.access = static_cast<int>(ChannelAccess::channel);
    } else {
      DUALCAST_FAIL("channel_broadcast: argument #", a, " (a ", kind_name(info.kind), ") has shape ",
                    t.shape().str(), "; expected the output's shape ", out.str(), ", a per-channel [",
                    plan.C, "] or [1, ", plan.C, out.rank() > 2 ? ", 1" : "", out.rank() > 3 ? ", 1" : "",
                    out.rank() > 4 ? ", ..." : "", "], or a number");
    }
  }

  // The dtype: of the first Var, else of the first floating tensor, promoted as broadcast() promotes
  // (float32 and the 16-bit types give float32 when they mix); with keep_activation_dtype only the
  // full-size arguments take part.
  auto decides = [&](const ChannelArg& a) {
    return a.kind != kNumberArg && (!keep_activation_dtype || a.access == static_cast<int>(ChannelAccess::full));
  };
  const ChannelArg* type_source = nullptr;
  for (const auto& a : args) {
    if (!decides(a)) continue;
    if (a.kind == kVarArg && (!type_source || type_source->kind != kVarArg)) type_source = &a;
    if (!type_source && is_floating(a.tensor.dtype())) type_source = &a;
  }
  plan.dtype = type_source ? type_source->tensor.dtype() : DType::float32;
  DUALCAST_CHECK(is_floating(plan.dtype), "channel_broadcast: arguments of dtype ",
                 dtype_name(plan.dtype), " (expected float32, float64, bfloat16 or float16)");
  for (const auto& a : args)
    if (decides(a) && is_floating(a.tensor.dtype()) && promotable(plan.dtype, a.tensor.dtype()))
      plan.dtype = promote_types(plan.dtype, a.tensor.dtype());
  // Per-channel tensors are kept in the compute type (float32 for a 16-bit call).
  const DType compute = is_half(plan.dtype) ? DType::float32 : plan.dtype;

  for (std::size_t a = 0; a < args.size(); ++a) {
    ChannelArg& info = args[a];
    if (info.kind == kNumberArg) continue;
    const Tensor& t = info.tensor;
    const bool full = info.access == static_cast<int>(ChannelAccess::full);
    if (t.dtype() != plan.dtype) {
      const bool promoted = is_half(t.dtype()) && plan.dtype == DType::float32;
      const bool float32_parameter = keep_activation_dtype && !full && t.dtype() == compute;
      DUALCAST_CHECK(promoted || float32_parameter || (t.dtype() == DType::uint8 && info.kind == kTensorArg),
                     "channel_broadcast: arguments of different dtypes: argument #", a, " ",
                     t.shape().str(), " is ", dtype_name(t.dtype()), " but argument #",
                     type_source - args.data(), " is ", dtype_name(plan.dtype),
                     keep_activation_dtype ? " (per-channel arguments may also be float32)" : "",
                     " (convert with Tensor::to(DType))");
    }
    const DType stored = full ? plan.dtype : compute;
    info.tensor = contiguous_copy(t.dtype() == stored ? t : t.to(stored));
  }
  plan.args = std::move(args);
  return plan;
}

std::int64_t channel_slices(Device device, std::int64_t C, std::int64_t M, std::int64_t inner) {
  if (device.is_cuda() && channel_columns(C, inner)) {
    // Blocks of 32 channels x kColumnRows rows; a slice of at least 64 rows (8 per thread).
    const std::int64_t across = (C + 31) / 32;
    const std::int64_t want = (8 * static_cast<std::int64_t>(multiprocessor_count(device)) + across - 1) / across;
    return std::clamp<std::int64_t>(want, 1, std::max<std::int64_t>(1, M / 64));
  }
  constexpr std::int64_t kMinSlice = 4096;  // elements: a block of 256 threads x 4 float4 chunks
  const std::int64_t max_slices = std::max<std::int64_t>(1, M / kMinSlice);
  std::int64_t want = 1;
  if (device.is_cuda()) {
    want = (8 * static_cast<std::int64_t>(multiprocessor_count(device)) + C - 1) / std::max<std::int64_t>(C, 1);
  } else {
    want = (4 * static_cast<std::int64_t>(cpu_thread_count()) + C - 1) / std::max<std::int64_t>(C, 1);
  }
  return std::clamp<std::int64_t>(want, 1, max_slices);
}

}  // namespace dualcast::detail
