// test_zero_size.cu: size-0 tensors are ordinary tensors on the tape. For every op (elementwise,
// mixed-mode broadcast, matmul, shape ops, reductions, losses) applied to inputs with a zero-size
// dimension, on every device and in float32 and float64: the result keeps requires-grad, backward
// runs, every input gets a gradient of its own shape (empty for an empty input, zeros for a
// non-empty input whose every use was empty), and gradients match finite differences where there
// is anything to differentiate. The values follow PyTorch: the sum of nothing is 0, the mean of
// nothing is NaN, and the maximum over an empty dimension is an error.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "dualcast/broadcast.hpp"
#include "dualcast/error.hpp"
#include "dualcast/gradcheck.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "dualcast/ops/linalg.hpp"
#include "dualcast/ops/loss.hpp"
#include "dualcast/ops/reduce.hpp"
#include "dualcast/ops/shape.hpp"
#include "dualcast/tape.hpp"
#include "test_util.hpp"

namespace dualcast {

// The issue's example, and functors of two Vars with one and two outputs (namespace scope: they
// run on the GPU too).
struct ZeroSizeAffine {
  DUALCAST_HD auto operator()(auto x) const {
    using T = scalar_t<decltype(x)>;
    if (x > T(0)) return x * T(2) + T(1);
    return x * x;
  }
};
struct ZeroSizeProduct {
  DUALCAST_HD auto operator()(auto a, auto b) const { return tanh(a) * b + a; }
};
struct ZeroSizeTwoOutputs {
  DUALCAST_HD auto operator()(auto a, auto b) const {
    using D = decltype(a * b);
    return std::tuple<D, D>(a * b, a - b);
  }
};
struct ZeroSizeWithConstant {
  DUALCAST_HD auto operator()(auto flag, auto a) const { return flag == 1 ? a * a : -a; }
};

/// The same broadcast written as a DUALCAST_HD lambda over duals (a public named function, as
/// nvcc requires of an extended lambda's enclosing function).
Var zero_size_lambda_f(const Var& a, const Var& b) {
  using D = Dual<float, 2>;
  return broadcast([] DUALCAST_HD(D x, D y) { return x * y + sin(x); }, a, b);
}
Var zero_size_lambda_d(const Var& a, const Var& b) {
  using D = Dual<double, 2>;
  return broadcast([] DUALCAST_HD(D x, D y) { return x * y + sin(x); }, a, b);
}

namespace {

using Fn = std::function<std::vector<Var>(const std::vector<Var>&)>;

struct ZeroCase {
  std::string name;
  std::vector<Shape> inputs;
  Fn fn;
  bool nan_result = false;  ///< a mean over nothing: NaN values (no finite differences to compare)
};

std::vector<Var> one(Var v) { return {std::move(v)}; }

std::vector<ZeroCase> zero_size_cases() {
  std::vector<ZeroCase> c;
  const Shape e03{0, 3}, e13{1, 3}, e01{0, 1}, e43{4, 3};
  // ---- elementwise ops (the reverse-mode baseline: one broadcast node per op) -------------------
  c.push_back({"a + b", {e03, e03}, [](auto& v) { return one(v[0] + v[1]); }});
  c.push_back({"a - 1", {e03}, [](auto& v) { return one(v[0] - 1.0); }});
  c.push_back({"2 / a", {e03}, [](auto& v) { return one(2.0 / v[0]); }});
  c.push_back({"[1,3] * [0,3]", {e13, e03}, [](auto& v) { return one(v[0] * v[1]); }});
  c.push_back({"[0,1] / [1,3]", {e01, e13}, [](auto& v) { return one(v[0] / v[1]); }});
  c.push_back({"-a", {e03}, [](auto& v) { return one(-v[0]); }});
  using Unary = Var (*)(const Var&);
  const std::vector<std::pair<const char*, Unary>> unary = {
      {"exp", &exp},   {"expm1", &expm1}, {"log", &log},       {"log1p", &log1p},
      {"sqrt", &sqrt}, {"cbrt", &cbrt},   {"sin", &sin},       {"cos", &cos},
      {"tan", &tan},   {"tanh", &tanh},   {"sigmoid", &sigmoid}, {"softplus", &softplus},
      {"erf", &erf},   {"abs", &abs},     {"relu", &relu}};
  for (const auto& [name, f] : unary)
    c.push_back({name, {e03}, [f = f](auto& v) { return one(f(v[0])); }});
  c.push_back({"pow(a, 2)", {e03}, [](auto& v) { return one(pow(v[0], 2.0)); }});
  c.push_back({"pow(a, b)", {e03, e13}, [](auto& v) { return one(pow(v[0], v[1])); }});
  c.push_back({"min(a, b)", {e03, e03}, [](auto& v) { return one(min(v[0], v[1])); }});
  c.push_back({"max(a, 0.5)", {e03}, [](auto& v) { return one(max(v[0], 0.5)); }});
  c.push_back({"hypot", {e03, e01}, [](auto& v) { return one(hypot(v[0], v[1])); }});
  c.push_back({"fma", {e03, e13, e01}, [](auto& v) { return one(fma(v[0], v[1], v[2])); }});
  c.push_back({"clamp", {e03}, [](auto& v) { return one(clamp(v[0], -0.5, 0.5)); }});
  c.push_back({"select", {e03, e13}, [](auto& v) {
                 const Tensor mask = Tensor::zeros(Shape{0, 3}, DType::uint8, v[0].device());
                 return one(select(mask, v[0], v[1]));
               }});
  // ---- mixed-mode broadcast ----------------------------------------------------------------------
  c.push_back({"broadcast(f, a)", {e03}, [](auto& v) { return one(broadcast(ZeroSizeAffine{}, v[0])); }});
  for (const Partials p : {Partials::store, Partials::recompute}) {
    const std::string pn = partials_name(p);
    c.push_back({"broadcast " + pn + " [1,3] x [0,3]", {e13, e03},
                 [p](auto& v) { return one(broadcast(p, ZeroSizeProduct{}, v[0], v[1])); }});
    c.push_back({"broadcast " + pn + " [0,1] x [1,3]", {e01, e13},
                 [p](auto& v) { return one(broadcast(p, ZeroSizeProduct{}, v[0], v[1])); }});
    c.push_back({"broadcast " + pn + " two outputs", {e03, e13}, [p](auto& v) {
                   auto [s, d] = broadcast(p, ZeroSizeTwoOutputs{}, v[0], v[1]);
                   return std::vector<Var>{s, d};
                 }});
  }
  c.push_back({"broadcast with an empty Tensor constant", {e13}, [](auto& v) {
                 const Tensor flag = Tensor::ones(Shape{0, 1}, v[0].dtype(), v[0].device());
                 return one(broadcast(ZeroSizeWithConstant{}, flag, v[0]));
               }});
  c.push_back({"broadcast HD lambda", {e03, e03}, [](auto& v) {
                 return one(v[0].dtype() == DType::float32 ? zero_size_lambda_f(v[0], v[1])
                                                           : zero_size_lambda_d(v[0], v[1]));
               }});
  // ---- matmul (m, n or k zero; batched; shared operands; transposes) ---------------------------
  c.push_back({"matmul m=0", {Shape{0, 3}, Shape{3, 4}}, [](auto& v) { return one(matmul(v[0], v[1])); }});
  c.push_back({"matmul n=0", {Shape{2, 3}, Shape{3, 0}}, [](auto& v) { return one(matmul(v[0], v[1])); }});
  c.push_back({"matmul k=0", {Shape{2, 0}, Shape{0, 4}}, [](auto& v) { return one(matmul(v[0], v[1])); }});
  c.push_back({"matmul k=0 trans_a trans_b", {Shape{0, 2}, Shape{4, 0}},
               [](auto& v) { return one(matmul(v[0], v[1], true, true)); }});
  c.push_back({"matmul batch=0", {Shape{0, 2, 3}, Shape{0, 3, 4}},
               [](auto& v) { return one(matmul(v[0], v[1])); }});
  c.push_back({"matmul [2,0,3] x shared [3,4]", {Shape{2, 0, 3}, Shape{3, 4}},
               [](auto& v) { return one(matmul(v[0], v[1])); }});
  c.push_back({"matmul shared [3,0] x [2,0,4] (k=0)", {Shape{3, 0}, Shape{2, 0, 4}},
               [](auto& v) { return one(matmul(v[0], v[1])); }});
  c.push_back({"matmul [2,0,3] trans_a x shared [0,4] (k=0)", {Shape{2, 0, 3}, Shape{0, 4}},
               [](auto& v) { return one(matmul(v[0], v[1], true, false)); }});
  // ---- shape ops ---------------------------------------------------------------------------------
  c.push_back({"reshape [0,3] -> [3,0]", {e03}, [](auto& v) { return one(reshape(v[0], {3, 0})); }});
  c.push_back({"reshape [0,3] -> [-1,1,3]", {e03}, [](auto& v) { return one(reshape(v[0], {-1, 1, 3})); }});
  c.push_back({"transpose", {e03}, [](auto& v) { return one(transpose(v[0])); }});
  c.push_back({"permute", {Shape{2, 0, 3}}, [](auto& v) { return one(permute(v[0], {2, 0, 1})); }});
  c.push_back({"empty slice of [4,3]", {e43}, [](auto& v) { return one(slice(v[0], 0, 2, 2)); }});
  c.push_back({"slice of [0,3]", {e03}, [](auto& v) { return one(slice(v[0], 1, 0, 2)); }});
  c.push_back({"concat [0,3] + [2,3]", {e03, Shape{2, 3}}, [](auto& v) { return one(concat({v[0], v[1]}, 0)); }});
  c.push_back({"concat [2,0] + [2,3] axis 1", {Shape{2, 0}, Shape{2, 3}},
               [](auto& v) { return one(concat({v[0], v[1]}, 1)); }});
  c.push_back({"concat of empties", {e03, e03}, [](auto& v) { return one(concat({v[0], v[1]}, 0)); }});
  c.push_back({"split [4,3] into {0, 4}", {e43}, [](auto& v) { return split(v[0], 0, {0, 4}); }});
  c.push_back({"split [0,3] into {1, 2} axis 1", {e03}, [](auto& v) { return split(v[0], 1, {1, 2}); }});
  c.push_back({"broadcast_to [0,1] -> [0,3]", {e01}, [](auto& v) { return one(broadcast_to(v[0], Shape{0, 3})); }});
  c.push_back({"broadcast_to [1,3] -> [0,3]", {e13}, [](auto& v) { return one(broadcast_to(v[0], Shape{0, 3})); }});
  c.push_back({"broadcast_to [3] -> [0,3]", {Shape{3}}, [](auto& v) { return one(broadcast_to(v[0], Shape{0, 3})); }});
  c.push_back({"sum_to [0,3] -> [1,3]", {e03}, [](auto& v) { return one(sum_to(v[0], Shape{1, 3})); }});
  c.push_back({"sum_to [0,3] -> [3]", {e03}, [](auto& v) { return one(sum_to(v[0], Shape{3})); }});
  // ---- reductions (sum of nothing = 0; mean of nothing = NaN) ----------------------------------
  c.push_back({"sum", {e03}, [](auto& v) { return one(sum(v[0])); }});
  c.push_back({"sum over the empty axis", {e03}, [](auto& v) { return one(sum(v[0], 0)); }});
  c.push_back({"sum over axis 1 keepdims", {e03}, [](auto& v) { return one(sum(v[0], 1, true)); }});
  c.push_back({"mean over axis 1", {e03}, [](auto& v) { return one(mean(v[0], 1)); }});
  c.push_back({"mean", {e03}, [](auto& v) { return one(mean(v[0])); }, true});
  c.push_back({"mean over the empty axis", {e03}, [](auto& v) { return one(mean(v[0], 0)); }, true});
  c.push_back({"amax over a non-empty axis", {e03}, [](auto& v) { return one(amax(v[0], 1)); }});
  // ---- losses ------------------------------------------------------------------------------------
  c.push_back({"softmax of no rows", {e03}, [](auto& v) { return one(softmax(v[0])); }});
  c.push_back({"softmax along the empty axis", {e03}, [](auto& v) { return one(softmax(v[0], 0)); }});
  c.push_back({"log_softmax of empty rows", {Shape{2, 0}}, [](auto& v) { return one(log_softmax(v[0])); }});
  c.push_back({"cross_entropy of no rows", {Shape{0, 5}}, [](auto& v) {
                 return one(cross_entropy(v[0], Tensor::zeros(Shape{0}, DType::float32, v[0].device())));
               }, true});
  c.push_back({"mse of nothing", {e03, e03}, [](auto& v) { return one(mse(v[0], v[1])); }, true});
  return c;
}

class ZeroSize : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override { DUALCAST_SKIP_IF_UNAVAILABLE(GetParam()); }
};

/// Sum of sums of the outputs: one scalar to differentiate.
Var total(const std::vector<Var>& outs) {
  Var acc = sum(outs[0]);
  for (std::size_t i = 1; i < outs.size(); ++i) acc = acc + sum(outs[i]);
  return acc;
}

TEST_P(ZeroSize, EveryOpKeepsRequiresGradAndGivesGradientsOfTheInputsShapes) {
  const Device dev = GetParam();
  std::uint64_t seed = 1;
  for (const ZeroCase& zc : zero_size_cases()) {
    for (const DType dt : {DType::float32, DType::float64}) {
      const std::string what = zc.name + " " + dtype_name(dt);
      SCOPED_TRACE(what);
      std::vector<Var> params;
      for (const Shape& s : zc.inputs)
        params.push_back(Var::param(Tensor::uniform(s, dev, seed++, 0.5, 1.5, dt)));
      std::vector<Var> outs;
      try {
        outs = zc.fn(params);
      } catch (const Error& e) {
        ADD_FAILURE() << what << ": forward threw " << e.what();
        continue;
      }
      bool all_outputs_empty = true;
      for (const Var& o : outs) {
        EXPECT_TRUE(o.requires_grad()) << what << ": output " << o.shape().str() << " lost requires_grad";
        all_outputs_empty = all_outputs_empty && o.numel() == 0;
      }
      try {
        total(outs).backward();
      } catch (const Error& e) {
        ADD_FAILURE() << what << ": backward threw " << e.what();
        continue;
      }
      for (std::size_t k = 0; k < params.size(); ++k) {
        ASSERT_TRUE(params[k].has_grad()) << what << ": input " << k << " has no gradient";
        const Tensor g = params[k].grad();
        EXPECT_EQ(g.shape(), params[k].shape()) << what << ": input " << k;
        EXPECT_EQ(g.dtype(), dt) << what;
        EXPECT_EQ(g.device(), dev) << what;
        if (all_outputs_empty)
          for (double v : g.to_vector<double>()) EXPECT_EQ(v, 0.0) << what << ": input " << k;
      }
    }
  }
}

TEST_P(ZeroSize, GradientsMatchFiniteDifferencesWhereAnythingIsDifferentiated) {
  const Device dev = GetParam();
  std::uint64_t seed = 1000;
  for (const ZeroCase& zc : zero_size_cases()) {
    if (zc.nan_result) continue;
    std::vector<Tensor> inputs;
    for (const Shape& s : zc.inputs) inputs.push_back(Tensor::uniform(s, dev, seed++, 0.5, 1.5, DType::float64));
    const GradCheckResult r =
        check_gradients([&](const std::vector<Var>& v) { return total(zc.fn(v)); }, inputs);
    EXPECT_TRUE(r.ok) << zc.name << ": " << r.message;
  }
}

TEST_P(ZeroSize, EmptyReductionsFollowPyTorch) {
  const Device dev = GetParam();
  const Var x = Var::param(Tensor::zeros({0, 3}, DType::float32, dev));
  EXPECT_EQ(sum(x).item(), 0.0);
  EXPECT_EQ(sum(x, 0).value().to_vector<double>(), std::vector<double>(3, 0.0));
  EXPECT_TRUE(std::isnan(mean(x).item()));
  for (double v : mean(x, 0).value().to_vector<double>()) EXPECT_TRUE(std::isnan(v));
  EXPECT_EQ(amax(x, 1).shape(), Shape{0});
  EXPECT_EQ(matmul(Var::param(Tensor::ones({2, 0}, DType::float32, dev)),
                   Var::param(Tensor::ones({0, 4}, DType::float32, dev)))
                .value()
                .to_vector<double>(),
            std::vector<double>(8, 0.0));
  for (const auto& bad : std::vector<std::function<Var()>>{[&] { return amax(x); },
                                                           [&] { return amax(x, 0); }}) {
    try {
      (void)bad();
      ADD_FAILURE() << "amax over an empty dimension did not throw";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("amax"), std::string::npos) << msg;
      EXPECT_NE(msg.find("[0, 3]"), std::string::npos) << msg;
    }
  }
  // The tape is unharmed: a gradient through the same empty parameter still works.
  sum(x * 2.0).backward();
  EXPECT_EQ(x.grad().shape(), (Shape{0, 3}));
}

TEST_P(ZeroSize, TheIssuesExampleGivesAnEmptyGradient) {
  const Device dev = GetParam();
  const Var a = Var::param(Tensor::zeros({0, 3}, DType::float32, dev));
  const Var y = broadcast(ZeroSizeAffine{}, a);
  EXPECT_TRUE(y.requires_grad());
  sum(y).backward();
  EXPECT_EQ(a.grad().shape(), (Shape{0, 3}));
  EXPECT_EQ(a.grad().numel(), 0);
}

INSTANTIATE_TEST_SUITE_P(Devices, ZeroSize, ::testing::ValuesIn(testing::all_devices()),
                         [](const auto& info) { return std::string(testing::device_label(info.param)); });

}  // namespace
}  // namespace dualcast
