// driver.hpp: what the two halves of resnet_train share: the options, and the benchmark / export
// entry points (bench.cu) called by the command-line front end and training loop (main.cu).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../common/precision.hpp"
#include "dualcast/device.hpp"
#include "model.hpp"

namespace resnet {

struct Options {
  // model and data
  std::int64_t width = 64;
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::int64_t train_subset = 0;  ///< 0: all 60000
  std::int64_t test_subset = 0;   ///< 0: all 10000
  Augment augment;
  Fusion fusion = Fusion::fused;
  bool channels_last = false;  ///< --channels-last: Config::channels_last
  // training
  std::string optimizer = "sgd";
  double lr = 0;  ///< 0: 0.1 (SGD) or 1e-3 (Adam)
  std::string schedule = "onecycle";
  double warmup = 0.2;  ///< onecycle: share of the steps spent rising linearly from lr/10 to lr
  double momentum = 0.9;
  double weight_decay = 5e-4;
  double label_smoothing = 0.0;
  dcexp::Precision precision = dcexp::Precision::fp32;  ///< --precision (experiments/common/precision.hpp)
  int epochs = 10;
  std::int64_t batch = 128;
  std::int64_t eval_batch = 500;
  std::int64_t max_steps = 0;  ///< per epoch; 0: all
  std::uint64_t seed = 0;
  std::string device = "cpu";
  int gpus = 1;  ///< --gpus: data-parallel ranks (experiments/common/distributed.hpp)
  double bucket_mib = 25;  ///< --bucket-mib: DataParallel's bucket size
  std::string out;
  std::string name;
  bool expect_loss_decrease = false;
  bool quiet = false;
  // benchmark and validation
  std::vector<std::int64_t> bench;  ///< batch sizes; non-empty: benchmark mode
  int bench_reps = 30;
  int bench_warmup = 10;
  bool capture = false;
  bool profile_step = false;
  std::string export_dir;  ///< non-empty: export mode
};

/// Times one training step (forward, backward, SGD update) at each batch size of o.bench on random
/// data; prints a table and writes OUT/NAME_bench.json. Returns the exit status.
int run_bench(const Options& o);

/// Writes the model's initial weights, one batch, the loss, the gradients, the running statistics
/// after the step and the weights after one SGD update (.npy files and manifest.json) to
/// o.export_dir, for experiments/resnet/peer_torch.py to check PyTorch against. Returns the status.
int run_export(const Options& o);

}  // namespace resnet
