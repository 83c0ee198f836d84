// ops/layer_norm.hpp: layer normalisation over the last axis, on tensors and on the tape.
//
//   y = (x - mean) / sqrt(var + eps) * gamma + beta,   mean and var (biased, as PyTorch) over the
//   last axis of x [..., C]; gamma and beta are [C] (either may be undefined: no scale / no shift).
//
// One dedicated kernel forward (two passes over each row: the mean, summed relative to the row's
// first element, then the centred sum of squares, so a large common offset costs no precision) that also keeps each row's mean and
// 1/sqrt(var + eps) for the backward ([rows] numbers, the node's only extra memory). Backward:
//   dx     = rstd * (gy - mean(gy) - xhat * mean(gy * xhat)),  gy = g * gamma, xhat = (x - mean) * rstd
//   dgamma = sum over rows of g * xhat,   dbeta = sum over rows of g
// dx is one row kernel; dgamma and dbeta are per-chunk column partial sums reduced by dualcast::sum.
// float32 (statistics accumulated in float32 per lane, combined in a fixed order) and float64, CPU
// and CUDA (a warp per row). bfloat16 and float16 x compute on a float32 copy (one conversion pass
// each way, forward and backward) and return x's dtype; their gamma and beta may be float32 (the
// master parameters of mixed precision, which then get float32 gradients) or x's dtype. Throws
// dualcast::Error naming the argument and shapes when gamma or beta is not [C], when dtypes or
// devices differ, for rank 0 or for eps < 0 or not finite.
#pragma once

#include "dualcast/tape.hpp"
#include "dualcast/tensor.hpp"

namespace dualcast {

/// The default epsilon (PyTorch's).
inline constexpr double kLayerNormEps = 1e-5;

Var layer_norm(const Var& x, const Var& gamma, const Var& beta, double eps = kLayerNormEps);
Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                  double eps = kLayerNormEps);

}  // namespace dualcast
