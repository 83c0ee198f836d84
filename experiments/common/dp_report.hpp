// dp_report.hpp: how much of a data-parallel step is communication, and how much of that the backward
// hides, as the drivers with --gpus report it (resnet_train --bench, hmlstm_dp --bench).
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "dualcast/data_parallel.hpp"
#include "report.hpp"

namespace dcexp {

/// After the data-parallel step has been timed at step_ms (median): times `local_step`, the same step
/// without the gradient average (what each rank computes: run under ddp.set_sync(false), or a graph
/// captured so), then the average of all the gradients' bytes alone (one flat all-reduce, nothing
/// to overlap). exposed = step - compute only is what the communication adds; hidden = 1 - exposed /
/// alone is the share of it the backward covered.
inline json time_data_parallel_parts(dualcast::Device device, const std::function<void()>& local_step,
                                     dualcast::dist::DataParallel& ddp, const std::vector<dualcast::Var>& params,
                                     double step_ms, int warmup, int reps) {
  auto none = [](int) {};
  const StepTimes local = time_steps(device, none, [&](int) { local_step(); }, warmup, reps);
  // The ideal all-reduce: all the gradients' bytes as one flat tensor (as the PyTorch peer times
  // it), or one per dtype when they are mixed.
  std::vector<std::pair<dualcast::DType, std::int64_t>> elements;  // per dtype
  std::size_t bytes = 0;
  for (const dualcast::Var& p : params) {
    bytes += p.value().nbytes();
    auto same = std::find_if(elements.begin(), elements.end(), [&](const auto& e) { return e.first == p.dtype(); });
    if (same == elements.end()) elements.emplace_back(p.dtype(), p.numel());
    else same->second += p.numel();
  }
  std::vector<dualcast::Tensor> grads;
  for (const auto& [dtype, n] : elements) grads.push_back(dualcast::Tensor::zeros({n}, dtype, device));
  auto& comm = ddp.communicator();
  const StepTimes alone = time_steps(
      device, none,
      [&](int) {
        comm.all_reduce(grads, dualcast::dist::ReduceOp::average);
        comm.wait();
      },
      warmup, reps);
  const double ar = alone.primary().median, exposed = step_ms - local.primary().median;
  json r = json::object();
  r["compute_only_ms"] = summary_json(local.primary());
  r["allreduce_alone_ms"] = summary_json(alone.primary());
  r["gradient_bytes"] = static_cast<long long>(bytes);
  // NCCL's "bus bandwidth" of an all-reduce: 2 (n - 1) / n of the bytes cross each link.
  r["allreduce_bus_gb_per_s"] = 2.0 * (comm.size() - 1) / comm.size() * static_cast<double>(bytes) / (ar * 1e6);
  r["exposed_comm_ms"] = exposed;
  r["hidden_comm_share"] = ar > 0 ? std::clamp(1.0 - exposed / ar, 0.0, 1.0) : 1.0;
  r["buckets"] = static_cast<long long>(ddp.num_buckets());
  r["buckets_launched_during_backward"] = static_cast<long long>(ddp.buckets_launched_early());
  std::printf("%8s %12.3f compute only; all-reduce alone %.3f ms (%.0f GB/s bus), exposed %.3f ms, %.0f%% hidden; "
              "%zu buckets, %zu launched during the backward\n",
              "", local.primary().median, ar, r["allreduce_bus_gb_per_s"].get<double>(), exposed,
              100.0 * r["hidden_comm_share"].get<double>(), ddp.num_buckets(), ddp.buckets_launched_early());
  return r;
}

}  // namespace dcexp
