// graph.cpp: Graph (graph.hpp). CUDA: stream capture on detail::stream(device), a memory pool of the
// caching allocator per graph (src/memory_pool.hpp), cudaGraphInstantiate and cudaGraphLaunch on the
// same stream. CPU: the callable is stored and called.
#include "dualcast/graph.hpp"

#include <string>

#include "blas.hpp"
#include "dualcast/error.hpp"
#include "dualcast/launch.hpp"
#include "dualcast/stream.hpp"
#include "memory_pool.hpp"

#if DUALCAST_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace dualcast {

namespace {
// The device this thread is capturing on (-1: none). Captures do not nest, on any device: a capture
// inside another would record into the outer stream's graph or be refused by CUDA.
thread_local int t_capture_device = -1;
}  // namespace

struct Graph::Impl {
  Device device{};
  bool captured = false;
  std::function<void()> fn;  // the CPU device's step
#if DUALCAST_WITH_CUDA
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
#endif
  detail::GraphPool* pool = nullptr;

  ~Impl() {
#if DUALCAST_WITH_CUDA
    if (exec != nullptr || graph != nullptr) {
      // An executable graph still in flight is freed by the driver when it completes; its pool's
      // blocks go back to the cache now, and the stream orders any reuse after the replay.
      int previous = -1;
      cudaGetDevice(&previous);
      cudaSetDevice(device.index);
      if (exec != nullptr) cudaGraphExecDestroy(exec);
      if (graph != nullptr) cudaGraphDestroy(graph);
      if (previous >= 0) cudaSetDevice(previous);
    }
#endif
    if (pool != nullptr) detail::pool_release(device, pool);
  }
};

Graph::Graph() : impl_(std::make_unique<Impl>()) {}
Graph::~Graph() = default;
Graph::Graph(Graph&& other) noexcept = default;
Graph& Graph::operator=(Graph&& other) noexcept = default;

Graph::Impl& Graph::impl(const char* op) const {
  DUALCAST_CHECK(impl_ != nullptr, op, ": this Graph was moved from (it holds nothing; use the Graph "
                 "it was moved to)");
  return *impl_;
}

bool Graph::captured() const { return impl_ != nullptr && impl_->captured; }

Device Graph::device() const {
  const Impl& g = impl("Graph::device");
  DUALCAST_CHECK(g.captured, "Graph::device: nothing has been captured yet");
  return g.device;
}

std::size_t Graph::num_nodes() const {
  const Impl& g = impl("Graph::num_nodes");
#if DUALCAST_WITH_CUDA
  if (g.graph == nullptr) return 0;
  std::size_t n = 0;
  DUALCAST_CUDA_CHECK(cudaGraphGetNodes(g.graph, nullptr, &n));
  return n;
#else
  (void)g;
  return 0;
#endif
}

void Graph::capture_impl(Device device, std::function<void()> fn) {
  Impl& g = impl("Graph::capture");
  DUALCAST_CHECK(!g.captured, "Graph::capture: this Graph already holds a step captured on ",
                 g.device.str(), "; a Graph is captured once (create another Graph for another step)");
  DUALCAST_CHECK(static_cast<bool>(fn), "Graph::capture: the callable is empty");
  DUALCAST_CHECK(t_capture_device < 0, "Graph::capture on ", device.str(),
                 ": called inside the capture of another Graph on cuda:", t_capture_device,
                 " (captures cannot be nested)");
  if (device.is_cpu()) {
    g.fn = std::move(fn);
    g.device = device;
    g.captured = true;
    return;
  }
#if DUALCAST_WITH_CUDA
  detail::DeviceGuard guard(device);
  const cudaStream_t s = detail::stream(device);
  // Everything created lazily on first use (the stream, the multiprocessor count, the cuBLAS handle
  // and its workspace, whether launches are chained) is created now: creating it under capture would
  // call unsafe APIs.
  (void)multiprocessor_count(device);
  (void)chained_launches(device);
  detail::blas_prepare(device);
  cudaGetLastError();  // a stale error from earlier work must not be blamed on the capture

  detail::GraphPool* pool = detail::pool_begin_capture(device);
  t_capture_device = device.index;
  cudaGraph_t graph = nullptr;
  // Ends the capture (whatever it recorded is discarded) and undoes the routing to the pool.
  auto abandon = [&] {
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(s, &partial);
    if (partial != nullptr) cudaGraphDestroy(partial);
    cudaGetLastError();
    t_capture_device = -1;
    detail::pool_release(device, pool);
  };
  const cudaError_t begin = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  if (begin != cudaSuccess) {
    cudaGetLastError();
    t_capture_device = -1;
    detail::pool_release(device, pool);
    DUALCAST_FAIL("Graph::capture on ", device.str(), ": cudaStreamBeginCapture failed (",
                  cudaGetErrorString(begin), ")");
  }
  try {
    fn();
  } catch (...) {
    abandon();
    throw;
  }
  const cudaError_t end = cudaStreamEndCapture(s, &graph);
  t_capture_device = -1;
  detail::pool_end_capture(device, pool);
  if (end != cudaSuccess || graph == nullptr) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    detail::pool_release(device, pool);
    DUALCAST_FAIL("Graph::capture on ", device.str(), ": the capture was invalidated (",
                  cudaGetErrorName(end), ": ", cudaGetErrorString(end),
                  "): the step called something that cannot be recorded in a CUDA graph outside "
                  "dualcast (e.g. work on the legacy default stream, cudaMalloc or a synchronising "
                  "call); nothing was captured");
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  if (inst != cudaSuccess) {
    cudaGetLastError();
    cudaGraphDestroy(graph);
    detail::pool_release(device, pool);
    DUALCAST_FAIL("Graph::capture on ", device.str(), ": cudaGraphInstantiate failed (",
                  cudaGetErrorString(inst), ")");
  }
  g.graph = graph;
  g.exec = exec;
  g.pool = pool;
  g.device = device;
  g.captured = true;
  // Uploading now keeps the first replay's setup out of the step's time.
  DUALCAST_CUDA_CHECK(cudaGraphUpload(exec, s));
#else
  DUALCAST_FAIL("Graph::capture on ", device.str(), ": this dualcast was built without CUDA");
#endif
}

void Graph::replay() {
  Impl& g = impl("Graph::replay");
  DUALCAST_CHECK(g.captured, "Graph::replay: nothing has been captured yet (call capture first)");
  if (g.device.is_cpu()) {
    g.fn();
    return;
  }
#if DUALCAST_WITH_CUDA
  DUALCAST_CHECK(t_capture_device < 0 && !detail::pool_capturing(g.device),
                 "Graph::replay on ", g.device.str(),
                 ": called while a capture is in progress there (a replay cannot be recorded)");
  detail::DeviceGuard guard(g.device);
  DUALCAST_CUDA_CHECK(cudaGraphLaunch(g.exec, detail::stream(g.device)));
#endif
}

void Graph::replay(Device device) {
  Impl& g = impl("Graph::replay");
  DUALCAST_CHECK(g.captured, "Graph::replay(", device.str(),
                 "): nothing has been captured yet (call capture first)");
  DUALCAST_CHECK(device == g.device, "Graph::replay(", device.str(), "): this Graph was captured on ",
                 g.device.str(), " and can only be replayed there");
  replay();
}

bool capturing(Device device) { return detail::pool_capturing(device); }

namespace detail {
void check_not_capturing(Device device, const char* what) {
  if (!pool_capturing(device)) return;
  DUALCAST_FAIL(what, " cannot be recorded in a CUDA graph: a Graph is capturing on ", device.str(),
                " (do it before capture() or after replay(); inside the step keep values on the "
                "device)");
}
}  // namespace detail

}  // namespace dualcast
