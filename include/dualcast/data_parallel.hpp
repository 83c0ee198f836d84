// data_parallel.hpp: DataParallel, data-parallel training over a Communicator (one process per GPU).
//
// Every rank holds the whole model, reads its own shard of each batch (shard()), and runs forward
// and backward on it; DataParallel makes the gradients the average over the ranks, so that with
// equal shards every rank's optimizer takes the step that one process would take on the whole
// batch. As in PyTorch's DistributedDataParallel:
//  * at construction the parameters are copied from rank 0 to every rank (and the ranks' parameter
//    lists are checked to agree);
//  * the gradients are averaged in buckets of about bucket_cap_bytes, filled in reverse parameter
//    order (the last layers' gradients are final first), each launched during the backward as soon
//    as its gradients are final (Var::add_grad_ready_hook), on the communicator's own stream, so
//    communication overlaps the rest of the backward. Buckets launch in the same order on every
//    rank (a bucket waits for the ones before it), which the collectives require.
//
//   auto comm = dist::Communicator::from_environment(device);
//   dist::DataParallel ddp(*comm, model.parameters());
//   for (...) { opt.zero_grad(); Var l = loss(model, dist::shard(batch, *comm)); l.backward();
//               ddp.finish(); opt.step(); }
//
// finish() launches whatever the backward did not (a parameter no backward reached gets a zero
// gradient, so every rank reduces the same tensors; unlike a one-process run, where it would have no
// gradient and be skipped, the optimizer then updates it, weight decay and momentum included) and
// makes later device work wait for the reductions. It records no host wait: a whole step with its
// collectives can be captured in a Graph and replayed. A bucket of several gradients is reduced as
// one flat buffer, and its parameters' gradients become views of that buffer (as with PyTorch's
// gradient_as_bucket_view): a gradient tensor kept past the next step's reduction sees it overwritten.
// Gradients are reduced in their parameters' dtypes (16-bit gradients included); with GradScaler,
// unscale after finish(), so every rank sees the same gradients and skips the same steps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dualcast/communicator.hpp"
#include "dualcast/dtype.hpp"
#include "dualcast/tape.hpp"

namespace dualcast::dist {

struct DataParallelOptions {
  /// Bytes of gradient per bucket (PyTorch's default: 25 MiB); a parameter larger than this gets a
  /// bucket of its own. A bucket is launched when all of it is final, so a model whose gradients
  /// become final in a few large groups (a recurrent model's layers at the end of BPTT) wants
  /// buckets no larger than a group.
  std::size_t bucket_cap_bytes = std::size_t{25} << 20;
  /// The first bucket (the last layers) is smaller, so that communication starts early.
  std::size_t first_bucket_cap_bytes = std::size_t{1} << 20;

  /// Buckets of `mib` MiB (the first the smaller of that and 1 MiB); an Error unless it is at least
  /// one byte and at most 4096 MiB.
  static DataParallelOptions with_bucket_mib(double mib);
};

class DataParallel {
 public:
  /// Registers the hooks and broadcasts the parameters' values from rank 0 (the parameter lists of
  /// the ranks are compared first), then reduces each bucket's shapes once, so that the collectives'
  /// lazy setup happens here and not inside a Graph capture. Waits for the device. Every parameter
  /// must be a leaf that requires a gradient, on the communicator's device, without duplicates.
  DataParallel(Communicator& comm, std::vector<Var> params, DataParallelOptions options = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  /// Completes the step's gradient averaging (see the file comment). Call once after each
  /// backward (or after the last of several under set_sync(false)).
  void finish();
  /// false: backwards add to the gradients locally and reduce nothing (gradient accumulation, as
  /// PyTorch's no_sync()); the first backward after set_sync(true) reduces the accumulated sums.
  /// A second backward before finish() is an Error, raised when its first gradient is final: by then
  /// it has added into a gradient whose reduction may be running, so that step's gradients are lost
  /// (call finish(), zero the gradients and start the step again).
  void set_sync(bool on) { sync_ = on; }

  [[nodiscard]] Communicator& communicator() const { return comm_; }
  [[nodiscard]] std::size_t num_buckets() const { return buckets_.size(); }
  /// Parameter indices of bucket b, in the order they are reduced.
  [[nodiscard]] const std::vector<std::size_t>& bucket(std::size_t b) const { return buckets_.at(b).members; }
  /// Buckets launched by the backward's hooks (not by finish()) in the last step: how much of the
  /// communication could overlap the backward.
  [[nodiscard]] std::size_t buckets_launched_early() const { return launched_early_; }

 private:
  struct Bucket {
    std::vector<std::size_t> members;
    std::vector<std::int64_t> offsets;  ///< each member's first element in flat
    DType dtype = DType::float32;
    Tensor flat;  ///< the gradients of a bucket of several, reduced as one (undefined for one)
    std::size_t ready = 0;
  };
  void on_ready(std::size_t param);
  void launch(std::size_t b);
  void reset();  ///< forgets the step's readiness (after finish, or after a failed launch)

  Communicator& comm_;
  std::vector<Var> params_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_;
  std::vector<std::uint8_t> ready_;
  std::vector<std::uint64_t> hook_ids_;
  std::size_t next_ = 0;  ///< the next bucket to launch: buckets launch in order
  std::size_t launched_early_ = 0, launched_early_now_ = 0;
  bool sync_ = true;
};

/// Rows [rank * n / size, (rank + 1) * n / size) of `batch` along its first dimension (a view, no
/// copy): this rank's part of a global batch. The first dimension must divide evenly by the group
/// size (equal shards are what make the averaged gradient the whole batch's), else an Error.
Tensor shard(const Tensor& batch, const Communicator& comm);
/// Shards along dimension `dim` (a copy unless dim is 0), for time-major data such as [T, B, ...].
Tensor shard(const Tensor& batch, const Communicator& comm, int dim);

/// A copy of `t` reduced over the ranks (e.g. the mean loss over the whole batch, for logging);
/// stream-ordered like every collective.
Tensor all_reduced(Communicator& comm, const Tensor& t, ReduceOp op = ReduceOp::average);

}  // namespace dualcast::dist
