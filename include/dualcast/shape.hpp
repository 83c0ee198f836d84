// shape.hpp: Shape (rank 0..kMaxRank), row-major strides and NumPy broadcasting rules with errors that
// name the operation, the arguments and their shapes.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "dualcast/config.hpp"

namespace dualcast {

inline constexpr int kMaxRank = 8;

/// Dimensions of a tensor, outermost first. A plain value type, usable inside kernels.
///
/// A Shape is not validated when it is built (beyond its rank): the operation it is given to checks
/// it with checked_numel, so an error names that operation. Every tensor's shape has non-negative
/// dimensions whose product fits in std::int64_t.
class Shape {
 public:
  constexpr Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims);
  explicit Shape(const std::vector<std::int64_t>& dims);

  [[nodiscard]] DUALCAST_HD int rank() const { return rank_; }
  [[nodiscard]] DUALCAST_HD std::int64_t operator[](int i) const { return dims_[i]; }
  [[nodiscard]] DUALCAST_HD std::int64_t& operator[](int i) { return dims_[i]; }
  /// Dimension i, negative i counting from the back (-1 is the last); checked.
  [[nodiscard]] std::int64_t dim(int i) const;
  /// Product of the dimensions. Computed in unsigned arithmetic, so an unchecked shape whose product
  /// overflows wraps instead of being undefined behaviour; checked_numel rejects such shapes.
  [[nodiscard]] DUALCAST_HD std::int64_t numel() const {
    std::uint64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= static_cast<std::uint64_t>(dims_[i]);
    return static_cast<std::int64_t>(n);
  }
  [[nodiscard]] std::vector<std::int64_t> vec() const { return {dims_, dims_ + rank_}; }
  [[nodiscard]] std::string str() const;
  void push_back(std::int64_t d);

  friend bool operator==(const Shape& a, const Shape& b) {
    if (a.rank_ != b.rank_) return false;
    for (int i = 0; i < a.rank_; ++i)
      if (a.dims_[i] != b.dims_[i]) return false;
    return true;
  }
  friend bool operator!=(const Shape& a, const Shape& b) { return !(a == b); }

 private:
  std::int64_t dims_[kMaxRank] = {};
  int rank_ = 0;
};

/// Row-major (C order) element strides of a contiguous tensor of this shape.
Shape contiguous_strides(const Shape& shape);

/// The number of elements of `shape` once checked: every dimension non-negative and the product of
/// the non-zero dimensions at most INT64_MAX (so neither numel nor any stride overflows). Throws
/// dualcast::Error naming `op`, the argument `arg` and the shape.
std::int64_t checked_numel(const char* op, const char* arg, const Shape& shape);

/// An argument's name and shape, for error messages.
struct NamedShape {
  const char* name;
  Shape shape;
};

/// NumPy broadcast of several shapes (align at the back; sizes equal or 1). Throws dualcast::Error
/// naming `op`, the two conflicting arguments, their shapes and the dimension, or naming `op` and
/// every argument's shape when the broadcast shape has more elements than std::int64_t can count.
Shape broadcast_shapes(const char* op, const std::vector<NamedShape>& args);
/// Two-argument convenience form.
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);

/// Normalises an axis (negative counts from the back) against a rank; throws naming op and shape.
int normalize_axis(const char* op, int axis, const Shape& shape);

}  // namespace dualcast
