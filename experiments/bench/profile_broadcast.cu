// profile_broadcast.cu: one forward+backward of an HM-LSTM workload between cudaProfilerStart and
// cudaProfilerStop, so that Nsight Compute (`ncu --profile-from-start off`) sees exactly the step's
// kernels and nothing of the set-up, the warm-up or the validation. Driven by scripts/ncu-broadcast.
//
//   profile_broadcast --workload a|b|c [--dims N] [--arity K] [--policy recompute|store|reverse]
//                     [--dtype float32|bfloat16|float16]
//   profile_broadcast --host-timing N [--dims D]
//
// Workload a: the paper's cell update (K = 4, row flags); b: the full cell (K = 6, two outputs);
// c: the arity product over K = 1..10 arguments. --dtype stores a and b in a 16-bit type (as
// hmlstm_experiment --precision bf16/fp16; c is float32 always). Prints the step's time (CUDA events).
//
// --host-timing N (issue 10, item 2): where the host's time goes in N steps of workload a (mixed,
// recompute), each phase timed on the host with the GPU idle at its start (the step is synchronised
// after it, outside the timers): zero_grad, the forward broadcast call, the backward call; and, for
// scale, an empty kernel launched with an 8-byte and with a 1 KiB argument (a broadcast body is about
// 1 KiB) and a cudaEventRecord. Medians and 90th percentiles in microseconds.
#include <cuda_profiler_api.h>

#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

#include "../common/cli.hpp"
#include "../common/gpu_timing.hpp"
#include "../hmlstm/workloads.hpp"

namespace {

struct Options {
  std::string workload = "a";
  std::int64_t dims = 8192;
  int arity = 4;
  std::string policy = "recompute";
  std::string dtype = "float32";
  int host_timing = 0;  ///< > 0: the host-timing mode with this many steps
};

struct Blob {
  unsigned char bytes[1024];
};
__global__ void empty_kernel_small(int) {}
__global__ void empty_kernel_blob(Blob) {}

/// "median p90" of the samples, microseconds.
void print_phase(const char* name, const std::vector<double>& us) {
  const dcexp::Summary s = dcexp::summarize(us);
  std::printf("  %-34s median %7.2f us   p90 %7.2f us\n", name, s.median, s.p90);
}

void run_host_timing(const Options& o) {
  using namespace hmexp;
  const Device dev = Device::cuda(0);
  const cudaStream_t st = dualcast::detail::stream(dev);
  CellSet s = make_cell_set(o.dims, 4, 1, FlagLayout::rows, dev, 7);
  const int n = o.host_timing;
  std::vector<double> zero(n), fwd(n), bwd(n), whole(n), launch_small(n), launch_blob(n), event(n);
  for (int i = -3; i < n; ++i) {  // three warm-up steps
    double t0 = dcexp::now_ms();
    s.zero_grad();
    double t1 = dcexp::now_ms();
    Var out = forward_a_mixed(s, Partials::recompute);
    double t2 = dcexp::now_ms();
    out.backward(s.adj[0]);
    double t3 = dcexp::now_ms();
    dualcast::synchronize(dev);
    if (i < 0) continue;
    const auto k = static_cast<std::size_t>(i);
    zero[k] = (t1 - t0) * 1e3;
    fwd[k] = (t2 - t1) * 1e3;
    bwd[k] = (t3 - t2) * 1e3;
    whole[k] = (t3 - t0) * 1e3;
  }
  const Blob blob{};
  dcexp::EventPair ev;
  for (int i = -3; i < n; ++i) {
    double t0 = dcexp::now_ms();
    empty_kernel_small<<<1, 32, 0, st>>>(i);
    double t1 = dcexp::now_ms();
    empty_kernel_blob<<<1, 32, 0, st>>>(blob);
    double t2 = dcexp::now_ms();
    DCEXP_CUDA(cudaEventRecord(ev.start, st));
    double t3 = dcexp::now_ms();
    DCEXP_CUDA(cudaStreamSynchronize(st));
    if (i < 0) continue;
    const auto k = static_cast<std::size_t>(i);
    launch_small[k] = (t1 - t0) * 1e3;
    launch_blob[k] = (t2 - t1) * 1e3;
    event[k] = (t3 - t2) * 1e3;
  }
  DCEXP_CUDA(cudaGetLastError());
  std::printf("profile_broadcast --host-timing: workload a (mixed, recompute), dims %lld, %d steps, host time per phase:\n",
              static_cast<long long>(o.dims), n);
  print_phase("zero_grad (4 gradients freed)", zero);
  print_phase("forward: broadcast(...)", fwd);
  print_phase("backward: out.backward(adjoint)", bwd);
  print_phase("the whole step", whole);
  print_phase("empty kernel launch, 8 B argument", launch_small);
  print_phase("empty kernel launch, 1 KiB argument", launch_blob);
  print_phase("cudaEventRecord", event);
}

void run(const Options& o) {
  using namespace hmexp;
  const Device dev = Device::cuda(0);
  const Partials p = o.policy == "store" ? Partials::store : Partials::recompute;
  const bool reverse = o.policy == "reverse";
  const dualcast::DType dt = o.dtype == "bfloat16"  ? dualcast::DType::bfloat16
                            : o.dtype == "float16" ? dualcast::DType::float16
                                                   : dualcast::DType::float32;
  CellSet s = o.workload == "a"   ? make_cell_set(o.dims, 4, 1, FlagLayout::rows, dev, 7, dt)
              : o.workload == "b" ? make_cell_set(o.dims, 6, 2, FlagLayout::rows, dev, 7, dt)
                                  : make_arity_set(o.dims, o.arity, dev, 7);
  auto step = [&] {
    s.zero_grad();
    if (o.workload == "a") (void)(reverse ? step_a_reverse(s) : step_a_mixed(s, p));
    else if (o.workload == "b") (void)(reverse ? step_b_reverse(s) : step_b_mixed(s, p));
    else (void)(reverse ? step_c_reverse(s) : step_c_mixed(s, p));
  };
  for (int w = 0; w < 3; ++w) step();  // warm-up: module load, allocator cache, occupancy queries
  dualcast::synchronize(dev);
  dcexp::EventPair ev;
  DCEXP_CUDA(cudaProfilerStart());
  DCEXP_CUDA(cudaEventRecord(ev.start, dualcast::detail::stream(dev)));
  step();
  DCEXP_CUDA(cudaEventRecord(ev.stop, dualcast::detail::stream(dev)));
  DCEXP_CUDA(cudaProfilerStop());
  std::printf("profile_broadcast: workload %s dims %lld arity %d policy %s: %.1f us\n",
              o.workload.c_str(), static_cast<long long>(o.dims), o.arity, o.policy.c_str(),
              ev.elapsed_ms() * 1e3);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    dcexp::cli::ArgWalker args(argc, argv);
    bool args_seen_host_timing = false;
    auto one_of = [](const std::string& opt, const std::string& v, std::initializer_list<const char*> ok) {
      for (const char* c : ok)
        if (v == c) return v;
      throw dcexp::cli::UsageError(opt + ": unexpected value '" + v + "'");
    };
    while (args.next()) {
      const std::string& opt = args.option();
      if (opt == "--workload") o.workload = one_of(opt, args.value(), {"a", "b", "c"});
      else if (opt == "--dims") o.dims = std::stoll(args.value());
      else if (opt == "--arity") o.arity = std::stoi(args.value());
      else if (opt == "--policy") o.policy = one_of(opt, args.value(), {"recompute", "store", "reverse"});
      else if (opt == "--dtype") o.dtype = one_of(opt, args.value(), {"float32", "bfloat16", "float16"});
      else if (opt == "--host-timing") {
        o.host_timing = std::stoi(args.value());
        args_seen_host_timing = true;
      }
      else throw dcexp::cli::UsageError("unknown option " + opt);
    }
    if (o.dims < 8 || o.dims > (1 << 15) || o.arity < 1 || o.arity > 10)
      throw dcexp::cli::UsageError("--dims must be in 8..32768 and --arity in 1..10");
    if (args_seen_host_timing && (o.host_timing < 1 || o.host_timing > 1000000))
      throw dcexp::cli::UsageError("--host-timing takes a step count in 1..1000000");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "profile_broadcast: %s\nusage: profile_broadcast --workload a|b|c [--dims N] "
                         "[--arity K] [--policy recompute|store|reverse] [--dtype float32|bfloat16|float16]\n       profile_broadcast --host-timing N [--dims D]\n", e.what());
    return 2;
  }
  if (!dualcast::cuda_available()) {
    std::fprintf(stderr, "profile_broadcast: no CUDA device\n");
    return 2;
  }
  try {
    if (o.host_timing > 0) run_host_timing(o);
    else run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "profile_broadcast: %s\n", e.what());
    return 1;
  }
  return 0;
}
