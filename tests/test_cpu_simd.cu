// test_cpu_simd.cu: the CPU broadcast tiles against the scalar chunks in float32 and float64, every
// arity 1..10 (the checks: cpu_simd_cases.hpp). Compiled as a CPU test, with
// DUALCAST_BROADCAST_HALF=0 (tests/CMakeLists.txt): the 16-bit cases are test_cpu_simd_half.cu's.
#include <utility>

using CpuSimdArities = std::integer_sequence<int, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10>;

#include "cpu_simd_cases.hpp"

INSTANTIATE_TEST_SUITE_P(Dtypes, CpuSimd, ::testing::Values(DType::float32, DType::float64),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });
