// test_training_memory.cu: memory reuse of a training loop. Trains the runner's MLP (784-256-100-10,
// experiments/mnist/model.hpp) on random data, a few steps per "epoch" plus an evaluation pass, and
// checks that after the first epoch nothing new is obtained from the device: on CUDA the caching
// allocator's cudaMalloc count is the same after epoch 10 and after epoch 30 (the earlier systems'
// executor criterion), and on both devices the bytes in use return to the same level after every
// epoch (no leak: graphs, gradients and batches of one step are all freed). Also: the seeded
// initialisation is identical on the CPU and the GPU, and a few training steps agree.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "../experiments/mnist/model.hpp"
#include "dualcast/memory.hpp"
#include "dualcast/ops/loss.hpp"
#include "dualcast/optim.hpp"
#include "dualcast/random.hpp"
#include "test_util.hpp"

using namespace dualcast;

namespace {

constexpr std::int64_t kExamples = 300;  // not a multiple of the batch: a partial last batch too
constexpr std::int64_t kBatch = 64;
constexpr int kStepsPerEpoch = 5;       // 4 full batches and the partial one

struct RandomData {
  Tensor images, labels;
  RandomData(Device d, std::uint64_t seed) {
    images = Tensor::uniform({kExamples, 784}, d, seed);
    std::vector<float> l(static_cast<std::size_t>(kExamples));
    for (std::size_t i = 0; i < l.size(); ++i)
      l[i] = static_cast<float>(static_cast<int>(random::uniform(seed + 1, i) * 10.0) % 10);
    labels = Tensor::from_vector<float>({kExamples}, l, d);
  }
};

Tensor index_tensor(const std::vector<std::int64_t>& perm, std::int64_t begin, std::int64_t end,
                    Device d) {
  std::vector<float> idx(perm.begin() + begin, perm.begin() + end);
  return Tensor::from_vector<float>({end - begin}, idx, d);
}

/// One "epoch": kStepsPerEpoch shuffled steps and an evaluation forward pass; returns the mean loss.
double run_epoch(const mnist::Model& model, Optimizer& opt, const RandomData& data, int epoch,
                 Device d) {
  const auto perm = mnist::epoch_permutation(kExamples, 7, epoch);
  double total = 0;
  for (int s = 0; s < kStepsPerEpoch; ++s) {
    const std::int64_t begin = s * kBatch, end = std::min(kExamples, begin + kBatch);
    const Tensor idx = index_tensor(perm, begin, end, d);
    const Tensor x = mnist::gather_rows(data.images, idx);
    const Tensor y = mnist::gather_rows(data.labels, idx);
    opt.zero_grad();
    Var loss = cross_entropy(model.forward(Var(x)), y);
    loss.backward();
    opt.step();
    total += loss.item();
  }
  {
    NoGradGuard no_grad;
    const Tensor logits = model.forward(Var(data.images)).value();
    EXPECT_EQ(logits.shape(), (Shape{kExamples, 10}));
  }
  synchronize(d);
  return total / kStepsPerEpoch;
}

class TrainingMemory : public ::testing::TestWithParam<Device> {};

TEST_P(TrainingMemory, NoNewMemoryAfterTheFirstEpoch) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  for (int which = 0; which < 2; ++which) {
    const RandomData data(d, 11);
    const mnist::Model model = mnist::Model::create(mnist::model_widths("mlp"), d, 3);
    std::unique_ptr<Optimizer> opt;
    if (which == 0) opt = std::make_unique<SGD>(model.params(), 0.05, 0.9);
    else opt = std::make_unique<Adam>(model.params(), 1e-3);

    // Under the sanitizer 6 epochs, compared at 3 and 6: the same allocations, a fifth of the launches.
    const int middle = dualcast::testing::unless_sanitizing(10, 3), last = dualcast::testing::unless_sanitizing(30, 6);
    MemoryStats at_middle{}, at_last{};
    std::int64_t in_use_after_epoch = -1;
    for (int epoch = 1; epoch <= last; ++epoch) {
      const double loss = run_epoch(model, *opt, data, epoch, d);
      ASSERT_TRUE(std::isfinite(loss)) << "epoch " << epoch;
      const MemoryStats st = memory_stats(d);
      if (epoch == 1) in_use_after_epoch = st.bytes_in_use;
      // Everything of a step is freed: the same bytes are live after every epoch.
      EXPECT_EQ(st.bytes_in_use, in_use_after_epoch) << "epoch " << epoch << " optimizer " << which;
      if (epoch == middle) at_middle = st;
      if (epoch == last) at_last = st;
    }
    if (d.is_cuda()) {
      EXPECT_EQ(at_last.device_malloc_calls, at_middle.device_malloc_calls)
          << "cudaMalloc calls grew between the middle and the last epoch (optimizer " << which << ")";
      EXPECT_EQ(at_last.bytes_held, at_middle.bytes_held);
      EXPECT_GT(at_last.cache_hits, at_middle.cache_hits);  // the steps did allocate, from the cache
    }
    EXPECT_EQ(at_last.bytes_in_use, at_middle.bytes_in_use);
    EXPECT_EQ(at_last.peak_bytes_in_use, at_middle.peak_bytes_in_use) << "the peak grew after the middle epoch";
  }
}

// The seeded initialisation is the same wherever the model is created, and the same training steps
// give the same losses on the CPU and the device (to float rounding).
TEST_P(TrainingMemory, SameStartAndStepsAsTheCpu) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  const auto widths = mnist::model_widths("mlp");
  const mnist::Model on_cpu = mnist::Model::create(widths, Device::cpu(), 5);
  const mnist::Model on_dev = mnist::Model::create(widths, d, 5);
  const auto pc = on_cpu.params(), pd = on_dev.params();
  ASSERT_EQ(pc.size(), 6u);
  for (std::size_t i = 0; i < pc.size(); ++i) {
    EXPECT_EQ(pd[i].device(), d);
    EXPECT_EQ(pc[i].value().to_vector<float>(), pd[i].value().to_vector<float>()) << "param " << i;
  }
  EXPECT_EQ(on_cpu.num_params(), 784 * 256 + 256 + 256 * 100 + 100 + 100 * 10 + 10);

  const RandomData dc(Device::cpu(), 21), dd(d, 21);
  SGD oc(on_cpu.params(), 0.1, 0.9), od(on_dev.params(), 0.1, 0.9);
  for (int epoch = 1; epoch <= 3; ++epoch) {
    const double lc = run_epoch(on_cpu, oc, dc, epoch, Device::cpu());
    const double ld = run_epoch(on_dev, od, dd, epoch, d);
    EXPECT_NEAR(lc, ld, 1e-4 * (1 + std::abs(lc))) << "epoch " << epoch;
  }
}

TEST(TrainingHelpers, PermutationIsAPermutationAndDependsOnSeedAndEpoch) {
  const auto a = mnist::epoch_permutation(1000, 1, 1);
  std::vector<int> seen(1000, 0);
  for (auto v : a) ++seen.at(static_cast<std::size_t>(v));
  for (int c : seen) EXPECT_EQ(c, 1);
  EXPECT_EQ(a, mnist::epoch_permutation(1000, 1, 1));
  EXPECT_NE(a, mnist::epoch_permutation(1000, 1, 2));
  EXPECT_NE(a, mnist::epoch_permutation(1000, 2, 1));
  EXPECT_THROW(mnist::model_widths("cnn"), Error);
  EXPECT_EQ(mnist::model_widths("logreg"), (std::vector<std::int64_t>{784, 10}));
}

TEST_P(TrainingMemory, GatherRows) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  const Tensor src = Tensor::arange(12, DType::float32, d).view({4, 3});
  const Tensor idx = Tensor::from_vector<float>({3}, {2, 0, 2}, d);
  EXPECT_EQ(mnist::gather_rows(src, idx).to_vector<float>(),
            (std::vector<float>{6, 7, 8, 0, 1, 2, 6, 7, 8}));
  const Tensor labels = Tensor::from_vector<float>({4}, {9, 8, 7, 6}, d);
  EXPECT_EQ(mnist::gather_rows(labels, idx).to_vector<float>(), (std::vector<float>{7, 9, 7}));
}

TEST_P(TrainingMemory, ResetPeakStartsANewPeakFromTheBytesInUse) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  const Tensor kept = Tensor::zeros({1000}, DType::float32, d);
  { const Tensor big = Tensor::zeros({1 << 20}, DType::float32, d); }
  const MemoryStats before = memory_stats(d);
  EXPECT_GE(before.peak_bytes_in_use, before.bytes_in_use + (4 << 20));
  reset_peak_memory_stats(d);
  const MemoryStats after = memory_stats(d);
  EXPECT_EQ(after.peak_bytes_in_use, after.bytes_in_use);
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  EXPECT_EQ(after.device_malloc_calls, before.device_malloc_calls);  // only the peak is touched
  { const Tensor small = Tensor::zeros({100}, DType::float32, d); }
  EXPECT_GT(memory_stats(d).peak_bytes_in_use, after.bytes_in_use);
  EXPECT_LT(memory_stats(d).peak_bytes_in_use, before.peak_bytes_in_use);
}

// A Tensor with static storage duration created before the allocator's first use is destroyed after
// the allocator's own statics would be; its buffer must still go back cleanly at exit. The death-test
// child is a fresh process ("threadsafe" style re-runs this test alone), so the holder below really is
// constructed before the allocator's state. It bites on CUDA devices (the cache's containers were
// destroyed before the Tensor, a use-after-free that aborted bench_broadcast); on the CPU the old
// statics had trivial destructors, so that instance is a guard for ASan builds only.
TEST_P(TrainingMemory, StaticTensorsAreFreedCleanlyAtExit) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  // Skipped under compute-sanitizer (scripts/gpu-sanitize): with --target-processes all, the death
  // test's re-executed child never finished under memcheck or synccheck (killed after 487 s on an
  // H100, 2026-11-24); its parent is the one the tool would check and has no device work of its own.
  // The property is checked by every plain GPU run (scripts/gpu-check) and by ASan on the CPU.
  if (running_under_sanitizer()) GTEST_SKIP() << "death test not run under compute-sanitizer";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  struct Holder {
    Tensor t;
  };
  EXPECT_EXIT(
      {
        static Holder holder;
        holder.t = Tensor::ones({1 << 16}, DType::float32, d);
        std::exit(holder.t.numel() == (1 << 16) ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace

INSTANTIATE_TEST_SUITE_P(Devices, TrainingMemory, ::testing::ValuesIn(dualcast::testing::all_devices()),
                         [](const auto& info) {
                           return std::string(dualcast::testing::device_label(info.param));
                         });
