// test_distributed.cu: communicator.hpp and data_parallel.hpp: the environment, the collectives, and
// data-parallel training on 2 and 3 ranks against one process on the whole batch, plus failures.
//
// A multi-rank test starts itself: run plainly (by ctest), it calls scripts/launch on this binary
// with its own --gtest_filter, and passes when every rank passes; each rank (WORLD_SIZE set) runs
// the body. The CPU collective runs everywhere (CI); the NCCL cases need 2 GPUs and skip otherwise.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "dualcast/dualcast.hpp"
#if DUALCAST_WITH_CUDA
#include <cuda_runtime_api.h>
#endif
#include "test_util.hpp"

namespace dualcast {
namespace {

using dist::Communicator;
using dist::DataParallel;
using dist::Env;
using dist::ReduceOp;

// N ranks on shards against one process on the whole batch: the same sums in another order.
constexpr double kShardVsWholeTolerance = 2e-5;
// A rank that fails must bring the group down in seconds, not at a timeout of minutes.
constexpr double kFailureStopsGroupSeconds = 20.0;

std::string current_test_name() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string(info->test_suite_name()) + "." + info->name();
}

struct LaunchResult {
  int status = -1;
  std::string stderr_text;
  double seconds = 0;
};

/// Runs this test in `ranks` processes through scripts/launch, with `env` added ("A=1 B=2").
std::string self_path() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

LaunchResult launch_self(int ranks, const std::string& env = "") {
  const std::string err = ::testing::TempDir() + "launch_stderr_" + std::to_string(::getpid()) + ".txt";
  // timeout: a hang (the bug these tests exist to catch) fails the test instead of stalling the suite.
  const std::string cmd = env + " timeout -k 5 120 python3 " DUALCAST_SOURCE_DIR "/scripts/launch --gpus " +
                          std::to_string(ranks) + " -- '" + self_path() + "' --gtest_filter='" +
                          current_test_name() + "' >" + err + " 2>&1";
  const auto t0 = std::chrono::steady_clock::now();
  const int raw = std::system(cmd.c_str());
  LaunchResult r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  std::ifstream in(err);
  std::stringstream ss;
  ss << in.rdbuf();
  r.stderr_text = ss.str();
  std::remove(err.c_str());
  return r;
}

/// In the parent: launches the ranks and checks they all passed; returns true there (the caller
/// returns). In a rank: returns false (the caller runs the body).
bool run_as_ranks(int ranks, const std::string& env = "") {
  if (Env::launched()) return false;
  const LaunchResult r = launch_self(ranks, env);
  EXPECT_EQ(r.status, 0) << "a rank failed:\n" << r.stderr_text;
  return true;
}

class Backends : public ::testing::TestWithParam<DeviceKind> {
 protected:
  /// The device this rank uses, or skips: CUDA needs NCCL and a GPU for each of `ranks` ranks.
  bool skip(int ranks) {
    if (GetParam() == DeviceKind::cpu) return false;
    if (!dist::nccl_available()) {
      skip_reason_ = "this build has no NCCL";
      return true;
    }
    if (cuda_device_count() < ranks) {
      skip_reason_ = "needs " + std::to_string(ranks) + " GPUs";
      return true;
    }
    return false;
  }
  [[nodiscard]] Device device() const {
    return GetParam() == DeviceKind::cpu ? Device::cpu() : Device::cuda(Env::from_environment().local_rank);
  }
  std::string skip_reason_;
};

#define DUALCAST_SKIP_UNLESS_RANKS(n) \
  do {                                \
    if (skip(n)) GTEST_SKIP() << skip_reason_; \
  } while (0)

// ---- the environment ------------------------------------------------------------------------

TEST(DistributedEnv, AnEmptyEnvironmentIsAGroupOfOne) {
  if (Env::launched()) GTEST_SKIP() << "run without a launcher";
  const Env e = Env::from_environment();
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
  auto comm = Communicator::create(e, Device::cpu());
  EXPECT_EQ(comm->backend(), "single");
  Tensor t = Tensor::full({3}, 2.0);
  comm->all_reduce({t}, ReduceOp::average);
  comm->wait();
  EXPECT_EQ(t.to_vector<double>(), std::vector<double>(3, 2.0));
}

TEST(DistributedEnv, MalformedVariablesAreErrorsNamingThem) {
  if (Env::launched()) GTEST_SKIP() << "run without a launcher";
  auto expect_error = [](const char* needle) {
    try {
      (void)Env::from_environment();
      ADD_FAILURE() << "no error; expected one naming " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  setenv("WORLD_SIZE", "2", 1);
  setenv("RANK", "2", 1);
  setenv("MASTER_PORT", "29500", 1);
  expect_error("RANK");
  setenv("RANK", "1", 1);
  setenv("MASTER_PORT", "70000", 1);
  expect_error("MASTER_PORT");
  unsetenv("MASTER_PORT");
  expect_error("MASTER_PORT");
  setenv("WORLD_SIZE", "two", 1);
  expect_error("WORLD_SIZE");
  unsetenv("WORLD_SIZE");
  unsetenv("RANK");
  EXPECT_EQ(Env::from_environment().world_size, 1);
}

TEST(DistributedBadInput, CommunicatorAndDataParallelRefuseBadArgumentsClearly) {
  if (Env::launched()) GTEST_SKIP() << "run without a launcher";
  auto expect_error = [](auto&& f, const char* needle) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  Env two;
  two.world_size = 2;
  two.rank = 2;
  two.master_port = 29500;
  expect_error([&] { (void)Communicator::create(two, Device::cpu()); }, "rank 2 is not in a group of 2");
  two.rank = 1;
  two.master_port = 0;
  expect_error([&] { (void)Communicator::create(two, Device::cpu()); }, "needs a master_port");
  auto one = Communicator::create(Env{}, Device::cpu());
  Var w = Var::param(Tensor::ones({3}));
  expect_error([&] { DataParallel ddp(*one, {}); }, "the parameter list is empty");
  expect_error([&] { DataParallel ddp(*one, {Var(Tensor::ones({3}))}); }, "is not a leaf that requires a gradient");
  expect_error([&] { DataParallel ddp(*one, {w * 2.0}); }, "is not a leaf that requires a gradient");
  expect_error([&] { DataParallel ddp(*one, {w, w}); }, "appears twice");
  expect_error([&] { one->all_reduce({Tensor()}, ReduceOp::sum); }, "tensor 0 is undefined");
  for (double mib : {0.0, 1e-9, -1.0, 5000.0})
    expect_error([&] { (void)dist::DataParallelOptions::with_bucket_mib(mib); }, "MiB is not in");
  // The library keeps working: a good DataParallel on the same communicator.
  DataParallel ddp(*one, {w});
  sum(w * 2.0).backward();
  ddp.finish();
  EXPECT_EQ(w.grad().to_vector<double>(), std::vector<double>(3, 2.0));
}

// ---- the tape hook DataParallel builds on -----------------------------------------------------

TEST(GradReadyHook, FiresOnceWithTheFinalGradientBeforeTheBackwardEnds) {
  Var w = Var::param(Tensor::from_vector<float>({2}, {0.5f, -1.5f}));
  Var x = Var::param(Tensor::from_vector<float>({2}, {2.0f, 3.0f}));
  std::vector<double> at_hook;
  int calls = 0;
  std::int64_t nodes_at_hook = 0;
  const std::uint64_t id = w.add_grad_ready_hook([&] {
    ++calls;
    at_hook = w.grad().to_vector<double>();
    nodes_at_hook = autograd_stats().nodes_run;
  });
  // w is used twice near the output; x's chain continues after w's gradient is final.
  const std::int64_t before = autograd_stats().nodes_run;
  Var early = sum(tanh(x * 2.0) * 3.0);  // recorded first, so its nodes run last in the backward
  Var late = sum(w * x + w * w);
  Var y = early + late;
  y.backward();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(at_hook, w.grad().to_vector<double>());
  EXPECT_LT(nodes_at_hook, autograd_stats().nodes_run) << "the hook should run before the last node";
  EXPECT_GT(nodes_at_hook, before);
  w.remove_grad_ready_hook(id);
  w.zero_grad();
  sum(w * x).backward();
  EXPECT_EQ(calls, 1) << "a removed hook still ran";
  EXPECT_THROW((void)Var(Tensor::ones({2})).add_grad_ready_hook([] {}), Error);
  EXPECT_THROW((void)(w * x).add_grad_ready_hook([] {}), Error);
}

// ---- collectives ----------------------------------------------------------------------------

TEST_P(Backends, AllReduceSumsAndAveragesEveryDtype) {
  DUALCAST_SKIP_UNLESS_RANKS(2);
  if (run_as_ranks(GetParam() == DeviceKind::cpu ? 3 : 2)) return;
  auto comm = Communicator::from_environment(device());
  const int r = comm->rank(), n = comm->size();
  std::vector<Tensor> ts;
  for (DType dt : {DType::float32, DType::float64, DType::bfloat16, DType::float16})
    ts.push_back(Tensor::full({3, 5}, r + 1.0, dt, device()));
  comm->all_reduce(ts, ReduceOp::sum);
  Tensor avg = Tensor::full({7}, 2.0 * r, DType::float32, device());
  comm->all_reduce({avg}, ReduceOp::average);
  comm->wait();
  const double sum = n * (n + 1) / 2.0;
  for (const Tensor& t : ts) EXPECT_EQ(t.to_vector<double>(), std::vector<double>(15, sum)) << t.str();
  EXPECT_EQ(avg.to_vector<double>(), std::vector<double>(7, n - 1.0));
  Tensor root = Tensor::full({4}, r == 0 ? 7.0 : -1.0, DType::float32, device());
  comm->broadcast({root}, 0);
  comm->wait();
  EXPECT_EQ(root.to_vector<double>(), std::vector<double>(4, 7.0));
  comm->barrier();
}

TEST_P(Backends, ShardGivesEachRankItsRowsAndRefusesUnevenBatches) {
  DUALCAST_SKIP_UNLESS_RANKS(2);
  if (run_as_ranks(2)) return;
  auto comm = Communicator::from_environment(device());
  const Tensor batch = Tensor::arange(12, DType::float32, device()).view({6, 2});
  const Tensor mine = dist::shard(batch, *comm);
  EXPECT_EQ(mine.shape(), Shape({3, 2}));
  EXPECT_EQ(mine.to_vector<double>()[0], 6.0 * comm->rank());
  const Tensor cols = dist::shard(batch.view({2, 6}), *comm, 1);
  EXPECT_EQ(cols.shape(), Shape({2, 3}));
  EXPECT_EQ(cols.to_vector<double>()[0], 3.0 * comm->rank());
  EXPECT_THROW((void)dist::shard(Tensor::zeros({5, 2}, DType::float32, device()), *comm), Error);
}

// ---- data-parallel training -----------------------------------------------------------------

struct Mlp {
  Var w1, b1, w2, b2;
  Mlp(Device d, std::uint64_t seed)
      : w1(Var::param(Tensor::randn({6, 16}, d, seed).to(DType::float64))),
        b1(Var::param(Tensor::zeros({16}, DType::float64, d))),
        w2(Var::param(Tensor::randn({16, 3}, d, seed + 1).to(DType::float64))),
        b2(Var::param(Tensor::zeros({3}, DType::float64, d))) {}
  [[nodiscard]] std::vector<Var> params() const { return {w1, b1, w2, b2}; }
  Var loss(const Tensor& x, const Tensor& y) const {
    return mse(matmul(tanh(matmul(x, w1) + b1), w2) + b2, y);
  }
};

/// Trains one model data-parallel on this rank's shards and one on the whole batches, and compares
/// the parameters after every step.
void train_and_compare(Communicator& comm, Device d, bool adam, dist::DataParallelOptions options) {
  Mlp local(d, 100 + comm.rank());  // different on every rank: DataParallel copies rank 0's
  Mlp whole(d, 100);
  DataParallel ddp(comm, local.params(), options);
  std::unique_ptr<Optimizer> opt_local, opt_whole;
  if (adam) {
    opt_local = std::make_unique<Adam>(local.params(), 1e-2);
    opt_whole = std::make_unique<Adam>(whole.params(), 1e-2);
  } else {
    opt_local = std::make_unique<SGD>(local.params(), 0.1, 0.9);
    opt_whole = std::make_unique<SGD>(whole.params(), 0.1, 0.9);
  }
  for (int step = 0; step < 5; ++step) {
    const Tensor x = Tensor::randn({12, 6}, d, 7 + step).to(DType::float64);
    const Tensor y = Tensor::randn({12, 3}, d, 70 + step).to(DType::float64);
    opt_local->zero_grad();
    Var l = local.loss(dist::shard(x, comm), dist::shard(y, comm));
    l.backward();
    ddp.finish();
    opt_local->step();
    opt_whole->zero_grad();
    Var lw = whole.loss(x, y);
    lw.backward();
    opt_whole->step();
    const double global = dist::all_reduced(comm, l.value()).item();
    EXPECT_NEAR(global, lw.item(), kShardVsWholeTolerance) << "step " << step;
    for (std::size_t i = 0; i < 4; ++i) {
      const auto a = local.params()[i].value().to_vector<double>();
      const auto b = whole.params()[i].value().to_vector<double>();
      for (std::size_t k = 0; k < a.size(); ++k)
        ASSERT_NEAR(a[k], b[k], kShardVsWholeTolerance) << "step " << step << " parameter " << i;
    }
  }
}

TEST_P(Backends, TwoRanksOnShardsTrainAsOneProcessOnTheWholeBatch) {
  DUALCAST_SKIP_UNLESS_RANKS(2);
  if (run_as_ranks(2)) return;
  auto comm = Communicator::from_environment(device());
  train_and_compare(*comm, device(), /*adam=*/false, {});
  train_and_compare(*comm, device(), /*adam=*/true, {});
}

TEST_P(Backends, SmallBucketsLaunchDuringTheBackwardAndGiveTheSameSteps) {
  DUALCAST_SKIP_UNLESS_RANKS(2);
  if (run_as_ranks(GetParam() == DeviceKind::cpu ? 3 : 2)) return;
  auto comm = Communicator::from_environment(device());
  dist::DataParallelOptions tiny;
  tiny.bucket_cap_bytes = 200;  // 25 float64 values: w1 and w2 get buckets of their own
  tiny.first_bucket_cap_bytes = 24;
  train_and_compare(*comm, device(), /*adam=*/false, tiny);
  Mlp m(device(), 5);
  DataParallel ddp(*comm, m.params(), tiny);
  EXPECT_EQ(ddp.num_buckets(), 4u);
  EXPECT_EQ(ddp.bucket(0), std::vector<std::size_t>{3});  // the last parameter first
  m.loss(Tensor::ones({2, 6}, DType::float64, device()), Tensor::zeros({2, 3}, DType::float64, device()))
      .backward();
  ddp.finish();
  EXPECT_EQ(ddp.buckets_launched_early(), 4u);
}

TEST_P(Backends, AParameterNoBackwardReachedGetsTheAverageOfTheOthers) {
  DUALCAST_SKIP_UNLESS_RANKS(2);
  if (run_as_ranks(2)) return;
  auto comm = Communicator::from_environment(device());
  Var used = Var::param(Tensor::ones({4}, DType::float32, device()));
  Var sometimes = Var::param(Tensor::ones({4}, DType::float32, device()));
  DataParallel ddp(*comm, {used, sometimes});
  // Rank 0 uses `sometimes`, rank 1 does not: its gradient there counts as zero.
  Var l = comm->rank() == 0 ? sum(used * 2.0 + sometimes * 4.0) : sum(used * 2.0);
  l.backward();
  ddp.finish();
  EXPECT_EQ(used.grad().to_vector<double>(), std::vector<double>(4, 2.0));
  EXPECT_EQ(sometimes.grad().to_vector<double>(), std::vector<double>(4, 4.0 / comm->size()));
}

TEST_P(Backends, ASecondBackwardBeforeFinishIsAnError) {
  DUALCAST_SKIP_UNLESS_RANKS(2);
  if (run_as_ranks(2)) return;
  auto comm = Communicator::from_environment(device());
  Var w = Var::param(Tensor::ones({4}, DType::float32, device()));
  DataParallel ddp(*comm, {w});
  sum(w * 3.0).backward();
  EXPECT_THROW(sum(w * 3.0).backward(), Error);
  ddp.finish();
  // Accumulation without reduction, then one reduction of the sum.
  w.zero_grad();
  ddp.set_sync(false);
  sum(w * 1.0).backward();
  ddp.finish();
  ddp.set_sync(true);
  sum(w * (comm->rank() + 1.0)).backward();
  ddp.finish();
  EXPECT_EQ(w.grad().to_vector<double>(), std::vector<double>(4, 1.0 + (comm->size() + 1) / 2.0));
}

TEST_P(Backends, ABucketOfSeveralGradientsAccumulatesAndReducesAsOneInItsDtype) {
  DUALCAST_SKIP_UNLESS_RANKS(2);
  if (run_as_ranks(2)) return;
  auto comm = Communicator::from_environment(device());
  Var w = Var::param(Tensor::ones({4}, DType::float64, device()));
  Var v = Var::param(Tensor::ones({3}, DType::float64, device()));
  Var s = Var::param(Tensor::ones({2}, DType::float32, device()));  // other dtypes: their own buckets
  Var h = Var::param(Tensor::ones({5}, DType::bfloat16, device()));
  DataParallel ddp(*comm, {w, v, s, h});
  ASSERT_EQ(ddp.num_buckets(), 3u);
  EXPECT_EQ(ddp.bucket(0), std::vector<std::size_t>{3});
  EXPECT_EQ(ddp.bucket(1), std::vector<std::size_t>{2});
  EXPECT_EQ(ddp.bucket(2), (std::vector<std::size_t>{1, 0}));
  const double r = comm->rank() + 1.0, mean_r = (comm->size() + 1) / 2.0;
  auto backward = [&](double k) {  // every value below is exact in bfloat16 too
    (sum(w * k) + sum(v * (2.0 * k)) + cast(sum(s * (3.0 * k)), DType::float64) +
     cast(sum(h * (4.0 * k)), DType::float64))
        .backward();
  };
  // Local accumulation, then one reduction of the sums.
  ddp.set_sync(false);
  backward(1.0);
  ddp.finish();
  ddp.set_sync(true);
  backward(r);
  ddp.finish();
  EXPECT_EQ(w.grad().to_vector<double>(), std::vector<double>(4, 1.0 + mean_r));
  EXPECT_EQ(v.grad().to_vector<double>(), std::vector<double>(3, 2.0 * (1.0 + mean_r)));
  EXPECT_EQ(s.grad().to_vector<double>(), std::vector<double>(2, 3.0 * (1.0 + mean_r)));
  EXPECT_EQ(h.grad().dtype(), DType::bfloat16);
  EXPECT_EQ(h.grad().to_vector<double>(), std::vector<double>(5, 4.0 * (1.0 + mean_r)));
  // Without zero_grad the next step adds into the reduced gradients (now the bucket's own storage).
  backward(r);
  ddp.finish();
  EXPECT_EQ(w.grad().to_vector<double>(), std::vector<double>(4, 1.0 + 2.0 * mean_r));
  EXPECT_EQ(v.grad().to_vector<double>(), std::vector<double>(3, 2.0 * (1.0 + 2.0 * mean_r)));
  // After zero_grad a step starts from fresh gradients again.
  w.zero_grad();
  v.zero_grad();
  s.zero_grad();
  h.zero_grad();
  backward(r);
  ddp.finish();
  EXPECT_EQ(w.grad().to_vector<double>(), std::vector<double>(4, mean_r));
  EXPECT_EQ(v.grad().to_vector<double>(), std::vector<double>(3, 2.0 * mean_r));
  EXPECT_EQ(s.grad().to_vector<double>(), std::vector<double>(2, 3.0 * mean_r));
  EXPECT_EQ(h.grad().to_vector<double>(), std::vector<double>(5, 4.0 * mean_r));
}

TEST_P(Backends, ACapturedDataParallelStepReplaysTheEagerSteps) {
  DUALCAST_SKIP_UNLESS_RANKS(2);
  if (run_as_ranks(2)) return;
  auto comm = Communicator::from_environment(device());
  const Device d = device();
  Mlp eager(d, 3), captured(d, 3);
  DataParallel ddp_e(*comm, eager.params()), ddp_c(*comm, captured.params());
  SGD opt_e(eager.params(), 0.05, 0.9), opt_c(captured.params(), 0.05, 0.9);
  const Tensor x = Tensor::randn({8, 6}, d, 11).to(DType::float64);
  const Tensor y = Tensor::randn({8, 3}, d, 12).to(DType::float64);
  const Tensor xs = dist::shard(x, *comm), ys = dist::shard(y, *comm);
  auto step = [](const Mlp& m, DataParallel& ddp, Optimizer& opt, const Tensor& a, const Tensor& b) {
    opt.zero_grad();
    m.loss(a, b).backward();
    ddp.finish();
    opt.step();
  };
  // Warm-up outside capture (allocates optimizer state, NCCL's buffers), then capture.
  step(captured, ddp_c, opt_c, xs, ys);
  step(eager, ddp_e, opt_e, xs, ys);
  Graph g;
  g.capture(d, [&] { step(captured, ddp_c, opt_c, xs, ys); });
  for (int i = 0; i < 3; ++i) {
    g.replay();
    step(eager, ddp_e, opt_e, xs, ys);
  }
  for (std::size_t i = 0; i < 4; ++i)
    EXPECT_EQ(eager.params()[i].value().to_vector<double>(), captured.params()[i].value().to_vector<double>());
}

TEST_P(Backends, ACaptureRightAfterEagerCollectivesIsNotBrokenByTheWatchdog) {
  DUALCAST_SKIP_UNLESS_RANKS(2);
  if (run_as_ranks(2)) return;
  auto comm = Communicator::from_environment(device());
  Tensor t = Tensor::ones({256}, DType::float32, device());
  // Eager collectives leave events for the NCCL watchdog to poll; the capture that follows lasts
  // longer than its polling period, so it polls during the capture (which, in the global capture
  // mode, used to invalidate the capture on that rank alone and leave its peer waiting).
  for (int i = 0; i < 8; ++i) comm->all_reduce({t}, ReduceOp::average);
  Graph g;
  g.capture(device(), [&] {
    comm->all_reduce({t}, ReduceOp::sum);
    comm->wait();
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    t.copy_(t * 0.5);
  });
  for (int i = 0; i < 3; ++i) g.replay();
  // The eager averages keep ones; each replay doubles (sum over 2 ranks) and halves.
  EXPECT_EQ(t.to_vector<double>(), std::vector<double>(256, 1.0));
}

// ---- failures -------------------------------------------------------------------------------

TEST_P(Backends, MismatchedCollectivesAreAnErrorOnEveryRank) {
  if (GetParam() != DeviceKind::cpu) GTEST_SKIP() << "NCCL does not check shapes (the CPU backend does)";
  if (run_as_ranks(2)) return;
  auto comm = Communicator::from_environment(Device::cpu());
  Tensor t = Tensor::ones({comm->rank() == 0 ? 3 : 4});
  comm->all_reduce({t}, ReduceOp::sum);
  try {
    comm->wait();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 called it with"), std::string::npos) << e.what();
  }
}

TEST_P(Backends, ARankThatFailsStopsEveryRankWithinSeconds) {
  DUALCAST_SKIP_UNLESS_RANKS(2);
  const char* fault = std::getenv("DUALCAST_TEST_FAULT");
  if (!Env::launched()) {
    // error: rank 1 fails while rank 0 waits in a collective; kill: rank 1 is killed there;
    // pending: rank 1 fails with its own collective queued, which no peer will ever join (its exit
    // must not wait for it).
    for (const char* how : {"error", "kill", "pending"}) {
      const LaunchResult r = launch_self(2, std::string("DUALCAST_TEST_FAULT=") + how);
      EXPECT_NE(r.status, 0) << how << ":\n" << r.stderr_text;
      EXPECT_LT(r.seconds, kFailureStopsGroupSeconds) << how << ":\n" << r.stderr_text;
      EXPECT_NE(r.stderr_text.find("launch: rank 1 "), std::string::npos) << how << ":\n" << r.stderr_text;
      if (std::string(how) == "kill")
        EXPECT_NE(r.stderr_text.find("SIGKILL"), std::string::npos) << r.stderr_text;
    }
    return;
  }
  const std::string how = fault;
  auto comm = Communicator::from_environment(device());
  Tensor t = Tensor::ones({1000}, DType::float32, device());
  // One collective that completes first: NCCL connects its channels at the first collective, which
  // blocks the host until the peer joins; the faults below happen in a running group.
  comm->all_reduce({t}, ReduceOp::sum);
  comm->wait();
  (void)t.to_vector<double>();
  if (comm->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 0 is waiting by now
    if (how == "kill") std::raise(SIGKILL);
    if (how == "pending") comm->all_reduce({t}, ReduceOp::sum);
    throw Error("rank 1: failing on purpose (bad input)");
  }
  if (how != "pending") {
    comm->all_reduce({t}, ReduceOp::sum);
    comm->wait();
    (void)t.to_vector<double>();  // on a GPU the wait is here; the launcher stops this rank
  }
  std::this_thread::sleep_for(std::chrono::seconds(60));
}

TEST_P(Backends, TheRanksGpuBecomesTheCurrentDevice) {
  if (GetParam() == DeviceKind::cpu) GTEST_SKIP() << "CUDA only";
  DUALCAST_SKIP_UNLESS_RANKS(2);
  if (run_as_ranks(2)) return;
  auto comm = Communicator::from_environment(device());
#if DUALCAST_WITH_CUDA
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, comm->env().local_rank);
#endif
}

TEST_P(Backends, ABarrierAgainstACollectiveIsAnErrorOnBothRanks) {
  if (GetParam() != DeviceKind::cpu) GTEST_SKIP() << "the CPU collective's own protocol";
  if (run_as_ranks(2)) return;
  auto comm = Communicator::from_environment(Device::cpu());
  try {
    if (comm->rank() == 0) {
      comm->barrier();
    } else {
      Tensor t = Tensor::ones({3});
      comm->all_reduce({t}, ReduceOp::sum);
      comm->wait();
    }
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("same collectives in the same order"), std::string::npos) << e.what();
  }
}

TEST_P(Backends, RanksWithDifferentModelsAllRefuseToStart) {
  if (GetParam() != DeviceKind::cpu) GTEST_SKIP() << "checked on the CPU collective (the check is backend-free)";
  if (run_as_ranks(3)) return;
  auto comm = Communicator::from_environment(Device::cpu());
  std::vector<Var> params{Var::param(Tensor::ones({4, 4}))};
  if (comm->rank() == 2) params.push_back(Var::param(Tensor::ones({4})));  // one rank built more
  try {
    DataParallel ddp(*comm, params);
    ADD_FAILURE() << "no error on rank " << comm->rank();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parameter lists differ"), std::string::npos) << e.what();
  }
}

TEST(DistributedFaults, APeerThatNeverComesIsATimeoutNotAHang) {
  if (!Env::launched()) {
    const LaunchResult r = launch_self(2, "DUALCAST_DIST_TIMEOUT=3");
    EXPECT_EQ(r.status, 1) << r.stderr_text;
    EXPECT_NE(r.stderr_text.find("DUALCAST_DIST_TIMEOUT"), std::string::npos) << r.stderr_text;
    EXPECT_LT(r.seconds, kFailureStopsGroupSeconds);
    return;
  }
  auto comm = Communicator::from_environment(Device::cpu());
  if (comm->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(30));  // never joins the collective
    return;
  }
  Tensor t = Tensor::ones({4});
  comm->all_reduce({t}, ReduceOp::sum);
  comm->wait();  // throws after 3 s; the test fails on rank 0, and the launcher stops rank 1
}

INSTANTIATE_TEST_SUITE_P(Distributed, Backends, ::testing::Values(DeviceKind::cpu, DeviceKind::cuda),
                         [](const auto& info) { return info.param == DeviceKind::cpu ? "cpu" : "cuda"; });

}  // namespace
}  // namespace dualcast
