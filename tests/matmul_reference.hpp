// matmul_reference.hpp: the tests' reference matrix product, op(A) op(B) in double straight from the
// definition, for every operand layout matmul takes (test_linalg, test_precision).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dualcast/tensor.hpp"

namespace dualcast::testing {

/// op(A) op(B) in double for the shapes matmul accepts (2-D, 3-D, 3-D x 2-D, 2-D x 3-D), of any
/// dtype's values (read as double).
inline std::vector<double> naive_matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
  const int ra = a.rank(), rb = b.rank();
  const std::int64_t batch = ra == 3 ? a.shape()[0] : (rb == 3 ? b.shape()[0] : 1);
  const std::int64_t ar = a.shape()[ra - 2], ac = a.shape()[ra - 1];
  const std::int64_t br = b.shape()[rb - 2], bc = b.shape()[rb - 1];
  const std::int64_t m = ta ? ac : ar, k = ta ? ar : ac, n = tb ? br : bc;
  std::vector<double> c(static_cast<std::size_t>(batch * m * n), 0.0);
  for (std::int64_t s = 0; s < batch; ++s) {
    const double* A = av.data() + (ra == 3 ? s * ar * ac : 0);
    const double* B = bv.data() + (rb == 3 ? s * br * bc : 0);
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double acc = 0.0;
        for (std::int64_t p = 0; p < k; ++p) {
          const double x = ta ? A[p * ac + i] : A[i * ac + p];
          const double y = tb ? B[j * bc + p] : B[p * bc + j];
          acc += x * y;
        }
        c[static_cast<std::size_t>((s * m + i) * n + j)] = acc;
      }
  }
  return c;
}

}  // namespace dualcast::testing
