// charlm.hpp: a character-level language model run of the HM-LSTM (network.hpp) on real English
// text: the license texts under /usr/share/common-licenses.
//
// Corpus: every regular file of the directory (symbolic links are skipped: on Debian GPL, LGPL and
// GFDL are links to GPL-3, LGPL-3 and GFDL-1.3, which would otherwise be read twice), concatenated in
// sorted name order, mapped to a 64-symbol vocabulary:
//
//   id  0       any other byte (rare: control characters, non-ASCII, { } | \ ^ ~)
//   id  1       '\n'
//   id  2       ' ' and '\t'
//   ids 3..28   'a'..'z' (upper case folded to lower case)
//   ids 29..38  '0'..'9'
//   ids 39..63  . , ; : ' " ( ) - ! ? / & * % $ # @ [ ] _ < > = +   (the backquote ` maps to ')
//
// '\r' is dropped. The first (1 - valid_fraction) of the encoded text is the training split, the rest
// the validation split. Training minibatches are B windows of T+1 characters at uniformly random
// offsets (counter-based, from the seed: the same batches for every cell mode); the validation set is
// the first valid_batches * kValidationBatch non-overlapping windows (stride T) of the validation
// split, in batches of kValidationBatch, whatever the training batch and the number of ranks.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dualcast/communicator.hpp"
#include "dualcast/data_parallel.hpp"
#include "network.hpp"

namespace hmlstm {

/// Vocabulary size of the mapping above.
inline constexpr int kCharVocab = 64;
/// The id of a byte (see the table above).
int char_to_id(unsigned char c);
/// A printable representative of an id ('?' for id 0).
char id_to_char(int id);
/// Maps text to ids ('\r' dropped).
std::vector<std::uint8_t> encode_text(const std::string& text);

/// The regular files of `dir` concatenated in sorted name order. dualcast::Error when the directory
/// is missing, is not a directory, or holds no non-empty regular file.
std::string load_corpus_text(const std::string& dir);

struct CharCorpus {
  std::vector<std::uint8_t> train, valid;
  std::vector<std::string> files;  ///< the files read, in order
  std::int64_t chars = 0;          ///< encoded length before the split
};
/// load_corpus_text + encode_text + split (valid_fraction in (0, 1)).
CharCorpus load_char_corpus(const std::string& dir, double valid_fraction = 0.1);

// ---- minibatches (shared with the transformer of experiments/transformer) ------------------------

/// Tokens [T+1, B] (float32 ids, CPU): column b is text[offsets[b] .. offsets[b] + T].
Tensor window_batch(const std::vector<std::uint8_t>& text, const std::vector<std::int64_t>& offsets, int T);
/// The window offsets of training minibatch `step`: B uniform offsets in [0, n_train - T - 1], a
/// counter-based function of (seed, step, b), so every model and mode sees the same batches.
std::vector<std::int64_t> train_offsets(std::int64_t n_train, int T, int B, std::uint64_t seed, int step);
/// The validation set: up to max_batches batches [T+1, B]; batch j holds the non-overlapping windows
/// j*B + b (stride T) of `valid`. dualcast::Error when `valid` holds fewer than B windows.
std::vector<Tensor> validation_batches(const std::vector<std::uint8_t>& valid, int T, int B, int max_batches);

/// DataParallel's bucket size for this model: 4 MiB, so that each gate weight matrix ([H, 4H+1] floats,
/// 4.2 MB at H 512) is a bucket. BPTT makes a layer's weight gradients final together, when its
/// weight-gradient product runs at the end of the backward, top layer first; with PyTorch's 25 MiB
/// one bucket would span layers 3, 2 and 1 and wait for layer 1, leaving nothing to overlap.
inline constexpr double kDataParallelBucketMib = 4.0;

/// Windows in one validation batch (the GPU's default training batch): the validation set does not
/// change with the training batch or the number of ranks.
inline constexpr int kValidationBatch = 64;

struct TrainConfig {
  NetworkConfig net;  ///< net.vocab must be 64; net.slope is the starting slope
  int steps = 300;
  int log_every = 25;
  float lr = 2e-3f;  ///< Adam's learning rate (adam = true), else SGD's
  std::string corpus_dir = "/usr/share/common-licenses";
  // ---- extras (defaults are the recommended setting) ----
  bool adam = true;              ///< Adam (dualcast::optim) instead of plain SGD
  float clip_norm = 1.0f;        ///< global gradient-norm clipping threshold (<= 0: off)
  float slope_final = 5.0f;      ///< a is annealed linearly from net.slope to this over the run
  double valid_fraction = 0.1;   ///< tail of the corpus held out for validation
  int valid_batches = 4;         ///< validation batches of kValidationBatch x (T+1) characters
  std::uint64_t data_seed = 7;   ///< minibatch sampling
  /// Record the training step once (dualcast::Graph) and replay it every step, feeding each minibatch
  /// into the step's static input and the slope through the network's device scalar. The same
  /// kernels run in the same order as in the eager run, so the curves are the same.
  bool captured = false;
  /// Data-parallel (a group of more than one rank): net.batch stays the global batch; this rank's
  /// network trains on its batch / size columns of every minibatch (which must divide evenly), the
  /// gradients are averaged over the ranks (dualcast::dist::DataParallel) before clipping, and every
  /// logged loss (training and validation, each on the rank's columns) is the average over the ranks:
  /// the curve of one process on the whole batch, up to summation order.
  dualcast::dist::Communicator* comm = nullptr;
  dualcast::dist::DataParallelOptions ddp_options =
      dualcast::dist::DataParallelOptions::with_bucket_mib(kDataParallelBucketMib);
};

struct TrainLog {
  std::vector<int> step;  ///< updates done when the entry was logged (0 = at initialisation)
  /// Training loss in bits/char: mean over the minibatches of the updates since the previous entry
  /// (entry 0: the first minibatch at the initial parameters).
  std::vector<double> train_bpc;
  std::vector<double> valid_bpc;  ///< validation loss in bits/char at that point
  double seconds = 0.0;           ///< wall time of the whole run (validation included)
  // ---- extras ----
  std::vector<double> slope;      ///< a at that point
  std::vector<double> grad_norm;  ///< mean pre-clipping gradient norm since the previous entry
  double train_seconds = 0.0;     ///< wall time of the training steps only
  double ms_per_step = 0.0;       ///< train_seconds / steps, in milliseconds
  CellMode mode = CellMode::mixed;
  bool captured = false;
};

/// Scales the gradients of `params` in place so that their global L2 norm is at most max_norm;
/// returns the norm before clipping. Parameters without a gradient are ignored. Reads the norms on the
/// host (one synchronisation per parameter).
double clip_grad_norm(std::vector<Var>& params, double max_norm);
/// The same without leaving the device (so it can be captured): returns the norm before clipping as
/// a 0-d tensor; every gradient is multiplied by max_norm / max(norm, max_norm), which is exactly 1
/// when the norm is within the threshold. max_norm <= 0: no clipping (the norm is still computed).
/// train_charlm uses this one, eager and captured alike.
Tensor clip_grad_norm_on_device(std::vector<Var>& params, double max_norm);

/// Trains the model of cfg.net (in cfg.net.mode) on the corpus; progress(step, train_bpc) is called at
/// each log entry. Throws dualcast::Error for a bad corpus directory or a corpus too short for the
/// batch shape, and when the training loss becomes non-finite.
TrainLog train_charlm(const TrainConfig& cfg, std::function<void(int step, double bpc)> progress = {});

/// The same training run in both cell modes (same seed, same batches), compared entry by entry.
///
/// The modes compute the same function but round differently (one fused kernel against one kernel
/// per primitive), and the boundary detector is a step function: once a z~ within rounding of 0.5
/// lands on the other side in one mode, that run takes a different (equally valid) path. So the
/// curves are compared in two phases: they must agree to `tolerance` bits/char up to the first entry
/// where they part (and that must not happen in the first quarter of the entries, nor before the
/// second entry after step 0: a wrong gradient shows up there at once), and from there on stay
/// within `drift_rtol` of each other, relatively.
struct CurveComparison {
  TrainLog mixed, reverse;
  double max_abs_diff_bpc = 0.0;  ///< over every train and valid entry
  double tolerance = 0.0;
  int parted_at_step = -1;        ///< first logged step whose difference exceeds tolerance; -1: never
  double max_rel_diff_after = 0.0;  ///< largest relative difference from parted_at_step on
  double drift_rtol = 0.0;
  bool ok = false;
  std::string message;
};
/// tolerance <= 0 picks the default: 1e-3 bits/char for float32 (measured: the two modes' curves
/// differ by ~4e-8 bits/char after 300 Adam steps at H=128, B=16, T=50, CPU and GPU; at H=512, B=64,
/// T=100 on an H100 they agree to 1e-8 through step 75 and part between steps 75 and 100, after
/// which they stay within 1.4%), 1e-8 for float64. drift_rtol is 3% for float32, 1e-6 for float64.
CurveComparison compare_charlm_modes(const TrainConfig& cfg, double tolerance = 0.0,
                                     std::function<void(int step, double bpc)> progress = {});
/// The comparison itself, on two logs with the same entries (what compare_charlm_modes applies).
/// dtype: the network's, or the autocast dtype of its products (float32_products_tolerance).
CurveComparison compare_curves(TrainLog mixed, TrainLog reverse, DType dtype, double tolerance = 0.0);

/// The same training run (cfg.net.mode) eager and captured (cfg.captured ignored), compared entry by
/// entry: every train and valid bits/char must agree within `tolerance` (default 1e-6; the runs
/// issue the same kernels in the same order, so they are expected to be identical).
struct CaptureCurveComparison {
  TrainLog eager, graph;
  double max_abs_diff_bpc = 0.0;
  bool bitwise = false;  ///< every logged bits/char identical
  double tolerance = 0.0;
  bool ok = false;
  std::string message;
};
CaptureCurveComparison compare_charlm_capture(const TrainConfig& cfg, double tolerance = 0.0,
                                              std::function<void(int step, double bpc)> progress = {});
/// The comparison itself, on the two logs (what compare_charlm_capture applies).
CaptureCurveComparison compare_capture_curves(TrainLog eager, TrainLog graph, double tolerance = 0.0);

}  // namespace hmlstm
