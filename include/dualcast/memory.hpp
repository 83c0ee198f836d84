// memory.hpp: Buffer, the move-only owner of tensor storage, and the caching device allocator behind
// it (a size seen before is served from the cache, never by a second cudaMalloc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "dualcast/device.hpp"

namespace dualcast {

/// Counters of the caching allocator of one device; cheap to read, for tests and experiments.
struct MemoryStats {
  std::int64_t device_malloc_calls = 0;  ///< cudaMalloc calls made so far (host: allocations)
  std::int64_t device_free_calls = 0;    ///< cudaFree calls (only when the cache is emptied)
  std::int64_t cache_hits = 0;           ///< allocations served from the cache
  std::int64_t bytes_held = 0;           ///< bytes obtained from the device and not yet released
  std::int64_t bytes_in_use = 0;         ///< bytes handed out to live buffers
  std::int64_t peak_bytes_in_use = 0;
  /// Of bytes_held, the bytes that belong to the memory pools of CUDA graphs (graph.hpp): reserved
  /// for their replays, never handed to other allocations, returned to the cache with the graph.
  std::int64_t graph_pool_bytes = 0;
};

/// Statistics of the allocator serving `device`.
MemoryStats memory_stats(Device device);
/// Returns every cached, unused block of `device` to the driver (cudaFree); live buffers and the
/// blocks of graph pools stay. A dualcast::Error while a graph is being captured on `device`.
void empty_cache(Device device);
/// Starts a new peak: peak_bytes_in_use of `device` becomes its current bytes_in_use (so a long
/// run's peak is its own, not that of whatever ran before it in the process).
void reset_peak_memory_stats(Device device);

/// Owns `bytes` of memory on a device: host memory (64-byte aligned) or a block of the caching
/// device allocator, or memory owned elsewhere (`adopt`: another library's tensor, through
/// DLPack). Move-only: a deep copy is always an explicit Tensor::clone().
class Buffer {
 public:
  Buffer() = default;
  Buffer(std::size_t bytes, Device device);
  /// Memory that dualcast neither allocated nor frees: `release` (may be empty) runs once, when the
  /// buffer goes (a DLPack deleter, dlpack.hpp), on the thread that drops it. On a CUDA device it
  /// runs once dualcast's stream has finished with the memory (the stream is synchronised first);
  /// dropped while a Graph captures on that device, it waits until the graph's memory pool is gone
  /// (its replays may read the memory). Not counted in memory_stats.
  static Buffer adopt(void* data, std::size_t bytes, Device device, std::function<void()> release);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  [[nodiscard]] void* data() const { return data_; }
  [[nodiscard]] std::size_t bytes() const { return bytes_; }
  [[nodiscard]] Device device() const { return device_; }

 private:
  void release() noexcept;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t block_bytes_ = 0;  // size class actually reserved (device blocks)
  Device device_{};
  bool adopted_ = false;                   // the memory is another owner's (adopt): never freed here
  std::function<void()> adopted_release_;  // what that owner runs when the buffer goes
};

/// Copies `bytes` between any two devices (host<->device, device<->device, host<->host). A copy to
/// the host waits for the device; other copies are stream-ordered. While a graph is being captured
/// on a device, a copy between it and the host or another device is a dualcast::Error (only copies
/// within the device can be recorded).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes);

}  // namespace dualcast
