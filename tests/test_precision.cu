// test_precision.cu: products in reduced precision (precision.hpp). The float32 matmul precision
// setting (names, errors, "highest" unchanged, "high" within TF32 error on a GPU), the autotuned
// float32 products (equal to the default within float32 rounding, each shape searched once, captured
// steps bit-identical to eager ones, the CPU unaffected), 16-bit matmul
// values and gradients against float64 products of the same rounded inputs, Autocast (result dtype,
// float32 parameter gradients, nesting, per-thread state) for matmul and conv2d, 16-bit conv2d and
// attention.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "dualcast/dualcast.hpp"
#include "../src/blas.hpp"  // detail::matmul_autotune_searches
#include "matmul_reference.hpp"
#include "test_util.hpp"

using namespace dualcast;

namespace {

/// A 16-bit result is its float32-accumulated value rounded once (half an ulp: 2^-9 relative for
/// bfloat16's 8 significant bits, 2^-12 for float16's 11); twice that leaves room for cuBLAS's
/// split-K reductions, which may round partial sums to the output type.
double result_tol(DType t) { return t == DType::bfloat16 ? 0x1p-8 : 0x1p-11; }
/// Gradients of 16-bit products, against the largest entry: a shared operand's gradient sums a
/// batch of rounded per-entry products and rounds again.
double grad_tol(DType t) { return t == DType::bfloat16 ? 0x1p-6 : 0x1p-9; }
/// float32 with TF32 products ("high") against exact float32, against the largest entry: inputs
/// rounded to 10 mantissa bits (2^-11 relative each), errors of random sign over k = 256 terms.
constexpr double kTf32Tol = 4e-3;
/// float32 with bfloat16 products ("medium"): inputs rounded to 8 significant bits.
constexpr double kBf16ProductTol = 3e-2;
/// Autotuned float32 products (other algorithms, split-K: the same exact products summed in another
/// order) against the default ones, against the largest entry: float32 rounding of sums over k
/// terms of random sign, with room (k up to 1540 below).
constexpr double kReorderedSumTol = 2e-5;

const DType kHalfTypes[] = {DType::bfloat16, DType::float16};

/// Leaves the process-wide precision at its default when a test ends, however it ends.
struct RestorePrecision {
  ~RestorePrecision() { set_float32_matmul_precision("highest"); }
};

/// Leaves the autotune setting as the test found it.
struct RestoreAutotune {
  bool was = matmul_autotune();
  ~RestoreAutotune() { set_matmul_autotune(was); }
};

using dualcast::testing::naive_matmul;

Shape stored(std::int64_t batch, std::int64_t rows, std::int64_t cols, bool trans) {
  const std::int64_t r = trans ? cols : rows, c = trans ? rows : cols;
  return batch > 0 ? Shape{batch, r, c} : Shape{r, c};
}

/// The operand forms matmul takes: batch of a and b (0: 2-D).
struct Form {
  std::int64_t batch_a, batch_b;
  const char* name;
};
const Form kForms[] = {{0, 0, "2-D"}, {3, 3, "batched"}, {3, 0, "shared b"}, {0, 3, "shared a"}};

bool bit_identical(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.to_vector<float>() == b.to_vector<float>();
}

class Precision : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override { DUALCAST_SKIP_IF_UNAVAILABLE(GetParam()); }
  Device dev() const { return GetParam(); }
};

// ---- the setting ----------------------------------------------------------------------------------

TEST(PrecisionSetting, DefaultIsHighestAndEveryNameRoundTrips) {
  RestorePrecision restore;
  EXPECT_EQ(get_float32_matmul_precision(), "highest");
  for (const char* name : {"high", "medium", "highest"}) {
    set_float32_matmul_precision(name);
    EXPECT_EQ(get_float32_matmul_precision(), name);
  }
}

TEST(PrecisionSetting, UnknownNameIsAnErrorNamingItAndLeavesTheSettingUnchanged) {
  RestorePrecision restore;
  set_float32_matmul_precision("high");
  for (const char* bad : {"fastest", "HIGH", ""}) {
    try {
      set_float32_matmul_precision(bad);
      ADD_FAILURE() << "no Error for '" << bad << "'";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("set_float32_matmul_precision"), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::string("'") + bad + "'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("\"highest\", \"high\" or \"medium\""), std::string::npos) << msg;
    }
    EXPECT_EQ(get_float32_matmul_precision(), "high");
  }
}

// ---- Autocast state ---------------------------------------------------------------------------------

TEST(AutocastState, NonHalfDtypeIsAnErrorAndChangesNothing) {
  for (DType t : {DType::float32, DType::float64, DType::uint8}) {
    EXPECT_THROW(Autocast guard(t), Error) << dtype_name(t);
    EXPECT_FALSE(autocast_enabled());
  }
}

TEST(AutocastState, NestedGuardsRestoreTheStateTheyFound) {
  EXPECT_FALSE(autocast_enabled());
  {
    Autocast outer(DType::bfloat16);
    EXPECT_TRUE(autocast_enabled());
    EXPECT_EQ(autocast_dtype(), DType::bfloat16);
    {
      Autocast inner(DType::float16);
      EXPECT_EQ(autocast_dtype(), DType::float16);
      {
        Autocast off(DType::float16, /*enabled=*/false);
        EXPECT_FALSE(autocast_enabled());
      }
      EXPECT_TRUE(autocast_enabled());
      EXPECT_EQ(autocast_dtype(), DType::float16);
    }
    EXPECT_TRUE(autocast_enabled());
    EXPECT_EQ(autocast_dtype(), DType::bfloat16);
  }
  EXPECT_FALSE(autocast_enabled());
}

TEST_P(Precision, AutocastOfOneThreadLeavesAnotherThreadsProductsInFloat32) {
  const Tensor a = Tensor::randn({4, 5}, dev(), 1), b = Tensor::randn({5, 3}, dev(), 2);
  const Tensor plain = matmul(a, b);
  Autocast guard(DType::bfloat16);
  EXPECT_EQ(matmul(a, b).dtype(), DType::bfloat16);
  bool other_enabled = true;
  Tensor other;
  std::thread t([&] {
    other_enabled = autocast_enabled();
    other = matmul(a, b);
  });
  t.join();
  EXPECT_FALSE(other_enabled);
  EXPECT_EQ(other.dtype(), DType::float32);
  EXPECT_TRUE(bit_identical(other, plain));
}

// ---- 16-bit matmul ----------------------------------------------------------------------------------

TEST_P(Precision, HalfProductsMatchFloat64ProductsOfTheRoundedInputs) {
  std::uint64_t seed = 10;
  for (DType dt : kHalfTypes)
    for (const Form& f : kForms)
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          const std::int64_t m = 7, k = 33, n = 5;
          const Tensor a = Tensor::randn(stored(f.batch_a, m, k, ta), dev(), seed++, dt);
          const Tensor b = Tensor::randn(stored(f.batch_b, k, n, tb), dev(), seed++, dt);
          const Tensor c = matmul(a, b, ta, tb);
          EXPECT_EQ(c.dtype(), dt);
          EXPECT_LE(array_error(c.to_vector<double>(), naive_matmul(a, b, ta, tb), ErrorScale::elementwise),
                    result_tol(dt))
              << dtype_name(dt) << " " << f.name << " trans_a=" << ta << " trans_b=" << tb;
        }
}

TEST_P(Precision, HalfMatmulGradientsMatchFloat64GradientsOfTheRoundedInputs) {
  std::uint64_t seed = 100;
  for (DType dt : kHalfTypes)
    for (const Form& f : kForms)
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          const std::int64_t m = 6, k = 9, n = 4;
          const Tensor a = Tensor::randn(stored(f.batch_a, m, k, ta), dev(), seed++, dt);
          const Tensor b = Tensor::randn(stored(f.batch_b, k, n, tb), dev(), seed++, dt);
          const Var a16 = Var::param(a.clone()), b16 = Var::param(b.clone());
          const Var c16 = matmul(a16, b16, ta, tb);
          const Tensor r = Tensor::randn(c16.shape(), dev(), seed++, dt);
          c16.backward(r);
          const Var a64 = Var::param(a.to(DType::float64)), b64 = Var::param(b.to(DType::float64));
          matmul(a64, b64, ta, tb).backward(r.to(DType::float64));
          const std::string where = std::string(dtype_name(dt)) + " " + f.name +
                                    " trans_a=" + std::to_string(ta) + " trans_b=" + std::to_string(tb);
          ASSERT_EQ(a16.grad().dtype(), dt) << where;
          ASSERT_EQ(b16.grad().dtype(), dt) << where;
          EXPECT_LE(array_error(a16.grad(), a64.grad(), ErrorScale::largest), grad_tol(dt)) << where;
          EXPECT_LE(array_error(b16.grad(), b64.grad(), ErrorScale::largest), grad_tol(dt)) << where;
        }
}

// ---- Autocast on matmul --------------------------------------------------------------------------

TEST_P(Precision, AutocastMatmulIsHalfWithFloat32ParameterGradients) {
  for (DType dt : kHalfTypes) {
    const Var x = Var::param(Tensor::randn({3, 8, 16}, dev(), 1));
    const Var w = Var::param(Tensor::randn({16, 5}, dev(), 2));
    Var y;
    {
      Autocast guard(dt);
      y = matmul(x, w);
    }
    ASSERT_EQ(y.dtype(), dt);
    const Tensor r = Tensor::randn(y.shape(), dev(), 3, dt);
    y.backward(r);
    ASSERT_EQ(x.grad().dtype(), DType::float32);
    ASSERT_EQ(w.grad().dtype(), DType::float32);
    // The same product of the rounded operands in float64.
    const Var x64 = Var::param(x.value().to(dt).to(DType::float64));
    const Var w64 = Var::param(w.value().to(dt).to(DType::float64));
    const Var y64 = matmul(x64, w64);
    y64.backward(r.to(DType::float64));
    EXPECT_LE(array_error(y.value(), y64.value(), ErrorScale::elementwise), result_tol(dt)) << dtype_name(dt);
    // The gradients were 16-bit products, then widened to float32 exactly.
    EXPECT_LE(array_error(x.grad(), x64.grad(), ErrorScale::largest), grad_tol(dt)) << dtype_name(dt);
    EXPECT_LE(array_error(w.grad(), w64.grad(), ErrorScale::largest), grad_tol(dt)) << dtype_name(dt);
  }
}

TEST_P(Precision, AutocastLeavesFloat64AndDisabledProductsAlone) {
  const Tensor a = Tensor::randn({4, 6}, dev(), 1), b = Tensor::randn({6, 2}, dev(), 2);
  const Tensor plain = matmul(a, b);
  Autocast guard(DType::bfloat16);
  EXPECT_EQ(matmul(a.to(DType::float64), b.to(DType::float64)).dtype(), DType::float64);
  Autocast off(DType::bfloat16, /*enabled=*/false);
  const Tensor c = matmul(Var(a), Var(b)).value();
  EXPECT_EQ(c.dtype(), DType::float32);
  EXPECT_TRUE(bit_identical(c, plain));
}

// ---- conv2d -------------------------------------------------------------------------------------------

TEST_P(Precision, AutocastConv2dIsHalfWithFloat32ParameterGradients) {
  const Conv2dOptions opt{.stride = 1, .padding = 1};
  for (DType dt : kHalfTypes) {
    const Var x = Var::param(Tensor::randn({2, 3, 6, 5}, dev(), 11));
    const Var w = Var::param(Tensor::randn({4, 3, 3, 3}, dev(), 12));
    const Var bias = Var::param(Tensor::randn({4}, dev(), 13));
    Var y;
    {
      Autocast guard(dt);
      y = conv2d(x, w, bias, opt);
    }
    ASSERT_EQ(y.dtype(), dt);
    const Tensor r = Tensor::randn(y.shape(), dev(), 14, dt);
    y.backward(r);
    for (const Var* v : {&x, &w, &bias}) ASSERT_EQ(v->grad().dtype(), DType::float32) << dtype_name(dt);
    const auto rounded = [&](const Var& v) { return Var::param(v.value().to(dt).to(DType::float64)); };
    const Var x64 = rounded(x), w64 = rounded(w), b64 = rounded(bias);
    const Var y64 = conv2d(x64, w64, b64, opt);
    y64.backward(r.to(DType::float64));
    // 27 products per output, summed in float32; the bias add rounds once more.
    EXPECT_LE(array_error(y.value(), y64.value(), ErrorScale::largest_or_one), 2 * result_tol(dt))
        << dtype_name(dt);
    EXPECT_LE(array_error(x.grad(), x64.grad(), ErrorScale::largest), grad_tol(dt)) << dtype_name(dt);
    EXPECT_LE(array_error(w.grad(), w64.grad(), ErrorScale::largest), grad_tol(dt)) << dtype_name(dt);
    EXPECT_LE(array_error(bias.grad(), b64.grad(), ErrorScale::largest), grad_tol(dt)) << dtype_name(dt);
  }
}

TEST_P(Precision, HalfConv2dGradientsHaveTheOperandsDtype) {
  for (DType dt : kHalfTypes) {
    const Var x = Var::param(Tensor::randn({2, 4, 5, 5}, dev(), 21, dt));
    const Var w = Var::param(Tensor::randn({6, 2, 3, 3}, dev(), 22, dt));
    const Var bias = Var::param(Tensor::randn({6}, dev(), 23, dt));
    const Conv2dOptions opt{.stride = 2, .padding = 1, .groups = 2};
    const Var y = conv2d(x, w, bias, opt);
    ASSERT_EQ(y.dtype(), dt);
    const Tensor r = Tensor::randn(y.shape(), dev(), 24, dt);
    y.backward(r);
    for (const Var* v : {&x, &w, &bias}) EXPECT_EQ(v->grad().dtype(), dt) << dtype_name(dt);
    const Var x64 = Var::param(x.value().to(DType::float64)), w64 = Var::param(w.value().to(DType::float64));
    const Var b64 = Var::param(bias.value().to(DType::float64));
    const Var y64 = conv2d(x64, w64, b64, opt);
    y64.backward(r.to(DType::float64));
    EXPECT_LE(array_error(y.value(), y64.value(), ErrorScale::largest_or_one), 2 * result_tol(dt));
    EXPECT_LE(array_error(w.grad(), w64.grad(), ErrorScale::largest), grad_tol(dt)) << dtype_name(dt);
    EXPECT_LE(array_error(x.grad(), x64.grad(), ErrorScale::largest), grad_tol(dt)) << dtype_name(dt);
    EXPECT_LE(array_error(bias.grad(), b64.grad(), ErrorScale::largest), grad_tol(dt)) << dtype_name(dt);
  }
}

TEST_P(Precision, HalfConv2dWithAFloat32BiasIsAnErrorOutsideAutocast) {
  const Var x = Var::param(Tensor::randn({1, 2, 4, 4}, dev(), 1, DType::bfloat16));
  const Var w = Var::param(Tensor::randn({3, 2, 3, 3}, dev(), 2, DType::bfloat16));
  const Var bias = Var::param(Tensor::randn({3}, dev(), 3));
  try {
    (void)conv2d(x, w, bias);
    ADD_FAILURE() << "no Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const char* word : {"conv2d", "bias", "[3]", "float32", "bfloat16"})
      EXPECT_NE(msg.find(word), std::string::npos) << word << " in " << msg;
  }
}

// ---- attention ------------------------------------------------------------------------------------

// head_dim 6: no tensor-core shape (test_attention_tensor_core.cu has those), so float32 copies run.
TEST_P(Precision, HalfAttentionOutsideTheTensorCoreShapesIsTheFloat32AttentionRounded) {
  for (DType dt : kHalfTypes) {
    const Var q = Var::param(Tensor::randn({1, 2, 5, 6}, dev(), 31, dt));
    const Var k = Var::param(Tensor::randn({1, 2, 7, 6}, dev(), 32, dt));
    const Var v = Var::param(Tensor::randn({1, 2, 7, 6}, dev(), 33, dt));
    const AttentionOptions opt{.causal = true};
    const Var o = scaled_dot_product_attention(q, k, v, opt);
    ASSERT_EQ(o.dtype(), dt);
    const Tensor o32 = scaled_dot_product_attention(q.value().to(DType::float32), k.value().to(DType::float32),
                                                    v.value().to(DType::float32), opt);
    EXPECT_TRUE(bit_identical(o.value(), o32.to(dt))) << dtype_name(dt);
    o.backward(Tensor::randn(o.shape(), dev(), 34, dt));
    for (const Var* x : {&q, &k, &v}) EXPECT_EQ(x->grad().dtype(), dt) << dtype_name(dt);
  }
}

TEST_P(Precision, ComposedAttentionStaysFloat32UnderAutocast) {
  const Tensor q = Tensor::randn({2, 2, 4, 8}, dev(), 41), k = Tensor::randn({2, 2, 6, 8}, dev(), 42);
  const Tensor v = Tensor::randn({2, 2, 6, 8}, dev(), 43);
  const AttentionOptions opt{.impl = AttentionImpl::composed};
  const Tensor plain = scaled_dot_product_attention(Var(q), Var(k), Var(v), opt).value();
  Autocast guard(DType::bfloat16);
  const Tensor under = scaled_dot_product_attention(Var(q), Var(k), Var(v), opt).value();
  EXPECT_EQ(under.dtype(), DType::float32);
  EXPECT_TRUE(bit_identical(under, plain));
}

// ---- float32 precisions --------------------------------------------------------------------------

/// A float32 matmul (batched, k = 256) and a convolution, each a fixed computation.
struct Float32Products {
  Tensor mm, conv;
};
Float32Products float32_products(Device d) {
  const Tensor a = Tensor::randn({2, 64, 256}, d, 51), b = Tensor::randn({256, 48}, d, 52);
  const Tensor x = Tensor::randn({2, 16, 12, 12}, d, 53), w = Tensor::randn({8, 16, 3, 3}, d, 54);
  return {matmul(a, b, false, false), conv2d(x, w, Conv2dOptions{.padding = 1})};
}

TEST_P(Precision, HighestFloat32ResultsAreBitIdenticalToTheDefault) {
  RestorePrecision restore;
  const Float32Products before = float32_products(dev());  // nothing set yet: the default
  set_float32_matmul_precision("high");
  set_float32_matmul_precision("highest");
  const Float32Products after = float32_products(dev());
  EXPECT_TRUE(bit_identical(after.mm, before.mm));
  EXPECT_TRUE(bit_identical(after.conv, before.conv));
}

TEST_P(Precision, CpuIgnoresTheFloat32Precision) {
  if (!dev().is_cpu()) GTEST_SKIP() << "the CPU's rule";
  RestorePrecision restore;
  const Float32Products highest = float32_products(dev());
  for (const char* name : {"high", "medium"}) {
    set_float32_matmul_precision(name);
    const Float32Products p = float32_products(dev());
    EXPECT_TRUE(bit_identical(p.mm, highest.mm)) << name;
    EXPECT_TRUE(bit_identical(p.conv, highest.conv)) << name;
  }
}

TEST_P(Precision, GpuHighAndMediumStayWithinTheirProductsRounding) {
  if (dev().is_cpu()) GTEST_SKIP() << "the GPU's rule";
  RestorePrecision restore;
  const Float32Products highest = float32_products(dev());
  set_float32_matmul_precision("high");
  const Float32Products high = float32_products(dev());
  EXPECT_LE(array_error(high.mm, highest.mm, ErrorScale::largest), kTf32Tol);
  EXPECT_LE(array_error(high.conv, highest.conv, ErrorScale::largest), kTf32Tol);
  set_float32_matmul_precision("medium");
  const Float32Products medium = float32_products(dev());
  EXPECT_LE(array_error(medium.mm, highest.mm, ErrorScale::largest), kBf16ProductTol);
  EXPECT_LE(array_error(medium.conv, highest.conv, ErrorScale::largest), kTf32Tol);
}

// ---- autotuned float32 products --------------------------------------------------------------------

TEST(MatmulAutotuneSetting, RoundTripsAndIsOnUnlessTheEnvironmentSaysNo) {
  RestoreAutotune restore;
  const char* env = std::getenv("DUALCAST_MATMUL_AUTOTUNE");
  if (env == nullptr || std::string(env) != "0") EXPECT_TRUE(restore.was);
  else EXPECT_FALSE(restore.was);
  set_matmul_autotune(true);
  EXPECT_TRUE(matmul_autotune());
  set_matmul_autotune(false);
  EXPECT_FALSE(matmul_autotune());
}

/// The HM-LSTM's gate-product shapes (M = 64 rows) and others, every transpose, plain and batched.
struct AutotuneCase {
  std::int64_t batch, m, n, k;
  bool ta, tb;
};
const AutotuneCase kAutotuneCases[] = {{0, 64, 2049, 1540, false, false}, {0, 64, 1540, 2049, false, true},
                                       {0, 1540, 513, 640, true, false}, {0, 37, 53, 71, true, true},
                                       {3, 64, 129, 96, false, false},     {3, 17, 40, 33, true, false}};

TEST_P(Precision, AutotunedFloat32ProductsEqualTheDefaultWithinFloat32Rounding) {
  RestoreAutotune restore;
  const Device d = dev();
  std::uint64_t seed = 300;
  for (const AutotuneCase& c : kAutotuneCases) {
    const Tensor a = Tensor::randn(stored(c.batch, c.m, c.k, c.ta), d, ++seed);
    const Tensor b = Tensor::randn(stored(c.batch, c.k, c.n, c.tb), d, ++seed);
    set_matmul_autotune(false);
    const Tensor plain = matmul(a, b, c.ta, c.tb);
    set_matmul_autotune(true);
    const Tensor tuned = matmul(a, b, c.ta, c.tb);
    const Tensor again = matmul(a, b, c.ta, c.tb);  // the cached choice
    const std::string what = "batch " + std::to_string(c.batch) + " m " + std::to_string(c.m) + " n " +
                             std::to_string(c.n) + " k " + std::to_string(c.k);
    if (d.is_cpu()) {
      EXPECT_TRUE(bit_identical(tuned, plain)) << what << ": the CPU ignores the setting";
    } else {
      EXPECT_LE(array_error(tuned, plain, ErrorScale::largest), kReorderedSumTol) << what;
      EXPECT_LE(array_error(tuned.to(DType::float64).to_vector<double>(), naive_matmul(a, b, c.ta, c.tb),
                            ErrorScale::largest), kReorderedSumTol) << what;
    }
    EXPECT_TRUE(bit_identical(again, tuned)) << what << ": a searched shape keeps its algorithm";
  }
}

TEST_P(Precision, AutotunedGemmAccumulatesSharesOperandsAndTakesUnalignedPointers) {
  if (dev().is_cpu()) GTEST_SKIP() << "the GPU's rule (the CPU ignores the setting)";
  RestoreAutotune restore;
  const Device d = dev();
  const std::int64_t batch = 3, m = 64, n = 131, k = 257;
  // A is shared by the batch (stride 0), B per batch; C starts from values it accumulates into
  // (beta = 1: the search times candidates on a scratch copy and writes C once). The operands start
  // one element into their buffers: 4-byte alignment, which the cache key and the heuristic see.
  const Tensor a = Tensor::randn({1 + m * k}, d, 501), b = Tensor::randn({1 + batch * k * n}, d, 502);
  const Tensor c0 = Tensor::randn({1 + batch * m * n}, d, 503);
  auto product = [&](bool tuned) {
    set_matmul_autotune(tuned);
    Tensor c = c0.clone();
    detail::gemm(d, DType::float32, false, false, m, n, k, 0.5, a.data<float>() + 1, k, 0, b.data<float>() + 1, n,
                 k * n, 1.0, c.data<float>() + 1, n, m * n, batch);
    return c;
  };
  const Tensor plain = product(false), tuned = product(true), again = product(true);
  EXPECT_LE(array_error(tuned, plain, ErrorScale::largest), kReorderedSumTol);
  EXPECT_TRUE(bit_identical(again, tuned));
  EXPECT_EQ(tuned.to_vector<float>()[0], c0.to_vector<float>()[0]) << "the element before C is untouched";
}

TEST_P(Precision, AutotuneSearchesAShapeOnceAndACapturedStepGivesTheEagerBits) {
  if (dev().is_cpu()) GTEST_SKIP() << "the GPU's rule";
  RestoreAutotune restore;
  set_matmul_autotune(true);
  const Device d = dev();
  const Tensor a = Tensor::randn({64, 1029}, d, 401), b = Tensor::randn({1029, 2051}, d, 402);
  const std::int64_t before = detail::matmul_autotune_searches();
  const Tensor eager = matmul(a, b, false, false);
  const std::int64_t after = detail::matmul_autotune_searches();
  EXPECT_LE(after, before + 1);  // (already searched when the test repeats)
  (void)matmul(a, b, false, false);
  EXPECT_EQ(detail::matmul_autotune_searches(), after) << "a searched shape is not searched again";
  Tensor out = Tensor::zeros({64, 2051}, DType::float32, d);
  Graph g;
  g.capture(d, [&] { out.copy_(matmul(a, b, false, false)); });
  g.replay();
  EXPECT_TRUE(bit_identical(out, eager));
}

TEST_P(Precision, AShapeFirstMetInACaptureKeepsCublasAndLaterEagerCallsGiveTheCapturedBits) {
  if (dev().is_cpu()) GTEST_SKIP() << "the GPU's rule";
  RestoreAutotune restore;
  const Device d = dev();
  // A shape no other test uses, so that the capture is where this process meets it first.
  const Tensor a = Tensor::randn({64, 1033}, d, 411), b = Tensor::randn({1033, 2043}, d, 412);
  set_matmul_autotune(false);
  const Tensor untuned = matmul(a, b, false, false);
  set_matmul_autotune(true);
  const std::int64_t before = detail::matmul_autotune_searches();
  Tensor out = Tensor::zeros({64, 2043}, DType::float32, d);
  Graph g;
  g.capture(d, [&] { out.copy_(matmul(a, b, false, false)); });
  g.replay();
  const Tensor eager = matmul(a, b, false, false);
  EXPECT_EQ(detail::matmul_autotune_searches(), before) << "nothing is timed in or after the capture";
  EXPECT_TRUE(bit_identical(out, untuned)) << "the capture ran cublasSgemm";
  EXPECT_TRUE(bit_identical(eager, out)) << "the eager call after it keeps the captured choice";
}

INSTANTIATE_TEST_SUITE_P(Devices, Precision, ::testing::ValuesIn(dualcast::testing::all_devices()),
                         [](const auto& info) { return std::string(dualcast::testing::device_label(info.param)); });

}  // namespace
