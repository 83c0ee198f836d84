// model.hpp: ResNet-18 in its CIFAR form (3x3 stem without pooling, four stages of two basic blocks,
// widths w, 2w, 4w, 8w with w = 64 for the real model, global average pooling, a linear head) for
// single-channel 28x28 Fashion-MNIST images; its seeded initialisation, PyTorch-style names of its
// parameters, the forward pass, and the augmented minibatch gather (random crop with zero padding and
// horizontal flips, normalisation) on the run device.
//
// The elementwise parts run fused (Fusion::fused, the default): each batch norm's apply with its ReLU,
// and a block's residual add with the shortcut's own batch norm, is one channel_broadcast
// (ops/norm.hpp functors), so a basic block is two convolutions, two or three statistics passes and
// two fused elementwise kernels forward, and as many backward. Fusion::composed builds the same
// network from batch_norm, relu and + (one kernel per op, like PyTorch eager) for comparison.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dualcast/ops/conv.hpp"
#include "dualcast/tape.hpp"
#include "dualcast/tensor.hpp"

namespace resnet {

using dualcast::Device;
using dualcast::Tensor;
using dualcast::Var;

struct Config {
  std::int64_t width = 64;        ///< channels of the first stage (64: ResNet-18)
  std::int64_t in_channels = 1;   ///< 1 for Fashion-MNIST
  std::int64_t classes = 10;
  std::vector<int> blocks{2, 2, 2, 2};  ///< basic blocks per stage
  double bn_momentum = 0.1;
  double bn_eps = 1e-5;
  /// Activations channels last ([N, H, W, C], PyTorch's channels_last): the convolutions run as
  /// ConvLayout::nhwc (cuDNN's tensor-core kernels are NHWC ones), each weight permuted to
  /// [O, KH, KW, C] as it is used (the parameters keep PyTorch's [O, C, KH, KW]), batch norm on
  /// the [N*H*W, C] view of an activation. The input and the logits are the same either way.
  /// For the tensor-core precisions (tf32, bf16, fp16): in exact float32 cuDNN's NHWC kernels are
  /// FMA implicit GEMMs and the step is 2x slower than NCHW (paper/measured/h200-2026-11-29j).
  bool channels_last = false;
};

enum class Fusion { fused, composed };

struct ConvLayer {
  Var w;  ///< [O, C, KH, KW], no bias (a batch norm follows)
  dualcast::Conv2dOptions options;
};

struct BatchNormLayer {
  Var gamma, beta;
  Tensor running_mean, running_var;
};

struct BasicBlock {
  ConvLayer conv1, conv2;
  BatchNormLayer bn1, bn2;
  bool projection = false;  ///< a strided 1x1 convolution and batch norm on the shortcut
  ConvLayer shortcut;
  BatchNormLayer shortcut_bn;
};

class Model {
 public:
  /// Conv weights ~ N(0, 2 / (O * KH * KW)) (Kaiming, fan-out, as torchvision's ResNet), batch norm
  /// gamma = 1 and beta = 0, running statistics 0 and 1, the head uniform in +-1/sqrt(fan_in) (as
  /// nn.Linear). Drawn on the CPU from counter-based streams seeded by `seed`, then moved to `device`,
  /// so every device starts from the same weights.
  static Model create(const Config& config, Device device, std::uint64_t seed);

  /// Logits [N, classes] of images [N, in_channels, H, W]. `training` uses batch statistics (and
  /// updates the running ones); evaluation uses the running statistics. Under dualcast::Autocast the
  /// convolutions and the head's matmul run in the 16-bit dtype and the activations between them stay
  /// 16-bit, as under PyTorch's autocast: batch norm statistics are float32 (summed in double from
  /// the 16-bit values), the fused applies compute in float32 and round once; pooling and the loss
  /// run in float32; the logits come back float32 (the head's float32 bias promotes them).
  [[nodiscard]] Var forward(const Var& x, bool training, Fusion fusion = Fusion::fused) const;

  /// Every parameter, in a fixed order.
  [[nodiscard]] std::vector<Var> params() const;
  /// Parameters under PyTorch's names (conv1.weight, bn1.weight, layer1.0.conv1.weight, ...,
  /// layer2.0.shortcut.0.weight, layer2.0.shortcut.1.bias, fc.weight, fc.bias).
  [[nodiscard]] std::vector<std::pair<std::string, Var>> named_params() const;
  /// Running statistics under PyTorch's names (bn1.running_mean, ...).
  [[nodiscard]] std::vector<std::pair<std::string, Tensor>> named_buffers() const;
  [[nodiscard]] std::int64_t num_params() const;
  [[nodiscard]] const Config& config() const { return config_; }

 private:
  Config config_;
  ConvLayer stem_;
  BatchNormLayer stem_bn_;
  std::vector<BasicBlock> blocks_;
  std::vector<std::string> block_names_;  ///< "layer1.0", ...
  Var fc_w_;  ///< [classes, 8w] (PyTorch's layout; applied as x W^T)
  Var fc_b_;  ///< [classes]
};

/// Augmentation of one minibatch.
struct Augment {
  std::int64_t pad = 2;    ///< random crop: shift by up to +-pad pixels, zeros coming in (0: none)
  bool flip = true;        ///< horizontal flip with probability 1/2
  float mean = 0.2860f;    ///< normalisation (Fashion-MNIST's pixel mean and standard deviation)
  float std = 0.3530f;
};

/// images [N, H*W] (float32 in [0, 1], on the device) -> batch [B, 1, H, W] of the rows `index`
/// (float32 [B] row numbers), each shifted and flipped by its own draw of the counter-based generator
/// keyed by (seed, stream, position in the batch), then normalised. One kernel; the same batch on every
/// device. `first` is the position of row 0 in the global batch when `index` is one rank's shard of
/// it (data-parallel), so that each image gets the draw a one-process run would give it.
Tensor gather_batch(const Tensor& images, const Tensor& index, std::int64_t height, std::int64_t width,
                    const Augment& augment, std::uint64_t seed, std::uint64_t stream, std::int64_t first = 0);

/// Softmax cross-entropy, with label smoothing eps when eps > 0:
/// (1 - eps) * CE + eps * mean over classes of -log_softmax (as torch's label_smoothing).
Var classification_loss(const Var& logits, const Tensor& labels, double label_smoothing);

}  // namespace resnet
