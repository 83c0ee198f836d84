// test_conv_nhwc.cu: conv2d with the channels last (ConvLayout::nhwc). On every geometry of
// test_conv.cu and every backend it equals the NCHW convolution of the permuted operands (values,
// input and weight gradients; cuDNN runs it on NHWC descriptors, the rest between permutes); its
// gradients match finite differences; its bias is added along the last dimension; an input gradient
// is added in place to an existing one; a 16-bit and an Autocast convolution keep the layout; bad
// input names the layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "dualcast/gradcheck.hpp"
#include "dualcast/ops/conv.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "dualcast/ops/shape.hpp"
#include "dualcast/precision.hpp"
#include "nn_reference.hpp"
#include "test_util.hpp"

using namespace dualcast;
using dualcast::testing::expect_close;
using dualcast::testing::expect_close_to_scale;
using dualcast::testing::expect_error;

namespace {

/// A 16-bit NHWC convolution against the NCHW one on the same 16-bit operands: both accumulate in
/// float32 and round once, but in different orders (other kernels, possibly other algorithms), so an
/// element may land a bf16 step away: 2^-8 of its size, at most 2^-7 of the largest element's.
/// Judged against the largest element, with room for two steps.
constexpr double kHalfLayoutTol = 1.0 / 64;

/// max |got - want| / max |want|.
void expect_close_to_largest(const std::vector<double>& got, const std::vector<double>& want, double tol,
                             const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double largest = 0, worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    largest = std::max(largest, std::fabs(want[i]));
    worst = std::max(worst, std::fabs(got[i] - want[i]));
  }
  EXPECT_LE(worst, tol * largest) << what << ": worst difference " << worst << ", largest element " << largest;
}

const std::vector<int> kToNhwc{0, 2, 3, 1};
const std::vector<int> kToNchw{0, 3, 1, 2};

struct NhwcCase {
  const char* name;
  Shape x, w;  // NCHW and OIHW, permuted for the nhwc call
  Conv2dOptions o;
};

std::vector<NhwcCase> cases() {
  return {
      {"plain3x3", {2, 3, 7, 6}, {4, 3, 3, 3}, {}},
      {"stride2_pad1", {2, 8, 9, 7}, {16, 8, 3, 3}, {.stride = 2, .padding = 1}},
      {"asymmetric", {1, 2, 8, 5}, {3, 2, 3, 2}, {.stride = {2, 1}, .padding = {1, 0}}},
      {"dilation2", {2, 2, 9, 9}, {3, 2, 3, 3}, {.padding = 2, .dilation = 2}},
      {"groups2", {2, 4, 6, 5}, {6, 2, 3, 3}, {.padding = 1, .groups = 2}},
      {"depthwise", {2, 8, 7, 7}, {8, 1, 3, 3}, {.stride = 2, .padding = 1, .groups = 8}},
      {"pointwise_stride2", {3, 16, 5, 5}, {32, 16, 1, 1}, {.stride = 2}},
      {"one_channel_stem", {4, 1, 12, 12}, {8, 1, 3, 3}, {.padding = 1}},
  };
}

Conv2dOptions nhwc(Conv2dOptions o) {
  o.layout = ConvLayout::nhwc;
  return o;
}

class ConvNhwc : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override { DUALCAST_SKIP_IF_UNAVAILABLE(GetParam()); }
  void TearDown() override { set_conv_backend(ConvBackend::automatic); }
};

std::vector<ConvBackend> backends_of(Device d) {
  if (d.is_cpu()) return {ConvBackend::automatic};
  std::vector<ConvBackend> b{ConvBackend::gemm};
  if (cudnn_available()) b.push_back(ConvBackend::cudnn);
  return b;
}
const char* label(ConvBackend b) { return b == ConvBackend::gemm ? "gemm" : (b == ConvBackend::cudnn ? "cudnn" : "auto"); }

/// y, dx and dw of one convolution with output gradient r, all in the layout of the call.
struct Pass {
  Tensor y, dx, dw;
};
Pass run(const Tensor& x, const Tensor& w, const Tensor& r, const Conv2dOptions& o) {
  Var xv = Var::param(x), wv = Var::param(w);
  const Var y = conv2d(xv, wv, o);
  y.backward(r);
  return {y.value(), xv.grad(), wv.grad()};
}

TEST_P(ConvNhwc, EqualsThePermutedNchwConvolutionOnEveryGeometryAndBackend) {
  const Device dev = GetParam();
  std::uint64_t seed = 40;
  for (const ConvBackend backend : backends_of(dev)) {
    set_conv_backend(backend);
    for (const auto& c : cases()) {
      std::vector<DType> dtypes{DType::float64, DType::float32};
      if (dev.is_cuda()) dtypes.push_back(DType::bfloat16);
      for (const DType dt : dtypes) {
        const Tensor x = Tensor::randn(c.x, dev, ++seed).to(dt);
        const Tensor w = Tensor::randn(c.w, dev, ++seed).to(dt);
        const Tensor r = Tensor::randn(conv2d_output_shape(c.x, c.w, c.o), dev, ++seed).to(dt);
        const Pass want = run(x, w, r, c.o);
        const Pass got = run(permute(x, kToNhwc), permute(w, kToNhwc), permute(r, kToNhwc), nhwc(c.o));
        const std::string what = std::string(c.name) + " " + dtype_name(dt) + " " + label(backend);
        ASSERT_EQ(got.y.shape(), conv2d_output_shape(permute(x, kToNhwc).shape(), permute(w, kToNhwc).shape(),
                                                     nhwc(c.o)))
            << what;
        ASSERT_EQ(got.dx.shape(), permute(x, kToNhwc).shape()) << what;
        ASSERT_EQ(got.dw.shape(), permute(w, kToNhwc).shape()) << what;
        ASSERT_EQ(got.y.dtype(), dt) << what;
        const Tensor y = permute(got.y, kToNchw), dx = permute(got.dx, kToNchw), dw = permute(got.dw, kToNchw);
        if (dt == DType::bfloat16) {
          expect_close_to_largest(y.to_vector<double>(), want.y.to_vector<double>(), kHalfLayoutTol, what + " y");
          expect_close_to_largest(dx.to_vector<double>(), want.dx.to_vector<double>(), kHalfLayoutTol, what + " dx");
          expect_close_to_largest(dw.to_vector<double>(), want.dw.to_vector<double>(), kHalfLayoutTol, what + " dw");
        } else {
          const double tol = dt == DType::float32 ? kSameResultTolFloat : 1e-12;
          expect_close(y, want.y, tol, what + " y");
          expect_close(dx, want.dx, tol, what + " dx");
          expect_close(dw, want.dw, tol, what + " dw");
        }
      }
    }
  }
}

struct NhwcConvOf {
  Conv2dOptions o;
  Var operator()(const std::vector<Var>& v) const { return conv2d(v[0], v[1], o); }
};

TEST_P(ConvNhwc, GradientsMatchFiniteDifferences) {
  const Device dev = GetParam();
  std::uint64_t seed = 140;
  for (const ConvBackend backend : backends_of(dev)) {
    set_conv_backend(backend);
    for (const auto& c : cases()) {
      const Tensor x = permute(Tensor::randn(c.x, dev, ++seed, DType::float64), kToNhwc);
      const Tensor w = permute(Tensor::randn(c.w, dev, ++seed, DType::float64), kToNhwc);
      const GradCheckResult r = check_gradients(NhwcConvOf{nhwc(c.o)}, {x, w});
      EXPECT_TRUE(r.ok) << c.name << " " << label(backend) << ": " << r.message;
    }
  }
}

struct NhwcBiasOf {
  Var operator()(const std::vector<Var>& v) const {
    return conv2d(v[0], v[1], v[2], {.stride = 2, .padding = 1, .layout = ConvLayout::nhwc});
  }
};

TEST_P(ConvNhwc, BiasIsAddedAlongTheLastDimension) {
  const Device dev = GetParam();
  const Tensor x = Tensor::randn({2, 6, 5, 3}, dev, 1, DType::float64);
  const Tensor w = Tensor::randn({4, 3, 3, 3}, dev, 2, DType::float64);
  const Tensor b = Tensor::randn({4}, dev, 3, DType::float64);
  const Conv2dOptions o{.stride = 2, .padding = 1, .layout = ConvLayout::nhwc};
  const Var y = conv2d(Var(x), Var(w), Var(b), o);
  const Tensor plain = conv2d(x, w, o);
  const std::vector<double> got = y.value().to_vector<double>(), base = plain.to_vector<double>();
  const std::vector<double> bv = b.to_vector<double>();
  std::vector<double> want(base.size());
  for (std::size_t i = 0; i < base.size(); ++i) want[i] = base[i] + bv[i % 4];
  expect_close(got, want, 1e-12, "nhwc conv2d + bias");
  const GradCheckResult r = check_gradients(NhwcBiasOf{}, {x, w, b});
  EXPECT_TRUE(r.ok) << r.message;
}

/// conv2d(x, w) + x in nhwc: the convolution's input gradient is added in place to the add's.
struct NhwcResidualOf {
  Var operator()(const std::vector<Var>& v) const {
    return conv2d(v[0], v[1], {.padding = 1, .layout = ConvLayout::nhwc}) + v[0];
  }
};

TEST_P(ConvNhwc, InputGradientIsAddedInPlaceToAnExistingOne) {
  const Device dev = GetParam();
  for (const ConvBackend backend : backends_of(dev)) {
    set_conv_backend(backend);
    const Tensor x = Tensor::randn({2, 5, 4, 3}, dev, 7, DType::float64);
    const Tensor w = Tensor::randn({3, 3, 3, 3}, dev, 8, DType::float64);
    const GradCheckResult r = check_gradients(NhwcResidualOf{}, {x, w});
    EXPECT_TRUE(r.ok) << label(backend) << ": " << r.message;
    // float32 on cuDNN takes the NHWC kernels (float64 runs between permutes).
    const Tensor xf = Tensor::randn({2, 5, 4, 8}, dev, 9), wf = Tensor::randn({8, 3, 3, 8}, dev, 10);
    Var a = Var::param(xf), b = Var::param(permute(xf, kToNchw));
    (conv2d(a, Var(wf), {.padding = 1, .layout = ConvLayout::nhwc}) + a).backward(Tensor::ones(Shape{2, 5, 4, 8}, DType::float32, dev));
    (conv2d(b, Var(permute(wf, kToNchw)), {.padding = 1}) + b).backward(Tensor::ones(Shape{2, 8, 5, 4}, DType::float32, dev));
    expect_close(permute(a.grad(), kToNchw), b.grad(), kSameResultTolFloat, std::string("float32 ") + label(backend));
  }
}

TEST_P(ConvNhwc, AutocastConvolvesInSixteenBitsAndKeepsTheLayout) {
  const Device dev = GetParam();
  const Tensor x = Tensor::randn({2, 6, 6, 8}, dev, 11), w = Tensor::randn({16, 3, 3, 8}, dev, 12);
  Var xv = Var::param(x), wv = Var::param(w);
  const Conv2dOptions o{.padding = 1, .layout = ConvLayout::nhwc};
  const Var y = [&] {
    const Autocast autocast(DType::bfloat16);
    return conv2d(xv, wv, o);
  }();
  EXPECT_EQ(y.dtype(), DType::bfloat16);
  EXPECT_EQ(y.shape(), (Shape{2, 6, 6, 16}));
  y.backward(Tensor::ones(y.shape(), DType::bfloat16, dev));
  EXPECT_EQ(xv.grad().dtype(), DType::float32);  // the float32 operand's gradient comes back float32
  EXPECT_EQ(wv.grad().shape(), w.shape());
  const Tensor want = conv2d(x.to(DType::bfloat16), w.to(DType::bfloat16), o);
  expect_close_to_scale(y.value().to_vector<double>(), want.to_vector<double>(), 0.0, "same 16-bit call");
}

TEST_P(ConvNhwc, CudnnRunsResNetShapesInNhwcItself) {
  // The point of the layout: cuDNN's own NHWC kernels, not the permuted NCHW convolution. A ResNet
  // stage's shape in bf16 and float32 (TF32 allowed at "high") must be chosen in NHWC in every
  // direction, and no "nhwc:NONE" fallback recorded for it.
  const Device dev = GetParam();
  if (dev.is_cpu() || !cudnn_available()) GTEST_SKIP() << "needs cuDNN on a CUDA device";
  set_conv_backend(ConvBackend::cudnn);
  struct High {  // TF32 for the float32 case, "highest" again afterwards
    High() { set_float32_matmul_precision("high"); }
    ~High() { set_float32_matmul_precision("highest"); }
  } high;
  for (const DType dt : {DType::bfloat16, DType::float32}) {
    Var x = Var::param(Tensor::randn({8, 14, 14, 64}, dev, 31).to(dt));
    Var w = Var::param(Tensor::randn({64, 3, 3, 64}, dev, 32).to(dt));
    conv2d(x, w, {.padding = 1, .layout = ConvLayout::nhwc}).backward(Tensor::ones(Shape{8, 14, 14, 64}, dt, dev));
  }
  // Each plan chooses once per process, so the whole list holds these choices also on a repeat.
  int nhwc = 0;
  for (const std::string& c : conv_algorithms_chosen()) {
    if (c.find("x [8, 14, 14, 64], O 64, 3x3") == std::string::npos) continue;
    EXPECT_EQ(c.find("nhwc:NONE"), std::string::npos) << c;
    if (c.find(", nhwc, ") != std::string::npos) ++nhwc;
  }
  EXPECT_EQ(nhwc, 6) << "three directions in each of two dtypes chosen in NHWC";
}

TEST_P(ConvNhwc, BadInputNamesTheLayoutAndConvStillWorks) {
  const Device dev = GetParam();
  const Conv2dOptions o{.padding = 1, .layout = ConvLayout::nhwc};
  const Tensor x = Tensor::randn({2, 6, 6, 4}, dev, 1);
  const Tensor w = Tensor::randn({3, 3, 3, 4}, dev, 2);
  // An NCHW weight given to an nhwc call: its last dimension is not the channels.
  expect_error([&] { (void)conv2d(x, Tensor::randn({3, 4, 3, 3}, dev, 3), o); },
               {"conv2d", "channel mismatch", "C = 4", "[3, 4, 3, 3]", "layout nhwc"}, "nchw weight in nhwc");
  expect_error([&] { (void)conv2d(Tensor::randn({6, 6, 4}, dev, 3), w, o); }, {"conv2d", "[N, H, W, C]", "[6, 6, 4]"},
               "3-D input");
  expect_error([&] { (void)conv2d(x, Tensor::randn({3, 3, 4}, dev, 3), o); }, {"conv2d", "[O, KH, KW, C/groups]"},
               "3-D weight");
  expect_error([&] { (void)conv2d(Var(x), Var(w), Var(Tensor::randn({4}, dev, 3)), o); },
               {"conv2d", "bias", "[4]", "O = 3"}, "bias size");
  const Tensor y = conv2d(x, w, o);
  expect_close(permute(y, kToNchw), conv2d(permute(x, kToNchw), permute(w, kToNchw), Conv2dOptions{.padding = 1}),
               kSameResultTolFloat, "after errors");
}

INSTANTIATE_TEST_SUITE_P(Devices, ConvNhwc, ::testing::ValuesIn(dualcast::testing::all_devices()),
                         [](const ::testing::TestParamInfo<Device>& info) {
                           return std::string(dualcast::testing::device_label(info.param));
                         });

}  // namespace
