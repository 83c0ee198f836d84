// test_attention.cu: scaled_dot_product_attention. Values of the composed path against a naive
// double loop for every mask kind and broadcast pattern (none, causal, boolean, additive with -inf,
// [Sq, Sk] / [B, 1, 1, Sk] / [1, H, Sq, 1] / [B, H, Sq, Sk], Sq != Sk, Dv != D); gradients of q, k,
// v against finite differences in double on every device, for both implementations where they
// exist, at sequence lengths that are no multiple of any tile (1, 5, 37, 67, 130); fused equal to
// composed in float32 and float64 (outputs and all three gradients) over head dims 1..128 and
// lengths across several tiles; fully masked rows give zeros and zero gradients, never NaN; the fused
// path never allocates an Sq x Sk buffer; which implementation `automatic` picks; argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "dualcast/gradcheck.hpp"
#include "dualcast/memory.hpp"
#include "dualcast/ops/attention.hpp"
#include "dualcast/ops/reduce.hpp"
#include "dualcast/ops/shape.hpp"
#include "test_util.hpp"

namespace dualcast {
namespace {

/// Fused vs composed in float64: the same sums in different orders.
constexpr double kSameResultTolDouble = 1e-10;

enum class MaskKind { none, boolean, additive };

struct Case {
  std::int64_t B, H, Sq, Sk, D, Dv;
  bool causal = false;
  MaskKind mask = MaskKind::none;
  Shape mask_shape{};  ///< empty: [B, H, Sq, Sk]
  std::string str() const {
    return "B=" + std::to_string(B) + " H=" + std::to_string(H) + " Sq=" + std::to_string(Sq) +
           " Sk=" + std::to_string(Sk) + " D=" + std::to_string(D) + " Dv=" + std::to_string(Dv) +
           (causal ? " causal" : "") +
           (mask == MaskKind::boolean ? " bool-mask" : (mask == MaskKind::additive ? " add-mask" : "")) +
           (mask != MaskKind::none ? " " + mask_shape.str() : "");
  }
};

Shape full_mask_shape(const Case& c) { return Shape{c.B, c.H, c.Sq, c.Sk}; }

/// A mask for the case: boolean keeps ~80% of the entries; additive is N(0, 1) with ~10% -inf.
Tensor make_mask(const Case& c, Device dev, std::uint64_t seed) {
  if (c.mask == MaskKind::none) return Tensor();
  const Shape s = c.mask_shape.rank() > 0 ? c.mask_shape : full_mask_shape(c);
  if (c.mask == MaskKind::boolean) return Tensor::bernoulli(s, 0.8, dev, seed, DType::uint8);
  std::vector<double> v = Tensor::randn(s, Device::cpu(), seed, DType::float64).to_vector<double>();
  for (std::size_t i = 0; i < v.size(); ++i)
    if (random::uniform(seed + 1, i) < 0.1) v[i] = -INFINITY;
  return Tensor::from_vector(s, v, dev);
}

/// out[b, h, i, :] in double, straight from the definition (fully masked rows: zeros).
std::vector<double> naive_attention(const Case& c, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& mask, double scale) {
  const auto Q = q.to_vector<double>(), K = k.to_vector<double>(), V = v.to_vector<double>();
  std::vector<double> M;
  if (mask.defined()) M = broadcast_to(mask.to(DType::float64), full_mask_shape(c)).to_vector<double>();
  std::vector<double> out(static_cast<std::size_t>(c.B * c.H * c.Sq * c.Dv), 0.0);
  std::vector<double> s(static_cast<std::size_t>(c.Sk));
  for (std::int64_t bh = 0; bh < c.B * c.H; ++bh)
    for (std::int64_t i = 0; i < c.Sq; ++i) {
      double m = -INFINITY;
      for (std::int64_t j = 0; j < c.Sk; ++j) {
        double x = 0.0;
        for (std::int64_t d = 0; d < c.D; ++d) x += Q[(bh * c.Sq + i) * c.D + d] * K[(bh * c.Sk + j) * c.D + d];
        x *= scale;
        const double mv = M.empty() ? 0.0 : M[static_cast<std::size_t>((bh * c.Sq + i) * c.Sk + j)];
        if (c.causal && j > i) x = -INFINITY;
        else if (c.mask == MaskKind::boolean && mv == 0.0) x = -INFINITY;
        else if (c.mask == MaskKind::additive) x += mv;
        s[static_cast<std::size_t>(j)] = x;
        m = std::max(m, x);
      }
      if (m == -INFINITY) continue;  // fully masked: zeros
      double z = 0.0;
      for (auto& x : s) z += (x = std::exp(x - m));
      for (std::int64_t j = 0; j < c.Sk; ++j)
        for (std::int64_t e = 0; e < c.Dv; ++e)
          out[static_cast<std::size_t>((bh * c.Sq + i) * c.Dv + e)] +=
              s[static_cast<std::size_t>(j)] / z * V[(bh * c.Sk + j) * c.Dv + e];
    }
  return out;
}

/// Whole arrays are compared in the max norm, values below 1 absolutely (array_error, gradcheck.hpp).
constexpr ErrorScale kWholeArray = ErrorScale::largest_or_one;

struct Inputs {
  Tensor q, k, v, mask;
};
Inputs make_inputs(const Case& c, Device dev, DType dt, std::uint64_t seed) {
  Inputs in;
  in.q = Tensor::randn({c.B, c.H, c.Sq, c.D}, dev, seed, dt);
  in.k = Tensor::randn({c.B, c.H, c.Sk, c.D}, dev, seed + 1, dt);
  in.v = Tensor::randn({c.B, c.H, c.Sk, c.Dv}, dev, seed + 2, dt);
  in.mask = make_mask(c, dev, seed + 3);
  return in;
}

AttentionOptions options(const Case& c, const Tensor& mask, AttentionImpl impl, double scale = 0.0) {
  AttentionOptions o;
  o.causal = c.causal;
  o.mask = mask;
  o.impl = impl;
  o.scale = scale;
  return o;
}

class Attention : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override { DUALCAST_SKIP_IF_UNAVAILABLE(GetParam()); }
  Device dev() const { return GetParam(); }
  /// The implementations that exist on this device.
  std::vector<AttentionImpl> impls() const {
    if (dev().is_cpu()) return {AttentionImpl::composed};
    return {AttentionImpl::composed, AttentionImpl::fused};
  }
};

// Odd lengths (no multiple of any tile), Sq != Sk, Dv != D, every mask kind and broadcast pattern.
const Case kValueCases[] = {
    {2, 3, 5, 7, 4, 3},
    {1, 2, 37, 37, 16, 16, true},
    {2, 2, 13, 29, 8, 5, false, MaskKind::boolean, Shape{13, 29}},
    {2, 2, 13, 29, 8, 8, true, MaskKind::boolean, Shape{2, 1, 1, 29}},
    {2, 3, 9, 11, 6, 6, false, MaskKind::additive, Shape{2, 3, 9, 11}},
    {2, 3, 9, 11, 6, 6, true, MaskKind::additive, Shape{1, 3, 9, 1}},
    {1, 1, 67, 3, 2, 2, true},
    {1, 1, 1, 1, 1, 1},
};

TEST_P(Attention, ComposedMatchesNaiveLoopForEveryMaskAndBroadcastPattern) {
  std::uint64_t seed = 10;
  for (DType dt : {DType::float32, DType::float64})
    for (const Case& c : kValueCases) {
      const Inputs in = make_inputs(c, dev(), dt, seed += 10);
      for (double scale : {0.0, 0.3}) {
        const Tensor out = scaled_dot_product_attention(in.q, in.k, in.v,
                                                        options(c, in.mask, AttentionImpl::composed, scale));
        ASSERT_EQ(out.shape(), (Shape{c.B, c.H, c.Sq, c.Dv})) << c.str();
        const double sc = scale != 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(c.D));
        EXPECT_LE(array_error(out.to_vector<double>(), naive_attention(c, in.q, in.k, in.v, in.mask, sc), kWholeArray),
                  dt == DType::float64 ? 1e-12 : kGradTolFloat)
            << dtype_name(dt) << " " << c.str() << " scale " << scale;
      }
    }
}

TEST_P(Attention, FusedMatchesNaiveLoopForEveryMaskAndBroadcastPattern) {
  if (dev().is_cpu()) GTEST_SKIP() << "the fused kernels run on CUDA devices";
  std::uint64_t seed = 500;
  for (DType dt : {DType::float32, DType::float64})
    for (const Case& c0 : kValueCases) {
      Case c = c0;
      c.Dv = c.D;  // the fused kernels take D == Dv
      const Inputs in = make_inputs(c, dev(), dt, seed += 10);
      const Tensor out =
          scaled_dot_product_attention(in.q, in.k, in.v, options(c, in.mask, AttentionImpl::fused));
      const double sc = 1.0 / std::sqrt(static_cast<double>(c.D));
      EXPECT_LE(array_error(out.to_vector<double>(), naive_attention(c, in.q, in.k, in.v, in.mask, sc), kWholeArray),
                dt == DType::float64 ? 1e-12 : kGradTolFloat)
          << dtype_name(dt) << " " << c.str();
    }
}

// ---- gradients against finite differences ------------------------------------------------------

void expect_gradients_ok(const Case& c, Device dev, AttentionImpl impl, std::uint64_t seed) {
  const Inputs in = make_inputs(c, dev, DType::float64, seed);
  const AttentionOptions o = options(c, in.mask, impl);
  const GradCheckResult r = check_gradients(
      [&](const std::vector<Var>& x) { return scaled_dot_product_attention(x[0], x[1], x[2], o); },
      {in.q, in.k, in.v});
  EXPECT_TRUE(r.ok) << attention_impl_name(impl) << " " << c.str() << ": " << r.message;
}

TEST_P(Attention, GradientsMatchFiniteDifferencesWithoutMask) {
  for (AttentionImpl impl : impls()) {
    expect_gradients_ok({2, 2, 5, 7, 4, 4}, dev(), impl, 1);
    expect_gradients_ok({1, 2, 37, 37, 8, 8}, dev(), impl, 2);
    expect_gradients_ok({1, 1, 1, 1, 3, 3}, dev(), impl, 3);
  }
  expect_gradients_ok({2, 1, 6, 4, 3, 5}, dev(), AttentionImpl::composed, 4);  // Dv != D
}

TEST_P(Attention, CausalGradientsMatchFiniteDifferencesAtLengthsThatAreNoMultipleOfAnyTile) {
  for (AttentionImpl impl : impls())
    for (std::int64_t S : {1, 5, 37, 67, 130}) {
      Case c{1, 1, S, S, 4, 4, true};
      expect_gradients_ok(c, dev(), impl, 10 + static_cast<std::uint64_t>(S));
    }
  // Sq != Sk (top-left aligned), more keys than queries and fewer.
  for (AttentionImpl impl : impls()) {
    expect_gradients_ok({1, 2, 9, 70, 4, 4, true}, dev(), impl, 20);
    expect_gradients_ok({1, 2, 70, 9, 4, 4, true}, dev(), impl, 21);
  }
}

TEST_P(Attention, MaskedGradientsMatchFiniteDifferences) {
  for (AttentionImpl impl : impls()) {
    expect_gradients_ok({2, 2, 13, 29, 4, 4, false, MaskKind::boolean, Shape{2, 1, 1, 29}}, dev(), impl, 30);
    expect_gradients_ok({2, 2, 13, 29, 4, 4, true, MaskKind::boolean, Shape{13, 29}}, dev(), impl, 31);
    expect_gradients_ok({2, 2, 9, 11, 4, 4, false, MaskKind::additive, Shape{2, 2, 9, 11}}, dev(), impl, 32);
    expect_gradients_ok({1, 3, 9, 11, 4, 4, true, MaskKind::additive, Shape{3, 1, 11}}, dev(), impl, 33);
  }
}

TEST_P(Attention, GradientsOfASubsetOfInputsMatchFiniteDifferences) {
  // k and v constants: the node must still give q's gradient (and the reverse).
  for (AttentionImpl impl : impls()) {
    const Case c{1, 2, 7, 9, 4, 4, true};
    const Inputs in = make_inputs(c, dev(), DType::float64, 40);
    const AttentionOptions o = options(c, Tensor(), impl);
    const GradCheckResult rq = check_gradients(
        [&](const std::vector<Var>& x) { return scaled_dot_product_attention(x[0], in.k, in.v, o); }, {in.q});
    EXPECT_TRUE(rq.ok) << attention_impl_name(impl) << " q only: " << rq.message;
    const GradCheckResult rkv = check_gradients(
        [&](const std::vector<Var>& x) { return scaled_dot_product_attention(in.q, x[0], x[1], o); },
        {in.k, in.v});
    EXPECT_TRUE(rkv.ok) << attention_impl_name(impl) << " k, v: " << rkv.message;
  }
}

// ---- fused equals composed ----------------------------------------------------------------------

struct AllResults {
  std::vector<double> out, dq, dk, dv;
};
AllResults run_with_grads(const Inputs& in, const AttentionOptions& o, std::uint64_t seed) {
  Var q = Var::param(in.q), k = Var::param(in.k), v = Var::param(in.v);
  const Var out = scaled_dot_product_attention(q, k, v, o);
  out.backward(Tensor::randn(out.shape(), out.device(), seed, out.dtype()));
  return {out.value().to_vector<double>(), q.grad().to_vector<double>(), k.grad().to_vector<double>(),
          v.grad().to_vector<double>()};
}

void expect_fused_equals_composed(const Case& c, Device dev, DType dt, std::uint64_t seed) {
  const Inputs in = make_inputs(c, dev, dt, seed);
  const AllResults f = run_with_grads(in, options(c, in.mask, AttentionImpl::fused), seed + 7);
  const AllResults r = run_with_grads(in, options(c, in.mask, AttentionImpl::composed), seed + 7);
  const double tol = dt == DType::float64 ? kSameResultTolDouble : kSameResultTolFloat;
  const std::string what = std::string(dtype_name(dt)) + " " + c.str();
  EXPECT_LE(array_error(f.out, r.out, kWholeArray), tol) << "out " << what;
  EXPECT_LE(array_error(f.dq, r.dq, kWholeArray), tol) << "dq " << what;
  EXPECT_LE(array_error(f.dk, r.dk, kWholeArray), tol) << "dk " << what;
  EXPECT_LE(array_error(f.dv, r.dv, kWholeArray), tol) << "dv " << what;
}

TEST_P(Attention, FusedEqualsComposedOverHeadDimsAndLengthsAcrossTiles) {
  if (dev().is_cpu()) GTEST_SKIP() << "the fused kernels run on CUDA devices";
  std::uint64_t seed = 1000;
  // Under the sanitizer (each shared-memory access checked): the head dimensions at the edges of the
  // kernels' specialisations and one batch entry, still across several tiles each way.
  const std::vector<std::int64_t> dims = running_under_sanitizer() ? std::vector<std::int64_t>{1, 33, 128}
                                                                   : std::vector<std::int64_t>{1, 16, 33, 64, 80, 128};
  const std::int64_t batch = dualcast::testing::unless_sanitizing(2, 1);
  for (DType dt : {DType::float32, DType::float64})
    for (std::int64_t D : dims)
      for (bool causal : {false, true}) {
        expect_fused_equals_composed({batch, 3, 200, 200, D, D, causal}, dev(), dt, seed += 10);
        expect_fused_equals_composed({1, 2, 65, 129, D, D, causal}, dev(), dt, seed += 10);
        expect_fused_equals_composed({1, 2, 300, 63, D, D, causal}, dev(), dt, seed += 10);
      }
}

TEST_P(Attention, FusedEqualsComposedWithMasks) {
  if (dev().is_cpu()) GTEST_SKIP() << "the fused kernels run on CUDA devices";
  std::uint64_t seed = 2000;
  for (DType dt : {DType::float32, DType::float64})
    for (bool causal : {false, true}) {
      expect_fused_equals_composed({2, 2, 150, 150, 64, 64, causal, MaskKind::boolean, Shape{2, 1, 1, 150}},
                                   dev(), dt, seed += 10);
      expect_fused_equals_composed({2, 2, 70, 130, 64, 64, causal, MaskKind::boolean, Shape{2, 2, 70, 130}},
                                   dev(), dt, seed += 10);
      expect_fused_equals_composed({1, 3, 100, 90, 32, 32, causal, MaskKind::additive, Shape{100, 90}},
                                   dev(), dt, seed += 10);
    }
}

TEST_P(Attention, FusedEqualsComposedAtTrainingSize) {
  if (dev().is_cpu()) GTEST_SKIP() << "the fused kernels run on CUDA devices";
  // Under the sanitizer one head of each long case: the same tiles and code paths, 16x less work.
  const std::int64_t heads = dualcast::testing::unless_sanitizing(8, 1);
  expect_fused_equals_composed({8, 4, 128, 128, 64, 64, true}, dev(), DType::float32, 3000);
  expect_fused_equals_composed({2, heads, 1024, 1024, 64, 64, true}, dev(), DType::float32, 3001);
  expect_fused_equals_composed({2, heads, 1000, 1000, 64, 64, false}, dev(), DType::float32, 3002);
}

// The float32 head_dim-64 forward has two tile shapes (attention_fused.cu: 4 or 8 rows per lane,
// chosen by causal masking and length, or forced with DUALCAST_ATTENTION_FWD_TM); each must equal
// the composed version.
TEST_P(Attention, BothFloat32ForwardTileShapesEqualComposed) {
  if (dev().is_cpu()) GTEST_SKIP() << "the fused kernels run on CUDA devices";
  struct RestoreEnv {
    std::string old;
    bool had;
    RestoreEnv() : had(std::getenv("DUALCAST_ATTENTION_FWD_TM") != nullptr) {
      if (had) old = std::getenv("DUALCAST_ATTENTION_FWD_TM");
    }
    ~RestoreEnv() {
      if (had) setenv("DUALCAST_ATTENTION_FWD_TM", old.c_str(), 1);
      else unsetenv("DUALCAST_ATTENTION_FWD_TM");
    }
  } restore;
  std::uint64_t seed = 4000;
  for (const char* tm : {"4", "8"}) {
    setenv("DUALCAST_ATTENTION_FWD_TM", tm, 1);
    SCOPED_TRACE(std::string("DUALCAST_ATTENTION_FWD_TM=") + tm);
    for (bool causal : {false, true}) {
      expect_fused_equals_composed({2, 3, 200, 200, 64, 64, causal}, dev(), DType::float32, seed += 10);
      expect_fused_equals_composed({1, 2, 65, 129, 64, 64, causal}, dev(), DType::float32, seed += 10);
      expect_fused_equals_composed({1, 2, 300, 63, 64, 64, causal}, dev(), DType::float32, seed += 10);
      expect_fused_equals_composed({2, 2, 150, 150, 64, 64, causal, MaskKind::boolean, Shape{2, 1, 1, 150}},
                                   dev(), DType::float32, seed += 10);
    }
  }
}

// ---- fully masked rows ----------------------------------------------------------------------------

TEST_P(Attention, FullyMaskedRowsGiveZerosAndZeroGradientsNeverNaN) {
  // Batch entry 1 masks every key (key padding), batch entry 0 masks rows 2 and 5 entirely
  // (additive -inf), and Sk = 0 masks everything.
  const std::int64_t B = 2, H = 2, S = 7, D = 4;
  std::vector<std::uint8_t> keep(static_cast<std::size_t>(B * S), 1);
  for (std::int64_t j = 0; j < S; ++j) keep[static_cast<std::size_t>(S + j)] = 0;
  std::vector<double> add(static_cast<std::size_t>(S * S), 0.0);
  for (std::int64_t j = 0; j < S; ++j) add[static_cast<std::size_t>(2 * S + j)] = add[static_cast<std::size_t>(5 * S + j)] = -INFINITY;
  for (AttentionImpl impl : impls())
    for (DType dt : {DType::float32, DType::float64})
      for (int variant = 0; variant < 3; ++variant) {
        const std::int64_t Sk = variant == 2 ? 0 : S;
        Var q = Var::param(Tensor::randn({B, H, S, D}, dev(), 1, dt));
        Var k = Var::param(Tensor::randn({B, H, Sk, D}, dev(), 2, dt));
        Var v = Var::param(Tensor::randn({B, H, Sk, D}, dev(), 3, dt));
        AttentionOptions o;
        o.impl = impl;
        if (variant == 0) o.mask = Tensor::from_vector(Shape{B, 1, 1, S}, keep, dev());
        if (variant == 1) o.mask = Tensor::from_vector(Shape{S, S}, add, dev()).to(dt);
        const Var out = scaled_dot_product_attention(q, k, v, o);
        out.backward(Tensor::ones(out.shape(), dt, dev()));
        const auto y = out.value().to_vector<double>();
        const auto gq = q.grad().to_vector<double>();
        const std::string what = std::string(attention_impl_name(impl)) + " " + dtype_name(dt) + " variant " +
                                 std::to_string(variant);
        for (double x : y) ASSERT_FALSE(std::isnan(x)) << what;
        for (double x : gq) ASSERT_FALSE(std::isnan(x)) << what;
        const auto row_zero = [&](const std::vector<double>& a, std::int64_t bh, std::int64_t i) {
          for (std::int64_t d = 0; d < D; ++d)
            if (a[static_cast<std::size_t>((bh * S + i) * D + d)] != 0.0) return false;
          return true;
        };
        for (std::int64_t bh = 0; bh < B * H; ++bh)
          for (std::int64_t i = 0; i < S; ++i) {
            const bool masked = variant == 2 || (variant == 0 && bh >= H) || (variant == 1 && (i == 2 || i == 5));
            if (!masked) continue;
            EXPECT_TRUE(row_zero(y, bh, i)) << what << " output row " << bh << "," << i;
            EXPECT_TRUE(row_zero(gq, bh, i)) << what << " dq row " << bh << "," << i;
          }
        if (variant == 0) {  // the padded batch entry's keys and values get nothing
          const auto gk = k.grad().to_vector<double>(), gv = v.grad().to_vector<double>();
          for (std::size_t i = static_cast<std::size_t>(H * S * D); i < gk.size(); ++i) {
            EXPECT_EQ(gk[i], 0.0) << what;
            EXPECT_EQ(gv[i], 0.0) << what;
          }
        }
      }
}

// ---- memory, selection, agreement between devices -----------------------------------------------

TEST_P(Attention, FusedNeverAllocatesTheScoreMatrix) {
  if (dev().is_cpu()) GTEST_SKIP() << "the fused kernels run on CUDA devices";
  // One score matrix would be 4 * 4096^2 * 4 bytes = 268 MB; q, k, v, out and the gradients are
  // 4 MB each. Under the sanitizer S = 1024: 16.8 MB of scores against 1 MB each.
  const std::int64_t B = 1, H = 4, S = dualcast::testing::unless_sanitizing(4096, 1024), D = 64;
  const std::int64_t score_bytes = H * S * S * 4;
  Var q = Var::param(Tensor::randn({B, H, S, D}, dev(), 1));
  Var k = Var::param(Tensor::randn({B, H, S, D}, dev(), 2));
  Var v = Var::param(Tensor::randn({B, H, S, D}, dev(), 3));
  const Tensor g = Tensor::randn({B, H, S, D}, dev(), 4);
  synchronize(dev());
  // The peak is the process's: start a new one here, or an earlier test's peak decides the outcome.
  reset_peak_memory_stats(dev());
  const std::int64_t before = memory_stats(dev()).bytes_in_use;
  AttentionOptions o;
  o.causal = true;
  o.impl = AttentionImpl::fused;
  {
    const Var out = scaled_dot_product_attention(q, k, v, o);
    out.backward(g);
    synchronize(dev());
  }
  const std::int64_t peak = memory_stats(dev()).peak_bytes_in_use;
  EXPECT_LT(peak - before, score_bytes / 2) << "peak " << peak << " before " << before;
}

TEST_P(Attention, AutomaticPicksFusedOnCudaDevicesWhereItApplies) {
  const Tensor q = Tensor::randn({1, 2, 5, 8}, dev(), 1), k = Tensor::randn({1, 2, 6, 8}, dev(), 2);
  const Tensor v8 = Tensor::randn({1, 2, 6, 8}, dev(), 3), v4 = Tensor::randn({1, 2, 6, 4}, dev(), 4);
  const AttentionImpl want = dev().is_cuda() ? AttentionImpl::fused : AttentionImpl::composed;
  EXPECT_EQ(attention_impl_for(q, k, v8), want);
  EXPECT_EQ(attention_impl_for(q, k, v4), AttentionImpl::composed);  // Dv != D
  const Tensor q200 = Tensor::randn({1, 1, 3, 200}, dev(), 5), k200 = Tensor::randn({1, 1, 3, 200}, dev(), 6);
  EXPECT_EQ(attention_impl_for(q200, k200, k200), AttentionImpl::composed);  // D > 128
  EXPECT_STREQ(attention_impl_name(AttentionImpl::fused), "fused");
}

TEST_P(Attention, GpuEqualsCpu) {
  if (dev().is_cpu()) GTEST_SKIP() << "compares a CUDA device with the CPU";
  const Case c{2, 3, 70, 90, 32, 32, true, MaskKind::boolean, Shape{2, 1, 1, 90}};
  const Inputs g = make_inputs(c, dev(), DType::float64, 77);
  Inputs h;
  h.q = g.q.to(Device::cpu());
  h.k = g.k.to(Device::cpu());
  h.v = g.v.to(Device::cpu());
  h.mask = g.mask.to(Device::cpu());
  const AllResults cpu = run_with_grads(h, options(c, h.mask, AttentionImpl::composed), 5);
  for (AttentionImpl impl : impls()) {
    const AllResults gpu = run_with_grads(g, options(c, g.mask, impl), 5);
    EXPECT_LE(array_error(gpu.out, cpu.out, kWholeArray), kSameResultTolDouble) << attention_impl_name(impl);
    EXPECT_LE(array_error(gpu.dq, cpu.dq, kWholeArray), kSameResultTolDouble) << attention_impl_name(impl);
    EXPECT_LE(array_error(gpu.dk, cpu.dk, kWholeArray), kSameResultTolDouble) << attention_impl_name(impl);
    EXPECT_LE(array_error(gpu.dv, cpu.dv, kWholeArray), kSameResultTolDouble) << attention_impl_name(impl);
  }
}

TEST_P(Attention, TensorFormEqualsVarForm) {
  for (AttentionImpl impl : impls()) {
    const Case c{1, 2, 9, 9, 8, 8, true};
    const Inputs in = make_inputs(c, dev(), DType::float32, 90);
    const AttentionOptions o = options(c, Tensor(), impl);
    const Tensor a = scaled_dot_product_attention(in.q, in.k, in.v, o);
    const Var b = scaled_dot_product_attention(Var::param(in.q), Var(in.k), Var(in.v), o);
    EXPECT_EQ(array_error(a.to_vector<double>(), b.value().to_vector<double>(), kWholeArray), 0.0)
        << attention_impl_name(impl);
  }
}

// ---- argument errors ----------------------------------------------------------------------------

template <class F>
void expect_error_mentioning(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no dualcast::Error thrown";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

TEST_P(Attention, BadArgumentsAreErrorsNamingTheArgumentAndShapes) {
  const Tensor q = Tensor::randn({2, 3, 5, 8}, dev(), 1), k = Tensor::randn({2, 3, 6, 8}, dev(), 2);
  const Tensor v = Tensor::randn({2, 3, 6, 8}, dev(), 3);
  const char* op = "scaled_dot_product_attention";
  expect_error_mentioning([&] { (void)scaled_dot_product_attention(reshape(q, {6, 5, 8}), k, v); },
                          {op, "'q'", "[6, 5, 8]"});
  expect_error_mentioning([&] { (void)scaled_dot_product_attention(q, Tensor::randn({2, 3, 6, 7}, dev(), 4), v); },
                          {op, "head_dim", "[2, 3, 6, 7]"});
  expect_error_mentioning([&] { (void)scaled_dot_product_attention(q, k, Tensor::randn({2, 3, 4, 8}, dev(), 5)); },
                          {op, "'v'", "[2, 3, 4, 8]"});
  expect_error_mentioning([&] { (void)scaled_dot_product_attention(q, Tensor::randn({2, 2, 6, 8}, dev(), 6), v); },
                          {op, "[2, 2, 6, 8]"});
  expect_error_mentioning([&] { (void)scaled_dot_product_attention(q, k.to(DType::float64), v); },
                          {op, "float64"});
  AttentionOptions bad_mask;
  bad_mask.mask = Tensor::ones({5, 7}, DType::uint8, dev());
  expect_error_mentioning([&] { (void)scaled_dot_product_attention(q, k, v, bad_mask); },
                          {op, "'mask'", "[5, 7]", "[2, 3, 5, 6]"});
  AttentionOptions bad_scale;
  bad_scale.scale = INFINITY;
  expect_error_mentioning([&] { (void)scaled_dot_product_attention(q, k, v, bad_scale); }, {op, "scale"});
  if (dev().is_cpu()) {
    AttentionOptions fused;
    fused.impl = AttentionImpl::fused;
    expect_error_mentioning([&] { (void)scaled_dot_product_attention(q, k, v, fused); }, {op, "fused", "cpu"});
  }
  // Still works afterwards.
  const Tensor out = scaled_dot_product_attention(q, k, v);
  EXPECT_EQ(out.shape(), (Shape{2, 3, 5, 8}));
}

INSTANTIATE_TEST_SUITE_P(Devices, Attention, ::testing::ValuesIn(testing::all_devices()),
                         [](const auto& info) { return testing::device_label(info.param); });

}  // namespace
}  // namespace dualcast
