// shape.cpp: Shape construction, formatting and the broadcasting rules.
#include "dualcast/shape.hpp"

#include <cstdint>
#include <sstream>
#include <string>

#include "dualcast/error.hpp"

namespace dualcast {

Shape::Shape(std::initializer_list<std::int64_t> dims) : Shape(std::vector<std::int64_t>(dims)) {}

Shape::Shape(const std::vector<std::int64_t>& dims) {
  DUALCAST_CHECK(static_cast<int>(dims.size()) <= kMaxRank, "Shape: rank ", dims.size(),
                 " exceeds the maximum rank ", kMaxRank);
  // Negative or overflowing dimensions are left to checked_numel in the op this Shape is given to,
  // so the error names that op.
  for (std::size_t i = 0; i < dims.size(); ++i) dims_[i] = dims[i];
  rank_ = static_cast<int>(dims.size());
}

std::int64_t Shape::dim(int i) const {
  const int k = i < 0 ? i + rank_ : i;
  DUALCAST_CHECK(k >= 0 && k < rank_, "Shape::dim: index ", i, " out of range for shape ", str());
  return dims_[k];
}

void Shape::push_back(std::int64_t d) {
  DUALCAST_CHECK(rank_ < kMaxRank, "Shape: rank would exceed the maximum rank ", kMaxRank);
  dims_[rank_++] = d;
}

std::string Shape::str() const {
  std::ostringstream os;
  os << '[';
  for (int i = 0; i < rank_; ++i) os << (i ? ", " : "") << dims_[i];
  os << ']';
  return os.str();
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides = shape;
  std::uint64_t s = 1;  // unsigned: no undefined behaviour on a shape checked_numel would reject
  for (int i = shape.rank() - 1; i >= 0; --i) {
    strides[i] = static_cast<std::int64_t>(s);
    s *= static_cast<std::uint64_t>(shape[i]);
  }
  return strides;
}

std::int64_t checked_numel(const char* op, const char* arg, const Shape& shape) {
  std::int64_t nonzero = 1;
  bool empty = false;
  for (int i = 0; i < shape.rank(); ++i) {
    const std::int64_t d = shape[i];
    DUALCAST_CHECK(d >= 0, op, ": ", arg, " ", shape.str(), " has a negative dimension ", d,
                   " at position ", i);
    if (d == 0) {
      empty = true;
      continue;
    }
    DUALCAST_CHECK(!__builtin_mul_overflow(nonzero, d, &nonzero), op, ": ", arg, " ",
                   shape.str(), " has more elements than a 64-bit count holds (the product of "
                   "its non-zero dimensions exceeds ", INT64_MAX, ")");
  }
  return empty ? 0 : nonzero;
}

Shape broadcast_shapes(const char* op, const std::vector<NamedShape>& args) {
  int rank = 0;
  for (const auto& a : args) rank = a.shape.rank() > rank ? a.shape.rank() : rank;
  std::vector<std::int64_t> out(static_cast<std::size_t>(rank), 1);
  std::vector<const NamedShape*> owner(static_cast<std::size_t>(rank), nullptr);
  for (const auto& a : args) {
    const int offset = rank - a.shape.rank();
    for (int i = 0; i < a.shape.rank(); ++i) {
      const std::int64_t d = a.shape[i];
      auto& o = out[static_cast<std::size_t>(offset + i)];
      auto& who = owner[static_cast<std::size_t>(offset + i)];
      if (d == o) {
        if (!who) who = &a;
        continue;
      }
      if (d == 1) continue;
      if (o == 1) {
        o = d;
        who = &a;
        continue;
      }
      DUALCAST_FAIL(op, ": cannot broadcast argument '", who->name, "' of shape ", who->shape.str(),
                    " with argument '", a.name, "' of shape ", a.shape.str(), " (dimension ",
                    offset + i - rank, ": ", o, " vs ", d, ")");
    }
  }
  const Shape result(out);
  std::int64_t n = 1;
  for (const std::int64_t d : out)
    if (d != 0 && __builtin_mul_overflow(n, d, &n)) {
      std::string shapes;
      for (const auto& a : args)
        shapes += (shapes.empty() ? "" : ", ") + std::string("'") + a.name + "' " + a.shape.str();
      DUALCAST_FAIL(op, ": the broadcast shape ", result.str(), " of ", shapes,
                    " has more elements than a 64-bit count holds (the product of its non-zero "
                    "dimensions exceeds ", INT64_MAX, ")");
    }
  return result;
}

Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  return broadcast_shapes(op, {{"a", a}, {"b", b}});
}

int normalize_axis(const char* op, int axis, const Shape& shape) {
  const int k = axis < 0 ? axis + shape.rank() : axis;
  DUALCAST_CHECK(k >= 0 && k < shape.rank(), op, ": axis ", axis, " out of range for shape ",
                 shape.str(), " (rank ", shape.rank(), ")");
  return k;
}

}  // namespace dualcast
