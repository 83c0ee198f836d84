// communicator_nccl.cpp: the NCCL backend. Collectives run on a stream of their own that waits for
// the device's stream (stream.hpp) and is joined back into it by wait(), all with events, so the host
// never blocks and a captured step records the NCCL calls with the rest.
#include "communicator_internal.hpp"
#include "dualcast/error.hpp"

#if DUALCAST_WITH_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "dualcast/graph.hpp"

#include "dualcast/stream.hpp"
#endif

namespace dualcast::dist::detail {

#if DUALCAST_WITH_NCCL
namespace {

#define DUALCAST_NCCL_CHECK(expr, comm)                                                           \
  do {                                                                                            \
    const ncclResult_t dualcast_nccl_ = (expr);                                                   \
    if (dualcast_nccl_ != ncclSuccess)                                                            \
      DUALCAST_FAIL("dist: rank ", rank(), ": ", #expr, " failed: ", ncclGetErrorString(dualcast_nccl_), \
                    " (", ncclGetLastError(comm), ")");                                          \
  } while (0)

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::float32: return ncclFloat32;
    case DType::float64: return ncclFloat64;
    case DType::bfloat16: return ncclBfloat16;
    case DType::float16: return ncclFloat16;
    default: break;
  }
  DUALCAST_FAIL("dist: NCCL collectives take floating tensors, not ", dtype_name(t));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const Env& env, Device device, std::unique_ptr<Rendezvous> rdv)
      : Communicator(env, device), rdv_(std::move(rdv)), watched_(watchdog_enabled()) {
    ncclUniqueId id{};
    if (rank() == 0) DUALCAST_NCCL_CHECK(ncclGetUniqueId(&id), nullptr);
    rdv_->broadcast_from_root(&id, sizeof id, "NCCL unique id");
    // One process per GPU: the rank's GPU becomes the thread's current device for good (PyTorch's
    // torch.cuda.set_device(local_rank)), so that code using the current device (the user's own
    // kernels, events, cudaDeviceSynchronize) works on this rank's GPU and not on GPU 0.
    DUALCAST_CUDA_CHECK(cudaSetDevice(device.index));
    ::dualcast::detail::DeviceGuard guard(device);
    DUALCAST_NCCL_CHECK(ncclCommInitRank(&comm_, size(), id, rank()), nullptr);
    try {
      int priority_low = 0, priority_high = 0;
      DUALCAST_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&priority_low, &priority_high));
      // High priority, as PyTorch's NCCL streams: a bucket's reduction should not queue behind the
      // backward's kernels, which are what it overlaps.
      DUALCAST_CUDA_CHECK(cudaStreamCreateWithPriority(&comm_stream_, cudaStreamNonBlocking, priority_high));
      DUALCAST_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
      DUALCAST_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    } catch (...) {
      ncclCommDestroy(comm_);
      throw;
    }
    int v = 0;
    ncclGetVersion(&v);
    version_ = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
    timeout_s_ = timeout_seconds();
    // DUALCAST_DIST_WATCHDOG=0 leaves the watchdog out (to measure what it costs): NCCL's errors and
    // a stopped peer are then found only by the host-side waits, and a lost peer can hang the rank.
    if (watched_) watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclCommunicator() override {
    stop_ = true;
    if (watchdog_.joinable()) watchdog_.join();
    ::dualcast::detail::DeviceGuard guard(device_);
    // While an exception unwinds (this rank failed), its peers may be inside a collective this rank
    // will never join, and ncclCommDestroy can wait for them: abort at once (as PyTorch does on an
    // error), so the rank exits and the launcher stops the others. Otherwise a collective still
    // queued (a peer stopped) gets a little time to finish before it is aborted.
    const bool unwinding = std::uncaught_exceptions() > 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(unwinding ? 0 : 10);
    while (cudaStreamQuery(comm_stream_) == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!unwinding && cudaStreamQuery(comm_stream_) == cudaSuccess) {
      ncclCommDestroy(comm_);
    } else {
      std::fprintf(stderr, "dualcast: rank %d: %s; aborting the communicator on %s\n", rank(),
                   unwinding ? "leaving on an error" : "a collective did not finish", device_.str().c_str());
      ncclCommAbort(comm_);
    }
    cudaEventDestroy(ready_);
    cudaEventDestroy(done_);
    for (const Pending& p : pending_) cudaEventDestroy(p.event);
    cudaStreamDestroy(comm_stream_);
  }

  [[nodiscard]] std::string backend() const override { return "nccl " + version_; }

  void all_reduce(const std::vector<Tensor>& tensors, ReduceOp op) override {
    check(tensors, "all_reduce");
    fork();
    grouped([&] {
      for (const Tensor& t : tensors)
        DUALCAST_NCCL_CHECK(ncclAllReduce(t.raw_data(), t.raw_data(), static_cast<std::size_t>(t.numel()),
                                          nccl_type(t.dtype()), op == ReduceOp::sum ? ncclSum : ncclAvg,
                                          comm_, comm_stream_),
                            comm_);
    });
    queued(tensors);
  }

  void broadcast(const std::vector<Tensor>& tensors, int root) override {
    check(tensors, "broadcast");
    DUALCAST_CHECK(root >= 0 && root < size(), "dist::broadcast: root ", root, " is not a rank of a group of ",
                   size());
    fork();
    grouped([&] {
      for (const Tensor& t : tensors)
        DUALCAST_NCCL_CHECK(ncclBroadcast(t.raw_data(), t.raw_data(), static_cast<std::size_t>(t.numel()),
                                          nccl_type(t.dtype()), root, comm_, comm_stream_),
                            comm_);
    });
    queued(tensors);
  }

  void wait() override {
    if (!forked_) return;
    ::dualcast::detail::DeviceGuard guard(device_);
    DUALCAST_CUDA_CHECK(cudaEventRecord(done_, comm_stream_));
    DUALCAST_CUDA_CHECK(cudaStreamWaitEvent(::dualcast::detail::stream(device_), done_, 0));
    forked_ = false;
    // The device's stream now waits for the collectives: the tensors may go back to the caching
    // allocator, whose next user of their blocks is ordered after them.
    in_flight_.clear();
  }

  void barrier() override {
    wait();
    synchronize(device_);
    rdv_->barrier("dist::barrier");
  }

 private:
  void check(const std::vector<Tensor>& tensors, const char* op) const {
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const Tensor& t = tensors[i];
      DUALCAST_CHECK(t.defined() && t.device() == device_ && t.is_contiguous() && is_floating(t.dtype()),
                     "dist::", op, ": tensor ", i, " (", t.defined() ? t.str() : std::string("undefined"),
                     ") must be a contiguous floating tensor on ", device_.str());
    }
  }

  /// The collective stream waits for everything queued on the device's stream so far.
  void fork() {
    ::dualcast::detail::DeviceGuard guard(device_);
    DUALCAST_CUDA_CHECK(cudaEventRecord(ready_, ::dualcast::detail::stream(device_)));
    DUALCAST_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, ready_, 0));
    forked_ = true;
  }

  /// f's NCCL calls as one group; the group is closed even when a call fails (else the thread's
  /// next NCCL call would still be inside it).
  template <class F>
  void grouped(F&& f) {
    // A group's first collective connects NCCL's channels and blocks the host until the peers take
    // part: the watchdog times a call that blocks too long (a peer alive but stuck elsewhere).
    struct InCall {
      std::atomic<std::int64_t>& since;
      explicit InCall(std::atomic<std::int64_t>& s) : since(s) { since = now_ns(); }
      ~InCall() { since = 0; }
    } in_call(host_call_since_ns_);
    DUALCAST_NCCL_CHECK(ncclGroupStart(), comm_);
    try {
      f();
    } catch (...) {
      ncclGroupEnd();
      throw;
    }
    DUALCAST_NCCL_CHECK(ncclGroupEnd(), comm_);
  }

  static std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  /// After a collective is queued: NCCL holds only the tensors' pointers, so the communicator holds
  /// the tensors until wait(); outside a capture, an event marks the collective's end for the
  /// watchdog's timeout.
  void queued(const std::vector<Tensor>& tensors) {
    in_flight_.insert(in_flight_.end(), tensors.begin(), tensors.end());
    if (capturing(device_)) return;  // a replay's collectives are not tracked (no event to wait on)
    if (!watched_) return;           // nobody would drain the events
    cudaEvent_t e = nullptr;
    DUALCAST_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    DUALCAST_CUDA_CHECK(cudaEventRecord(e, comm_stream_));
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back({e, std::chrono::steady_clock::now()});
  }

  /// NCCL reports a failed peer or network asynchronously; a rank blocked in a collective would wait
  /// forever, so the watchdog names the failure and ends the process (scripts/launch then stops the
  /// other ranks), as PyTorch's NCCL watchdog does.
  static bool watchdog_enabled() {
    const char* s = std::getenv("DUALCAST_DIST_WATCHDOG");
    if (s == nullptr || *s == '\0') return true;
    const std::string v(s);
    DUALCAST_CHECK(v == "0" || v == "1", "dist: DUALCAST_DIST_WATCHDOG='", v, "' is neither 0 nor 1");
    return v == "1";
  }

  void watch() {
    // A new thread's current device is GPU 0: its first CUDA call would make a context there.
    cudaSetDevice(device_.index);
    // The main thread may be capturing a Graph (in the global capture mode) while this thread queries
    // events recorded before the capture began. In the global mode that query is prohibited and
    // invalidates the capture, on this rank only, so its peers would wait forever in the captured
    // collectives. Thread-local mode lets this thread, which never captures, query freely (PyTorch's
    // NCCL watchdog does the same).
    cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
    cudaThreadExchangeStreamCaptureMode(&mode);
    while (!stop_) {
      ncclResult_t r = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &r) == ncclSuccess && r != ncclSuccess && r != ncclInProgress)
        fail(std::string(ncclGetErrorString(r)) + " (" + ncclGetLastError(comm_) + ")");
      {
        // A peer that stopped (killed, or gone without the launcher) leaves the collective waiting
        // forever without any error: time the oldest queued collective out.
        std::lock_guard<std::mutex> lock(mu_);
        while (!pending_.empty()) {
          const cudaError_t q = cudaEventQuery(pending_.front().event);
          if (q == cudaErrorNotReady) break;
          if (q != cudaSuccess)  // a sticky CUDA error: name it, not a peer
            fail(std::string("CUDA error while a collective was queued: ") + cudaGetErrorString(q));
          cudaEventDestroy(pending_.front().event);
          pending_.pop_front();
        }
        if (!pending_.empty() &&
            std::chrono::duration<double>(std::chrono::steady_clock::now() - pending_.front().queued).count() > timeout_s_)
          fail("a collective queued " + std::to_string(static_cast<int>(timeout_s_)) +
               " s ago has not finished (DUALCAST_DIST_TIMEOUT): a peer stopped, or never joined it");
      }
      const std::int64_t since = host_call_since_ns_;
      if (since != 0 && static_cast<double>(now_ns() - since) * 1e-9 > timeout_s_)
        fail("an NCCL call has blocked this rank for " + std::to_string(static_cast<int>(timeout_s_)) +
             " s (DUALCAST_DIST_TIMEOUT): a peer never joined the collective");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  [[noreturn]] void fail(const std::string& why) {
    std::fprintf(stderr, "dualcast: rank %d: NCCL on %s: %s; aborting the communicator and exiting\n", rank(),
                 device_.str().c_str(), why.c_str());
    std::fflush(stderr);
    // ncclCommAbort itself has been seen to hang in some NCCL versions: the exit must not wait on it.
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(10));
      std::_Exit(3);
    }).detach();
    ncclCommAbort(comm_);
    std::_Exit(3);
  }

  struct Pending {
    cudaEvent_t event;
    std::chrono::steady_clock::time_point queued;
  };

  std::unique_ptr<Rendezvous> rdv_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t comm_stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  bool forked_ = false;                 ///< collectives queued since the last wait()
  std::vector<Tensor> in_flight_;       ///< their tensors, held until wait()
  std::mutex mu_;                       ///< guards pending_ (the watchdog reads it)
  std::deque<Pending> pending_;         ///< end events of queued collectives, oldest first
  double timeout_s_ = 300;
  std::string version_;
  std::atomic<bool> stop_{false};
  std::atomic<std::int64_t> host_call_since_ns_{0};  ///< when the NCCL call in progress began (0: none)
  std::thread watchdog_;
  const bool watched_;  ///< DUALCAST_DIST_WATCHDOG is not 0: the watchdog runs
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const Env& env, Device device,
                                                     std::unique_ptr<Rendezvous> rdv) {
  return std::make_unique<NcclCommunicator>(env, device, std::move(rdv));
}
#else
std::unique_ptr<Communicator> make_nccl_communicator(const Env& env, Device device,
                                                     std::unique_ptr<Rendezvous>) {
  DUALCAST_FAIL("dist: rank ", env.rank, ": collectives on ", device.str(), " need NCCL, and this build has none");
}
#endif

}  // namespace dualcast::dist::detail
