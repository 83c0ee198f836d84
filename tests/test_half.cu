// test_half.cu: the 16-bit dtypes: conversions (every bit pattern, rounding of ties, overflow,
// subnormals; the GPU's cvt instructions equal the host's bit arithmetic), tensors of bfloat16 and
// float16 (creation, random numbers, conversion, promotion, cast on the tape), and broadcast over
// 16-bit tensors (loads 16 bits, computes in float, stores 16 bits) against the float32 broadcast of
// the same rounded values, on the CPU and on CUDA.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "dualcast/dualcast.hpp"
#include "test_util.hpp"

using namespace dualcast;
using dualcast::testing::all_devices;
using dualcast::testing::device_label;

namespace {

float from_bits32(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

/// The representable 16-bit value nearest to x (ties to the even bit pattern), found by brute force
/// over every finite pattern: the reference the conversions must equal.
template <class H>
std::uint16_t nearest_bits(double x, const std::vector<double>& values) {
  std::uint16_t best = 0;
  double best_err = INFINITY;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const double v = values[b];
    if (!std::isfinite(v)) continue;
    const double err = std::fabs(v - x);
    if (err < best_err || (err == best_err && (b & 1u) == 0 && (best & 1u) == 1)) {
      best = static_cast<std::uint16_t>(b);
      best_err = err;
    }
  }
  return best;
}

template <class H>
std::vector<double> all_values() {
  std::vector<double> v(65536);
  for (std::uint32_t b = 0; b < 65536; ++b) v[b] = static_cast<float>(H::from_bits(static_cast<std::uint16_t>(b)));
  return v;
}

/// Floats that exercise rounding: ties, values just off ties, subnormals, the overflow boundary.
template <class H>
std::vector<float> probe_floats() {
  std::vector<float> xs{0.0f, -0.0f, 1.0f, -1.0f, 1.00390625f, 1.01171875f, 3.14159265f, 1e-3f,
                        1e-8f, 6e-8f, 3e-8f, 65504.0f, 65519.0f, 65520.0f, 65535.0f, 1e5f, 3e38f,
                        -2.5e-5f, 1.0e-38f, 1.17549435e-38f};
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 2000; ++i) {
    const float f = from_bits32(bits(rng));
    if (std::isfinite(f)) xs.push_back(f);
  }
  // Exact ties between neighbouring 16-bit values, both parities.
  const auto values = all_values<H>();
  for (std::uint32_t b = 1; b < 0x7b00; b += 997) xs.push_back(static_cast<float>((values[b] + values[b + 1]) / 2));
  return xs;
}

template <class H>
void expect_rounding_matches_nearest() {
  const auto values = all_values<H>();
  const double max_finite = std::is_same_v<H, bfloat16> ? 3.3895313892515355e38 : 65504.0;
  const double next_up = std::is_same_v<H, bfloat16> ? 3.402823669209385e38 : 65536.0;
  for (float x : probe_floats<H>()) {
    const std::uint16_t got = H(x).bits;
    const double ax = std::fabs(static_cast<double>(x));
    if (ax >= (max_finite + next_up) / 2) {  // rounds to infinity (the tie included: max is odd)
      EXPECT_TRUE(std::isinf(static_cast<float>(H(x)))) << x;
      continue;
    }
    const std::uint16_t want = nearest_bits<H>(x, values);
    // -0 and +0 are both nearest to a tiny negative number; keep the sign as IEEE does.
    if (static_cast<float>(H::from_bits(want)) == 0.0f) {
      EXPECT_EQ(static_cast<float>(H::from_bits(got)), 0.0f) << x;
      EXPECT_EQ(std::signbit(static_cast<float>(H::from_bits(got))), std::signbit(x)) << x;
    } else {
      EXPECT_EQ(got, want) << "x = " << x;
    }
  }
}

}  // namespace

TEST(HalfConversion, BfloatRoundsToTheNearestValueWithTiesToEven) { expect_rounding_matches_nearest<bfloat16>(); }
TEST(HalfConversion, Float16RoundsToTheNearestValueWithTiesToEven) { expect_rounding_matches_nearest<float16>(); }

TEST(HalfConversion, EveryBitPatternSurvivesARoundTripThroughFloat) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    const float fb = bfloat16::from_bits(h);
    const float fh = float16::from_bits(h);
    if (std::isnan(fb)) EXPECT_TRUE(std::isnan(static_cast<float>(bfloat16(fb))));
    else EXPECT_EQ(bfloat16(fb).bits, h);
    if (std::isnan(fh)) EXPECT_TRUE(std::isnan(static_cast<float>(float16(fh))));
    else EXPECT_EQ(float16(fh).bits, h);
  }
}

TEST(HalfConversion, Float16ValuesAreTheIeeeBinary16Ones) {
  EXPECT_EQ(static_cast<float>(float16::from_bits(0x3c00)), 1.0f);
  EXPECT_EQ(static_cast<float>(float16::from_bits(0x7bff)), 65504.0f);
  EXPECT_EQ(static_cast<float>(float16::from_bits(0x0001)), std::ldexp(1.0f, -24));
  EXPECT_EQ(static_cast<float>(float16::from_bits(0x0400)), std::ldexp(1.0f, -14));
  EXPECT_TRUE(std::isinf(static_cast<float>(float16::from_bits(0xfc00))));
  EXPECT_EQ(static_cast<float>(bfloat16::from_bits(0x3f80)), 1.0f);
  EXPECT_EQ(bfloat16(std::numeric_limits<float>::quiet_NaN()).bits & 0x7f80u, 0x7f80u);
}

// ---- tensors -------------------------------------------------------------------------------------

/// "cpu_bfloat16", ...: the parameter names of the suites below.
std::string device_dtype_name(const ::testing::TestParamInfo<std::tuple<Device, DType>>& info) {
  return std::string(device_label(std::get<0>(info.param))) + "_" + dtype_name(std::get<1>(info.param));
}

class HalfTensorTest : public ::testing::TestWithParam<std::tuple<Device, DType>> {
 protected:
  void SetUp() override { DUALCAST_SKIP_IF_UNAVAILABLE(dev()); }
  [[nodiscard]] Device dev() const { return std::get<0>(GetParam()); }
  [[nodiscard]] DType dt() const { return std::get<1>(GetParam()); }
};

namespace {
/// Every value of t as the float32 tensor it rounds from: the reference a 16-bit result must equal.
std::vector<float> rounded(const std::vector<float>& xs, DType dt) {
  std::vector<float> r;
  for (float x : xs) r.push_back(dt == DType::bfloat16 ? static_cast<float>(bfloat16(x)) : static_cast<float>(float16(x)));
  return r;
}
}  // namespace

TEST_P(HalfTensorTest, ConversionsOnTheDeviceEqualTheHostBitArithmetic) {
  // Every bit pattern up and back, and random floats down, through the device's kernels.
  std::vector<float> xs = probe_floats<bfloat16>();
  const Tensor f = Tensor::from_vector<float>({static_cast<std::int64_t>(xs.size())}, xs, dev());
  EXPECT_EQ(f.to(dt()).to(DType::float32).to_vector<float>(), rounded(xs, dt()));
  std::vector<std::uint8_t> raw(2 * 65536);
  for (std::uint32_t b = 0; b < 65536; ++b) {
    raw[2 * b] = static_cast<std::uint8_t>(b & 0xff);
    raw[2 * b + 1] = static_cast<std::uint8_t>(b >> 8);
  }
  Tensor bits = Tensor::empty({65536}, dt(), dev());
  copy_bytes(bits.raw_data(), dev(), raw.data(), Device::cpu(), raw.size());
  const std::vector<float> up = bits.to(DType::float32).to_vector<float>();
  const std::vector<float> back = Tensor::from_vector<float>({65536}, up, dev()).to(dt()).to_vector<float>();
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const float want = dt() == DType::bfloat16 ? static_cast<float>(bfloat16::from_bits(static_cast<std::uint16_t>(b)))
                                               : static_cast<float>(float16::from_bits(static_cast<std::uint16_t>(b)));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(up[b]) && std::isnan(back[b])) << b;
    } else {
      ASSERT_EQ(std::memcmp(&up[b], &want, 4), 0) << "pattern " << b;
      ASSERT_EQ(std::memcmp(&back[b], &want, 4), 0) << "pattern " << b;
    }
  }
}

TEST_P(HalfTensorTest, CreationAndRandomNumbersEqualTheRoundedFloat32Ones) {
  const Shape s{3, 37};
  EXPECT_EQ(Tensor::zeros(s, dt(), dev()).to_vector<float>(), std::vector<float>(111, 0.0f));
  EXPECT_EQ(Tensor::full(s, 0.1, dt(), dev()).to_vector<float>(), rounded(std::vector<float>(111, 0.1f), dt()));
  EXPECT_EQ(Tensor::arange(0.0, 3.0, 0.25, dt(), dev()).to_vector<float>(),
            rounded(Tensor::arange(0.0, 3.0, 0.25).to_vector<float>(), dt()));
  const Tensor r = Tensor::randn(s, dev(), 11, dt());
  EXPECT_EQ(r.dtype(), dt());
  EXPECT_EQ(r.nbytes(), 111u * 2);
  EXPECT_EQ(r.to_vector<float>(), rounded(Tensor::randn(s, Device::cpu(), 11).to_vector<float>(), dt()));
  EXPECT_EQ(Tensor::uniform(s, dev(), 5, -2.0, 2.0, dt()).to_vector<float>(),
            rounded(Tensor::uniform(s, Device::cpu(), 5, -2.0, 2.0).to_vector<float>(), dt()));
  EXPECT_NE(r.str().find(dtype_name(dt())), std::string::npos);
  EXPECT_THROW((void)r.data<float>(), Error);
}

TEST_P(HalfTensorTest, ShapeOpsMoveSixteenBitWordsUnchanged) {
  const Tensor x = Tensor::randn({4, 6, 5}, dev(), 3, dt());
  const std::vector<float> xv = x.to_vector<float>();
  const Tensor t = permute(x, {2, 0, 1});
  const std::vector<float> tv = t.to_vector<float>();
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 6; ++j)
      for (int k = 0; k < 5; ++k) EXPECT_EQ(tv[(k * 4 + i) * 6 + j], xv[(i * 6 + j) * 5 + k]);
  const Tensor c = concat({x, x}, 1);
  EXPECT_EQ(c.dtype(), dt());
  EXPECT_EQ(slice(c, 1, 6, 12).to_vector<float>(), xv);
}

TEST_P(HalfTensorTest, CastOnTheTapeSendsTheGradientBackInTheSourceDtype) {
  Var w = Var::param(Tensor::randn({2, 9}, dev(), 4));
  Var h = cast(w, dt());
  EXPECT_EQ(h.dtype(), dt());
  Var y = cast(h * h, DType::float32);
  y.backward(Tensor::ones({2, 9}, DType::float32, dev()));
  ASSERT_EQ(w.grad().dtype(), DType::float32);
  const auto wv = h.value().to_vector<float>();
  const auto g = w.grad().to_vector<float>();
  for (std::size_t i = 0; i < g.size(); ++i) {
    // d(h*h)/dh = 2h, rounded once to the 16-bit type, then widened exactly.
    const float want = rounded({2.0f * wv[i]}, dt())[0];
    EXPECT_EQ(g[i], want) << i;
  }
  EXPECT_THROW((void)cast(w, DType::uint8), Error);
}

INSTANTIATE_TEST_SUITE_P(Devices, HalfTensorTest,
                         ::testing::Combine(::testing::ValuesIn(all_devices()),
                                            ::testing::Values(DType::bfloat16, DType::float16)),
                         device_dtype_name);

// ---- broadcast over 16-bit tensors ---------------------------------------------------------------

namespace {

// The paper's cell update, with branches on values.
struct CellUpdate {
  DUALCAST_HD auto operator()(auto z, auto zb, auto c, auto f, auto i, auto g) const {
    if (z == 1) return sigmoid(i) * tanh(g);
    if (zb == 0) return c;
    return sigmoid(f) * c + sigmoid(i) * tanh(g);
  }
};

// Two outputs from one kernel.
struct TwoOutputs {
  DUALCAST_HD auto operator()(auto a, auto b) const {
    using D = decltype(a * b);
    return std::tuple<D, D>(a * b + exp(a), tanh(b) - a);
  }
};

// prod_k tanh(x_k > 0.5 ? x_k : -x_k): ten partials per element.
struct ArityProduct16 {
  DUALCAST_HD auto operator()(auto... x) const {
    auto term = [](auto v) { return tanh(v > 0.5f ? v : -v); };
    return (term(x) * ...);
  }
};

double tol16(DType dt) { return dt == DType::bfloat16 ? kSameResultTolBfloat16 : kSameResultTolFloat16; }

/// Runs f over `shapes` twice: on 16-bit Vars, and on float32 Vars holding the same (rounded)
/// values; outputs must equal the float32 ones rounded once, gradients likewise (a gradient summed
/// over broadcast dimensions: within one rounding per summed term).
template <class F, std::size_t... I>
void expect_half_broadcast_matches_float32(F f, const std::vector<Shape>& shapes, Device d, DType dt,
                                           Partials policy, std::index_sequence<I...>) {
  std::vector<Var> h, r;
  Shape out_shape;
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    const Tensor x16 = Tensor::uniform(shapes[k], d, 100 + k, -1.5, 1.5, dt);
    h.push_back(Var::param(x16));
    r.push_back(Var::param(x16.to(DType::float32)));
  }
  auto yh = broadcast(policy, f, h[I]...);
  auto yr = broadcast(policy, f, r[I]...);
  std::vector<Var> outs_h, outs_r;
  if constexpr (std::is_same_v<decltype(yh), Var>) {
    outs_h = {yh};
    outs_r = {yr};
  } else {
    outs_h.assign(yh.begin(), yh.end());
    outs_r.assign(yr.begin(), yr.end());
  }
  Var lh, lr;
  for (std::size_t m = 0; m < outs_h.size(); ++m) {
    ASSERT_EQ(outs_h[m].dtype(), dt);
    const Tensor want = outs_r[m].value().to(dt).to(DType::float32);
    EXPECT_LE(array_error(outs_h[m].value().to(DType::float32), want, ErrorScale::elementwise), tol16(dt))
        << "output " << m;
    // Adjoints of 16-bit values, the same for both runs.
    const Tensor adj = Tensor::uniform(outs_h[m].shape(), d, 900 + m, -1.0, 1.0, dt);
    Var th = sum(outs_h[m] * Var(adj));
    Var tr = sum(outs_r[m] * Var(adj.to(DType::float32)));
    lh = lh.defined() ? lh + cast(th, DType::float32) : cast(th, DType::float32);
    lr = lr.defined() ? lr + tr : tr;
    out_shape = outs_h[m].shape();
  }
  lh.backward();
  lr.backward();
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    ASSERT_EQ(h[k].grad().dtype(), dt);
    const double summed = static_cast<double>(out_shape.numel() / std::max<std::int64_t>(1, shapes[k].numel()));
    const double tol = (summed / 2 + 1) * tol16(dt) * static_cast<double>(outs_h.size());
    EXPECT_LE(array_error(h[k].grad().to(DType::float32), r[k].grad(), ErrorScale::largest_or_one), tol)
        << "gradient of argument " << k << " (summed over " << summed << " elements)";
  }
}

}  // namespace

class HalfBroadcastTest : public HalfTensorTest {};

TEST_P(HalfBroadcastTest, BranchyCellEqualsTheFloat32CellRoundedOnceInEveryBroadcastPattern) {
  for (Partials p : {Partials::recompute, Partials::store}) {
    // Flags per row, a bias per column, odd sizes (tails of 8-element chunks), full operands.
    const Tensor z = Tensor::bernoulli({37, 1}, 0.3, dev(), 1, dt());
    const Tensor zb = Tensor::bernoulli({37, 1}, 0.5, dev(), 2, dt());
    std::vector<Var> h, r;
    const std::vector<Shape> shapes{{37, 53}, {1, 53}, {37, 53}, {37, 1}};
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      const Tensor x = Tensor::uniform(shapes[k], dev(), 30 + k, -2.0, 2.0, dt());
      h.push_back(Var::param(x));
      r.push_back(Var::param(x.to(DType::float32)));
    }
    Var yh = broadcast(p, CellUpdate{}, z, zb, h[0], h[1], h[2], h[3]);
    Var yr = broadcast(p, CellUpdate{}, z.to(DType::float32), zb.to(DType::float32), r[0], r[1], r[2], r[3]);
    EXPECT_LE(array_error(yh.value().to(DType::float32), yr.value().to(dt()).to(DType::float32),
                          ErrorScale::elementwise),
              tol16(dt()));
    cast(sum(yh), DType::float32).backward();
    sum(yr).backward();
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      const double summed = static_cast<double>(37 * 53 / shapes[k].numel());
      EXPECT_LE(array_error(h[k].grad().to(DType::float32), r[k].grad(), ErrorScale::largest_or_one),
                (summed / 2 + 1) * tol16(dt()))
          << partials_name(p) << ", argument " << k;
    }
  }
}

TEST_P(HalfBroadcastTest, TwoOutputsAndTenPartialsEqualTheFloat32ResultsRoundedOnce) {
  for (Partials p : {Partials::recompute, Partials::store}) {
    expect_half_broadcast_matches_float32(TwoOutputs{}, {{5, 67}, {67}}, dev(), dt(), p,
                                          std::make_index_sequence<2>{});
    std::vector<Shape> ten(10, Shape{3, 41});
    ten[3] = Shape{41};
    ten[7] = Shape{};
    expect_half_broadcast_matches_float32(ArityProduct16{}, ten, dev(), dt(), p,
                                          std::make_index_sequence<10>{});
  }
}

TEST_P(HalfBroadcastTest, SixteenBitAndFloat32ArgumentsPromoteToFloat32WithGradientsInTheirOwnDtypes) {
  Var a = Var::param(Tensor::randn({4, 9}, dev(), 1, dt()));
  Var b = Var::param(Tensor::randn({9}, dev(), 2));
  Var y = a * b + 1.5;  // a plain number does not promote
  ASSERT_EQ(y.dtype(), DType::float32);
  Var y16 = a * 1.5;
  EXPECT_EQ(y16.dtype(), dt());
  sum(y).backward();
  ASSERT_EQ(a.grad().dtype(), dt());
  ASSERT_EQ(b.grad().dtype(), DType::float32);
  const auto av = a.value().to_vector<float>();
  const auto bv = b.value().to_vector<float>();
  const auto ga = a.grad().to_vector<float>();
  const auto gb = b.grad().to_vector<float>();
  for (int j = 0; j < 9; ++j) {
    float s = 0;
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(ga[i * 9 + j], rounded({bv[j]}, dt())[0]);
      s += av[i * 9 + j];
    }
    EXPECT_NEAR(gb[j], s, 1e-5 * (1 + std::fabs(s)));
  }
  // float64 does not mix with 16-bit or float32 tensors.
  EXPECT_THROW((void)(a * Var(Tensor::ones({9}, DType::float64, dev()))), Error);
}

namespace {
// Batch-norm apply fused with a ReLU: x full-size, gamma/beta/mean per channel.
struct NormRelu {
  DUALCAST_HD auto operator()(auto x, auto g, auto b, auto m) const {
    const auto y = (x - m) * g + b;
    return y > 0 ? y : y - y;
  }
};
}  // namespace

TEST_P(HalfBroadcastTest, ChannelBroadcastOverSixteenBitTensorsEqualsFloat32RoundedOnce) {
  // N, C, H, W with an odd inner size (no packets) and an aligned one (packets).
  for (const Shape& s : {Shape{3, 5, 7, 3}, Shape{2, 6, 4, 4}}) {
    const std::int64_t C = s[1];
    std::vector<Var> h, r;
    const std::vector<Shape> shapes{s, Shape{C}, Shape{1, C, 1, 1}, Shape{C}};
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      const Tensor x = Tensor::uniform(shapes[k], dev(), 60 + k, -1.0, 1.0, dt());
      h.push_back(Var::param(x));
      r.push_back(Var::param(x.to(DType::float32)));
    }
    Var yh = channel_broadcast(NormRelu{}, h[0], h[1], h[2], h[3]);
    Var yr = channel_broadcast(NormRelu{}, r[0], r[1], r[2], r[3]);
    ASSERT_EQ(yh.dtype(), dt());
    EXPECT_LE(array_error(yh.value().to(DType::float32), yr.value().to(dt()).to(DType::float32),
                          ErrorScale::elementwise),
              tol16(dt()));
    cast(sum(yh), DType::float32).backward();
    sum(yr).backward();
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      ASSERT_EQ(h[k].grad().dtype(), dt());
      const double summed = static_cast<double>(s.numel() / shapes[k].numel());
      // Per-channel sums are kept in float and rounded once; full-size ones are one product each.
      EXPECT_LE(array_error(h[k].grad().to(DType::float32), r[k].grad(), ErrorScale::largest_or_one),
                (k == 0 ? 1.0 : 2.0) * tol16(dt()))
          << "argument " << k << " (summed over " << summed << " elements)";
    }
  }
  // float32 per-channel parameters with a 16-bit x promote: a float32 result, gradients in each
  // argument's own dtype.
  Var x = Var::param(Tensor::randn({2, 3, 4, 4}, dev(), 5, dt()));
  Var g = Var::param(Tensor::ones({3}, DType::float32, dev()));
  Var y = channel_broadcast(NormRelu{}, x, g, Tensor::zeros({3}, DType::float32, dev()),
                            Tensor::zeros({3}, DType::float32, dev()));
  ASSERT_EQ(y.dtype(), DType::float32);
  sum(y).backward();
  EXPECT_EQ(x.grad().dtype(), dt());
  EXPECT_EQ(g.grad().dtype(), DType::float32);
}

INSTANTIATE_TEST_SUITE_P(Devices, HalfBroadcastTest,
                         ::testing::Combine(::testing::ValuesIn(all_devices()),
                                            ::testing::Values(DType::bfloat16, DType::float16)),
                         device_dtype_name);
