// driver.hpp: what the parts of hmlstm_experiment (the HM-LSTM experiment's driver; see
// experiments/README.md) share: the options, the rows of the table and the measurements gathered, the
// machine's numbers, and the functions each part offers the others:
//   main.cu        run(): the device, the defaults, the copy bandwidth, workloads a-d; main()
//   options.cu     the command line
//   workload_e.cu  workload e: the network's training step timed, and the character-LM training
//   peers_run.cu   the validation folder and the PyTorch/JAX peers (experiments/peers/peers.py)
//   results.cu     the table, results.json, results.csv and the summary printed at the end
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dualcast/device.hpp"
#include "dualcast/dtype.hpp"
#include "dualcast/memory.hpp"

#include "../common/gpu_timing.hpp"
#include "../common/json.hpp"
#include "../common/text.hpp"
#include "workloads.hpp"

#ifndef DCEXP_SOURCE_DIR
#define DCEXP_SOURCE_DIR "."
#endif

namespace hmdriver {

using dcexp::fmt;
using dcexp::json;
using dcexp::log_line;
using hmexp::ExperimentError;
using hmexp::Measurement;

struct Options {
  std::string device = "auto";
  std::vector<std::string> workloads{"a", "b", "c", "d", "e"};
  std::vector<std::int64_t> dims;
  bool full = false;
  std::int64_t arity_dims = -1;
  std::vector<int> arity{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  int reps = -1, warmup = -1;
  int e_hidden = -1, e_batch = -1, e_seq = -1, e_reps = -1, train_steps = -1;
  int train_seed = 1;  ///< --train-seed: the training run's parameters (seed S) and minibatches (6 + S)
  int max_sets = 16;
  bool graphs = true;
  bool fused_cell = true;  ///< workload e: NetworkConfig::fused_cell (--unfused-cell: false)
  bool e_accuracy = false; ///< workload e: the precision accuracy study too (--e-accuracy)
  std::int64_t graph_max_dims = 1024;
  std::string out = "results/hmlstm";
  std::string validate_dir;
  bool peers = false;
  // torch.compile last: its per-shape compilation is the slowest part of the peers
  std::string peer_methods = "eager,jax,compile";
  double peer_budget_s = 0;  // 0: no limit
  std::string python;
  std::string precision = "fp32";  ///< fp32, tf32, bf16, fp16 (--precision)
};

/// The storage dtype of workloads a, b and d at a --precision.
inline dualcast::DType cell_dtype(const Options& o) {
  return o.precision == "bf16"   ? dualcast::DType::bfloat16
         : o.precision == "fp16" ? dualcast::DType::float16
                                 : dualcast::DType::float32;
}

/// Options from the command line; a bad one prints its message and exits with status 2 (--help: the
/// usage, status 0).
Options parse_args(int argc, char** argv);

/// Whether workload w (a-e) was selected.
bool has(const Options& o, const std::string& w);

/// mkdir -p; whether `path` is a folder afterwards.
bool make_dirs(const std::string& path);

/// Seconds since the run began, as "12s", for the progress lines.
struct Elapsed {
  double t_start = dcexp::now_ms();
  std::string operator()() const { return fmt("%.0fs", (dcexp::now_ms() - t_start) / 1000); }
};

/// One row of the table: a workload at a size, the median ms of each method.
struct Row {
  std::string workload, variant;
  std::int64_t dims = 0;
  double floor_ms = NAN;
  std::map<std::string, double> ms;  // method -> median ms
};

/// The measurements of the run and the rows of the table.
struct Results {
  std::vector<Measurement> ms;
  std::vector<Row> rows;
  /// The row of (workload, variant, dims), added where there is none.
  Row& row_for(const std::string& w, const std::string& variant, std::int64_t dims) {
    for (auto& r : rows)
      if (r.workload == w && r.variant == variant && r.dims == dims) return r;
    rows.push_back(Row{w, variant, dims, NAN, {}});
    return rows.back();
  }
  /// Records a configuration's measurements (and its table cells); empties `device`'s cache, so the
  /// next configuration's sizes start from a clean one.
  void add(dualcast::Device device, std::vector<Measurement> v) {
    dualcast::empty_cache(device);
    for (auto& m : v) {
      Row& r = row_for(m.workload, m.variant, m.dims);
      if (m.floor_ms > 0) r.floor_ms = m.floor_ms;
      r.ms[m.method] = m.median_ms();
      ms.push_back(std::move(m));
    }
  }
};

/// The machine the run measured on.
struct Machine {
  dualcast::Device device;
  std::string name;
  dcexp::Bandwidth bw;
  std::size_t cache = 0;
};

/// What workload e leaves for the outputs: results.json's "training" and whether it went well.
struct WorkloadE {
  json training = json::object();
  bool training_ok = true;
  std::string variant;  ///< "H=.. B=.. T=..", the rows' variant
  std::string matmul_precision;  ///< what e's float32 products ran at ("" when e did not run)
  json accuracy = json::object();  ///< --e-accuracy: per precision, the step's errors against float64
};
/// Workload e (workload_e.cu): the training step timed in each mode (eager and captured), then the
/// character-LM training in both modes (and replayed from a capture); writes OUT/training.csv.
WorkloadE run_workload_e(const Options& o, dualcast::Device device, Results& res, const Elapsed& elapsed);

/// Writes the validation folder (--validate-dir, or OUT/validate with --peers) for the peers; returns
/// it ("" when none is wanted).
std::string write_validation_dir(const Options& o, dualcast::Device device);

/// What the peers leave for the outputs.
struct Peers {
  std::vector<std::string> cols;  ///< the peer methods with a timed record, in order of appearance
  json raw = json::array();       ///< peers.json as read
  std::string note;               ///< one line: what ran, or why nothing did
};
/// With --peers: peers.py once per method on the run's shapes, its records added to `res`.
Peers run_peers(const Options& o, dualcast::Device device, bool gpu, const std::string& valdir,
                const std::string& e_variant, Results& res, const Elapsed& elapsed);

/// results.json, results.csv and the printed table and summary (results.cu); returns the exit status.
int write_outputs(const Options& o, const Machine& mc, const Results& res, const WorkloadE& e, const Peers& peers,
                  const Elapsed& elapsed);

}  // namespace hmdriver
