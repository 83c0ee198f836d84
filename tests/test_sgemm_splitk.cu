// test_sgemm_splitk.cu: dualcast's split-K float32 product for few rows (src/sgemm_splitk.hpp), GPU
// only: values against a double reference on odd shapes of both layouts, alpha, beta and pitches wider
// than the rows (padding untouched, C never read when beta is 0), the same bits on every run and
// under graph replay, matmul's gradients through it equal to the CPU's, and the measured choice made
// once per shape (cuBLAS kept for a shape first met inside a capture).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "../src/blas.hpp"
#include "../src/sgemm_splitk.hpp"
#include "dualcast/gradcheck.hpp"
#include "dualcast/graph.hpp"
#include "dualcast/ops/linalg.hpp"
#include "test_util.hpp"

using namespace dualcast;

namespace {

/// A float32 sum of K products carries about sqrt(K) roundings of its terms' magnitude; this many
/// times that is the tolerance (a missing or doubled term is ~1/K of the scale: far outside it for
/// every K tested).
constexpr double kRoundingsPerSqrtK = 16.0;
constexpr double kFloatUlp = 5.9604644775390625e-8;  // 2^-24

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "the split-K kernel runs on CUDA devices"

/// Sets the mode for one test and restores the one found.
struct ModeGuard {
  detail::SplitKMode was = detail::splitk_mode();
  explicit ModeGuard(detail::SplitKMode m) { detail::set_splitk_mode(m); }
  ~ModeGuard() { detail::set_splitk_mode(was); }
};

struct Case {
  bool tb;
  int M, N, K;
  int pad_a = 0, pad_b = 0, pad_c = 0;  // extra elements per row beyond the used width
  float alpha = 1.f, beta = 0.f;
};

/// The operands as host vectors and device tensors of their padded storage.
struct Operands {
  Case c;
  int lda, ldb, ldc, b_rows;
  std::vector<float> a, b, c0;
  Tensor da, db, dc;

  explicit Operands(const Case& cs, std::uint64_t seed) : c(cs) {
    lda = c.K + c.pad_a;
    ldb = (c.tb ? c.K : c.N) + c.pad_b;
    ldc = c.N + c.pad_c;
    b_rows = c.tb ? c.N : c.K;
    const Device g = Device::cuda(0);
    // The operands' padding is NaN: a read past a row's width would poison the result.
    a = with_nan_padding(Tensor::randn(Shape{c.M, lda}, Device::cpu(), seed), c.K);
    b = with_nan_padding(Tensor::randn(Shape{b_rows, ldb}, Device::cpu(), seed + 1), c.tb ? c.K : c.N);
    da = Tensor::from_vector(Shape{c.M, lda}, a, g);
    db = Tensor::from_vector(Shape{b_rows, ldb}, b, g);
    // beta == 0: C starts as NaN, which must never reach the result. Otherwise random.
    dc = c.beta == 0.f ? Tensor::full(Shape{c.M, ldc}, std::numeric_limits<double>::quiet_NaN(), DType::float32, g)
                       : Tensor::randn(Shape{c.M, ldc}, g, seed + 2);
    c0 = dc.to_vector<float>();
  }

  static std::vector<float> with_nan_padding(const Tensor& t, int width) {
    std::vector<float> v = t.to_vector<float>();
    const auto ld = static_cast<std::size_t>(t.shape()[1]);
    for (std::size_t i = 0; i < v.size(); ++i)
      if (i % ld >= static_cast<std::size_t>(width)) v[i] = std::numeric_limits<float>::quiet_NaN();
    return v;
  }

  void run() {
    detail::gemm(Device::cuda(0), DType::float32, false, c.tb, c.M, c.N, c.K, c.alpha, da.raw_data(), lda, 0,
                 db.raw_data(), ldb, 0, c.beta, dc.raw_data(), ldc, 0, 1);
  }

  /// Worst |got - want| / scale over the used elements (scale: |alpha| sum |a b| + |beta c0|), and
  /// whether the padding of C kept its values.
  double error(const std::vector<float>& got, bool* padding_kept) const {
    double worst = 0.0;
    *padding_kept = true;
    for (int m = 0; m < c.M; ++m) {
      for (int n = 0; n < ldc; ++n) {
        const std::size_t ci = static_cast<std::size_t>(m) * ldc + n;
        if (n >= c.N) {
          const bool same = got[ci] == c0[ci] || (std::isnan(got[ci]) && std::isnan(c0[ci]));
          *padding_kept = *padding_kept && same;
          continue;
        }
        double want = 0.0, scale = 0.0;
        for (int k = 0; k < c.K; ++k) {
          const double x = a[static_cast<std::size_t>(m) * lda + k];
          const double y = c.tb ? b[static_cast<std::size_t>(n) * ldb + k] : b[static_cast<std::size_t>(k) * ldb + n];
          want += x * y;
          scale += std::fabs(x * y);
        }
        want *= c.alpha;
        scale *= std::fabs(c.alpha);
        if (c.beta != 0.f) {
          want += c.beta * static_cast<double>(c0[ci]);
          scale += std::fabs(c.beta * static_cast<double>(c0[ci]));
        }
        const double e = std::fabs(got[ci] - want) / (scale > 0 ? scale : 1.0);
        worst = std::isnan(got[ci]) ? std::numeric_limits<double>::infinity() : std::fmax(worst, e);
      }
    }
    return worst;
  }
};

double tolerance(int K) { return kRoundingsPerSqrtK * std::sqrt(static_cast<double>(K)) * kFloatUlp; }

void expect_correct(const Case& cs, std::uint64_t seed) {
  ASSERT_TRUE(detail::splitk_applies(Device::cuda(0), cs.tb, cs.M, cs.N, cs.K))
      << "M=" << cs.M << " N=" << cs.N << " K=" << cs.K << " would not test the split-K kernel";
  Operands o(cs, seed);
  o.run();
  bool padding_kept = false;
  const double err = o.error(o.dc.to_vector<float>(), &padding_kept);
  EXPECT_LE(err, tolerance(cs.K)) << "tb=" << cs.tb << " M=" << cs.M << " N=" << cs.N << " K=" << cs.K
                                  << " alpha=" << cs.alpha << " beta=" << cs.beta;
  EXPECT_TRUE(padding_kept) << "the product wrote C's padding (ldc=" << o.ldc << ", N=" << cs.N << ")";
}

TEST(SplitKProduct, MatchesTheDoubleReferenceOnOddShapesOfBothLayouts) {
  SKIP_WITHOUT_GPU();
  const ModeGuard mode(detail::SplitKMode::always);
  // The HM-LSTM's forward and input-gradient products, a single row, rows and columns off the tile
  // grid, K not a multiple of the 16-deep slices, two and four row tiles.
  const int shapes[][3] = {{7, 129, 77},     {1, 128, 64},     {65, 300, 1000}, {130, 257, 513},
                           {64, 2049, 1540}, {64, 1540, 2049}, {64, 2049, 1028}, {256, 200, 4099}};
  // Under compute-sanitizer the first four (every edge case, shorter launches).
  const int count = dualcast::testing::unless_sanitizing(8, 4);
  std::uint64_t seed = 10;
  for (bool tb : {false, true})
    for (int i = 0; i < count; ++i) expect_correct(Case{tb, shapes[i][0], shapes[i][1], shapes[i][2]}, seed += 3);
}

TEST(SplitKProduct, AppliesAlphaBetaAndPitchesWiderThanTheRows) {
  SKIP_WITHOUT_GPU();
  const ModeGuard mode(detail::SplitKMode::always);
  std::uint64_t seed = 100;
  for (bool tb : {false, true}) {
    expect_correct(Case{tb, 64, 2049, 1540, 3, 5, 7, 0.5f, -1.25f}, seed += 3);  // reads and scales C
    expect_correct(Case{tb, 33, 190, 250, 1, 2, 9, -2.f, 0.f}, seed += 3);       // C is NaN: never read
    expect_correct(Case{tb, 256, 4300, 100, 0, 0, 0, 1.f, 1.f}, seed += 3);      // 272 tiles: K unsplit
  }
}

TEST(SplitKProduct, GivesTheSameBitsOnEveryRunAndUnderGraphReplay) {
  SKIP_WITHOUT_GPU();
  const ModeGuard mode(detail::SplitKMode::always);
  const Device g = Device::cuda(0);
  const Tensor a = Tensor::randn(Shape{64, 1540}, g, 7), b = Tensor::randn(Shape{1540, 2049}, g, 8);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Into a NaN-filled C each time: a launch that skipped its sums (a tile counter not back at zero
  // after the launch before) would leave NaN, not the previous run's values.
  Tensor c = Tensor::full(Shape{64, 2049}, nan, DType::float32, g);
  const auto product = [&] {
    detail::gemm(g, DType::float32, false, false, 64, 2049, 1540, 1.0, a.raw_data(), 1540, 0, b.raw_data(), 2049,
                 0, 0.0, c.raw_data(), 2049, 0, 1);
  };
  product();
  const std::vector<float> first = c.to_vector<float>();
  for (float v : first) ASSERT_FALSE(std::isnan(v));
  for (int i = 0; i < 3; ++i) {
    c.fill_(nan);
    product();
    EXPECT_EQ(c.to_vector<float>(), first) << "run " << i;
  }
  Graph graph;
  graph.capture(g, product);
  for (int i = 0; i < 3; ++i) {
    c.fill_(nan);
    graph.replay();
    EXPECT_EQ(c.to_vector<float>(), first) << "replay " << i;
  }
}

TEST(SplitKProduct, MatmulGradientsThroughItMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const ModeGuard mode(detail::SplitKMode::always);
  // Forward C = X W and the input gradient dX = dC W^T take the kernel; dW = X^T dC stays cuBLAS.
  std::vector<std::vector<double>> results[2];
  int slot = 0;
  for (Device d : {Device::cpu(), Device::cuda(0)}) {
    const Var x = Var::param(Tensor::randn(Shape{64, 515}, d, 21));
    const Var w = Var::param(Tensor::randn(Shape{515, 1025}, d, 22));
    const Var c = matmul(x, w);
    c.backward(Tensor::randn(c.shape(), d, 23));
    results[slot++] = {c.value().to_vector<double>(), x.grad().to_vector<double>(), w.grad().to_vector<double>()};
  }
  for (int r = 0; r < 3; ++r)
    EXPECT_LE(array_error(results[1][static_cast<std::size_t>(r)], results[0][static_cast<std::size_t>(r)],
                          ErrorScale::largest),
              kSameResultTolFloat)
        << "result " << r;
}

TEST(SplitKProduct, MeasuredModeDecidesEachShapeOnceAndKeepsCublasForAShapeFirstCaptured) {
  SKIP_WITHOUT_GPU();
  const ModeGuard mode(detail::SplitKMode::measured);
  const Device g = Device::cuda(0);
  // (Counts decisions of this process: ctest runs each test in a process of its own.)
  const Tensor a = Tensor::randn(Shape{64, 777}, g, 31), b = Tensor::randn(Shape{777, 1111}, g, 32);
  const auto before = detail::splitk_decisions();
  const std::vector<float> eager = matmul(a, b).to_vector<float>();
  (void)matmul(a, b).to_vector<float>();
  const auto after = detail::splitk_decisions();
  EXPECT_EQ((after.own - before.own) + (after.cublas - before.cublas), 1) << "one measurement for one shape";
  EXPECT_EQ(matmul(a, b).to_vector<float>(), eager) << "the decision is kept: the same bits";

  // A new shape met first inside a capture: cuBLAS, kept, so eager calls afterwards match the graph.
  const Tensor a2 = Tensor::randn(Shape{64, 779}, g, 33), b2 = Tensor::randn(Shape{779, 1111}, g, 34);
  Tensor out;
  Graph graph;
  graph.capture(g, [&] { out = matmul(a2, b2); });
  const auto captured = detail::splitk_decisions();
  EXPECT_EQ(captured.cublas - after.cublas, 1);
  EXPECT_EQ(captured.own, after.own);
  graph.replay();
  EXPECT_EQ(matmul(a2, b2).to_vector<float>(), out.to_vector<float>());
  EXPECT_EQ(detail::splitk_decisions().cublas, captured.cublas) << "no second decision for the captured shape";
}

TEST(SplitKProduct, IsOffForOtherShapesAndWhenSwitchedOff) {
  SKIP_WITHOUT_GPU();
  const Device g = Device::cuda(0);
  {
    const ModeGuard mode(detail::SplitKMode::always);
    EXPECT_FALSE(detail::splitk_applies(g, false, 257, 2049, 1540)) << "more than a few rows";
    EXPECT_FALSE(detail::splitk_applies(g, false, 64, 100, 1540)) << "too few columns";
    EXPECT_FALSE(detail::splitk_applies(g, false, 64, 2049, 32)) << "too shallow";
    EXPECT_TRUE(detail::splitk_applies(g, false, 64, 2049, 1540));
  }
  const ModeGuard mode(detail::SplitKMode::off);
  EXPECT_FALSE(detail::splitk_applies(g, false, 64, 2049, 1540));
}

}  // namespace
