// shape_ops_common.hpp (private to src/shape_ops*.cu): what the shape ops share: dispatch by word
// size (data movement cares about the element's size, not its type) and argument checks.
#pragma once

#include <cstdint>

#include "dualcast/error.hpp"
#include "dualcast/shape.hpp"
#include "dualcast/tape.hpp"
#include "dualcast/tensor.hpp"

namespace dualcast::shape_ops_detail {

/// Calls fn(W{}) with W an unsigned word of the dtype's size.
template <class Fn>
void dispatch_word(DType t, const char* op, Fn&& fn) {
  switch (dtype_size(t)) {
    case 1: fn(std::uint8_t{}); return;
    case 2: fn(std::uint16_t{}); return;
    case 4: fn(std::uint32_t{}); return;
    case 8: fn(std::uint64_t{}); return;
    default: break;
  }
  DUALCAST_FAIL(op, ": unsupported dtype ", dtype_name(t));
}

inline void check_var(const Var& x, const char* op, const char* arg) {
  DUALCAST_CHECK(x.defined(), op, ": argument '", arg, "' is an undefined Var");
}

inline std::int64_t product(const Shape& s, int begin, int end) {
  std::int64_t p = 1;
  for (int i = begin; i < end; ++i) p *= s[i];
  return p;
}

}  // namespace dualcast::shape_ops_detail
