// test_elementwise.cu: ops/elementwise.hpp cases found by the differential fuzzer (tests/fuzz), kept
// as regression tests, and the binary functions' three overloads (Var with Var, with a number on
// either side) against finite differences; the fuzzer itself covers every op, overload and broadcast
// pattern at random. Parameterised over every device of the build; CUDA cases skip without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dualcast/gradcheck.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "dualcast/tensor.hpp"
#include "test_util.hpp"

namespace dualcast {
namespace {

class Elementwise : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override { DUALCAST_SKIP_IF_UNAVAILABLE(GetParam()); }
  [[nodiscard]] Device dev() const { return GetParam(); }
};

std::vector<int> ints(const Tensor& mask) {
  const std::vector<std::uint8_t> v = mask.to_vector<std::uint8_t>();
  return {v.begin(), v.end()};
}

// Fuzzer case 0xcd604847d929c1cb: a uint8 mask compared with a number converted the number to uint8,
// so `mask < 0.5` was `mask < 0` and `mask > -1.58` was `mask > 254` (a negative number wrapped).
TEST_P(Elementwise, MaskComparedWithANumberComparesTheMaskValuesWithTheExactNumber) {
  const Tensor m = Tensor::from_vector<std::uint8_t>({4}, {0, 1, 0, 1}, dev());
  EXPECT_EQ(ints(m < 0.5), (std::vector<int>{1, 0, 1, 0}));
  EXPECT_EQ(ints(m <= 0.3), (std::vector<int>{1, 0, 1, 0}));
  EXPECT_EQ(ints(m > -1.58), (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ(ints(m >= 1.5), (std::vector<int>{0, 0, 0, 0}));
  EXPECT_EQ(ints(m == 1.0), (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(ints(m != 0.25), (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ(ints(0.5 < m), (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(ints(256.0 > m), (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ(ints(logical_not(m)), (std::vector<int>{1, 0, 1, 0}));
  // Float tensors keep the documented rule: the number is converted to the tensor's type.
  const Tensor f = Tensor::from_vector<float>({2}, {0.1f, 0.5f}, dev());
  EXPECT_EQ(ints(f == 0.1), (std::vector<int>{1, 0}));
}

// Every function of DUALCAST_BINARY_FUNCTIONS, each overload, through the tape. The first argument
// lies in (0.3, 0.9), the second in (1.1, 1.7) and the numbers are 1.3 and 0.6, so no kink of min or
// max lies within a finite-difference step and pow's base stays positive. Broadcast [4, 1] with
// [1, 5] so that the gradient of the smaller operand is a sum.
TEST_P(Elementwise, EveryBinaryFunctionMatchesFiniteDifferencesWithAVarOrANumberOnEitherSide) {
  const Tensor a = Tensor::uniform({4, 1}, dev(), 31, 0.3, 0.9, DType::float64);
  const Tensor b = Tensor::uniform({1, 5}, dev(), 32, 1.1, 1.7, DType::float64);
  const auto expect_ok = [](const GradCheckResult& r, const std::string& what) {
    EXPECT_TRUE(r.ok) << what << ": " << r.message;
  };
#define DUALCAST_CHECK_BINARY(fn, ...)                                                                \
  expect_ok(check_gradients([](const std::vector<Var>& v) { return fn(v[0], v[1]); }, {a, b}),         \
            #fn "(Var, Var)");                                                                         \
  expect_ok(check_gradients([](const std::vector<Var>& v) { return fn(v[0], 1.3); }, {a}),             \
            #fn "(Var, 1.3)");                                                                         \
  expect_ok(check_gradients([](const std::vector<Var>& v) { return fn(0.6, v[0]); }, {b}), #fn "(0.6, Var)");
  DUALCAST_BINARY_FUNCTIONS(DUALCAST_CHECK_BINARY)
#undef DUALCAST_CHECK_BINARY
}

INSTANTIATE_TEST_SUITE_P(Devices, Elementwise, ::testing::ValuesIn(dualcast::testing::all_devices()),
                         [](const auto& info) { return std::string(dualcast::testing::device_label(info.param)); });

}  // namespace
}  // namespace dualcast
