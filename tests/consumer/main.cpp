// main.cpp: host-only consumer of an installed dualcast (compiled by the host compiler).
#include <dualcast/dualcast.hpp>

#include <cstdio>
#include <exception>

static_assert(__cplusplus >= 202002L, "the dualcast package must request C++20 for its users");

int main() {
  try {
    using dualcast::DType;
    using dualcast::Tensor;
    const Tensor t = Tensor::arange(10, DType::float64);  // 0, 1, ..., 9
    double sum = 0.0;
    for (double x : t.to_vector<double>()) sum += x;
    const double n = dualcast::norm(Tensor::full({2, 3}, 2.0));  // sqrt(6 * 4)
    std::printf("dualcast consumer: %s sum=%g norm^2=%g with_cuda=%d\n", t.str().c_str(), sum, n * n,
                DUALCAST_WITH_CUDA);
    if (sum != 45.0 || n * n < 23.999 || n * n > 24.001) {
      std::printf("dualcast consumer: FAILED (expected sum=45 norm^2=24)\n");
      return 1;
    }
    std::printf("dualcast consumer: OK\n");
    return 0;
  } catch (const std::exception& e) {
    std::printf("dualcast consumer: FAILED with exception: %s\n", e.what());
    return 1;
  }
}
