// test_tensor_limits.cu: shapes and allocations at the limits. A shape with a negative dimension, or
// whose element count (or byte count) does not fit in 64 bits, is a dualcast::Error naming the op and
// the shape wherever a shape enters the library (factories, view, reshape, broadcasting, matmul,
// concat, split, arange); an allocation larger than the host or the device can give is a
// dualcast::Error naming the request and the allocator's statistics (never std::bad_alloc or a
// crash). After every one of these errors the library computes correctly and its statistics are
// unchanged.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "dualcast/broadcast.hpp"
#include "dualcast/error.hpp"
#include "dualcast/memory.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "dualcast/ops/linalg.hpp"
#include "dualcast/ops/reduce.hpp"
#include "dualcast/ops/shape.hpp"
#include "dualcast/tape.hpp"
#include "dualcast/tensor.hpp"
#include "test_util.hpp"

// Under AddressSanitizer (the debug-asan preset) an impossible malloc aborts the process unless the
// allocator may return null, which is what this test is about.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }

namespace dualcast {

struct LimitsAddOne {  // a * b + 1
  DUALCAST_HD auto operator()(auto a, auto b) const {
    using T = scalar_t<decltype(a * b)>;
    return a * b + T(1);
  }
};

namespace {

constexpr std::int64_t k62 = std::int64_t{1} << 62;
constexpr std::int64_t k40 = std::int64_t{1} << 40;

/// Runs fn, which must throw dualcast::Error whose message holds every one of `parts`.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts,
                  const std::string& what) {
  try {
    fn();
    ADD_FAILURE() << what << ": no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << what << ": '" << p << "' not in: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": threw a non-dualcast exception: " << e.what();
  }
}

/// A small computation through the tape: must still give the right answer after any error.
void expect_library_works(Device dev, const std::string& after) {
  const Var a = Var::param(Tensor::from_vector<float>({2, 2}, {1, 2, 3, 4}, dev));
  const Var b = Var::param(Tensor::from_vector<float>({2, 2}, {1, 0, 0, 1}, dev));
  const Var y = sum(broadcast(LimitsAddOne{}, matmul(a, b), a));  // sum(a a + 1) = 34, b = I
  y.backward();
  EXPECT_EQ(y.item(), 34.0) << "after " << after;
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{2, 4, 6, 8})) << "after " << after;
}

class TensorLimits : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override { DUALCAST_SKIP_IF_UNAVAILABLE(GetParam()); }
  [[nodiscard]] Device dev() const { return GetParam(); }
};

TEST_P(TensorLimits, ShapesWhoseElementCountOverflowsAreErrorsNamingOpAndShape) {
  const Device d = dev();
  const std::string huge2 = "[4611686018427387904, 4611686018427387904]";
  expect_error([&] { (void)Tensor::empty({k62, k62}, DType::float32, d); }, {"Tensor::empty", huge2, "64-bit"},
               "empty 2^62 x 2^62");
  expect_error([&] { (void)Tensor::zeros({k62, k62}, DType::float32, d); }, {"Tensor::zeros", huge2}, "zeros");
  expect_error([&] { (void)Tensor::ones({1 << 21, 1 << 21, 1 << 21}, DType::float32, d); },
               {"Tensor::ones", "[2097152, 2097152, 2097152]"}, "ones 2^63");
  expect_error([&] { (void)Tensor::full({k62, 4}, 1.0, DType::float32, d); }, {"Tensor::full", "[4611686018427387904, 4]"},
               "full");
  expect_error([&] { (void)Tensor::randn({k62, k62}, d, 1); }, {"Tensor::randn", huge2}, "randn");
  expect_error([&] { (void)Tensor::uniform({k62, k62}, d, 1); }, {"Tensor::uniform", huge2}, "uniform");
  expect_error([&] { (void)Tensor::bernoulli({k62, k62}, 0.5, d, 1); }, {"Tensor::bernoulli", huge2}, "bernoulli");
  expect_error([&] { (void)Tensor::from_vector<float>({k62, k62}, {1.0f}, d); }, {"from_vector", huge2}, "from_vector");
  // The element count fits, the byte count does not.
  expect_error([&] { (void)Tensor::empty({k62}, DType::float32, d); },
               {"Tensor::empty", "[4611686018427387904]", "float32", "byte count"}, "empty 2^64 bytes");
  expect_error([&] { (void)Tensor::empty({INT64_MAX}, DType::float64, d); }, {"Tensor::empty", "float64"},
               "empty INT64_MAX float64");
  // Zero-size tensors with huge other dimensions: the product of the non-zero dimensions counts.
  expect_error([&] { (void)Tensor::empty({0, k62, k62}, DType::float32, d); }, {"Tensor::empty", "[0, "},
               "empty 0 x 2^62 x 2^62");
  EXPECT_EQ(Tensor::empty({k62, 0}, DType::float32, d).numel(), 0);
  expect_error([&] { (void)Tensor::arange(0.0, 1e19, 1.0, DType::float32, d); }, {"arange", "64-bit"}, "arange");
  expect_library_works(d, "overflowing factories");
}

TEST_P(TensorLimits, NegativeDimensionsAreErrorsNamingOpAndShape) {
  const Device d = dev();
  expect_error([&] { (void)Tensor::zeros({-1, 3}, DType::float32, d); },
               {"Tensor::zeros", "[-1, 3]", "negative dimension -1"}, "zeros");
  expect_error([&] { (void)Tensor::randn({2, -5}, d, 1); }, {"Tensor::randn", "[2, -5]", "position 1"}, "randn");
  const Tensor x = Tensor::zeros({2, 3}, DType::float32, d);
  expect_error([&] { (void)x.view({-2, -3}); }, {"view", "[-2, -3]", "negative"}, "view");
  expect_error([&] { (void)broadcast_to(x, Shape{-1, 3}); }, {"broadcast_to", "[-1, 3]", "negative"}, "broadcast_to");
  expect_error([&] { (void)sum_to(x, Shape{-3}); }, {"sum_to", "[-3]", "negative"}, "sum_to");
  expect_library_works(d, "negative dimensions");
}

TEST_P(TensorLimits, ShapesBuiltByOpsThatWouldOverflowAreErrorsNamingOpAndShapes) {
  const Device d = dev();
  const Tensor x = Tensor::zeros({2, 3}, DType::float32, d);
  expect_error([&] { (void)x.view({k62, k62}); }, {"view", "[4611686018427387904, 4611686018427387904]"}, "view");
  expect_error([&] { (void)reshape(x, {k40, k40, 6}); }, {"reshape", "[1099511627776, 1099511627776, 6]", "[2, 3]"},
               "reshape");
  expect_error([&] { (void)reshape(Var::param(x), {-1, k62, 8}); }, {"reshape", "[2, 3]"}, "reshape -1");
  expect_error([&] { (void)broadcast_to(x, Shape{k62, k62, 3}); }, {"broadcast_to", "[4611686018427387904, "},
               "broadcast_to");
  // Empty operands whose broadcast or product would be too large to count.
  const Tensor a = Tensor::zeros({0, k40, 1}, DType::float32, d), b = Tensor::zeros({0, 1, k40}, DType::float32, d);
  expect_error([&] { (void)(Var::param(a) + b); }, {"broadcast", "[0, 1099511627776, 1099511627776]", "[0, 1099511627776, 1]"},
               "a + b");
  expect_error([&] { (void)broadcast(LimitsAddOne{}, Var::param(a), b); }, {"broadcast", "[0, 1, 1099511627776]"},
               "broadcast");
  const Tensor m = Tensor::zeros({k40, 0}, DType::float32, d), n = Tensor::zeros({0, k40}, DType::float32, d);
  expect_error([&] { (void)matmul(m, n); }, {"matmul", "[1099511627776, 1099511627776]", "[1099511627776, 0]"}, "matmul");
  const Tensor c = Tensor::zeros({k62, 0}, DType::float32, d);
  expect_error([&] { (void)concat({c, c, c}, 0); }, {"concat", "axis 0", "64-bit"}, "concat");
  expect_error([&] { (void)split(Tensor::zeros({0}, DType::float32, d), 0, {INT64_MAX, 2}); }, {"split", "[0]", "64-bit"},
               "split");
  expect_library_works(d, "overflowing op shapes");
}

TEST(TensorLimitsHost, AHostAllocationThatFailsIsAnErrorNamingTheRequestAndTheStatistics) {
  const Device cpu = Device::cpu();
  const MemoryStats before = memory_stats(cpu);
  // 2^48 float32 elements: 2^50 bytes, more than any host has (and beyond x86-64's user address space).
  expect_error([&] { (void)Tensor::empty({std::int64_t{1} << 48}, DType::float32, cpu); },
               {"Tensor::empty", "[281474976710656]", "float32", "1125899906842624 bytes", "out of host memory",
                "host statistics", "bytes in use"},
               "2^50-byte host tensor");
  expect_error([&] { (void)Tensor::ones({std::int64_t{1} << 47}, DType::float64, cpu); },
               {"Tensor::ones", "out of host memory"}, "2^50-byte ones");
  const MemoryStats after = memory_stats(cpu);
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  EXPECT_EQ(after.device_malloc_calls, before.device_malloc_calls);
  expect_library_works(cpu, "a failed host allocation");
}

/// MemTotal + SwapTotal from /proc/meminfo, in bytes (0 where the file cannot be read): the test's
/// own reading of the machine, not the library's.
std::uint64_t machine_memory_and_swap() {
  std::ifstream in("/proc/meminfo");
  std::uint64_t total = 0;
  for (std::string key, unit; in >> key;) {
    std::uint64_t kib = 0;
    in >> kib;
    std::getline(in, unit);
    if (key == "MemTotal:" || key == "SwapTotal:") total += kib * 1024;
  }
  return total;
}

TEST(TensorLimitsHost, AHostAllocationBeyondMemoryAndSwapIsAnErrorEvenWhereTheHostOvercommits) {
  // On a host with vm.overcommit_memory = 1 (the GPU machines here) aligned_alloc grants such a
  // request and zeros() gets the process killed on the first touch of pages the machine lacks.
  const Device cpu = Device::cpu();
  const std::uint64_t machine = machine_memory_and_swap();
  ASSERT_GT(machine, 0u) << "/proc/meminfo gave no MemTotal";
  const MemoryStats before = memory_stats(cpu);
  const auto just_beyond = static_cast<std::int64_t>((machine + (std::uint64_t{1} << 30)) / 4);
  expect_error([&] { (void)Tensor::zeros({just_beyond}, DType::float32, cpu); },
               {"Tensor::zeros", "out of host memory", "more than the machine's physical memory and swap",
                "bytes of swap"},
               "a host tensor 1 GiB beyond memory and swap");
  expect_error([&] { (void)Tensor::zeros({std::int64_t{1} << 38}, DType::float32, cpu); },
               {"Tensor::zeros", "[274877906944]", "out of host memory"}, "1 TiB host tensor");
  const MemoryStats after = memory_stats(cpu);
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  EXPECT_EQ(after.device_malloc_calls, before.device_malloc_calls);
  expect_library_works(cpu, "a host allocation beyond the machine");
}

TEST(TensorLimitsCuda, ADeviceAllocationBeyondTheDeviceIsAnErrorAndTheDeviceWorksAfterwards) {
  DUALCAST_REQUIRE_CUDA();
  const Device gpu = Device::cuda(0);
  // Leave a cached block behind, so the failed request has a cache to empty before its retry.
  { const Tensor t = Tensor::empty({1 << 24}, DType::float32, gpu); }
  const MemoryStats before = memory_stats(gpu);
  ASSERT_GT(before.bytes_held, before.bytes_in_use);
  expect_error([&] { (void)Tensor::empty({std::int64_t{1} << 48}, DType::float32, gpu); },
               {"Tensor::empty", "[281474976710656]", "cuda:0", "1125899906842624 bytes", "out of device memory",
                "cached blocks", "allocator statistics", "bytes held", "bytes free"},
               "2^50-byte device tensor");
  const MemoryStats after = memory_stats(gpu);
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  EXPECT_EQ(after.bytes_held, after.bytes_in_use) << "the cache was emptied before the retry";
  EXPECT_GT(after.device_free_calls, before.device_free_calls);
  EXPECT_EQ(after.device_malloc_calls, before.device_malloc_calls);
  // A request just beyond the device's memory fails the same way.
  expect_error([&] { (void)Tensor::zeros({std::int64_t{1} << 38}, DType::float32, gpu); },
               {"Tensor::zeros", "out of device memory"}, "1 TiB device tensor");
  expect_library_works(gpu, "failed device allocations");
  const MemoryStats end = memory_stats(gpu);
  EXPECT_GE(end.bytes_held, end.bytes_in_use);
  EXPECT_GE(end.peak_bytes_in_use, end.bytes_in_use);
  EXPECT_EQ(end.bytes_in_use, after.bytes_in_use) << "the computation's buffers were all returned";
}

TEST_P(TensorLimits, FloatsOutsideAnIntegerDtypesRangeSaturateAndNanBecomesZeroOnEveryDevice) {
  // C++ leaves these conversions undefined; the host wrapped (300 -> 44) where the GPU saturated.
  const std::vector<double> xs = {-5.0, -0.5, -0.0, 0.0, 2.7, 254.9, 255.0, 255.5, 300.0, 1e30,
                                  -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity(),
                                  std::numeric_limits<double>::quiet_NaN()};
  const std::vector<std::uint8_t> want = {0, 0, 0, 0, 2, 254, 255, 255, 255, 255, 0, 255, 0};
  const Tensor f64 = Tensor::from_vector<double>({static_cast<std::int64_t>(xs.size())}, xs, GetParam());
  for (DType from : {DType::float64, DType::float32, DType::bfloat16, DType::float16}) {
    const std::vector<std::uint8_t> got = f64.to(from).to(DType::uint8).to_vector<std::uint8_t>();
    for (std::size_t i = 0; i < xs.size(); ++i) {
      // bfloat16 rounds 254.9 to 255 and float16 rounds 254.9 to 254.875: both then truncate as above.
      const std::uint8_t expect = from == DType::bfloat16 && xs[i] == 254.9 ? 255 : want[i];
      EXPECT_EQ(got[i], expect) << dtype_name(from) << " " << xs[i];
    }
  }
  // The host reads follow the same rule (to_vector into an integer type).
  const std::vector<int> ints = Tensor::from_vector<double>({3}, {3e9, -3e9, std::nan("")}, GetParam())
                                    .to_vector<int>();
  EXPECT_EQ(ints, (std::vector<int>{std::numeric_limits<int>::max(), std::numeric_limits<int>::lowest(), 0}));
}

INSTANTIATE_TEST_SUITE_P(Devices, TensorLimits, ::testing::ValuesIn(testing::all_devices()),
                         [](const auto& info) { return std::string(testing::device_label(info.param)); });

}  // namespace
}  // namespace dualcast
