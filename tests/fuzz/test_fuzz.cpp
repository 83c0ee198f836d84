// test_fuzz.cpp: the differential fuzzer as a seeded, time-bounded GoogleTest. Runs random cases of
// every category (harness.hpp) on the CPU and, where one is found, on the GPU, until the time is up;
// prints the cases run per category, every failing case with its seed, and a summary line.
//
// Environment:
//   DUALCAST_FUZZ_SECONDS  time budget (default 120)
//   DUALCAST_FUZZ_SEED     master seed (default below); case i runs with seed case_seed(master, i)
//   DUALCAST_FUZZ_CASES    stop after this many cases (default: none)
//   DUALCAST_FUZZ_REPLAY   a case seed printed by a failure: runs that case alone and describes it
//   DUALCAST_FUZZ_STRICT   1: known issues (README.md) fail too
//   DUALCAST_FUZZ_VERBOSE  1: print every case before running it
#include <gtest/gtest.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "dualcast/device.hpp"
#include "harness.hpp"

namespace {

using namespace fuzz;

constexpr std::uint64_t kDefaultSeed = 0x6475616c63617374ULL;  // "dualcast"
constexpr double kDefaultSeconds = 120.0;
constexpr int kMaxFailuresPrinted = 20;

std::uint64_t env_u64(const char* name, std::uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 0) : fallback;
}
double env_double(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtod(v, nullptr) : fallback;
}

Options default_options() {
  Options opt;
  opt.devices = {dualcast::Device::cpu()};
  if (dualcast::cuda_available()) opt.devices.push_back(dualcast::Device::cuda(0));
  opt.strict = env_u64("DUALCAST_FUZZ_STRICT", 0) != 0;
  return opt;
}

void print_report(std::uint64_t seed, const Report& rep) {
  std::printf("FAILED case 0x%016" PRIx64 " [%s] %s\n", seed, category_name(rep.category), rep.what.c_str());
  for (const auto& f : rep.failures) std::printf("    %s\n", f.c_str());
  std::printf("    replay: DUALCAST_FUZZ_REPLAY=0x%016" PRIx64 " %s\n", seed,
              "test_fuzz --gtest_filter='Fuzz.*'");
}

}  // namespace

TEST(Fuzz, EveryOpAgreesWithTheDoubleReferenceAndAcrossDevices) {
  const Options opt = default_options();
  const std::uint64_t replay = env_u64("DUALCAST_FUZZ_REPLAY", 0);
  if (replay != 0) {
    Rng rng(replay);
    const Report rep = run_case(rng, opt);
    std::printf("case 0x%016" PRIx64 " [%s] %s\n", replay, category_name(rep.category), rep.what.c_str());
    for (const auto& k : rep.known) std::printf("    known issue: %s\n", k.c_str());
    if (!rep.failures.empty()) print_report(replay, rep);
    EXPECT_TRUE(rep.failures.empty());
    return;
  }
  const std::uint64_t master = env_u64("DUALCAST_FUZZ_SEED", kDefaultSeed);
  const double seconds = env_double("DUALCAST_FUZZ_SECONDS", kDefaultSeconds);
  const std::uint64_t max_cases = env_u64("DUALCAST_FUZZ_CASES", 0);
  const bool verbose = env_u64("DUALCAST_FUZZ_VERBOSE", 0) != 0;
  std::printf("fuzz: master seed 0x%016" PRIx64 ", %.0f s, devices:", master, seconds);
  for (const auto d : opt.devices) std::printf(" %s", dev_label(d));
  std::printf("%s\n", opt.strict ? " (strict)" : "");

  std::int64_t cases[kCategoryCount] = {}, failed[kCategoryCount] = {};
  std::int64_t compared = 0, failures = 0;
  std::map<std::string, std::int64_t> known;
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  std::uint64_t i = 0;
  for (; elapsed() < seconds && (max_cases == 0 || i < max_cases); ++i) {
    const std::uint64_t seed = case_seed(master, i);
    if (verbose) {
      std::printf("case %" PRIu64 " 0x%016" PRIx64 "\n", i, seed);
      std::fflush(stdout);
    }
    Rng rng(seed);
    const Report rep = run_case(rng, opt);
    if (verbose) std::printf("    [%s] %s\n", category_name(rep.category), rep.what.c_str());
    const int c = static_cast<int>(rep.category);
    ++cases[c];
    compared += rep.compared;
    for (const auto& k : rep.known) ++known[k];
    if (rep.failures.empty()) continue;
    ++failed[c];
    if (failures++ < kMaxFailuresPrinted) print_report(seed, rep);
  }
  std::printf("fuzz: cases per category:");
  for (int c = 0; c < kCategoryCount; ++c)
    std::printf(" %s %" PRId64 " (%" PRId64 " failed)", category_name(static_cast<Category>(c)), cases[c], failed[c]);
  std::printf("\n");
  for (const auto& [id, count] : known)
    std::printf("fuzz: known issue %s met in %" PRId64 " cases (DUALCAST_FUZZ_STRICT=1 fails them)\n", id.c_str(), count);
  std::printf("fuzz: SUMMARY %" PRIu64 " cases in %.1f s, %" PRId64 " numbers compared, %" PRId64
              " failing cases, seed 0x%016" PRIx64 "\n",
              i, elapsed(), compared, failures, master);
  EXPECT_EQ(failures, 0) << "replay a failing case with DUALCAST_FUZZ_REPLAY=<its seed> (printed above)";
}
