// distributed.hpp: the drivers' --gpus N (data-parallel training, include/dualcast/data_parallel.hpp).
//
// A driver given --gpus N > 1 that no launcher started re-executes itself through scripts/launch,
// which starts N copies with torchrun's environment (relaunch_if_requested, once the options parse);
// each copy is one rank: it trains on cuda:LOCAL_RANK (or the CPU, for tests without a GPU), reads
// its shard of every global batch (--batch stays the global batch, so N ranks take the steps one
// process takes on the whole batch), and only rank 0 prints and writes results (the other ranks'
// stdout goes to /dev/null; their errors still reach stderr).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "dualcast/communicator.hpp"
#include "dualcast/data_parallel.hpp"
#include "dualcast/device.hpp"
#include "dualcast/error.hpp"

#ifndef DUALCAST_LAUNCHER
#error "define DUALCAST_LAUNCHER as the path of scripts/launch for the driver that includes this"
#endif

namespace dcexp {

/// With --gpus N > 1 and no launcher around this process: replaces it by scripts/launch --gpus N --
/// <this program> <its arguments> (returns only when that cannot be started, after saying why).
/// Drivers call it at the end of their option parsing, so a bad command line is refused once, here.
inline void relaunch_if_requested(int gpus, int argc, char** argv) {
  if (gpus <= 1 || dualcast::dist::Env::launched()) return;
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  const std::string exe = n > 0 ? std::string(self, static_cast<std::size_t>(n)) : std::string(argv[0]);
  const std::string gpus_text = std::to_string(gpus);
  std::vector<char*> args{const_cast<char*>("python3"), const_cast<char*>(DUALCAST_LAUNCHER),
                          const_cast<char*>("--gpus"), const_cast<char*>(gpus_text.c_str()),
                          const_cast<char*>("--"), const_cast<char*>(exe.c_str())};
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  std::fflush(stdout);
  execvp("python3", args.data());
  std::perror("--gpus: cannot start python3 " DUALCAST_LAUNCHER);
}

/// This process's place in a data-parallel run: the device it trains on and its communicator (a
/// group of one without --gpus).
struct DataParallelRun {
  dualcast::Device device;
  std::unique_ptr<dualcast::dist::Communicator> comm;
  [[nodiscard]] int rank() const { return comm->rank(); }
  [[nodiscard]] int size() const { return comm->size(); }
  [[nodiscard]] bool is_root() const { return comm->rank() == 0; }

  /// Steps of an epoch over n examples in global batches of `batch`: a last partial batch counts
  /// when it splits evenly over the ranks (always, in a group of one).
  [[nodiscard]] std::int64_t steps_per_epoch(std::int64_t n, std::int64_t batch) const {
    const std::int64_t rem = n % batch;
    return n / batch + (rem != 0 && rem % size() == 0 ? 1 : 0);
  }
  /// Where this rank's shard of global batch `step` lies in the epoch's order: rows [first, first +
  /// count) of the `global` rows of that batch.
  struct Rows {
    std::int64_t first, count, global;
  };
  [[nodiscard]] Rows shard_rows(std::int64_t n, std::int64_t batch, std::int64_t step) const {
    const std::int64_t global = std::min(n, (step + 1) * batch) - step * batch;
    const std::int64_t count = global / size();
    return {step * batch + rank() * count, count, global};
  }
  /// A per-rank loss averaged over the ranks (the loss itself in a group of one), on the host.
  [[nodiscard]] double mean_over_ranks(const dualcast::Tensor& loss) const {
    return size() > 1 ? dualcast::dist::all_reduced(*comm, loss).item() : loss.item();
  }
};

/// Joins the group of --gpus `gpus` ranks: the device is cuda:LOCAL_RANK when `requested` is a CUDA
/// device (so every rank names the same --device cuda), the CPU otherwise. Checks that the launcher
/// started `gpus` ranks and that there are that many GPUs. Ranks other than 0 stop printing.
inline DataParallelRun join_group(int gpus, dualcast::Device requested) {
  const dualcast::dist::Env env = dualcast::dist::Env::from_environment();
  DUALCAST_CHECK(env.world_size == gpus, "--gpus ", gpus, ": this process was started as one of ",
                 env.world_size, " ranks (WORLD_SIZE)");
  DataParallelRun run;
  run.device = requested;
  if (requested.is_cuda() && gpus > 1) {
    DUALCAST_CHECK(env.local_rank < dualcast::cuda_device_count(), "--gpus ", gpus, ": rank ", env.rank,
                   " needs cuda:", env.local_rank, " but this machine has ", dualcast::cuda_device_count(),
                   " GPU(s)");
    run.device = dualcast::Device::cuda(env.local_rank);
  }
  run.comm = dualcast::dist::Communicator::create(env, run.device);
  if (env.rank != 0 && std::freopen("/dev/null", "w", stdout) == nullptr)
    std::perror("--gpus: cannot silence a rank's stdout");
  return run;
}

}  // namespace dcexp
