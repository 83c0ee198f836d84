// dtype.hpp: element types a Tensor can hold and the dispatch from a runtime dtype to a C++ type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "dualcast/error.hpp"

namespace dualcast {

/// float32 and float64 are differentiable; uint8 holds masks (comparison results, flags).
enum class DType { float32, float64, uint8 };

inline std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::float32: return 4;
    case DType::float64: return 8;
    case DType::uint8: return 1;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::float32: return "float32";
    case DType::float64: return "float64";
    case DType::uint8: return "uint8";
  }
  return "unknown";
}

inline bool is_floating(DType t) { return t == DType::float32 || t == DType::float64; }

template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::float32;
  else if constexpr (std::is_same_v<T, double>) return DType::float64;
  else if constexpr (std::is_same_v<T, std::uint8_t> || std::is_same_v<T, bool>) return DType::uint8;
  else static_assert(sizeof(T) == 0, "dualcast tensors hold float, double or uint8");
}

/// Calls fn(T{}) with T the C++ type of a floating dtype; an unsupported dtype is an Error naming
/// the operation.
template <class Fn>
decltype(auto) dispatch_floating(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::float32: return fn(float{});
    case DType::float64: return fn(double{});
    default: break;
  }
  DUALCAST_FAIL(op, ": unsupported dtype ", dtype_name(t), " (expected float32 or float64)");
}

/// Like dispatch_floating, for every dtype including uint8 masks.
template <class Fn>
decltype(auto) dispatch_all(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::float32: return fn(float{});
    case DType::float64: return fn(double{});
    case DType::uint8: return fn(std::uint8_t{});
  }
  DUALCAST_FAIL(op, ": unsupported dtype ", static_cast<int>(t));
}

}  // namespace dualcast
