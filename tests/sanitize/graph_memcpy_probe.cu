// graph_memcpy_probe.cu: is compute-sanitizer initcheck's report on test_graph (a CUDA graph's memcpy
// node "reads uninitialised" the buffer a kernel node before it wrote) about dualcast or about the
// tool? The same pattern in plain CUDA, no dualcast: a kernel writes tmp, a D2D cudaMemcpyAsync copies
// tmp to x, on one stream, run eagerly or as a captured graph replayed three times.
//
// Answer (H100, CUDA 13.0, 2026-11-25, tests/sanitize/graph-probe): the tool. With a kernel that takes
// a little longer (`slow`: one block, a grid-stride loop, some arithmetic per element, as dualcast's
// instrumented broadcast kernels) every graph run reports 61-109 "uninitialised" 32-byte pieces of
// tmp, a varying tail of what the kernel wrote, while the values copied are right and the eager run
// reports nothing: initcheck checks the memcpy node without waiting for the kernel node's writes.
// The short kernels below never lose that race. scripts/gpu-sanitize keeps the three test_graph tests
// with this pattern out of initcheck (and says why there).
//
// Build and run on the GPU machine:
//   nvcc -o probe tests/sanitize/graph_memcpy_probe.cu && compute-sanitizer --tool initcheck ./probe graph slow
// First argument: eager | graph | graph-alloc-in-capture (tmp allocated by cudaMalloc during a
// relaxed-mode capture, as dualcast's graph pool does). Further arguments, each one way dualcast
// differs from the plainest form: slow (above), stcs (the kernel writes float4 with streaming
// stores, __stcs, as dualcast's broadcast fast path does), upload (cudaGraphUpload before the first
// launch, as Graph::capture does), global (cudaStreamCaptureModeGlobal, the allocation in capture
// after switching the thread to relaxed mode, as dualcast's graph pool does), default
// (cudaMemcpyDefault, as dualcast's copies), occupancy (the kernel's first touch is an occupancy
// query inside the capture, as dualcast's launcher asks), prewrite-half (tmp's first half written
// eagerly before the capture, as a block from dualcast's cache may be), abandon (first a capture on
// the same stream that records the step into its own buffer, allocated in that capture, and is
// ended and destroyed without a launch: what test_graph does before some reports, in
// expect_uncapturable), abandon-reuse (the same, the abandoned capture writing tmp itself, which the
// real capture then reuses). Exit status 0 when x holds the written values.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <vector>

#define CHECK(x)                                                                  \
  do {                                                                            \
    const cudaError_t e = (x);                                                    \
    if (e != cudaSuccess) {                                                       \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      return 2;                                                                   \
    }                                                                             \
  } while (0)

__global__ void add_one(const float* x, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + 1.0f;
}

__global__ void add_one_stcs(const float4* x, float4* y, int n4) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n4) {
    float4 v = x[i];
    v.x += 1.0f, v.y += 1.0f, v.z += 1.0f, v.w += 1.0f;
    __stcs(y + i, v);
  }
}

// One block, a grid-stride loop and some arithmetic per element: a kernel whose writes come out over
// a longer time, like dualcast's broadcast kernels (instrumented, they take far longer still).
__global__ void add_one_slow(const float* x, float* y, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float v = x[i], acc = 0.0f;
    for (int k = 0; k < 64; ++k) acc = acc * 0.5f + v * 1e-30f;
    y[i] = x[i] + 1.0f + acc * 0.0f;
  }
}

bool has(int argc, char** argv, const char* flag) {
  for (int a = 2; a < argc; ++a)
    if (std::strcmp(argv[a], flag) == 0) return true;
  return false;
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "graph";
  const int n = 1000;
  const std::size_t bytes = n * sizeof(float);
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float *x = nullptr, *tmp = nullptr;
  CHECK(cudaMalloc(&x, bytes));
  CHECK(cudaMemsetAsync(x, 0, bytes, s));
  CHECK(cudaStreamSynchronize(s));
  const bool alloc_in_capture = std::strcmp(mode, "graph-alloc-in-capture") == 0;
  if (!alloc_in_capture) CHECK(cudaMalloc(&tmp, bytes));
  const bool stcs = has(argc, argv, "stcs"), upload = has(argc, argv, "upload");
  const bool global = has(argc, argv, "global"), kind_default = has(argc, argv, "default");
  const bool abandon = has(argc, argv, "abandon"), abandon_reuse = has(argc, argv, "abandon-reuse");
  if (has(argc, argv, "prewrite-half") && !alloc_in_capture) {
    // tmp partly written before the capture (its first half by an eager kernel), as a block from
    // dualcast's cache may be: does the tool then judge the graph's memcpy by tmp's state at launch?
    add_one<<<(n / 2 + 255) / 256, 256, 0, s>>>(x, tmp, n / 2);
    CHECK(cudaStreamSynchronize(s));
  }
  if (abandon || abandon_reuse) {
    // A capture that records a kernel writing a buffer allocated during it, then is given up.
    float* scratch = nullptr;
    CHECK(cudaStreamBeginCapture(s, global ? cudaStreamCaptureModeGlobal : cudaStreamCaptureModeRelaxed));
    cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
    CHECK(cudaThreadExchangeStreamCaptureMode(&m));
    CHECK(cudaMalloc(&scratch, bytes));
    CHECK(cudaThreadExchangeStreamCaptureMode(&m));
    add_one<<<(n + 255) / 256, 256, 0, s>>>(x, scratch, n);
    cudaGraph_t partial = nullptr;
    CHECK(cudaStreamEndCapture(s, &partial));
    CHECK(cudaGraphDestroy(partial));
    if (abandon_reuse && !alloc_in_capture) {
      CHECK(cudaFree(tmp));
      tmp = scratch;  // never written: its only writer was never launched
    } else {
      CHECK(cudaFree(scratch));
    }
  }
  const bool occupancy = has(argc, argv, "occupancy");
  auto step = [&]() -> cudaError_t {  // x = x + 1 through tmp, as x.copy_(x + 1.0) does
    if (occupancy) {
      // The kernel's first touch inside the capture is an occupancy query, as dualcast's launcher
      // asks once per kernel (with lazy module loading this loads the kernel's module mid-capture).
      int blocks = 0;
      const cudaError_t e = stcs ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, add_one_stcs, 256, 0)
                                 : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, add_one, 256, 0);
      if (e != cudaSuccess) return e;
    }
    if (has(argc, argv, "slow"))
      add_one_slow<<<1, 128, 0, s>>>(x, tmp, n);
    else if (stcs)
      add_one_stcs<<<(n / 4 + 255) / 256, 256, 0, s>>>(reinterpret_cast<const float4*>(x),
                                                       reinterpret_cast<float4*>(tmp), n / 4);
    else
      add_one<<<(n + 255) / 256, 256, 0, s>>>(x, tmp, n);
    return cudaMemcpyAsync(x, tmp, bytes, kind_default ? cudaMemcpyDefault : cudaMemcpyDeviceToDevice, s);
  };
  int reps = 3;
  if (std::strcmp(mode, "eager") == 0) {
    for (int r = 0; r < reps; ++r) CHECK(step());
  } else {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CHECK(cudaStreamBeginCapture(s, global ? cudaStreamCaptureModeGlobal : cudaStreamCaptureModeRelaxed));
    if (alloc_in_capture) {
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
      CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
      CHECK(cudaMalloc(&tmp, bytes));
      CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    }
    CHECK(step());
    CHECK(cudaStreamEndCapture(s, &g));
    CHECK(cudaGraphInstantiate(&ge, g, 0));
    if (upload) CHECK(cudaGraphUpload(ge, s));
    for (int r = 0; r < reps; ++r) CHECK(cudaGraphLaunch(ge, s));
    CHECK(cudaGraphExecDestroy(ge));
    CHECK(cudaGraphDestroy(g));
  }
  CHECK(cudaStreamSynchronize(s));
  std::vector<float> h(n);
  CHECK(cudaMemcpy(h.data(), x, bytes, cudaMemcpyDeviceToHost));
  std::printf("%s%s%s%s%s%s: x[0] = %g, x[%d] = %g (want %d)\n", mode, stcs ? " stcs" : "", upload ? " upload" : "", global ? " global" : "", kind_default ? " default" : "", abandon_reuse ? " abandon-reuse" : abandon ? " abandon" : "", h[0], n - 1, h[n - 1], reps);
  CHECK(cudaFree(tmp));
  CHECK(cudaFree(x));
  CHECK(cudaStreamDestroy(s));
  return h[0] == reps && h[n - 1] == reps ? 0 : 1;
}
