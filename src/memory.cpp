// memory.cpp: host buffers and the caching CUDA allocator.
//
// Why our own cache rather than cub::CachingDeviceAllocator: tests and experiments need exact counts
// of cudaMalloc calls and bytes held, and a retry-after-emptying-the-cache on out-of-memory that
// ends in a dualcast::Error naming the request. The policy is CUB's: blocks are binned by size class
// (four classes per power of two, at most 25% slack), freed blocks wait in a per-class free list, and
// every allocation and free is ordered on the device's one stream, so a block can be reused as soon
// as it is returned.
//
// Graph pools (the end of this file; src/memory_pool.hpp): while a Graph captures on a device, every
// allocation there comes from a pool that belongs to the graph, and every block freed there goes to
// it, so the addresses a captured graph reads and writes are never handed to anyone else.
#include "dualcast/memory.hpp"

#include <sys/sysinfo.h>
#include <unistd.h>

#include <atomic>
#include <utility>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "dualcast/error.hpp"
#include "dualcast/graph.hpp"
#include "dualcast/stream.hpp"
#include "memory_pool.hpp"

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
  // Graph pools: the pool of the capture in progress (null when none), and the pool owning each
  // block that belongs to one (empty while no pool exists, so eager frees skip the lookup).
  std::atomic<detail::GraphPool*> capturing{nullptr};
  std::unordered_map<void*, detail::GraphPool*> pool_of;
  std::vector<std::function<void()>> foreign_due;  // see pool_dissolve and run_foreign_due
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

void* pool_allocate(DeviceCache& cache, detail::GraphPool& pool, std::size_t block, int index);
bool pool_deallocate(DeviceCache& cache, void* p, std::size_t block) noexcept;
void run_foreign_due(DeviceCache& cache, int index) noexcept;

/// `requested` bytes asked for, served as a block of `block` bytes (its size class).
void* device_allocate(std::size_t requested, std::size_t block, int index) {
  DeviceCache& cache = cache_for(index);
  std::lock_guard lock(cache.mutex);
  if (detail::GraphPool* pool = cache.capturing.load()) return pool_allocate(cache, *pool, block, index);
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
  {
    std::lock_guard lock(cache.mutex);
    if (!pool_deallocate(cache, p, block)) {
      cache.free_blocks[block].push_back(p);
      cache.stats.bytes_in_use -= static_cast<std::int64_t>(block);
    }
  }
  run_foreign_due(cache, index);
}

// ---- graph pools (src/memory_pool.hpp) -----------------------------------------------------------

void pool_adopt(DeviceCache& cache, detail::GraphPool& pool, void* p, std::size_t block);

#endif

}  // namespace

namespace detail {
struct GraphPool {
  std::map<std::size_t, std::vector<void*>> free_blocks;
  std::vector<std::pair<void*, std::size_t>> blocks;  // every block the pool owns
  std::int64_t live = 0;                               // of them, handed out to live buffers now
  bool owner_alive = true;
  // Releases of adopted memory (Buffer::adopt) dropped during the capture: the graph may read that
  // memory, so its owner gets it back only when the pool dissolves.
  std::vector<std::function<void()>> foreign;
};
}  // namespace detail

namespace {
// Runs an owner's release of adopted memory; what it throws stays with it (a buffer is dropped in
// destructors).
void run_release(const std::function<void()>& release) noexcept {
  try {
    release();
  } catch (...) {
  }
}

#if DUALCAST_WITH_CUDA
void pool_adopt(DeviceCache& cache, detail::GraphPool& pool, void* p, std::size_t block) {
  pool.blocks.emplace_back(p, block);
  cache.pool_of[p] = &pool;
  cache.stats.graph_pool_bytes += static_cast<std::int64_t>(block);
}

/// Returns every block of `pool` (none in use) to the general cache and deletes the pool.
void pool_dissolve(DeviceCache& cache, detail::GraphPool* pool) noexcept {
  for (const auto& [p, block] : pool->blocks) {
    cache.free_blocks[block].push_back(p);
    cache.pool_of.erase(p);
    cache.stats.graph_pool_bytes -= static_cast<std::int64_t>(block);
  }
  // Run by run_foreign_due once the cache's lock is released: an owner's release may free dualcast
  // memory of its own (a tensor exported with to_dlpack and taken back).
  for (auto& release : pool->foreign) cache.foreign_due.push_back(std::move(release));
  delete pool;
}

// Called WITHOUT cache.mutex held: `releases` once the device's stream has finished with their
// memory (a kernel or a graph's last replay may still be reading it).
void run_releases_after_stream(const std::vector<std::function<void()>>& releases, int index) noexcept {
  if (releases.empty()) return;
  (void)cudaStreamSynchronize(detail::stream(Device{DeviceKind::cuda, index}));
  for (const auto& release : releases) run_release(release);
}

// Called WITHOUT cache.mutex held: the releases of adopted memory whose graph pool dissolved.
void run_foreign_due(DeviceCache& cache, int index) noexcept {
  std::vector<std::function<void()>> due;
  {
    std::lock_guard lock(cache.mutex);
    due.swap(cache.foreign_due);
  }
  run_releases_after_stream(due, index);
}

// Adopted memory dropped on a CUDA device: given to its owner once dualcast's stream is done with
// it, or, during a capture on the device, kept by the capture's pool (pool_dissolve).
void foreign_deallocate(std::function<void()> release, int index) noexcept {
  DeviceCache& cache = cache_for(index);
  {
    std::lock_guard lock(cache.mutex);
    if (detail::GraphPool* pool = cache.capturing.load()) {
      pool->foreign.push_back(std::move(release));
      return;
    }
  }
  run_releases_after_stream({std::move(release)}, index);
}

// Called with cache.mutex held.
void* pool_allocate(DeviceCache& cache, detail::GraphPool& pool, std::size_t block, int index) {
  void* p = nullptr;
  auto own = pool.free_blocks.find(block);
  if (own != pool.free_blocks.end() && !own->second.empty()) {
    p = own->second.back();
    own->second.pop_back();
    ++cache.stats.cache_hits;
  } else if (auto gen = cache.free_blocks.find(block);
             gen != cache.free_blocks.end() && !gen->second.empty()) {
    // An idle block of the general cache: every earlier use of it is ordered before the graph's.
    p = gen->second.back();
    gen->second.pop_back();
    ++cache.stats.cache_hits;
    pool_adopt(cache, pool, p, block);
  } else {
    // cudaMalloc is a "potentially unsafe" call under global capture mode (it may synchronise):
    // allowed for this thread in relaxed mode, as PyTorch's caching allocator does. It does not
    // enter the graph: the block simply exists before the first replay.
    detail::DeviceGuard guard(Device{DeviceKind::cuda, index});
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    const cudaError_t err = cudaMalloc(&p, block);
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (err != cudaSuccess) {
      cudaGetLastError();
      // No retry after emptying the cache here: cudaFree cannot run while a capture is in progress.
      DUALCAST_FAIL("out of device memory during graph capture: could not allocate ", block,
                    " bytes on cuda:", index, " (", cudaGetErrorString(err), "; dualcast holds ",
                    cache.stats.bytes_held, " bytes, ", cache.stats.bytes_in_use,
                    " in use; call empty_cache before capturing to return cached blocks)");
    }
    ++cache.stats.device_malloc_calls;
    cache.stats.bytes_held += static_cast<std::int64_t>(block);
    pool_adopt(cache, pool, p, block);
  }
  ++pool.live;
  cache.stats.bytes_in_use += static_cast<std::int64_t>(block);
  if (cache.stats.bytes_in_use > cache.stats.peak_bytes_in_use)
    cache.stats.peak_bytes_in_use = cache.stats.bytes_in_use;
  return p;
}

// Called with cache.mutex held. Returns false when the block goes to the general cache.
bool pool_deallocate(DeviceCache& cache, void* p, std::size_t block) noexcept {
  detail::GraphPool* const capturing = cache.capturing.load();
  if (cache.pool_of.empty() && capturing == nullptr) return false;
  detail::GraphPool* pool = nullptr;
  if (auto it = cache.pool_of.find(p); it != cache.pool_of.end()) {
    pool = it->second;
    --pool->live;
  } else if (capturing != nullptr) {
    // Allocated before the capture and freed during it: the graph may read it, so it must never be
    // handed to anyone else while the graph lives.
    pool = capturing;
    pool_adopt(cache, *pool, p, block);
  } else {
    return false;
  }
  pool->free_blocks[block].push_back(p);
  cache.stats.bytes_in_use -= static_cast<std::int64_t>(block);
  if (!pool->owner_alive && pool->live == 0 && pool != capturing) pool_dissolve(cache, pool);
  return true;
}
#endif
}  // namespace

namespace detail {

GraphPool* pool_begin_capture(Device device) {
#if DUALCAST_WITH_CUDA
  DeviceCache& cache = cache_for(device.index);
  std::lock_guard lock(cache.mutex);
  DUALCAST_CHECK(cache.capturing.load() == nullptr, "Graph::capture: a capture is already in progress on ",
                 device.str(), " (captures cannot be nested)");
  auto* pool = new GraphPool();
  cache.capturing.store(pool);
  return pool;
#else
  DUALCAST_FAIL("Graph::capture on ", device.str(), ": this dualcast was built without CUDA");
#endif
}

void pool_end_capture(Device device, GraphPool* pool) noexcept {
#if DUALCAST_WITH_CUDA
  DeviceCache& cache = cache_for(device.index);
  std::lock_guard lock(cache.mutex);
  if (cache.capturing.load() == pool) cache.capturing.store(nullptr);
#else
  (void)device;
  (void)pool;
#endif
}

void pool_release(Device device, GraphPool* pool) noexcept {
#if DUALCAST_WITH_CUDA
  if (pool == nullptr) return;
  DeviceCache& cache = cache_for(device.index);
  {
    std::lock_guard lock(cache.mutex);
    if (cache.capturing.load() == pool) cache.capturing.store(nullptr);
    pool->owner_alive = false;
    if (pool->live == 0) pool_dissolve(cache, pool);
  }
  run_foreign_due(cache, device.index);
#else
  (void)device;
  (void)pool;
#endif
}

bool pool_capturing(Device device) noexcept {
  if (!device.is_cuda() || device.index < 0 || device.index >= kMaxDevices) return false;
  return cache_for(device.index).capturing.load() != nullptr;
}

}  // namespace detail

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
  detail::check_not_capturing(device, "empty_cache (it synchronises the device and frees memory)");
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

namespace {

/// What this host can ever hold: its physical memory and its swap, as the kernel reported them at
/// the first host allocation.
struct HostMemory {
  std::uint64_t physical = 0, swap = 0;
};
const HostMemory& host_memory() {
  static const HostMemory m = [] {
    struct sysinfo si {};
    if (sysinfo(&si) != 0) return HostMemory{UINT64_MAX / 2, 0};  // unknown: the allocator decides
    return HostMemory{static_cast<std::uint64_t>(si.totalram) * si.mem_unit,
                      static_cast<std::uint64_t>(si.totalswap) * si.mem_unit};
  }();
  return m;
}

[[noreturn]] void fail_host_allocation(std::size_t bytes, const std::string& why, const HostMemory& m) {
  MemoryStats s;
  {
    std::lock_guard lock(host_mutex());
    s = host_stats();
  }
  DUALCAST_FAIL("out of host memory: could not allocate ", bytes, " bytes on cpu (", why,
                "); host statistics: ", s.bytes_in_use, " bytes in use by dualcast (peak ",
                s.peak_bytes_in_use, "), ", s.device_malloc_calls, " allocations and ",
                s.device_free_calls, " frees so far; the machine has ", m.physical,
                " bytes of physical memory and ", m.swap, " bytes of swap");
}

}  // namespace

Buffer::Buffer(std::size_t bytes, Device device) : bytes_(bytes), device_(device) {
  if (device.is_cpu()) {
    const std::size_t rounded = bytes > SIZE_MAX - kHostAlignment
                                    ? 0  // cannot be rounded up, let alone allocated
                                    : (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
    block_bytes_ = bytes == 0 ? kHostAlignment : rounded;
    // A request the machine can never hold is refused before allocating: a host that overcommits
    // memory (vm.overcommit_memory = 1, as the GPU machines here) grants it, and the first touch of
    // its pages gets the process killed instead of an error.
    const HostMemory& mem = host_memory();
    if (block_bytes_ == 0 || block_bytes_ > mem.physical + mem.swap)
      fail_host_allocation(bytes, "more than the machine's physical memory and swap together", mem);
    data_ = std::aligned_alloc(kHostAlignment, block_bytes_);
    if (data_ == nullptr) fail_host_allocation(bytes, std::strerror(ENOMEM), mem);
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

Buffer Buffer::adopt(void* data, std::size_t bytes, Device device, std::function<void()> release) {
  Buffer b;
  b.data_ = data;
  b.bytes_ = bytes;
  b.device_ = device;
  b.adopted_ = true;
  b.adopted_release_ = std::move(release);
  return b;
}

void Buffer::release() noexcept {
  if (adopted_) {
    // Another library's memory: never freed here; its owner's release (a DLPack deleter) runs once.
    auto release = std::move(adopted_release_);
    adopted_release_ = nullptr;
    adopted_ = false;
    data_ = nullptr;
    if (!release) return;
#if DUALCAST_WITH_CUDA
    if (device_.is_cuda()) {
      foreign_deallocate(std::move(release), device_.index);
      return;
    }
#endif
    run_release(release);
    return;
  }
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
      device_(other.device_), adopted_(other.adopted_), adopted_release_(std::move(other.adopted_release_)) {
  other.data_ = nullptr;
  other.bytes_ = other.block_bytes_ = 0;
  other.adopted_ = false;
  other.adopted_release_ = nullptr;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = other.data_;
    bytes_ = other.bytes_;
    block_bytes_ = other.block_bytes_;
    device_ = other.device_;
    adopted_ = other.adopted_;
    adopted_release_ = std::move(other.adopted_release_);
    other.data_ = nullptr;
    other.bytes_ = other.block_bytes_ = 0;
    other.adopted_ = false;
    other.adopted_release_ = nullptr;
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
  // A copy to or from the host waits for it, and one between devices waits for the source: neither
  // can be recorded in a graph. A device-to-device copy on one device is a graph node like a kernel.
  if (dst_device.is_cpu() || src_device.is_cpu())
    detail::check_not_capturing(d, dst_device.is_cpu() ? "a copy from the device to the host"
                                                       : "a copy from the host to the device");
  else if (dst_device.index != src_device.index) {
    detail::check_not_capturing(src_device, "a copy between two devices");
    detail::check_not_capturing(dst_device, "a copy between two devices");
  }
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
