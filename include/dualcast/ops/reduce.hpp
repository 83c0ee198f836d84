// reduce.hpp: reductions on tensors and on the tape: sum_to (the reverse of broadcasting), sum, mean
// and amax over all elements or over axes, and the broadcast copy that is their gradient.
//
// Every function works on float32, float64, bfloat16 and float16, on the CPU and on CUDA devices
// (the result lives on the input's device, with its dtype, as in PyTorch). Sums and means accumulate
// in double whatever the dtype; maxima and the counts of tied maxima are taken in float for the 16-bit
// dtypes, whose values are read directly (no float32 copy) and rounded once, on the store. Gradients
// have the input's dtype. Results are contiguous.
//
// Axes: a list of dimensions, negative ones counting from the back (-1 is the last). A duplicate or
// out-of-range axis is a dualcast::Error naming the op, the axis and the shape. An empty list
// reduces nothing (NumPy's `axis=()`), so sum(x, {}) is x; use sum(x) to reduce everything.
// keepdims=true keeps each reduced dimension with size 1 (the result broadcasts against x).
//
// Naming: the maximum over axes is called `amax`, never `max`, so that it cannot be confused with
// the elementwise binary max(a, b) / min(a, b) of ops/elementwise.hpp (max(var, 1) is the
// elementwise maximum of var and the scalar 1, amax(var, 1) the maximum over axis 1).
//
// Overloads: each op has a Var form (recorded on the tape when an argument requires a gradient and
// recording is on) and a Tensor form (plain computation, returns a Tensor). Passing a Tensor picks
// the Tensor form; passing a Var picks the Var form.
#pragma once

#include <vector>

#include "dualcast/shape.hpp"
#include "dualcast/tape.hpp"
#include "dualcast/tensor.hpp"

namespace dualcast {

// ---- sum_to: the reverse of NumPy broadcasting ------------------------------------------------

/// Sums x over every dimension where `target` (aligned at the back, possibly of lower rank) has
/// size 1 or is missing; the result has exactly `target`'s shape (contiguous, x's dtype and
/// device). When x already has shape `target`, returns x itself (shares storage, no copy).
/// Throws dualcast::Error (naming "sum_to" and both shapes) unless `target` broadcasts to x.shape().
Tensor sum_to(const Tensor& x, const Shape& target);
/// Tape form: the gradient is the adjoint broadcast back to x's shape.
Var sum_to(const Var& x, const Shape& target);

// ---- sum and mean -----------------------------------------------------------------------------

/// Sum of all elements (a 0-d tensor).
Tensor sum(const Tensor& x);
Tensor sum(const Tensor& x, const std::vector<int>& axes, bool keepdims = false);
Tensor sum(const Tensor& x, int axis, bool keepdims = false);
Var sum(const Var& x);
Var sum(const Var& x, const std::vector<int>& axes, bool keepdims = false);
Var sum(const Var& x, int axis, bool keepdims = false);

/// Arithmetic mean (sum divided by the number of reduced elements; NaN for an empty reduction).
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const std::vector<int>& axes, bool keepdims = false);
Tensor mean(const Tensor& x, int axis, bool keepdims = false);
Var mean(const Var& x);
Var mean(const Var& x, const std::vector<int>& axes, bool keepdims = false);
Var mean(const Var& x, int axis, bool keepdims = false);

// ---- amax -------------------------------------------------------------------------------------

/// Maximum over the axes (NaN propagates). Its gradient flows to the positions holding the
/// maximum; tied positions share it evenly (like PyTorch's amax). Reducing an empty dimension is an
/// Error (a maximum of nothing does not exist).
Tensor amax(const Tensor& x);
Tensor amax(const Tensor& x, const std::vector<int>& axes, bool keepdims = false);
Tensor amax(const Tensor& x, int axis, bool keepdims = false);
Var amax(const Var& x);
Var amax(const Var& x, const std::vector<int>& axes, bool keepdims = false);
Var amax(const Var& x, int axis, bool keepdims = false);

namespace detail {
/// A contiguous copy of x broadcast (NumPy rules) to `shape`, every element multiplied by `scale`.
/// The gradient of sum/mean/sum_to; throws unless x's shape broadcasts to `shape`.
Tensor broadcast_copy(const Tensor& x, const Shape& shape, double scale = 1.0);
/// Normalises a list of axes against `shape` into a mask (mask[d] true = reduced); throws on a
/// duplicate or out-of-range axis naming `op`, the axis and the shape.
std::vector<bool> axes_mask(const char* op, const std::vector<int>& axes, const Shape& shape);
/// x itself when contiguous, else a contiguous copy (same shape, dtype and device).
Tensor contiguous_copy(const Tensor& x);
/// `shape` with every masked dimension set to 1 (keepdims) or removed.
Shape reduced_shape(const Shape& shape, const std::vector<bool>& mask, bool keepdims);
}  // namespace detail

}  // namespace dualcast
