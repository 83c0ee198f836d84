// soak.hpp: long training runs that look for leaks and drift rather than speed. A run trains the
// HM-LSTM character model (experiments/hmlstm/network.hpp, the training step of charlm.cu) or the
// Fashion-MNIST MLP (experiments/mnist/model.hpp) for many steps and reads, every few steps, the
// caching allocator's counters (dualcast::memory_stats), the process's resident memory
// (/proc/self/statm) and the loss. judge() then holds the run to four properties:
//
//   - after the warm-up steps no new device allocation (cudaMalloc count) and constant cached bytes
//     (bytes_held), on CUDA devices; the host backend has no cache and allocates every step;
//   - the bytes in use and their peak are the same at every reading after the warm-up (no Buffer
//     outlives its step), on the run device and on the host;
//   - no growth of the resident set beyond a slack (host leaks outside the allocator: tape nodes,
//     closures, std containers);
//   - every loss finite.
//
// Warm-up: 2 steps by default. The optimizer's state (Adam's moments, SGD's momentum) is created in
// the first step's update and is live through the whole of the second step, which raises that step's
// peak once; from the third step on every step repeats the second's allocations exactly.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dualcast/device.hpp"
#include "dualcast/memory.hpp"

namespace soak {

/// One reading, taken after `step` training steps and an evaluation pass.
struct Sample {
  int step = 0;
  double loss = 0.0;       ///< mean training loss of the steps since the previous reading
  double eval_loss = 0.0;  ///< loss of a fixed held-out batch at this point (no tape)
  dualcast::MemoryStats device;  ///< memory_stats of the run device
  dualcast::MemoryStats host;    ///< memory_stats of the CPU (the same as `device` on a CPU run)
  std::int64_t rss_bytes = -1;   ///< resident set size of the process; -1 where unknown
  double seconds = 0.0;          ///< wall time since the first step began
};

struct Limits {
  int warmup_steps = 2;  ///< readings before this step are not held to the memory properties
  /// Allowed growth of the resident set from its baseline: the first reading at or after
  /// max(warmup_steps, steps / 20) (the C library's arenas settle during the first steps).
  std::int64_t rss_slack_bytes = std::int64_t{8} << 20;
  bool check_rss = true;
};

struct Verdict {
  bool ok = true;
  std::vector<std::string> violations;  ///< one line each, naming the quantity and the step
};

/// Holds a run's readings (in step order) to the properties above. `steps` is the run's length (for
/// the resident-set baseline); `on_cuda` whether the run device has the caching allocator.
Verdict judge(const std::vector<Sample>& samples, int steps, bool on_cuda, const Limits& limits);

/// Resident set size of this process in bytes (/proc/self/statm); -1 where it cannot be read.
std::int64_t resident_bytes();

struct Config {
  std::string model = "hmlstm";  ///< "hmlstm" or "mlp"
  dualcast::Device device;
  int steps = 10000;
  int every = 100;  ///< a reading every `every` steps (and after each warm-up step and the last)
  Limits limits;
  std::uint64_t seed = 1;
  // ---- HM-LSTM (3 layers, vocabulary 64, Adam lr 2e-3, slope annealed 1 -> 5, mixed mode) ----
  int hidden = 64;
  int batch = 16;
  int seq = 8;
  std::string mode = "mixed";  ///< cell mode: "mixed" or "reverse"
  // ---- MLP (784-256-100-10, Adam lr 1e-3) ----
  std::int64_t mlp_batch = 64;
  /// A directory of Fashion-MNIST IDX files, or "synthetic" (uniform random images and labels).
  std::string data = "synthetic";
};

struct Run {
  Config config;
  std::string data_used;  ///< what was trained on: a directory, "synthetic", or "random tokens"
  std::string device_name;
  std::vector<Sample> samples;
  Verdict verdict;
  double seconds = 0.0;  ///< wall time of the training loop
};

/// Trains config.model on config.device for config.steps steps and judges the readings. Bad
/// configurations and data are a dualcast::Error; `progress` sees every reading as it is taken.
Run run(const Config& config, const std::function<void(const Sample&)>& progress = {});

/// "soak mlp cpu: PASS 10000 steps ...": the one-line verdict of a run.
std::string verdict_line(const Run& run);

/// The record of one or more runs, into `dir` (created if needed): soak.csv, one row per reading
/// (model, device, step, loss, the allocator's counters, the resident set), and soak.json, each run's
/// configuration, verdict and readings. Two files whatever the number of runs (the device tool brings
/// back at most 8). Returns the JSON's path.
std::string write_records(const std::vector<Run>& runs, const std::string& dir);

}  // namespace soak
