// test_norm.cu: batch_norm and batch_norm_stats. Training values against the batch's statistics
// computed in double, 4-D and 2-D; the running statistics updated as PyTorch does (momentum, unbiased
// variance) and used in evaluation; data far from zero (the shifted one-pass variance); gradients
// against finite differences in float64, in training and in evaluation, and through the fused
// residual functors; GPU equal to CPU; channels-last rows ([N*H*W, C]) equal to the permuted batch;
// 16-bit x read as it is; bad input named in clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "dualcast/channel_broadcast.hpp"
#include "dualcast/gradcheck.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "dualcast/ops/norm.hpp"
#include "dualcast/ops/reduce.hpp"
#include "dualcast/ops/shape.hpp"
#include "nn_reference.hpp"
#include "test_util.hpp"

using namespace dualcast;
using dualcast::testing::expect_close;
using dualcast::testing::expect_error;

namespace {

class BatchNorm : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override { DUALCAST_SKIP_IF_UNAVAILABLE(GetParam()); }
};

std::vector<double> naive_bn(const std::vector<double>& x, const Shape& xs, const std::vector<double>& mean,
                             const std::vector<double>& var, const std::vector<double>& g,
                             const std::vector<double>& b, double eps) {
  const std::int64_t C = xs[1], inner = xs.numel() / (xs[0] * C);
  std::vector<double> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::size_t c = (i / static_cast<std::size_t>(inner)) % static_cast<std::size_t>(C);
    y[i] = (x[i] - mean[c]) / std::sqrt(var[c] + eps) * g[c] + b[c];
  }
  return y;
}

TEST_P(BatchNorm, TrainingNormalisesWithBatchStatisticsAndUpdatesRunningOnes) {
  const Device dev = GetParam();
  std::uint64_t seed = 1;
  for (const Shape& xs : {Shape{4, 3, 5, 6}, Shape{6, 5}, Shape{3, 2, 7, 1}}) {
    for (const DType dt : {DType::float64, DType::float32}) {
      const std::int64_t C = xs[1], M = xs.numel() / C;
      const Tensor x = Tensor::randn(xs, dev, ++seed, dt);
      const Tensor g = Tensor::uniform({C}, dev, ++seed, 0.5, 2.0, dt);
      const Tensor b = Tensor::randn({C}, dev, ++seed, dt);
      const Tensor rm0 = Tensor::randn({C}, dev, ++seed, dt);
      const Tensor rv0 = Tensor::uniform({C}, dev, ++seed, 0.5, 2.0, dt);
      const Tensor rm = rm0.clone(), rv = rv0.clone();
      const double momentum = 0.3, eps = 1e-5;
      const Var y = batch_norm(Var(x), Var(g), Var(b), rm, rv, true, momentum, eps);
      std::vector<double> mean, var;
      dualcast::testing::naive_batch_stats(x.to_vector<double>(), xs, mean, var);
      const double tol = dt == DType::float64 ? 1e-12 : 2e-5;
      const std::string what = xs.str() + " " + dtype_name(dt);
      expect_close(y.value().to_vector<double>(),
                   naive_bn(x.to_vector<double>(), xs, mean, var, g.to_vector<double>(),
                            b.to_vector<double>(), eps),
                   tol, what + " value");
      std::vector<double> want_rm, want_rv;
      for (std::int64_t c = 0; c < C; ++c) {
        const auto k = static_cast<std::size_t>(c);
        want_rm.push_back((1 - momentum) * rm0.to_vector<double>()[k] + momentum * mean[k]);
        want_rv.push_back((1 - momentum) * rv0.to_vector<double>()[k] +
                          momentum * var[k] * static_cast<double>(M) / static_cast<double>(M - 1));
      }
      expect_close(rm.to_vector<double>(), want_rm, tol, what + " running mean");
      expect_close(rv.to_vector<double>(), want_rv, tol, what + " running var (unbiased)");
    }
  }
}

TEST_P(BatchNorm, EvaluationUsesTheRunningStatisticsAndLeavesThem) {
  const Device dev = GetParam();
  const Shape xs{3, 4, 2, 5};
  const Tensor x = Tensor::randn(xs, dev, 1, DType::float64);
  const Tensor g = Tensor::randn({4}, dev, 2, DType::float64), b = Tensor::randn({4}, dev, 3, DType::float64);
  const Tensor rm = Tensor::randn({4}, dev, 4, DType::float64);
  const Tensor rv = Tensor::uniform({4}, dev, 5, 0.5, 2.0, DType::float64);
  const auto rm0 = rm.to_vector<double>(), rv0 = rv.to_vector<double>();
  const Var y = batch_norm(Var(x), Var(g), Var(b), rm, rv, false, 0.1, 1e-3);
  expect_close(y.value().to_vector<double>(),
               naive_bn(x.to_vector<double>(), xs, rm0, rv0, g.to_vector<double>(), b.to_vector<double>(), 1e-3),
               1e-12, "evaluation");
  EXPECT_EQ(rm.to_vector<double>(), rm0);
  EXPECT_EQ(rv.to_vector<double>(), rv0);
}

TEST_P(BatchNorm, VarianceOfDataFarFromZeroIsAccurate) {
  // float32 activations around 1e4 with unit spread: E[x^2] - E[x]^2 without a shift would lose
  // every digit of the variance.
  const Device dev = GetParam();
  const Shape xs{16, 3, 8, 8};
  const Tensor x = Tensor::randn(xs, dev, 9) + 1e4;
  const BatchNormStats st = batch_norm_stats(Var(x), Tensor(), Tensor(), true);
  std::vector<double> mean, var;
  dualcast::testing::naive_batch_stats(x.to_vector<double>(), xs, mean, var);
  std::vector<double> rstd;
  for (double v : var) rstd.push_back(1.0 / std::sqrt(v + 1e-5));
  expect_close(st.mean.value().to_vector<double>(), mean, 1e-6, "mean");
  expect_close(st.rstd.value().to_vector<double>(), rstd, 1e-5, "rstd");
}

struct TrainOf {
  Var operator()(const std::vector<Var>& v) const {
    return batch_norm(v[0], v[1], v[2], Tensor(), Tensor(), true, 0.1, 1e-3);
  }
};
struct EvalOf {
  Tensor rm, rv;
  Var operator()(const std::vector<Var>& v) const { return batch_norm(v[0], v[1], v[2], rm, rv, false); }
};
/// A whole basic-block tail: relu(bn(x) + bn(s)), statistics of both branches from the batch.
struct BlockOf {
  Var operator()(const std::vector<Var>& v) const {
    const BatchNormStats a = batch_norm_stats(v[0], Tensor(), Tensor(), true, 0.1, 1e-3);
    const BatchNormStats b = batch_norm_stats(v[3], Tensor(), Tensor(), true, 0.1, 1e-3);
    return channel_broadcast(BatchNorm2AddRelu{}, v[0], a.mean, a.rstd, v[1], v[2], v[3], b.mean, b.rstd,
                             v[4], v[5]);
  }
};
/// The statistics alone, each output used.
struct StatsOf {
  Var operator()(const std::vector<Var>& v) const {
    const BatchNormStats s = batch_norm_stats(v[0], Tensor(), Tensor(), true, 0.1, 1e-2);
    return s.mean * 3.0 + s.rstd;
  }
};

TEST_P(BatchNorm, GradientsMatchFiniteDifferences) {
  const Device dev = GetParam();
  std::uint64_t seed = 30;
  // [69, 40]: channels-last rows, reduced in columns on a GPU (check_gradients checks every 29th
  // element: both parities of channel, which chunks of consecutive channels need).
  for (const Shape& xs : {Shape{3, 2, 3, 4}, Shape{5, 3}, Shape{2, 3, 3, 3}, Shape{69, 40}}) {
    const std::int64_t C = xs[1];
    auto x = [&] { return Tensor::randn(xs, dev, ++seed, DType::float64); };
    auto gamma = [&] { return Tensor::uniform({C}, dev, ++seed, 0.5, 2.0, DType::float64); };
    auto beta = [&] { return Tensor::randn({C}, dev, ++seed, DType::float64); };
    GradCheckResult r = check_gradients(TrainOf{}, {x(), gamma(), beta()});
    EXPECT_TRUE(r.ok) << xs.str() << " training: " << r.message;
    r = check_gradients(EvalOf{Tensor::randn({C}, dev, ++seed, DType::float64),
                               Tensor::uniform({C}, dev, ++seed, 0.5, 2.0, DType::float64)},
                        {x(), gamma(), beta()});
    EXPECT_TRUE(r.ok) << xs.str() << " evaluation: " << r.message;
    r = check_gradients(BlockOf{}, {x(), gamma(), beta(), x(), gamma(), beta()});
    EXPECT_TRUE(r.ok) << xs.str() << " block: " << r.message;
    r = check_gradients(StatsOf{}, {x()});
    EXPECT_TRUE(r.ok) << xs.str() << " statistics: " << r.message;
  }
}

TEST_P(BatchNorm, GpuEqualsCpu) {
  const Device dev = GetParam();
  if (dev.is_cpu()) GTEST_SKIP() << "compares a CUDA device with the CPU";
  const Shape xs{16, 8, 14, 14};
  const Tensor x = Tensor::randn(xs, Device::cpu(), 1), adj = Tensor::randn(xs, Device::cpu(), 2);
  const Tensor g = Tensor::uniform({8}, Device::cpu(), 3, 0.5, 2.0), b = Tensor::randn({8}, Device::cpu(), 4);
  auto run = [&](Device d) {
    Var xv = Var::param(x.to(d)), gv = Var::param(g.to(d)), bv = Var::param(b.to(d));
    Tensor rm = Tensor::zeros({8}, DType::float32, d), rv = Tensor::ones({8}, DType::float32, d);
    Var y = batch_norm(xv, gv, bv, rm, rv, true);
    y.backward(adj.to(d));
    return std::vector<Tensor>{y.value(), xv.grad(), gv.grad(), bv.grad(), rm, rv};
  };
  const auto c = run(Device::cpu()), gg = run(dev);
  const char* names[] = {"y", "dx", "dgamma", "dbeta", "running_mean", "running_var"};
  for (std::size_t k = 0; k < c.size(); ++k)
    expect_close(gg[k].to(Device::cpu()), c[k], kSameResultTolFloat, names[k]);
}

TEST_P(BatchNorm, ChannelsLastRowsEqualThePermutedBatch) {
  // An NHWC activation [N, H, W, C] normalised as [N*H*W, C] (channels last: a GPU reduces it in
  // columns of 32 channels, channel_columns) against the same batch as [N, C, H, W]: values, every
  // gradient and the running statistics. Channel counts below, at and past a warp, odd row counts,
  // and enough rows for many slices per channel.
  const Device dev = GetParam();
  std::uint64_t seed = 500;
  for (const Shape nhwc : {Shape{3, 7, 5, 8}, Shape{2, 9, 11, 40}, Shape{5, 3, 3, 70}, Shape{64, 14, 14, 32}}) {
    const std::int64_t C = nhwc[3];
    const Tensor x = Tensor::randn(nhwc, dev, ++seed) + 3.0, adj = Tensor::randn(nhwc, dev, ++seed);
    const Tensor g = Tensor::uniform({C}, dev, ++seed, 0.5, 2.0), b = Tensor::randn({C}, dev, ++seed);
    auto run = [&](bool rows) {
      Var xv = Var::param(x), gv = Var::param(g), bv = Var::param(b);
      Tensor rm = Tensor::zeros({C}, DType::float32, dev), rv = Tensor::ones({C}, DType::float32, dev);
      const std::vector<int> to_nchw{0, 3, 1, 2}, to_nhwc{0, 2, 3, 1};
      const Var y = rows ? reshape(batch_norm(reshape(xv, {x.numel() / C, C}), gv, bv, rm, rv, true), nhwc)
                         : permute(batch_norm(permute(xv, to_nchw), gv, bv, rm, rv, true), to_nhwc);
      y.backward(adj);
      return std::vector<Tensor>{y.value(), xv.grad(), gv.grad(), bv.grad(), rm, rv};
    };
    const auto want = run(false), got = run(true);
    const char* names[] = {"y", "dx", "dgamma", "dbeta", "running_mean", "running_var"};
    for (std::size_t k = 0; k < want.size(); ++k)
      expect_close(got[k], want[k], kSameResultTolFloat, std::string(names[k]) + " " + nhwc.str());
  }
}

TEST_P(BatchNorm, SixteenBitStatisticsAreTheFloat32StatisticsOfTheSameValues) {
  // batch_norm_stats reads a 16-bit x as it is: float32 mean, rstd and running statistics equal to
  // those of x converted to float32 (the sums are double either way), and x's gradient through them
  // in x's dtype, the float32 one rounded once. NCHW and [M, C] rows.
  const Device dev = GetParam();
  std::uint64_t seed = 600;
  for (const DType half : {DType::bfloat16, DType::float16}) {
    for (const Shape& s : {Shape{4, 6, 5, 3}, Shape{2, 8, 4, 4}, Shape{301, 40}}) {
      const std::int64_t C = s[1];
      const Tensor x16 = (Tensor::randn(s, dev, ++seed) + 2.0).to(half);
      const Tensor dm = Tensor::randn({C}, dev, ++seed), dr = Tensor::randn({C}, dev, ++seed);
      auto run = [&](bool sixteen) {
        Var x = Var::param(sixteen ? x16 : x16.to(DType::float32));
        Tensor rm = Tensor::zeros({C}, DType::float32, dev), rv = Tensor::ones({C}, DType::float32, dev);
        const BatchNormStats st = batch_norm_stats(x, rm, rv, true);
        (sum(st.mean * Var(dm)) + sum(st.rstd * Var(dr))).backward();
        return std::vector<Tensor>{st.mean.value(), st.rstd.value(), rm, rv, x.grad()};
      };
      const auto got = run(true), want = run(false);
      const std::string what = std::string(dtype_name(half)) + " " + s.str();
      const char* names[] = {"mean", "rstd", "running_mean", "running_var", "dx"};
      for (std::size_t k = 0; k < 4; ++k) {
        ASSERT_EQ(got[k].dtype(), DType::float32) << what << " " << names[k];
        expect_close(got[k], want[k], 1e-6, what + " " + names[k]);
      }
      ASSERT_EQ(got[4].dtype(), half) << what;
      expect_close(got[4].to(DType::float32), want[4].to(half).to(DType::float32),
                   dev.is_cpu() ? 0.0 : (half == DType::bfloat16 ? 8e-3 : 1e-3), what + " dx");
    }
  }
}

TEST_P(BatchNorm, BadInputIsAClearError) {
  const Device dev = GetParam();
  const Var x = Var::param(Tensor::randn({4, 3, 2, 2}, dev, 1));
  const Var g = Var::param(Tensor::ones({3}, DType::float32, dev));
  const Var b = Var::param(Tensor::zeros({3}, DType::float32, dev));
  const Tensor rm = Tensor::zeros({3}, DType::float32, dev), rv = Tensor::ones({3}, DType::float32, dev);
  expect_error([&] { (void)batch_norm(x, Var::param(Tensor::ones({4}, DType::float32, dev)), b, rm, rv, true); },
               {"batch_norm", "'gamma'", "[4]", "[4, 3, 2, 2]", "3 channels"}, "gamma");
  expect_error([&] { (void)batch_norm(x, g, b, Tensor::zeros({2}, DType::float32, dev), rv, true); },
               {"batch_norm", "'running_mean'", "[2]"}, "running mean");
  expect_error([&] { (void)batch_norm(x, g, b, Tensor(), Tensor(), false); },
               {"batch_norm", "running_mean", "evaluation"}, "evaluation without statistics");
  expect_error([&] { (void)batch_norm(Var::param(Tensor::randn({5}, dev, 2)), g, b, rm, rv, true); },
               {"batch_norm", "[5]", "rank >= 2"}, "1-D input");
  expect_error([&] { (void)batch_norm(Var::param(Tensor::randn({1, 3, 1, 1}, dev, 2)), g, b, rm, rv, true); },
               {"batch_norm", "more than 1 value per channel", "[1, 3, 1, 1]"}, "one value per channel");
  expect_error([&] { (void)batch_norm(x, g, b, rm, rv, true, 1.5); }, {"batch_norm", "momentum 1.5"}, "momentum");
  expect_error([&] { (void)batch_norm(x, g, b, rm.to(DType::float64), rv, true); },
               {"batch_norm", "running_mean"}, "dtype");
  EXPECT_EQ(batch_norm(x, g, b, rm, rv, true).shape(), x.shape());  // still works
}

INSTANTIATE_TEST_SUITE_P(Devices, BatchNorm, ::testing::ValuesIn(dualcast::testing::all_devices()),
                         [](const ::testing::TestParamInfo<Device>& info) {
                           return std::string(dualcast::testing::device_label(info.param));
                         });

}  // namespace
