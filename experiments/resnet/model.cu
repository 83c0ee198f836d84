// model.cu: the ResNet-18 model of model.hpp (initialisation, names, forward, fused and composed) and
// the augmented minibatch gather.
#include "model.hpp"

#include <cmath>

#include "dualcast/channel_broadcast.hpp"
#include "dualcast/error.hpp"
#include "dualcast/ops/cast.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "dualcast/ops/linalg.hpp"
#include "dualcast/ops/loss.hpp"
#include "dualcast/ops/norm.hpp"
#include "dualcast/ops/pool.hpp"
#include "dualcast/ops/reduce.hpp"
#include "dualcast/ops/shape.hpp"
#include "dualcast/parallel.hpp"
#include "dualcast/random.hpp"

namespace resnet {

using dualcast::BatchNormStats;
using dualcast::DType;
using dualcast::Shape;

namespace {

ConvLayer make_conv(std::int64_t out, std::int64_t in, std::int64_t k, std::int64_t stride, Device device,
                    std::uint64_t seed) {
  const double std = std::sqrt(2.0 / static_cast<double>(out * k * k));
  Tensor w = Tensor::randn(Shape{out, in, k, k}, Device::cpu(), seed) * std;
  return {Var::param(w.to(device)), {.stride = stride, .padding = k / 2}};
}

BatchNormLayer make_bn(std::int64_t c, Device device) {
  return {Var::param(Tensor::ones(Shape{c}, DType::float32, device)),
          Var::param(Tensor::zeros(Shape{c}, DType::float32, device)),
          Tensor::zeros(Shape{c}, DType::float32, device), Tensor::ones(Shape{c}, DType::float32, device)};
}

// Under Autocast a convolution returns a 16-bit result, and the activations stay 16-bit from one
// convolution to the next, as under PyTorch's autocast: batch_norm_stats reads the 16-bit result and
// gives float32 statistics (summing a channel in 16 bits would lose it), and the fused apply reads the
// 16-bit activations with the float32 statistics and parameters and writes a 16-bit result
// (kKeep: ChannelOptions::keep_activation_dtype; by default float32 operands would promote it). No
// float32 copy of an activation is written. In float32 the same calls are the plain float32 ones.
constexpr dualcast::ChannelOptions kKeep{.keep_activation_dtype = true};
Var as32(const Var& x) { return dualcast::cast(x, DType::float32); }

// Channels last (Config::channels_last): an activation is [N, H, W, C]; batch norm and the fused
// applies see it as [N*H*W, C] (channels(): a view, no copy), where channel_broadcast's channel axis
// is the last, and the result takes the activation's shape again (like()).
Var channels(const Var& x, const Config& c) {
  if (!c.channels_last) return x;
  const std::int64_t C = x.shape()[3];
  return dualcast::reshape(x, {x.numel() / C, C});
}
Var like(const Var& y, const Var& activation) { return dualcast::reshape(y, activation.shape()); }

/// conv(x) with the layer's weights, in the model's layout.
Var conv(const Var& x, const ConvLayer& layer, const Config& c) {
  if (!c.channels_last) return dualcast::conv2d(x, layer.w, layer.options);
  dualcast::Conv2dOptions o = layer.options;
  o.layout = dualcast::ConvLayout::nhwc;
  return dualcast::conv2d(x, dualcast::permute(layer.w, {0, 2, 3, 1}), o);
}

BatchNormStats stats(const Var& y, const BatchNormLayer& bn, bool training, const Config& c) {
  return dualcast::batch_norm_stats(channels(y, c), bn.running_mean, bn.running_var, training, c.bn_momentum,
                                    c.bn_eps);
}

/// batch_norm as one op (PyTorch eager's form; a 16-bit x gives a 16-bit result, as under autocast).
Var bn_composed(const Var& x, const BatchNormLayer& bn, bool training, const Config& c) {
  return like(dualcast::batch_norm(channels(x, c), bn.gamma, bn.beta, bn.running_mean, bn.running_var, training,
                                   c.bn_momentum, c.bn_eps),
              x);
}

/// relu(bn(conv(x))).
Var conv_bn_relu(const Var& x, const ConvLayer& layer, const BatchNormLayer& bn, bool training,
                 Fusion fusion, const Config& c) {
  const Var y = conv(x, layer, c);
  if (fusion == Fusion::composed) return dualcast::relu(bn_composed(y, bn, training, c));
  const BatchNormStats s = stats(y, bn, training, c);
  return like(dualcast::channel_broadcast(kKeep, dualcast::BatchNormRelu{}, channels(y, c), s.mean, s.rstd,
                                          bn.gamma, bn.beta),
              y);
}

Var block_forward(const Var& x, const BasicBlock& b, bool training, Fusion fusion, const Config& c) {
  const Var h = conv_bn_relu(x, b.conv1, b.bn1, training, fusion, c);
  const Var y = conv(h, b.conv2, c);
  if (fusion == Fusion::composed) {
    const Var main = bn_composed(y, b.bn2, training, c);
    const Var shortcut =
        b.projection ? bn_composed(conv(x, b.shortcut, c), b.shortcut_bn, training, c) : x;
    return dualcast::relu(main + shortcut);
  }
  const BatchNormStats s = stats(y, b.bn2, training, c);
  if (!b.projection)
    return like(dualcast::channel_broadcast(kKeep, dualcast::BatchNormAddRelu{}, channels(y, c), s.mean, s.rstd,
                                            b.bn2.gamma, b.bn2.beta, channels(x, c)),
                y);
  const Var p = conv(x, b.shortcut, c);
  const BatchNormStats ps = stats(p, b.shortcut_bn, training, c);
  return like(dualcast::channel_broadcast(kKeep, dualcast::BatchNorm2AddRelu{}, channels(y, c), s.mean, s.rstd,
                                          b.bn2.gamma, b.bn2.beta, channels(p, c), ps.mean, ps.rstd,
                                          b.shortcut_bn.gamma, b.shortcut_bn.beta),
              y);
}

void push_bn(std::vector<std::pair<std::string, Var>>& out, const std::string& name, const BatchNormLayer& bn) {
  out.emplace_back(name + ".weight", bn.gamma);
  out.emplace_back(name + ".bias", bn.beta);
}
void push_buffers(std::vector<std::pair<std::string, Tensor>>& out, const std::string& name,
                  const BatchNormLayer& bn) {
  out.emplace_back(name + ".running_mean", bn.running_mean);
  out.emplace_back(name + ".running_var", bn.running_var);
}

/// out[b, 0, y, x] = normalised pixel of image index[b], shifted by (dy, dx) and flipped per sample.
struct GatherBody {
  const float* images;
  const float* index;
  float* out;
  std::int64_t H, W, pad;
  bool flip;
  float mean, inv_std;
  std::uint64_t key, stream;
  std::int64_t first;  ///< position of row 0 in the global batch
  DUALCAST_HD void operator()(std::int64_t i) const {
    const std::int64_t plane = H * W;
    const std::int64_t b = i / plane, p = i - b * plane;
    const std::int64_t y = p / W, x = p - y * W;
    std::int64_t dy = 0, dx = 0;
    bool mirror = false;
    if (pad > 0 || flip) {
      const dualcast::random::U32x4 r =
          dualcast::random::philox4x32(stream * 0x100000000ull + static_cast<std::uint64_t>(first + b), key);
      const auto span = static_cast<std::uint32_t>(2 * pad + 1);
      dy = static_cast<std::int64_t>(r.v[0] % span) - pad;
      dx = static_cast<std::int64_t>(r.v[1] % span) - pad;
      mirror = flip && (r.v[2] & 1u);
    }
    const std::int64_t sy = y + dy, sx = (mirror ? W - 1 - x : x) + dx;
    float v = 0.0f;
    if (sy >= 0 && sy < H && sx >= 0 && sx < W)
      v = images[static_cast<std::int64_t>(index[b]) * plane + sy * W + sx];
    out[i] = (v - mean) * inv_std;
  }
};

}  // namespace

Model Model::create(const Config& config, Device device, std::uint64_t seed) {
  DUALCAST_CHECK(config.width >= 1 && config.in_channels >= 1 && config.classes >= 2,
                 "resnet: bad configuration (width ", config.width, ", in_channels ", config.in_channels,
                 ", classes ", config.classes, ")");
  Model m;
  m.config_ = config;
  std::uint64_t s = seed * 1000003ull + 17;
  const std::int64_t w = config.width;
  m.stem_ = make_conv(w, config.in_channels, 3, 1, device, s++);
  m.stem_bn_ = make_bn(w, device);
  std::int64_t in = w;
  for (std::size_t stage = 0; stage < config.blocks.size(); ++stage) {
    const std::int64_t out = w << stage;
    for (int i = 0; i < config.blocks[stage]; ++i) {
      const std::int64_t stride = (stage > 0 && i == 0) ? 2 : 1;
      BasicBlock b;
      b.conv1 = make_conv(out, in, 3, stride, device, s++);
      b.bn1 = make_bn(out, device);
      b.conv2 = make_conv(out, out, 3, 1, device, s++);
      b.bn2 = make_bn(out, device);
      b.projection = stride != 1 || in != out;
      if (b.projection) {
        b.shortcut = make_conv(out, in, 1, stride, device, s++);
        b.shortcut_bn = make_bn(out, device);
      }
      m.blocks_.push_back(std::move(b));
      m.block_names_.push_back("layer" + std::to_string(stage + 1) + "." + std::to_string(i));
      in = out;
    }
  }
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  m.fc_w_ = Var::param(Tensor::uniform(Shape{config.classes, in}, Device::cpu(), s++, -bound, bound).to(device));
  m.fc_b_ = Var::param(Tensor::uniform(Shape{config.classes}, Device::cpu(), s++, -bound, bound).to(device));
  return m;
}

Var Model::forward(const Var& x, bool training, Fusion fusion) const {
  DUALCAST_CHECK(x.shape().rank() == 4 && x.shape()[1] == config_.in_channels, "resnet: input of shape ",
                 x.shape().str(), "; expected [N, ", config_.in_channels, ", H, W]");
  // Channels last: the images as [N, H, W, C] (a reshape for one channel), pooled over H and W.
  const Var in = !config_.channels_last ? x
                 : config_.in_channels == 1
                     ? dualcast::reshape(x, {x.shape()[0], x.shape()[2], x.shape()[3], 1})
                     : dualcast::permute(x, {0, 2, 3, 1});
  Var h = conv_bn_relu(in, stem_, stem_bn_, training, fusion, config_);
  for (const BasicBlock& b : blocks_) h = block_forward(h, b, training, fusion, config_);
  // Pooling sums in float32 (the last activation is 16-bit under Autocast).
  const Var pooled = config_.channels_last ? dualcast::mean(as32(h), {1, 2})  // [N, 8w]
                                           : dualcast::flatten(dualcast::adaptive_avg_pool2d(as32(h), {1, 1}));
  return dualcast::matmul(pooled, fc_w_, false, true) + fc_b_;
}

std::vector<std::pair<std::string, Var>> Model::named_params() const {
  std::vector<std::pair<std::string, Var>> out;
  out.emplace_back("conv1.weight", stem_.w);
  push_bn(out, "bn1", stem_bn_);
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    const BasicBlock& b = blocks_[i];
    const std::string& n = block_names_[i];
    out.emplace_back(n + ".conv1.weight", b.conv1.w);
    push_bn(out, n + ".bn1", b.bn1);
    out.emplace_back(n + ".conv2.weight", b.conv2.w);
    push_bn(out, n + ".bn2", b.bn2);
    if (b.projection) {
      out.emplace_back(n + ".shortcut.0.weight", b.shortcut.w);
      push_bn(out, n + ".shortcut.1", b.shortcut_bn);
    }
  }
  out.emplace_back("fc.weight", fc_w_);
  out.emplace_back("fc.bias", fc_b_);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Model::named_buffers() const {
  std::vector<std::pair<std::string, Tensor>> out;
  push_buffers(out, "bn1", stem_bn_);
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    const BasicBlock& b = blocks_[i];
    const std::string& n = block_names_[i];
    push_buffers(out, n + ".bn1", b.bn1);
    push_buffers(out, n + ".bn2", b.bn2);
    if (b.projection) push_buffers(out, n + ".shortcut.1", b.shortcut_bn);
  }
  return out;
}

std::vector<Var> Model::params() const {
  std::vector<Var> out;
  for (auto& [name, v] : named_params()) out.push_back(v);
  return out;
}

std::int64_t Model::num_params() const {
  std::int64_t n = 0;
  for (const Var& v : params()) n += v.numel();
  return n;
}

Tensor gather_batch(const Tensor& images, const Tensor& index, std::int64_t height, std::int64_t width,
                    const Augment& augment, std::uint64_t seed, std::uint64_t stream, std::int64_t first) {
  DUALCAST_CHECK(images.dtype() == DType::float32 && index.dtype() == DType::float32 &&
                     images.rank() == 2 && images.shape()[1] == height * width &&
                     images.device() == index.device(),
                 "gather_batch: images ", images.str(), " and index ", index.str(),
                 " must be float32 [N, H*W] and [B] on one device");
  DUALCAST_CHECK(augment.pad >= 0 && augment.pad < height && augment.pad < width,
                 "gather_batch: padding ", augment.pad, " must lie in [0, image size)");
  const std::int64_t B = index.numel();
  Tensor out = Tensor::empty(Shape{B, 1, height, width}, DType::float32, images.device());
  dualcast::parallel_for(images.device(), out.numel(),
                         GatherBody{images.data<float>(), index.data<float>(), out.data<float>(), height,
                                    width, augment.pad, augment.flip, augment.mean, 1.0f / augment.std,
                                    seed * 0x9E3779B97F4A7C15ull + 0x5851F42D4C957F2Dull, stream, first});
  return out;
}

Var classification_loss(const Var& logits, const Tensor& labels, double label_smoothing) {
  const Var ce = dualcast::cross_entropy(logits, labels);
  if (label_smoothing <= 0) return ce;
  const Var smooth = -dualcast::mean(dualcast::log_softmax(logits, -1));  // mean over N and classes
  return ce * (1.0 - label_smoothing) + smooth * label_smoothing;
}

}  // namespace resnet
