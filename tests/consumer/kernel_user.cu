// kernel_user.cu: CUDA consumer of an installed dualcast: its own DUALCAST_HD functor and lambda run
// through dualcast::parallel_for, on the CPU and, where a GPU is present, on cuda:0. Compiling it
// proves the package carries C++20 and --extended-lambda --expt-relaxed-constexpr for nvcc users.
#include <dualcast/parallel.hpp>
#include <dualcast/tensor.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <vector>

static_assert(__cplusplus >= 202002L, "the dualcast package must request C++20 for CUDA users");

namespace {

// y[i] = max(a * x[i] + y[i], 0): std::max in device code needs --expt-relaxed-constexpr.
struct ReluAxpy {
  float a;
  const float* x;
  float* y;
  DUALCAST_HD void operator()(std::int64_t i) const { y[i] = std::max(a * x[i] + y[i], 0.0f); }
};

bool run_on(dualcast::Device device) {
  using dualcast::DType;
  using dualcast::Tensor;
  constexpr std::int64_t n = 1000;
  const Tensor x = Tensor::arange(n, DType::float32, device);           // 0..999
  Tensor y = Tensor::full({n}, -10.0, DType::float32, device);
  dualcast::parallel_for(device, n, ReluAxpy{2.0f, x.data<float>(), y.data<float>()});
  float* yp = y.data<float>();
  // A __host__ __device__ lambda needs --extended-lambda under nvcc.
  dualcast::parallel_for(device, n, [=] DUALCAST_HD(std::int64_t i) { yp[i] += 1.0f; });
  const std::vector<float> got = y.to_vector<float>();  // waits for the device
  for (std::int64_t i = 0; i < n; ++i) {
    const float want = std::max(2.0f * static_cast<float>(i) - 10.0f, 0.0f) + 1.0f;
    if (got[static_cast<std::size_t>(i)] != want) {
      std::printf("kernel_user: %s: y[%lld] = %g, expected %g\n", device.str().c_str(),
                  static_cast<long long>(i), got[static_cast<std::size_t>(i)], want);
      return false;
    }
  }
  std::printf("kernel_user: %s OK\n", device.str().c_str());
  return true;
}

}  // namespace

int main() {
  try {
    bool ok = run_on(dualcast::Device::cpu());
    if (dualcast::cuda_available())
      ok = run_on(dualcast::Device::cuda(0)) && ok;
    else
      std::printf("kernel_user: no CUDA device, GPU run skipped\n");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("kernel_user: FAILED with exception: %s\n", e.what());
    return 1;
  }
}
