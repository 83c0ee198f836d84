// test_channel_broadcast.cu: channel_broadcast, the mixed-mode broadcast over NCHW tensors. Fused
// equals composed: values and every gradient equal broadcast() of the same functor with the
// per-channel arguments as [1, C, 1, 1] tensors (the sum_to path), for the residual-network functors
// of ops/norm.hpp, vectorised (H*W a multiple of 4) and not, 2-D [N, C] and 4-D, float32 and
// float64; gradients against finite differences with full-size and per-channel Vars, constant
// Tensors and numbers; a Var passed twice; a gradient added in place to an existing one; the
// per-channel sums identical from run to run; GPU equal to CPU; 16-bit activations with float32
// parameters (ChannelOptions::keep_activation_dtype) equal to the float32 call rounded once; bad
// arguments named in clear errors.
#include <gtest/gtest.h>

#include <string>
#include <type_traits>
#include <vector>

#include "dualcast/broadcast.hpp"
#include "dualcast/channel_broadcast.hpp"
#include "dualcast/gradcheck.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "dualcast/ops/norm.hpp"
#include "dualcast/ops/shape.hpp"
#include "nn_reference.hpp"
#include "test_util.hpp"

using namespace dualcast;
using dualcast::testing::expect_close;
using dualcast::testing::expect_error;

namespace {

/// A functor with a data-dependent branch over every kind of argument: x (full Var), a (channel
/// Var), t (full Tensor), u (channel Tensor), s (number).
struct Mixed {
  DUALCAST_HD auto operator()(auto x, auto a, auto t, auto u, auto s) const {
    if (x > t) return x * a + u * s;
    return tanh(x) * a * a - t * u;
  }
};

struct TwoOf {
  DUALCAST_HD auto operator()(auto x, auto y, auto g) const { return x * y * g + y; }
};

class ChannelBroadcast : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override { DUALCAST_SKIP_IF_UNAVAILABLE(GetParam()); }
};

Shape keep_shape(std::int64_t C, int rank) {
  Shape s;
  for (int d = 0; d < rank; ++d) s.push_back(d == 1 ? C : 1);
  return s;
}

/// Values and gradients of one call, via channel_broadcast (fused) or broadcast with [1, C, 1, 1]
/// arguments (composed).
struct Outcome {
  Tensor y;
  std::vector<Tensor> grads;
};

template <class F>
Outcome run_block(const F& f, const std::vector<Tensor>& full, const std::vector<Tensor>& channel,
                  bool fused, const Tensor& adjoint) {
  std::vector<Var> fv, cv;
  for (const auto& t : full) fv.push_back(Var::param(t.clone()));
  for (const auto& t : channel)
    cv.push_back(Var::param(fused ? t.clone() : t.clone().view(keep_shape(t.numel(), full[0].rank()))));
  auto call = [&](const auto&... args) {
    return fused ? channel_broadcast(f, args...) : Var(broadcast(f, args...));
  };
  Var y;
  if constexpr (std::is_same_v<F, BatchNormApply> || std::is_same_v<F, BatchNormRelu>)
    y = call(fv[0], cv[0], cv[1], cv[2], cv[3]);
  else if constexpr (std::is_same_v<F, BatchNormAddRelu>)
    y = call(fv[0], cv[0], cv[1], cv[2], cv[3], fv[1]);
  else
    y = call(fv[0], cv[0], cv[1], cv[2], cv[3], fv[1], cv[4], cv[5], cv[6], cv[7]);
  y.backward(adjoint);
  Outcome o{y.value(), {}};
  for (auto& v : fv) o.grads.push_back(v.grad());
  for (auto& v : cv) o.grads.push_back(v.grad().view(Shape{v.numel()}));
  return o;
}

TEST_P(ChannelBroadcast, FusedEqualsComposedForTheResidualNetworkFunctors) {
  const Device dev = GetParam();
  std::uint64_t seed = 1;
  for (const Shape& xs : {Shape{3, 4, 4, 4}, Shape{2, 5, 3, 5}, Shape{7, 6}, Shape{2, 3, 1, 1}}) {
    for (const DType dt : {DType::float64, DType::float32}) {
      const std::int64_t C = xs[1];
      auto full = [&] { return Tensor::randn(xs, dev, ++seed, dt); };
      auto chan = [&](double lo, double hi) { return Tensor::uniform({C}, dev, ++seed, lo, hi, dt); };
      const Tensor adj = Tensor::randn(xs, dev, ++seed, dt);
      const double tol = dt == DType::float64 ? 1e-12 : 1e-5;
      const std::string what = xs.str() + " " + dtype_name(dt);
      auto compare = [&](const char* name, const Outcome& a, const Outcome& b) {
        expect_close(a.y, b.y, tol, what + " " + name + " value");
        ASSERT_EQ(a.grads.size(), b.grads.size());
        for (std::size_t k = 0; k < a.grads.size(); ++k)
          expect_close(a.grads[k], b.grads[k], tol, what + " " + name + " gradient " + std::to_string(k));
      };
      const std::vector<Tensor> one{full()}, two{full(), full()};
      const std::vector<Tensor> four{chan(-1, 1), chan(0.5, 2), chan(0.5, 1.5), chan(-1, 1)};
      std::vector<Tensor> eight = four;
      for (int i = 0; i < 4; ++i) eight.push_back(chan(i == 1 ? 0.5 : -1, i == 1 ? 2 : 1));
      compare("BatchNormApply", run_block(BatchNormApply{}, one, four, true, adj),
              run_block(BatchNormApply{}, one, four, false, adj));
      compare("BatchNormRelu", run_block(BatchNormRelu{}, one, four, true, adj),
              run_block(BatchNormRelu{}, one, four, false, adj));
      compare("BatchNormAddRelu", run_block(BatchNormAddRelu{}, two, four, true, adj),
              run_block(BatchNormAddRelu{}, two, four, false, adj));
      compare("BatchNorm2AddRelu", run_block(BatchNorm2AddRelu{}, two, eight, true, adj),
              run_block(BatchNorm2AddRelu{}, two, eight, false, adj));
    }
  }
}

struct MixedOf {
  Tensor t, u;
  Var operator()(const std::vector<Var>& v) const { return channel_broadcast(Mixed{}, v[0], v[1], t, u, 0.7); }
};
struct TwiceOf {
  Var operator()(const std::vector<Var>& v) const { return channel_broadcast(TwoOf{}, v[0], v[0], v[1]); }
};
/// channel_broadcast's backward runs after the product's, so x's gradient already exists: added in
/// place.
struct AfterOf {
  Var operator()(const std::vector<Var>& v) const {
    Var y = channel_broadcast(BatchNormRelu{}, v[0], v[1], v[2], v[1], v[2]);
    return y + v[0] * v[0];
  }
};

TEST_P(ChannelBroadcast, GradientsMatchFiniteDifferences) {
  const Device dev = GetParam();
  // [69, 40]: channels-last rows, reduced in columns on a GPU (a partial block of 32 channels;
  // check_gradients checks every 29th element: both parities of channel).
  for (const Shape& xs : {Shape{3, 4, 2, 4}, Shape{2, 3, 5, 3}, Shape{5, 2}, Shape{69, 40}}) {
    const std::int64_t C = xs[1];
    const Tensor x = Tensor::randn(xs, dev, 11, DType::float64);
    const Tensor a = Tensor::randn({C}, dev, 12, DType::float64);
    const MixedOf mixed{Tensor::randn(xs, dev, 13, DType::float64),
                        Tensor::randn(keep_shape(C, xs.rank()), dev, 14, DType::float64)};
    GradCheckResult r = check_gradients(mixed, {x, a});
    EXPECT_TRUE(r.ok) << xs.str() << " mixed: " << r.message;
    r = check_gradients(TwiceOf{}, {x, a});
    EXPECT_TRUE(r.ok) << xs.str() << " twice: " << r.message;
    r = check_gradients(AfterOf{}, {x, a, Tensor::uniform({C}, dev, 15, 0.5, 2.0, DType::float64)});
    EXPECT_TRUE(r.ok) << xs.str() << " accumulate: " << r.message;
  }
}

TEST_P(ChannelBroadcast, PerChannelSumsAreTheSameEveryRun) {
  const Device dev = GetParam();
  const Shape xs{16, 8, 20, 20};
  const Tensor x = Tensor::randn(xs, dev, 21), adj = Tensor::randn(xs, dev, 22);
  auto run = [&] {
    Var xv = Var::param(x), g = Var::param(Tensor::ones({8}, DType::float32, dev));
    channel_broadcast(BatchNormRelu{}, xv, Tensor::zeros({8}, DType::float32, dev),
                      Tensor::ones({8}, DType::float32, dev), g, 0.1)
        .backward(adj);
    return g.grad().to_vector<float>();
  };
  const auto first = run();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(run(), first);
}

TEST_P(ChannelBroadcast, GpuEqualsCpu) {
  const Device dev = GetParam();
  if (dev.is_cpu()) GTEST_SKIP() << "compares a CUDA device with the CPU";
  // NCHW, and channels-last rows [M, C] with C past a warp (columns on the GPU, several slices).
  for (const Shape& xs : {Shape{8, 6, 7, 9}, Shape{3000, 40}}) {
    const std::int64_t C = xs[1];
    const std::vector<Tensor> two{Tensor::randn(xs, Device::cpu(), 1), Tensor::randn(xs, Device::cpu(), 2)};
    std::vector<Tensor> eight;
    for (int i = 0; i < 8; ++i) eight.push_back(Tensor::uniform({C}, Device::cpu(), 10 + i, 0.5, 1.5));
    const Tensor adj = Tensor::randn(xs, Device::cpu(), 3);
    auto on = [&](Device d) {
      std::vector<Tensor> f, c;
      for (const auto& t : two) f.push_back(t.to(d));
      for (const auto& t : eight) c.push_back(t.to(d));
      return run_block(BatchNorm2AddRelu{}, f, c, true, adj.to(d));
    };
    const Outcome cpu = on(Device::cpu()), gpu = on(dev);
    expect_close(gpu.y.to(Device::cpu()), cpu.y, kSameResultTolFloat, "value " + xs.str());
    for (std::size_t k = 0; k < cpu.grads.size(); ++k)
      expect_close(gpu.grads[k].to(Device::cpu()), cpu.grads[k], kSameResultTolFloat,
                   "gradient " + std::to_string(k) + " " + xs.str());
  }
}

TEST_P(ChannelBroadcast, KeepingTheActivationDtypeGivesTheFloat32CallRoundedOnce) {
  // ChannelOptions::keep_activation_dtype: 16-bit activations (x and a residual) with float32
  // statistics and parameters give a 16-bit result, the float32 call's rounded once; x's and the
  // residual's gradients are 16-bit, the float32 call's rounded once; the parameters' are float32
  // and the float32 call's. NCHW with an odd and an aligned inner size, and [M, C] rows (channels
  // last; a GPU reduces them in columns).
  const Device dev = GetParam();
  const ChannelOptions keep{.keep_activation_dtype = true};
  std::uint64_t seed = 70;
  for (const DType half : {DType::bfloat16, DType::float16}) {
    // One rounding step where the two devices' float32 results differ in the last bit (a GPU
    // contracts multiply-adds); none on the CPU, whose two instantiations compute alike.
    const double tol = dev.is_cpu() ? 0.0 : (half == DType::bfloat16 ? 8e-3 : 1e-3);
    for (const Shape& s : {Shape{3, 5, 7, 3}, Shape{2, 8, 4, 4}, Shape{37, 40}}) {
      const std::int64_t C = s[1];
      const Tensor x16 = Tensor::randn(s, dev, ++seed).to(half), r16 = Tensor::randn(s, dev, ++seed).to(half);
      const Tensor adj16 = Tensor::randn(s, dev, ++seed).to(half);
      const std::vector<Tensor> pc{Tensor::randn({C}, dev, ++seed) * 0.1, Tensor::uniform({C}, dev, ++seed, 0.5, 2.0),
                                   Tensor::uniform({C}, dev, ++seed, 0.5, 2.0), Tensor::randn({C}, dev, ++seed)};
      auto run = [&](bool sixteen) {
        Var x = Var::param(sixteen ? x16 : x16.to(DType::float32));
        Var r = Var::param(sixteen ? r16 : r16.to(DType::float32));
        std::vector<Var> p;
        for (const Tensor& t : pc) p.push_back(Var::param(t.clone()));
        const Var y = sixteen ? channel_broadcast(keep, BatchNormAddRelu{}, x, p[0], p[1], p[2], p[3], r)
                              : channel_broadcast(BatchNormAddRelu{}, x, p[0], p[1], p[2], p[3], r);
        y.backward(sixteen ? adj16 : adj16.to(DType::float32));
        std::vector<Tensor> out{y.value(), x.grad(), r.grad()};
        for (const Var& v : p) out.push_back(v.grad());
        return out;
      };
      const auto got = run(true), want = run(false);
      const std::string what = std::string(dtype_name(half)) + " " + s.str();
      const char* names[] = {"y", "dx", "dresidual", "dmean", "drstd", "dgamma", "dbeta"};
      for (std::size_t k = 0; k < got.size(); ++k) {
        const bool full = k < 3;
        ASSERT_EQ(got[k].dtype(), full ? half : DType::float32) << what << " " << names[k];
        if (full)
          expect_close(got[k].to(DType::float32), want[k].to(half).to(DType::float32), tol, what + " " + names[k]);
        else
          expect_close(got[k], want[k], dev.is_cpu() ? 1e-6 : kSameResultTolFloat, what + " " + names[k]);
      }
    }
  }
  // The default still promotes, and keep takes no float64 parameter for a 16-bit activation.
  const Var x = Var::param(Tensor::randn({2, 3, 4, 4}, dev, 1).to(DType::bfloat16));
  const Var c = Var::param(Tensor::ones({3}, DType::float32, dev));
  EXPECT_EQ(channel_broadcast(BatchNormRelu{}, x, c, c, c, c).dtype(), DType::float32);
  EXPECT_EQ(channel_broadcast(keep, BatchNormRelu{}, x, c, c, c, c).dtype(), DType::bfloat16);
  expect_error([&] { (void)channel_broadcast(keep, BatchNormRelu{}, x, c, c, c, Tensor::ones({3}, DType::float64, dev)); },
               {"channel_broadcast", "different dtypes", "float64", "may also be float32"}, "float64 parameter");
}

TEST_P(ChannelBroadcast, BadArgumentsAreClearErrors) {
  const Device dev = GetParam();
  const Var x = Var::param(Tensor::randn({2, 3, 4, 4}, dev, 1));
  const Var c = Var::param(Tensor::ones({3}, DType::float32, dev));
  expect_error([&] { (void)channel_broadcast(BatchNormRelu{}, x, Tensor::ones({4}, DType::float32, dev), c, c, c); },
               {"channel_broadcast", "argument #1", "[4]", "[2, 3, 4, 4]", "per-channel [3]"}, "bad channel count");
  expect_error([&] { (void)channel_broadcast(BatchNormRelu{}, x, Tensor::ones({2, 3, 4, 1}, DType::float32, dev), c, c, c); },
               {"channel_broadcast", "[2, 3, 4, 1]"}, "partial broadcast");
  expect_error([&] { (void)channel_broadcast(BatchNormRelu{}, x, c, c, c, Var::param(Tensor::ones({3}, DType::float64, dev))); },
               {"channel_broadcast", "different dtypes", "float64"}, "dtype");
  expect_error([&] { (void)channel_broadcast(TwoOf{}, Var::param(Tensor::ones({3}, DType::float32, dev)), c, c); },
               {"channel_broadcast", "rank >= 2"}, "no NCHW argument");
  // Still works.
  EXPECT_EQ(channel_broadcast(BatchNormRelu{}, x, c, c, c, c).shape(), x.shape());
}

INSTANTIATE_TEST_SUITE_P(Devices, ChannelBroadcast, ::testing::ValuesIn(dualcast::testing::all_devices()),
                         [](const ::testing::TestParamInfo<Device>& info) {
                           return std::string(dualcast::testing::device_label(info.param));
                         });

}  // namespace
