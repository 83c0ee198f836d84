// workloads.hpp: the HM-LSTM experiment's elementwise workloads (a-d), shared by the driver
// (hmlstm_experiment) and the Google Benchmark binary (bench_broadcast).
//
// Header-only part: the functions f as users write them (if-form for mixed mode, select-form for
// pure reverse mode on Vars), the input generators and the byte counts of each partials policy.
// Declared below and defined in workloads.cu: the measurement runners used by the driver.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <functional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dualcast/broadcast.hpp"
#include "dualcast/device.hpp"
#include "dualcast/math.hpp"
#include "dualcast/memory.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "dualcast/tape.hpp"
#include "dualcast/tensor.hpp"

#include "../common/gpu_timing.hpp"
#include "cell.hpp"

namespace hmexp {

using dualcast::Device;
using dualcast::Partials;
using dualcast::Tensor;
using dualcast::Var;

// ==== the functions ===================================================================================

/// Workload a: the 2018 paper's cell update, as a user writes it (data-dependent control flow).
struct CellUpdate {
  DUALCAST_HD auto operator()(auto z, auto zb, auto c, auto f, auto i, auto g) const {
    using dualcast::sigmoid;
    using dualcast::tanh;
    if (z == 1) return sigmoid(i) * tanh(g);       // FLUSH
    if (zb == 0) return c;                         // COPY
    return sigmoid(f) * c + sigmoid(i) * tanh(g);  // UPDATE
  }
};

/// Workload a in select form on Vars: pure reverse mode, one kernel (and one tape node) per
/// primitive; written like the peers' `cell_a` (sig(i)*tanh(g) computed once).
struct CellUpdateSelect {
  Var operator()(const Tensor& z, const Tensor& zb, const Var& c, const Var& f, const Var& i,
                 const Var& g) const {
    using namespace dualcast;
    const Var ig = sigmoid(i) * tanh(g);
    return select(z == 1.0, ig, select(zb == 0.0, c, sigmoid(f) * c + ig));
  }
};

/// Workload b: the full cell, two outputs (c', h') from one kernel (the if-form; cell.hpp).
using Cell = hmlstm::HmCell;

/// Workload b in select form on Vars (the peers' `cell_b`; cell.hpp).
using CellSelect = hmlstm::HmCellSelect;

/// Workload c: prod_k tanh(x_k > 0.5 ? x_k : -x_k) over K arguments (a pack: nvcc 13.0 rejects
/// abbreviated templates with 10 separate auto parameters).
struct ArityProduct {
  DUALCAST_HD auto operator()(auto... x) const {
    auto term = [](auto v) { return dualcast::tanh(v > 0.5 ? v : -v); };
    return (term(x) * ...);
  }
};

/// Workload c in select form on Vars.
inline Var arity_product_select(const std::vector<Var>& x) {
  using namespace dualcast;
  Var p;
  for (const Var& v : x) {
    const Var t = tanh(select(v > 0.5, v, -v));
    p = p.defined() ? p * t : t;
  }
  return p;
}

// ==== bytes each policy must move (values per element times their size; flags negligible) ========

/// K differentiated inputs, M outputs. recompute: forward reads K, writes M; backward reads K
/// inputs + M adjoints, writes K gradients. store: forward also writes M*K partials; backward reads
/// the M*K partials + M adjoints (not the inputs) and writes K gradients.
inline double values_per_element(int K, int M, Partials p) {
  if (p == Partials::store) return K + M + M * K + M * K + M + K;
  return K + M + K + M + K;
}
inline double bytes_moved(std::int64_t n, int K, int M, Partials p, int elem_bytes = 4) {
  return static_cast<double>(n) * values_per_element(K, M, p) * elem_bytes;
}

// ==== inputs ==========================================================================================

enum class FlagLayout {
  rows,     ///< z, zb of shape [dims, 1]: one flag per row, warp-uniform branches
  columns,  ///< z, zb of shape [1, dims]: neighbouring elements take different branches
};
inline const char* flag_layout_name(FlagLayout l) { return l == FlagLayout::rows ? "uniform" : "divergent"; }

/// Paper flags: entries 0, 1, 2 forced to FLUSH (z=1), COPY (z=0, zb=0), UPDATE (z=0, zb=1); the
/// others Bernoulli(0.5). Of dtype `dtype` (the cell's, so that nothing promotes), on `device`.
inline std::pair<Tensor, Tensor> paper_flags(std::int64_t n, FlagLayout layout, Device device,
                                             std::uint64_t seed,
                                             dualcast::DType dtype = dualcast::DType::float32) {
  std::vector<float> z = Tensor::bernoulli({n}, 0.5, Device::cpu(), seed * 2 + 1).to_vector<float>();
  std::vector<float> zb = Tensor::bernoulli({n}, 0.5, Device::cpu(), seed * 2 + 2).to_vector<float>();
  const float forced[3][2] = {{1, 1}, {0, 0}, {0, 1}};
  for (std::int64_t r = 0; r < n && r < 3; ++r) {
    z[static_cast<std::size_t>(r)] = forced[r][0];
    zb[static_cast<std::size_t>(r)] = forced[r][1];
  }
  const dualcast::Shape s = layout == FlagLayout::rows ? dualcast::Shape{n, 1} : dualcast::Shape{1, n};
  return {Tensor::from_vector(s, z, device).to(dtype), Tensor::from_vector(s, zb, device).to(dtype)};
}

/// One input set of a cell workload: flags, K differentiated inputs (Vars), M adjoints.
struct CellSet {
  Tensor z, zb;
  std::vector<Var> x;
  std::vector<Tensor> adj;
  void zero_grad() {
    for (auto& v : x) v.zero_grad();
  }
};

/// K standard-normal [dims, dims] parameters and M adjoints, flags as the paper (seeded by `seed`),
/// all stored as `dtype` (a 16-bit set holds the float32 set's values rounded).
inline CellSet make_cell_set(std::int64_t dims, int K, int M, FlagLayout layout, Device device,
                             std::uint64_t seed, dualcast::DType dtype = dualcast::DType::float32) {
  CellSet s;
  std::tie(s.z, s.zb) = paper_flags(dims, layout, device, seed, dtype);
  for (int k = 0; k < K; ++k)
    s.x.push_back(Var::param(Tensor::randn({dims, dims}, device, seed * 1000 + 10 + static_cast<std::uint64_t>(k), dtype)));
  for (int m = 0; m < M; ++m)
    s.adj.push_back(Tensor::randn({dims, dims}, device, seed * 1000 + 500 + static_cast<std::uint64_t>(m), dtype));
  return s;
}

/// Arity-study inputs: K standard-normal [dims, dims] Vars and an adjoint (no flags).
inline CellSet make_arity_set(std::int64_t dims, int K, Device device, std::uint64_t seed) {
  CellSet s;
  for (int k = 0; k < K; ++k)
    s.x.push_back(Var::param(Tensor::randn({dims, dims}, device, seed * 1000 + 20 + static_cast<std::uint64_t>(k))));
  s.adj.push_back(Tensor::randn({dims, dims}, device, seed * 1000 + 700));
  return s;
}

// ==== one forward + backward =========================================================================

/// The join node of backward_multi: hands each stored adjoint to its input (no kernel).
class JoinNode final : public dualcast::Node {
 public:
  explicit JoinNode(std::vector<Tensor> adjoints) : adj_(std::move(adjoints)) {}
  [[nodiscard]] const char* name() const override { return "join"; }
  void backward(const std::vector<Tensor>& /*grad_outputs*/) override {
    for (std::size_t k = 0; k < inputs.size() && k < adj_.size(); ++k)
      if (inputs[k]) dualcast::detail::accumulate_grad(*inputs[k], adj_[k], /*owned=*/false);
  }
  void release_saved() override { adj_.clear(); }

 private:
  std::vector<Tensor> adj_;
};

/// Backward from several outputs at once with the given adjoints, in one walk over the tape (so a
/// multi-output broadcast node runs once, with both adjoints): a join node whose backward hands each
/// adjoint to its output unchanged. Launches nothing itself.
inline void backward_multi(const std::vector<Var>& outputs, const std::vector<Tensor>& adjoints) {
  const Tensor& v0 = outputs.at(0).value();
  Var root = dualcast::detail::record1(std::make_shared<JoinNode>(adjoints), outputs,
                                       Tensor::empty({}, v0.dtype(), v0.device()));
  root.backward(root.value());  // the join ignores its own adjoint: any 0-d tensor will do
}

// The mixed-mode steps are compiled once, in workload_steps.cu (a, b) and workload_steps_c.cu (c):
// each broadcast call instantiates its forward and backward bodies for float and double, as GPU
// kernels and CPU tiles, which the driver, bench_broadcast and profile_broadcast would otherwise each
// compile again.

/// Mixed mode, workload a, forward only: one broadcast of the if-form (one kernel).
Var forward_a_mixed(const CellSet& s, Partials p);
/// Mixed mode, workload a: forward_a_mixed, then the backward (one kernel).
Var step_a_mixed(const CellSet& s, Partials p);
/// Reverse mode, workload a: the select form on Vars (one kernel per primitive each way).
inline Var step_a_reverse(const CellSet& s) {
  Var out = CellUpdateSelect{}(s.z, s.zb, s.x[0], s.x[1], s.x[2], s.x[3]);
  out.backward(s.adj[0]);
  return out;
}

/// Mixed mode, workload b: both outputs from one broadcast, backward with both adjoints.
std::array<Var, 2> step_b_mixed(const CellSet& s, Partials p);
inline std::array<Var, 2> step_b_reverse(const CellSet& s) {
  auto [c, h] = CellSelect{}(s.z, s.zb, s.x[0], s.x[1], s.x[2], s.x[3], s.x[4], s.x[5]);
  backward_multi({c, h}, s.adj);
  return {c, h};
}

/// Mixed mode, workload c: K = s.x.size() in 1..10.
Var step_c_mixed(const CellSet& s, Partials p);
inline Var step_c_reverse(const CellSet& s) {
  Var out = arity_product_select(s.x);
  out.backward(s.adj[0]);
  return out;
}

// ==== the driver's measurement runners (workloads.cu) ============================================

/// A run-time failure the driver reports with a clear message and a non-zero exit.
struct ExperimentError : std::runtime_error {
  using std::runtime_error::runtime_error;
  int exit_code = 1;
  ExperimentError(const std::string& m, int code) : std::runtime_error(m), exit_code(code) {}
};

struct RunContext {
  Device device = Device::cpu();
  int reps = 5;
  int warmup = 1;
  double copy_gbps = 0;       ///< measured copy bandwidth (bytes read + written per second / 1e9)
  std::size_t cache_bytes = 0;  ///< L2 (GPU) or last-level cache (CPU): decides input rotation
  int max_sets = 16;
  double rtol = 1e-4;         ///< mixed vs reverse (and vs the float64 host reference)
  /// Storage dtype of workloads a, b and d (--precision bf16/fp16: 16-bit tensors; c stays float32).
  dualcast::DType dtype = dualcast::DType::float32;
  bool graphs = true;         ///< a, b: also time the captured step (mixed_graph, reverse_graph)
  std::int64_t graph_max_dims = 1024;  ///< ... at dims up to this
  std::function<void(const std::string&)> progress;  ///< one line per measurement (stderr)
};

/// One timed method on one configuration.
struct Measurement {
  std::string workload;  ///< a, b, c, d, e
  std::string variant;   ///< "", "K=3", "uniform"/"divergent", ...
  std::int64_t dims = 0;
  std::string method;  ///< mixed, mixed_store, reverse, mixed_graph, reverse_graph (peers: eager, jax, ...)
  std::string policy;  ///< recompute / store / "" (reverse)
  double bytes = 0;    ///< bytes this method must move (its own count; 0: not counted)
  double floor_bytes = 0;  ///< the configuration's floor count (recompute mixed mode)
  double floor_ms = 0;
  dcexp::StepTimes times;
  int input_sets = 1;
  int kernels_per_step = 0;  ///< tape nodes run per step (one kernel each way for mixed); graph nodes for *_graph
  bool validated = false;
  double max_rel_err = 0;
  std::int64_t mallocs_during_timing = 0;
  std::string note;
  [[nodiscard]] double median_ms() const { return times.primary().median; }
};

/// Workload a (cell update, K = 4) at dims x dims with row flags: mixed recompute, mixed store,
/// reverse, and (ctx.graphs, dims <= ctx.graph_max_dims) mixed_graph and reverse_graph: the
/// recompute and reverse steps recorded in a Graph per input set and replayed. Validates before
/// timing; throws ExperimentError on a mismatch.
std::vector<Measurement> run_a(const RunContext& ctx, std::int64_t dims);
/// Workload b (full cell, K = 6, two outputs).
std::vector<Measurement> run_b(const RunContext& ctx, std::int64_t dims);
/// Workload c (arity K, 1..10) at dims x dims.
std::vector<Measurement> run_c(const RunContext& ctx, std::int64_t dims, int K);
/// Workload d: workload a with the given flag layout.
std::vector<Measurement> run_d(const RunContext& ctx, std::int64_t dims, FlagLayout layout);

/// Device bytes a configuration needs (for the fit check before allocating), elements of elem_bytes.
double bytes_needed_cell(std::int64_t dims, int K, int M, int sets, int elem_bytes = 4);
/// Input sets rotated for a cell configuration (K inputs + M adjoints of dims x dims, of dtype
/// ctx.dtype).
int sets_for(const RunContext& ctx, std::int64_t dims, int K, int M);
/// Throws ExperimentError (exit code 3) when `need` bytes do not fit in the memory of ctx.device
/// (cudaMemGetInfo plus dualcast's cached blocks; MemAvailable on the CPU), naming `what`.
void check_fits(const RunContext& ctx, double need, const std::string& what);

/// Writes workload a and b arrays at dims x dims (inputs, adjoints, dualcast's mixed-mode
/// gradients) into `dir` in the peers' validation format; returns the manifest entries written
/// (name -> {file, shape, dtype}) as JSON text fragments for the caller to merge.
struct ValArray {
  std::string name;
  std::vector<std::int64_t> shape;
  std::string dtype;  ///< float32 / int32
};
std::vector<ValArray> write_cell_validation(const std::string& dir, std::int64_t dims, Device device);

}  // namespace hmexp
