// test_graph.cu: Graph (graph.hpp), whole-step capture and replay.
//
//  * an MLP training loop (SGD with momentum, Adam) replayed from one capture equals the same loop run
//    eagerly (the same kernels in the same order: bit for bit on the CPU, <= 1e-6 and reported on the
//    GPU);
//  * the contract's errors: replay before capture, a second capture, a moved-from Graph, replay on
//    another device; on a GPU every operation that cannot be recorded (host reads, host copies,
//    synchronize, empty_cache, nested captures, ...) is a dualcast::Error naming it, the capture is
//    discarded and the library keeps working;
//  * memory: replays allocate nothing (1,000 replays), a graph's pool never serves other allocations
//    and returns to the cache when the Graph is gone;
//  * state that changes between replays: set_lr, Adam's step count, a fed input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "dualcast/dualcast.hpp"
#include "test_util.hpp"

using namespace dualcast;

namespace {

template <class Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no dualcast::Error (expected one mentioning '" << parts.at(0) << "')";
  } catch (const Error& e) {
    for (const auto& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "missing '" << part << "' in: " << e.what();
  }
}

/// A two-layer MLP classifier: logits = tanh(x W1 + b1) W2 + b2, mean cross-entropy.
struct Mlp {
  static constexpr std::int64_t kIn = 12, kHidden = 32, kClasses = 5, kBatch = 16;
  std::vector<Var> params;
  explicit Mlp(Device d) {
    params.push_back(Var::param(Tensor::uniform({kIn, kHidden}, d, 11, -0.5, 0.5)));
    params.push_back(Var::param(Tensor::zeros({kHidden}, DType::float32, d)));
    params.push_back(Var::param(Tensor::uniform({kHidden, kClasses}, d, 12, -0.5, 0.5)));
    params.push_back(Var::param(Tensor::zeros({kClasses}, DType::float32, d)));
  }
  Var loss(const Tensor& x, const Tensor& labels) const {
    const Var h = tanh(matmul(x, params[0]) + params[1]);
    return cross_entropy(matmul(h, params[2]) + params[3], labels);
  }
};

/// Batch k of a fixed stream of inputs and labels (on the host).
Tensor batch_x(int k) { return Tensor::randn({Mlp::kBatch, Mlp::kIn}, Device::cpu(), 100 + k); }
Tensor batch_y(int k) {
  std::vector<float> y(Mlp::kBatch);
  for (std::size_t i = 0; i < y.size(); ++i)
    y[i] = static_cast<float>(static_cast<int>(random::uniform(200 + k, i) * Mlp::kClasses) % Mlp::kClasses);
  return Tensor::from_vector({Mlp::kBatch}, y);
}

std::unique_ptr<Optimizer> make_opt(int which, const std::vector<Var>& params) {
  if (which == 0) return std::make_unique<SGD>(params, 0.1, 0.9);
  return std::make_unique<Adam>(params, 0.01);
}

struct TrainRun {
  std::vector<float> losses;
  std::vector<std::vector<float>> params;
};

TrainRun eager_run(Device d, int which, int steps) {
  Mlp m(d);
  auto opt = make_opt(which, m.params);
  TrainRun r;
  for (int k = 0; k < steps; ++k) {
    opt->zero_grad();
    Var l = m.loss(batch_x(k).to(d), batch_y(k).to(d));
    l.backward();
    opt->step();
    r.losses.push_back(static_cast<float>(l.item()));
  }
  for (const Var& p : m.params) r.params.push_back(p.value().to_vector<float>());
  return r;
}

TrainRun replay_run(Device d, int which, int steps) {
  Mlp m(d);
  auto opt = make_opt(which, m.params);
  Tensor x_in = Tensor::zeros({Mlp::kBatch, Mlp::kIn}, DType::float32, d);
  Tensor y_in = Tensor::zeros({Mlp::kBatch}, DType::float32, d);
  Tensor loss_out = Tensor::zeros({}, DType::float32, d);
  Graph step;
  EXPECT_FALSE(step.captured());
  step.capture(d, [&] {
    opt->zero_grad();
    Var l = m.loss(x_in, y_in);
    l.backward();
    opt->step();
    loss_out.copy_(l.value());
  });
  EXPECT_TRUE(step.captured());
  TrainRun r;
  for (int k = 0; k < steps; ++k) {
    x_in.copy_(batch_x(k));
    y_in.copy_(batch_y(k));
    step.replay();
    r.losses.push_back(static_cast<float>(loss_out.item()));
  }
  for (const Var& p : m.params) r.params.push_back(p.value().to_vector<float>());
  return r;
}

class GraphDevices : public ::testing::TestWithParam<Device> {};

}  // namespace

// ---- capture and replay equal eager execution ------------------------------------------------------

// The same kernels in the same order: identical results. The CPU replay is literally the eager code;
// on a GPU identity also needs cuBLAS to pick the same algorithms with and without capture (same
// handle, same workspace), so there the test holds the runs to 1e-6 and reports whether they are
// bit for bit equal.
TEST_P(GraphDevices, MlpTrainingLoopReplayedEqualsEager) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  for (int which : {0, 1}) {
    const char* opt = which ? "Adam" : "SGD";
    const TrainRun eager = eager_run(d, which, 8);
    const TrainRun replay = replay_run(d, which, 8);
    ASSERT_EQ(replay.params.size(), eager.params.size());
    bool bitwise = replay.losses == eager.losses;
    double worst = array_error(replay.losses, eager.losses, ErrorScale::elementwise);
    for (std::size_t k = 0; k < eager.params.size(); ++k) {
      bitwise = bitwise && replay.params[k] == eager.params[k];
      worst = std::max(worst, array_error(replay.params[k], eager.params[k], ErrorScale::elementwise));
    }
    if (d.is_cpu()) EXPECT_TRUE(bitwise) << opt << ": max rel diff " << worst;
    EXPECT_LE(worst, 1e-6) << opt;
    std::printf("[ mlp/%s/%s ] replay vs eager over 8 steps: %s (max rel diff %.3g)\n", opt,
                dualcast::testing::device_label(d), bitwise ? "bit for bit identical" : "NOT bitwise", worst);
    for (float l : eager.losses) EXPECT_TRUE(std::isfinite(l));
    EXPECT_NE(eager.params[0], Mlp(d).params[0].value().to_vector<float>());  // it did train
  }
}

TEST_P(GraphDevices, CaptureRecordsTheStepAndReplayRunsIt) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  Tensor x = Tensor::zeros({1000}, DType::float32, d);
  int host_calls = 0;
  Graph g;
  g.capture(d, [&] {
    ++host_calls;
    x.copy_(x + 1.0);
  });
  // CUDA: the host code ran once and recorded the device work without running it; CPU: stored.
  EXPECT_EQ(host_calls, d.is_cuda() ? 1 : 0);
  EXPECT_EQ(x.to_vector<float>()[0], 0.0f);
  for (int k = 0; k < 3; ++k) g.replay();
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(1000, 3.0f));
  EXPECT_EQ(host_calls, d.is_cuda() ? 1 : 3);
  EXPECT_EQ(g.device(), d);
  if (d.is_cuda()) EXPECT_GE(g.num_nodes(), 1u);
  g.replay(d);
  EXPECT_EQ(x.to_vector<float>()[999], 4.0f);
}

TEST_P(GraphDevices, SetLrBetweenReplaysTakesEffect) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  // loss = sum(p * c): the gradient is c, so one SGD step moves p by -lr * c exactly.
  const Tensor c = Tensor::full({8}, 2.0, DType::float64, d);
  Var p = Var::param(Tensor::zeros({8}, DType::float64, d));
  SGD sgd({p}, 0.25);
  Graph g;
  g.capture(d, [&] {
    sgd.zero_grad();
    sum(p * c).backward();
    sgd.step();
  });
  g.replay();
  EXPECT_EQ(p.value().to_vector<double>()[3], -0.5);
  sgd.set_lr(1.0);
  g.replay();
  EXPECT_EQ(p.value().to_vector<double>()[3], -2.5);
  sgd.set_lr(1.0);  // unchanged: no-op
  g.replay();
  EXPECT_EQ(p.value().to_vector<double>()[3], -4.5);
}

TEST_P(GraphDevices, AdamCountsStepsAndReadsTheLearningRateOnTheDevice) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  // Against an eager twin whose learning rate changes at the same step.
  Var pa = Var::param(Tensor::randn({64}, d, 5, DType::float64));
  Var pb = Var::param(pa.value().clone());
  const Tensor c = Tensor::randn({64}, d, 6, DType::float64);
  Adam graph_opt({pa}, 0.05), eager_opt({pb}, 0.05);
  Graph g;
  g.capture(d, [&] {
    graph_opt.zero_grad();
    sum(pa * pa * c).backward();
    graph_opt.step();
  });
  EXPECT_EQ(graph_opt.param_steps(0), 0);  // recorded, not run
  for (int k = 0; k < 6; ++k) {
    if (k == 3) {
      graph_opt.set_lr(0.01);
      eager_opt.set_lr(0.01);
    }
    g.replay();
    eager_opt.zero_grad();
    sum(pb * pb * c).backward();
    eager_opt.step();
  }
  EXPECT_EQ(graph_opt.param_steps(0), 6);
  EXPECT_EQ(eager_opt.param_steps(0), 6);
  const auto va = pa.value().to_vector<double>(), vb = pb.value().to_vector<double>();
  for (std::size_t i = 0; i < va.size(); ++i) EXPECT_NEAR(va[i], vb[i], 1e-12 * (1 + std::fabs(vb[i])));
  if (d.is_cpu()) EXPECT_EQ(va, vb);
}

// ---- contract errors on both devices -----------------------------------------------------------------

TEST_P(GraphDevices, ReplayBeforeCaptureAndSecondCaptureAreErrors) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  Graph g;
  EXPECT_FALSE(g.captured());
  expect_error([&] { g.replay(); }, {"Graph::replay", "nothing has been captured"});
  expect_error([&] { (void)g.device(); }, {"Graph::device", "nothing has been captured"});
  Tensor x = Tensor::zeros({4}, DType::float32, d);
  g.capture(d, [&] { x.fill_(1.0); });
  expect_error([&] { g.capture(d, [&] { x.fill_(2.0); }); }, {"Graph::capture", "already holds"});
  g.replay();
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(4, 1.0f));
}

TEST_P(GraphDevices, MovedFromGraphIsAnErrorAndTheTargetReplays) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  Tensor x = Tensor::zeros({4}, DType::float32, d);
  Graph a;
  a.capture(d, [&] { x.copy_(x + 1.0); });
  Graph b = std::move(a);
  EXPECT_FALSE(a.captured());  // NOLINT(bugprone-use-after-move): the contract defines it
  expect_error([&] { a.replay(); }, {"Graph::replay", "moved from"});
  expect_error([&] { a.capture(d, [] {}); }, {"Graph::capture", "moved from"});
  b.replay();
  Graph c;
  c = std::move(b);
  c.replay();
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(4, 2.0f));
}

TEST_P(GraphDevices, ReplayOnAnotherDeviceIsAnError) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  Graph g;
  g.capture(d, [] {});
  const Device other = d.is_cpu() ? Device{DeviceKind::cuda, 0} : Device::cpu();
  expect_error([&] { g.replay(other); }, {"Graph::replay", "captured on " + d.str()});
}

TEST_P(GraphDevices, ReplaysDoNotGrowMemory) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  Mlp m(d);
  Adam opt(m.params, 0.01);
  Tensor x_in = batch_x(0).to(d), y_in = batch_y(0).to(d);
  Tensor loss_out = Tensor::zeros({}, DType::float32, d);
  Graph g;
  g.capture(d, [&] {
    opt.zero_grad();
    Var l = m.loss(x_in, y_in);
    l.backward();
    opt.step();
    loss_out.copy_(l.value());
  });
  g.replay();
  synchronize(d);
  const MemoryStats before = memory_stats(d);
  for (int k = 0; k < dualcast::testing::unless_sanitizing(1000, 20); ++k) g.replay();
  synchronize(d);
  const MemoryStats after = memory_stats(d);
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  EXPECT_EQ(after.bytes_held, before.bytes_held);
  if (d.is_cuda()) {
    EXPECT_EQ(after.device_malloc_calls, before.device_malloc_calls);
    EXPECT_EQ(after.cache_hits, before.cache_hits);  // replays do not even ask the allocator
    EXPECT_EQ(after.graph_pool_bytes, before.graph_pool_bytes);
  }
  EXPECT_TRUE(std::isfinite(loss_out.item()));
}

// ---- GPU only: pools --------------------------------------------------------------------------------

TEST(GraphCuda, PoolBlocksKeepTheirAddressesAndAreNeverHandedToEagerWork) {
  DUALCAST_REQUIRE_CUDA();
  const Device d = Device::cuda(0);
  Var p = Var::param(Tensor::randn({256, 256}, d, 1));
  SGD opt({p}, 0.01);
  Graph g;
  g.capture(d, [&] {
    opt.zero_grad();
    sum(tanh(p) * p).backward();
    opt.step();
  });
  const void* grad_addr = p.grad().raw_data();
  EXPECT_GT(memory_stats(d).graph_pool_bytes, 0);
  for (int k = 0; k < 3; ++k) g.replay();
  EXPECT_EQ(p.grad().raw_data(), grad_addr);
  // Eager work of the same sizes never receives a block of the pool.
  std::set<const void*> eager;
  for (int k = 0; k < 8; ++k) {
    Tensor t = tanh(p.value()) * p.value();
    eager.insert(t.raw_data());
  }
  EXPECT_EQ(eager.count(grad_addr), 0u);
  synchronize(d);
}

TEST(GraphCuda, DestroyingAGraphReturnsItsPoolToTheCache) {
  DUALCAST_REQUIRE_CUDA();
  const Device d = Device::cuda(0);
  Var p = Var::param(Tensor::randn({512, 512}, d, 2));
  SGD opt({p}, 0.01);
  synchronize(d);
  const MemoryStats before = memory_stats(d);
  {
    Graph g;
    g.capture(d, [&] {
      opt.zero_grad();
      sum(sigmoid(p) * p).backward();
      opt.step();
    });
    g.replay();
    synchronize(d);
    EXPECT_GT(memory_stats(d).graph_pool_bytes, 0);
  }
  // The gradient created during the capture still holds a block: the pool outlives the Graph.
  EXPECT_GT(memory_stats(d).graph_pool_bytes, 0);
  opt.zero_grad();
  const MemoryStats after = memory_stats(d);
  EXPECT_EQ(after.graph_pool_bytes, 0);
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  // The blocks are in the general cache now: the same eager step allocates nothing new.
  const auto mallocs = after.device_malloc_calls;
  opt.zero_grad();
  sum(sigmoid(p) * p).backward();
  opt.step();
  opt.zero_grad();
  synchronize(d);
  EXPECT_EQ(memory_stats(d).device_malloc_calls, mallocs);
  empty_cache(d);
  EXPECT_EQ(memory_stats(d).bytes_held, memory_stats(d).bytes_in_use);
}

// ---- GPU only: what cannot be captured ------------------------------------------------------------

namespace {
/// Captures `op` (after some recordable work) into a fresh Graph: it must throw a dualcast::Error
/// naming `name`; then the Graph is empty, nothing is capturing, memory is back and the library
/// works (an eager computation and a new capture).
template <class Op>
void expect_uncapturable(const std::string& name, Op&& op) {
  SCOPED_TRACE(name);
  const Device d = Device::cuda(0);
  Tensor x = Tensor::full({64}, 3.0, DType::float32, d);
  synchronize(d);
  const MemoryStats before = memory_stats(d);
  Graph g;
  expect_error(
      [&] {
        g.capture(d, [&] {
          Tensor y = x * 2.0;
          op(y);
        });
      },
      {name, "cannot be recorded in a CUDA graph"});
  EXPECT_FALSE(g.captured());
  EXPECT_FALSE(capturing(d));
  expect_error([&] { g.replay(); }, {"nothing has been captured"});
  const MemoryStats after = memory_stats(d);
  EXPECT_EQ(after.graph_pool_bytes, 0);
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  // The stream is usable and the library keeps working.
  EXPECT_EQ((x * 2.0).to_vector<float>()[7], 6.0f);
  Graph h;
  Tensor z = Tensor::zeros({64}, DType::float32, d);
  h.capture(d, [&] { z.copy_(x + 1.0); });
  h.replay();
  EXPECT_EQ(z.to_vector<float>()[5], 4.0f);
}
}  // namespace

TEST(GraphCuda, HostReadsDuringCaptureAreErrors) {
  DUALCAST_REQUIRE_CUDA();
  expect_uncapturable("Tensor::item", [](const Tensor& y) { (void)sum(y).item(); });
  expect_uncapturable("Tensor::to_vector", [](const Tensor& y) { (void)y.to_vector<float>(); });
  expect_uncapturable("norm", [](const Tensor& y) { (void)norm(y); });
  expect_uncapturable("Tensor::item", [](const Tensor& y) { (void)Var(sum(y)).item(); });  // Var::item
}

TEST(GraphCuda, HostCopiesDuringCaptureAreErrors) {
  DUALCAST_REQUIRE_CUDA();
  const Tensor host = Tensor::ones({64});
  expect_uncapturable("Tensor::copy_ from the host", [&](Tensor y) { y.copy_(host); });
  expect_uncapturable("Tensor::copy_ to the host", [&](const Tensor& y) { Tensor(host).copy_(y); });
  expect_uncapturable("Tensor::to(cpu)", [](const Tensor& y) { (void)y.to(Device::cpu()); });
  expect_uncapturable("Tensor::to (a copy from the host)",
                      [&](const Tensor&) { (void)host.to(Device::cuda(0)); });
  expect_uncapturable("Tensor::from_vector", [](const Tensor&) {
    (void)Tensor::from_vector({2}, std::vector<float>{1, 2}, Device::cuda(0));
  });
  expect_uncapturable("a copy from the host to the device", [&](const Tensor& y) {
    copy_bytes(y.raw_data(), y.device(), host.raw_data(), Device::cpu(), 16);
  });
}

TEST(GraphCuda, SynchronisationAndCacheControlDuringCaptureAreErrors) {
  DUALCAST_REQUIRE_CUDA();
  expect_uncapturable("synchronize", [](const Tensor& y) { synchronize(y.device()); });
  expect_uncapturable("empty_cache", [](const Tensor& y) { empty_cache(y.device()); });
}

TEST(GraphCuda, OptimizerStateChangesDuringCaptureAreErrors) {
  DUALCAST_REQUIRE_CUDA();
  Var p = Var::param(Tensor::zeros({4}, DType::float32, Device::cuda(0)));
  SGD sgd({p}, 0.1);
  expect_uncapturable("Optimizer::set_lr", [&](const Tensor&) { sgd.set_lr(0.2); });
  expect_uncapturable("constructing an optimizer", [&](const Tensor&) { Adam a({p}, 0.1); });
  EXPECT_EQ(sgd.lr(), 0.1);
  // set_lr with the current value records nothing and is allowed.
  Graph g;
  g.capture(Device::cuda(0), [&] { sgd.set_lr(0.1); });
  EXPECT_TRUE(g.captured());
}

TEST(GraphCuda, NestedCapturesAndReplaysInsideACaptureAreErrors) {
  DUALCAST_REQUIRE_CUDA();
  const Device d = Device::cuda(0);
  Tensor x = Tensor::zeros({8}, DType::float32, d);
  Graph ready;
  ready.capture(d, [&] { x.fill_(1.0); });
  Graph outer;
  expect_error(
      [&] {
        outer.capture(d, [&] {
          Graph inner;
          inner.capture(d, [&] { x.fill_(2.0); });
        });
      },
      {"Graph::capture", "nested"});
  EXPECT_FALSE(outer.captured());
  Graph outer2;
  expect_error([&] { outer2.capture(d, [&] { ready.replay(); }); }, {"Graph::replay", "capture is in progress"});
  EXPECT_FALSE(capturing(d));
  ready.replay();
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(8, 1.0f));
}

TEST(GraphCuda, AnExceptionFromTheStepDiscardsTheCapture) {
  DUALCAST_REQUIRE_CUDA();
  const Device d = Device::cuda(0);
  Var p = Var::param(Tensor::randn({128}, d, 3));
  synchronize(d);
  const MemoryStats before = memory_stats(d);
  Graph g;
  EXPECT_THROW(g.capture(d,
                         [&] {
                           Var l = sum(p * p);
                           EXPECT_TRUE(capturing(d));
                           throw std::runtime_error("user error");
                         }),
               std::runtime_error);
  EXPECT_FALSE(g.captured());
  EXPECT_FALSE(capturing(d));
  EXPECT_EQ(memory_stats(d).graph_pool_bytes, 0);
  EXPECT_EQ(memory_stats(d).bytes_in_use, before.bytes_in_use);
  EXPECT_NEAR(sum(p.value() * p.value()).item(), std::pow(norm(p.value()), 2), 1e-3);
}

TEST(GraphCuda, CrossEntropyWithABadLabelUnderReplayGivesNaN) {
  DUALCAST_REQUIRE_CUDA();
  const Device d = Device::cuda(0);
  Var logits = Var::param(Tensor::randn({4, 3}, d, 4));
  Tensor labels = Tensor::from_vector({4}, std::vector<float>{0, 1, 2, 1}, d);
  Tensor loss_out = Tensor::zeros({}, DType::float32, d);
  Graph g;
  g.capture(d, [&] {
    logits.zero_grad();
    Var l = cross_entropy(logits, labels);
    l.backward();
    loss_out.copy_(l.value());
  });
  g.replay();
  EXPECT_TRUE(std::isfinite(loss_out.item()));
  labels.copy_(Tensor::from_vector({4}, std::vector<float>{0, 7, 2, 1}));
  g.replay();
  EXPECT_TRUE(std::isnan(loss_out.item()));
  EXPECT_TRUE(std::isnan(logits.grad().to_vector<float>()[3]));
  // Eager, the same label is still an Error naming it.
  expect_error([&] { (void)cross_entropy(logits.value(), labels); }, {"cross_entropy", "label 7"});
}

INSTANTIATE_TEST_SUITE_P(Devices, GraphDevices, ::testing::ValuesIn(dualcast::testing::all_devices()),
                         [](const auto& info) {
                           return std::string(dualcast::testing::device_label(info.param));
                         });
