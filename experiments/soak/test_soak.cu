// test_soak.cu: the soak's judgement on made-up readings (each property caught, at the right step,
// and nothing flagged that the properties allow), and short soaks of both models on every device:
// the shorter version of the 10,000-step soak that runs in the test suite.
//
// Under compute-sanitizer (scripts/gpu-sanitize sets DUALCAST_SANITIZE=1) the short soaks take 12
// steps instead of 200 (every launch is instrumented there) and do not check the resident set, which
// the sanitizer's own bookkeeping in the process makes grow.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "dualcast/error.hpp"
#include "dualcast/gradcheck.hpp"  // running_under_sanitizer
#include "soak.hpp"
#include "test_util.hpp"

using namespace dualcast;

namespace {

/// Readings at steps 1, 2, 10, 20, ..., 100 of a healthy CUDA run.
std::vector<soak::Sample> healthy_readings() {
  std::vector<soak::Sample> v;
  for (int step : {1, 2, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100}) {
    soak::Sample s;
    s.step = step;
    s.loss = 2.0 - step * 0.01;
    s.eval_loss = s.loss + 0.1;
    s.device.device_malloc_calls = step == 1 ? 10 : 14;  // the second step adds the optimizer's share
    s.device.bytes_held = step == 1 ? 4000 : 5000;
    s.device.bytes_in_use = 1000;
    s.device.peak_bytes_in_use = step == 1 ? 3000 : 4000;
    s.device.cache_hits = 100 * step;
    s.host.bytes_in_use = 64;
    s.host.peak_bytes_in_use = 128;
    s.rss_bytes = (100 << 20) + step * 1000;  // 100 KB over the run: inside the slack
    v.push_back(s);
  }
  return v;
}

TEST(SoakJudge, AHealthyRunPassesAndTheWarmUpMayAllocate) {
  const soak::Verdict v = soak::judge(healthy_readings(), 100, true, soak::Limits{});
  EXPECT_TRUE(v.ok);
  EXPECT_TRUE(v.violations.empty()) << v.violations.front();
}

TEST(SoakJudge, ANewCudaMallocAfterTheWarmUpIsNamedWithItsStep) {
  auto r = healthy_readings();
  for (auto& s : r)
    if (s.step >= 50) s.device.device_malloc_calls = 15;
  const soak::Verdict v = soak::judge(r, 100, true, soak::Limits{});
  ASSERT_FALSE(v.ok);
  ASSERT_EQ(v.violations.size(), 1u);
  EXPECT_NE(v.violations[0].find("cudaMalloc calls changed from 14 at step 2 to 15 at step 50"), std::string::npos)
      << v.violations[0];
}

TEST(SoakJudge, GrowingCachedBytesBytesInUseOrPeakAreEachCaught) {
  auto held = healthy_readings(), in_use = healthy_readings(), peak = healthy_readings(), host = healthy_readings();
  held.back().device.bytes_held += 256;
  in_use[5].device.bytes_in_use += 256;
  peak[7].device.peak_bytes_in_use += 256;
  host[9].host.bytes_in_use += 64;
  const std::pair<std::vector<soak::Sample>*, const char*> cases[] = {
      {&held, "cached bytes"}, {&in_use, "bytes in use changed"}, {&peak, "peak bytes in use"},
      {&host, "host bytes in use"}};
  for (const auto& [readings, what] : cases) {
    const soak::Verdict v = soak::judge(*readings, 100, true, soak::Limits{});
    ASSERT_FALSE(v.ok) << what;
    EXPECT_NE(v.violations[0].find(what), std::string::npos) << v.violations[0];
  }
}

TEST(SoakJudge, TheHostBackendAllocatesEveryStepButMustNotKeepMore) {
  auto r = healthy_readings();
  for (auto& s : r) {
    s.device.device_malloc_calls = 1000 * s.step;  // no cache on the host: every Buffer is a malloc
    s.device.bytes_held = s.device.bytes_in_use;
    s.host = s.device;
  }
  EXPECT_TRUE(soak::judge(r, 100, false, soak::Limits{}).ok);
  r.back().device.bytes_in_use += 64;
  EXPECT_FALSE(soak::judge(r, 100, false, soak::Limits{}).ok);
}

TEST(SoakJudge, ResidentSetGrowthBeyondTheSlackFailsFromItsBaseline) {
  auto r = healthy_readings();
  r.back().rss_bytes = r[2].rss_bytes + (9 << 20);  // baseline: the first reading at or after step 5 (steps / 20)
  soak::Limits limits;
  soak::Verdict v = soak::judge(r, 100, true, limits);
  ASSERT_FALSE(v.ok);
  EXPECT_NE(v.violations[0].find("resident set grew by 9.00 MiB from step 10 to step 100"), std::string::npos)
      << v.violations[0];
  limits.rss_slack_bytes = 10 << 20;
  EXPECT_TRUE(soak::judge(r, 100, true, limits).ok);
  limits.rss_slack_bytes = 0;
  limits.check_rss = false;
  EXPECT_TRUE(soak::judge(r, 100, true, limits).ok);
  // Growth during the first 5% of the run (arenas settling) is not counted.
  r = healthy_readings();
  r[0].rss_bytes = r[1].rss_bytes = 1 << 20;
  EXPECT_TRUE(soak::judge(r, 100, true, soak::Limits{}).ok);
}

TEST(SoakJudge, ANonFiniteLossFailsTheRun) {
  for (double bad : {NAN, INFINITY}) {
    auto r = healthy_readings();
    r[4].eval_loss = bad;
    const soak::Verdict v = soak::judge(r, 100, true, soak::Limits{});
    ASSERT_FALSE(v.ok);
    EXPECT_NE(v.violations[0].find("non-finite loss at step 30"), std::string::npos) << v.violations[0];
  }
}

TEST(SoakJudge, ARunWithoutAReadingAfterTheWarmUpFails) {
  auto r = healthy_readings();
  r.resize(1);
  EXPECT_FALSE(soak::judge(r, 100, true, soak::Limits{}).ok);
  EXPECT_FALSE(soak::judge({}, 100, true, soak::Limits{}).ok);
}

TEST(SoakResidentSet, IsReadOnLinux) {
#ifdef __linux__
  EXPECT_GT(soak::resident_bytes(), 1 << 20);
#else
  GTEST_SKIP() << "/proc/self/statm is Linux's";
#endif
}

class ShortSoak : public ::testing::TestWithParam<Device> {
 protected:
  static soak::Config config(const std::string& model, Device d) {
    soak::Config c;
    c.model = model;
    c.device = d;
    const bool sanitizing = running_under_sanitizer();
    c.steps = sanitizing ? 12 : 200;
    c.every = sanitizing ? 4 : 10;
    c.limits.check_rss = !sanitizing;
    c.hidden = 16;
    c.batch = 4;
    c.seq = 5;
    c.mlp_batch = 32;
    c.data = DCEXP_MINI_FASHION_MNIST;
    return c;
  }
  static void expect_stable(const soak::Run& r) {
    EXPECT_TRUE(r.verdict.ok) << soak::verdict_line(r);
    ASSERT_FALSE(r.samples.empty());
    EXPECT_EQ(r.samples.back().step, r.config.steps);
    if (r.config.device.is_cuda())
      EXPECT_GT(r.samples.back().device.cache_hits, 0) << "the steps allocate from the cache";
  }
};

TEST_P(ShortSoak, MlpOnTheMiniDataSetAllocatesNothingNewAfterTheWarmUp) {
  DUALCAST_SKIP_IF_UNAVAILABLE(GetParam());
  const soak::Run r = soak::run(config("mlp", GetParam()));
  expect_stable(r);
  EXPECT_EQ(r.data_used, DCEXP_MINI_FASHION_MNIST);
  EXPECT_LT(r.samples.back().eval_loss, r.samples.front().eval_loss) << "the MLP learns";
}

TEST_P(ShortSoak, SyntheticMlpDataNeedsNoFiles) {
  DUALCAST_SKIP_IF_UNAVAILABLE(GetParam());
  soak::Config c = config("mlp", GetParam());
  c.data = "synthetic";
  c.steps = std::min(c.steps, 20);
  const soak::Run r = soak::run(c);
  expect_stable(r);
  EXPECT_EQ(r.data_used, "synthetic");
}

TEST_P(ShortSoak, HmlstmAllocatesNothingNewAfterTheWarmUpInBothCellModes) {
  DUALCAST_SKIP_IF_UNAVAILABLE(GetParam());
  for (const char* mode : {"mixed", "reverse"}) {
    soak::Config c = config("hmlstm", GetParam());
    c.mode = mode;
    const soak::Run r = soak::run(c);
    expect_stable(r);
    EXPECT_EQ(r.data_used, "random tokens");
    EXPECT_NE(soak::verdict_line(r).find("soak hmlstm " + GetParam().str() + ": PASS"), std::string::npos)
        << soak::verdict_line(r);
  }
}

TEST_P(ShortSoak, BadConfigurationsAreErrors) {
  DUALCAST_SKIP_IF_UNAVAILABLE(GetParam());
  soak::Config c = config("cnn", GetParam());
  EXPECT_THROW(soak::run(c), dualcast::Error);
  c = config("mlp", GetParam());
  c.mlp_batch = 100000;
  EXPECT_THROW(soak::run(c), dualcast::Error);
  c = config("mlp", GetParam());
  c.data = "/nonexistent/fashion-mnist";
  EXPECT_THROW(soak::run(c), dualcast::Error);
  c = config("hmlstm", GetParam());
  c.limits.warmup_steps = c.steps;
  EXPECT_THROW(soak::run(c), dualcast::Error);
}

INSTANTIATE_TEST_SUITE_P(Devices, ShortSoak, ::testing::ValuesIn(dualcast::testing::all_devices()),
                         [](const auto& info) { return std::string(dualcast::testing::device_label(info.param)); });

}  // namespace
