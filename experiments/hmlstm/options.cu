// options.cu: hmlstm_experiment's command line (driver.hpp): the usage text and the walk over the
// options; a bad one is reported as "hmlstm_experiment: error: ..." with exit status 2.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "../common/cli.hpp"
#include "driver.hpp"

namespace hmdriver {
namespace {

using dcexp::cli::split_csv;

constexpr const char* kUsage = R"(usage: hmlstm_experiment [options]

The HM-LSTM experiment of dualcast: mixed-mode broadcast (one fused kernel of the if-form) against
pure reverse mode (the select form on Vars: one kernel per primitive), validated, then timed.

Workloads (--workloads, comma-separated; default a,b,c,d,e):
  a  the 2018 paper's cell update, K = 4, z/zb [dims,1] row flags, dims x dims
  b  the full cell: c', h' from z, zb, c, h, f, i, o, g (K = 6, two outputs from one kernel)
  c  arity sweep: prod_k tanh(x_k > 0.5 ? x_k : -x_k), K = 1..10, at --arity-dims^2
  d  flags row-uniform [dims,1] vs divergent [1,dims] (workload a), store vs recompute
  e  the 3-layer HM-LSTM character model: one training step (mixed vs reverse), then a short
     character-LM training run in both modes (bits/char curves)
Each of a-d times three methods: mixed (Partials::recompute), mixed_store (Partials::store),
reverse (select form on Vars). a and b (dims up to --graph-max-dims) and e also time the step
recorded once in a dualcast::Graph and replayed: mixed_graph, reverse_graph (validated against the
eager step first).

Options:
  --device auto|cpu|cuda   where to run (default auto: the GPU when one is present)
  --workloads LIST         subset of a,b,c,d,e
  --dims LIST              matrix sizes for a, b, d (default: GPU 512,1024,2048; CPU 256,512)
  --full                   the full GPU sweep: dims 512,1024,2048,4096,8192, network H=512 B=64
                           T=100, 300 training steps
  --arity-dims N           size of workload c (default: GPU 2048, CPU 256)
  --arity LIST             arities of workload c (default 1..10)
  --reps N                 timed repetitions per measurement (default: GPU 100, CPU 5)
  --warmup N               untimed repetitions first (default: GPU 10, CPU 1; at least one pass
                           over every rotated input set)
  --e-hidden H --e-batch B --e-seq T
                           network shape of workload e (default: GPU 512/64/100; CPU 32/8/16)
  --e-reps N               timed training steps (default: GPU 20, CPU 3)
  --train-steps N          steps of the training run (default: GPU 300, CPU 40; 0 skips it); the
                           mixed-mode run is also replayed from a capture and must give the eager
                           run's bits/char curve (to 1e-6)
  --train-seed S           the training run's initial parameters (seed S) and minibatch order
                           (seed 6 + S); default 1, the published curves' (to compare seeds)
  --no-graphs              skip the captured variants (mixed_graph, reverse_graph, captured training)
  --unfused-cell           workload e: the gates as Vars and the cell and boundary detector as two
                           library broadcasts (NetworkConfig::fused_cell = false), to time against
                           the fused layer-step in the same run
  --e-accuracy             workload e: also the accuracy study: the float32 step's loss and gradients
                           at each float32 matmul precision ("highest", "high", "medium") against the
                           float64 step from the same parameters and tokens (results.json "accuracy")
  --graph-max-dims N       largest dims of a and b with captured variants (default 1024)
  --max-sets N             input sets rotated at most (default 16; enough to exceed 2x the cache)
  --precision P            fp32 (default), tf32, bf16 or fp16. bf16/fp16: a, b and d store every
                           tensor in bfloat16/float16 (computing in float; floors count 2 bytes a
                           value); tf32 leaves them float32. e: tf32 runs its products at
                           set_float32_matmul_precision("high"); bf16/fp16 run e under Autocast
                           (products of operands rounded to 16 bits, float32 sums and results;
                           cells, states and gradients float32). c is float32 always. The peers
                           run the same precision in the same run.
  --out DIR                output folder (default results/hmlstm): results.json, results.csv
  --validate-dir DIR       write the peers' validation directory (a_*, b_* at dims 256; e_* by
                           hmlstm::write_validation at H=64 B=8 T=24)
  --peers                  run experiments/peers/peers.py (python3) on the same shapes and add its
                           numbers to the table (validated against --validate-dir, or OUT/validate)
  --peer-methods LIST      peers' methods, each run in its own python process in this order
                           (default eager,jax,compile; torch_dualcast = the cells as dualcast.torch
                           kernels, issue 33; numpy = CPU test double)
  --peer-budget S          seconds the peers may take all together (default: no limit); a
                           measurement that would start later is recorded as skipped, so a run
                           under a hard wall-clock limit keeps what it measured
  --python PATH            interpreter for the peers (default: the first of python3,
                           /usr/bin/python3 that has numpy)
  --help                   this text

Exit status: 0 done; 2 bad usage (or a GPU requested where there is none); 3 a size does not fit in
memory; 4 a validation failed (mixed vs reverse vs float64 reference); 1 any other error.
)";

[[noreturn]] void usage_error(const std::string& msg) {
  std::cerr << "hmlstm_experiment: error: " << msg << "\n(run with --help for the options)\n";
  std::exit(2);
}

long long parse_int(const std::string& opt, const std::string& v, long long lo, long long hi) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0) usage_error(opt + ": not an integer: '" + v + "'");
  if (x < lo || x > hi)
    usage_error(opt + ": " + v + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

}  // namespace

Options parse_args(int argc, char** argv) {
  Options o;
  dcexp::cli::ArgWalker args(argc, argv);
  // The walk throws for a missing or unwanted value; this driver's convention is usage_error (exit 2).
  auto value = [&]() -> std::string {
    try {
      return args.value();
    } catch (const dcexp::cli::UsageError& e) {
      usage_error(e.what());
    }
  };
  auto flag = [&] {
    try {
      args.no_value();
    } catch (const dcexp::cli::UsageError& e) {
      usage_error(e.what());
    }
  };
  while (args.next()) {
    const std::string a = args.option();
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      std::exit(0);
    } else if (a == "--device") {
      o.device = value();
      if (o.device != "auto" && o.device != "cpu" && o.device != "cuda" && o.device != "gpu")
        usage_error("--device: expected auto, cpu or cuda, got '" + o.device + "'");
      if (o.device == "gpu") o.device = "cuda";
    } else if (a == "--precision") {
      o.precision = value();
      if (o.precision != "fp32" && o.precision != "tf32" && o.precision != "bf16" && o.precision != "fp16")
        usage_error("--precision: expected fp32, tf32, bf16 or fp16, got '" + o.precision + "'");
    } else if (a == "--workloads") {
      o.workloads.clear();
      for (const auto& w : split_csv(value())) {
        if (w != "a" && w != "b" && w != "c" && w != "d" && w != "e")
          usage_error("--workloads: unknown workload '" + w + "' (choose from a,b,c,d,e)");
        if (std::find(o.workloads.begin(), o.workloads.end(), w) == o.workloads.end()) o.workloads.push_back(w);
      }
      if (o.workloads.empty()) usage_error("--workloads: empty list");
    } else if (a == "--dims") {
      o.dims.clear();
      for (const auto& d : split_csv(value())) o.dims.push_back(parse_int("--dims", d, 4, 1 << 17));
      if (o.dims.empty()) usage_error("--dims: empty list");
    } else if (a == "--full") {
      flag();
      o.full = true;
    } else if (a == "--arity-dims") {
      o.arity_dims = parse_int(a, value(), 1, 1 << 17);
    } else if (a == "--arity") {
      o.arity.clear();
      for (const auto& k : split_csv(value())) o.arity.push_back(static_cast<int>(parse_int("--arity", k, 1, 10)));
      if (o.arity.empty()) usage_error("--arity: empty list");
    } else if (a == "--reps") {
      o.reps = static_cast<int>(parse_int(a, value(), 1, 1000000));
    } else if (a == "--warmup") {
      o.warmup = static_cast<int>(parse_int(a, value(), 0, 1000000));
    } else if (a == "--e-hidden") {
      o.e_hidden = static_cast<int>(parse_int(a, value(), 1, 1 << 16));
    } else if (a == "--e-batch") {
      o.e_batch = static_cast<int>(parse_int(a, value(), 1, 1 << 16));
    } else if (a == "--e-seq") {
      o.e_seq = static_cast<int>(parse_int(a, value(), 1, 1 << 16));
    } else if (a == "--e-reps") {
      o.e_reps = static_cast<int>(parse_int(a, value(), 1, 100000));
    } else if (a == "--train-steps") {
      o.train_steps = static_cast<int>(parse_int(a, value(), 0, 10000000));
    } else if (a == "--train-seed") {
      o.train_seed = static_cast<int>(parse_int(a, value(), 1, 1000000));
    } else if (a == "--no-graphs") {
      flag();
      o.graphs = false;
    } else if (a == "--unfused-cell") {
      flag();
      o.fused_cell = false;
    } else if (a == "--e-accuracy") {
      flag();
      o.e_accuracy = true;
    } else if (a == "--graph-max-dims") {
      o.graph_max_dims = parse_int(a, value(), 1, 1 << 17);
    } else if (a == "--max-sets") {
      o.max_sets = static_cast<int>(parse_int(a, value(), 1, 1024));
    } else if (a == "--out") {
      o.out = value();
      if (o.out.empty()) usage_error("--out: empty path");
    } else if (a == "--validate-dir") {
      o.validate_dir = value();
      if (o.validate_dir.empty()) usage_error("--validate-dir: empty path");
    } else if (a == "--peers") {
      flag();
      o.peers = true;
    } else if (a == "--peer-methods") {
      o.peer_methods = value();
      const std::set<std::string> known{"eager", "compile", "torch_dualcast", "jax", "jax_remat", "numpy"};
      for (const auto& m : split_csv(o.peer_methods))
        if (!known.count(m))
          usage_error("--peer-methods: unknown method '" + m + "' (eager, compile, torch_dualcast, jax, jax_remat, numpy)");
      if (split_csv(o.peer_methods).empty()) usage_error("--peer-methods: empty list");
    } else if (a == "--peer-budget") {
      const std::string v = value();
      char* end = nullptr;
      o.peer_budget_s = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(o.peer_budget_s > 0) || !std::isfinite(o.peer_budget_s))
        usage_error("--peer-budget: expected a positive number of seconds, got '" + v + "'");
    } else if (a == "--python") {
      o.python = value();
    } else {
      usage_error("unknown option '" + a + "'");
    }
  }
  return o;
}

bool has(const Options& o, const std::string& w) {
  return std::find(o.workloads.begin(), o.workloads.end(), w) != o.workloads.end();
}


}  // namespace hmdriver
