// soak: the soak driver (soak.hpp, README.md beside this file): long training runs of the HM-LSTM and
// the MLP with the allocator's statistics, the resident set and the loss read every few steps; one
// verdict line per run; exit status 1 when any run breaks a property.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "../common/cli.hpp"
#include "dualcast/data.hpp"
#include "dualcast/device.hpp"
#include "dualcast/error.hpp"
#include "soak.hpp"

#ifndef DCEXP_SOURCE_DIR
#define DCEXP_SOURCE_DIR "."
#endif

namespace {

using dcexp::cli::parse_int;
using dcexp::cli::UsageError;
using dualcast::Device;

constexpr const char* kUsage = R"(usage: soak [options]

Long training runs that look for leaks and drift: the 3-layer HM-LSTM character model (random
tokens) and the Fashion-MNIST MLP (784-256-100-10, Adam). Every --every steps a reading of the
caching allocator (dualcast::memory_stats), the process's resident set and the loss. A run passes
when, after the --warmup steps, the cudaMalloc count and the cached bytes stay constant (CUDA), the
bytes in use and their peak stay constant (CUDA and CPU), the resident set grows by at most
--rss-slack-mib, and every loss is finite. One verdict line per run; exit status 0 when all pass,
1 when one fails or cannot run, 2 for a bad command line.

options:
  --runs LIST          comma-separated MODEL:DEVICE runs, MODEL hmlstm or mlp, DEVICE cpu, cuda or
                       cuda:K (default: hmlstm:cuda,mlp:cpu,mlp:cuda where a CUDA device is found,
                       else hmlstm:cpu,mlp:cpu)
  --steps N            training steps of each run (default 10000)
  --every N            a reading every N steps, and after each warm-up step and the last (default 100)
  --warmup N           steps before the memory properties apply (default 2)
  --rss-slack-mib X    allowed growth of the resident set (default 8)
  --no-rss             do not check the resident set
  --seed N             parameters, tokens and shuffling (default 1)
  --hidden N, --batch N, --seq N
                       HM-LSTM size (default 64, 16, 8: the full-size step's code paths in ~5 ms)
  --mode mixed|reverse HM-LSTM cell mode (default mixed)
  --mlp-batch N        MLP minibatch (default 64)
  --data DIR|synthetic MLP data: a directory of Fashion-MNIST IDX files, or uniform random images
                       (default: /usr/share/datasets/fashion-mnist when present, else the source
                       tree's tests/data/mini-fashion-mnist, else synthetic)
  --out DIR            write soak.csv (every reading of every run) and soak.json (each run's
                       settings, verdict and readings) into DIR
  --quiet              no progress lines (the verdicts are always printed)
  --help               this text
)";

struct Options {
  std::vector<std::pair<std::string, std::string>> runs;  // (model, device); empty: the default
  soak::Config base;
  std::string out;
  bool quiet = false;
};

/// -1 for "cpu", K for "cuda" (0) and "cuda:K"; checks the spelling only (the Device is made, and
/// the device looked for, when the run starts).
int device_index(const std::string& s) {
  if (s == "cpu") return -1;
  if (s == "cuda") return 0;
  if (s.rfind("cuda:", 0) == 0) return static_cast<int>(parse_int("--runs", s.substr(5), 0, 63));
  throw UsageError("--runs: unknown device '" + s + "' (expected cpu, cuda or cuda:K)");
}

std::string default_data() {
  namespace fs = std::filesystem;
  if (fs::is_directory(dualcast::data::kFashionMnistDir)) return dualcast::data::kFashionMnistDir;
  const std::string mini = std::string(DCEXP_SOURCE_DIR) + "/tests/data/mini-fashion-mnist";
  if (fs::is_directory(mini)) return mini;
  return "synthetic";
}

Options parse(int argc, char** argv, bool& help) {
  Options o;
  o.base.data.clear();
  dcexp::cli::ArgWalker args(argc, argv);
  while (args.next()) {
    const std::string& a = args.option();
    auto value = [&] { return args.value(); };
    if (a == "--help" || a == "-h") {
      help = true;
    } else if (a == "--runs") {
      std::string list = value();
      std::size_t start = 0;
      while (start <= list.size()) {
        const std::size_t comma = std::min(list.find(',', start), list.size());
        const std::string item = list.substr(start, comma - start);
        const std::size_t colon = item.find(':');
        const std::string model = item.substr(0, colon);
        if (colon == std::string::npos || (model != "hmlstm" && model != "mlp"))
          throw UsageError("--runs: '" + item + "' is not MODEL:DEVICE with MODEL hmlstm or mlp");
        (void)device_index(item.substr(colon + 1));
        o.runs.emplace_back(model, item.substr(colon + 1));
        start = comma + 1;
      }
    } else if (a == "--steps") {
      o.base.steps = static_cast<int>(parse_int(a, value(), 2, 100'000'000));
    } else if (a == "--every") {
      o.base.every = static_cast<int>(parse_int(a, value(), 1, 100'000'000));
    } else if (a == "--warmup") {
      o.base.limits.warmup_steps = static_cast<int>(parse_int(a, value(), 1, 1'000'000));
    } else if (a == "--rss-slack-mib") {
      const std::string v = value();
      double mib = NAN;
      try {
        std::size_t used = 0;
        mib = std::stod(v, &used);
        if (used != v.size()) mib = NAN;
      } catch (const std::exception&) {
      }
      if (!(mib >= 0 && mib < 1e6)) throw UsageError(a + ": '" + v + "' is not a size in MiB >= 0");
      o.base.limits.rss_slack_bytes = static_cast<std::int64_t>(mib * (1 << 20));
    } else if (a == "--no-rss") {
      args.no_value();
      o.base.limits.check_rss = false;
    } else if (a == "--seed") {
      o.base.seed = static_cast<std::uint64_t>(parse_int(a, value(), 0, 1LL << 40));
    } else if (a == "--hidden") {
      o.base.hidden = static_cast<int>(parse_int(a, value(), 1, 8192));
    } else if (a == "--batch") {
      o.base.batch = static_cast<int>(parse_int(a, value(), 1, 65536));
    } else if (a == "--seq") {
      o.base.seq = static_cast<int>(parse_int(a, value(), 1, 100000));
    } else if (a == "--mode") {
      o.base.mode = value();
      if (o.base.mode != "mixed" && o.base.mode != "reverse")
        throw UsageError("--mode: unknown cell mode '" + o.base.mode + "' (expected mixed or reverse)");
    } else if (a == "--mlp-batch") {
      o.base.mlp_batch = parse_int(a, value(), 1, 1'000'000);
    } else if (a == "--data") {
      o.base.data = value();
    } else if (a == "--out") {
      o.out = value();
    } else if (a == "--quiet") {
      args.no_value();
      o.quiet = true;
    } else {
      throw UsageError("unknown option '" + a + "'");
    }
  }
  if (o.base.limits.warmup_steps >= o.base.steps)
    throw UsageError("--warmup: " + std::to_string(o.base.limits.warmup_steps) +
                     " steps leave nothing of a run of " + std::to_string(o.base.steps) + " steps");
  return o;
}

std::string mib(std::int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const int status = dcexp::cli::parse_command_line("soak", kUsage, argc, argv, parse, o); status >= 0)
    return status;
  if (o.runs.empty()) {
    if (dualcast::cuda_available()) {
      o.runs = {{"hmlstm", "cuda"}, {"mlp", "cpu"}, {"mlp", "cuda"}};
    } else {
      std::printf("soak: no CUDA device: CPU runs only\n");
      o.runs = {{"hmlstm", "cpu"}, {"mlp", "cpu"}};
    }
  }
  if (o.base.data.empty()) o.base.data = default_data();

  int status = 0;
  std::vector<std::string> verdicts;
  std::vector<soak::Run> done;
  for (const auto& [model, device] : o.runs) {
    soak::Config c = o.base;
    c.model = model;
    try {
      const int index = device_index(device);
      if (index >= 0 && !dualcast::cuda_available()) DUALCAST_FAIL("no CUDA device is available");
      c.device = index < 0 ? Device::cpu() : Device::cuda(index);
      std::printf("soak %s %s: %d steps, a reading every %d, warm-up %d step(s); %s\n", model.c_str(),
                  c.device.str().c_str(), c.steps, c.every, c.limits.warmup_steps,
                  model == "hmlstm" ? ("H=" + std::to_string(c.hidden) + " B=" + std::to_string(c.batch) +
                                       " T=" + std::to_string(c.seq) + " " + c.mode + " mode, random tokens")
                                          .c_str()
                                    : ("batch " + std::to_string(c.mlp_batch) + ", data " + c.data).c_str());
      std::fflush(stdout);
      const int report_every = std::max(1, c.steps / 10);
      const soak::Run r = soak::run(c, [&](const soak::Sample& s) {
        if (o.quiet || (s.step % report_every != 0 && s.step > c.limits.warmup_steps)) return;
        std::printf("  step %d: loss %.4f (held-out %.4f), %lld %s, %s cached, %s in use, RSS %s, %.1f s\n",
                    s.step, s.loss, s.eval_loss, static_cast<long long>(s.device.device_malloc_calls),
                    c.device.is_cuda() ? "cudaMalloc" : "host allocations", mib(s.device.bytes_held).c_str(),
                    mib(s.device.bytes_in_use).c_str(), mib(s.rss_bytes).c_str(), s.seconds);
        std::fflush(stdout);
      });
      const std::string line = soak::verdict_line(r);
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
      verdicts.push_back(line.substr(0, line.find('\n')));
      if (!r.verdict.ok) status = 1;
      done.push_back(r);
    } catch (const UsageError& e) {
      std::fprintf(stderr, "soak: %s\n", e.what());
      return 2;
    } catch (const std::exception& e) {
      const std::string line = "soak " + model + " " + device + ": ERROR " + e.what();
      std::printf("%s\n", line.c_str());
      verdicts.push_back(line);
      status = 1;
    }
  }
  if (!o.out.empty() && !done.empty()) {
    try {
      std::printf("wrote %s and soak.csv\n", soak::write_records(done, o.out).c_str());
    } catch (const std::exception& e) {
      std::printf("soak: ERROR writing the record: %s\n", e.what());
      status = 1;
    }
  }
  if (verdicts.size() > 1) {
    std::printf("==== soak: %zu runs\n", verdicts.size());
    for (const auto& v : verdicts) std::printf("%s\n", v.c_str());
  }
  return status;
}
