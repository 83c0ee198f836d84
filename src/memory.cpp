// memory.cpp: host buffers and the caching CUDA allocator.
//
// Why our own cache rather than cub::CachingDeviceAllocator: tests and experiments need exact counts
// of cudaMalloc calls and bytes held, and a retry-after-emptying-the-cache on out-of-memory that
// ends in a dualcast::Error naming the request. The policy is CUB's: blocks are binned by size class
// (four classes per power of two, at most 25% slack), freed blocks wait in a per-class free list, and
// every allocation and free is ordered on the device's one stream, so a block can be reused as soon
// as it is returned.
#include "dualcast/memory.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "dualcast/error.hpp"
#include "dualcast/stream.hpp"

#if DUALCAST_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace dualcast {

namespace {

constexpr std::size_t kHostAlignment = 64;
constexpr int kMaxDevices = 64;

struct DeviceCache {
  std::mutex mutex;
  std::map<std::size_t, std::vector<void*>> free_blocks;
  MemoryStats stats;
};

// The allocator's state is created on first use and never destroyed: a Tensor with static storage
// duration (a program's or a benchmark's cache of inputs) is often created before it and so
// destroyed after it at exit, and its buffer must still find a live cache to go back to.
DeviceCache& cache_for(int index) {
  static DeviceCache* const caches = new DeviceCache[kMaxDevices];
  DUALCAST_CHECK(index >= 0 && index < kMaxDevices, "allocator: device index ", index, " out of range");
  return caches[index];
}

MemoryStats& host_stats() {
  static MemoryStats* const stats = new MemoryStats();
  return *stats;
}
std::mutex& host_mutex() {
  static std::mutex* const m = new std::mutex();
  return *m;
}

#if DUALCAST_WITH_CUDA
/// Size class: below 1 KiB round to 256 bytes; above, to the next of 2^k * {1, 1.25, 1.5, 1.75}.
std::size_t size_class(std::size_t bytes) {
  if (bytes <= 1024) return (bytes + 255) / 256 * 256;
  // No device holds 2^62 bytes: such a request goes to cudaMalloc as it is (and fails there with
  // the out-of-memory error below) instead of overflowing the rounding.
  if (bytes > (SIZE_MAX >> 2)) return bytes;
  std::size_t p = 1;
  while (p * 2 <= bytes) p *= 2;
  const std::size_t step = p / 4;
  return (bytes + step - 1) / step * step;
}

void release_cached(DeviceCache& cache, int index) {
  detail::DeviceGuard guard(Device{DeviceKind::cuda, index});
  for (auto& [size, blocks] : cache.free_blocks) {
    for (void* p : blocks) {
      cudaFree(p);
      ++cache.stats.device_free_calls;
      cache.stats.bytes_held -= static_cast<std::int64_t>(size);
    }
  }
  cache.free_blocks.clear();
}

std::string stats_str(const MemoryStats& s) {
  return detail::concat(s.bytes_held, " bytes held, ", s.bytes_in_use, " in use (peak ",
                        s.peak_bytes_in_use, "), ", s.device_malloc_calls, " cudaMalloc and ",
                        s.device_free_calls, " cudaFree calls, ", s.cache_hits, " cache hits");
}

/// `requested` bytes asked for, served as a block of `block` bytes (its size class).
void* device_allocate(std::size_t requested, std::size_t block, int index) {
  DeviceCache& cache = cache_for(index);
  std::lock_guard lock(cache.mutex);
  auto it = cache.free_blocks.find(block);
  void* p = nullptr;
  if (it != cache.free_blocks.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    ++cache.stats.cache_hits;
  } else {
    detail::DeviceGuard guard(Device{DeviceKind::cuda, index});
    cudaError_t err = cudaMalloc(&p, block);
    const bool retried = err == cudaErrorMemoryAllocation;
    if (retried) {
      cudaGetLastError();
      release_cached(cache, index);  // the cache may hold enough in other size classes
      err = cudaMalloc(&p, block);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();  // not sticky: the device stays usable
      std::size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      cudaGetLastError();
      DUALCAST_FAIL("out of device memory: could not allocate ", requested, " bytes (a block of ",
                    block, ") on cuda:", index,
                    retried ? ", also after returning the allocator's cached blocks to the driver"
                            : "",
                    " (", cudaGetErrorName(err), ": ", cudaGetErrorString(err),
                    "); allocator statistics: ", stats_str(cache.stats), "; the device reports ",
                    free_b, " of ", total_b, " bytes free");
    }
    ++cache.stats.device_malloc_calls;
    cache.stats.bytes_held += static_cast<std::int64_t>(block);
  }
  cache.stats.bytes_in_use += static_cast<std::int64_t>(block);
  if (cache.stats.bytes_in_use > cache.stats.peak_bytes_in_use)
    cache.stats.peak_bytes_in_use = cache.stats.bytes_in_use;
  return p;
}

void device_deallocate(void* p, std::size_t block, int index) noexcept {
  DeviceCache& cache = cache_for(index);
  std::lock_guard lock(cache.mutex);
  cache.free_blocks[block].push_back(p);
  cache.stats.bytes_in_use -= static_cast<std::int64_t>(block);
}
#endif

}  // namespace

MemoryStats memory_stats(Device device) {
  if (device.is_cpu()) {
    std::lock_guard lock(host_mutex());
    return host_stats();
  }
  DeviceCache& cache = cache_for(device.index);
  std::lock_guard lock(cache.mutex);
  return cache.stats;
}

void empty_cache(Device device) {
  if (device.is_cpu()) return;
#if DUALCAST_WITH_CUDA
  DeviceCache& cache = cache_for(device.index);
  std::lock_guard lock(cache.mutex);
  DUALCAST_CUDA_CHECK(cudaDeviceSynchronize());
  release_cached(cache, device.index);
#endif
}

void reset_peak_memory_stats(Device device) {
  if (device.is_cpu()) {
    std::lock_guard lock(host_mutex());
    host_stats().peak_bytes_in_use = host_stats().bytes_in_use;
    return;
  }
  DeviceCache& cache = cache_for(device.index);
  std::lock_guard lock(cache.mutex);
  cache.stats.peak_bytes_in_use = cache.stats.bytes_in_use;
}

Buffer::Buffer(std::size_t bytes, Device device) : bytes_(bytes), device_(device) {
  if (device.is_cpu()) {
    const std::size_t rounded = bytes > SIZE_MAX - kHostAlignment
                                    ? 0  // cannot be rounded up, let alone allocated
                                    : (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
    block_bytes_ = bytes == 0 ? kHostAlignment : rounded;
    data_ = block_bytes_ == 0 ? nullptr : std::aligned_alloc(kHostAlignment, block_bytes_);
    if (data_ == nullptr) {
      MemoryStats s;
      {
        std::lock_guard lock(host_mutex());
        s = host_stats();
      }
      const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
      DUALCAST_FAIL("out of host memory: could not allocate ", bytes, " bytes on cpu (",
                    std::strerror(ENOMEM), "); host statistics: ", s.bytes_in_use,
                    " bytes in use by dualcast (peak ", s.peak_bytes_in_use, "), ",
                    s.device_malloc_calls, " allocations and ", s.device_free_calls,
                    " frees so far; the machine has ",
                    pages > 0 && page > 0 ? static_cast<std::int64_t>(pages) * page : -1,
                    " bytes of physical memory");
    }
    std::lock_guard lock(host_mutex());
    auto& s = host_stats();
    ++s.device_malloc_calls;
    s.bytes_in_use += static_cast<std::int64_t>(block_bytes_);
    s.bytes_held = s.bytes_in_use;
    if (s.bytes_in_use > s.peak_bytes_in_use) s.peak_bytes_in_use = s.bytes_in_use;
    return;
  }
#if DUALCAST_WITH_CUDA
  block_bytes_ = size_class(bytes == 0 ? 1 : bytes);
  data_ = device_allocate(bytes, block_bytes_, device.index);
#else
  DUALCAST_FAIL("Buffer: cannot allocate on ", device.str(), " in a build without CUDA");
#endif
}

void Buffer::release() noexcept {
  if (!data_) return;
  if (device_.is_cpu()) {
    std::free(data_);
    std::lock_guard lock(host_mutex());
    auto& s = host_stats();
    ++s.device_free_calls;
    s.bytes_in_use -= static_cast<std::int64_t>(block_bytes_);
    s.bytes_held = s.bytes_in_use;
  } else {
#if DUALCAST_WITH_CUDA
    device_deallocate(data_, block_bytes_, device_.index);
#endif
  }
  data_ = nullptr;
}

Buffer::~Buffer() { release(); }

Buffer::Buffer(Buffer&& other) noexcept
    : data_(other.data_), bytes_(other.bytes_), block_bytes_(other.block_bytes_),
      device_(other.device_) {
  other.data_ = nullptr;
  other.bytes_ = other.block_bytes_ = 0;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = other.data_;
    bytes_ = other.bytes_;
    block_bytes_ = other.block_bytes_;
    device_ = other.device_;
    other.data_ = nullptr;
    other.bytes_ = other.block_bytes_ = 0;
  }
  return *this;
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if DUALCAST_WITH_CUDA
  const Device d = dst_device.is_cuda() ? dst_device : src_device;
  detail::DeviceGuard guard(d);
  if (dst_device.is_cuda() && src_device.is_cuda() && dst_device.index != src_device.index) {
    // The source device's pending work must finish before its memory is read from elsewhere.
    DUALCAST_CUDA_CHECK(cudaStreamSynchronize(detail::stream(src_device)));
    DUALCAST_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, bytes,
                                            detail::stream(dst_device)));
  } else {
    const cudaStream_t s = detail::stream(d);
    DUALCAST_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
    // A copy that touches host memory is complete when it returns (the caller may read or free it).
    if (dst_device.is_cpu() || src_device.is_cpu()) DUALCAST_CUDA_CHECK(cudaStreamSynchronize(s));
  }
#else
  DUALCAST_FAIL("copy between ", src_device.str(), " and ", dst_device.str(),
                " in a build without CUDA");
#endif
}

}  // namespace dualcast
