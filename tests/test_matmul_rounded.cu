// test_matmul_rounded.cu: matmul_rounded (ops/linalg.hpp), the product Autocast computes with its
// float32 sums kept. Values against a double triple loop over the operands rounded to 16 bits, for
// every transpose combination, both 16-bit types, float32 and 16-bit operands, odd sizes; on CUDA
// the skinny split-K kernel and cuBLAS each against that reference (forced one way, then the
// other), at every copy width of the kernel and at the HM-LSTM's shapes too, and the kernel bit for
// bit the same over repeated launches; argument errors that name the op and shapes, after which the
// op still works.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "../src/gemm_skinny.hpp"  // force_skinny(), to test both paths
#include "dualcast/gradcheck.hpp"
#include "dualcast/ops/linalg.hpp"
#include "nn_reference.hpp"  // expect_error
#include "test_util.hpp"

using namespace dualcast;
using dualcast::testing::expect_error;

namespace {

/// Each product sums k exactly representable products (a 16-bit value times a 16-bit value fits a
/// float) in float32: about sqrt(k) ulps of the largest partial sum, judged against the result's
/// largest entry. Far below 16-bit rounding (kSameResultTolBfloat16 = 2^-7), so a result rounded to
/// 16 bits, or an operand left unrounded, fails it.
constexpr double kRoundedSumTol = 2e-5;

/// C = op(A) op(B) in double over the operands' values rounded to `dtype`.
std::vector<double> reference(const Tensor& a, const Tensor& b, DType dtype, bool ta, bool tb) {
  const std::vector<double> av = a.to(Device::cpu()).to(dtype).to_vector<double>();
  const std::vector<double> bv = b.to(Device::cpu()).to(dtype).to_vector<double>();
  const std::int64_t m = ta ? a.shape()[1] : a.shape()[0], k = ta ? a.shape()[0] : a.shape()[1];
  const std::int64_t n = tb ? b.shape()[0] : b.shape()[1];
  std::vector<double> c(static_cast<std::size_t>(m * n), 0.0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (std::int64_t p = 0; p < k; ++p)
        s += av[static_cast<std::size_t>(ta ? p * m + i : i * k + p)] *
             bv[static_cast<std::size_t>(tb ? j * k + p : p * n + j)];
      c[static_cast<std::size_t>(i * n + j)] = s;
    }
  return c;
}

/// A [rows, cols] operand of dtype t: seeded normal values.
Tensor operand(std::int64_t rows, std::int64_t cols, DType t, Device d, std::uint64_t seed) {
  const Tensor x = Tensor::randn(Shape{rows, cols}, d, seed);
  return t == DType::float32 ? x : x.to(t);
}

class MatmulRounded : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override { DUALCAST_SKIP_IF_UNAVAILABLE(GetParam()); }
  void TearDown() override { detail::force_skinny(-2); }
  Device dev() const { return GetParam(); }

  /// Every flag combination and operand dtype at [m, k] x [k, n] against reference().
  void check_all(std::int64_t m, std::int64_t k, std::int64_t n, const std::string& what) {
    for (DType h : {DType::bfloat16, DType::float16})
      for (DType ta_dtype : {DType::float32, h})
        for (DType tb_dtype : {DType::float32, h})
          for (bool ta : {false, true})
            for (bool tb : {false, true}) {
              const Tensor a = ta ? operand(k, m, ta_dtype, dev(), 1) : operand(m, k, ta_dtype, dev(), 1);
              const Tensor b = tb ? operand(n, k, tb_dtype, dev(), 2) : operand(k, n, tb_dtype, dev(), 2);
              const Tensor c = matmul_rounded(a, b, h, ta, tb);
              ASSERT_EQ(c.dtype(), DType::float32);
              ASSERT_EQ(c.shape(), (Shape{m, n}));
              EXPECT_LE(array_error(c.to_vector<double>(), reference(a, b, h, ta, tb), ErrorScale::largest),
                        kRoundedSumTol)
                  << what << " " << dtype_name(h) << " a " << dtype_name(ta_dtype) << " " << a.shape().str()
                  << (ta ? "^T" : "") << " b " << dtype_name(tb_dtype) << " " << b.shape().str() << (tb ? "^T" : "");
            }
  }
};

TEST_P(MatmulRounded, MatchesTheDoubleProductOfTheRoundedOperands) {
  // Odd sizes, size-1 dimensions, k spanning several of the kernel's 64-wide steps, m past 64.
  for (const auto& [m, k, n] : {std::tuple{1, 1, 1}, {3, 5, 4}, {7, 130, 9}, {64, 200, 129}, {65, 70, 33}})
    check_all(m, k, n, "measured choice");
}

TEST_P(MatmulRounded, SkinnyKernelAndCublasEachMatchTheReference) {
  if (!dev().is_cuda()) GTEST_SKIP() << "the two CUDA paths";
  for (int mode : {1, 0}) {
    detail::force_skinny(mode);
    const std::string what = mode == 1 ? "skinny kernel" : "cuBLAS";
    // Unaligned pitches (odd k and n), one slice and many, a partial last column tile and m = 1.
    for (const auto& [m, k, n] : {std::tuple{1, 3, 1}, {17, 1, 65}, {33, 129, 200}, {64, 777, 131}})
      check_all(m, k, n, what);
  }
}

TEST_P(MatmulRounded, SkinnyKernelMatchesTheReferenceAtEveryCopyWidth) {
  if (!dev().is_cuda()) GTEST_SKIP() << "the CUDA kernel's copies";
  detail::force_skinny(1);
  // The kernel copies each operand's rows in the widest chunks their pitch allows. k = 256: 16 bytes
  // for every operand; k = n = 132: 16 for a float32 A, 8 for 16-bit rows; 130: 8 and 4; n = 131: a
  // 16-bit B [k, n] at an odd pitch (no cp.async). k = 2600 over 8 slices is 7 steps per slice,
  // more than the ring's 4 stages, and m = 31 leaves two of the four warps without rows.
  for (const auto& [m, k, n] : {std::tuple{64, 256, 64}, {48, 132, 132}, {64, 130, 130}, {31, 2600, 131}})
    check_all(m, k, n, "skinny kernel");
}

TEST_P(MatmulRounded, HmLstmGateShapesMatchTheReferenceOnBothPaths) {
  if (!dev().is_cuda()) GTEST_SKIP() << "the two CUDA paths";
  // Forward s = x W (W^T kept as [G, K] bfloat16) and backward dx = ds W^T, H = 512 (K = 1540, G = 2049).
  const Tensor x = operand(64, 1540, DType::float32, dev(), 3);
  const Tensor ds = operand(64, 2049, DType::float32, dev(), 4);
  const Tensor wt = operand(2049, 1540, DType::bfloat16, dev(), 5);
  for (int mode : {1, 0}) {
    detail::force_skinny(mode);
    const Tensor s = matmul_rounded(x, wt, DType::bfloat16, false, true);
    const Tensor dx = matmul_rounded(ds, wt, DType::bfloat16, false, false);
    EXPECT_LE(array_error(s.to_vector<double>(), reference(x, wt, DType::bfloat16, false, true), ErrorScale::largest),
              kRoundedSumTol)
        << "forward, mode " << mode;
    EXPECT_LE(array_error(dx.to_vector<double>(), reference(ds, wt, DType::bfloat16, false, false),
                          ErrorScale::largest),
              kRoundedSumTol)
        << "backward, mode " << mode;
  }
}

TEST_P(MatmulRounded, SkinnyKernelGivesTheSameBitsEveryLaunch) {
  if (!dev().is_cuda()) GTEST_SKIP() << "the CUDA kernel's split-K order";
  detail::force_skinny(1);
  const Tensor a = operand(48, 3001, DType::float32, dev(), 6);
  const Tensor b = operand(3001, 300, DType::bfloat16, dev(), 7);
  const std::vector<double> first = matmul_rounded(a, b, DType::bfloat16).to_vector<double>();
  for (int i = 0; i < 20; ++i) ASSERT_EQ(matmul_rounded(a, b, DType::bfloat16).to_vector<double>(), first) << i;
}

TEST_P(MatmulRounded, EmptyInnerDimensionGivesZerosAndEmptyOuterGivesEmpty) {
  const Tensor z = matmul_rounded(Tensor::zeros(Shape{3, 0}, DType::float32, dev()),
                                  Tensor::zeros(Shape{0, 4}, DType::float32, dev()), DType::bfloat16);
  EXPECT_EQ(z.shape(), (Shape{3, 4}));
  EXPECT_EQ(z.to_vector<double>(), std::vector<double>(12, 0.0));
  EXPECT_EQ(matmul_rounded(Tensor::zeros(Shape{0, 5}, DType::float32, dev()),
                           Tensor::zeros(Shape{5, 4}, DType::float32, dev()), DType::float16)
                .shape(),
            (Shape{0, 4}));
}

TEST_P(MatmulRounded, BadArgumentsRaiseErrorsNamingShapesAndTheNextCallStillWorks) {
  const Tensor a = operand(4, 6, DType::float32, dev(), 8);
  const Tensor b = operand(6, 5, DType::bfloat16, dev(), 9);
  expect_error([&] { (void)matmul_rounded(a, b, DType::float32); }, {"matmul_rounded", "'dtype'", "float32"});
  expect_error([&] { (void)matmul_rounded(a.to(DType::float64), b, DType::bfloat16); },
               {"matmul_rounded", "'a' [4, 6]", "float64"});
  expect_error([&] { (void)matmul_rounded(a, b, DType::float16); }, {"matmul_rounded", "'b' [6, 5]", "bfloat16"});
  expect_error([&] { (void)matmul_rounded(a, b, DType::bfloat16, true); },
               {"matmul_rounded", "inner dimensions", "[4, 6]", "trans_a=true"});
  expect_error([&] { (void)matmul_rounded(a.view(Shape{2, 2, 6}), b, DType::bfloat16); },
               {"matmul_rounded", "'a' has shape [2, 2, 6]", "2-D"});
  expect_error([&] { (void)matmul_rounded(Tensor(), b, DType::bfloat16); }, {"matmul_rounded", "'a'", "undefined"});
  if (cuda_available()) {
    const Device other = dev().is_cpu() ? Device::cuda(0) : Device::cpu();
    expect_error([&] { (void)matmul_rounded(a, b.to(other), DType::bfloat16); }, {"matmul_rounded", "[6, 5]"});
  }
  // Nothing is left broken: a valid product right after the failures is correct.
  const Tensor c = matmul_rounded(a, b, DType::bfloat16);
  EXPECT_LE(array_error(c.to_vector<double>(), reference(a, b, DType::bfloat16, false, false), ErrorScale::largest),
            kRoundedSumTol);
}

INSTANTIATE_TEST_SUITE_P(Devices, MatmulRounded, ::testing::ValuesIn(dualcast::testing::all_devices()),
                         [](const ::testing::TestParamInfo<Device>& info) {
                           return std::string(dualcast::testing::device_label(info.param));
                         });

}  // namespace
