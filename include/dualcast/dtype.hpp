// dtype.hpp: element types a Tensor can hold, the type promotion between them, and the dispatch from
// a runtime dtype to a C++ type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "dualcast/error.hpp"
#include "dualcast/half.hpp"

namespace dualcast {

/// The floating dtypes are differentiable; uint8 holds masks (comparison results, flags).
/// bfloat16 and float16 are storage types: kernels load them, compute in float32 and store them
/// back (half.hpp).
enum class DType { float32, float64, uint8, bfloat16, float16 };

inline std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::float32: return 4;
    case DType::float64: return 8;
    case DType::uint8: return 1;
    case DType::bfloat16:
    case DType::float16: return 2;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::float32: return "float32";
    case DType::float64: return "float64";
    case DType::uint8: return "uint8";
    case DType::bfloat16: return "bfloat16";
    case DType::float16: return "float16";
  }
  return "unknown";
}

/// bfloat16 or float16.
inline bool is_half(DType t) { return t == DType::bfloat16 || t == DType::float16; }

/// Every dtype but uint8: what may require a gradient.
inline bool is_floating(DType t) { return t == DType::float32 || t == DType::float64 || is_half(t); }

/// The dtype arithmetic on t happens in: float32 for the 16-bit types, t itself otherwise.
inline DType compute_dtype(DType t) { return is_half(t) ? DType::float32 : t; }

/// Whether elementwise operations combine a and b by promotion: equal dtypes, or float32 with the
/// 16-bit types (float64 mixes with nothing, so a float32 model never silently runs in double).
inline bool promotable(DType a, DType b) {
  const auto single = [](DType t) { return t == DType::float32 || is_half(t); };
  return a == b || (single(a) && single(b));
}

/// The result dtype of an operation on a and b, as PyTorch promotes tensors: equal dtypes stay;
/// uint8 masks take the other side's dtype; float64 wins; any other mix of floating dtypes (a 16-bit
/// type with float32, or bfloat16 with float16) gives float32.
inline DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::uint8) return b;
  if (b == DType::uint8) return a;
  if (a == DType::float64 || b == DType::float64) return DType::float64;
  return DType::float32;
}

template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::float32;
  else if constexpr (std::is_same_v<T, double>) return DType::float64;
  else if constexpr (std::is_same_v<T, std::uint8_t> || std::is_same_v<T, bool>) return DType::uint8;
  else if constexpr (std::is_same_v<T, bfloat16>) return DType::bfloat16;
  else if constexpr (std::is_same_v<T, float16>) return DType::float16;
  else static_assert(sizeof(T) == 0, "dualcast tensors hold float, double, uint8, bfloat16 or float16");
}

/// Calls fn(T{}) with T the C++ type of a float32 or float64 dtype (the compute types); any other
/// dtype is an Error naming the operation.
template <class Fn>
decltype(auto) dispatch_floating(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::float32: return fn(float{});
    case DType::float64: return fn(double{});
    default: break;
  }
  DUALCAST_FAIL(op, ": unsupported dtype ", dtype_name(t), " (expected float32 or float64)");
}

/// Calls fn(T{}) with T the C++ type of any floating dtype, the 16-bit storage types included.
template <class Fn>
decltype(auto) dispatch_floating_storage(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::float32: return fn(float{});
    case DType::float64: return fn(double{});
    case DType::bfloat16: return fn(bfloat16{});
    case DType::float16: return fn(float16{});
    default: break;
  }
  DUALCAST_FAIL(op, ": unsupported dtype ", dtype_name(t),
                " (expected float32, float64, bfloat16 or float16)");
}

/// Like dispatch_floating_storage, for every dtype including uint8 masks.
template <class Fn>
decltype(auto) dispatch_all(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::float32: return fn(float{});
    case DType::float64: return fn(double{});
    case DType::uint8: return fn(std::uint8_t{});
    case DType::bfloat16: return fn(bfloat16{});
    case DType::float16: return fn(float16{});
  }
  DUALCAST_FAIL(op, ": unsupported dtype ", static_cast<int>(t));
}

}  // namespace dualcast
