// ops/norm.hpp: batch normalisation over NCHW tensors, PyTorch's semantics, as two pieces that a
// network can fuse with what follows:
//   1. batch_norm_stats(x, ...): per-channel mean and rstd = 1/sqrt(var + eps). In training they are
//      the batch's (biased variance, one pass shifted by each channel's first element, accumulated
//      in double) and the running statistics are updated in place: running = (1 - momentum) * running
//      + momentum * batch, with the unbiased variance (as torch.nn.BatchNorm2d). In evaluation they
//      are the running statistics (constants). One tape node; its backward is one elementwise pass,
//      dx += dmean / M - drstd * rstd^3 * (x - mean) / M (M = N * H * W), added in place.
//   2. the apply, written as a mixed-mode broadcast (channel_broadcast.hpp) of one of the functors
//      below: (x - mean) * rstd * gamma + beta, optionally followed by ReLU, a residual add, or a
//      second batch-norm branch, in one kernel forward and one backward whose per-channel gradients
//      (mean, rstd, gamma, beta) are summed inside the kernel.
// batch_norm() is the two together with BatchNormApply.
//
// Shapes: x [N, C, *] (rank >= 2; [N, C] is BatchNorm1d), gamma and beta [C], running statistics [C]
// (same dtype and device as x). Training needs more than one value per channel (N * H * W > 1), as
// PyTorch does. Errors name the op, the argument and the shapes.
//
// 16-bit x (bfloat16, float16), as PyTorch's autocast runs batch norm in float32: batch_norm_stats
// reads x as it is (summing in double) and returns float32 statistics; its backward writes x's
// gradient in x's dtype. The running statistics must then be float32 (an Error otherwise). batch_norm
// computes on a float32 copy (one conversion pass each way) and returns x's dtype; gamma and beta may
// be float32 (they then get float32 gradients) or x's dtype. A network that keeps its activations in
// 16 bits applies the float32 statistics with channel_broadcast(ChannelOptions{.keep_activation_dtype
// = true}, f, x, ...): x is read and the result written in 16 bits, the statistics and parameters in
// float32.
#pragma once

#include "dualcast/channel_broadcast.hpp"
#include "dualcast/math.hpp"
#include "dualcast/tape.hpp"
#include "dualcast/tensor.hpp"

namespace dualcast {

/// Per-channel statistics of a batch-norm layer, [C] each.
struct BatchNormStats {
  Var mean;
  Var rstd;  ///< 1 / sqrt(var + eps)
};

/// The statistics batch norm normalises with: the batch's (training; running statistics updated in
/// place when defined) or the running ones (evaluation; they must be defined).
BatchNormStats batch_norm_stats(const Var& x, const Tensor& running_mean, const Tensor& running_var,
                                bool training, double momentum = 0.1, double eps = 1e-5);

/// y = (x - mean) * rstd * gamma + beta per channel, as torch.nn.functional.batch_norm.
Var batch_norm(const Var& x, const Var& gamma, const Var& beta, const Tensor& running_mean,
               const Tensor& running_var, bool training, double momentum = 0.1, double eps = 1e-5);

// ---- the elementwise parts of a residual network, for channel_broadcast --------------------------
// Argument order: the activation, then its statistics and affine parameters as batch_norm_stats and
// the layer give them. Each is one fused kernel forward and one backward.

/// (x - mean) * rstd * gamma + beta.
struct BatchNormApply {
  DUALCAST_HD auto operator()(auto x, auto mean, auto rstd, auto gamma, auto beta) const {
    return (x - mean) * rstd * gamma + beta;
  }
};

/// relu(batch norm of x).
struct BatchNormRelu {
  DUALCAST_HD auto operator()(auto x, auto mean, auto rstd, auto gamma, auto beta) const {
    return relu((x - mean) * rstd * gamma + beta);
  }
};

/// relu(batch norm of x + residual): the end of a basic block with an identity shortcut.
struct BatchNormAddRelu {
  DUALCAST_HD auto operator()(auto x, auto mean, auto rstd, auto gamma, auto beta, auto residual) const {
    return relu((x - mean) * rstd * gamma + beta + residual);
  }
};

/// relu(batch norm of x + batch norm of s): the end of a basic block whose shortcut is a strided 1x1
/// convolution with its own batch norm. Ten arguments (an explicit template list: nvcc rejects ten
/// abbreviated `auto` parameters).
struct BatchNorm2AddRelu {
  template <class X, class M, class R, class G, class B, class S, class SM, class SR, class SG, class SB>
  DUALCAST_HD auto operator()(X x, M mean, R rstd, G gamma, B beta, S s, SM s_mean, SR s_rstd,
                              SG s_gamma, SB s_beta) const {
    return relu((x - mean) * rstd * gamma + beta + ((s - s_mean) * s_rstd * s_gamma + s_beta));
  }
};

}  // namespace dualcast
