// test_cpu_simd_half.cu: the CPU broadcast tiles against the scalar chunks in bfloat16 and float16
// (the checks: cpu_simd_cases.hpp): the tiles load 16 bits, convert in the lanes, compute in float
// and round once when they store. Arities 1, 4 and 10 (the ends and the paper's cell): every arity
// compiles a body per storage type, and the lanes' conversions do not depend on it.
#include <utility>

using CpuSimdArities = std::integer_sequence<int, 1, 4, 10>;

#include "cpu_simd_cases.hpp"

INSTANTIATE_TEST_SUITE_P(Dtypes, CpuSimd, ::testing::Values(DType::bfloat16, DType::float16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });
