// test_broadcast.cu: the mixed-mode broadcast. Gradients against finite differences (double) for
// functions with branches, loops and early returns, every arity 1..10, every broadcast pattern,
// multiple outputs and both partials policies; CPU == GPU; mixed == reverse for select forms.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "dualcast/broadcast.hpp"
#include "dualcast/gradcheck.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "hmlstm_update.hpp"
#include "test_util.hpp"

using namespace dualcast;

namespace {

using dualcast::testing::HmlstmUpdate;  // the HM-LSTM cell update of Revels et al. 2018, as a user writes it

// The same function without data-dependent control flow: runs on Vars too (pure reverse mode).
// nv_exec_check_disable: the Var instantiation calls host functions from a __host__ __device__
// template; it is only ever instantiated for the host, which the pragma tells nvcc.
struct HmlstmUpdateSelect {
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
  DUALCAST_HD auto operator()(auto z, auto zb, auto c, auto f, auto i, auto g) const {
    auto flush = sigmoid(i) * tanh(g);
    auto update = sigmoid(f) * c + flush;
    return select(z == 1, flush, select(zb == 0, c, update));
  }
};

// Full cell: two outputs from one kernel.
struct HmlstmCell {
  DUALCAST_HD auto operator()(auto z, auto zb, auto c, auto h, auto f, auto i, auto o, auto g) const {
    using D = decltype(c * f);
    if (z == 1) {
      const D cn = sigmoid(i) * tanh(g);
      return std::tuple<D, D>(cn, sigmoid(o) * tanh(cn));
    }
    if (zb == 0) return std::tuple<D, D>(c, h);
    const D cn = sigmoid(f) * c + sigmoid(i) * tanh(g);
    return std::tuple<D, D>(cn, sigmoid(o) * tanh(cn));
  }
};

// Data-dependent loop and early return.
struct NewtonSqrt {  // sqrt(a) by Newton iterations until converged: trip count depends on a
  DUALCAST_HD auto operator()(auto a) const {
    using T = scalar_t<decltype(a)>;
    auto x = a * T(0) + T(1);
    for (int it = 0; it < 60; ++it) {
      auto next = (x + a / x) * T(0.5);
      if (abs(next - x) < T(1e-15) * (1 + abs(x))) return next;
      x = next;
    }
    return x;
  }
};

// prod_k tanh(x_k > 0.5 ? x_k : -x_k), the arity study of the paper.
struct ArityProduct {
  DUALCAST_HD auto operator()(auto... x) const {
    auto term = [](auto v) { return tanh(v > 0.5 ? v : -v); };
    return (term(x) * ...);
  }
};

std::vector<Device> devices() { return dualcast::testing::all_devices(); }

class BroadcastTest : public ::testing::TestWithParam<Device> {};

Tensor flags(const Shape& s, Device d, std::uint64_t seed, DType t = DType::float64) {
  return Tensor::bernoulli(s, 0.5, d, seed, t);
}

// Rows 0, 1, 2 forced to FLUSH, COPY, UPDATE as in the paper.
std::pair<Tensor, Tensor> paper_flags(std::int64_t rows, Device d, DType t = DType::float64) {
  std::vector<double> z = flags({rows, 1}, Device::cpu(), 11, DType::float64).to_vector<double>();
  std::vector<double> zb = flags({rows, 1}, Device::cpu(), 12, DType::float64).to_vector<double>();
  z[0] = 1; z[1] = 0; zb[1] = 0; z[2] = 0; zb[2] = 1;
  return {Tensor::from_vector({rows, 1}, z, d).to(t), Tensor::from_vector({rows, 1}, zb, d).to(t)};
}

// nvcc: the enclosing function of an extended lambda must be public (not a TEST body), so the
// lambdas sit in free functions, as they would in user code.
Var update_with_hd_lambda(const Tensor& z, const Tensor& zb, const std::vector<Var>& v) {
  using D = Dual<double, 4>;
  return broadcast([] DUALCAST_HD(double zz, double zzb, D c, D f, D i, D g) {
    if (zz == 1) return sigmoid(i) * tanh(g);
    if (zzb == 0) return c;
    return sigmoid(f) * c + sigmoid(i) * tanh(g);
  }, z, zb, v[0], v[1], v[2], v[3]);
}

Var sqrt_with_hd_lambda(const Var& x) {
  return broadcast([] DUALCAST_HD(Dual<double, 1> v) { return sqrt(v); }, x);
}

}  // namespace

TEST_P(BroadcastTest, HmlstmUpdateGradientMatchesFiniteDifferencesInEveryBranch) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  const std::int64_t rows = 7, cols = 5;
  auto [z, zb] = paper_flags(rows, d);
  // Every branch is hit.
  const auto zv = z.to_vector<double>(), zbv = zb.to_vector<double>();
  int counts[3] = {0, 0, 0};
  for (std::int64_t r = 0; r < rows; ++r) ++counts[zv[r] == 1 ? 0 : (zbv[r] == 0 ? 1 : 2)];
  ASSERT_GT(counts[0], 0);
  ASSERT_GT(counts[1], 0);
  ASSERT_GT(counts[2], 0);
  for (Partials p : {Partials::store, Partials::recompute}) {
    std::vector<Tensor> in;
    for (int k = 0; k < 4; ++k) in.push_back(Tensor::randn({rows, cols}, d, 100 + k, DType::float64));
    const auto res = check_gradients(
        [&](const std::vector<Var>& v) { return broadcast(p, HmlstmUpdate{}, z, zb, v[0], v[1], v[2], v[3]); },
        in);
    EXPECT_TRUE(res.ok) << partials_name(p) << ": " << res.message;
  }
}

TEST_P(BroadcastTest, LambdaOverDualsMatchesFunctor) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  auto [z, zb] = paper_flags(9, d);
  std::vector<Var> v;
  for (int k = 0; k < 4; ++k) v.push_back(Var::param(Tensor::randn({9, 6}, d, 200 + k, DType::float64)));
  Var a = broadcast(HmlstmUpdate{}, z, zb, v[0], v[1], v[2], v[3]);
  Var b = update_with_hd_lambda(z, zb, v);
  const auto av = a.value().to_vector<double>(), bv = b.value().to_vector<double>();
  // Not bit-equal on the CPU under nvcc: the functor runs in SIMD lanes (libmvec), while nvcc's
  // lambda wrapper is an indirect call, evaluated lane by lane with the C library.
  for (std::size_t j = 0; j < av.size(); ++j)
    EXPECT_LE(relative_error(av[j], bv[j]), kSameResultTolDouble) << j;
  const Tensor adj = Tensor::randn({9, 6}, d, 7, DType::float64);
  a.backward(adj);
  std::vector<std::vector<double>> ga;
  for (auto& x : v) { ga.push_back(x.grad().to_vector<double>()); x.zero_grad(); }
  b.backward(adj);
  for (int k = 0; k < 4; ++k) {
    const auto gb = v[k].grad().to_vector<double>();
    for (std::size_t j = 0; j < gb.size(); ++j)
      EXPECT_LE(relative_error(ga[k][j], gb[j]), kSameResultTolDouble) << k << " " << j;
  }
}

TEST_P(BroadcastTest, LoopsAndEarlyReturnsDifferentiateCorrectly) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  const Tensor a = Tensor::uniform({13}, d, 3, 0.5, 40.0, DType::float64);
  const auto res = check_gradients([](const std::vector<Var>& v) { return broadcast(NewtonSqrt{}, v[0]); }, {a});
  EXPECT_TRUE(res.ok) << res.message;
  // and the value is sqrt
  const auto y = broadcast(NewtonSqrt{}, Var(a)).value().to_vector<double>();
  const auto av = a.to_vector<double>();
  for (std::size_t j = 0; j < y.size(); ++j) EXPECT_NEAR(y[j], std::sqrt(av[j]), 1e-12);
}

template <std::size_t... I>
Var arity_call(const std::vector<Var>& v, std::index_sequence<I...>) {
  return broadcast(ArityProduct{}, v[I]...);
}

template <int K>
void check_arity(Device d) {
  std::vector<Tensor> in;
  for (int k = 0; k < K; ++k) in.push_back(Tensor::uniform({3, 5}, d, 50 + k, -1.0, 1.5, DType::float64));
  for (Partials p : {Partials::store, Partials::recompute}) {
    const auto res = check_gradients(
        [&](const std::vector<Var>& v) {
          return [&]<std::size_t... I>(std::index_sequence<I...>) {
            return broadcast(p, ArityProduct{}, v[I]...);
          }(std::make_index_sequence<K>{});
        },
        in);
    EXPECT_TRUE(res.ok) << "K=" << K << " " << partials_name(p) << ": " << res.message;
  }
}

TEST_P(BroadcastTest, EveryArityFromOneToTenMatchesFiniteDifferences) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  check_arity<1>(d); check_arity<2>(d); check_arity<3>(d); check_arity<4>(d); check_arity<5>(d);
  check_arity<6>(d); check_arity<7>(d); check_arity<8>(d); check_arity<9>(d); check_arity<10>(d);
}

struct ThreeArg {
  DUALCAST_HD auto operator()(auto a, auto b, auto c) const {
    if (a > b) return a * sin(b) + exp(c * 0.3f);
    return a * b - c * c;
  }
};

TEST_P(BroadcastTest, EveryBroadcastPatternReducesGradientsCorrectly) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  const std::vector<std::vector<Shape>> patterns = {
      {{4, 5}, {4, 5}, {4, 5}},     // same shape
      {{4, 5}, {}, {4, 5}},         // 0-d scalar
      {{4, 5}, {1, 5}, {4, 1}},     // row and column
      {{2, 3, 4}, {4}, {3, 1}},     // rank-different
      {{1, 3, 1}, {2, 1, 5}, {1}},  // size-1 dims on both sides
      {{7, 1, 3}, {1, 11, 3}, {7, 11, 1}},
  };
  for (const auto& shapes : patterns) {
    std::vector<Tensor> in;
    for (std::size_t k = 0; k < shapes.size(); ++k)
      in.push_back(Tensor::randn(shapes[k], d, 300 + k, DType::float64));
    for (Partials p : {Partials::store, Partials::recompute}) {
      const auto res = check_gradients(
          [&](const std::vector<Var>& v) { return broadcast(p, ThreeArg{}, v[0], v[1], v[2]); }, in);
      EXPECT_TRUE(res.ok) << shapes[0].str() << shapes[1].str() << shapes[2].str() << " "
                          << partials_name(p) << ": " << res.message;
    }
  }
}

TEST_P(BroadcastTest, SameVariableTwiceAccumulatesBothContributions) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  const Tensor x = Tensor::randn({6, 7}, d, 5, DType::float64);
  const auto res = check_gradients(
      [](const std::vector<Var>& v) { return broadcast(ThreeArg{}, v[0], v[0], v[0]); }, {x});
  EXPECT_TRUE(res.ok) << res.message;
}

TEST_P(BroadcastTest, MultiOutputCellMatchesFiniteDifferencesAndRunsOneKernelPerPass) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  auto [z, zb] = paper_flags(6, d);
  std::vector<Tensor> in;
  for (int k = 0; k < 6; ++k) in.push_back(Tensor::randn({6, 4}, d, 400 + k, DType::float64));
  for (Partials p : {Partials::store, Partials::recompute}) {
    for (int which = 0; which < 2; ++which) {
      const auto res = check_gradients(
          [&](const std::vector<Var>& v) {
            auto [c, h] = broadcast(p, HmlstmCell{}, z, zb, v[0], v[1], v[2], v[3], v[4], v[5]);
            return which == 0 ? c : h;
          },
          in);
      EXPECT_TRUE(res.ok) << "output " << which << " " << partials_name(p) << ": " << res.message;
    }
    // Both outputs at once (adjoints flow into both).
    const auto res = check_gradients(
        [&](const std::vector<Var>& v) {
          auto [c, h] = broadcast(p, HmlstmCell{}, z, zb, v[0], v[1], v[2], v[3], v[4], v[5]);
          return c * h;
        },
        in);
    EXPECT_TRUE(res.ok) << "c*h " << partials_name(p) << ": " << res.message;
  }
  // one node for both outputs
  const auto before = autograd_stats().nodes_created;
  std::vector<Var> v;
  for (auto& t : in) v.push_back(Var::param(t));
  auto [c, h] = broadcast(HmlstmCell{}, z, zb, v[0], v[1], v[2], v[3], v[4], v[5]);
  EXPECT_EQ(autograd_stats().nodes_created - before, 1);
}

TEST_P(BroadcastTest, SelectFormGivesSameValuesAndGradientsInMixedAndReverseMode) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  auto [z, zb] = paper_flags(33, d, DType::float32);
  std::vector<Var> v;
  for (int k = 0; k < 4; ++k) v.push_back(Var::param(Tensor::randn({33, 65}, d, 500 + k)));
  const Tensor adj = Tensor::randn({33, 65}, d, 9);
  Var mixed = broadcast(HmlstmUpdateSelect{}, z, zb, v[0], v[1], v[2], v[3]);
  Var reverse = HmlstmUpdateSelect{}(z, zb, v[0], v[1], v[2], v[3]);
  const auto mv = mixed.value().to_vector<double>(), rv = reverse.value().to_vector<double>();
  for (std::size_t j = 0; j < mv.size(); ++j) EXPECT_NEAR(mv[j], rv[j], kSameResultTolFloat);
  mixed.backward(adj);
  std::vector<std::vector<double>> gm;
  for (auto& x : v) { gm.push_back(x.grad().to_vector<double>()); x.zero_grad(); }
  reverse.backward(adj);
  for (int k = 0; k < 4; ++k) {
    const auto gr = v[k].grad().to_vector<double>();
    for (std::size_t j = 0; j < gr.size(); ++j) EXPECT_NEAR(gm[k][j], gr[j], kSameResultTolFloat) << k;
  }
}

struct TieBreak {  // if partials steered comparisons, a == b would be false for duals
  DUALCAST_HD auto operator()(auto a, auto b) const {
    if (a == b) return a * 2;
    return a * b;
  }
};

TEST_P(BroadcastTest, ComparisonsOnDualsLookAtValuesOnly) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  // a and b hold equal values but get different unit partials: the branch must still be a == b.
  Var a = Var::param(Tensor::full({5}, 1.5, DType::float64, d));
  Var b = Var::param(Tensor::full({5}, 1.5, DType::float64, d));
  Var y = broadcast(TieBreak{}, a, b);
  for (double v : y.value().to_vector<double>()) EXPECT_DOUBLE_EQ(v, 3.0);
  y.backward(Tensor::ones({5}, DType::float64, d));
  for (double g : a.grad().to_vector<double>()) EXPECT_DOUBLE_EQ(g, 2.0);
  for (double g : b.grad().to_vector<double>()) EXPECT_DOUBLE_EQ(g, 0.0);
}

TEST_P(BroadcastTest, ConstantVarsGetNoGradientAndStillWork) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  Var a = Var::param(Tensor::randn({4, 4}, d, 1, DType::float64));
  Var b(Tensor::randn({4, 4}, d, 2, DType::float64));  // a constant Var
  Var y = broadcast(ThreeArg{}, a, b, 0.25);
  y.backward(Tensor::ones({4, 4}, DType::float64, d));
  EXPECT_TRUE(a.has_grad());
  EXPECT_THROW((void)b.grad(), Error);
}

TEST_P(BroadcastTest, NaNInOneElementStaysInThatElement) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  std::vector<double> xs(37, 2.0);
  xs[17] = -1.0;  // sqrt of a negative number: NaN value and NaN partial
  Var x = Var::param(Tensor::from_vector({37}, xs, d));
  Var y = sqrt_with_hd_lambda(x);
  y.backward(Tensor::ones({37}, DType::float64, d));
  const auto yv = y.value().to_vector<double>();
  const auto g = x.grad().to_vector<double>();
  for (int j = 0; j < 37; ++j) {
    EXPECT_EQ(std::isnan(yv[j]), j == 17) << j;
    EXPECT_EQ(std::isfinite(g[j]), j != 17) << j;
    if (j != 17) EXPECT_DOUBLE_EQ(g[j], 0.5 / std::sqrt(2.0)) << j;
  }
}

TEST_P(BroadcastTest, EmptyTensorsGiveEmptyResultsWithoutLaunching) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  Var x = Var::param(Tensor::zeros({0, 3}, DType::float32, d));
  Var y = broadcast(ThreeArg{}, x, x, 1.0f);
  EXPECT_EQ(y.shape(), (Shape{0, 3}));
  EXPECT_EQ(y.numel(), 0);
}

TEST_P(BroadcastTest, IncompatibleShapesRaiseErrorNamingTheArguments) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  Var a = Var::param(Tensor::randn({3, 4}, d, 1));
  Var b = Var::param(Tensor::randn({5, 4}, d, 2));
  try {
    (void)broadcast(ThreeArg{}, a, b, 1.0f);
    FAIL() << "expected dualcast::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[3, 4]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[5, 4]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("broadcast"), std::string::npos) << msg;
  }
  // the tape still works afterwards
  Var y = broadcast(ThreeArg{}, a, a, 1.0f);
  EXPECT_NO_THROW(y.backward(Tensor::ones({3, 4}, DType::float32, d)));
}

TEST_P(BroadcastTest, MixedDtypesRaiseError) {
  const Device d = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(d);
  Var a = Var::param(Tensor::randn({3}, d, 1, DType::float32));
  Var b = Var::param(Tensor::randn({3}, d, 2, DType::float64));
  EXPECT_THROW((void)broadcast(ThreeArg{}, a, b, 1.0), Error);
}

TEST(Broadcast, MixedDevicesRaiseError) {
  DUALCAST_REQUIRE_CUDA();
  Var a = Var::param(Tensor::randn({3}, Device::cpu(), 1));
  Var b = Var::param(Tensor::randn({3}, Device::cuda(), 2));
  EXPECT_THROW((void)broadcast(ThreeArg{}, a, b, 1.0f), Error);
}

TEST(Broadcast, GpuMatchesCpuOnSeededInputs) {
  DUALCAST_REQUIRE_CUDA();
  const Device gpu = Device::cuda();
  std::vector<std::vector<double>> grads[2];
  std::vector<double> values[2];
  int slot = 0;
  for (Device d : {Device::cpu(), gpu}) {
    auto [z, zb] = paper_flags(129, d, DType::float32);
    std::vector<Var> v;
    for (int k = 0; k < 6; ++k) v.push_back(Var::param(Tensor::randn({129, 257}, d, 600 + k)));
    auto [c, h] = broadcast(HmlstmCell{}, z, zb, v[0], v[1], v[2], v[3], v[4], v[5]);
    Var loss = c * h;
    loss.backward(Tensor::randn({129, 257}, d, 77));
    values[slot] = loss.value().to_vector<double>();
    for (auto& x : v) grads[slot].push_back(x.grad().to_vector<double>());
    ++slot;
  }
  for (std::size_t j = 0; j < values[0].size(); ++j) EXPECT_NEAR(values[0][j], values[1][j], kSameResultTolFloat);
  for (std::size_t k = 0; k < grads[0].size(); ++k)
    for (std::size_t j = 0; j < grads[0][k].size(); ++j)
      ASSERT_NEAR(grads[0][k][j], grads[1][k][j], kSameResultTolFloat) << k << " " << j;
}

#if defined(__CUDACC__)
// nvcc: an extended __device__ lambda's enclosing function must be public, so not a TEST body.
Var update_with_device_lambda(const Tensor& z, const Tensor& zb, const std::vector<Var>& v) {
  auto f = [] __device__(auto zz, auto zzb, auto c, auto fg, auto i, auto g) {
    return HmlstmUpdate{}(zz, zzb, c, fg, i, g);
  };
  return broadcast(f, z, zb, v[0], v[1], v[2], v[3]);
}

TEST(Broadcast, GenericDeviceLambdaRunsOnGpuAndIsRefusedOnCpu) {
  {
    auto [z, zb] = paper_flags(4, Device::cpu(), DType::float32);
    Var c = Var::param(Tensor::randn({4, 3}, Device::cpu(), 1));
    EXPECT_THROW((void)update_with_device_lambda(z, zb, {c, c, c, c}), Error);
  }
  DUALCAST_REQUIRE_CUDA();
  const Device d = Device::cuda();
  auto [z, zb] = paper_flags(8, d, DType::float32);
  std::vector<Var> v;
  for (int k = 0; k < 4; ++k) v.push_back(Var::param(Tensor::randn({8, 16}, d, 700 + k)));
  Var a = update_with_device_lambda(z, zb, v);
  Var b = broadcast(HmlstmUpdate{}, z, zb, v[0], v[1], v[2], v[3]);
  const auto av = a.value().to_vector<double>(), bv = b.value().to_vector<double>();
  for (std::size_t j = 0; j < av.size(); ++j) EXPECT_FLOAT_EQ(av[j], bv[j]);
  a.backward(Tensor::ones({8, 16}, DType::float32, d));
  EXPECT_TRUE(v[0].has_grad());
}
#endif

INSTANTIATE_TEST_SUITE_P(Devices, BroadcastTest, ::testing::ValuesIn(devices()),
                         [](const auto& info) { return std::string(dualcast::testing::device_label(info.param)); });

// This file is compiled with DUALCAST_BROADCAST_HALF=0 (tests/CMakeLists.txt): a 16-bit call is a
// clear error, and float32 still works after it.
TEST(BroadcastWithoutHalfBodies, SixteenBitArgumentsAreAnErrorNamingTheSwitch) {
  static_assert(DUALCAST_BROADCAST_HALF == 0, "tests/CMakeLists.txt compiles this file without 16-bit bodies");
  Var x = Var::param(Tensor::ones({2, 3}, DType::bfloat16));
  try {
    (void)broadcast(ThreeArg{}, x, x, x);
    FAIL() << "expected a dualcast::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DUALCAST_BROADCAST_HALF=0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bfloat16"), std::string::npos) << e.what();
  }
  Var y = Var::param(Tensor::ones({2, 3}));
  EXPECT_EQ(broadcast(ThreeArg{}, y, y, y).dtype(), DType::float32);
}
