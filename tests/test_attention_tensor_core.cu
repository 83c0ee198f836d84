// test_attention_tensor_core.cu: scaled_dot_product_attention on bfloat16 and float16 q, k, v, which
// runs on the tensor-core kernels (src/attention_mma.cuh) on CUDA devices where head_dim is a
// multiple of 8 up to 128: outputs and all three gradients against the float64 attention of the same
// 16-bit values for every mask kind, causal masking, odd lengths and every padded head dim; fully
// masked rows give zeros, never NaN; under Autocast, float32 inputs run there too (16-bit output,
// float32 gradients); other 16-bit shapes keep running on float32 copies; which implementation
// `automatic` names. On the CPU the tensor-core kernels do not exist and these tests skip.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "dualcast/gradcheck.hpp"
#include "dualcast/ops/attention.hpp"
#include "dualcast/ops/shape.hpp"
#include "dualcast/precision.hpp"
#include "test_util.hpp"

namespace dualcast {
namespace {

/// Largest error (ErrorScale::largest_or_one) against the float64 attention of the same 16-bit
/// inputs: the kernels round P and dS to 16 bits before the products that use them, as
/// FlashAttention-2 does, and round their outputs once. The CPU emulation of these kernels
/// (tests/emulation/test_attention_mma_emulation.cpp) measured at most 0.0033 / 0.0062 (bfloat16
/// outputs / gradients) and 0.00037 / 0.00063 (float16).
double out_tol(DType dt) { return dt == DType::bfloat16 ? 0.01 : 0.0015; }
double grad_tol(DType dt) { return dt == DType::bfloat16 ? 0.02 : 0.0025; }

constexpr ErrorScale kWholeArray = ErrorScale::largest_or_one;
constexpr DType kHalfTypes[] = {DType::bfloat16, DType::float16};

enum class Mask { none, key_padding, additive, full_boolean };

struct Case {
  std::int64_t B, H, Sq, Sk, D;
  bool causal = false;
  Mask mask = Mask::none;
  std::string str() const {
    return "B=" + std::to_string(B) + " H=" + std::to_string(H) + " Sq=" + std::to_string(Sq) +
           " Sk=" + std::to_string(Sk) + " D=" + std::to_string(D) + (causal ? " causal" : "") + " mask " +
           std::to_string(static_cast<int>(mask));
  }
};

Tensor make_mask(const Case& c, Device dev, std::uint64_t seed) {
  switch (c.mask) {
    case Mask::key_padding: return Tensor::bernoulli({c.B, 1, 1, c.Sk}, 0.8, dev, seed, DType::uint8);
    case Mask::full_boolean: return Tensor::bernoulli({c.B, c.H, c.Sq, c.Sk}, 0.7, dev, seed, DType::uint8);
    case Mask::additive: {
      std::vector<double> v = Tensor::randn({c.Sq, c.Sk}, Device::cpu(), seed, DType::float64).to_vector<double>();
      for (std::size_t i = 0; i < v.size(); ++i)
        if (random::uniform(seed + 1, i) < 0.1) v[i] = -INFINITY;
      return Tensor::from_vector(Shape{c.Sq, c.Sk}, v, dev);
    }
    default: return Tensor();
  }
}

struct Results {
  Tensor out, dq, dk, dv;
};

Results run(const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& g, const AttentionOptions& o) {
  Var q = Var::param(q0), k = Var::param(k0), v = Var::param(v0);
  const Var out = scaled_dot_product_attention(q, k, v, o);
  out.backward(g.to(out.dtype()));
  return {out.value(), q.grad(), k.grad(), v.grad()};
}

class AttentionTensorCore : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    DUALCAST_SKIP_IF_UNAVAILABLE(GetParam());
    if (GetParam().is_cpu()) GTEST_SKIP() << "the tensor-core kernels run on CUDA devices";
  }
  Device dev() const { return GetParam(); }

  /// The 16-bit attention of the case against the float64 one of the same values.
  void expect_matches_float64(const Case& c, DType dt, std::uint64_t seed) {
    const Tensor q = Tensor::randn({c.B, c.H, c.Sq, c.D}, dev(), seed, dt);
    const Tensor k = Tensor::randn({c.B, c.H, c.Sk, c.D}, dev(), seed + 1, dt);
    const Tensor v = Tensor::randn({c.B, c.H, c.Sk, c.D}, dev(), seed + 2, dt);
    const Tensor g = Tensor::randn({c.B, c.H, c.Sq, c.D}, dev(), seed + 3, dt);
    AttentionOptions o;
    o.causal = c.causal;
    o.mask = make_mask(c, dev(), seed + 4);
    ASSERT_EQ(attention_impl_for(q, k, v, o), AttentionImpl::fused) << c.str();
    const Results h = run(q, k, v, g, o);
    const Results r = run(q.to(DType::float64), k.to(DType::float64), v.to(DType::float64), g, o);
    const std::string what = std::string(dtype_name(dt)) + " " + c.str();
    ASSERT_EQ(h.out.dtype(), dt) << what;
    ASSERT_EQ(h.dq.dtype(), dt) << what;
    EXPECT_LE(array_error(h.out, r.out, kWholeArray), out_tol(dt)) << "out " << what;
    EXPECT_LE(array_error(h.dq, r.dq, kWholeArray), grad_tol(dt)) << "dq " << what;
    EXPECT_LE(array_error(h.dk, r.dk, kWholeArray), grad_tol(dt)) << "dk " << what;
    EXPECT_LE(array_error(h.dv, r.dv, kWholeArray), grad_tol(dt)) << "dv " << what;
    // The tensor-core kernels ran, not the float32 kernels on copies: those give other bits (and
    // are more accurate, so the tolerances above would not tell).
    const Tensor f32 = scaled_dot_product_attention(q.to(DType::float32), k.to(DType::float32),
                                                    v.to(DType::float32), o);
    EXPECT_GT(array_error(h.out, f32.to(dt), kWholeArray), 0.0) << "the float32 route ran: " << what;
  }
};

TEST_P(AttentionTensorCore, MatchesFloat64AtOddLengthsAndEveryPaddedHeadDim) {
  std::uint64_t seed = 100;
  for (DType dt : kHalfTypes)
    for (std::int64_t D : {8, 24, 64, 80, 128})
      for (bool causal : {false, true}) {
        expect_matches_float64({2, 3, 200, 200, D, causal}, dt, seed += 10);
        expect_matches_float64({1, 2, 65, 129, D, causal}, dt, seed += 10);
        expect_matches_float64({1, 2, 300, 63, D, causal}, dt, seed += 10);
      }
}

TEST_P(AttentionTensorCore, MatchesFloat64WithEveryMaskKind) {
  std::uint64_t seed = 200;
  for (DType dt : kHalfTypes)
    for (bool causal : {false, true}) {
      expect_matches_float64({2, 2, 150, 150, 64, causal, Mask::key_padding}, dt, seed += 10);
      expect_matches_float64({2, 2, 70, 130, 64, causal, Mask::full_boolean}, dt, seed += 10);
      expect_matches_float64({1, 3, 100, 90, 32, causal, Mask::additive}, dt, seed += 10);
    }
}

TEST_P(AttentionTensorCore, MatchesFloat64AtTrainingSize) {
  const std::int64_t heads = dualcast::testing::unless_sanitizing(4, 1);
  expect_matches_float64({2, heads, 1024, 1024, 64, true}, DType::bfloat16, 300);
  expect_matches_float64({1, heads, 1000, 1000, 128, false}, DType::float16, 301);
}

TEST_P(AttentionTensorCore, FullyMaskedRowsGiveZerosAndZeroGradientsNeverNaN) {
  // Batch entry 1 masks every key; Sk = 0 masks everything.
  const std::int64_t B = 2, H = 2, S = 7, D = 16;
  std::vector<std::uint8_t> keep(static_cast<std::size_t>(B * S), 1);
  for (std::int64_t j = 0; j < S; ++j) keep[static_cast<std::size_t>(S + j)] = 0;
  for (DType dt : kHalfTypes)
    for (std::int64_t Sk : {S, std::int64_t(0)}) {
      const Tensor q = Tensor::randn({B, H, S, D}, dev(), 1, dt);
      const Tensor k = Tensor::randn({B, H, Sk, D}, dev(), 2, dt), v = Tensor::randn({B, H, Sk, D}, dev(), 3, dt);
      AttentionOptions o;
      if (Sk > 0) o.mask = Tensor::from_vector(Shape{B, 1, 1, S}, keep, dev());
      const Results r = run(q, k, v, Tensor::ones({B, H, S, D}, dt, dev()), o);
      const auto y = r.out.to_vector<double>(), gq = r.dq.to_vector<double>();
      const std::string what = std::string(dtype_name(dt)) + " Sk=" + std::to_string(Sk);
      const std::size_t masked_from = Sk == 0 ? 0 : static_cast<std::size_t>(H * S * D);
      for (std::size_t i = 0; i < y.size(); ++i) {
        ASSERT_FALSE(std::isnan(y[i]) || std::isnan(gq[i])) << what;
        if (i >= masked_from) {
          EXPECT_EQ(y[i], 0.0) << what << " output " << i;
          EXPECT_EQ(gq[i], 0.0) << what << " dq " << i;
        }
      }
      if (Sk > 0) {
        const auto gk = r.dk.to_vector<double>(), gv = r.dv.to_vector<double>();
        for (std::size_t i = masked_from; i < gk.size(); ++i) {
          EXPECT_EQ(gk[i], 0.0) << what;
          EXPECT_EQ(gv[i], 0.0) << what;
        }
      }
    }
}

TEST_P(AttentionTensorCore, AutocastRunsFloat32InputsOnTensorCores) {
  const Tensor q = Tensor::randn({2, 2, 70, 64}, dev(), 11), k = Tensor::randn({2, 2, 90, 64}, dev(), 12);
  const Tensor v = Tensor::randn({2, 2, 90, 64}, dev(), 13), g = Tensor::randn({2, 2, 70, 64}, dev(), 14);
  AttentionOptions o;
  o.causal = true;
  for (DType dt : kHalfTypes) {
    const Results plain = run(q, k, v, g, o);
    Results under;
    {
      Autocast guard(dt);
      EXPECT_EQ(attention_impl_for(q, k, v, o), AttentionImpl::fused);
      under = run(q, k, v, g, o);
    }
    EXPECT_EQ(under.out.dtype(), dt);
    EXPECT_EQ(under.dq.dtype(), DType::float32) << "gradients reach float32 inputs in float32";
    // The inputs' own rounding to 16 bits adds to the kernels' error.
    EXPECT_LE(array_error(under.out, plain.out, kWholeArray), 2 * out_tol(dt)) << dtype_name(dt);
    EXPECT_LE(array_error(under.dk, plain.dk, kWholeArray), 2 * grad_tol(dt)) << dtype_name(dt);
    // ... and the same call with the same 16-bit values outside Autocast is the same computation.
    const Results direct = run(q.to(dt), k.to(dt), v.to(dt), g, o);
    EXPECT_EQ(array_error(under.out, direct.out, kWholeArray), 0.0) << dtype_name(dt);
    EXPECT_EQ(array_error(under.dv, direct.dv, kWholeArray), 0.0) << dtype_name(dt);
  }
}

// A contiguous view whose data is not 16-byte aligned (3 elements into its storage) is copied to
// aligned memory first: the same bits as the aligned tensors give.
TEST_P(AttentionTensorCore, MisalignedContiguousViewsGiveTheAlignedResult) {
  const std::int64_t B = 1, H = 2, S = 70, D = 64, n = B * H * S * D;
  for (DType dt : kHalfTypes) {
    const auto view = [&](std::uint64_t seed) {
      return reshape(slice(Tensor::randn({n + 3}, dev(), seed, dt), 0, 3, n + 3), {B, H, S, D});
    };
    const Tensor q = view(51), k = view(52), v = view(53), g = Tensor::randn({B, H, S, D}, dev(), 54, dt);
    AttentionOptions o;
    o.causal = true;
    const Results got = run(q, k, v, g, o);
    const Results want = run(q.clone(), k.clone(), v.clone(), g, o);
    EXPECT_EQ(array_error(got.out, want.out, kWholeArray), 0.0) << dtype_name(dt);
    EXPECT_EQ(array_error(got.dk, want.dk, kWholeArray), 0.0) << dtype_name(dt);
    EXPECT_EQ(array_error(got.dv, want.dv, kWholeArray), 0.0) << dtype_name(dt);
  }
}

TEST_P(AttentionTensorCore, OtherHalfShapesAndTheComposedPathRunOnFloat32Copies) {
  for (DType dt : kHalfTypes) {
    // head_dim 6 (no multiple of 8), and the composed implementation asked for.
    for (std::int64_t D : {6, 16}) {
      const Tensor q = Tensor::randn({1, 2, 9, D}, dev(), 21, dt), k = Tensor::randn({1, 2, 11, D}, dev(), 22, dt);
      const Tensor v = Tensor::randn({1, 2, 11, D}, dev(), 23, dt);
      AttentionOptions o;
      o.impl = D == 6 ? AttentionImpl::automatic : AttentionImpl::composed;
      const Tensor got = scaled_dot_product_attention(q, k, v, o);
      const Tensor want = scaled_dot_product_attention(q.to(DType::float32), k.to(DType::float32),
                                                       v.to(DType::float32), o)
                              .to(dt);
      EXPECT_EQ(got.dtype(), dt);
      EXPECT_EQ(array_error(got, want, kWholeArray), 0.0) << dtype_name(dt) << " D=" << D;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, AttentionTensorCore, ::testing::ValuesIn(testing::all_devices()),
                         [](const auto& info) { return std::string(testing::device_label(info.param)); });

}  // namespace
}  // namespace dualcast
