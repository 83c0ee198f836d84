// device.hpp: where a tensor lives (CPU or a CUDA device) and questions about the machine's GPUs.
#pragma once

#include <string>

#include "dualcast/config.hpp"

namespace dualcast {

enum class DeviceKind { cpu, cuda };

/// A place where tensors live and kernels run. `Device::cuda(i)` checks that device i exists and
/// throws dualcast::Error otherwise, so a bad device is caught where it is named, not at first use.
struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;

  static Device cpu() { return Device{DeviceKind::cpu, 0}; }
  static Device cuda(int index = 0);
  /// The device a spelling names: "cpu", "cuda" (device 0) or "cuda:N", as str() writes them (and
  /// PyTorch spells them). Anything else, or a CUDA device that is not there, is a dualcast::Error
  /// naming the spelling.
  static Device parse(const std::string& spelling);

  [[nodiscard]] bool is_cpu() const { return kind == DeviceKind::cpu; }
  [[nodiscard]] bool is_cuda() const { return kind == DeviceKind::cuda; }
  [[nodiscard]] std::string str() const;

  friend bool operator==(const Device& a, const Device& b) {
    return a.kind == b.kind && (a.kind == DeviceKind::cpu || a.index == b.index);
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

/// True when the library was built with CUDA and at least one CUDA device is usable.
bool cuda_available();
/// Number of usable CUDA devices (0 in a CPU-only build or on a machine without a GPU).
int cuda_device_count();
/// Blocks the host until all work queued on `device` has finished (no-op on the CPU). A dualcast::Error
/// while a Graph is capturing on `device` (graph.hpp).
void synchronize(Device device);
/// Multiprocessor count of a CUDA device (cached); used to size grid-stride launches.
int multiprocessor_count(Device device);
/// Name of the device ("cpu (N threads)" or the GPU's name), for reports.
std::string device_name(Device device);

namespace detail {
/// Makes `device` current for the calling thread while in scope (CUDA devices only).
class DeviceGuard {
 public:
  explicit DeviceGuard(Device device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};
}  // namespace detail

}  // namespace dualcast
