// communicator.hpp: a group of processes (ranks) that train together, and the collectives they run.
//
// One process per GPU (or per CPU "rank"), as in PyTorch's DistributedDataParallel: the processes
// are started by scripts/launch (or torchrun), which gives each its place in the environment
// variables torchrun uses: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT. Rank 0 listens
// on MASTER_ADDR:MASTER_PORT and every other rank connects to it (the rendezvous); those TCP
// connections then carry what must be agreed on before any collective can run (NCCL's unique id,
// barriers, the backend each rank chose).
//
// Two backends with one interface:
//  * NCCL for CUDA tensors (when the build found it: "dualcast: NCCL ..." at configure time). The
//    collectives run on a stream of the communicator's own, ordered after the work already queued
//    on the device's stream (stream.hpp) and joined back into it by wait(): the host never blocks,
//    the backward goes on while gradients travel, and a whole step with its collectives can be
//    captured in a Graph (NCCL calls are capturable).
//  * A CPU collective for CPU tensors, over the rendezvous sockets on the loopback: rank 0 sums the
//    ranks' tensors in rank order and sends the result back (every rank gets the same bits). Its
//    collectives run on a thread of their own, so they overlap the backward as NCCL's do. It is
//    what lets the data-parallel code be tested in CI, where there is no GPU and no NCCL.
//
// Faults never hang: every socket wait has a timeout (DUALCAST_DIST_TIMEOUT seconds, default 300);
// a peer that exits closes its sockets and the ranks waiting on it fail at once with an Error naming
// that rank; scripts/launch stops every rank within seconds when one fails. NCCL's asynchronous
// errors are polled by a watchdog thread, which reports the rank and the error and ends the process
// (a rank stuck in a collective whose peer is gone cannot be unstuck otherwise, as in PyTorch).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dualcast/device.hpp"
#include "dualcast/tensor.hpp"

namespace dualcast::dist {

/// Where this process is in the group, as torchrun's environment variables say.
struct Env {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  ///< rank among the processes of this host (the GPU index to use)
  std::string master_addr = "127.0.0.1";
  int master_port = 0;

  /// Reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT. With none of them set this is a
  /// group of one (rank 0 of 1). Missing or malformed values (a rank outside [0, WORLD_SIZE), a
  /// port outside 1..65535, WORLD_SIZE > 1 without MASTER_PORT) are a dualcast::Error naming the
  /// variable.
  static Env from_environment();
  /// Whether the environment names a group (WORLD_SIZE set).
  static bool launched();
};

enum class ReduceOp { sum, average };

/// A group of ranks that run collectives together. Every rank must call the same collectives in the
/// same order with tensors of the same shapes and dtypes (as with NCCL and MPI); shapes are checked
/// on the CPU backend, where a mismatch is an Error on every rank.
class Communicator {
 public:
  /// Joins the group `env` describes, for tensors on `device`: NCCL for a CUDA device (an Error
  /// when the build has no NCCL), the CPU collective for the CPU. Blocks until every rank has
  /// joined (or the timeout). A group of one needs no sockets and runs no communication. With NCCL,
  /// `device` also becomes the calling thread's current CUDA device (one process per GPU, as
  /// torch.cuda.set_device), so code that uses the current device runs on the rank's GPU.
  static std::unique_ptr<Communicator> create(const Env& env, Device device);
  /// create(Env::from_environment(), device).
  static std::unique_ptr<Communicator> from_environment(Device device);

  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  [[nodiscard]] int rank() const { return env_.rank; }
  [[nodiscard]] int size() const { return env_.world_size; }
  [[nodiscard]] const Env& env() const { return env_; }
  [[nodiscard]] Device device() const { return device_; }
  /// "nccl <version>", "cpu-sockets" or "single" (a group of one).
  [[nodiscard]] virtual std::string backend() const = 0;

  /// Queues an in-place reduction of each tensor across the ranks (every tensor contiguous, on this
  /// communicator's device, floating dtype). Ordered after the work already queued on the device;
  /// returns at once. The tensors must not be written or freed until wait() has been called.
  virtual void all_reduce(const std::vector<Tensor>& tensors, ReduceOp op) = 0;
  /// Queues a copy of root's tensors into every rank's tensors (in place; same rules).
  virtual void broadcast(const std::vector<Tensor>& tensors, int root) = 0;
  /// Makes later work on the device wait for every collective queued so far (stream-ordered on a
  /// GPU, so capturable; on the CPU the calling thread waits). Errors of the collectives (a peer
  /// that failed, a timeout) are thrown here on the CPU backend.
  virtual void wait() = 0;
  /// Blocks the host until every rank has reached this call (and this rank's queued collectives
  /// have finished). Not capturable.
  virtual void barrier() = 0;

 protected:
  Communicator(Env env, Device device) : env_(std::move(env)), device_(device) {}
  Env env_;
  Device device_;
};

/// Whether this build can run collectives on CUDA devices (NCCL was found at configure time).
bool nccl_available();

}  // namespace dualcast::dist
