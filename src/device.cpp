// device.cpp: device discovery and selection (CUDA runtime queries, cached), synchronisation.
#include "dualcast/device.hpp"

#include <algorithm>

#include <array>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

#include "dualcast/error.hpp"
#include "dualcast/graph.hpp"
#include "dualcast/parallel.hpp"
#include "dualcast/stream.hpp"

#if DUALCAST_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace dualcast {

int cuda_device_count() {
#if DUALCAST_WITH_CUDA
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // "no device" / "no driver" is an answer here, not an error
      return 0;
    }
#if DUALCAST_DEVICE_CODE_CHECK_ONLY
    // Never a slow path in silence: this build's kernels are unoptimized PTX (CMakeLists.txt).
    if (n > 0)
      std::fprintf(stderr, "dualcast: warning: built with DUALCAST_CUDA_DEVICE_CODE=check for a "
                           "machine without a GPU: the kernels are unoptimized PTX, compiled by the "
                           "driver at first use and slow; configure with "
                           "-DDUALCAST_CUDA_DEVICE_CODE=run to use this GPU\n");
#endif
    return n;
  }();
  return count;
#else
  return 0;
#endif
}

bool cuda_available() { return cuda_device_count() > 0; }

Device Device::cuda(int index) {
#if !DUALCAST_WITH_CUDA
  DUALCAST_FAIL("Device::cuda(", index,
                "): this dualcast was built without its CUDA backend (nvcc was not found at "
                "configure time); use Device::cpu()");
#else
  const int n = cuda_device_count();
  DUALCAST_CHECK(n > 0, "Device::cuda(", index,
                 "): no CUDA device is available on this machine; use Device::cpu() or check "
                 "cuda_available() first");
  DUALCAST_CHECK(index >= 0 && index < n, "Device::cuda(", index, "): device index out of range; ",
                 "this machine has ", n, " CUDA device(s), valid indices 0..", n - 1);
  return Device{DeviceKind::cuda, index};
#endif
}

Device Device::parse(const std::string& s) {
  if (s == "cpu") return cpu();
  if (s == "cuda") return cuda(0);
  const std::string digits = s.rfind("cuda:", 0) == 0 ? s.substr(5) : std::string();
  const bool number = !digits.empty() && digits.size() <= 6 &&
                      std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
  DUALCAST_CHECK(number, "Device::parse: '", s, "' is not a device (expected cpu, cuda or cuda:N)");
  return cuda(std::stoi(digits));
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

void synchronize(Device device) {
  if (device.is_cpu()) return;
#if DUALCAST_WITH_CUDA
  detail::check_not_capturing(device, "synchronize");
  detail::DeviceGuard guard(device);
  DUALCAST_CUDA_CHECK(cudaDeviceSynchronize());
#endif
}

int multiprocessor_count(Device device) {
  if (device.is_cpu()) return detail::cpu_thread_count();
#if DUALCAST_WITH_CUDA
  static std::array<int, 64> cache{};
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  int& sms = cache.at(static_cast<std::size_t>(device.index));
  if (sms == 0)
    DUALCAST_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device.index));
  return sms;
#else
  return 1;
#endif
}

std::string device_name(Device device) {
  if (device.is_cpu())
    return "cpu (" + std::to_string(detail::cpu_thread_count()) + " threads)";
#if DUALCAST_WITH_CUDA
  cudaDeviceProp prop{};
  DUALCAST_CUDA_CHECK(cudaGetDeviceProperties(&prop, device.index));
  return prop.name;
#else
  return device.str();
#endif
}

namespace detail {
#if DUALCAST_WITH_CUDA
cudaStream_t stream(Device device) {
  constexpr int kMaxDevices = 64;
  static std::once_flag once[kMaxDevices];
  static cudaStream_t streams[kMaxDevices] = {};
  DUALCAST_CHECK(device.is_cuda() && device.index >= 0 && device.index < kMaxDevices,
                 "stream: ", device.str(), " is not a CUDA device index dualcast can use");
  std::call_once(once[device.index], [&] {
    DeviceGuard guard(device);
    cudaStream_t s = nullptr;
    DUALCAST_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamDefault));
    streams[device.index] = s;
  });
  return streams[device.index];
}
#endif

DeviceGuard::DeviceGuard(Device device) {
#if DUALCAST_WITH_CUDA
  if (!device.is_cuda()) return;
  int current = 0;
  DUALCAST_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device.index) {
    DUALCAST_CUDA_CHECK(cudaSetDevice(device.index));
    previous_ = current;
  }
#else
  (void)device;
#endif
}

DeviceGuard::~DeviceGuard() {
#if DUALCAST_WITH_CUDA
  if (previous_ >= 0) cudaSetDevice(previous_);
#endif
}
}  // namespace detail

}  // namespace dualcast
