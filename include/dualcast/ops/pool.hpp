// ops/pool.hpp: pooling over NCHW tensors and flatten, on the tape, PyTorch's semantics (floor
// output sizes, no ceil mode), float32, float64, bfloat16 and float16, CPU and CUDA. One kernel
// forward, one backward. 16-bit tensors are read and written directly (no float32 copy): a window's
// maximum or sum and a gradient's gathered sum are formed in float, rounded once to the input's dtype,
// which the result and the gradient have.
//
//   OH = (H + 2 * padding.h - kernel.h) / stride.h + 1   (likewise OW)
//
// * max_pool2d: the maximum of each window; padding counts as -infinity. The gradient goes to ONE
//   element per window, the one the forward picked: the first maximum in the window's scan order
//   (rows top to bottom, each row left to right), as PyTorch; a NaN wins over numbers (the last NaN
//   in scan order). Tied windows that overlap may pick the same element, which then receives the
//   sum of their adjoints. The forward keeps the picked positions (4 bytes per output).
// * avg_pool2d: the window's mean; with count_include_pad (the default, as PyTorch) the divisor is
//   kernel.h * kernel.w, padding counting as zeros; without it, the number of input elements in the
//   window.
// * adaptive_avg_pool2d: output size given; window o spans [floor(o * H / OH), ceil((o + 1) * H / OH))
//   (PyTorch's rule). {1, 1} is global average pooling.
// Backward passes gather: every input element sums the windows that contain it (no atomics; the
// result does not depend on thread timing).
//
// Errors (dualcast::Error naming the op and the shapes): x not 4-D, kernel or stride < 1, padding < 0
// or more than half the kernel, a kernel larger than the padded input, an output size < 1.
#pragma once

#include "dualcast/ops/conv.hpp"  // Size2
#include "dualcast/tape.hpp"
#include "dualcast/tensor.hpp"

namespace dualcast {

Var max_pool2d(const Var& x, Size2 kernel, Size2 stride, Size2 padding = Size2(0));
/// Stride = kernel (PyTorch's default).
Var max_pool2d(const Var& x, Size2 kernel);
Tensor max_pool2d(const Tensor& x, Size2 kernel, Size2 stride, Size2 padding = Size2(0));
Tensor max_pool2d(const Tensor& x, Size2 kernel);

Var avg_pool2d(const Var& x, Size2 kernel, Size2 stride, Size2 padding = Size2(0),
               bool count_include_pad = true);
Var avg_pool2d(const Var& x, Size2 kernel);
Tensor avg_pool2d(const Tensor& x, Size2 kernel, Size2 stride, Size2 padding = Size2(0),
                  bool count_include_pad = true);
Tensor avg_pool2d(const Tensor& x, Size2 kernel);

Var adaptive_avg_pool2d(const Var& x, Size2 output);
Tensor adaptive_avg_pool2d(const Tensor& x, Size2 output);

/// Merges dimensions start_dim..end_dim (negative counts from the back) into one: [N, C, H, W] ->
/// [N, C*H*W] with the defaults. Shares storage (a reshape).
Var flatten(const Var& x, int start_dim = 1, int end_dim = -1);
Tensor flatten(const Tensor& x, int start_dim = 1, int end_dim = -1);

}  // namespace dualcast
