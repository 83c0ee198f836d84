// train.hpp: training the character-level transformer (model.hpp) on the license texts with the
// HM-LSTM's data code (experiments/hmlstm/charlm.hpp: the same corpus, vocabulary, split, batch
// sampler and validation windows), timing its training step, and the checks that come before any
// timing: fused attention against composed on the whole model.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/precision.hpp"
#include "model.hpp"

namespace transformer {

struct TrainConfig {
  TransformerConfig model;
  int batch = 64;
  int steps = 1000;
  int log_every = 100;
  double lr = 1e-3;        ///< Adam's peak learning rate
  int warmup = 100;        ///< linear warm-up steps, then cosine decay to lr * min_lr_ratio at `steps`
  double min_lr_ratio = 0.1;
  float clip_norm = 1.0f;  ///< global gradient-norm clipping (<= 0: off)
  std::string corpus_dir = "/usr/share/common-licenses";
  double valid_fraction = 0.1;
  int valid_batches = 4;
  std::uint64_t data_seed = 7;
  /// --precision: train() and time_training_step() run the loss under Autocast for bf16/fp16 (the
  /// matmuls in 16 bits; the bias adds promote their results back to float32, so layer norm,
  /// attention and the loss see float32) and with TF32 matmuls for tf32. Adam keeps float32 weights.
  dcexp::Precision precision = dcexp::Precision::fp32;
};

struct TrainLog {
  std::vector<int> step;              ///< updates done at the entry (0: initial parameters)
  std::vector<double> train_seconds;  ///< training time (steps only, no evaluation) at the entry
  std::vector<double> train_bpc;      ///< mean training loss since the previous entry, bits/char
  std::vector<double> valid_bpc;      ///< validation loss at the entry, bits/char
  double train_seconds_total = 0.0;
  double ms_per_step = 0.0;
  double seconds = 0.0;  ///< wall time of the whole run, evaluation included
  std::int64_t parameters = 0;
};

/// Adam (weight decay 0), warm-up + cosine schedule, gradient clipping; logs every log_every steps.
/// Throws dualcast::Error for a bad corpus or configuration, or a non-finite training loss.
TrainLog train(const TrainConfig& cfg, const std::function<void(int step, double train_bpc)>& progress = {});

struct StepTiming {
  double ms_median = 0.0, ms_p10 = 0.0, ms_p90 = 0.0;  ///< CUDA events on the GPU, host clock on the CPU
  double wall_ms_median = 0.0;
  double pipelined_ms = 0.0;
  int reps = 0;
  double loss = 0.0;  ///< loss at the initial parameters on the first batch (nats)
};
/// Times one training step (forward, backward, Adam update; no gradient clipping) of cfg.model at
/// batch cfg.batch and T = cfg.model.context, on corpus batches rotating over 3 sets.
StepTiming time_training_step(const TrainConfig& cfg, int warmup, int reps);

struct ImplComparison {
  double loss_fused = 0.0, loss_composed = 0.0;
  double max_grad_rel_err = 0.0;  ///< max over parameters of max|g_f - g_c| / max|g_c|
  std::string worst_param;
  bool ok = false;
  std::string message;
};
/// The model with fused attention against the same model with composed attention (same parameters,
/// same batch): loss and every parameter gradient (tolerance 1e-4 in float32, 1e-10 in float64).
ImplComparison compare_attention_impls(const TrainConfig& cfg);

/// Writes the PyTorch peer's validation data into `dir` (created if needed; raw little-endian
/// arrays and manifest.json, the experiments/peers format): every parameter (float32, by name),
/// tokens [T+1, B] (int32), the loss and every gradient of the float32 model at those values, and
/// the configuration as scalars.
void write_validation(const std::string& dir, const TrainConfig& cfg);

}  // namespace transformer
