// test_linalg.cu: matmul. Values against a naive double triple loop for every transpose combination,
// 2-D, batched and shared-operand forms; gradients against finite differences (float64) for every
// form and flag combination, odd and size-1 shapes; fp32 accuracy (no TF32); CPU == GPU on the same
// seeded inputs; argument errors that name the op and shapes, after which matmul still works.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../src/blas.hpp"  // cublas_handles_created(), a private counter for the handle test
#include "dualcast/gradcheck.hpp"
#include "dualcast/ops/linalg.hpp"
#include "matmul_reference.hpp"
#include "test_util.hpp"

using namespace dualcast;

namespace {

struct Flags {
  bool ta, tb;
};
const Flags kAllFlags[] = {{false, false}, {false, true}, {true, false}, {true, true}};

std::string flags_str(Flags f) {
  return std::string("trans_a=") + (f.ta ? "1" : "0") + " trans_b=" + (f.tb ? "1" : "0");
}

/// Stored shape of an operand whose op() is [rows, cols], with an optional batch.
Shape stored(std::int64_t batch, std::int64_t rows, std::int64_t cols, bool trans) {
  const std::int64_t r = trans ? cols : rows, c = trans ? rows : cols;
  return batch > 0 ? Shape{batch, r, c} : Shape{r, c};
}

using dualcast::testing::naive_matmul;

/// Each element against its reference (array_error, gradcheck.hpp).
constexpr ErrorScale kEachElement = ErrorScale::elementwise;

/// Relative tolerance of a float GEMM against the double reference: the sum of k products of
/// O(1) numbers carries about sqrt(k) ulps of float rounding, far inside kGradTolFloat.
double tolerance_for(DType t) { return t == DType::float64 ? 1e-12 : kGradTolFloat; }

struct Dims {
  std::int64_t m, k, n;
};
// Odd sizes, size-1 dimensions, a vector-like product, and k spanning several BLAS blocks.
const Dims kShapes[] = {{1, 1, 1}, {3, 5, 4}, {7, 1, 9}, {1, 6, 1}, {17, 13, 5}, {33, 70, 1}};

class Matmul : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override { DUALCAST_SKIP_IF_UNAVAILABLE(GetParam()); }
  Device dev() const { return GetParam(); }
};

// ---- values ---------------------------------------------------------------------------------------

TEST_P(Matmul, MatchesNaiveLoopForEveryTransposeCombination) {
  std::uint64_t seed = 1;
  for (DType dt : {DType::float32, DType::float64})
    for (const Dims& d : kShapes)
      for (Flags f : kAllFlags) {
        const Tensor a = Tensor::randn(stored(0, d.m, d.k, f.ta), dev(), seed++, dt);
        const Tensor b = Tensor::randn(stored(0, d.k, d.n, f.tb), dev(), seed++, dt);
        const Tensor c = matmul(a, b, f.ta, f.tb);
        ASSERT_EQ(c.shape(), (Shape{d.m, d.n})) << flags_str(f);
        EXPECT_EQ(c.dtype(), dt);
        EXPECT_EQ(c.device(), dev());
        EXPECT_LE(array_error(c.to_vector<double>(), naive_matmul(a, b, f.ta, f.tb), kEachElement),
                  tolerance_for(dt))
            << dtype_name(dt) << " m=" << d.m << " k=" << d.k << " n=" << d.n << " " << flags_str(f);
      }
}

TEST_P(Matmul, BatchedMatchesNaiveLoopForEveryTransposeCombination) {
  std::uint64_t seed = 100;
  for (DType dt : {DType::float32, DType::float64})
    for (std::int64_t batch : {1, 4})
      for (const Dims& d : {Dims{1, 1, 1}, Dims{3, 5, 4}, Dims{9, 2, 7}})
        for (Flags f : kAllFlags) {
          const Tensor a = Tensor::randn(stored(batch, d.m, d.k, f.ta), dev(), seed++, dt);
          const Tensor b = Tensor::randn(stored(batch, d.k, d.n, f.tb), dev(), seed++, dt);
          const Tensor c = matmul(a, b, f.ta, f.tb);
          ASSERT_EQ(c.shape(), (Shape{batch, d.m, d.n}));
          EXPECT_LE(array_error(c.to_vector<double>(), naive_matmul(a, b, f.ta, f.tb), kEachElement),
                    tolerance_for(dt))
              << dtype_name(dt) << " batch=" << batch << " " << flags_str(f);
        }
}

TEST_P(Matmul, SharedOperandIsBroadcastOverTheBatch) {
  std::uint64_t seed = 200;
  for (DType dt : {DType::float32, DType::float64})
    for (const Dims& d : {Dims{1, 3, 2}, Dims{5, 4, 3}, Dims{2, 1, 6}})
      for (Flags f : kAllFlags) {
        // 3-D x 2-D
        const Tensor a3 = Tensor::randn(stored(3, d.m, d.k, f.ta), dev(), seed++, dt);
        const Tensor b2 = Tensor::randn(stored(0, d.k, d.n, f.tb), dev(), seed++, dt);
        const Tensor c1 = matmul(a3, b2, f.ta, f.tb);
        ASSERT_EQ(c1.shape(), (Shape{3, d.m, d.n}));
        EXPECT_LE(array_error(c1.to_vector<double>(), naive_matmul(a3, b2, f.ta, f.tb), kEachElement),
                  tolerance_for(dt))
            << "3-D x 2-D " << dtype_name(dt) << " " << flags_str(f);
        // 2-D x 3-D
        const Tensor a2 = Tensor::randn(stored(0, d.m, d.k, f.ta), dev(), seed++, dt);
        const Tensor b3 = Tensor::randn(stored(3, d.k, d.n, f.tb), dev(), seed++, dt);
        const Tensor c2 = matmul(a2, b3, f.ta, f.tb);
        ASSERT_EQ(c2.shape(), (Shape{3, d.m, d.n}));
        EXPECT_LE(array_error(c2.to_vector<double>(), naive_matmul(a2, b3, f.ta, f.tb), kEachElement),
                  tolerance_for(dt))
            << "2-D x 3-D " << dtype_name(dt) << " " << flags_str(f);
      }
}

TEST_P(Matmul, Float32StaysFloat32WithoutTf32Rounding) {
  // TF32 keeps 10 mantissa bits: relative errors near 1e-3 on a k = 1024 product. Full fp32
  // accumulation stays near 1e-6; the bound below separates the two by two orders of magnitude.
  const Tensor a = Tensor::randn(Shape{64, 1024}, dev(), 7);
  const Tensor b = Tensor::randn(Shape{1024, 48}, dev(), 8);
  const std::vector<double> want = naive_matmul(a, b, false, false);
  const std::vector<double> got = matmul(a, b).to_vector<double>();
  // Scale by the typical magnitude sqrt(k) so the bound is relative for every element.
  double worst = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i)
    worst = std::fmax(worst, std::fabs(got[i] - want[i]) / std::sqrt(1024.0));
  EXPECT_LT(worst, 1e-5);
}

TEST_P(Matmul, EmptyInnerDimensionGivesZerosAndEmptyOuterGivesEmpty) {
  for (Flags f : kAllFlags) {
    const Tensor a = Tensor::randn(stored(0, 3, 0, f.ta), dev(), 1);
    const Tensor b = Tensor::randn(stored(0, 0, 4, f.tb), dev(), 2);
    const Tensor c = matmul(a, b, f.ta, f.tb);
    ASSERT_EQ(c.shape(), (Shape{3, 4}));
    for (double v : c.to_vector<double>()) EXPECT_EQ(v, 0.0) << flags_str(f);
    const Tensor a3 = Tensor::randn(stored(2, 3, 0, f.ta), dev(), 3);
    const Tensor c3 = matmul(a3, b, f.ta, f.tb);
    ASSERT_EQ(c3.shape(), (Shape{2, 3, 4}));
    for (double v : c3.to_vector<double>()) EXPECT_EQ(v, 0.0) << flags_str(f);
  }
  EXPECT_EQ(matmul(Tensor::zeros(Shape{0, 5}, DType::float32, dev()),
                   Tensor::zeros(Shape{5, 3}, DType::float32, dev()))
                .shape(),
            (Shape{0, 3}));
  EXPECT_EQ(matmul(Tensor::zeros(Shape{0, 2, 5}, DType::float32, dev()),
                   Tensor::zeros(Shape{0, 5, 3}, DType::float32, dev()))
                .shape(),
            (Shape{0, 2, 3}));
}

// ---- gradients ------------------------------------------------------------------------------------

void expect_gradients_match(Device dev, const Shape& as, const Shape& bs, Flags f, std::uint64_t seed) {
  const auto fn = [f](const std::vector<Var>& v) { return matmul(v[0], v[1], f.ta, f.tb); };
  const GradCheckResult r = check_gradients(
      fn, {Tensor::randn(as, dev, seed, DType::float64), Tensor::randn(bs, dev, seed + 1, DType::float64)});
  EXPECT_TRUE(r.ok) << "a " << as.str() << " b " << bs.str() << " " << flags_str(f) << ": "
                    << r.message;
}

TEST_P(Matmul, GradientMatchesFiniteDifferences) {
  std::uint64_t seed = 300;
  for (const Dims& d : kShapes)
    for (Flags f : kAllFlags)
      expect_gradients_match(dev(), stored(0, d.m, d.k, f.ta), stored(0, d.k, d.n, f.tb), f,
                             seed += 2);
}

TEST_P(Matmul, BatchedGradientMatchesFiniteDifferences) {
  std::uint64_t seed = 400;
  for (std::int64_t batch : {1, 3})
    for (const Dims& d : {Dims{1, 1, 1}, Dims{3, 5, 2}, Dims{4, 1, 3}})
      for (Flags f : kAllFlags)
        expect_gradients_match(dev(), stored(batch, d.m, d.k, f.ta), stored(batch, d.k, d.n, f.tb), f,
                               seed += 2);
}

TEST_P(Matmul, SharedOperandGradientSumsOverTheBatch) {
  std::uint64_t seed = 500;
  for (const Dims& d : {Dims{1, 1, 1}, Dims{3, 5, 2}, Dims{2, 1, 4}})
    for (Flags f : kAllFlags) {
      expect_gradients_match(dev(), stored(3, d.m, d.k, f.ta), stored(0, d.k, d.n, f.tb), f,
                             seed += 2);  // 3-D x 2-D
      expect_gradients_match(dev(), stored(0, d.m, d.k, f.ta), stored(3, d.k, d.n, f.tb), f,
                             seed += 2);  // 2-D x 3-D
    }
}

TEST_P(Matmul, GradientOfAChainAccumulatesIntoSharedInputs) {
  // x used twice: y = (x W) W^T, the gradient of x sums both paths; W appears twice as well.
  const auto fn = [](const std::vector<Var>& v) {
    return matmul(matmul(v[0], v[1]), v[1], false, true);
  };
  const GradCheckResult r = check_gradients(
      fn, {Tensor::randn(Shape{4, 3}, dev(), 1, DType::float64),
           Tensor::randn(Shape{3, 5}, dev(), 2, DType::float64)});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST_P(Matmul, OnlyOperandsThatRequireGradientsGetThem) {
  const Var a = Var::param(Tensor::randn(Shape{3, 4}, dev(), 1, DType::float64));
  const Tensor b = Tensor::randn(Shape{4, 2}, dev(), 2, DType::float64);
  const Var c = matmul(a, b);  // Var x Tensor mixes freely
  EXPECT_TRUE(c.requires_grad());
  c.backward(Tensor::ones(Shape{3, 2}, DType::float64, dev()));
  ASSERT_TRUE(a.has_grad());
  // d/da sum(a b) = 1 b^T: every row of the gradient is the row sums of b.
  const std::vector<double> bv = b.to_vector<double>(), g = a.grad().to_vector<double>();
  for (int i = 0; i < 3; ++i)
    for (int p = 0; p < 4; ++p)
      EXPECT_NEAR(g[static_cast<std::size_t>(i * 4 + p)], bv[static_cast<std::size_t>(p * 2)] + bv[static_cast<std::size_t>(p * 2 + 1)], 1e-12);

  const Var constant_result = matmul(Var(b), Var(Tensor::randn(Shape{2, 5}, dev(), 3, DType::float64)));
  EXPECT_FALSE(constant_result.requires_grad());
  EXPECT_TRUE(constant_result.is_leaf());
}

TEST_P(Matmul, TensorOverloadAndNoGradGuardRecordNothing) {
  const Tensor a = Tensor::randn(Shape{5, 3}, dev(), 1);
  const Tensor b = Tensor::randn(Shape{3, 2}, dev(), 2);
  static_assert(std::is_same_v<decltype(matmul(a, b)), Tensor>);
  static_assert(std::is_same_v<decltype(matmul(Var(a), b)), Var>);
  const auto before = autograd_stats().nodes_created;
  const Tensor c = matmul(a, b, false, false);
  const Var p = Var::param(a);
  {
    NoGradGuard guard;
    const Var d = matmul(p, b);
    EXPECT_FALSE(d.requires_grad());
  }
  EXPECT_EQ(autograd_stats().nodes_created, before);
  const Var e = matmul(p, b);
  EXPECT_EQ(autograd_stats().nodes_created, before + 1);
  EXPECT_LE(array_error(c.to_vector<double>(), e.value().to_vector<double>(), kEachElement), 0.0);
}

// ---- errors ---------------------------------------------------------------------------------------

/// Expects `fn` to throw dualcast::Error whose message contains every one of `parts`.
template <class Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no dualcast::Error thrown (expected one mentioning " << parts.at(0) << ")";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const auto& p : parts) EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' not in: " << what;
  }
}

TEST_P(Matmul, BadArgumentsRaiseErrorsNamingShapesAndTheNextMatmulStillWorks) {
  const Device d = dev();
  const Tensor a23 = Tensor::randn(Shape{2, 3}, d, 1);
  const Tensor b43 = Tensor::randn(Shape{4, 3}, d, 2);
  expect_error([&] { (void)matmul(a23, b43); }, {"matmul", "inner dimensions", "[2, 3]", "[4, 3]"});
  expect_error([&] { (void)matmul(a23, Tensor::randn(Shape{2, 5}, d, 3), false, true); },
               {"matmul", "inner dimensions", "trans_b=true"});
  expect_error([&] { (void)matmul(Tensor::randn(Shape{3}, d, 1), a23); }, {"matmul", "'a'", "[3]", "rank 1"});
  expect_error([&] { (void)matmul(a23, Tensor::randn(Shape{1, 1, 3, 2}, d, 1)); },
               {"matmul", "'b'", "[1, 1, 3, 2]"});
  expect_error([&] { (void)matmul(Tensor::randn(Shape{2, 2, 3}, d, 1), Tensor::randn(Shape{3, 3, 4}, d, 2)); },
               {"matmul", "batch", "[2, 2, 3]", "[3, 3, 4]"});
  expect_error([&] { (void)matmul(a23, Tensor::randn(Shape{3, 2}, d, 1, DType::float64)); },
               {"matmul", "dtype", "float32", "float64"});
  expect_error([&] {
    (void)matmul(Tensor::zeros(Shape{2, 3}, DType::uint8, d), Tensor::zeros(Shape{3, 2}, DType::uint8, d));
  }, {"matmul", "uint8"});
  expect_error([&] { (void)matmul(Tensor(), a23); }, {"matmul", "'a'", "undefined"});
  expect_error([&] { (void)matmul(Var(), Var(a23)); }, {"matmul", "undefined"});
  if (cuda_available()) {
    const Device other = d.is_cpu() ? Device::cuda(0) : Device::cpu();
    expect_error([&] { (void)matmul(a23, Tensor::randn(Shape{3, 2}, other, 1)); }, {"matmul", "devices"});
  }
  EXPECT_THROW((void)matmul(Var::param(a23), Var::param(b43)), Error);
  // Nothing is left broken: a valid product right after the failures is correct.
  const Tensor b32 = Tensor::randn(Shape{3, 2}, d, 5);
  EXPECT_LE(array_error(matmul(a23, b32).to_vector<double>(), naive_matmul(a23, b32, false, false), kEachElement),
            kGradTolFloat);
}

// ---- CPU vs GPU -----------------------------------------------------------------------------------

TEST_P(Matmul, GpuMatchesCpuOnTheSameSeededInputs) {
  if (!dev().is_cuda()) GTEST_SKIP() << "compares a CUDA device against the CPU";
  for (Flags f : kAllFlags)
    for (const auto& [as, bs] : {std::pair{Shape{37, 129}, Shape{129, 65}},
                                 std::pair{Shape{4, 33, 17}, Shape{4, 17, 9}},
                                 std::pair{Shape{4, 33, 17}, Shape{17, 9}},
                                 std::pair{Shape{33, 17}, Shape{4, 17, 9}}}) {
      Shape sa = as, sb = bs;
      if (f.ta) std::swap(sa[sa.rank() - 1], sa[sa.rank() - 2]);
      if (f.tb) std::swap(sb[sb.rank() - 1], sb[sb.rank() - 2]);
      // Forward and both gradients, fp32, on each device from the same seeds.
      std::vector<std::vector<double>> results[2];
      int slot = 0;
      for (Device d : {Device::cpu(), dev()}) {
        const Var a = Var::param(Tensor::randn(sa, d, 11));
        const Var b = Var::param(Tensor::randn(sb, d, 12));
        const Var c = matmul(a, b, f.ta, f.tb);
        c.backward(Tensor::randn(c.shape(), d, 13));
        results[slot++] = {c.value().to_vector<double>(), a.grad().to_vector<double>(),
                           b.grad().to_vector<double>()};
      }
      for (int r = 0; r < 3; ++r)
        EXPECT_LE(array_error(results[1][static_cast<std::size_t>(r)],
                              results[0][static_cast<std::size_t>(r)], kEachElement),
                  kSameResultTolFloat)
            << "result " << r << " a " << sa.str() << " b " << sb.str() << " " << flags_str(f);
    }
}

TEST_P(Matmul, ConcurrentCallersShareOneBlasHandlePerDevice) {
  const Tensor a = Tensor::randn(Shape{16, 8}, dev(), 1);
  const Tensor b = Tensor::randn(Shape{8, 4}, dev(), 2);
  const std::vector<double> want = naive_matmul(a, b, false, false);
  std::vector<double> worst(4, 0.0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        const std::vector<double> got = matmul(a, b).to_vector<double>();
        for (std::size_t j = 0; j < got.size(); ++j)
          worst[static_cast<std::size_t>(t)] =
              std::fmax(worst[static_cast<std::size_t>(t)], relative_error(got[j], want[j]));
      }
    });
  for (auto& th : threads) th.join();
  for (double w : worst) EXPECT_LE(w, kGradTolFloat);
  if (dev().is_cuda()) EXPECT_EQ(detail::cublas_handles_created(), 1);
  else EXPECT_LE(detail::cublas_handles_created(), cuda_device_count());
}

INSTANTIATE_TEST_SUITE_P(Devices, Matmul, ::testing::ValuesIn(dualcast::testing::all_devices()),
                         [](const ::testing::TestParamInfo<Device>& info) {
                           return std::string(dualcast::testing::device_label(info.param));
                         });

}  // namespace
