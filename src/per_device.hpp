// per_device.hpp (private): state a backend keeps per device (a cuBLAS or cuDNN handle, a kernel's
// raised shared-memory limit), made the first time a device asks for it.
#pragma once

#include <mutex>

#include "dualcast/device.hpp"
#include "dualcast/error.hpp"

namespace dualcast::detail {

/// One V per device index, made by make() under std::call_once (thread-safe; a failed make throws and
/// is retried by the next call). Meant as a function-local static that is never torn down: handles
/// outlive the process's static destructors, which would race the CUDA runtime's own teardown.
template <class V>
class PerDevice {
 public:
  static constexpr int kMaxDevices = 64;

  /// The value of `device`, made now when it is the first call for it; `op` names the caller in the
  /// error for a device index out of range.
  template <class Make>
  V get(Device device, const char* op, const Make& make) {
    DUALCAST_CHECK(device.index >= 0 && device.index < kMaxDevices, op, ": device index ", device.index,
                   " out of range");
    std::call_once(once_[device.index], [&] { values_[device.index] = make(); });
    return values_[device.index];
  }

 private:
  std::once_flag once_[kMaxDevices];
  V values_[kMaxDevices] = {};
};

}  // namespace dualcast::detail
