// ops/shape.hpp: ops that move data without arithmetic: transpose, permute, reshape, slice, concat,
// split and broadcast_to, on the tape and for plain Tensors.
//
// Every function takes Vars; a Tensor converts implicitly to a constant Var, so Tensors and Vars mix
// freely. The Tensor overloads are for pure-Tensor code: they record nothing and skip the tape.
// Results are contiguous row-major tensors: reshape shares its input's storage, the others write a new
// tensor in one parallel_for pass (one kernel on a CUDA device). Negative axes count from the back.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "dualcast/shape.hpp"
#include "dualcast/tape.hpp"
#include "dualcast/tensor.hpp"

namespace dualcast {

/// Swaps the last two dimensions (the matrix transpose of a 2-D tensor; batched for rank > 2).
Var transpose(const Var& x);
Tensor transpose(const Tensor& x);

/// Reorders dimensions: result dimension i is x's dimension dims[i]. `dims` is a permutation of
/// 0..rank-1 (negative entries count from the back). Gradient: the inverse permutation.
Var permute(const Var& x, const std::vector<int>& dims);
Tensor permute(const Tensor& x, const std::vector<int>& dims);

/// The same elements under a new shape of equal size; one entry may be -1 (inferred). Shares storage
/// with x (no copy).
Var reshape(const Var& x, std::initializer_list<std::int64_t> shape);
Var reshape(const Var& x, const std::vector<std::int64_t>& shape);
Var reshape(const Var& x, const Shape& shape);
Tensor reshape(const Tensor& x, std::initializer_list<std::int64_t> shape);
Tensor reshape(const Tensor& x, const std::vector<std::int64_t>& shape);
Tensor reshape(const Tensor& x, const Shape& shape);

/// Elements start..stop-1 along `axis` (step 1). Negative start/stop count from the end of the
/// axis; after that 0 <= start <= stop <= size is required (no clamping: bad bounds throw).
Var slice(const Var& x, int axis, std::int64_t start, std::int64_t stop);
Tensor slice(const Tensor& x, int axis, std::int64_t start, std::int64_t stop);

/// Joins tensors along `axis`; all must have the same rank, dtype and device and equal sizes in
/// every other dimension. One kernel pass writes the result (per 8 pieces).
Var concat(const std::vector<Var>& xs, int axis);
Tensor concat(const std::vector<Tensor>& xs, int axis);
/// For `concat({t1, t2}, axis)` with Tensors (a braced list of Vars, or of Vars and Tensors, picks the
/// Var overload).
Tensor concat(std::initializer_list<Tensor> xs, int axis);

/// Cuts x along `axis` into pieces of the given sizes (non-negative, summing to the axis size). One
/// tape node with one output per piece and one kernel pass for all pieces (per 8 pieces); in the
/// backward pass, pieces that received no gradient count as zero.
std::vector<Var> split(const Var& x, int axis, const std::vector<std::int64_t>& sizes);
std::vector<Tensor> split(const Tensor& x, int axis, const std::vector<std::int64_t>& sizes);

/// Repeats x to `shape` under NumPy rules (x's shape aligned at the back; each of its dimensions
/// equal to the target's or 1). Gradient: the adjoint summed over the broadcast dimensions.
Var broadcast_to(const Var& x, const Shape& shape);
Tensor broadcast_to(const Tensor& x, const Shape& shape);

}  // namespace dualcast
