// bench_broadcast.cu: Google Benchmark of mixed-mode broadcast, forward + backward.
//
//   {gpu,cpu}/hmlstm_update/{recompute,store}/DIMS   the paper's HM-LSTM cell update (K = 4) through
//                                                    broadcast: z, zb [DIMS,1] row flags (rows 0/1/2
//                                                    FLUSH/COPY/UPDATE, others Bernoulli(0.5)), c, f,
//                                                    i, g [DIMS,DIMS] randn, adjoint randn
//   {gpu,cpu}/hmlstm_update/reverse/DIMS             the select form on Vars (one kernel per primitive)
//   {gpu,cpu}/arity/{recompute,store,reverse}/K      prod_k tanh(x_k > 0.5 ? x_k : -x_k), K = 1..10
//   gpu/copy_d2d                                     the copy that defines the floor (same binary run)
//
// GPU benchmarks use manual time from CUDA events around each forward+backward (UseManualTime); CPU
// ones real time. Each configuration is validated once before it is timed (mixed gradients against
// the reverse-mode select form; a mismatch is reported with SkipWithError). Gradients are reset
// between iterations (zero_grad), so every backward writes fresh buffers (assigned, not accumulated);
// input sets rotate while one set fits twice in the cache.
//
// Counters: bytes = what the method must move per step (recompute: 3K+2 fp32 values per element;
// store: 4K+2; reverse: the recompute count, i.e. its floor), GB/s = bytes / mean step time,
// floor_us = bytes(recompute count) / measured copy bandwidth, x_floor = mean time / floor_us,
// mallocs = cudaMalloc calls during the timed iterations (GPU: 0 expected, all from the caching
// allocator; CPU: every host allocation counts), sets = input sets, val_err = the validation error,
// host_us (GPU) = the host's wall time inside one step (it starts on an idle GPU, so this is the
// cost of issuing the step: tape, allocations, argument packing, launches; issue 10, item 2).
//
// GPU sizes: DIMS 512..8192, arity at 2048. CPU sizes (2-core friendly): DIMS 256..1024, arity at
// 512, and DIMS 16, whose 256 elements leave the per-call host cost of the CPU path.
// Without a CUDA device the GPU benchmarks are not registered (a line on stderr says so).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../common/gpu_timing.hpp"
#include "../hmlstm/workloads.hpp"
#include "dualcast/device.hpp"
#include "dualcast/gradcheck.hpp"
#include "dualcast/memory.hpp"

namespace {

using hmexp::CellSet;
using hmexp::FlagLayout;
using dualcast::Device;
using dualcast::Partials;
using dualcast::Var;

enum class Method { recompute, store, reverse };
const char* method_name(Method m) {
  return m == Method::recompute ? "recompute" : m == Method::store ? "store" : "reverse";
}

double g_gpu_copy_gbps = 0;  // measured once per run, before the first GPU benchmark
double g_cpu_copy_gbps = 0;

double copy_gbps(Device d) {
  if (d.is_cuda()) {
#if defined(__CUDACC__)
    if (g_gpu_copy_gbps <= 0) g_gpu_copy_gbps = dcexp::measure_cuda_copy_bandwidth().gbps;
#endif
    return g_gpu_copy_gbps;
  }
  if (g_cpu_copy_gbps <= 0) g_cpu_copy_gbps = dcexp::measure_host_copy_bandwidth(std::size_t(128) << 20, 5).gbps;
  return g_cpu_copy_gbps;
}

std::size_t cache_bytes(Device d) {
#if defined(__CUDACC__)
  if (d.is_cuda()) return dcexp::cuda_l2_bytes(d.index);
#endif
  (void)d;
  return dcexp::host_llc_bytes();
}

// ---- the configurations -----------------------------------------------------------------------------

struct Config {
  bool arity = false;  // false: HM-LSTM update (K = 4)
  int K = 4;
  std::int64_t dims = 0;
  Device device;
  Method method = Method::recompute;
  [[nodiscard]] std::string key() const {
    return std::string(arity ? "arity" : "update") + "/" + std::to_string(K) + "/" + std::to_string(dims) + "/" +
           device.str();
  }
};

/// The input sets of the current configuration (kept across the framework's repeated calls of one
/// benchmark, rebuilt when the configuration changes) and whether they were validated.
struct Cache {
  std::string key;
  std::vector<CellSet> sets;
  std::string validation_error;  // empty: validated
  double max_err = 0;
};
Cache& cache() {
  static Cache c;
  return c;
}

Var step(const Config& c, const CellSet& s, Method m) {
  if (c.arity) return m == Method::reverse ? hmexp::step_c_reverse(s) : hmexp::step_c_mixed(s, m == Method::store ? Partials::store : Partials::recompute);
  return m == Method::reverse ? hmexp::step_a_reverse(s) : hmexp::step_a_mixed(s, m == Method::store ? Partials::store : Partials::recompute);
}

std::vector<std::vector<float>> grads_of(CellSet& s) {
  std::vector<std::vector<float>> g;
  for (auto& v : s.x) g.push_back(v.grad().to_vector<float>());
  return g;
}

/// Builds the sets of `c` (if not cached) and validates mixed (both policies) against reverse mode.
Cache& prepare(const Config& c) {
  Cache& k = cache();
  if (k.key == c.key()) return k;
  k.sets.clear();
  k.key = c.key();
  k.validation_error.clear();
  const int M = 1;
  const auto set_bytes = static_cast<std::size_t>(c.dims * c.dims * (c.K + M) * 4);
  const int nsets = dcexp::rotation_sets(set_bytes, cache_bytes(c.device), 16);
  for (int j = 0; j < nsets; ++j)
    k.sets.push_back(c.arity ? hmexp::make_arity_set(c.dims, c.K, c.device, 50 + static_cast<std::uint64_t>(j))
                             : hmexp::make_cell_set(c.dims, 4, 1, FlagLayout::rows, c.device, 60 + static_cast<std::uint64_t>(j)));
  // Validation on set 0: mixed (recompute, store) against the reverse-mode select form.
  CellSet& s = k.sets[0];
  s.zero_grad();
  const std::vector<float> out_r = step(c, s, Method::reverse).value().to_vector<float>();
  const auto g_r = grads_of(s);
  k.max_err = 0;
  for (Method m : {Method::recompute, Method::store}) {
    s.zero_grad();
    const std::vector<float> out_m = step(c, s, m).value().to_vector<float>();
    constexpr auto largest = dualcast::ErrorScale::largest;
    double e = dualcast::array_error(out_m, out_r, largest);
    const auto g_m = grads_of(s);
    for (std::size_t q = 0; q < g_m.size(); ++q) e = std::max(e, dualcast::array_error(g_m[q], g_r[q], largest));
    k.max_err = std::max(k.max_err, e);
    if (!(e <= dualcast::kSameResultTolFloat)) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "validation failed: mixed (%s) vs reverse: max rel err %.3e", method_name(m), e);
      k.validation_error = buf;
    }
  }
  s.zero_grad();
  return k;
}

void run_config(benchmark::State& state, const Config& c) {
  Cache* kp = nullptr;
  try {
    kp = &prepare(c);
  } catch (const std::exception& e) {
    cache().key.clear();
    state.SkipWithError(e.what());
    return;
  }
  Cache& k = *kp;
  if (!k.validation_error.empty()) {
    state.SkipWithError(k.validation_error.c_str());
    return;
  }
  const auto nsets = static_cast<int>(k.sets.size());
  // Warm-up: one pass over every set (fills the allocator's cache with every size the step needs).
  for (int j = 0; j < nsets; ++j) {
    k.sets[static_cast<std::size_t>(j)].zero_grad();
    (void)step(c, k.sets[static_cast<std::size_t>(j)], c.method);
  }
  dualcast::synchronize(c.device);
  const auto mallocs0 = dualcast::memory_stats(c.device).device_malloc_calls;
  double total_s = 0, host_s = 0;
  std::int64_t it = 0;
#if defined(__CUDACC__)
  std::unique_ptr<dcexp::EventPair> ev;
  if (c.device.is_cuda()) ev = std::make_unique<dcexp::EventPair>();
#endif
  for (auto _ : state) {
    CellSet& s = k.sets[static_cast<std::size_t>(it % nsets)];
    s.zero_grad();  // fresh gradient buffers: the backward assigns, never accumulates
    if (c.device.is_cuda()) {
#if defined(__CUDACC__)
      cudaEventRecord(ev->start);
      const double h0 = dcexp::now_ms();
      (void)step(c, s, c.method);  // the queue is empty here: this is the host's own cost
      host_s += (dcexp::now_ms() - h0) * 1e-3;
      cudaEventRecord(ev->stop);
      const double sec = ev->elapsed_ms() * 1e-3;
      state.SetIterationTime(sec);
      total_s += sec;
#endif
    } else {
      const double t0 = dcexp::now_ms();
      (void)step(c, s, c.method);
      total_s += (dcexp::now_ms() - t0) * 1e-3;
    }
    ++it;
  }
  dualcast::synchronize(c.device);
#if defined(__CUDACC__)
  if (c.device.is_cuda()) {
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
      state.SkipWithError(cudaGetErrorString(err));
      return;
    }
  }
#endif
  for (auto& s : k.sets) s.zero_grad();
  const std::int64_t n = c.dims * c.dims;
  const int K = c.K;
  const double bytes = hmexp::bytes_moved(n, K, 1, c.method == Method::store ? Partials::store : Partials::recompute);
  const double floor_bytes = hmexp::bytes_moved(n, K, 1, Partials::recompute);
  const double mean_s = it > 0 ? total_s / static_cast<double>(it) : NAN;
  const double floor_s = floor_bytes / (copy_gbps(c.device) * 1e9);
  state.counters["bytes"] = bytes;
  state.counters["GB/s"] = bytes / mean_s / 1e9;
  state.counters["floor_us"] = floor_s * 1e6;
  state.counters["x_floor"] = mean_s / floor_s;
  state.counters["mallocs"] = static_cast<double>(dualcast::memory_stats(c.device).device_malloc_calls - mallocs0);
  state.counters["sets"] = nsets;
  state.counters["val_err"] = k.max_err;
  if (c.device.is_cuda() && it > 0) state.counters["host_us"] = host_s / static_cast<double>(it) * 1e6;
  state.SetLabel(c.arity ? "K=" + std::to_string(K) + " dims=" + std::to_string(c.dims) : "dims=" + std::to_string(c.dims));
}

#if defined(__CUDACC__)
void run_copy(benchmark::State& state) {
  const std::size_t bytes = std::size_t(1) << 30;
  const auto [free_b, total_b] = dcexp::cuda_mem_info();
  (void)total_b;
  const std::size_t nb = std::min(bytes, free_b / 4) / 256 * 256;
  void *src = nullptr, *dst = nullptr;
  if (cudaMalloc(&src, nb) != cudaSuccess || cudaMalloc(&dst, nb) != cudaSuccess) {
    cudaFree(src);
    state.SkipWithError("cudaMalloc failed");
    return;
  }
  cudaMemset(src, 0x5a, nb);
  cudaMemset(dst, 0, nb);
  dcexp::EventPair ev;
  double total_s = 0;
  std::int64_t it = 0;
  for (int w = 0; w < 3; ++w) cudaMemcpy(dst, src, nb, cudaMemcpyDeviceToDevice);
  for (auto _ : state) {
    cudaEventRecord(ev.start);
    cudaMemcpyAsync(dst, src, nb, cudaMemcpyDeviceToDevice);
    cudaEventRecord(ev.stop);
    const double sec = ev.elapsed_ms() * 1e-3;
    state.SetIterationTime(sec);
    total_s += sec;
    ++it;
  }
  cudaFree(src);
  cudaFree(dst);
  state.counters["bytes"] = 2.0 * static_cast<double>(nb);
  state.counters["GB/s"] = 2.0 * static_cast<double>(nb) * static_cast<double>(it) / total_s / 1e9;
  state.counters["floor_GB/s"] = copy_gbps(Device::cuda(0));  // the figure the floors use
  state.SetLabel("read+write, " + std::to_string(nb >> 20) + " MiB");
}
#endif

void register_all() {
  const bool gpu = dualcast::cuda_available();
  std::vector<Device> devices;
#if defined(__CUDACC__)
  if (gpu) devices.push_back(Device::cuda(0));
#endif
  devices.push_back(Device::cpu());
  if (!gpu) std::fprintf(stderr, "bench_broadcast: no CUDA device: GPU benchmarks skipped (CPU ones run)\n");
#if defined(__CUDACC__)
  if (gpu) benchmark::RegisterBenchmark("gpu/copy_d2d", run_copy)->UseManualTime()->Unit(benchmark::kMicrosecond);
#endif
  for (const Device& d : devices) {
    const std::string dev = d.is_cuda() ? "gpu" : "cpu";
    const std::vector<std::int64_t> dims = d.is_cuda() ? std::vector<std::int64_t>{512, 1024, 2048, 4096, 8192}
                                                       : std::vector<std::int64_t>{16, 256, 512, 1024};
    const std::int64_t arity_dims = d.is_cuda() ? 2048 : 512;
    auto reg = [&](const std::string& name, const Config& c) {
      auto* b = benchmark::RegisterBenchmark(name.c_str(), [c](benchmark::State& st) { run_config(st, c); });
      b->Unit(benchmark::kMicrosecond);
      if (d.is_cuda()) b->UseManualTime();
      else b->UseRealTime();
    };
    for (const auto n : dims)
      for (Method m : {Method::recompute, Method::store, Method::reverse})
        reg(dev + "/hmlstm_update/" + method_name(m) + "/" + std::to_string(n), Config{false, 4, n, d, m});
    for (int K = 1; K <= 10; ++K)
      for (Method m : {Method::recompute, Method::store, Method::reverse})
        reg(dev + "/arity/" + method_name(m) + "/" + std::to_string(K), Config{true, K, arity_dims, d, m});
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
