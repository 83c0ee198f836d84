// gpu_timing.hpp: timing helpers shared by the benchmarks and experiment drivers (header-only).
//
//  * Summary / summarize(): median, p10, p90 (linear interpolation, as numpy.percentile), min, max,
//    mean of a list of samples.
//  * time_steps_wall(): host wall time (std::chrono) of a callable, after a synchronize callback
//    (the CPU backend; also usable for any device given its synchronize).
//  * time_steps_cuda() (nvcc only): per-repetition CUDA-event time AND host wall time of the same
//    repetitions, each started from an idle device, plus a "pipelined" number (all repetitions back
//    to back between one pair of events, divided by the count: the device's throughput with launch
//    gaps hidden wherever the host runs ahead).
//  * time_steps(): one of the two on a dualcast Device. Both run the one timed loop (timed_loop), which
//    stops after a count of repetitions or where a StopRule says (a time budget, say).
//  * copy bandwidth: a large device-to-device cudaMemcpy (nvcc only) or a multithreaded host memcpy,
//    counting bytes read + bytes written, median of many repetitions.
//  * floor_ms(bytes, GB/s): the memory floor of a kernel that must move `bytes`.
//  * rotation_sets(): how many input sets to rotate among so that repeated steps do not run from
//    the last-level cache (several while one set is smaller than twice the cache).
//
// Everything CUDA sits under `#if defined(__CUDACC__)`, so a .cu file compiled as C++ (the CPU-only
// build) still includes this header.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dualcast/device.hpp"

#if defined(__CUDACC__)
#include <cuda_runtime.h>

#include "dualcast/stream.hpp"
#endif

namespace dcexp {

// ---- statistics ---------------------------------------------------------------------------------

struct Summary {
  double median = NAN, p10 = NAN, p90 = NAN, min = NAN, max = NAN, mean = NAN;
  int n = 0;
};

/// Percentile q in [0, 100] of sorted samples, linear interpolation between closest ranks.
inline double percentile_sorted(const std::vector<double>& s, double q) {
  if (s.empty()) return NAN;
  if (s.size() == 1) return s[0];
  const double pos = q / 100.0 * static_cast<double>(s.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, s.size() - 1);
  const double w = pos - static_cast<double>(lo);
  return s[lo] * (1.0 - w) + s[hi] * w;
}

inline Summary summarize(std::vector<double> v) {
  Summary r;
  r.n = static_cast<int>(v.size());
  if (v.empty()) return r;
  std::sort(v.begin(), v.end());
  r.median = percentile_sorted(v, 50);
  r.p10 = percentile_sorted(v, 10);
  r.p90 = percentile_sorted(v, 90);
  r.min = v.front();
  r.max = v.back();
  double s = 0;
  for (double x : v) s += x;
  r.mean = s / static_cast<double>(v.size());
  return r;
}

/// The result of timing one step function.
struct StepTimes {
  Summary wall_ms;            ///< host clock around each repetition (device idle at the start)
  Summary gpu_ms;             ///< CUDA events around each repetition (n = 0 on the CPU)
  double pipelined_ms = NAN;  ///< reps back to back, one sync at the end, divided by reps
  int warmup = 0;
  int reps = 0;
  /// The headline per-step time: the GPU's events where there are any, else the host wall time.
  [[nodiscard]] const Summary& primary() const { return gpu_ms.n > 0 ? gpu_ms : wall_ms; }
};

// ---- host wall time -------------------------------------------------------------------------------

inline double now_ms() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double, std::milli>(clock::now().time_since_epoch()).count();
}

/// prepare(r) then step(r) for r = 0 .. n-1, untimed and with no synchronisation (the warm-up, and the
/// back-to-back pipelined runs).
template <class Prepare, class Step>
void run_steps(Prepare&& prepare, Step&& step, int n) {
  for (int r = 0; r < n; ++r) {
    prepare(r);
    step(r);
  }
}

/// When a timed loop stops: asked before each timed repetition with the repetitions done so far and
/// the wall milliseconds since the loop began (untimed preparations included), so that a measurement
/// can end on a count, on a time budget, or on both.
using StopRule = std::function<bool(int done, double elapsed_ms)>;

/// The rule of a fixed count.
inline StopRule after_reps(int reps) {
  return [reps](int done, double) { return done >= reps; };
}

/// The timed loop of every timing here: prepare(r) (untimed), then step(r) between clock.start() and
/// clock.stop(), until `stop` says so. Returns the repetitions timed.
template <class Prepare, class Step, class Clock>
int timed_loop(Prepare&& prepare, Step&& step, const StopRule& stop, Clock& clock) {
  const double start = now_ms();
  int r = 0;
  for (; !stop(r, now_ms() - start); ++r) {
    prepare(r);
    clock.start();
    step(r);
    clock.stop();
  }
  return r;
}

/// Times step(rep) with the host clock: `warmup` untimed calls, then timed ones until `stop` says so,
/// each preceded by prepare(rep) (untimed; e.g. zero_grad) and followed by sync() (inside the timing);
/// with `pipelined`, the same count once more back to back.
template <class Prepare, class Step, class Sync>
StepTimes time_steps_wall(Prepare&& prepare, Step&& step, Sync&& sync, int warmup, const StopRule& stop,
                          bool pipelined = true) {
  struct WallClock {
    Sync& sync;
    std::vector<double> ms;
    double t0 = 0;
    void start() {
      sync();
      t0 = now_ms();
    }
    void stop() {
      sync();
      ms.push_back(now_ms() - t0);
    }
  } clock{sync, {}};
  StepTimes out;
  out.warmup = warmup;
  run_steps(prepare, step, warmup);
  sync();
  out.reps = timed_loop(prepare, step, stop, clock);
  out.wall_ms = summarize(std::move(clock.ms));
  if (pipelined) {
    const double t0 = now_ms();
    run_steps(prepare, step, out.reps);
    sync();
    out.pipelined_ms = (now_ms() - t0) / std::max(1, out.reps);
  }
  return out;
}

/// The same for a fixed count of `reps` timed repetitions.
template <class Prepare, class Step, class Sync>
StepTimes time_steps_wall(Prepare&& prepare, Step&& step, Sync&& sync, int warmup, int reps) {
  return time_steps_wall(prepare, step, sync, warmup, after_reps(reps));
}

// ---- floor and rotation -------------------------------------------------------------------------------

/// Milliseconds to move `bytes` at `gbps` (1e9 bytes per second).
inline double floor_ms(double bytes, double gbps) { return gbps > 0 ? bytes / (gbps * 1e9) * 1e3 : NAN; }
/// Achieved GB/s when `bytes` move in `ms`.
inline double achieved_gbps(double bytes, double ms) { return ms > 0 ? bytes / (ms * 1e-3) / 1e9 : NAN; }

/// Input sets to rotate among: enough that sets * set_bytes >= 2 * cache_bytes, at most max_sets.
inline int rotation_sets(std::size_t set_bytes, std::size_t cache_bytes, int max_sets = 16) {
  if (set_bytes == 0) return 1;
  const double need = std::ceil(2.0 * static_cast<double>(cache_bytes) / static_cast<double>(set_bytes));
  return static_cast<int>(std::clamp(need, 1.0, static_cast<double>(std::max(1, max_sets))));
}

/// Size of the largest CPU cache (bytes) from sysfs; 32 MiB if it cannot be read.
inline std::size_t host_llc_bytes() {
  std::size_t best = 0;
  for (int idx = 0; idx < 8; ++idx) {
    std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(idx) + "/size");
    if (!in) continue;
    std::string s;
    in >> s;
    if (s.empty()) continue;
    std::size_t mult = 1;
    const char unit = s.back();
    if (unit == 'K' || unit == 'k') mult = 1024;
    if (unit == 'M' || unit == 'm') mult = 1024 * 1024;
    const std::size_t v = std::strtoull(s.c_str(), nullptr, 10) * mult;
    best = std::max(best, v);
  }
  return best ? best : std::size_t(32) << 20;
}

/// Bytes of host memory available now (MemAvailable), 0 if unknown.
inline std::size_t host_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::size_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

// ---- copy bandwidth -------------------------------------------------------------------------------

struct Bandwidth {
  double gbps = NAN;        ///< median, (bytes read + bytes written) / time
  double gbps_p10 = NAN;    ///< from the p90 time (slow end)
  double gbps_p90 = NAN;    ///< from the p10 time (fast end)
  double bytes_copied = 0;  ///< size of one copy (read + write = 2x this)
  Summary ms;
  std::string how;
};

/// Host copy bandwidth: `threads` threads each memcpy their slice of a `bytes` buffer (first-touched
/// by the same thread), median of `reps` repetitions after 2 warm-ups.
inline Bandwidth measure_host_copy_bandwidth(std::size_t bytes = std::size_t(256) << 20, int reps = 10,
                                             int threads = 0) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bytes = bytes / 64 * 64;
  std::unique_ptr<char[]> src(new char[bytes]), dst(new char[bytes]);
  const std::size_t slice = (bytes / static_cast<std::size_t>(threads)) / 64 * 64;
  auto run = [&](auto&& fn) {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      const std::size_t b = slice * static_cast<std::size_t>(t);
      const std::size_t e = t + 1 == threads ? bytes : b + slice;
      pool.emplace_back([&, b, e] { fn(b, e); });
    }
    for (auto& th : pool) th.join();
  };
  run([&](std::size_t b, std::size_t e) {
    std::memset(src.get() + b, 0x5a, e - b);
    std::memset(dst.get() + b, 0, e - b);
  });
  std::vector<double> ms;
  for (int r = 0; r < reps + 2; ++r) {
    const double t0 = now_ms();
    run([&](std::size_t b, std::size_t e) { std::memcpy(dst.get() + b, src.get() + b, e - b); });
    const double dt = now_ms() - t0;
    if (r >= 2) ms.push_back(dt);
  }
  Bandwidth bw;
  bw.ms = summarize(ms);
  bw.bytes_copied = static_cast<double>(bytes);
  bw.gbps = achieved_gbps(2.0 * static_cast<double>(bytes), bw.ms.median);
  bw.gbps_p10 = achieved_gbps(2.0 * static_cast<double>(bytes), bw.ms.p90);
  bw.gbps_p90 = achieved_gbps(2.0 * static_cast<double>(bytes), bw.ms.p10);
  bw.how = "host memcpy, " + std::to_string(threads) + " threads, " +
           std::to_string(bytes >> 20) + " MiB, read+write";
  return bw;
}

#if defined(__CUDACC__)

// ---- CUDA ---------------------------------------------------------------------------------------------

/// Throws std::runtime_error with the expression and CUDA's message.
#define DCEXP_CUDA(expr)                                                                      \
  do {                                                                                        \
    const cudaError_t dcexp_err_ = (expr);                                                    \
    if (dcexp_err_ != cudaSuccess)                                                            \
      throw std::runtime_error(std::string(#expr) + ": " + cudaGetErrorString(dcexp_err_) +   \
                               " (" + __FILE__ + ":" + std::to_string(__LINE__) + ")");       \
  } while (0)

/// RAII pair of events.
struct EventPair {
  cudaEvent_t start{}, stop{};
  EventPair() {
    DCEXP_CUDA(cudaEventCreate(&start));
    DCEXP_CUDA(cudaEventCreate(&stop));
  }
  ~EventPair() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
  float elapsed_ms() {
    DCEXP_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    DCEXP_CUDA(cudaEventElapsedTime(&ms, start, stop));
    return ms;
  }
};

/// Times step(rep) on the GPU: warm-up, then timed repetitions until `stop` says so, each started
/// from an idle device (cudaDeviceSynchronize), timed by CUDA events on `stream` and by the host clock
/// (the host clock stops after the stop event completes); then, with `pipelined`, the pipelined
/// throughput. prepare(rep) runs before each repetition, untimed. Checks cudaGetLastError after every
/// repetition.
template <class Prepare, class Step>
StepTimes time_steps_cuda(Prepare&& prepare, Step&& step, int warmup, const StopRule& stop,
                          cudaStream_t stream = nullptr, bool pipelined = true) {
  struct EventClock {
    cudaStream_t stream;
    EventPair ev;
    std::vector<double> gpu, wall;
    double t0 = 0;
    void start() {
      DCEXP_CUDA(cudaDeviceSynchronize());
      t0 = now_ms();
      DCEXP_CUDA(cudaEventRecord(ev.start, stream));
    }
    void stop() {
      DCEXP_CUDA(cudaEventRecord(ev.stop, stream));
      const double g = ev.elapsed_ms();  // waits for the stop event
      wall.push_back(now_ms() - t0);
      gpu.push_back(g);
      DCEXP_CUDA(cudaGetLastError());
    }
  };
  StepTimes out;
  out.warmup = warmup;
  run_steps(prepare, step, warmup);
  DCEXP_CUDA(cudaDeviceSynchronize());
  DCEXP_CUDA(cudaGetLastError());
  EventClock clock{stream};
  out.reps = timed_loop(prepare, step, stop, clock);
  out.gpu_ms = summarize(std::move(clock.gpu));
  out.wall_ms = summarize(std::move(clock.wall));
  if (pipelined) {
    DCEXP_CUDA(cudaDeviceSynchronize());
    DCEXP_CUDA(cudaEventRecord(clock.ev.start, stream));
    run_steps(prepare, step, out.reps);
    DCEXP_CUDA(cudaEventRecord(clock.ev.stop, stream));
    out.pipelined_ms = clock.ev.elapsed_ms() / std::max(1, out.reps);
    DCEXP_CUDA(cudaGetLastError());
  }
  return out;
}

/// The same for a fixed count of `reps` timed repetitions.
template <class Prepare, class Step>
StepTimes time_steps_cuda(Prepare&& prepare, Step&& step, int warmup, int reps, cudaStream_t stream = nullptr) {
  return time_steps_cuda(prepare, step, warmup, after_reps(reps), stream);
}

/// L2 size of the current device (bytes).
inline std::size_t cuda_l2_bytes(int device = 0) {
  int v = 0;
  DCEXP_CUDA(cudaDeviceGetAttribute(&v, cudaDevAttrL2CacheSize, device));
  return static_cast<std::size_t>(v);
}

/// (free, total) device memory in bytes.
inline std::pair<std::size_t, std::size_t> cuda_mem_info() {
  std::size_t free_b = 0, total_b = 0;
  DCEXP_CUDA(cudaMemGetInfo(&free_b, &total_b));
  return {free_b, total_b};
}

/// Device-to-device copy bandwidth: one cudaMemcpy of `bytes` (capped at a quarter of the free
/// memory), `reps` repetitions after 3 warm-ups, CUDA events, (read + write) / median time.
/// Allocates with cudaMalloc directly and frees before returning.
inline Bandwidth measure_cuda_copy_bandwidth(std::size_t bytes = std::size_t(1) << 30, int reps = 30) {
  const auto [free_b, total_b] = cuda_mem_info();
  (void)total_b;
  bytes = std::min(bytes, free_b / 4) / 256 * 256;
  if (bytes < (std::size_t(1) << 20))
    throw std::runtime_error("measure_cuda_copy_bandwidth: too little free device memory");
  void* src = nullptr;
  void* dst = nullptr;
  DCEXP_CUDA(cudaMalloc(&src, bytes));
  DCEXP_CUDA(cudaMalloc(&dst, bytes));
  Bandwidth bw;
  try {
    DCEXP_CUDA(cudaMemset(src, 0x5a, bytes));
    DCEXP_CUDA(cudaMemset(dst, 0x00, bytes));
    EventPair ev;
    std::vector<double> ms;
    for (int r = 0; r < reps + 3; ++r) {
      DCEXP_CUDA(cudaEventRecord(ev.start));
      DCEXP_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
      DCEXP_CUDA(cudaEventRecord(ev.stop));
      const double t = ev.elapsed_ms();
      if (r >= 3) ms.push_back(t);
    }
    bw.ms = summarize(ms);
  } catch (...) {
    cudaFree(src);
    cudaFree(dst);
    throw;
  }
  DCEXP_CUDA(cudaFree(src));
  DCEXP_CUDA(cudaFree(dst));
  bw.bytes_copied = static_cast<double>(bytes);
  bw.gbps = achieved_gbps(2.0 * static_cast<double>(bytes), bw.ms.median);
  bw.gbps_p10 = achieved_gbps(2.0 * static_cast<double>(bytes), bw.ms.p90);
  bw.gbps_p90 = achieved_gbps(2.0 * static_cast<double>(bytes), bw.ms.p10);
  bw.how = "cudaMemcpy D2D " + std::to_string(bytes >> 20) + " MiB, read+write, median of " +
           std::to_string(reps);
  return bw;
}

#endif  // __CUDACC__

// ---- on a dualcast device -----------------------------------------------------------------------

/// Where time_steps records its CUDA events: on the stream dualcast issues the device's work to, or
/// on the legacy default stream (which orders with it: dualcast's stream is a blocking one).
enum class EventStream { dualcast, legacy };

/// The timing of every driver: time_steps_cuda on a CUDA device, time_steps_wall (dualcast::synchronize
/// as the sync) on the CPU. A CUDA device in a build without nvcc is a std::runtime_error.
template <class Prepare, class Step>
StepTimes time_steps(dualcast::Device device, Prepare&& prepare, Step&& step, int warmup, const StopRule& stop,
                     bool pipelined = true, EventStream events = EventStream::dualcast) {
  if (device.is_cuda()) {
#if defined(__CUDACC__)
    // The events, the legacy stream and cudaDeviceSynchronize belong to the current device: make it
    // `device`, or timing cuda:K (K > 0) from a thread on GPU 0 fails (events of another device).
    const dualcast::detail::DeviceGuard guard(device);
    const cudaStream_t stream = events == EventStream::dualcast ? dualcast::detail::stream(device) : nullptr;
    return time_steps_cuda(prepare, step, warmup, stop, stream, pipelined);
#else
    (void)events;
    throw std::runtime_error("built without nvcc: cannot time on " + device.str());
#endif
  }
  return time_steps_wall(prepare, step, [&] { dualcast::synchronize(device); }, warmup, stop, pipelined);
}

/// The same for a fixed count of `reps` timed repetitions.
template <class Prepare, class Step>
StepTimes time_steps(dualcast::Device device, Prepare&& prepare, Step&& step, int warmup, int reps,
                     EventStream events = EventStream::dualcast) {
  return time_steps(device, prepare, step, warmup, after_reps(reps), true, events);
}

}  // namespace dcexp
