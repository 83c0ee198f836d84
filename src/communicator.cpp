// communicator.cpp: the environment a launcher gives, the group of one, and the CPU collective (a
// worker thread running sums through rank 0 over the rendezvous sockets).
#include "dualcast/communicator.hpp"

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>

#include "communicator_internal.hpp"
#include "dualcast/error.hpp"
#include "rendezvous.hpp"

namespace dualcast::dist {

namespace {

const char* env_or_null(const char* name) {
  const char* s = std::getenv(name);
  return s != nullptr && *s != '\0' ? s : nullptr;
}

int env_int(const char* name, int fallback, long lo, long hi) {
  const char* s = env_or_null(name);
  if (s == nullptr) return fallback;
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  DUALCAST_CHECK(end != s && *end == '\0' && v >= lo && v <= hi, "dist: environment variable ", name,
                 "='", s, "' is not an integer in [", lo, ", ", hi, "]");
  return static_cast<int>(v);
}

/// Checks what every collective gets: contiguous tensors of a floating dtype on the group's device.
void check_tensors(const char* op, const std::vector<Tensor>& tensors, Device device) {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    DUALCAST_CHECK(t.defined(), "dist::", op, ": tensor ", i, " is undefined");
    DUALCAST_CHECK(t.device() == device, "dist::", op, ": tensor ", i, " (", t.str(),
                   ") is not on the communicator's device ", device.str());
    DUALCAST_CHECK(t.is_contiguous(), "dist::", op, ": tensor ", i, " (", t.str(), ") is not contiguous");
    DUALCAST_CHECK(is_floating(t.dtype()), "dist::", op, ": tensor ", i, " (", t.str(),
                   ") is not of a floating dtype");
  }
}

std::string describe(const char* op, const std::vector<Tensor>& tensors, const std::string& extra) {
  std::ostringstream s;
  s << op << "(" << extra << ") of";
  for (const Tensor& t : tensors) s << ' ' << t.shape().str() << ':' << dtype_name(t.dtype());
  return s.str();
}

/// A group of one: every collective is the identity.
class SingleCommunicator final : public Communicator {
 public:
  SingleCommunicator(Env env, Device device) : Communicator(std::move(env), device) {}
  [[nodiscard]] std::string backend() const override { return "single"; }
  void all_reduce(const std::vector<Tensor>& tensors, ReduceOp) override {
    check_tensors("all_reduce", tensors, device_);
  }
  void broadcast(const std::vector<Tensor>& tensors, int root) override {
    check_tensors("broadcast", tensors, device_);
    DUALCAST_CHECK(root == 0, "dist::broadcast: root ", root, " is not a rank of a group of 1");
  }
  void wait() override {}
  void barrier() override {}
};

/// The CPU collective. Collectives are queued to one worker thread, in order, so that they overlap
/// the caller's work (the backward) as NCCL's stream does; wait() joins them and rethrows the first
/// failure. After a failure every later call fails too: the group is out of step and cannot recover.
class CpuCommunicator final : public Communicator {
 public:
  CpuCommunicator(Env env, std::unique_ptr<detail::Rendezvous> rdv)
      : Communicator(std::move(env), Device::cpu()), rdv_(std::move(rdv)),
        worker_([this] { run(); }) {}

  ~CpuCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      // Leaving with a collective in progress (this rank is unwinding after an error): its peers
      // may never answer, so cut the connections rather than wait for the timeout.
      if (busy_ || !queue_.empty()) {
        queue_.clear();
        rdv_->shutdown();
      }
    }
    cv_.notify_all();
    worker_.join();
  }

  [[nodiscard]] std::string backend() const override { return "cpu-sockets"; }

  void all_reduce(const std::vector<Tensor>& tensors, ReduceOp op) override {
    check_tensors("all_reduce", tensors, device_);
    enqueue([this, tensors, op] {
      rdv_->check_same(describe("all_reduce", tensors, op == ReduceOp::sum ? "sum" : "average"),
                       "dist::all_reduce");
      for (const Tensor& t : tensors) reduce_one(t, op);
    });
  }

  void broadcast(const std::vector<Tensor>& tensors, int root) override {
    check_tensors("broadcast", tensors, device_);
    DUALCAST_CHECK(root == 0, "dist::broadcast: root ", root,
                   ": the CPU collective broadcasts from rank 0 only");
    enqueue([this, tensors] {
      rdv_->check_same(describe("broadcast", tensors, "root 0"), "dist::broadcast");
      for (const Tensor& t : tensors) rdv_->broadcast_from_root(t.raw_data(), t.nbytes(), "dist::broadcast");
    });
  }

  void wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return (queue_.empty() && !busy_) || failure_; });
    if (failure_) std::rethrow_exception(failure_);
  }

  void barrier() override {
    wait();
    rdv_->barrier("dist::barrier");
  }

 private:
  void enqueue(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_) std::rethrow_exception(failure_);
    queue_.push_back(std::move(task));
    cv_.notify_all();
  }

  void run() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ with nothing left to do
        task = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      std::exception_ptr error;
      if (!failure_) {
        try {
          task();
        } catch (...) {
          error = std::current_exception();
        }
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        busy_ = false;
        if (error && !failure_) failure_ = error;
        if (failure_) queue_.clear();
      }
      done_cv_.notify_all();
    }
  }

  /// Rank 0 sums every rank's values in rank order in double precision (so the result does not
  /// depend on the number of ranks more than rounding once to the dtype does) and sends the result
  /// back: every rank ends with the same bits.
  void reduce_one(const Tensor& t, ReduceOp op) {
    const std::size_t n = static_cast<std::size_t>(t.numel());
    if (n == 0) return;
    dispatch_floating_storage(t.dtype(), "dist::all_reduce", [&](auto tag) {
      using T = decltype(tag);
      T* mine = static_cast<T*>(t.raw_data());
      if (rank() != 0) {
        rdv_->send(0, mine, n * sizeof(T), "dist::all_reduce");
        rdv_->recv(0, mine, n * sizeof(T), "dist::all_reduce");
        return;
      }
      std::vector<double> acc(n);
      for (std::size_t i = 0; i < n; ++i) acc[i] = convert<double>(mine[i]);
      std::vector<T> theirs(n);
      for (int k = 1; k < size(); ++k) {
        rdv_->recv(k, theirs.data(), n * sizeof(T), "dist::all_reduce");
        for (std::size_t i = 0; i < n; ++i) acc[i] += convert<double>(theirs[i]);
      }
      const double scale = op == ReduceOp::average ? 1.0 / size() : 1.0;
      for (std::size_t i = 0; i < n; ++i) mine[i] = convert<T>(acc[i] * scale);
      for (int k = 1; k < size(); ++k) rdv_->send(k, mine, n * sizeof(T), "dist::all_reduce");
    });
  }

  std::unique_ptr<detail::Rendezvous> rdv_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::function<void()>> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::exception_ptr failure_;
  std::thread worker_;  // last: started once everything it uses exists
};

}  // namespace

bool Env::launched() { return env_or_null("WORLD_SIZE") != nullptr; }

Env Env::from_environment() {
  Env e;
  e.world_size = env_int("WORLD_SIZE", 1, 1, 1 << 20);
  e.rank = env_int("RANK", 0, 0, e.world_size - 1);
  e.local_rank = env_int("LOCAL_RANK", e.rank, 0, 1 << 20);
  if (const char* a = env_or_null("MASTER_ADDR")) e.master_addr = a;
  e.master_port = env_int("MASTER_PORT", 0, 1, 65535);
  DUALCAST_CHECK(e.world_size == 1 || e.master_port != 0, "dist: WORLD_SIZE=", e.world_size,
                 " but MASTER_PORT is not set: start the ranks with scripts/launch (or torchrun), "
                 "which sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT");
  DUALCAST_CHECK(e.world_size == 1 || env_or_null("RANK") != nullptr, "dist: WORLD_SIZE=", e.world_size,
                 " but RANK is not set");
  return e;
}

bool nccl_available() {
#if DUALCAST_WITH_NCCL
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Communicator> Communicator::from_environment(Device device) {
  return create(Env::from_environment(), device);
}

std::unique_ptr<Communicator> Communicator::create(const Env& env, Device device) {
  DUALCAST_CHECK(env.world_size >= 1 && env.rank >= 0 && env.rank < env.world_size,
                 "dist::Communicator::create: rank ", env.rank, " is not in a group of ", env.world_size);
  DUALCAST_CHECK(env.world_size == 1 || (env.master_port > 0 && env.master_port <= 65535),
                 "dist::Communicator::create: a group of ", env.world_size,
                 " needs a master_port in 1..65535, not ", env.master_port);
  if (env.world_size == 1) return std::make_unique<SingleCommunicator>(env, device);
  DUALCAST_CHECK(!device.is_cuda() || nccl_available(), "dist::Communicator::create: rank ", env.rank,
                 ": collectives on ", device.str(),
                 " need NCCL, and this build has none (configure found no nccl.h/libnccl: see "
                 "'dualcast: NCCL' in its output)");
  auto rdv = std::make_unique<detail::Rendezvous>(env);
  // Every rank must pick the same backend: a CPU rank cannot sum with a GPU rank.
  rdv->check_same(device.is_cuda() ? "CUDA tensors (NCCL)" : "CPU tensors (cpu-sockets)",
                  "dist::Communicator::create");
  if (device.is_cuda()) return detail::make_nccl_communicator(env, device, std::move(rdv));
  return std::make_unique<CpuCommunicator>(env, std::move(rdv));
}

}  // namespace dualcast::dist
