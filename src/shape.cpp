// shape.cpp: Shape construction, formatting and the broadcasting rules.
#include "dualcast/shape.hpp"

#include <sstream>

#include "dualcast/error.hpp"

namespace dualcast {

Shape::Shape(std::initializer_list<std::int64_t> dims) : Shape(std::vector<std::int64_t>(dims)) {}

Shape::Shape(const std::vector<std::int64_t>& dims) {
  DUALCAST_CHECK(static_cast<int>(dims.size()) <= kMaxRank, "Shape: rank ", dims.size(),
                 " exceeds the maximum rank ", kMaxRank);
  for (std::size_t i = 0; i < dims.size(); ++i) {
    DUALCAST_CHECK(dims[i] >= 0, "Shape: negative dimension ", dims[i], " at position ", i);
    dims_[i] = dims[i];
  }
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
  std::int64_t s = 1;
  for (int i = shape.rank() - 1; i >= 0; --i) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
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
  return Shape(out);
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
