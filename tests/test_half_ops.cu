// test_half_ops.cu: reductions, losses, softmax, normalisation, pooling and the optimizers on
// bfloat16 and float16 tensors. Each result is held against the float32 op applied to the same
// rounded values, within the 16-bit rounding of the result; dtypes of values, gradients and optimizer
// state are checked; gradients go through the one checker (check_gradients) at 16-bit tolerances.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "dualcast/gradcheck.hpp"
#include "dualcast/ops/cast.hpp"
#include "dualcast/ops/layer_norm.hpp"
#include "dualcast/ops/loss.hpp"
#include "dualcast/ops/norm.hpp"
#include "dualcast/ops/pool.hpp"
#include "dualcast/ops/reduce.hpp"
#include "dualcast/ops/shape.hpp"
#include "dualcast/optim.hpp"
#include "test_util.hpp"

namespace dualcast {
namespace {

/// One unit in the last place, relative, of each 16-bit dtype (2^-7 and 2^-10): a result rounded
/// once from a float32 value lies within half of it; a full unit allows the float32 reference,
/// accumulated in another order, to sit on the other side of a rounding boundary.
double ulp_of(DType t) { return t == DType::bfloat16 ? 0x1p-7 : 0x1p-10; }
double grad_tol(DType t) { return t == DType::bfloat16 ? kGradTolBfloat16 : kGradTolFloat16; }

struct Case {
  Device device;
  DType dtype;
};

class HalfOps : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { DUALCAST_SKIP_IF_UNAVAILABLE(GetParam().device); }
  [[nodiscard]] Device dev() const { return GetParam().device; }
  [[nodiscard]] DType dt() const { return GetParam().dtype; }
  /// Random values in the 16-bit dtype.
  [[nodiscard]] Tensor rand16(const Shape& s, std::uint64_t seed, double scale = 1.0) const {
    std::vector<double> v = Tensor::randn(s, Device::cpu(), seed).to_vector<double>();
    for (double& e : v) e *= scale;
    return Tensor::from_vector<double>(s, v, dev()).to(dt());
  }
  /// got (16-bit) against want (float32) within one 16-bit unit of each element (relative to
  /// max(1, |want|): sums near zero are judged absolutely), and got has the 16-bit dtype.
  void expect_rounded(const Tensor& got, const Tensor& want, const std::string& what) const {
    EXPECT_EQ(got.dtype(), dt()) << what;
    EXPECT_LE(array_error(got, want, ErrorScale::elementwise), ulp_of(dt())) << what;
  }
};

// ---- reductions ----------------------------------------------------------------------------------

TEST_P(HalfOps, ReductionsOverEveryAxisPatternEqualFloat32OfTheRoundedValues) {
  const Tensor x = rand16({3, 4, 5}, 1);
  const Tensor xr = x.to(DType::float32);
  for (int mask = 1; mask < 8; ++mask) {
    std::vector<int> axes;
    for (int d = 0; d < 3; ++d)
      if (mask & (1 << d)) axes.push_back(d);
    for (const bool keep : {false, true}) {
      const std::string what = "mask " + std::to_string(mask) + (keep ? " keepdims" : "");
      expect_rounded(sum(x, axes, keep), sum(xr, axes, keep), "sum " + what);
      expect_rounded(mean(x, axes, keep), mean(xr, axes, keep), "mean " + what);
      const Tensor m = amax(x, axes, keep);
      EXPECT_EQ(m.dtype(), dt());  // a maximum is one of the values: exact
      EXPECT_EQ(m.to_vector<double>(), amax(xr, axes, keep).to_vector<double>()) << what;
    }
  }
  expect_rounded(sum(x), sum(xr), "full sum");
  expect_rounded(sum_to(x, Shape{4, 1}), sum_to(xr, Shape{4, 1}), "sum_to");
  // A strided view (the transpose of the last two dimensions, copied by the same engine).
  expect_rounded(sum(transpose(x), 1), sum(transpose(xr), 1), "transposed");
}

// 4096 ones: a bfloat16 accumulator sticks at 256 (256 + 1 rounds back to 256), a float16 one at
// 2048; the result 4096 is exact in both dtypes, so only a wider accumulator gets it.
TEST_P(HalfOps, LongSumsAccumulateWiderThanSixteenBits) {
  const Tensor ones = Tensor::ones({2, 4096}, dt(), dev());
  EXPECT_EQ(sum(ones).item(), 8192.0);
  EXPECT_EQ(sum(ones, 1).to_vector<double>(), (std::vector<double>{4096.0, 4096.0}));
  EXPECT_EQ(mean(ones, 1).to_vector<double>(), (std::vector<double>{1.0, 1.0}));
  const Tensor cols = Tensor::ones({4096, 3}, dt(), dev());  // the column kernels
  EXPECT_EQ(sum(cols, 0).to_vector<double>(), (std::vector<double>{4096.0, 4096.0, 4096.0}));
}

TEST_P(HalfOps, ReductionGradientsHaveTheInputDtypeAndPassTheChecker) {
  const Tensor x = rand16({4, 6}, 2);
  for (int which = 0; which < 3; ++which) {
    Var p = Var::param(x);
    Var s = which == 0 ? sum(p) : (which == 1 ? sum(mean(p, 0)) : sum(amax(p, 1)));
    EXPECT_EQ(s.dtype(), dt());
    s.backward();
    EXPECT_EQ(p.grad().dtype(), dt()) << which;
  }
  GradCheckOptions o;
  o.tolerance = grad_tol(dt());
  for (int which = 0; which < 3; ++which) {
    const GradCheckResult r = check_gradients(
        [which](const std::vector<Var>& v) {
          return which == 0 ? sum(v[0], 1) : (which == 1 ? mean(v[0], {0, 1}) : amax(v[0], 0));
        },
        {x}, o);
    EXPECT_TRUE(r.ok) << "reduction " << which << ": " << r.message;
  }
}

// ---- softmax, losses ------------------------------------------------------------------------------

TEST_P(HalfOps, SoftmaxAndLossesComputeInFloat32AndReturnTheInputDtype) {
  const Tensor x = rand16({5, 7}, 3, 3.0);
  const Tensor xr = x.to(DType::float32);
  expect_rounded(softmax(x, 1), softmax(xr, 1), "softmax");
  expect_rounded(log_softmax(x, 0), log_softmax(xr, 0), "log_softmax");
  const Tensor labels = Tensor::from_vector<int>(Shape{5}, {0, 3, 6, 2, 1}, dev()).to(DType::float32);
  expect_rounded(cross_entropy(x, labels), cross_entropy(xr, labels), "cross_entropy");
  const Tensor t = rand16({5, 7}, 4);
  expect_rounded(mse(x, t), mse(xr, t.to(DType::float32)), "mse");
  // Gradients: the input's dtype, and the checker at 16-bit tolerance.
  for (int which = 0; which < 4; ++which) {
    Var p = Var::param(x);
    Var l = which == 0 ? cross_entropy(p, labels)
                       : (which == 1 ? mse(p, Var(t))
                                     : sum(which == 2 ? softmax(p, 1) : log_softmax(p, 1)));
    EXPECT_EQ(l.dtype(), dt()) << which;
    l.backward();
    EXPECT_EQ(p.grad().dtype(), dt()) << which;
  }
  GradCheckOptions o;
  o.tolerance = grad_tol(dt());
  const auto softmax_f = [](const std::vector<Var>& v) { return softmax(v[0], 1); };
  const auto logsm_f = [](const std::vector<Var>& v) { return log_softmax(v[0], 1); };
  const auto ce_f = [&](const std::vector<Var>& v) { return cross_entropy(v[0], labels); };
  const auto mse_f = [](const std::vector<Var>& v) { return mse(v[0], v[1]); };
  EXPECT_TRUE(check_gradients(softmax_f, {x}, o).ok);
  EXPECT_TRUE(check_gradients(logsm_f, {x}, o).ok);
  EXPECT_TRUE(check_gradients(ce_f, {x}, o).ok);
  const GradCheckResult r = check_gradients(mse_f, {x, t}, o);
  EXPECT_TRUE(r.ok) << r.message;
}

// A function of float64 inputs that rounds to 16 bits inside: the checker differences the float64
// function (the casts are suspended) and compares with the 16-bit tape gradient.
TEST_P(HalfOps, CheckGradientsDifferencesInFloat64WhenTheFunctionCastsInside) {
  const Tensor x = Tensor::randn({3, 8}, dev(), 5, DType::float64);
  // Outside the checker's differencing the function really runs in 16 bits.
  EXPECT_NE(log_softmax(cast(Var(x), dt()), 1).value().dtype(), DType::float64);
  GradCheckOptions o;
  o.tolerance = grad_tol(dt());
  const DType t = dt();
  const GradCheckResult r = check_gradients(
      [t](const std::vector<Var>& v) { return log_softmax(cast(v[0], t), 1); },
      {x}, o);
  EXPECT_TRUE(r.ok) << r.message;
}

// ---- normalisation ---------------------------------------------------------------------------------

TEST_P(HalfOps, LayerNormTakesFloat32ParametersAndReturnsTheInputDtype) {
  const Tensor x = rand16({6, 10}, 6, 2.0);
  const Tensor gamma = Tensor::randn({10}, dev(), 7);
  const Tensor beta = Tensor::randn({10}, dev(), 8);
  expect_rounded(layer_norm(x, gamma, beta), layer_norm(x.to(DType::float32), gamma, beta),
                 "layer_norm");
  Var px = Var::param(x), pg = Var::param(gamma), pb = Var::param(beta);
  Var y = layer_norm(px, pg, pb);
  EXPECT_EQ(y.dtype(), dt());
  sum(y).backward();
  EXPECT_EQ(px.grad().dtype(), dt());
  EXPECT_EQ(pg.grad().dtype(), DType::float32);
  EXPECT_EQ(pb.grad().dtype(), DType::float32);
  GradCheckOptions o;
  o.tolerance = grad_tol(dt());
  // The checker differences every input in float64, so the parameters go in as inputs too, in x's
  // dtype (the other form layer_norm accepts).
  const GradCheckResult r = check_gradients(
      [](const std::vector<Var>& v) { return layer_norm(v[0], v[1], v[2]); },
      {x, gamma.to(dt()), beta.to(dt())}, o);
  EXPECT_TRUE(r.ok) << r.message;
}

TEST_P(HalfOps, BatchNormKeepsFloat32ParametersAndRunningStatistics) {
  const Tensor x = rand16({4, 3, 5, 5}, 9, 2.0);
  const Tensor gamma = Tensor::randn({3}, dev(), 10);
  const Tensor beta = Tensor::randn({3}, dev(), 11);
  Tensor rm = Tensor::zeros({3}, DType::float32, dev()), rv = Tensor::ones({3}, DType::float32, dev());
  Tensor rm32 = rm.clone(), rv32 = rv.clone();
  Var px = Var::param(x), pg = Var::param(gamma), pb = Var::param(beta);
  Var y = batch_norm(px, pg, pb, rm, rv, /*training=*/true);
  const Var y32 = batch_norm(Var(x.to(DType::float32)), Var(gamma), Var(beta), rm32, rv32, true);
  expect_rounded(y.value(), y32.value(), "batch_norm");
  EXPECT_LE(array_error(rm, rm32, ErrorScale::elementwise), 1e-6);  // the same float32 computation
  EXPECT_LE(array_error(rv, rv32, ErrorScale::elementwise), 1e-6);
  sum(y).backward();
  EXPECT_EQ(px.grad().dtype(), dt());
  EXPECT_EQ(pg.grad().dtype(), DType::float32);
  // 16-bit running statistics would stop moving: an Error naming them.
  Tensor rm16 = rm.to(dt());
  try {
    (void)batch_norm(px, pg, pb, rm16, rv, true);
    ADD_FAILURE() << "16-bit running statistics were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("running_mean"), std::string::npos) << e.what();
  }
}

// ---- pooling ---------------------------------------------------------------------------------------

TEST_P(HalfOps, PoolingReadsSixteenBitsDirectlyAndMatchesFloat32) {
  const Tensor x = rand16({2, 3, 7, 6}, 12);
  const Tensor xr = x.to(DType::float32);
  const Tensor m = max_pool2d(x, Size2(3), Size2(2), Size2(1));
  EXPECT_EQ(m.dtype(), dt());
  EXPECT_EQ(m.to_vector<double>(), max_pool2d(xr, Size2(3), Size2(2), Size2(1)).to_vector<double>());
  expect_rounded(avg_pool2d(x, Size2(2)), avg_pool2d(xr, Size2(2)), "avg_pool2d");
  expect_rounded(adaptive_avg_pool2d(x, Size2(3, 2)), adaptive_avg_pool2d(xr, Size2(3, 2)),
                 "adaptive_avg_pool2d");
  GradCheckOptions o;
  o.tolerance = grad_tol(dt());
  const auto avg_f = [](const std::vector<Var>& v) { return avg_pool2d(v[0], Size2(3), Size2(2), Size2(1)); };
  const auto ada_f = [](const std::vector<Var>& v) { return adaptive_avg_pool2d(v[0], Size2(3, 2)); };
  GradCheckResult r = check_gradients(avg_f, {x}, o);
  EXPECT_TRUE(r.ok) << r.message;
  r = check_gradients(ada_f, {x}, o);
  EXPECT_TRUE(r.ok) << r.message;
  Var p = Var::param(x);
  sum(max_pool2d(p, Size2(2))).backward();
  EXPECT_EQ(p.grad().dtype(), dt());
  // Each 2x2 window's gradient goes to one element: the gradient sums to the number of windows.
  EXPECT_EQ(sum(p.grad()).item(), 2.0 * 3 * 3 * 3);
}

// ---- optimizers ------------------------------------------------------------------------------------

/// One step of `opt_kind` (0: SGD with momentum and weight decay, 1: Adam) on a parameter of dtype
/// t whose value and gradient are p0 and g0 rounded to t; returns the parameter and the optimizer's
/// first state tensor after `steps` steps.
std::pair<Tensor, Tensor> optimizer_run(int opt_kind, Device d, DType t, const Tensor& p0,
                                        const Tensor& g0, int steps) {
  Var p = Var::param(p0.to(t).clone());  // (to() of the same dtype shares p0's storage)
  std::unique_ptr<Optimizer> opt;
  if (opt_kind == 0) opt = std::make_unique<SGD>(std::vector<Var>{p}, 0.05, 0.9, 0.01);
  else opt = std::make_unique<Adam>(std::vector<Var>{p}, 1e-2, 0.9, 0.999, 1e-8, 0.01);
  for (int k = 0; k < steps; ++k) {
    p.zero_grad();
    p.backward(g0.to(t));
    opt->step();
  }
  const Tensor state = opt_kind == 0 ? static_cast<SGD&>(*opt).momentum_buffer(0)
                                     : static_cast<Adam&>(*opt).first_moment(0);
  return {p.value(), state};
}

TEST_P(HalfOps, OptimizersKeepFloat32StateAndMatchTheFloat32StepWithinRounding) {
  const Tensor p0 = rand16({64}, 13).to(DType::float32);  // values exact in the 16-bit dtype
  const Tensor g0 = rand16({64}, 14).to(DType::float32);
  for (int kind = 0; kind < 2; ++kind) {
    const auto [p16, s16] = optimizer_run(kind, dev(), dt(), p0, g0, 1);
    const auto [p32, s32] = optimizer_run(kind, dev(), DType::float32, p0, g0, 1);
    EXPECT_EQ(s16.dtype(), DType::float32) << kind;
    EXPECT_EQ(s16.to_vector<float>(), s32.to_vector<float>()) << kind;  // the same float32 state
    EXPECT_EQ(p16.dtype(), dt());
    // The 16-bit parameter is the float32 step's result rounded once.
    EXPECT_EQ(p16.to_vector<double>(), p32.to(dt()).to_vector<double>()) << kind;
  }
}

std::vector<Case> cases() {
  std::vector<Case> c;
  for (const Device d : testing::all_devices())
    for (const DType t : {DType::bfloat16, DType::float16}) c.push_back({d, t});
  return c;
}

INSTANTIATE_TEST_SUITE_P(Devices, HalfOps, ::testing::ValuesIn(cases()), [](const auto& info) {
  return std::string(testing::device_label(info.param.device)) + "_" +
         dtype_name(info.param.dtype);
});

}  // namespace
}  // namespace dualcast
