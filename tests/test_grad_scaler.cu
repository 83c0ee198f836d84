// test_grad_scaler.cu: GradScaler (grad_scaler.hpp): a step with an inf gradient changes nothing and
// halves the scale, growth after growth_interval clean steps, unscaled gradients equal the unscaled
// reference, a scaled clean step equals the plain one, the same inside a captured Graph (every
// device; the CPU replay is the eager code), the call-order errors, and a disabled scaler.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "dualcast/grad_scaler.hpp"
#include "dualcast/graph.hpp"
#include "dualcast/ops/loss.hpp"
#include "dualcast/optim.hpp"
#include "test_util.hpp"

namespace dualcast {
namespace {

const double kInf = std::numeric_limits<double>::infinity();

class Scaler : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override { DUALCAST_SKIP_IF_UNAVAILABLE(GetParam()); }
  [[nodiscard]] Device dev() const { return GetParam(); }
  [[nodiscard]] Tensor vec(const std::vector<double>& v, DType t = DType::float32) const {
    return Tensor::from_vector<double>(Shape{static_cast<std::int64_t>(v.size())}, v, dev()).to(t);
  }
};

template <class Fn>
void expect_error(Fn&& fn, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one containing: " << part;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST_P(Scaler, InfGradientSkipsTheStepBitForBitAndHalvesTheScale) {
  for (const DType t : {DType::float16, DType::float32}) {
    Var p = Var::param(vec({0.5, -1.25, 2.0}, t));
    Adam opt({p}, 0.1);
    GradScaler scaler(dev());
    EXPECT_EQ(scaler.get_scale(), 65536.0);
    const std::vector<double> before = p.value().to_vector<double>();
    p.backward(vec({1.0, kInf, 0.5}, t));
    scaler.step(opt);
    scaler.update();
    EXPECT_EQ(p.value().to_vector<double>(), before) << dtype_name(t);
    EXPECT_EQ(opt.first_moment(0).to_vector<double>(), std::vector<double>(3, 0.0));
    EXPECT_EQ(opt.param_steps(0), 0);  // a skipped step does not count for Adam's bias correction
    EXPECT_TRUE(scaler.last_step_skipped());
    EXPECT_EQ(scaler.get_scale(), 32768.0);
    // The next, clean step goes through.
    p.zero_grad();
    p.backward(vec({32768.0, 32768.0, 32768.0}, t));
    scaler.step(opt);
    scaler.update();
    EXPECT_FALSE(scaler.last_step_skipped());
    EXPECT_NE(p.value().to_vector<double>(), before);
    EXPECT_EQ(opt.param_steps(0), 1);
    EXPECT_EQ(scaler.get_scale(), 32768.0);
  }
}

TEST_P(Scaler, NaNGradientAlsoSkipsSGD) {
  Var p = Var::param(vec({1.0, 2.0}));
  SGD opt({p}, 0.1, 0.9);
  GradScaler scaler(dev(), {.init_scale = 8.0});
  p.backward(vec({std::nan(""), 1.0}));
  scaler.step(opt);
  scaler.update();
  EXPECT_EQ(p.value().to_vector<double>(), (std::vector<double>{1.0, 2.0}));
  EXPECT_EQ(opt.momentum_buffer(0).to_vector<double>(), (std::vector<double>{0.0, 0.0}));
  EXPECT_EQ(scaler.get_scale(), 4.0);
}

TEST_P(Scaler, ScaleGrowsAfterGrowthIntervalCleanSteps) {
  Var p = Var::param(vec({1.0}));
  SGD opt({p}, 0.01);
  GradScaler scaler(dev(), {.init_scale = 4.0, .growth_factor = 2.0, .backoff_factor = 0.5,
                            .growth_interval = 3});
  const auto clean_step = [&] {
    p.zero_grad();
    p.backward(vec({1.0}));
    scaler.step(opt);
    scaler.update();
  };
  clean_step();
  clean_step();
  EXPECT_EQ(scaler.get_scale(), 4.0);
  EXPECT_EQ(scaler.growth_tracker(), 2);
  clean_step();
  EXPECT_EQ(scaler.get_scale(), 8.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  // An overflow resets the count.
  clean_step();
  p.zero_grad();
  p.backward(vec({kInf}));
  scaler.step(opt);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 4.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

// mse's gradient through scale(): the unscaled gradient equals the plain one (the scale is a power
// of two, so scaling and unscaling are exact away from float16's subnormals).
TEST_P(Scaler, UnscaledGradientsEqualTheUnscaledReference) {
  for (const DType t : {DType::float16, DType::float32}) {
    const Tensor p0 = vec({0.5, -1.0, 0.25, 3.0}, t);
    const Tensor target = vec({0.0, 1.0, -0.5, 2.5}, t);
    Var ref = Var::param(p0.clone());
    mse(ref, Var(target)).backward();
    Var p = Var::param(p0.clone());
    SGD opt({p}, 0.1);
    GradScaler scaler(dev(), {.init_scale = 1024.0});
    Var scaled = scaler.scale(mse(p, Var(target)));
    EXPECT_EQ(scaled.dtype(), t);
    EXPECT_EQ(scaled.item(), 1024.0 * mse(p0, target).item());
    scaled.backward();
    EXPECT_EQ(p.grad().to_vector<double>()[1], 1024.0 * ref.grad().to_vector<double>()[1]);
    scaler.unscale_(opt);
    EXPECT_EQ(p.grad().to_vector<double>(), ref.grad().to_vector<double>()) << dtype_name(t);
    // step() after unscale_ does not unscale again: the update is the plain one.
    SGD ref_opt({ref}, 0.1);
    ref_opt.step();
    scaler.step(opt);
    scaler.update();
    EXPECT_EQ(p.value().to_vector<double>(), ref.value().to_vector<double>());
  }
}

// A whole scaled step captured once and replayed: an inf in the data skips the update and halves
// the scale at that replay, clean replays update and count towards growth.
TEST_P(Scaler, CapturedStepSkipsOverflowsAtReplay) {
  const Tensor p0 = vec({0.5, -1.0, 0.25, 3.0});
  Var p = Var::param(p0.clone());
  Adam opt({p}, 0.05);
  GradScaler scaler(dev(), {.init_scale = 256.0, .growth_interval = 2});
  Tensor target_in = Tensor::zeros({4}, DType::float32, dev());
  Graph step;
  step.capture(dev(), [&] {
    opt.zero_grad();
    scaler.scale(mse(p, Var(target_in))).backward();
    scaler.step(opt);
    scaler.update();
  });
  // Eager reference of the same clean steps.
  Var q = Var::param(p0.clone());
  Adam ref_opt({q}, 0.05);
  const Tensor clean = vec({0.0, 1.0, -0.5, 2.5});
  const auto ref_step = [&] {
    ref_opt.zero_grad();
    mse(q, Var(clean)).backward();
    ref_opt.step();
  };
  target_in.copy_(clean);
  step.replay();
  ref_step();
  EXPECT_FALSE(scaler.last_step_skipped());
  target_in.copy_(vec({0.0, kInf, -0.5, 2.5}));
  const std::vector<double> before = p.value().to_vector<double>();
  step.replay();
  EXPECT_TRUE(scaler.last_step_skipped());
  EXPECT_EQ(p.value().to_vector<double>(), before);
  EXPECT_EQ(scaler.get_scale(), 128.0);
  target_in.copy_(clean);
  step.replay();
  step.replay();
  ref_step();
  ref_step();
  EXPECT_EQ(scaler.get_scale(), 256.0);  // two clean steps after the backoff: growth
  EXPECT_EQ(opt.param_steps(0), 3);
  EXPECT_LE(array_error(p.value(), q.value(), ErrorScale::elementwise), kSameResultTolFloat);
}

TEST_P(Scaler, CallOrderAndOptionErrorsNameTheProblem) {
  Var p = Var::param(vec({1.0}));
  SGD opt({p}, 0.1);
  GradScaler scaler(dev());
  expect_error([&] { scaler.update(); }, "no optimizer was unscaled");
  p.backward(vec({1.0}));
  scaler.unscale_(opt);
  expect_error([&] { scaler.unscale_(opt); }, "already called for this optimizer");
  scaler.step(opt);
  expect_error([&] { scaler.step(opt); }, "already called for this optimizer");
  scaler.update();
  expect_error([] { GradScaler s(Device::cpu(), {.growth_factor = 1.0}); }, "growth_factor");
  expect_error([] { GradScaler s(Device::cpu(), {.backoff_factor = 1.0}); }, "backoff_factor");
  expect_error([] { GradScaler s(Device::cpu(), {.init_scale = 0.0}); }, "init_scale");
  expect_error([] { GradScaler s(Device::cpu(), {.growth_interval = 0}); }, "growth_interval");
  expect_error([&] { (void)opt.step_unless(Tensor::zeros({2}, DType::float32, dev())); },
               "one element");
}

TEST_P(Scaler, DisabledScalerIsThePlainStep) {
  Var p = Var::param(vec({1.0, 2.0}));
  SGD opt({p}, 0.5);
  GradScaler scaler(dev(), {.enabled = false});
  Var l = scaler.scale(mse(p, Var(vec({0.0, 0.0}))));
  EXPECT_EQ(l.item(), 2.5);
  l.backward();
  scaler.step(opt);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1.0);
  EXPECT_EQ(p.value().to_vector<double>(), (std::vector<double>{0.5, 1.0}));
}

INSTANTIATE_TEST_SUITE_P(Devices, Scaler, ::testing::ValuesIn(testing::all_devices()),
                         [](const auto& info) { return std::string(testing::device_label(info.param)); });

}  // namespace
}  // namespace dualcast
