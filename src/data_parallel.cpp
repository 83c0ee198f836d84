// data_parallel.cpp: DataParallel's buckets and hooks, and the sharding helpers.
#include "dualcast/data_parallel.hpp"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "dualcast/error.hpp"
#include "dualcast/ops/shape.hpp"

namespace dualcast::dist {

namespace {

/// A fingerprint of the parameter list (count, elements, and a hash of shapes and dtypes) that the
/// ranks sum: if every rank's sum equals size x its own, the lists agree.
std::vector<double> signature(const std::vector<Var>& params) {
  double elements = 0;
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over (dims..., dtype) of every parameter
  auto mix = [&h](std::uint64_t v) {
    h ^= v;
    h *= 1099511628211ull;
  };
  for (const Var& p : params) {
    elements += static_cast<double>(p.numel());
    for (int d = 0; d < p.shape().rank(); ++d) mix(static_cast<std::uint64_t>(p.shape()[d]));
    mix(static_cast<std::uint64_t>(p.dtype()) + 1000);
  }
  return {static_cast<double>(params.size()), elements, static_cast<double>(h % (1u << 30))};
}

/// `elements` rounded up to a multiple of 16 bytes: each gradient's slot in a bucket's flat buffer
/// starts 16-byte aligned, as a tensor of its own would, so kernels keep their vector loads on it.
std::int64_t aligned(std::int64_t elements, DType dtype) {
  const auto per = static_cast<std::int64_t>(16 / dtype_size(dtype));
  return (elements + per - 1) / per * per;
}

}  // namespace

DataParallelOptions DataParallelOptions::with_bucket_mib(double mib) {
  DUALCAST_CHECK(mib * 1048576.0 >= 1.0 && mib <= 4096, "DataParallelOptions: a bucket of ", mib,
                 " MiB is not in [1 byte, 4096 MiB]");
  DataParallelOptions o;
  o.bucket_cap_bytes = static_cast<std::size_t>(mib * 1048576.0);
  o.first_bucket_cap_bytes = std::min(o.first_bucket_cap_bytes, o.bucket_cap_bytes);
  return o;
}

DataParallel::DataParallel(Communicator& comm, std::vector<Var> params, DataParallelOptions options)
    : comm_(comm), params_(std::move(params)) {
  DUALCAST_CHECK(!params_.empty(), "DataParallel: the parameter list is empty");
  DUALCAST_CHECK(options.bucket_cap_bytes > 0 && options.first_bucket_cap_bytes > 0,
                 "DataParallel: bucket caps must be positive");
  std::unordered_set<const VarState*> seen;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Var& p = params_[i];
    DUALCAST_CHECK(p.defined() && p.requires_grad() && p.is_leaf(), "DataParallel: parameter ", i,
                   " is not a leaf that requires a gradient (Var::param)");
    DUALCAST_CHECK(p.device() == comm_.device(), "DataParallel: parameter ", i, " of shape ",
                   p.shape().str(), " lives on ", p.device().str(), " but the communicator on ",
                   comm_.device().str());
    DUALCAST_CHECK(seen.insert(p.state().get()).second, "DataParallel: parameter ", i, " of shape ",
                   p.shape().str(), " appears twice in the list");
  }

  // The ranks must hold the same parameters, or the buckets' collectives would not match.
  // A rank whose sums differ from size x its own knows the lists differ; a second reduction of that
  // verdict lets every rank know, so that none goes on into the broadcast alone.
  const std::vector<double> mine = signature(params_);
  const std::vector<double> sum =
      all_reduced(comm_, Tensor::from_vector<double>({3}, mine, comm_.device()), ReduceOp::sum).to_vector<double>();
  bool differ = false;
  for (std::size_t k = 0; k < mine.size(); ++k) differ = differ || sum[k] != mine[k] * comm_.size();
  const double ranks_differing =
      all_reduced(comm_, Tensor::full({1}, differ ? 1.0 : 0.0, DType::float64, comm_.device()), ReduceOp::sum).item();
  DUALCAST_CHECK(ranks_differing == 0, "DataParallel: rank ", comm_.rank(),
                 ": the ranks' parameter lists differ (this rank has ", params_.size(), " parameters of ",
                 mine[1], " elements", differ ? "" : ", as most ranks do",
                 "); every rank must build the same model");

  // Buckets in reverse parameter order: the last layers' gradients are the first to be final.
  // A bucket holds one dtype, so that its gradients can live in one flat buffer.
  bucket_of_.assign(params_.size(), 0);
  std::size_t bytes = 0;
  for (std::size_t k = params_.size(); k-- > 0;) {
    const Tensor& v = params_[k].value();
    const std::size_t b = v.nbytes();
    const std::size_t cap = buckets_.size() == 1 ? options.first_bucket_cap_bytes : options.bucket_cap_bytes;
    if (buckets_.empty() || (bytes > 0 && bytes + b > cap) || v.dtype() != buckets_.back().dtype) {
      buckets_.emplace_back();
      buckets_.back().dtype = v.dtype();
      bytes = 0;
    }
    Bucket& bk = buckets_.back();
    bk.offsets.push_back(bk.members.empty() ? 0 : aligned(bk.offsets.back() + params_[bk.members.back()].numel(), v.dtype()));
    bk.members.push_back(k);
    bucket_of_[k] = buckets_.size() - 1;
    bytes += b;
  }
  // A bucket of several gradients is reduced as one flat buffer: one collective of full-size
  // messages instead of one per tensor (ResNet-18's 62 tensors include many of a few hundred bytes).
  for (Bucket& bk : buckets_)
    if (bk.members.size() > 1)
      bk.flat = Tensor::zeros({bk.offsets.back() + params_[bk.members.back()].numel()}, bk.dtype, comm_.device());
  ready_.assign(params_.size(), 0);

  comm_.broadcast([&] {
    std::vector<Tensor> values;
    for (const Var& p : params_) values.push_back(p.value());
    return values;
  }(), 0);
  // One reduction of each bucket's shapes now, so that whatever the collectives set up on first use
  // (NCCL connects its channels lazily) is done before a step is captured in a Graph.
  for (const Bucket& b : buckets_) {
    const Tensor zeros = b.flat.defined() ? b.flat
                                          : Tensor::zeros(params_[b.members[0]].shape(), b.dtype, comm_.device());
    comm_.all_reduce({zeros}, ReduceOp::average);
    comm_.wait();
  }
  synchronize(comm_.device());

  for (std::size_t k = 0; k < params_.size(); ++k)
    hook_ids_.push_back(params_[k].add_grad_ready_hook([this, k] { on_ready(k); }));
}

DataParallel::~DataParallel() {
  for (std::size_t k = 0; k < params_.size(); ++k) params_[k].remove_grad_ready_hook(hook_ids_[k]);
}

void DataParallel::reset() {
  next_ = 0;
  launched_early_now_ = 0;
  std::fill(ready_.begin(), ready_.end(), 0);
  for (Bucket& b : buckets_) b.ready = 0;
}

void DataParallel::on_ready(std::size_t param) {
  if (!sync_) return;
  DUALCAST_CHECK(!ready_[param], "DataParallel: a second backward reached parameter ", param, " (shape ",
                 params_[param].shape().str(),
                 ") before finish(): call finish() after each backward, or set_sync(false) for the "
                 "backwards whose gradients should only accumulate");
  ready_[param] = 1;
  Bucket& b = buckets_[bucket_of_[param]];
  ++b.ready;
  // Launch, in order, every bucket that is complete.
  while (next_ < buckets_.size() && buckets_[next_].ready == buckets_[next_].members.size()) {
    try {
      launch(next_++);
    } catch (...) {
      reset();
      throw;
    }
    ++launched_early_now_;
  }
}

void DataParallel::launch(std::size_t b) {
  Bucket& bk = buckets_[b];
  if (!bk.flat.defined()) {  // one gradient: reduced where it is
    VarState& s = *params_[bk.members[0]].state();
    if (!s.grad.defined()) {
      // No backward reached it on this rank; another rank's may have: reduce zeros.
      s.grad = Tensor::zeros(s.value.shape(), s.value.dtype(), s.value.device());
    } else if (!s.grad_owned) {
      // Its storage may be shared with a tensor the rest of the backward still reads.
      s.grad = s.grad.clone();
    }
    s.grad_owned = true;
    comm_.all_reduce({s.grad}, ReduceOp::average);
    return;
  }
  // Several: each gradient is copied into its slot of the flat buffer and from then on IS that slot
  // (as PyTorch's gradient_as_bucket_view), so the reduced values need no copy back. A gradient
  // that already is its slot (accumulated into since the last step) is not copied.
  for (std::size_t i = 0; i < bk.members.size(); ++i) {
    VarState& s = *params_[bk.members[i]].state();
    Tensor slot = bk.flat.narrow(bk.offsets[i], s.value.numel()).view(s.value.shape());
    if (!s.grad.defined())
      slot.fill_(0.0);  // no backward reached it on this rank; another rank's may have
    else if (s.grad.raw_data() != slot.raw_data())
      slot.copy_(s.grad);
    s.grad = std::move(slot);
    s.grad_owned = true;
  }
  comm_.all_reduce({bk.flat}, ReduceOp::average);
}

void DataParallel::finish() {
  if (!sync_) return;
  launched_early_ = launched_early_now_;
  try {
    while (next_ < buckets_.size()) launch(next_++);
    comm_.wait();
  } catch (...) {
    reset();  // the next step starts clean and reports its own errors, not "a second backward"
    throw;
  }
  reset();
}

Tensor shard(const Tensor& batch, const Communicator& comm) { return shard(batch, comm, 0); }

Tensor shard(const Tensor& batch, const Communicator& comm, int dim) {
  check_defined(batch, "dist::shard", "batch");
  DUALCAST_CHECK(dim >= 0 && dim < batch.rank(), "dist::shard: dimension ", dim, " is not one of ",
                 batch.shape().str());
  const std::int64_t n = batch.shape()[dim];
  DUALCAST_CHECK(n % comm.size() == 0, "dist::shard: a batch of shape ", batch.shape().str(),
                 " has ", n, " rows along dimension ", dim, ", which do not split evenly over ",
                 comm.size(), " ranks");
  const std::int64_t part = n / comm.size();
  if (comm.size() == 1) return batch;
  if (dim == 0) return batch.narrow(comm.rank() * part, part);
  return slice(batch, dim, comm.rank() * part, (comm.rank() + 1) * part);
}

Tensor all_reduced(Communicator& comm, const Tensor& t, ReduceOp op) {
  check_defined(t, "dist::all_reduced", "t");
  Tensor copy = t.clone();
  comm.all_reduce({copy}, op);
  comm.wait();
  return copy;
}

}  // namespace dualcast::dist
