// loss.hpp: softmax, log_softmax and the losses (cross-entropy over class indices, mean squared
// error), on tensors and on the tape.
//
// Each op is one dedicated kernel forward and one backward (not composed from generic ops), on the
// CPU and on CUDA devices, for float32 and float64. bfloat16 and float16 inputs are accepted and
// computed on a float32 copy (one conversion pass each way, forward and backward), as PyTorch
// computes them in float32 internally: the result (and the gradient) has the input's dtype, rounded
// once from the float32 result. mse needs pred and target of the same dtype; cross_entropy's labels
// keep whatever dtype they have.
//  - softmax / log_softmax subtract the maximum along the axis (one online max-and-sum pass, then
//    one write pass), so large logits never overflow. Backward: softmax  gx = y * (g - sum(g * y)),
//    log_softmax  gx = g - exp(y) * sum(g), both along the axis, from the saved output alone.
//  - cross_entropy(logits [N, C], labels [N]) is the batch mean of -log softmax(logits)[i, label_i],
//    fused: one pass per row computes the row's log-sum-exp (kept for backward: N numbers) and its
//    loss; backward is (softmax - onehot) * adjoint / N in one elementwise pass. Labels are class
//    indices held in a float32/float64 (or uint8) tensor, e.g. Tensor::from_vector<int>; a label
//    outside [0, C) or not an integer is a dualcast::Error naming it (checking costs one device
//    synchronisation per call on a GPU; while a Graph captures, where nothing can be read back, the
//    check is skipped and a bad label makes the loss and the gradient NaN at every replay).
//    Invariant under shifting all logits by a constant (e.g. +1e5).
//  - Non-finite logits stay in their line (a row, or a line along `axis`), on the CPU and the GPU
//    alike: a NaN makes its line's softmax / log_softmax NaN; k >= 1 elements equal to +inf give NaN
//    at those elements and 0 (softmax) / -inf (log_softmax) at the others; -inf among finite logits
//    gives exactly 0 / -inf there. A cross_entropy row with a +inf has loss +inf (NaN when its label
//    is the +inf), so the batch mean is +inf or NaN, but the other rows' gradients are unaffected.
//  - mse(pred, target) = mean((pred - target)^2) over all elements; pred and target must have the
//    same shape (no broadcasting: a [N, 1] vs [N] mix-up is an Error, not an N x N loss). Both may
//    require gradients.
// Passing Tensors picks the Tensor form (plain computation); passing a Var picks the tape form.
#pragma once

#include "dualcast/tape.hpp"
#include "dualcast/tensor.hpp"

namespace dualcast {

/// exp(x - max) / sum(exp(x - max)) along `axis` (negative counts from the back).
Tensor softmax(const Tensor& x, int axis = -1);
Var softmax(const Var& x, int axis = -1);

/// x - max - log(sum(exp(x - max))) along `axis`.
Tensor log_softmax(const Tensor& x, int axis = -1);
Var log_softmax(const Var& x, int axis = -1);

/// Mean over the batch of the softmax cross-entropy of logits [N, C] against N class indices
/// (a 0-d result). Gradients flow to the logits only.
Tensor cross_entropy(const Tensor& logits, const Tensor& labels);
Var cross_entropy(const Var& logits, const Tensor& labels);

/// mean((pred - target)^2) (a 0-d result).
Tensor mse(const Tensor& pred, const Tensor& target);
Var mse(const Var& pred, const Var& target);

}  // namespace dualcast
