// model.hpp: a small decoder-only transformer (GPT-2 style, pre-layer-norm) for character-level
// language modelling on dualcast's tape, and the MultiHeadAttention module it is built from.
//
//   h_0 = E[x_t] + P[t]                                     token and learned position embeddings
//   a   = h + MHA(layer_norm(h))                            per layer, causal self-attention
//   h'  = a + W2 gelu(layer_norm(a) W1 + c1) + c2           the MLP (width 4C)
//   logits = layer_norm(h_L) Wout + bout,  loss = mean cross-entropy of the next character
//
// Matrices are stored [in, out] (y = x W + b), also in the PyTorch peer (peer_torch.py), which loads
// dualcast's parameters by name to validate. Mixed mode appears where it fuses: the MLP's bias + gelu
// is ONE broadcast of a functor (one kernel forward, one backward, instead of two ops each way), and
// so is the residual + bias of each sublayer's output projection (x + y + b); everything else is
// reverse mode (matmul, layer_norm, the shape ops, attention, cross_entropy). Both can be switched to
// plain ops (TransformerConfig::fuse_elementwise = false) for comparison.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dualcast/device.hpp"
#include "dualcast/dtype.hpp"
#include "dualcast/ops/attention.hpp"
#include "dualcast/tape.hpp"
#include "dualcast/tensor.hpp"

namespace transformer {

using dualcast::AttentionImpl;
using dualcast::Device;
using dualcast::DType;
using dualcast::Tensor;
using dualcast::Var;

/// Multi-head self-attention with packed input projections (PyTorch's in_proj layout):
///   [q | k | v] = x Wqkv + bqkv      Wqkv = [Wq | Wk | Wv]  [C, 3C],  bqkv [3C]
///   heads: [N, T, 3, H, C/H] -> permute -> [3, N, H, T, C/H] -> split into q, k, v   (shape ops)
///   o = scaled_dot_product_attention(q, k, v, options)                              [N, H, T, C/H]
///   out = merge(o) Wo + bo      merge: permute to [N, T, H, C/H], reshape to [N*T, C]
class MultiHeadAttention {
 public:
  /// Weights ~ N(0, 0.02^2) (Wo scaled by out_scale), biases 0; seeded (same on CPU and GPU).
  MultiHeadAttention(int width, int heads, DType dtype, Device device, std::uint64_t seed,
                     double out_scale = 1.0);
  /// x [N, T, C] -> the attention sublayer's output before its bias: merge(o) Wo, [N*T, C]. The
  /// caller adds bo (Transformer fuses it with the residual); forward() adds it.
  [[nodiscard]] Var project(const Var& x, const dualcast::AttentionOptions& options) const;
  /// x [N, T, C] -> [N, T, C], the whole module.
  [[nodiscard]] Var forward(const Var& x, const dualcast::AttentionOptions& options) const;

  [[nodiscard]] int width() const { return width_; }
  [[nodiscard]] int heads() const { return heads_; }
  /// Wqkv, bqkv, Wo, bo (handles to the same variables).
  [[nodiscard]] std::vector<Var> params() const { return {Wqkv, bqkv, Wo, bo}; }

  Var Wqkv, bqkv, Wo, bo;

 private:
  int width_, heads_;
};

struct TransformerConfig {
  int layers = 4;
  int heads = 4;
  int width = 256;
  int context = 128;  ///< longest sequence (rows of the position table)
  int vocab = 64;
  int mlp_ratio = 4;
  DType dtype = DType::float32;
  Device device;
  std::uint64_t seed = 1;
  AttentionImpl attention = AttentionImpl::automatic;
  /// Mixed-mode fusions (bias + gelu, residual + bias) as single broadcasts; false: plain ops.
  bool fuse_elementwise = true;
};

class Transformer {
 public:
  explicit Transformer(const TransformerConfig& config);

  /// Mean next-character cross-entropy (nats) over tokens [T+1, B] (charlm's layout: column b is
  /// one window; float ids in [0, vocab), any float dtype and device): inputs are rows 0..T-1,
  /// targets rows 1..T. T <= context. Builds the graph: call backward() for every gradient.
  Var loss(const Tensor& tokens);
  /// logits [B*T, vocab] for ids [B, T] (float ids, the model's device).
  Var logits(const Tensor& ids);

  std::vector<Var>& params() { return params_; }
  [[nodiscard]] const std::vector<Var>& params() const { return params_; }
  /// "E", "P", "l0.ln1_g", "l0.ln1_b", "l0.Wqkv", "l0.bqkv", "l0.Wo", "l0.bo", "l0.ln2_g",
  /// "l0.ln2_b", "l0.W1", "l0.c1", "l0.W2", "l0.c2", ..., "lnf_g", "lnf_b", "Wout", "bout".
  [[nodiscard]] const std::vector<std::string>& param_names() const { return names_; }
  [[nodiscard]] std::int64_t parameter_count() const;
  /// Copies every parameter's value from `other` (same configuration; any device or dtype).
  void load_params_from(const Transformer& other);
  [[nodiscard]] const TransformerConfig& config() const { return config_; }
  void set_attention(AttentionImpl impl) { config_.attention = impl; }

 private:
  struct Layer {
    Var ln1_g, ln1_b;
    MultiHeadAttention attn;
    Var ln2_g, ln2_b, W1, c1, W2, c2;
  };
  Var add_param(const std::string& name, Tensor value);
  Var block(const Layer& L, const Var& x, int batch, int T) const;

  TransformerConfig config_;
  Var E_, P_, lnf_g_, lnf_b_, Wout_, bout_;
  std::vector<Layer> layers_;
  std::vector<Var> params_;
  std::vector<std::string> names_;
};

}  // namespace transformer
