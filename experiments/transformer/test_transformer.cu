// test_transformer.cu: the MultiHeadAttention module and the transformer of model.hpp. The module's
// gradients (input and all four parameters) against finite differences in double, for each
// attention implementation on each device; the whole model's parameter gradients against finite
// differences in double; the mixed-mode fusions (bias + gelu, residual + bias) equal to plain ops;
// fused attention equal to composed in the whole model (float32 and float64); GPU equal to CPU; a
// short training run whose bits/char fall; the validation directory the PyTorch peer reads.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "common/json.hpp"
#include "dualcast/gradcheck.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "dualcast/ops/reduce.hpp"
#include "model.hpp"
#include "test_util.hpp"
#include "train.hpp"

namespace transformer {
namespace {

using namespace dualcast;

bool have_corpus() { return std::filesystem::is_directory("/usr/share/common-licenses"); }

class Transformer_ : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override { DUALCAST_SKIP_IF_UNAVAILABLE(GetParam()); }
  Device dev() const { return GetParam(); }
  std::vector<AttentionImpl> impls() const {
    if (dev().is_cpu()) return {AttentionImpl::composed};
    return {AttentionImpl::composed, AttentionImpl::fused};
  }
};

TEST_P(Transformer_, MultiHeadAttentionGradientsMatchFiniteDifferences) {
  for (AttentionImpl impl : impls())
    for (bool causal : {false, true}) {
      MultiHeadAttention mha(12, 3, DType::float64, dev(), 5);
      AttentionOptions o;
      o.causal = causal;
      o.impl = impl;
      const Tensor x = Tensor::randn({2, 7, 12}, dev(), 9, DType::float64);
      // Non-zero biases, so that their paths are exercised too.
      const Tensor bqkv = Tensor::randn({36}, dev(), 10, DType::float64) * 0.1;
      const Tensor bo = Tensor::randn({12}, dev(), 11, DType::float64) * 0.1;
      const GradCheckResult r = check_gradients(
          [&](const std::vector<Var>& v) {
            MultiHeadAttention m = mha;
            m.Wqkv = v[1];
            m.bqkv = v[2];
            m.Wo = v[3];
            m.bo = v[4];
            return m.forward(v[0], o);
          },
          {x, mha.Wqkv.value() * 10.0, bqkv, mha.Wo.value() * 10.0, bo});
      EXPECT_TRUE(r.ok) << attention_impl_name(impl) << (causal ? " causal" : "") << ": " << r.message;
    }
}

TEST_P(Transformer_, MultiHeadAttentionRejectsAWrongWidth) {
  MultiHeadAttention mha(8, 2, DType::float32, dev(), 1);
  EXPECT_THROW((void)mha.forward(Var(Tensor::randn({1, 3, 6}, dev(), 2)), AttentionOptions{}), Error);
  EXPECT_THROW(MultiHeadAttention(10, 3, DType::float32, dev(), 1), Error);
}

TransformerConfig tiny(Device dev, DType dt, AttentionImpl impl = AttentionImpl::automatic) {
  TransformerConfig c;
  c.layers = 2;
  c.heads = 2;
  c.width = 8;
  c.context = 6;
  c.vocab = 64;
  c.mlp_ratio = 2;
  c.dtype = dt;
  c.device = dev;
  c.seed = 3;
  c.attention = impl;
  return c;
}

/// Random ids [T+1, B] in [0, 64).
Tensor tokens(int T, int B, std::uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>((T + 1) * B));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::floor(static_cast<float>(random::uniform(seed, i)) * 63.999f);
  return Tensor::from_vector({T + 1, B}, v);
}

TEST_P(Transformer_, ParameterGradientsMatchFiniteDifferences) {
  for (AttentionImpl impl : impls()) {
    Transformer model(tiny(dev(), DType::float64, impl));
    // Larger weights than the initialisation, so that every path carries a visible gradient.
    for (Var& p : model.params()) {
      Tensor t = p.value();
      t.copy_(t + Tensor::randn(t.shape(), dev(), 77 + static_cast<std::uint64_t>(t.numel()), DType::float64) * 0.3);
    }
    const Tensor tok = tokens(5, 3, 4);
    Var loss = model.loss(tok);
    loss.backward();
    double worst = 0.0;
    std::string where;
    for (std::size_t i = 0; i < model.params().size(); ++i) {
      Tensor value = model.params()[i].value();
      const std::vector<double> g = model.params()[i].grad().to_vector<double>();
      std::vector<double> base = value.to_vector<double>();
      const std::size_t samples = static_cast<std::size_t>(dualcast::testing::unless_sanitizing(5, 1));
      for (std::size_t j = 0; j < base.size(); j += std::max<std::size_t>(1, base.size() / samples)) {
        const auto eval = [&](double x) {
          std::vector<double> w = base;
          w[j] = x;
          value.copy_(Tensor::from_vector(value.shape(), w, dev()));
          NoGradGuard no_grad;
          return model.loss(tok).item();
        };
        const double fd = central_difference(eval, base[j]);
        value.copy_(Tensor::from_vector(value.shape(), base, dev()));
        const double e = relative_error(g[j], fd);
        if (e > worst) {
          worst = e;
          where = model.param_names()[i] + "[" + std::to_string(j) + "]";
        }
      }
    }
    EXPECT_LE(worst, kGradTolDouble) << attention_impl_name(impl) << ": worst at " << where;
  }
}

TEST_P(Transformer_, MixedModeFusionsEqualPlainOps) {
  for (DType dt : {DType::float64, DType::float32}) {
    TransformerConfig c = tiny(dev(), dt);
    Transformer fused(c);
    c.fuse_elementwise = false;
    Transformer plain(c);
    const Tensor tok = tokens(6, 4, 8);
    Var a = fused.loss(tok), b = plain.loss(tok);
    a.backward();
    b.backward();
    const double tol = dt == DType::float64 ? 1e-12 : kSameResultTolFloat;
    EXPECT_LE(relative_error(a.item(), b.item()), tol);
    for (std::size_t i = 0; i < fused.params().size(); ++i) {
      const auto ga = fused.params()[i].grad().to_vector<double>(), gb = plain.params()[i].grad().to_vector<double>();
      double d = 0.0, s = 1e-30;
      for (std::size_t j = 0; j < ga.size(); ++j) {
        d = std::max(d, std::fabs(ga[j] - gb[j]));
        s = std::max(s, std::fabs(gb[j]));
      }
      EXPECT_LE(d / s, tol) << dtype_name(dt) << " " << fused.param_names()[i];
    }
  }
}

TEST_P(Transformer_, FusedAttentionEqualsComposedInTheWholeModel) {
  if (dev().is_cpu()) GTEST_SKIP() << "the fused kernels run on CUDA devices";
  if (!have_corpus()) GTEST_SKIP() << "/usr/share/common-licenses not present";
  for (DType dt : {DType::float32, DType::float64}) {
    TrainConfig cfg;
    cfg.model.layers = 2;
    cfg.model.heads = 4;
    cfg.model.width = 64;
    cfg.model.context = 100;
    cfg.model.dtype = dt;
    cfg.model.device = dev();
    cfg.batch = 8;
    const ImplComparison r = compare_attention_impls(cfg);
    EXPECT_TRUE(r.ok) << dtype_name(dt) << ": " << r.message;
  }
}

TEST_P(Transformer_, GpuEqualsCpu) {
  if (dev().is_cpu()) GTEST_SKIP() << "compares a CUDA device with the CPU";
  Transformer gpu(tiny(dev(), DType::float64));
  Transformer cpu(tiny(Device::cpu(), DType::float64));
  const Tensor tok = tokens(6, 4, 12);
  Var a = gpu.loss(tok), b = cpu.loss(tok);
  a.backward();
  b.backward();
  EXPECT_LE(relative_error(a.item(), b.item()), 1e-12);
  for (std::size_t i = 0; i < gpu.params().size(); ++i) {
    const auto ga = gpu.params()[i].grad().to_vector<double>(), gb = cpu.params()[i].grad().to_vector<double>();
    for (std::size_t j = 0; j < ga.size(); ++j)
      ASSERT_LE(relative_error(ga[j], gb[j]), 1e-10) << gpu.param_names()[i] << "[" << j << "]";
  }
}

TEST_P(Transformer_, ShortTrainingRunLowersBitsPerChar) {
  if (!have_corpus()) GTEST_SKIP() << "/usr/share/common-licenses not present";
  TrainConfig cfg;
  cfg.model.layers = 1;
  cfg.model.heads = 2;
  cfg.model.width = 32;
  cfg.model.context = 16;
  cfg.model.device = dev();
  cfg.batch = 8;
  cfg.steps = 40;
  cfg.log_every = 20;
  cfg.warmup = 5;
  cfg.lr = 3e-3;
  cfg.valid_batches = 2;
  const TrainLog log = train(cfg);
  ASSERT_EQ(log.step.size(), 3u);
  EXPECT_LT(log.train_bpc.back(), log.train_bpc.front() - 0.5);
  EXPECT_LT(log.valid_bpc.back(), log.valid_bpc.front() - 0.5);
  EXPECT_GT(log.train_seconds_total, 0.0);
}

TEST_P(Transformer_, ValidationDirectoryHoldsEveryParameterAndGradient) {
  if (!have_corpus()) GTEST_SKIP() << "/usr/share/common-licenses not present";
  TrainConfig cfg;
  cfg.model = tiny(dev(), DType::float32);
  cfg.batch = 2;
  const std::string dir = ::testing::TempDir() + "transformer_valdir_" + dualcast::testing::device_label(dev());
  write_validation(dir, cfg);
  const auto m = dcexp::read_json_file(dir + "/manifest.json");
  const Transformer model(cfg.model);
  for (const auto& n : model.param_names()) {
    EXPECT_TRUE(dcexp::member(m, "arrays").contains("param_" + n)) << n;
    EXPECT_TRUE(dcexp::member(m, "arrays").contains("grad_" + n)) << n;
  }
  EXPECT_TRUE(std::isfinite(dcexp::number_or(dcexp::member(dcexp::member(m, "scalars"), "loss"))));
  EXPECT_EQ(std::filesystem::file_size(dir + "/tokens.bin"), 7u * 2u * 4u);
}

INSTANTIATE_TEST_SUITE_P(Devices, Transformer_, ::testing::ValuesIn(dualcast::testing::all_devices()),
                         [](const auto& info) { return dualcast::testing::device_label(info.param); });

}  // namespace
}  // namespace transformer
