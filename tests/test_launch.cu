// test_launch.cu: chained kernel launches (launch.hpp).
//
//  * the switch: set_chained_launches and chained_launches agree; the CPU never chains;
//  * a chained launch really starts early on a GPU that has it: a probe kernel that reads before its
//    chain_wait() sees its predecessor still running (in some of several tries, eager or replayed from
//    a Graph: the overlap is the driver's to grant), and after it always sees the predecessor's write;
//    a plain launch never starts early;
//  * the library's chained kernels see every write of the kernel before them: chains of parallel_for
//    steps that each read other blocks' results of the step before, and of broadcast arithmetic, give
//    the exact expected values, eagerly and replayed from a Graph, chained or not.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "dualcast/dualcast.hpp"
#include "test_util.hpp"

using namespace dualcast;

namespace {

/// Puts the process back on what DUALCAST_CHAINED_LAUNCH says when a test ends.
struct ChainedSetting {
  explicit ChainedSetting(bool on) { set_chained_launches(on); }
  ~ChainedSetting() { detail::reset_chained_launches(); }
};

bool compute_capability_9(Device d) {
#if DUALCAST_WITH_CUDA
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d.index);
  return major >= 9;
#else
  (void)d;
  return false;
#endif
}

#if defined(__CUDACC__)
__device__ std::uint64_t global_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// Lets the next kernel launch (chain_wait), then spins for `ns` and sets *flag.
__global__ void slow_writer(float* flag, std::uint64_t ns) {
  detail::chain_wait();
  const std::uint64_t t0 = global_ns();
  while (global_ns() - t0 < ns) {
  }
  *reinterpret_cast<volatile float*>(flag) = 1.0f;
}

/// Reads *flag before and after its chain_wait(). Reading first breaks the contract on purpose: it
/// shows whether this kernel started while slow_writer was still running.
__global__ void early_reader(const float* flag, float* seen) {
  seen[0] = *reinterpret_cast<const volatile float*>(flag);
  detail::chain_wait();
  seen[1] = *reinterpret_cast<const volatile float*>(flag);
}

/// How often early_reader, launched after slow_writer, saw the flag unset before its chain_wait()
/// (`early`) and set after it (`after`), over `tries` pairs: eagerly or replayed from one Graph.
struct Seen {
  int early = 0, after = 0;
};
Seen probe(Device d, int tries, bool graph) {
  Tensor flag = Tensor::zeros({1}, DType::float32, d);
  Tensor seen = Tensor::zeros({2}, DType::float32, d);
  auto pair = [&] {
    detail::launch_chained(d, slow_writer, dim3(1), dim3(32), 0, static_cast<float*>(flag.raw_data()),
                           std::uint64_t{1'000'000});
    detail::launch_chained(d, early_reader, dim3(1), dim3(1), 0, static_cast<const float*>(flag.raw_data()),
                           static_cast<float*>(seen.raw_data()));
  };
  Graph g;
  if (graph) g.capture(d, pair);
  Seen r;
  for (int i = 0; i < tries; ++i) {
    flag.fill_(0.0);
    seen.fill_(-1.0);
    if (graph) g.replay();
    else pair();
    const std::vector<float> v = seen.to_vector<float>();
    r.early += v[0] == 0.0f;
    r.after += v[1] == 1.0f;
  }
  return r;
}
#endif

constexpr std::int64_t kN = 100'003;  // odd: partial blocks and a grid of many blocks
constexpr std::int64_t kShift = 7'919;
constexpr int kSteps = 300;

/// kSteps steps of y[i] = x[(i + kShift) % n] + 1 (each reads what other blocks wrote one step
/// before), ping-ponging between x and y, then kSteps of x = x + 0.5 as broadcast arithmetic.
void chain(Device d, Tensor& x, Tensor& y) {
  for (int s = 0; s < kSteps; ++s) {
    const float* in = static_cast<const float*>(x.raw_data());
    float* out = static_cast<float*>(y.raw_data());
    parallel_for(d, kN, [=] DUALCAST_HD(std::int64_t i) { out[i] = in[(i + kShift) % kN] + 1.0f; });
    std::swap(x, y);
  }
  const Tensor half = Tensor::full({1}, 0.5, DType::float32, d);
  for (int s = 0; s < kSteps; ++s) x = x + half;
}

/// What chain() leaves in x, from x = arange(n).
std::vector<float> expected_chain() {
  std::vector<float> e(kN);
  for (std::int64_t i = 0; i < kN; ++i)
    e[i] = static_cast<float>((i + kSteps * kShift) % kN) + static_cast<float>(kSteps) + 0.5f * kSteps;
  return e;
}

}  // namespace

TEST(ChainedLaunch, SwitchDecidesOnDevicesThatHaveIt) {
  EXPECT_FALSE(chained_launches(Device::cpu()));
  DUALCAST_REQUIRE_CUDA();
  const Device d = Device::cuda(0);
  {
    ChainedSetting off(false);
    EXPECT_FALSE(chained_launches(d));
  }
  ChainedSetting on(true);
  EXPECT_EQ(chained_launches(d), compute_capability_9(d));
}

#if defined(__CUDACC__)
TEST(ChainedLaunch, ChainedKernelStartsBeforeItsPredecessorEnds) {
  DUALCAST_REQUIRE_CUDA();
  const Device d = Device::cuda(0);
  if (!compute_capability_9(d)) GTEST_SKIP() << "no chained launches before compute capability 9.0";
  constexpr int kTries = 8;
  int early = 0;
  for (bool graph : {false, true}) {
    {
      ChainedSetting on(true);
      const Seen r = probe(d, kTries, graph);
      EXPECT_EQ(r.after, kTries) << "a chained kernel saw its predecessor unfinished after chain_wait()";
      std::printf("chained launches, %s: the reader started before the writer ended in %d of %d pairs\n",
                  graph ? "replayed from a Graph" : "eager", r.early, kTries);
      early += r.early;
    }
    ChainedSetting off(false);
    EXPECT_EQ(probe(d, kTries, graph).early, 0) << "a plain launch started before its predecessor ended";
  }
  // The overlap is the driver's to grant, not guaranteed per launch; never seeing it means the
  // chained launches run as plain ones.
  EXPECT_GT(early, 0) << "no chained kernel ever started before its predecessor ended";
}
#endif

TEST(ChainedLaunch, ChainOnTheCpuGivesTheExpectedValues) {  // checks expected_chain itself
  Tensor x = Tensor::arange(kN, DType::float32, Device::cpu()), y = Tensor::zeros({kN}, DType::float32, Device::cpu());
  chain(Device::cpu(), x, y);
  EXPECT_EQ(x.to_vector<float>(), expected_chain());
}

TEST(ChainedLaunch, ChainedLibraryKernelsSeeThePreviousKernelsWrites) {
  DUALCAST_REQUIRE_CUDA();
  const Device d = Device::cuda(0);
  const std::vector<float> want = expected_chain();
  for (bool on : {true, false}) {
    ChainedSetting setting(on);
    Tensor x = Tensor::arange(kN, DType::float32, d), y = Tensor::zeros({kN}, DType::float32, d);
    chain(d, x, y);
    EXPECT_EQ(x.to_vector<float>(), want) << (on ? "chained" : "plain") << " launches, eager";
  }
}

TEST(ChainedLaunch, ChainedLibraryKernelsSeeThePreviousKernelsWritesInAGraph) {
  DUALCAST_REQUIRE_CUDA();
  const Device d = Device::cuda(0);
  const std::vector<float> want = expected_chain();
  ChainedSetting on(true);
  Tensor x_in = Tensor::zeros({kN}, DType::float32, d), out = Tensor::zeros({kN}, DType::float32, d);
  const Tensor start = Tensor::arange(kN, DType::float32, d);
  Graph g;
  g.capture(d, [&] {
    Tensor x = x_in, y = Tensor::zeros({kN}, DType::float32, d);
    chain(d, x, y);
    out.copy_(x);
  });
  for (int replay = 0; replay < 3; ++replay) {
    x_in.copy_(start);
    out.fill_(-1.0);
    g.replay();
    EXPECT_EQ(out.to_vector<float>(), want) << "replay " << replay;
  }
}
