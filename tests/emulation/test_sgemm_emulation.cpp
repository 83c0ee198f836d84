// test_sgemm_emulation.cpp: the split-K float32 product's kernel (src/sgemm_splitk_kernel.cuh), its
// very code, run on the CPU under cuda_emulation.hpp, against a double reference: both operand
// layouts, rows, columns and depth off the tile grid, several chunks of K and one, alpha, beta and
// pitches wider than the rows (padding untouched, C never read when beta is 0), the tile counters back
// at zero after every launch, no asynchronous copy left unwaited, and the same bits whichever block of
// a tile finishes last (blocks run in both orders). test_sgemm_splitk.cu checks the same on a device.
#include <gtest/gtest.h>

#include "cuda_emulation.hpp"
// the emulation must come first
#define DUALCAST_SGEMM_EMULATION 1
#include "sgemm_splitk_kernel.cuh"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

namespace k = dualcast::detail::sgemm_kernels;

/// As test_sgemm_splitk.cu: this many float32 roundings per sqrt(K) of the terms' magnitude.
constexpr double kRoundingsPerSqrtK = 16.0;
constexpr double kFloatUlp = 5.9604644775390625e-8;  // 2^-24

struct Case {
  bool tb;
  int M, N, K;
  int sms;  // the plan's SM count: sets how many chunks K is cut into
  int pad_a = 0, pad_b = 0, pad_c = 0;
  float alpha = 1.f, beta = 0.f;
};

struct Run {
  std::vector<float> c;
  long unwaited = 0;
  bool counters_zero = true;
  int splits = 0;
};

Run run(const Case& cs, const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& c0,
        bool reverse) {
  const int lda = cs.K + cs.pad_a, ldb = (cs.tb ? cs.K : cs.N) + cs.pad_b, ldc = cs.N + cs.pad_c;
  const std::size_t ws_floats = std::size_t{1} << 20;
  const k::Plan pl = k::plan(cs.sms, cs.M, cs.N, cs.K, ws_floats);
  Run r;
  r.c = c0;
  r.splits = pl.splits;
  if (pl.splits == 0) return r;
  std::vector<float> ws(ws_floats, std::numeric_limits<float>::quiet_NaN());
  std::vector<unsigned> counters(k::kMaxTiles, 0u);
  const k::Args p{a.data(), b.data(), r.c.data(), ws.data(), counters.data(), cs.M, cs.N, cs.K, lda, ldb, ldc,
                  pl.chunk, pl.splits, cs.alpha, cs.beta};
  const long before = emu::unwaited_copies.load();
  emu::reverse_blocks = reverse;
  const EmuDim3 grid{static_cast<unsigned>(pl.tiles_n), static_cast<unsigned>(pl.tiles_m),
                     static_cast<unsigned>(pl.splits)};
  if (cs.tb) emu::launch3(&k::splitk_kernel<true>, grid, k::kThreads, 0, p);
  else emu::launch3(&k::splitk_kernel<false>, grid, k::kThreads, 0, p);
  emu::reverse_blocks = false;
  r.unwaited = emu::unwaited_copies.load() - before;
  for (unsigned v : counters) r.counters_zero = r.counters_zero && v == 0u;
  return r;
}

void check(const Case& cs, std::uint64_t seed, int want_splits_at_least) {
  const int lda = cs.K + cs.pad_a, ldb = (cs.tb ? cs.K : cs.N) + cs.pad_b, ldc = cs.N + cs.pad_c;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> a(static_cast<std::size_t>(cs.M) * lda), b(static_cast<std::size_t>(cs.tb ? cs.N : cs.K) * ldb),
      c0(static_cast<std::size_t>(cs.M) * ldc);
  for (float& v : a) v = normal(rng);
  for (float& v : b) v = normal(rng);
  for (float& v : c0) v = cs.beta == 0.f ? std::numeric_limits<float>::quiet_NaN() : normal(rng);

  const Run fwd = run(cs, a, b, c0, false), rev = run(cs, a, b, c0, true);
  const std::string what = "tb=" + std::to_string(cs.tb) + " M=" + std::to_string(cs.M) + " N=" +
                           std::to_string(cs.N) + " K=" + std::to_string(cs.K);
  ASSERT_GE(fwd.splits, want_splits_at_least) << what << ": the plan does not test what this case is for";
  EXPECT_EQ(fwd.unwaited, 0) << what;
  EXPECT_TRUE(fwd.counters_zero && rev.counters_zero) << what << ": a tile counter was not reset";
  // Bit for bit (memcmp: the NaN padding of a beta = 0 case compares equal to itself).
  EXPECT_EQ(std::memcmp(fwd.c.data(), rev.c.data(), fwd.c.size() * sizeof(float)), 0)
      << what << ": the sums depend on which block finished last";

  const double tol = kRoundingsPerSqrtK * std::sqrt(static_cast<double>(cs.K)) * kFloatUlp;
  double worst = 0.0;
  bool padding_kept = true;
  for (int m = 0; m < cs.M; ++m)
    for (int n = 0; n < ldc; ++n) {
      const std::size_t ci = static_cast<std::size_t>(m) * ldc + n;
      const float got = fwd.c[ci];
      if (n >= cs.N) {
        padding_kept = padding_kept && (got == c0[ci] || (std::isnan(got) && std::isnan(c0[ci])));
        continue;
      }
      double want = 0.0, scale = 0.0;
      for (int kk = 0; kk < cs.K; ++kk) {
        const double x = a[static_cast<std::size_t>(m) * lda + kk];
        const double y = cs.tb ? b[static_cast<std::size_t>(n) * ldb + kk] : b[static_cast<std::size_t>(kk) * ldb + n];
        want += x * y;
        scale += std::fabs(x * y);
      }
      want = cs.alpha * want + (cs.beta != 0.f ? cs.beta * static_cast<double>(c0[ci]) : 0.0);
      scale = std::fabs(cs.alpha) * scale + (cs.beta != 0.f ? std::fabs(cs.beta * static_cast<double>(c0[ci])) : 0.0);
      worst = std::isnan(got) ? std::numeric_limits<double>::infinity()
                              : std::fmax(worst, std::fabs(got - want) / (scale > 0 ? scale : 1.0));
    }
  EXPECT_LE(worst, tol) << what;
  EXPECT_TRUE(padding_kept) << what << ": C's padding was written";
}

TEST(SplitKProductEmulated, MatchesTheDoubleReferenceWithKCutIntoChunks) {
  std::uint64_t seed = 1;
  for (bool tb : {false, true}) {
    check(Case{tb, 64, 200, 300, 16}, seed++, 4);   // 4 column tiles, K in 7 chunks of 48
    check(Case{tb, 7, 129, 77, 8}, seed++, 2);      // rows, columns and depth off the tile grid
    check(Case{tb, 130, 150, 96, 12}, seed++, 2);   // three row tiles
  }
}

TEST(SplitKProductEmulated, RunsUnsplitWhenTheTilesFillTheGpu) {
  for (bool tb : {false, true}) check(Case{tb, 130, 257, 100, 2}, 20 + tb, 1);
}

TEST(SplitKProductEmulated, AppliesAlphaBetaAndPitchesWiderThanTheRows) {
  std::uint64_t seed = 40;
  for (bool tb : {false, true}) {
    check(Case{tb, 33, 150, 90, 12, 3, 5, 7, 0.5f, -1.25f}, seed++, 2);  // C read and scaled
    check(Case{tb, 33, 150, 90, 12, 1, 2, 9, -2.f, 0.f}, seed++, 2);     // C is NaN: never read
    check(Case{tb, 65, 140, 70, 1, 2, 3, 4, 1.f, 1.f}, seed++, 1);       // unsplit, C read
  }
}

TEST(SplitKProductEmulated, PlanSplitsKForTwoBlocksPerSmAndRefusesOtherShapes) {
  // The HM-LSTM's forward product on 132 SMs: 33 column tiles, K = 1540 in 8 chunks of 208.
  const k::Plan p = k::plan(132, 64, 2049, 1540, std::size_t{4} << 20);
  EXPECT_EQ(p.tiles_n, 33);
  EXPECT_EQ(p.tiles_m, 1);
  EXPECT_EQ(p.splits, 8);
  EXPECT_EQ(p.chunk, 208);
  EXPECT_EQ(p.chunk % k::kBK, 0);
  EXPECT_EQ(k::plan(132, 257, 2049, 1540, std::size_t{4} << 20).splits, 0) << "too many rows";
  EXPECT_EQ(k::plan(132, 64, 127, 1540, std::size_t{4} << 20).splits, 0) << "too few columns";
  EXPECT_EQ(k::plan(132, 64, 2049, 63, std::size_t{4} << 20).splits, 0) << "too shallow";
  // A workspace too small for the split it wants gets fewer chunks, never an overflow.
  const k::Plan small = k::plan(132, 64, 2049, 1540, std::size_t{33} * k::kTile * 3);
  EXPECT_EQ(small.splits, 3);
}

}  // namespace
