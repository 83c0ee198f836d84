// test_attention_emulation.cpp: the fused attention kernels (src/attention_kernels.cuh), their very
// code, run on the CPU under cuda_emulation.hpp, against a float64 reference of the output, the
// log-sum-exp and the three gradients. Every tile shape the launchers use (float32 and float64, head
// dims padded to 32, 64, 128, both float32 forward tile heights), causal and all mask kinds,
// lengths that are no multiple of any tile, fully masked rows, head dims that are no multiple of 4
// (the scalar paths); no 16-byte access may be misaligned, no asynchronous copy left unwaited. This
// is how the kernels' logic is checked on machines without a GPU (CI); the CUDA tests in
// test_attention.cu check the same on a device.
#include <gtest/gtest.h>

#include "cuda_emulation.hpp"
// the emulation must come first
#include "attention_kernels.cuh"
#include "attention_reference.hpp"
#include "dualcast/gradcheck.hpp"  // array_error

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace dualcast::attention_detail {
namespace {

using namespace kernels;
using testing::Case;
using testing::Reference;
using testing::reference;

template <class T, int D_PAD, int TM, int TK>
void run(const Case& c, unsigned seed) {
  SCOPED_TRACE(::testing::Message() << (sizeof(T) == 4 ? "float32" : "float64") << " D_PAD=" << D_PAD << " TM="
                                    << TM << " TK=" << TK << " B=" << c.B << " H=" << c.H << " Sq=" << c.Sq
                                    << " Sk=" << c.Sk << " D=" << c.D << " causal=" << c.causal
                                    << " mask=" << c.mask);
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal;
  const std::int64_t B = c.B, H = c.H, Sq = c.Sq, Sk = c.Sk, D = c.D;
  const auto values = [&](std::int64_t n) {
    std::vector<T> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = static_cast<T>(normal(gen));
    return v;
  };
  const std::vector<T> q = values(B * H * Sq * D), k = values(B * H * Sk * D), v = values(B * H * Sk * D),
                       dout = values(B * H * Sq * D);
  const auto wide = [](const std::vector<T>& a) { return std::vector<double>(a.begin(), a.end()); };

  testing::MaskData<T> md;
  testing::make_mask(c, gen, md);
  const MaskView mv = md.view;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const Reference ref = reference(c, wide(q), wide(k), wide(v), wide(dout), md.full, scale);
  emu::misaligned = 0;
  emu::unwaited_copies = 0;
  emu::out_of_smem = 0;
  emu::smem_races = 0;

  // Forward, as launch_forward does.
  std::vector<T> o(q.size(), T(777)), lse(static_cast<std::size_t>(B * H * Sq), T(777));
  FwdParams<T> fp{};
  fp.q = q.data();
  fp.k = k.data();
  fp.v = v.data();
  fp.o = o.data();
  fp.lse = lse.data();
  fp.mask = mv;
  fp.heads = B * H;
  fp.H = H;
  fp.Sq = Sq;
  fp.Sk = Sk;
  fp.D = D;
  fp.q_tiles = static_cast<int>((Sq + kWarps * 4 * TM - 1) / (kWarps * 4 * TM));
  fp.causal = c.causal;
  fp.vec = D % 4 == 0;
  fp.smul = static_cast<T>(scale * kLog2e);
  fp.mask_mul = static_cast<T>(kLog2e);
  emu::launch(&attention_forward_kernel<T, D_PAD, TM>, static_cast<unsigned>(fp.heads * fp.q_tiles), kThreads,
              fwd_smem_bytes<T, D_PAD, TM>(), fp);

  // Backward, as launch_backward does.
  const std::int64_t rows = B * H * Sq;
  std::vector<T> delta(static_cast<std::size_t>(rows), T(777));
  emu::launch(&attention_backward_delta_kernel<T>, static_cast<unsigned>((rows + 7) / 8), 256u, 0,
              static_cast<const T*>(o.data()), static_cast<const T*>(dout.data()), delta.data(), rows, D);
  std::vector<T> dq(q.size(), T(0)), dk(k.size(), T(777)), dv(v.size(), T(777));
  BwdParams<T> bp{};
  bp.q = q.data();
  bp.k = k.data();
  bp.v = v.data();
  bp.dout = dout.data();
  bp.lse = lse.data();
  bp.delta = delta.data();
  bp.dq = dq.data();
  bp.dk = dk.data();
  bp.dv = dv.data();
  bp.mask = mv;
  bp.heads = B * H;
  bp.H = H;
  bp.Sq = Sq;
  bp.Sk = Sk;
  bp.D = D;
  bp.k_tiles = static_cast<int>((Sk + kWarps * 4 * TK - 1) / (kWarps * 4 * TK));
  bp.causal = c.causal;
  bp.vec = D % 4 == 0;
  bp.smul = static_cast<T>(scale * kLog2e);
  bp.mask_mul = static_cast<T>(kLog2e);
  bp.scale = static_cast<T>(scale);
  emu::launch(&attention_backward_kernel<T, D_PAD, TK>, static_cast<unsigned>(bp.heads * bp.k_tiles), kThreads,
              bwd_smem_bytes<T, D_PAD, TK>(), bp);

  // float32: the same sums in another order (kSameResultTolFloat); float64: rounding only.
  const double tol = sizeof(T) == 4 ? 1e-4 : 1e-12;
  EXPECT_LE(array_error(o, ref.o, ErrorScale::largest_or_one), tol) << "output";
  EXPECT_LE(array_error(lse, ref.lse2, ErrorScale::largest_or_one), tol) << "log-sum-exp";
  EXPECT_LE(array_error(dq, ref.dq, ErrorScale::largest_or_one), tol) << "dq";
  EXPECT_LE(array_error(dk, ref.dk, ErrorScale::largest_or_one), tol) << "dk";
  EXPECT_LE(array_error(dv, ref.dv, ErrorScale::largest_or_one), tol) << "dv";
  EXPECT_EQ(emu::misaligned.load(), 0) << "misaligned 16-byte accesses";
  EXPECT_EQ(emu::unwaited_copies.load(), 0) << "asynchronous copies never waited for";
  EXPECT_EQ(emu::out_of_smem.load(), 0) << "copies outside shared memory";
  EXPECT_EQ(emu::smem_races.load(), 0) << "copies into shared memory that another warp read between the same barriers";
}

/// Every tile shape the launchers use for this head dimension (attention_fused.cu: Config).
void run_all(const Case& c, unsigned seed) {
  if (c.D <= 32) {
    run<float, 32, 4, 4>(c, seed);
    run<double, 32, 4, 2>(c, seed + 1);
  } else if (c.D <= 64) {
    run<float, 64, 8, 4>(c, seed);
    run<float, 64, 4, 4>(c, seed + 1);
    run<double, 64, 4, 2>(c, seed + 2);
  } else {
    run<float, 128, 4, 2>(c, seed);
    run<double, 128, 2, 1>(c, seed + 1);
  }
}

TEST(AttentionKernelsEmulated, MatchReferenceWithoutMask) {
  run_all({1, 1, 5, 7, 4, false, 0}, 1);
  run_all({2, 1, 130, 67, 33, false, 0}, 2);
  run_all({1, 1, 1, 1, 1, false, 0}, 3);
}

TEST(AttentionKernelsEmulated, CausalMatchesReferenceAtLengthsThatAreNoMultipleOfAnyTile) {
  run_all({1, 2, 37, 37, 16, true, 0}, 10);
  run_all({2, 1, 130, 67, 33, true, 0}, 11);
  run_all({1, 1, 67, 150, 64, true, 0}, 12);
  run_all({1, 1, 200, 200, 80, true, 0}, 13);
}

// Tiles wholly inside Sq x Sk with nothing to mask skip the per-element checks (interior_tile);
// these lengths give every launcher tile shape such tiles, beside edge and diagonal ones, with and
// without the causal mask, at every padded head dimension and on the 16-byte (D % 4 == 0) path.
TEST(AttentionKernelsEmulated, InteriorTilesMatchReferenceAtEveryTileShape) {
  run_all({1, 1, 130, 130, 32, false, 0}, 30);
  run_all({1, 1, 129, 129, 30, true, 0}, 31);
  run_all({1, 1, 260, 200, 64, true, 0}, 32);
  run_all({1, 1, 200, 260, 64, false, 0}, 33);
  run_all({1, 1, 140, 140, 128, false, 0}, 34);
}

TEST(AttentionKernelsEmulated, MasksMatchReferenceAndFullyMaskedRowsGiveZeros) {
  run_all({2, 1, 70, 130, 64, false, 1}, 20);
  run_all({3, 2, 70, 45, 20, true, 1}, 21);
  run_all({2, 2, 67, 67, 64, true, 2}, 22);
  run_all({1, 2, 129, 65, 64, false, 3}, 23);
  run_all({1, 1, 40, 70, 100, false, 2}, 24);
}

}  // namespace
}  // namespace dualcast::attention_detail
