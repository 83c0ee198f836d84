// channel_broadcast.cpp: the non-template half of channel_broadcast(): argument checks (devices,
// dtypes, the NCHW shape pattern) with messages naming the arguments, and the slicing of the backward.
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

ChannelPlan plan_channel_broadcast(std::vector<ChannelArg> args) {
  ChannelPlan plan;
  const ChannelArg* largest = nullptr;
  const ChannelArg* type_source = nullptr;  // first Var, else first floating tensor
  for (const auto& a : args) {
    if (a.kind == kNumberArg) continue;
    DUALCAST_CHECK(a.tensor.defined(), "channel_broadcast: argument #", &a - args.data(),
                   " is an undefined ", kind_name(a.kind));
    if (!largest || a.tensor.numel() > largest->tensor.numel()) largest = &a;
    if (a.kind == kVarArg && (!type_source || type_source->kind != kVarArg)) type_source = &a;
    if (!type_source && is_floating(a.tensor.dtype())) type_source = &a;
  }
  DUALCAST_CHECK(largest != nullptr, "channel_broadcast: needs at least one Var or Tensor argument (all ",
                 args.size(), " arguments are plain numbers)");
  const Shape out = largest->tensor.shape();
  DUALCAST_CHECK(out.rank() >= 2, "channel_broadcast: the largest argument, #",
                 largest - args.data(), ", has shape ", out.str(),
                 "; expected an [N, C, ...] tensor of rank >= 2 (NCHW activations)");
  plan.out_shape = out;
  plan.device = largest->tensor.device();
  plan.dtype = type_source ? type_source->tensor.dtype() : DType::float32;
  DUALCAST_CHECK(is_floating(plan.dtype), "channel_broadcast: arguments of dtype ",
                 dtype_name(plan.dtype), " (expected float32, float64, bfloat16 or float16)");
  // As broadcast(): float32 and the 16-bit types promote (to float32 when they mix).
  for (const auto& a : args)
    if (a.kind != kNumberArg && is_floating(a.tensor.dtype()) && promotable(plan.dtype, a.tensor.dtype()))
      plan.dtype = promote_types(plan.dtype, a.tensor.dtype());
  plan.N = out[0];
  plan.C = out[1];
  plan.inner = 1;
  for (int d = 2; d < out.rank(); ++d) plan.inner *= out[d];

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
    if (t.dtype() != plan.dtype) {
      const bool promoted = is_half(t.dtype()) && plan.dtype == DType::float32;
      DUALCAST_CHECK(promoted || (t.dtype() == DType::uint8 && info.kind == kTensorArg),
                     "channel_broadcast: arguments of different dtypes: argument #", a, " ",
                     t.shape().str(), " is ", dtype_name(t.dtype()), " but argument #",
                     type_source - args.data(), " is ", dtype_name(plan.dtype),
                     " (convert with Tensor::to(DType))");
      info.tensor = t.to(plan.dtype);
    }
    if (info.tensor.shape() == out) {
      info.access = static_cast<int>(ChannelAccess::full);
    } else if (per_channel_shape(info.tensor.shape(), plan.C, out.rank())) {
      info.access = static_cast<int>(ChannelAccess::channel);
    } else {
      DUALCAST_FAIL("channel_broadcast: argument #", a, " (a ", kind_name(info.kind), ") has shape ",
                    info.tensor.shape().str(), "; expected the output's shape ", out.str(),
                    ", a per-channel [", plan.C, "] or [1, ", plan.C,
                    out.rank() > 2 ? ", 1" : "", out.rank() > 3 ? ", 1" : "",
                    out.rank() > 4 ? ", ..." : "", "], or a number");
    }
    info.tensor = contiguous_copy(info.tensor);
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
