// model.cu: the decoder-only transformer and its MultiHeadAttention module (model.hpp).
#include "model.hpp"

#include <cmath>
#include <utility>

#include "dualcast/broadcast.hpp"
#include "dualcast/error.hpp"
#include "dualcast/math.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "dualcast/ops/layer_norm.hpp"
#include "dualcast/ops/linalg.hpp"
#include "dualcast/ops/loss.hpp"
#include "dualcast/ops/shape.hpp"

namespace transformer {

using namespace dualcast;

namespace {

/// gelu(u + c): the MLP's bias and activation, one fused kernel each way (mixed mode).
struct BiasGelu {
  DUALCAST_HD auto operator()(auto u, auto c) const { return gelu(u + c); }
};
/// x + y + b: a residual connection with the sublayer's output bias, one fused kernel each way.
struct ResidualBias {
  DUALCAST_HD auto operator()(auto x, auto y, auto b) const { return x + y + b; }
};

Tensor normal(const Shape& shape, double std, DType dt, Device dev, std::uint64_t seed) {
  return Tensor::randn(shape, dev, seed, dt) * std;
}

}  // namespace

// ---- MultiHeadAttention -------------------------------------------------------------------------

MultiHeadAttention::MultiHeadAttention(int width, int heads, DType dt, Device dev, std::uint64_t seed,
                                       double out_scale)
    : width_(width), heads_(heads) {
  DUALCAST_CHECK(width > 0 && heads > 0 && width % heads == 0, "MultiHeadAttention: width ", width,
                 " must be a positive multiple of heads ", heads);
  const std::int64_t C = width;
  Wqkv = Var::param(normal({C, 3 * C}, 0.02, dt, dev, seed));
  bqkv = Var::param(Tensor::zeros({3 * C}, dt, dev));
  Wo = Var::param(normal({C, C}, 0.02 * out_scale, dt, dev, seed + 1));
  bo = Var::param(Tensor::zeros({C}, dt, dev));
}

Var MultiHeadAttention::project(const Var& x, const AttentionOptions& options) const {
  DUALCAST_CHECK(x.defined() && x.shape().rank() == 3 && x.shape()[2] == width_,
                 "MultiHeadAttention: x must be [N, T, ", width_, "], got ",
                 x.defined() ? x.shape().str() : std::string("an undefined Var"));
  const std::int64_t N = x.shape()[0], T = x.shape()[1], C = width_, H = heads_, dh = C / H;
  const Var qkv = matmul(reshape(x, {N * T, C}), Wqkv) + bqkv;                   // [N*T, 3C]
  const Var heads = permute(reshape(qkv, {N, T, std::int64_t{3}, H, dh}), {2, 0, 3, 1, 4});  // [3, N, H, T, dh]
  const std::vector<Var> qkv3 = split(heads, 0, {1, 1, 1});
  const Var q = reshape(qkv3[0], {N, H, T, dh});
  const Var k = reshape(qkv3[1], {N, H, T, dh});
  const Var v = reshape(qkv3[2], {N, H, T, dh});
  const Var o = scaled_dot_product_attention(q, k, v, options);                  // [N, H, T, dh]
  return matmul(reshape(permute(o, {0, 2, 1, 3}), {N * T, C}), Wo);              // [N*T, C]
}

Var MultiHeadAttention::forward(const Var& x, const AttentionOptions& options) const {
  return reshape(project(x, options) + bo, x.shape());
}

// ---- Transformer --------------------------------------------------------------------------------

Var Transformer::add_param(const std::string& name, Tensor value) {
  Var p = Var::param(std::move(value));
  params_.push_back(p);
  names_.push_back(name);
  return p;
}

Transformer::Transformer(const TransformerConfig& c) : config_(c) {
  DUALCAST_CHECK(c.layers >= 1 && c.context >= 1 && c.vocab >= 1 && c.mlp_ratio >= 1,
                 "Transformer: layers, context, vocab and mlp_ratio must be positive");
  const DType dt = c.dtype;
  const Device dev = c.device;
  const std::int64_t C = c.width, V = c.vocab, F = static_cast<std::int64_t>(c.mlp_ratio) * c.width;
  // GPT-2's initialisation: N(0, 0.02^2); projections into the residual stream scaled by
  // 1/sqrt(2 * layers); layer norms gamma 1, beta 0; biases 0.
  const double out_scale = 1.0 / std::sqrt(2.0 * c.layers);
  std::uint64_t seed = c.seed * 1000;
  E_ = add_param("E", normal({V, C}, 0.02, dt, dev, ++seed));
  P_ = add_param("P", normal({c.context, C}, 0.02, dt, dev, ++seed));
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = "l" + std::to_string(l) + ".";
    Var ln1_g = add_param(p + "ln1_g", Tensor::ones({C}, dt, dev));
    Var ln1_b = add_param(p + "ln1_b", Tensor::zeros({C}, dt, dev));
    MultiHeadAttention attn(c.width, c.heads, dt, dev, seed += 2, out_scale);
    params_.push_back(attn.Wqkv);
    names_.push_back(p + "Wqkv");
    params_.push_back(attn.bqkv);
    names_.push_back(p + "bqkv");
    params_.push_back(attn.Wo);
    names_.push_back(p + "Wo");
    params_.push_back(attn.bo);
    names_.push_back(p + "bo");
    Var ln2_g = add_param(p + "ln2_g", Tensor::ones({C}, dt, dev));
    Var ln2_b = add_param(p + "ln2_b", Tensor::zeros({C}, dt, dev));
    Var W1 = add_param(p + "W1", normal({C, F}, 0.02, dt, dev, ++seed));
    Var c1 = add_param(p + "c1", Tensor::zeros({F}, dt, dev));
    Var W2 = add_param(p + "W2", normal({F, C}, 0.02 * out_scale, dt, dev, ++seed));
    Var c2 = add_param(p + "c2", Tensor::zeros({C}, dt, dev));
    layers_.push_back(Layer{ln1_g, ln1_b, std::move(attn), ln2_g, ln2_b, W1, c1, W2, c2});
  }
  lnf_g_ = add_param("lnf_g", Tensor::ones({C}, dt, dev));
  lnf_b_ = add_param("lnf_b", Tensor::zeros({C}, dt, dev));
  Wout_ = add_param("Wout", normal({C, V}, 0.02, dt, dev, ++seed));
  bout_ = add_param("bout", Tensor::zeros({V}, dt, dev));
}

std::int64_t Transformer::parameter_count() const {
  std::int64_t n = 0;
  for (const Var& p : params_) n += p.numel();
  return n;
}

void Transformer::load_params_from(const Transformer& other) {
  DUALCAST_CHECK(other.params_.size() == params_.size(), "Transformer::load_params_from: the models differ");
  for (std::size_t i = 0; i < params_.size(); ++i) {
    DUALCAST_CHECK(other.params_[i].shape() == params_[i].shape(), "Transformer::load_params_from: ",
                   names_[i], " has shape ", other.params_[i].shape().str(), " there and ",
                   params_[i].shape().str(), " here");
    Tensor dst = params_[i].value();
    dst.copy_(other.params_[i].value().to(dst.device()).to(dst.dtype()));
  }
}

Var Transformer::block(const Layer& L, const Var& x, int batch, int T) const {
  const std::int64_t B = batch, C = config_.width;
  AttentionOptions opt;
  opt.causal = true;
  opt.impl = config_.attention;
  const Var a_in = layer_norm(x, L.ln1_g, L.ln1_b);
  const Var attn = L.attn.project(reshape(a_in, {B, std::int64_t{T}, C}), opt);  // [B*T, C], no bias yet
  const Var h = config_.fuse_elementwise ? broadcast(ResidualBias{}, x, attn, L.attn.bo) : x + attn + L.attn.bo;
  const Var u = matmul(layer_norm(h, L.ln2_g, L.ln2_b), L.W1);
  const Var act = config_.fuse_elementwise ? broadcast(BiasGelu{}, u, L.c1) : gelu(u + L.c1);
  const Var y = matmul(act, L.W2);
  return config_.fuse_elementwise ? broadcast(ResidualBias{}, h, y, L.c2) : h + y + L.c2;
}

Var Transformer::logits(const Tensor& ids) {
  DUALCAST_CHECK(ids.rank() == 2, "Transformer::logits: ids must be [B, T], got ", ids.shape().str());
  const std::int64_t B = ids.shape()[0], T = ids.shape()[1], C = config_.width, V = config_.vocab;
  DUALCAST_CHECK(T >= 1 && T <= config_.context, "Transformer::logits: T = ", T, " must lie in [1, context = ",
                 config_.context, "]");
  const DType dt = config_.dtype;
  const Device dev = config_.device;
  const Tensor x = ids.to(dev).to(dt);
  // E[x] as a one-hot product: its gradient onehot^T dh is the scatter-add of repeated tokens.
  const Tensor onehot = (reshape(x, {B * T, std::int64_t{1}}) == Tensor::arange(V, dt, dev)).to(dt);
  const Var pos = T == config_.context ? P_ : slice(P_, 0, 0, T);
  Var h = reshape(reshape(matmul(Var(onehot), E_), {B, T, C}) + pos, {B * T, C});
  for (const Layer& L : layers_) h = block(L, h, static_cast<int>(B), static_cast<int>(T));
  return matmul(layer_norm(h, lnf_g_, lnf_b_), Wout_) + bout_;
}

Var Transformer::loss(const Tensor& tokens) {
  DUALCAST_CHECK(tokens.rank() == 2 && tokens.shape()[0] >= 2, "Transformer::loss: tokens must be [T+1, B] "
                 "with T >= 1, got ", tokens.shape().str());
  DUALCAST_CHECK(is_floating(tokens.dtype()), "Transformer::loss: tokens must hold float ids");
  const std::int64_t T = tokens.shape()[0] - 1, B = tokens.shape()[1];
  if (tokens.device().is_cpu()) {
    for (double v : tokens.to_vector<double>())
      DUALCAST_CHECK(v >= 0 && v < config_.vocab && v == std::floor(v), "Transformer::loss: token id ", v,
                     " is not an integer in [0, ", config_.vocab, ")");
  }
  const Tensor bt = transpose(tokens.to(config_.device).to(config_.dtype));  // [B, T+1]
  const Tensor targets = reshape(slice(bt, 1, 1, T + 1), {B * T});
  return cross_entropy(logits(slice(bt, 1, 0, T)), targets);
}

}  // namespace transformer
