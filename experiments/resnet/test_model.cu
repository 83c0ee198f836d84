// test_model.cu: the whole ResNet-18 model of model.hpp. Fused equals composed (the same network
// built from channel_broadcast functors and from separate batch_norm / relu / add ops: logits, every
// gradient, running statistics); GPU equal to CPU on the same weights and batch; a warm training step
// allocates no new device memory; evaluation uses the running statistics; the augmented gather is the
// same on every device, and is a shift and mirror of its image.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "dualcast/memory.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "dualcast/optim.hpp"
#include "dualcast/precision.hpp"
#include "model.hpp"
#include "../../tests/nn_reference.hpp"
#include "../../tests/test_util.hpp"

using namespace dualcast;
using dualcast::testing::expect_close;

namespace {

/// Float32 drift allowed between two orders of the same whole-network computation (20 batch norms
/// deep, gradients summed over the batch): measured differences are ~1e-5.
constexpr double kNetworkTol = 1e-3;
/// The same under bf16 Autocast. On the CPU the two orders agree to 1e-9 (measured); on a GPU the
/// per-channel sums run in another order, and a float32 difference that rounds to a neighbouring
/// bf16 value is 2^-8 relative, carried through 20 layers. Measured on an H200 (h200-2026-11-29h):
/// 2.46e-2 of the tensor's rms at worst (a weight gradient element four bf16 steps apart), which
/// 2e-2 refused; a wrong statistic or apply is off by the order of the rms itself.
constexpr double kNetworkBf16Tol = 5e-2;

class ResNet : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override { DUALCAST_SKIP_IF_UNAVAILABLE(GetParam()); }
};

struct Result {
  Tensor logits, loss;
  std::vector<Tensor> grads;
  std::vector<Tensor> buffers;
};

Result step(Device dev, std::int64_t width, std::int64_t batch, resnet::Fusion fusion, std::uint64_t seed = 3,
            bool bf16 = false) {
  resnet::Config cfg;
  cfg.width = width;
  const resnet::Model model = resnet::Model::create(cfg, dev, seed);
  const Tensor x = Tensor::randn({batch, 1, 28, 28}, Device::cpu(), seed + 1).to(dev);
  std::vector<float> labels;
  for (std::int64_t i = 0; i < batch; ++i) labels.push_back(static_cast<float>((i * 7) % 10));
  const Tensor y = Tensor::from_vector<float>({batch}, labels, dev);
  const Var logits = [&] {
    if (!bf16) return model.forward(Var(x), true, fusion);
    const dualcast::Autocast autocast(DType::bfloat16);
    return model.forward(Var(x), true, fusion);
  }();
  const Var loss = resnet::classification_loss(logits, y, 0.1);
  loss.backward();
  Result r{logits.value().to(Device::cpu()), loss.value().to(Device::cpu()), {}, {}};
  for (const Var& p : model.params()) r.grads.push_back(p.grad().to(Device::cpu()));
  for (const auto& [name, t] : model.named_buffers()) r.buffers.push_back(t.to(Device::cpu()));
  return r;
}

void expect_same(const Result& a, const Result& b, double tol, const std::string& what) {
  expect_close(a.logits, b.logits, tol, what + " logits");
  expect_close(a.loss, b.loss, tol, what + " loss");
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (std::size_t k = 0; k < a.grads.size(); ++k)
    dualcast::testing::expect_close_to_scale(a.grads[k].to_vector<double>(), b.grads[k].to_vector<double>(),
                                             tol, what + " gradient " + std::to_string(k));
  for (std::size_t k = 0; k < a.buffers.size(); ++k)
    expect_close(a.buffers[k], b.buffers[k], tol, what + " buffer " + std::to_string(k));
}

TEST_P(ResNet, FusedEqualsComposed) {
  const Device dev = GetParam();
  expect_same(step(dev, 4, 6, resnet::Fusion::fused), step(dev, 4, 6, resnet::Fusion::composed), kNetworkTol,
              "fused vs composed");
}

TEST_P(ResNet, FusedEqualsComposedUnderBf16Autocast) {
  // The same step with 16-bit convolutions: the fused model converts each convolution's result to
  // float32 once for its statistics and its fused apply; the composed one for batch_norm. The two
  // differ only in where 16-bit gradients are rounded.
  const Device dev = GetParam();
  expect_same(step(dev, 4, 6, resnet::Fusion::fused, 3, true), step(dev, 4, 6, resnet::Fusion::composed, 3, true),
              kNetworkBf16Tol, "fused vs composed under bf16 Autocast");
}

TEST_P(ResNet, GpuEqualsCpu) {
  const Device dev = GetParam();
  if (dev.is_cpu()) GTEST_SKIP() << "compares a CUDA device with the CPU";
  expect_same(step(dev, 8, 8, resnet::Fusion::fused), step(Device::cpu(), 8, 8, resnet::Fusion::fused),
              kNetworkTol, "gpu vs cpu");
}

TEST_P(ResNet, NamesFollowPyTorchAndCountTheParameters) {
  resnet::Config cfg;
  cfg.width = 64;
  const resnet::Model m = resnet::Model::create(cfg, Device::cpu(), 0);
  // torchvision-style CIFAR ResNet-18 with one input channel and 10 classes.
  EXPECT_EQ(m.num_params(), 11172810);  // 11,173,962 with three input channels
  const auto names = m.named_params();
  EXPECT_EQ(names.front().first, "conv1.weight");
  EXPECT_EQ(names[3].first, "layer1.0.conv1.weight");
  EXPECT_EQ(names.back().first, "fc.bias");
  EXPECT_EQ(m.named_buffers().size(), 2u * 20u);
}

TEST_P(ResNet, WarmTrainingStepAllocatesNoNewDeviceMemory) {
  const Device dev = GetParam();
  if (dev.is_cpu()) GTEST_SKIP() << "the CPU allocates without a cache";
  resnet::Config cfg;
  cfg.width = 8;
  const resnet::Model model = resnet::Model::create(cfg, dev, 1);
  dualcast::SGD opt(model.params(), 0.05, 0.9, 5e-4);
  const Tensor x = Tensor::randn({16, 1, 28, 28}, dev, 2);
  const Tensor y = Tensor::zeros({16}, DType::float32, dev);
  auto train_step = [&] {
    opt.zero_grad();
    Var loss = resnet::classification_loss(model.forward(Var(x), true), y, 0.0);
    loss.backward();
    opt.step();
    return loss.item();
  };
  for (int i = 0; i < 3; ++i) train_step();
  const auto before = memory_stats(dev);
  for (int i = 0; i < 5; ++i) train_step();
  const auto after = memory_stats(dev);
  EXPECT_EQ(after.device_malloc_calls, before.device_malloc_calls);
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
}

TEST_P(ResNet, EvaluationUsesRunningStatistics) {
  const Device dev = GetParam();
  resnet::Config cfg;
  cfg.width = 4;
  const resnet::Model model = resnet::Model::create(cfg, dev, 5);
  const Tensor x = Tensor::randn({5, 1, 28, 28}, dev, 6);
  NoGradGuard no_grad;
  const auto a = model.forward(Var(x), false).value().to_vector<double>();
  const auto b = model.forward(Var(x), false).value().to_vector<double>();
  EXPECT_EQ(a, b) << "evaluation changed state";
  (void)model.forward(Var(x), true);  // updates the running statistics
  const auto c = model.forward(Var(x), false).value().to_vector<double>();
  EXPECT_NE(a, c) << "training did not move the running statistics";
}

TEST_P(ResNet, AugmentedGatherIsAShiftAndMirrorTheSameOnEveryDevice) {
  const Device dev = GetParam();
  // 3 images of 6x5 with distinct pixels 1..30 (+ 100 * image).
  std::vector<float> img;
  for (int n = 0; n < 3; ++n)
    for (int p = 0; p < 30; ++p) img.push_back(static_cast<float>(100 * n + p + 1));
  const Tensor images = Tensor::from_vector<float>({3, 30}, img, dev);
  const Tensor index = Tensor::from_vector<float>({4}, {2, 0, 1, 2}, dev);
  resnet::Augment aug;
  aug.pad = 2;
  aug.flip = true;
  aug.mean = 0.0f;
  aug.std = 1.0f;
  const Tensor out = resnet::gather_batch(images, index, 6, 5, aug, 9, 4);
  const auto v = out.to_vector<float>();
  const auto cpu = resnet::gather_batch(images.to(Device::cpu()), index.to(Device::cpu()), 6, 5, aug, 9, 4)
                       .to_vector<float>();
  EXPECT_EQ(v, cpu) << "devices draw different augmentations";
  const int rows[] = {2, 0, 1, 2};
  for (int b = 0; b < 4; ++b) {
    bool found = false;
    for (int dy = -2; dy <= 2 && !found; ++dy)
      for (int dx = -2; dx <= 2 && !found; ++dx)
        for (int m = 0; m < 2 && !found; ++m) {
          bool all = true;
          for (int y = 0; y < 6 && all; ++y)
            for (int x = 0; x < 5 && all; ++x) {
              const int sy = y + dy, sx = (m ? 4 - x : x) + dx;
              const float want = (sy >= 0 && sy < 6 && sx >= 0 && sx < 5) ? img[static_cast<std::size_t>(rows[b] * 30 + sy * 5 + sx)] : 0.0f;
              all = v[static_cast<std::size_t>(b * 30 + y * 5 + x)] == want;
            }
          found = all;
        }
    EXPECT_TRUE(found) << "sample " << b << " is no shift or mirror of image " << rows[b];
  }
}

TEST_P(ResNet, AShardGatheredAtItsOffsetIsThatSliceOfTheWholeBatch) {
  // Data-parallel ranks gather their shard of a global batch: each image must get the crop and flip
  // it gets in a one-process run of the whole batch.
  const Device dev = GetParam();
  std::vector<float> img;
  for (int p = 0; p < 4 * 30; ++p) img.push_back(static_cast<float>(p + 1));
  const Tensor images = Tensor::from_vector<float>({4, 30}, img, dev);
  const std::vector<float> rows{3, 1, 0, 2, 1, 3};
  resnet::Augment aug;
  const auto whole = resnet::gather_batch(images, Tensor::from_vector<float>({6}, rows, dev), 6, 5, aug, 9, 4)
                         .to_vector<float>();
  const std::vector<float> tail(rows.begin() + 3, rows.end());
  const auto shard = resnet::gather_batch(images, Tensor::from_vector<float>({3}, tail, dev), 6, 5, aug, 9, 4, 3)
                         .to_vector<float>();
  EXPECT_EQ(shard, std::vector<float>(whole.begin() + 3 * 30, whole.end()));
  const auto unshifted = resnet::gather_batch(images, Tensor::from_vector<float>({3}, tail, dev), 6, 5, aug, 9, 4)
                             .to_vector<float>();
  EXPECT_NE(unshifted, shard) << "the offset changed nothing: the test would not see a missing offset";
}

INSTANTIATE_TEST_SUITE_P(Devices, ResNet, ::testing::ValuesIn(dualcast::testing::all_devices()),
                         [](const ::testing::TestParamInfo<Device>& info) {
                           return std::string(dualcast::testing::device_label(info.param));
                         });

}  // namespace
