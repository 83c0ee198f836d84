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
#include <cstdio>
#include <cstdlib>
#include <thread>

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
      : Communicator(env, device), rdv_(std::move(rdv)) {
    ncclUniqueId id{};
    if (rank() == 0) DUALCAST_NCCL_CHECK(ncclGetUniqueId(&id), nullptr);
    rdv_->broadcast_from_root(&id, sizeof id, "NCCL unique id");
    // One process per GPU: the rank's GPU becomes the thread's current device for good (PyTorch's
    // torch.cuda.set_device(local_rank)), so that code using the current device (the user's own
    // kernels, events, cudaDeviceSynchronize) works on this rank's GPU and not on GPU 0.
    DUALCAST_CUDA_CHECK(cudaSetDevice(device.index));
    ::dualcast::detail::DeviceGuard guard(device);
    DUALCAST_NCCL_CHECK(ncclCommInitRank(&comm_, size(), id, rank()), nullptr);
    int priority_low = 0, priority_high = 0;
    DUALCAST_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&priority_low, &priority_high));
    // High priority, as PyTorch's NCCL streams: a bucket's reduction should not queue behind the
    // backward's kernels, which are what it overlaps.
    DUALCAST_CUDA_CHECK(cudaStreamCreateWithPriority(&comm_stream_, cudaStreamNonBlocking, priority_high));
    DUALCAST_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    DUALCAST_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    int v = 0;
    ncclGetVersion(&v);
    version_ = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclCommunicator() override {
    stop_ = true;
    watchdog_.join();
    ::dualcast::detail::DeviceGuard guard(device_);
    // A collective still queued when the communicator goes (this rank is unwinding after an error,
    // or a peer stopped) may never complete: wait a little, then abort it rather than hang the exit.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (cudaStreamQuery(comm_stream_) == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (cudaStreamQuery(comm_stream_) == cudaSuccess) {
      ncclCommDestroy(comm_);
    } else {
      std::fprintf(stderr, "dualcast: rank %d: a collective on %s did not finish; aborting the communicator\n",
                   rank(), device_.str().c_str());
      ncclCommAbort(comm_);
    }
    cudaEventDestroy(ready_);
    cudaEventDestroy(done_);
    cudaStreamDestroy(comm_stream_);
  }

  [[nodiscard]] std::string backend() const override { return "nccl " + version_; }

  void all_reduce(const std::vector<Tensor>& tensors, ReduceOp op) override {
    check(tensors, "all_reduce");
    fork();
    DUALCAST_NCCL_CHECK(ncclGroupStart(), comm_);
    for (const Tensor& t : tensors)
      DUALCAST_NCCL_CHECK(ncclAllReduce(t.raw_data(), t.raw_data(), static_cast<std::size_t>(t.numel()),
                                        nccl_type(t.dtype()), op == ReduceOp::sum ? ncclSum : ncclAvg,
                                        comm_, comm_stream_),
                          comm_);
    DUALCAST_NCCL_CHECK(ncclGroupEnd(), comm_);
  }

  void broadcast(const std::vector<Tensor>& tensors, int root) override {
    check(tensors, "broadcast");
    DUALCAST_CHECK(root >= 0 && root < size(), "dist::broadcast: root ", root, " is not a rank of a group of ",
                   size());
    fork();
    DUALCAST_NCCL_CHECK(ncclGroupStart(), comm_);
    for (const Tensor& t : tensors)
      DUALCAST_NCCL_CHECK(ncclBroadcast(t.raw_data(), t.raw_data(), static_cast<std::size_t>(t.numel()),
                                        nccl_type(t.dtype()), root, comm_, comm_stream_),
                          comm_);
    DUALCAST_NCCL_CHECK(ncclGroupEnd(), comm_);
  }

  void wait() override {
    if (!pending_) return;
    ::dualcast::detail::DeviceGuard guard(device_);
    DUALCAST_CUDA_CHECK(cudaEventRecord(done_, comm_stream_));
    DUALCAST_CUDA_CHECK(cudaStreamWaitEvent(::dualcast::detail::stream(device_), done_, 0));
    pending_ = false;
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
    pending_ = true;
  }

  /// NCCL reports a failed peer or network asynchronously; a rank blocked in a collective would wait
  /// forever, so the watchdog names the failure and ends the process (scripts/launch then stops the
  /// other ranks), as PyTorch's NCCL watchdog does.
  void watch() {
    while (!stop_) {
      ncclResult_t r = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &r) == ncclSuccess && r != ncclSuccess && r != ncclInProgress) {
        std::fprintf(stderr, "dualcast: rank %d: NCCL failed on %s: %s (%s); aborting the communicator "
                     "and exiting\n", rank(), device_.str().c_str(), ncclGetErrorString(r),
                     ncclGetLastError(comm_));
        std::fflush(stderr);
        ncclCommAbort(comm_);
        std::_Exit(3);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  std::unique_ptr<Rendezvous> rdv_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t comm_stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  bool pending_ = false;
  std::string version_;
  std::atomic<bool> stop_{false};
  std::thread watchdog_;
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
