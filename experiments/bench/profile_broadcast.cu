// profile_broadcast.cu: one forward+backward of an HM-LSTM workload between cudaProfilerStart and
// cudaProfilerStop, so that Nsight Compute (`ncu --profile-from-start off`) sees exactly the step's
// kernels and nothing of the set-up, the warm-up or the validation. Driven by scripts/ncu-broadcast.
//
//   profile_broadcast --workload a|b|c [--dims N] [--arity K] [--policy recompute|store|reverse]
//
// Workload a: the paper's cell update (K = 4, row flags); b: the full cell (K = 6, two outputs);
// c: the arity product over K = 1..10 arguments. Prints the step's time (CUDA events) on stdout.
#include <cuda_profiler_api.h>

#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>

#include "../common/cli.hpp"
#include "../common/gpu_timing.hpp"
#include "../hmlstm/workloads.hpp"

namespace {

struct Options {
  std::string workload = "a";
  std::int64_t dims = 8192;
  int arity = 4;
  std::string policy = "recompute";
};

void run(const Options& o) {
  using namespace hmexp;
  const Device dev = Device::cuda(0);
  const Partials p = o.policy == "store" ? Partials::store : Partials::recompute;
  const bool reverse = o.policy == "reverse";
  CellSet s = o.workload == "a"   ? make_cell_set(o.dims, 4, 1, FlagLayout::rows, dev, 7)
              : o.workload == "b" ? make_cell_set(o.dims, 6, 2, FlagLayout::rows, dev, 7)
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
      else throw dcexp::cli::UsageError("unknown option " + opt);
    }
    if (o.dims < 8 || o.dims > (1 << 15) || o.arity < 1 || o.arity > 10)
      throw dcexp::cli::UsageError("--dims must be in 8..32768 and --arity in 1..10");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "profile_broadcast: %s\nusage: profile_broadcast --workload a|b|c [--dims N] "
                         "[--arity K] [--policy recompute|store|reverse]\n", e.what());
    return 2;
  }
  if (!dualcast::cuda_available()) {
    std::fprintf(stderr, "profile_broadcast: no CUDA device\n");
    return 2;
  }
  try {
    run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "profile_broadcast: %s\n", e.what());
    return 1;
  }
  return 0;
}
