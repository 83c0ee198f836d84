// parallel.cpp: the CPU thread pool behind parallel_for. Persistent workers, one job at a time,
// static chunking (elementwise bodies cost the same per index, so balancing buys nothing).
#include "dualcast/parallel.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace dualcast::detail {

namespace {

thread_local bool t_inside_pool = false;

class ThreadPool {
 public:
  explicit ThreadPool(int threads) {
    for (int t = 1; t < threads; ++t) workers_.emplace_back([this, t] { work(t); });
  }
  ~ThreadPool() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
  }

  [[nodiscard]] int size() const { return static_cast<int>(workers_.size()) + 1; }

  void run(std::int64_t n, int chunks, RangeFn fn, const void* ctx) {
    std::unique_lock job_lock(job_mutex_);  // one parallel_for at a time across caller threads
    {
      std::lock_guard lock(mutex_);
      fn_ = fn;
      ctx_ = ctx;
      n_ = n;
      chunks_ = chunks;
      pending_ = chunks - 1;
      ++generation_;
    }
    wake_.notify_all();
    t_inside_pool = true;  // a nested parallel_for in the caller's share runs inline
    run_chunk(0);          // the caller does its share
    t_inside_pool = false;
    std::unique_lock lock(mutex_);
    done_.wait(lock, [this] { return pending_ == 0; });
  }

 private:
  void run_chunk(int c) const {
    const std::int64_t begin = n_ * c / chunks_;
    const std::int64_t end = n_ * (c + 1) / chunks_;
    if (begin < end) fn_(ctx_, begin, end);
  }

  void work(int index) {
    t_inside_pool = true;
    std::uint64_t seen = 0;
    for (;;) {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      const bool mine = index < chunks_;
      lock.unlock();
      if (!mine) continue;
      run_chunk(index);
      lock.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex job_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  RangeFn fn_ = nullptr;
  const void* ctx_ = nullptr;
  std::int64_t n_ = 0;
  int chunks_ = 0;
  int pending_ = 0;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
};

int configured_threads() {
  if (const char* env = std::getenv("DUALCAST_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool& pool() {
  static ThreadPool instance(configured_threads());
  return instance;
}

}  // namespace

int cpu_thread_count() { return pool().size(); }

void cpu_parallel_range(std::int64_t n, std::int64_t grain, RangeFn fn, const void* ctx) {
  const int threads = cpu_thread_count();
  if (threads == 1 || n <= grain || t_inside_pool) {
    fn(ctx, 0, n);
    return;
  }
  const auto chunks = static_cast<int>(std::min<std::int64_t>(threads, (n + grain - 1) / grain));
  pool().run(n, chunks, fn, ctx);
}

}  // namespace dualcast::detail
