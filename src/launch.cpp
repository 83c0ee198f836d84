// launch.cpp: whether kernels are launched chained (launch.hpp), per device and per process.
#include "dualcast/launch.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "dualcast/error.hpp"
#include "per_device.hpp"

namespace dualcast {
namespace {

// -1: as the environment says; 0 / 1: set_chained_launches.
std::atomic<int> g_override{-1};

bool environment_allows() {
  static const bool on = [] {
    const char* e = std::getenv("DUALCAST_CHAINED_LAUNCH");
    if (e == nullptr || *e == '\0') return true;
    DUALCAST_CHECK(std::strcmp(e, "0") == 0 || std::strcmp(e, "1") == 0,
                   "DUALCAST_CHAINED_LAUNCH must be 0 or 1, not '", e, "'");
    return *e == '1';
  }();
  return on;
}

}  // namespace

bool chained_launches(Device device) {
  if (device.is_cpu()) return false;
#if DUALCAST_WITH_CUDA
  const int o = g_override.load(std::memory_order_relaxed);
  if (o == 0 || (o < 0 && !environment_allows())) return false;
  static detail::PerDevice<bool> capable;
  return capable.get(device, "chained_launches", [&] {
    int major = 0;
    DUALCAST_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device.index));
    return major >= 9;  // programmatic dependent launch: Hopper and newer
  });
#else
  return false;
#endif
}

void set_chained_launches(bool on) { g_override.store(on ? 1 : 0, std::memory_order_relaxed); }

namespace detail {
void reset_chained_launches() { g_override.store(-1, std::memory_order_relaxed); }

#if DUALCAST_WITH_CUDA
int add_chain_attribute(Device device, cudaLaunchAttribute* attrs, int count) {
  if (!chained_launches(device)) return count;
  attrs[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[count].val.programmaticStreamSerializationAllowed = 1;
  return count + 1;
}
#endif
}  // namespace detail

}  // namespace dualcast
