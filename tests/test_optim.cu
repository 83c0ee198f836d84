// test_optim.cu: SGD and Adam. One step and a few steps of each against hand computations (float32
// and float64), in-place updates visible through every handle, skipping parameters without a
// gradient, argument checks (NaN or non-positive learning rate and the rest), no allocation inside
// step(), a few hundred steps minimising an ill-conditioned quadratic, and CPU == GPU. Gradients are
// given directly with Var::backward(grad) on each leaf, so these tests need no other op.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "dualcast/memory.hpp"
#include "dualcast/optim.hpp"
#include "dualcast/random.hpp"
#include "test_util.hpp"

using namespace dualcast;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

Var param(const std::vector<double>& v, Device d = Device::cpu(), DType t = DType::float32) {
  Tensor x = Tensor::from_vector<double>(Shape{static_cast<std::int64_t>(v.size())}, v, d);
  return Var::param(x.to(t));
}

void set_grad(Var& p, const std::vector<double>& g) {
  p.zero_grad();
  Tensor t = Tensor::from_vector<double>(p.shape(), g, p.device()).to(p.dtype());
  p.backward(t);
}

template <class Fn>
void expect_error(Fn&& fn, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "no dualcast::Error (expected one mentioning '" << part << "')";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

// Double-precision references of the update rules, element by element.
struct SgdRef {
  double lr, momentum, wd;
  std::vector<double> buf;
  void step(std::vector<double>& p, const std::vector<double>& g) {
    if (buf.empty()) buf.assign(p.size(), 0.0);
    for (std::size_t i = 0; i < p.size(); ++i) {
      double d = g[i] + wd * p[i];
      if (momentum > 0) {
        buf[i] = momentum * buf[i] + d;
        d = buf[i];
      }
      p[i] -= lr * d;
    }
  }
};

struct AdamRef {
  double lr, b1, b2, eps, wd;
  std::vector<double> m, v;
  int t = 0;
  void step(std::vector<double>& p, const std::vector<double>& g) {
    if (m.empty()) m.assign(p.size(), 0.0), v.assign(p.size(), 0.0);
    ++t;
    for (std::size_t i = 0; i < p.size(); ++i) {
      const double d = g[i] + wd * p[i];
      m[i] = b1 * m[i] + (1 - b1) * d;
      v[i] = b2 * v[i] + (1 - b2) * d * d;
      const double mh = m[i] / (1 - std::pow(b1, t)), vh = v[i] / (1 - std::pow(b2, t));
      p[i] -= lr * mh / (std::sqrt(vh) + eps);
    }
  }
};

/// Deterministic pseudo-gradient of step s, element i (in [-2, 2]).
double fake_grad(int s, std::size_t i) {
  return 4.0 * random::uniform(1234u + static_cast<std::uint64_t>(s), i) - 2.0;
}

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << "element " << i;
}

}  // namespace

// ---- hand computations ----------------------------------------------------------------------------

TEST(Sgd, OneStepByHand) {
  for (DType t : {DType::float32, DType::float64}) {
    Var p = param({1.0, -2.0, 3.0}, Device::cpu(), t);
    const Tensor handle = p.value();  // shares storage: sees the update
    SGD opt({p}, 0.1);
    set_grad(p, {0.5, 0.25, -1.0});
    opt.step();
    const std::vector<double> want{1.0 - 0.05, -2.0 - 0.025, 3.0 + 0.1};
    expect_near_all(handle.to_vector<double>(), want, 1e-7);
    expect_near_all(p.value().to_vector<double>(), want, 1e-7);
    EXPECT_TRUE(p.value().shares_storage(handle));
    EXPECT_EQ(opt.steps(), 1);
  }
}

TEST(Sgd, MomentumAndWeightDecayTwoStepsByHand) {
  // lr 0.5, momentum 0.9, wd 0.1; p0 = 2, g1 = 1, g2 = -3.
  //   d1 = 1 + 0.2 = 1.2; buf1 = 1.2; p1 = 2 - 0.6 = 1.4
  //   d2 = -3 + 0.14 = -2.86; buf2 = 0.9 * 1.2 - 2.86 = -1.78; p2 = 1.4 + 0.89 = 2.29
  Var p = param({2.0}, Device::cpu(), DType::float64);
  SGD opt({p}, 0.5, 0.9, 0.1);
  set_grad(p, {1.0});
  opt.step();
  EXPECT_NEAR(p.item(), 1.4, 1e-12);
  EXPECT_NEAR(opt.momentum_buffer(0).item(), 1.2, 1e-12);
  set_grad(p, {-3.0});
  opt.step();
  EXPECT_NEAR(opt.momentum_buffer(0).item(), -1.78, 1e-12);
  EXPECT_NEAR(p.item(), 2.29, 1e-12);
}

TEST(Adam, OneStepByHand) {
  // After one step m̂ = g and v̂ = g², so p moves by lr * g / (|g| + eps): lr * sign(g) to 1e-8.
  for (DType t : {DType::float32, DType::float64}) {
    Var p = param({1.0, -2.0, 0.5}, Device::cpu(), t);
    Adam opt({p}, 0.01, 0.9, 0.999, 1e-8);
    set_grad(p, {3.0, -0.5, 0.0});
    opt.step();
    expect_near_all(p.value().to_vector<double>(), {0.99, -1.99, 0.5}, 1e-6);
    expect_near_all(opt.first_moment(0).to_vector<double>(), {0.3, -0.05, 0.0}, 1e-6);
    expect_near_all(opt.second_moment(0).to_vector<double>(), {0.009, 0.00025, 0.0}, 1e-6);
    EXPECT_EQ(opt.param_steps(0), 1);
  }
}

TEST(Adam, ThreeStepsWithWeightDecayAgainstTheFormula) {
  Var p = param({0.3, -1.2, 2.0, 0.0}, Device::cpu(), DType::float64);
  Adam opt({p}, 0.05, 0.8, 0.95, 1e-3, 0.01);
  std::vector<double> ref = p.value().to_vector<double>();
  AdamRef r{0.05, 0.8, 0.95, 1e-3, 0.01, {}, {}};
  for (int s = 0; s < 3; ++s) {
    std::vector<double> g{1.0 - s, 0.5 * s, -2.0, 1e-4};
    set_grad(p, g);
    opt.step();
    r.step(ref, g);
  }
  expect_near_all(p.value().to_vector<double>(), ref, 1e-12);
}

// ---- behaviour ---------------------------------------------------------------------------------

TEST(Optim, ParamsWithoutGradientAreSkipped) {
  Var a = param({1.0, 2.0}), b = param({5.0});
  SGD sgd({a, b}, 0.1, 0.9);
  Adam adam({a, b}, 0.1);
  set_grad(a, {1.0, 1.0});
  sgd.step();
  adam.step();
  EXPECT_EQ(b.item(), 5.0);
  EXPECT_EQ(sgd.momentum_buffer(1).item(), 0.0);
  EXPECT_EQ(adam.param_steps(0), 1);
  EXPECT_EQ(adam.param_steps(1), 0);
  // zero_grad forgets every gradient: the next step changes nothing.
  sgd.zero_grad();
  EXPECT_FALSE(a.has_grad());
  const auto before = a.value().to_vector<double>();
  sgd.step();
  adam.step();
  EXPECT_EQ(a.value().to_vector<double>(), before);
  EXPECT_EQ(adam.param_steps(0), 1);
}

TEST(Optim, InvalidArgumentsAreErrors) {
  Var p = param({1.0});
  for (double lr : {kNaN, 0.0, -0.1, kInf}) {
    expect_error([&] { SGD({p}, lr); }, "learning rate");
    expect_error([&] { Adam({p}, lr); }, "learning rate");
  }
  SGD ok({p}, 0.1);
  expect_error([&] { ok.set_lr(kNaN); }, "SGD: learning rate nan");
  ok.set_lr(0.2);
  EXPECT_EQ(ok.lr(), 0.2);
  expect_error([&] { SGD({p}, 0.1, 1.0); }, "momentum");
  expect_error([&] { SGD({p}, 0.1, -0.5); }, "momentum");
  expect_error([&] { SGD({p}, 0.1, 0.0, kNaN); }, "weight_decay");
  expect_error([&] { Adam({p}, 0.1, 1.0); }, "beta1");
  expect_error([&] { Adam({p}, 0.1, 0.9, kNaN); }, "beta2");
  expect_error([&] { Adam({p}, 0.1, 0.9, 0.999, 0.0); }, "eps");
  expect_error([&] { SGD({}, 0.1); }, "empty");
  expect_error([&] { SGD({Var(Tensor::ones({2}))}, 0.1); }, "Var::param");
  expect_error([&] { SGD({Var()}, 0.1); }, "undefined");
  expect_error([&] { Adam({p, p}, 0.1); }, "twice");
}

TEST(Optim, StepAllocatesNothing) {
  Var a = param({1.0, 2.0, 3.0}), b = param({4.0});
  SGD sgd({a, b}, 0.1, 0.9, 0.01);
  Adam adam({a, b}, 0.01);
  set_grad(a, {1.0, -1.0, 0.5});
  set_grad(b, {2.0});
  const auto before = memory_stats(Device::cpu());
  for (int s = 0; s < 10; ++s) {
    sgd.step();
    adam.step();
  }
  const auto after = memory_stats(Device::cpu());
  EXPECT_EQ(after.device_malloc_calls, before.device_malloc_calls);
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
}

// Where gradients stop, the state decays geometrically; it must reach exactly 0 rather than linger
// in the (very slow on x86) subnormal range.
TEST(Optim, DecayedStateIsFlushedNotSubnormal) {
  for (DType t : {DType::float32, DType::float64}) {
    Var p = param({1.0, -1.0, 0.5, 2.0}, Device::cpu(), t);
    SGD sgd({p}, 1e-6, 0.9);
    Adam adam({p}, 1e-6);
    // element 2: (1 - beta2) d^2 is subnormal from the first step, so Adam's second moment must be
    // flushed to exactly 0 at once (0.999^n alone would need ~10^5 steps to get there)
    const double tiny = t == DType::float32 ? 1e-18 : 1e-154;
    set_grad(p, {1e-3, -2.0, tiny, 5.0});
    sgd.step();
    adam.step();
    set_grad(p, {0.0, 0.0, 0.0, 0.0});
    const int steps = t == DType::float32 ? 1500 : 8000;  // 0.9^n below the normal range
    for (int s = 0; s < steps; ++s) {
      sgd.step();
      adam.step();
    }
    const double min_normal = t == DType::float32 ? 1.17549435e-38 : 2.2250738585072014e-308;
    for (const Tensor* state : {&sgd.momentum_buffer(0), &adam.first_moment(0), &adam.second_moment(0)})
      for (double v : state->to_vector<double>())
        EXPECT_TRUE(v == 0.0 || std::abs(v) >= min_normal) << v << " is subnormal (" << dtype_name(t) << ")";
    EXPECT_EQ(adam.first_moment(0).to_vector<double>(), std::vector<double>(4, 0.0));
    EXPECT_EQ(adam.second_moment(0).to_vector<double>()[2], 0.0) << dtype_name(t);
  }
}

// ---- devices: a quadratic, and agreement with the double reference -----------------------------

class OptimDevices : public ::testing::TestWithParam<Device> {};

// f(p) = 1/2 sum a_i (p_i - c_i)^2 with a_i in [1, 10] (condition number 10), gradient a (p - c),
// computed on the host each step. 300 steps of each optimizer drive p to c.
TEST_P(OptimDevices, MinimisesAQuadratic) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  const std::size_t n = 64;
  std::vector<double> a(n), c(n), p0(n);
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = 1.0 + 9.0 * random::uniform(1, i);
    c[i] = random::normal(2, i);
    p0[i] = 3.0 * random::normal(3, i);
  }
  auto loss = [&](const std::vector<double>& p) {
    double s = 0;
    for (std::size_t i = 0; i < n; ++i) s += 0.5 * a[i] * (p[i] - c[i]) * (p[i] - c[i]);
    return s;
  };
  for (int which = 0; which < 3; ++which) {
    Var p = param(p0, d);
    std::unique_ptr<Optimizer> opt;
    if (which == 0) opt = std::make_unique<SGD>(std::vector<Var>{p}, 0.15);
    if (which == 1) opt = std::make_unique<SGD>(std::vector<Var>{p}, 0.02, 0.9);
    if (which == 2) opt = std::make_unique<Adam>(std::vector<Var>{p}, 0.2);
    const double l0 = loss(p0);
    std::vector<double> cur = p0;
    for (int s = 0; s < 300; ++s) {
      std::vector<double> g(n);
      for (std::size_t i = 0; i < n; ++i) g[i] = a[i] * (cur[i] - c[i]);
      opt->zero_grad();
      set_grad(p, g);
      opt->step();
      cur = p.value().to_vector<double>();
    }
    EXPECT_LT(loss(cur), 1e-6 * l0) << "optimizer " << which << " loss " << loss(cur) << " from " << l0;
    for (std::size_t i = 0; i < n; ++i) EXPECT_NEAR(cur[i], c[i], 2e-3) << "optimizer " << which;
  }
}

// 25 steps with pseudo-random gradients on the device against the double reference: float32
// agrees to float rounding, float64 to 1e-12. On CUDA this is the CPU == GPU check.
TEST_P(OptimDevices, MatchesTheReferenceOverManySteps) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  const std::size_t n = 1000;  // several blocks on the GPU
  std::vector<double> p0(n);
  for (std::size_t i = 0; i < n; ++i) p0[i] = random::normal(9, i);
  for (DType t : {DType::float32, DType::float64}) {
    const double tol = t == DType::float32 ? 2e-5 : 1e-12;
    Var ps = param(p0, d, t), pa = param(p0, d, t);
    SGD sgd({ps}, 0.05, 0.9, 1e-3);
    Adam adam({pa}, 0.01, 0.9, 0.99, 1e-6, 1e-3);
    SgdRef sr{0.05, 0.9, 1e-3, {}};
    AdamRef ar{0.01, 0.9, 0.99, 1e-6, 1e-3, {}, {}};
    std::vector<double> rs = p0, ra = p0;
    for (int s = 0; s < 25; ++s) {
      std::vector<double> g(n);
      for (std::size_t i = 0; i < n; ++i) g[i] = fake_grad(s, i);
      set_grad(ps, g);
      set_grad(pa, g);
      sgd.step();
      adam.step();
      sr.step(rs, g);
      ar.step(ra, g);
    }
    expect_near_all(ps.value().to_vector<double>(), rs, tol);
    expect_near_all(pa.value().to_vector<double>(), ra, tol);
  }
}

// The same optimizer run on the CPU and on the GPU from identical starts ends identical (to float
// rounding: the GPU may fuse multiply-adds).
TEST_P(OptimDevices, CpuEqualsDevice) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  const Shape shape{37, 29};
  const Tensor init = Tensor::randn(shape, Device::cpu(), 77);
  Var pc = Var::param(init.clone()), pd = Var::param(init.to(d).clone());
  SGD sc({pc}, 0.1, 0.5), sd({pd}, 0.1, 0.5);
  Adam ac({pc}, 0.003), ad({pd}, 0.003);
  for (int s = 0; s < 20; ++s) {
    const Tensor g = Tensor::randn(shape, Device::cpu(), 1000 + s);
    pc.zero_grad();
    pd.zero_grad();
    pc.backward(g);
    pd.backward(g.to(d));
    (s % 2 ? sc : static_cast<Optimizer&>(ac)).step();
    (s % 2 ? sd : static_cast<Optimizer&>(ad)).step();
  }
  const auto a = pc.value().to_vector<float>(), b = pd.value().to_vector<float>();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5f * (1 + std::abs(a[i])));
  EXPECT_EQ(pd.device(), d);
}

TEST_P(OptimDevices, StateLivesOnTheParameterDevice) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  Var p = Var::param(Tensor::zeros({4, 3}, DType::float64, d));
  SGD sgd({p}, 0.1, 0.9);
  Adam adam({p}, 0.1);
  EXPECT_EQ(sgd.momentum_buffer(0).device(), d);
  EXPECT_EQ(adam.first_moment(0).device(), d);
  EXPECT_EQ(adam.second_moment(0).dtype(), DType::float64);
  EXPECT_EQ(adam.second_moment(0).shape(), (Shape{4, 3}));
  // Steps on the device allocate nothing there either.
  p.backward(Tensor::ones({4, 3}, DType::float64, d));
  const auto before = memory_stats(d);
  for (int s = 0; s < 5; ++s) {
    sgd.step();
    adam.step();
  }
  synchronize(d);
  EXPECT_EQ(memory_stats(d).device_malloc_calls, before.device_malloc_calls);
  EXPECT_EQ(memory_stats(d).bytes_in_use, before.bytes_in_use);
}

INSTANTIATE_TEST_SUITE_P(Devices, OptimDevices, ::testing::ValuesIn(dualcast::testing::all_devices()),
                         [](const auto& info) {
                           return std::string(dualcast::testing::device_label(info.param));
                         });
