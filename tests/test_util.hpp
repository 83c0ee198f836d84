// test_util.hpp: helpers shared by the tests: skipping GPU tests without a device, device lists.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "dualcast/device.hpp"
#include "dualcast/gradcheck.hpp"  // running_under_sanitizer

/// Skips the current test cleanly when no CUDA device is usable (CI machines have none).
#define DUALCAST_REQUIRE_CUDA()                                        \
  do {                                                                 \
    if (!::dualcast::cuda_available()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

namespace dualcast::testing {
/// The devices a parameterised test runs on; CUDA is listed whenever the build has it, and tests
/// on it skip at run time where no device is found.
inline std::vector<Device> all_devices() {
  std::vector<Device> devices{Device::cpu()};
#if DUALCAST_WITH_CUDA
  devices.push_back(Device{DeviceKind::cuda, 0});
#endif
  return devices;
}

inline const char* device_label(Device d) { return d.is_cpu() ? "cpu" : "cuda"; }

/// Skip helper for device-parameterised tests.
inline bool skip_if_unavailable(Device d) { return d.is_cuda() && !cuda_available(); }
}  // namespace dualcast::testing

#define DUALCAST_SKIP_IF_UNAVAILABLE(dev)                                                  \
  do {                                                                                     \
    if (::dualcast::testing::skip_if_unavailable(dev)) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

namespace dualcast::testing {
/// `normal`, or `sanitizing` under compute-sanitizer (dualcast::running_under_sanitizer): for the
/// repetition counts and lengths that make a test longer without reaching other code, since every
/// kernel launch there costs milliseconds (racecheck the most). The assertions stay the same.
inline int unless_sanitizing(int normal, int sanitizing) {
  return running_under_sanitizer() ? sanitizing : normal;
}
}  // namespace dualcast::testing
