// test_attention_mma_emulation.cpp: the tensor-core attention kernels for 16-bit q, k, v
// (src/attention_mma.cuh), their very code, run on the CPU under cuda_emulation.hpp (which emulates
// ldmatrix and mma.sync from the PTX ISA's fragment layouts), against the float64 reference of the
// output, the log-sum-exp and the three gradients computed from the same 16-bit inputs. bfloat16
// and float16 at every padded head dimension (32, 64, 128), causal and every mask kind, lengths that
// are no multiple of any tile, fully masked rows; no ldmatrix row outside shared memory, no
// misaligned 16-byte access, no copy left unwaited. test_attention.cu checks the same on a device.
#include <gtest/gtest.h>

#include "cuda_emulation.hpp"
// the emulation must come first
#include "attention_mma.cuh"
#include "attention_reference.hpp"
#include "dualcast/gradcheck.hpp"  // array_error

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace dualcast::attention_detail {
namespace {

using namespace kernels;
using testing::Case;
using testing::Reference;

/// Largest error against the float64 reference (ErrorScale::largest_or_one) of the outputs and of
/// the gradients. The kernels round P and dS^T to 16 bits before the products that use them (as
/// FlashAttention-2 does) and store 16-bit outputs: a few units of the format's last place.
/// Measured under this emulation: bfloat16 at most 0.0033 (outputs) and 0.0062 (gradients), float16
/// 0.00037 and 0.00063; the same limits as test_attention_tensor_core.cu's on the GPU.
template <class T16>
constexpr double kOutTol = std::is_same_v<T16, bfloat16> ? 0.01 : 0.0015;
template <class T16>
constexpr double kGradTol = std::is_same_v<T16, bfloat16> ? 0.02 : 0.0025;
/// lse is float32 from float32 sums: the inputs' rounding is in the reference too.
constexpr double kLseTol = 1e-5;

template <class T16>
std::vector<double> wide(const std::vector<T16>& a) {
  std::vector<double> r(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) r[i] = static_cast<float>(a[i]);
  return r;
}

template <class T16, int D_PAD>
void run(const Case& c, unsigned seed) {
  SCOPED_TRACE(::testing::Message() << (std::is_same_v<T16, bfloat16> ? "bfloat16" : "float16")
                                    << " D_PAD=" << D_PAD << " B=" << c.B << " H=" << c.H << " Sq=" << c.Sq
                                    << " Sk=" << c.Sk << " D=" << c.D << " causal=" << c.causal
                                    << " mask=" << c.mask);
  ASSERT_EQ(c.D % 8, 0) << "the tensor-core path takes head dims that are multiples of 8";
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal;
  const std::int64_t B = c.B, H = c.H, Sq = c.Sq, Sk = c.Sk, D = c.D;
  const auto values = [&](std::int64_t n) {
    std::vector<T16> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = T16(static_cast<float>(normal(gen)));
    return v;
  };
  const std::vector<T16> q = values(B * H * Sq * D), k = values(B * H * Sk * D), v = values(B * H * Sk * D),
                         dout = values(B * H * Sq * D);
  testing::MaskData<float> md;
  testing::make_mask(c, gen, md);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const Reference ref = testing::reference(c, wide(q), wide(k), wide(v), wide(dout), md.full, scale);
  emu::misaligned = 0;
  emu::unwaited_copies = 0;
  emu::out_of_smem = 0;
  emu::smem_races = 0;

  // Forward, as the launcher does (outputs poisoned first).
  constexpr int BR = kWarps * 16 * kFwdAtoms<D_PAD>;
  std::vector<T16> o(q.size(), T16(777.f));
  std::vector<float> lse(static_cast<std::size_t>(B * H * Sq), 777.f);
  Dims dims;
  dims.B = B;
  dims.H = H;
  dims.Sq = Sq;
  dims.Sk = Sk;
  dims.D = dims.Dv = D;
  dims.causal = c.causal;
  dims.scale = scale;
  MmaFwdParams<T16> fp{mma_common(dims, md.view, q.data(), k.data(), v.data())};
  fp.o = o.data();
  fp.lse = lse.data();
  fp.q_tiles = static_cast<int>((Sq + BR - 1) / BR);
  emu::launch(&attention_forward_mma_kernel<T16, D_PAD>, static_cast<unsigned>(fp.heads * fp.q_tiles), kThreads,
              mma_fwd_smem_bytes<D_PAD>(), fp);

  // Backward, as the launcher does.
  const std::int64_t rows = B * H * Sq;
  std::vector<float> delta(static_cast<std::size_t>(rows), 777.f);
  emu::launch(&attention_delta16_kernel<T16>, static_cast<unsigned>((rows + 7) / 8), 256u, 0,
              static_cast<const T16*>(o.data()), static_cast<const T16*>(dout.data()), delta.data(), rows, D);
  std::vector<float> dq(q.size(), 0.f);
  std::vector<T16> dk(k.size(), T16(777.f)), dv(v.size(), T16(777.f));
  MmaBwdParams<T16> bp{mma_common(dims, md.view, q.data(), k.data(), v.data())};
  bp.dout = dout.data();
  bp.lse = lse.data();
  bp.delta = delta.data();
  bp.dq = dq.data();
  bp.dk = dk.data();
  bp.dv = dv.data();
  bp.k_tiles = static_cast<int>((Sk + kMmaKeysPerBlock - 1) / kMmaKeysPerBlock);
  emu::launch(&attention_backward_mma_kernel<T16, D_PAD>, static_cast<unsigned>(bp.heads * bp.k_tiles), kThreads,
              mma_bwd_smem_bytes<D_PAD>(), bp);

  const double eo = array_error(wide(o), ref.o, ErrorScale::largest_or_one);
  const double el = array_error(std::vector<double>(lse.begin(), lse.end()), ref.lse2, ErrorScale::largest_or_one);
  const double eq = array_error(std::vector<double>(dq.begin(), dq.end()), ref.dq, ErrorScale::largest_or_one);
  const double ek = array_error(wide(dk), ref.dk, ErrorScale::largest_or_one);
  const double ev = array_error(wide(dv), ref.dv, ErrorScale::largest_or_one);
  std::printf("  errors: o %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n", eo, el, eq, ek, ev);
  EXPECT_LE(eo, kOutTol<T16>) << "output";
  EXPECT_LE(el, kLseTol) << "log-sum-exp";
  EXPECT_LE(eq, kGradTol<T16>) << "dq";
  EXPECT_LE(ek, kGradTol<T16>) << "dk";
  EXPECT_LE(ev, kGradTol<T16>) << "dv";
  EXPECT_EQ(emu::misaligned.load(), 0) << "misaligned 16-byte accesses";
  EXPECT_EQ(emu::unwaited_copies.load(), 0) << "asynchronous copies never waited for";
  EXPECT_EQ(emu::smem_races.load(), 0) << "copies into shared memory that another warp read between the same barriers";
  EXPECT_EQ(emu::out_of_smem.load(), 0) << "ldmatrix rows or copies outside shared memory";
}

/// Both 16-bit types at the padded head dimension the launcher picks for c.D.
void run_all(const Case& c, unsigned seed) {
  if (c.D <= 32) {
    run<bfloat16, 32>(c, seed);
    run<float16, 32>(c, seed + 1);
  } else if (c.D <= 64) {
    run<bfloat16, 64>(c, seed);
    run<float16, 64>(c, seed + 1);
  } else {
    run<bfloat16, 128>(c, seed);
    run<float16, 128>(c, seed + 1);
  }
}

TEST(AttentionMmaKernelsEmulated, MatchReferenceWithoutMask) {
  run_all({1, 1, 5, 7, 8, false, 0}, 1);
  run_all({2, 1, 130, 67, 64, false, 0}, 2);
  run_all({1, 1, 1, 1, 16, false, 0}, 3);
}

TEST(AttentionMmaKernelsEmulated, CausalMatchesReferenceAtLengthsThatAreNoMultipleOfAnyTile) {
  run_all({1, 2, 37, 37, 16, true, 0}, 10);
  run_all({1, 1, 150, 67, 64, true, 0}, 11);
  run_all({1, 1, 67, 150, 64, true, 0}, 12);
  run_all({1, 1, 200, 200, 80, true, 0}, 13);
}

// Interior tiles (no per-element mask) next to edge and diagonal ones at every padded head dim.
TEST(AttentionMmaKernelsEmulated, InteriorTilesMatchReferenceAtEveryTileShape) {
  run_all({1, 1, 260, 200, 32, false, 0}, 30);
  run_all({1, 1, 260, 260, 64, true, 0}, 31);
  run_all({1, 1, 140, 140, 128, false, 0}, 34);
  run_all({1, 1, 140, 140, 128, true, 0}, 35);
}

TEST(AttentionMmaKernelsEmulated, MasksMatchReferenceAndFullyMaskedRowsGiveZeros) {
  run_all({2, 1, 70, 130, 64, false, 1}, 20);
  run_all({3, 2, 70, 45, 24, true, 1}, 21);
  run_all({2, 2, 67, 67, 64, true, 2}, 22);
  run_all({1, 2, 129, 65, 64, false, 3}, 23);
  run_all({1, 1, 40, 70, 104, false, 2}, 24);
}

}  // namespace
}  // namespace dualcast::attention_detail
