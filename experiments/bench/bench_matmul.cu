// bench_matmul.cu: Google Benchmark of dualcast::matmul (Tensor API, nothing recorded) against a raw
// cublasSgemm on the same operand buffers, square fp32 N x N x N.
//
//   gpu/matmul/dualcast/N   Tensor c = dualcast::matmul(a, b): argument checks, output allocation
//                           (a hit in the caching allocator after warm-up), the cuBLAS call
//   gpu/matmul/cublas/N     cublasSgemm into a preallocated C, from the bench's own handle (stream 0,
//                           CUBLAS_DEFAULT_MATH, like dualcast's)
//   gpu/matmul/paired/N     both in every iteration, alternating which goes first; manual time is
//                           dualcast's; counters compare medians of the same run
//
// N = 1024, 2048, 4096 (the targets) and 256 (where a fixed host cost would show). Every iteration
// starts from an idle device and is timed by CUDA events around the call on stream 0, so host work
// before the launch (checks, allocation) is inside the measured interval (UseManualTime). Before
// timing, each configuration runs 3 warm-up calls and checks that dualcast's C equals the raw C.
//
// Counters: TFLOPs = 2 N^3 / median time; in `paired` also TFLOPs_cublas, ratio = median dualcast
// time / median cuBLAS time and overhead_pct = 100 (ratio - 1) (target: within 5% at 4096^3), and
// max_rel_diff between the two results. Without a CUDA device (or in a build without CUDA) every
// benchmark reports SkipWithError.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "../common/gpu_timing.hpp"
#include "dualcast/device.hpp"
#include "dualcast/ops/linalg.hpp"
#include "dualcast/tensor.hpp"

#if defined(__CUDACC__)
#include <cublas_v2.h>
#endif

namespace {

using dualcast::Device;
using dualcast::DType;
using dualcast::Shape;
using dualcast::Tensor;

#if defined(__CUDACC__)

double median(std::vector<double> v) { return dcexp::summarize(std::move(v)).median; }

/// Operands of the current size, kept across the framework's repeated calls.
struct Operands {
  std::int64_t n = 0;
  Tensor a, b, c_raw;
};

Operands& operands(std::int64_t n) {
  static Operands ops;
  if (ops.n != n) {
    ops = Operands{};  // release the previous size first
    const Device d = Device::cuda(0);
    ops.a = Tensor::randn(Shape{n, n}, d, 1);
    ops.b = Tensor::randn(Shape{n, n}, d, 2);
    ops.c_raw = Tensor::empty(Shape{n, n}, DType::float32, d);
    ops.n = n;
  }
  return ops;
}

cublasHandle_t raw_handle() {
  static cublasHandle_t h = [] {
    cublasHandle_t handle = nullptr;
    if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cublasCreate failed");
    cublasSetStream(handle, nullptr);
    cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH);
    return handle;
  }();
  return h;
}

/// Row-major C = A B as the column-major C^T = B^T A^T: B first.
void raw_sgemm(const Operands& o) {
  const float alpha = 1.0f, beta = 0.0f;
  const int n = static_cast<int>(o.n);
  const cublasStatus_t s = cublasSgemm(raw_handle(), CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha,
                                       o.b.data<float>(), n, o.a.data<float>(), n, &beta,
                                       o.c_raw.data<float>(), n);
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(cublasGetStatusString(s));
}

/// Runs `fn` between two events on stream 0 from an idle device; returns milliseconds.
template <class Fn>
double timed_ms(dcexp::EventPair& ev, Fn&& fn) {
  DCEXP_CUDA(cudaDeviceSynchronize());
  DCEXP_CUDA(cudaEventRecord(ev.start, nullptr));
  fn();
  DCEXP_CUDA(cudaEventRecord(ev.stop, nullptr));
  return ev.elapsed_ms();
}

/// Warm-up and validation: both paths run 3 times, then dualcast's C must equal the raw C.
/// Returns the worst relative difference (gradcheck.hpp's definition), or a negative on failure.
double warm_up_and_compare(Operands& o, std::string& error) {
  Tensor c;
  for (int r = 0; r < 3; ++r) {
    c = dualcast::matmul(o.a, o.b);
    raw_sgemm(o);
  }
  const std::vector<float> x = c.to_vector<float>(), y = o.c_raw.to_vector<float>();
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double scale = std::max(1.0, std::fabs(static_cast<double>(y[i])));
    const double e = std::fabs(static_cast<double>(x[i]) - y[i]) / scale;
    worst = std::isnan(e) ? INFINITY : std::max(worst, e);
  }
  if (!(worst <= 1e-5)) error = "dualcast::matmul differs from cublasSgemm: max rel diff " + std::to_string(worst);
  return worst;
}

bool have_gpu(benchmark::State& state) {
  if (!dualcast::cuda_available()) {
    state.SkipWithError("no CUDA device available");
    return false;
  }
  return true;
}

enum class Mode { dualcast, cublas, paired };

void bm_matmul(benchmark::State& state, Mode mode) {
  if (!have_gpu(state)) return;
  const std::int64_t n = state.range(0);
  const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  Operands* op = nullptr;
  std::string error;
  double diff = 0;
  try {
    op = &operands(n);
    diff = warm_up_and_compare(*op, error);
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (!error.empty()) {
    state.SkipWithError(error.c_str());
    return;
  }
  Operands& o = *op;
  dcexp::EventPair ev;
  std::vector<double> t_dc, t_raw;
  bool dualcast_first = true;
  for (auto _ : state) {
    double ms = 0;
    auto run_dualcast = [&] {
      const double t = timed_ms(ev, [&] { benchmark::DoNotOptimize(dualcast::matmul(o.a, o.b)); });
      t_dc.push_back(t);
      return t;
    };
    auto run_raw = [&] {
      const double t = timed_ms(ev, [&] { raw_sgemm(o); });
      t_raw.push_back(t);
      return t;
    };
    if (mode == Mode::dualcast) {
      ms = run_dualcast();
    } else if (mode == Mode::cublas) {
      ms = run_raw();
    } else if (dualcast_first) {
      ms = run_dualcast();
      run_raw();
    } else {
      run_raw();
      ms = run_dualcast();
    }
    dualcast_first = !dualcast_first;
    state.SetIterationTime(ms * 1e-3);
  }
  const std::vector<double>& mine = mode == Mode::cublas ? t_raw : t_dc;
  state.counters["TFLOPs"] = flops / (median(mine) * 1e-3) / 1e12;
  if (mode == Mode::paired) {
    const double ratio = median(t_dc) / median(t_raw);
    state.counters["TFLOPs_cublas"] = flops / (median(t_raw) * 1e-3) / 1e12;
    state.counters["ratio"] = ratio;
    state.counters["overhead_pct"] = 100.0 * (ratio - 1.0);
    state.counters["max_rel_diff"] = diff;
  }
  state.SetLabel(dualcast::device_name(Device::cuda(0)));
}

#else  // a host-compiled (CPU-only) build: cuBLAS is not available

enum class Mode { dualcast, cublas, paired };
void bm_matmul(benchmark::State& state, Mode) {
  state.SkipWithError("bench_matmul was built without CUDA (a CPU-only dualcast build)");
}

#endif

void sizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t n : {256, 1024, 2048, 4096}) b->Arg(n);
  b->UseManualTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK_CAPTURE(bm_matmul, dualcast, Mode::dualcast)->Name("gpu/matmul/dualcast")->Apply(sizes);
BENCHMARK_CAPTURE(bm_matmul, cublas, Mode::cublas)->Name("gpu/matmul/cublas")->Apply(sizes);
BENCHMARK_CAPTURE(bm_matmul, paired, Mode::paired)->Name("gpu/matmul/paired")->Apply(sizes);

}  // namespace

BENCHMARK_MAIN();
