// test_layer_norm.cu: layer_norm over the last axis. Values against a naive double loop (with and
// without gamma/beta, rank 1..4, C = 1); float32 keeps its accuracy under a large common offset
// (two-pass statistics); gradients of x, gamma and beta against finite differences in double on every
// device; GPU equal to CPU; argument errors that name the argument and shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "dualcast/gradcheck.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "dualcast/ops/layer_norm.hpp"
#include "test_util.hpp"

namespace dualcast {
namespace {

std::vector<double> naive_layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
  const auto xv = x.to_vector<double>();
  const std::int64_t C = x.shape()[x.rank() - 1], rows = C ? x.numel() / C : 0;
  const auto g = gamma.defined() ? gamma.to_vector<double>() : std::vector<double>(C, 1.0);
  const auto b = beta.defined() ? beta.to_vector<double>() : std::vector<double>(C, 0.0);
  std::vector<double> y(xv.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    double m = 0.0, v = 0.0;
    for (std::int64_t c = 0; c < C; ++c) m += xv[r * C + c];
    m /= static_cast<double>(C);
    for (std::int64_t c = 0; c < C; ++c) v += (xv[r * C + c] - m) * (xv[r * C + c] - m);
    v /= static_cast<double>(C);
    for (std::int64_t c = 0; c < C; ++c) y[r * C + c] = (xv[r * C + c] - m) / std::sqrt(v + eps) * g[c] + b[c];
  }
  return y;
}

/// Each element against its reference (array_error, gradcheck.hpp).
constexpr ErrorScale kEachElement = ErrorScale::elementwise;

class LayerNorm : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override { DUALCAST_SKIP_IF_UNAVAILABLE(GetParam()); }
  Device dev() const { return GetParam(); }
};

const Shape kShapes[] = {Shape{7}, Shape{3, 1}, Shape{4, 5}, Shape{2, 3, 33}, Shape{2, 2, 3, 256}, Shape{5, 1000}};

TEST_P(LayerNorm, MatchesNaiveLoopWithAndWithoutAffineParameters) {
  std::uint64_t seed = 1;
  for (DType dt : {DType::float32, DType::float64})
    for (const Shape& s : kShapes)
      for (int affine = 0; affine < 3; ++affine) {
        const std::int64_t C = s[s.rank() - 1];
        const Tensor x = Tensor::randn(s, dev(), seed++, dt);
        const Tensor g = affine >= 1 ? Tensor::randn({C}, dev(), seed++, dt) : Tensor();
        const Tensor b = affine >= 2 ? Tensor::randn({C}, dev(), seed++, dt) : Tensor();
        for (double eps : {1e-5, 0.1}) {
          const Tensor y = layer_norm(x, g, b, eps);
          ASSERT_EQ(y.shape(), s);
          EXPECT_LE(array_error(y.to_vector<double>(), naive_layer_norm(x, g, b, eps), kEachElement),
                    dt == DType::float64 ? 1e-12 : kGradTolFloat)
              << dtype_name(dt) << " " << s.str() << " affine " << affine << " eps " << eps;
        }
      }
}

TEST_P(LayerNorm, Float32KeepsAccuracyUnderALargeCommonOffset) {
  // x = 1e4 + N(0, 1): a one-pass E[x^2] - E[x]^2 would lose every digit in float32.
  const Tensor x = Tensor::randn({16, 256}, dev(), 3) + 1e4;
  const Tensor y = layer_norm(x, Tensor(), Tensor());
  EXPECT_LE(array_error(y.to_vector<double>(),
                        naive_layer_norm(x, Tensor(), Tensor(), kLayerNormEps), kEachElement), 2e-3);
}

TEST_P(LayerNorm, GradientsMatchFiniteDifferences) {
  std::uint64_t seed = 100;
  for (const Shape& s : {Shape{4, 5}, Shape{2, 3, 33}, Shape{3, 1}, Shape{6}}) {
    const std::int64_t C = s[s.rank() - 1];
    const Tensor x = Tensor::randn(s, dev(), seed++, DType::float64);
    const Tensor g = Tensor::randn({C}, dev(), seed++, DType::float64);
    const Tensor b = Tensor::randn({C}, dev(), seed++, DType::float64);
    const GradCheckResult all = check_gradients(
        [](const std::vector<Var>& v) { return layer_norm(v[0], v[1], v[2], 1e-3); }, {x, g, b});
    EXPECT_TRUE(all.ok) << s.str() << ": " << all.message;
    const GradCheckResult plain =
        check_gradients([](const std::vector<Var>& v) { return layer_norm(v[0], Var(), Var(), 1e-3); }, {x});
    EXPECT_TRUE(plain.ok) << s.str() << " without gamma/beta: " << plain.message;
    const GradCheckResult params = check_gradients(
        [&](const std::vector<Var>& v) { return layer_norm(Var(x), v[0], v[1], 1e-3); }, {g, b});
    EXPECT_TRUE(params.ok) << s.str() << " gamma, beta only: " << params.message;
  }
}

TEST_P(LayerNorm, GradientsOfManyRowsMatchFiniteDifferences) {
  // Enough rows for several chunks of the column sums of dgamma and dbeta.
  const Tensor x = Tensor::randn({300, 7}, dev(), 7, DType::float64);
  const Tensor g = Tensor::randn({7}, dev(), 8, DType::float64);
  const Tensor b = Tensor::randn({7}, dev(), 9, DType::float64);
  const GradCheckResult r = check_gradients(
      [](const std::vector<Var>& v) { return layer_norm(v[0], v[1], v[2]); }, {x, g, b});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST_P(LayerNorm, GpuEqualsCpu) {
  if (dev().is_cpu()) GTEST_SKIP() << "compares a CUDA device with the CPU";
  const Tensor x = Tensor::randn({64, 129}, dev(), 11, DType::float64);
  const Tensor gm = Tensor::randn({129}, dev(), 12, DType::float64);
  const Tensor bt = Tensor::randn({129}, dev(), 13, DType::float64);
  const Tensor adj = Tensor::randn({64, 129}, dev(), 14, DType::float64);
  std::vector<std::vector<double>> res[2];
  for (int k = 0; k < 2; ++k) {
    const Device d = k == 0 ? dev() : Device::cpu();
    Var xv = Var::param(x.to(d)), gv = Var::param(gm.to(d)), bv = Var::param(bt.to(d));
    const Var y = layer_norm(xv, gv, bv);
    y.backward(adj.to(d));
    res[k] = {y.value().to_vector<double>(), xv.grad().to_vector<double>(), gv.grad().to_vector<double>(),
              bv.grad().to_vector<double>()};
  }
  for (std::size_t i = 0; i < 4; ++i)
    EXPECT_LE(array_error(res[0][i], res[1][i], kEachElement), 1e-12) << "output " << i;
}

TEST_P(LayerNorm, BadArgumentsAreErrorsNamingTheArgumentAndShapes) {
  const Tensor x = Tensor::randn({4, 5}, dev(), 1);
  const auto expect_error = [](auto&& f, const std::vector<std::string>& parts) {
    try {
      f();
      ADD_FAILURE() << "no dualcast::Error thrown";
    } catch (const Error& e) {
      for (const auto& p : parts)
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "'" << p << "' not in: " << e.what();
    }
  };
  expect_error([&] { (void)layer_norm(x, Tensor::ones({4}, DType::float32, dev()), Tensor()); },
               {"layer_norm", "'gamma'", "[4]", "[4, 5]"});
  expect_error([&] { (void)layer_norm(x, Tensor(), Tensor::ones({5}, DType::float64, dev())); },
               {"layer_norm", "beta", "float64"});
  expect_error([&] { (void)layer_norm(Tensor::scalar(1.0, DType::float32, dev()), Tensor(), Tensor()); },
               {"layer_norm", "'x'"});
  expect_error([&] { (void)layer_norm(x, Tensor(), Tensor(), -1.0); }, {"layer_norm", "eps"});
  EXPECT_EQ(layer_norm(x, Tensor(), Tensor()).shape(), x.shape());
}

INSTANTIATE_TEST_SUITE_P(Devices, LayerNorm, ::testing::ValuesIn(testing::all_devices()),
                         [](const auto& info) { return testing::device_label(info.param); });

}  // namespace
}  // namespace dualcast
