// half.hpp: bfloat16 and float16, the two 16-bit storage types. They hold bits and convert to and
// from float (round to nearest even, NaN kept NaN, overflow to infinity); all arithmetic happens in
// float after the implicit conversion, which is how dualcast computes on them everywhere: load 16
// bits, work in float registers, store 16 bits. The conversions are DUALCAST_HD: one PTX cvt
// instruction in a kernel, the same rounding in portable bit arithmetic on the host.
#pragma once

#include <cstdint>
#include <type_traits>

#include "dualcast/config.hpp"

namespace dualcast {

namespace detail {

// A kernel reinterprets with CUDA's intrinsics: NVRTC (dualcast.jit's CUDA kernels) has no
// __builtin_memcpy. Both are a register move there.
DUALCAST_HD DUALCAST_INLINE std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  __builtin_memcpy(&u, &f, sizeof(u));
  return u;
#endif
}
DUALCAST_HD DUALCAST_INLINE float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  __builtin_memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

DUALCAST_HD DUALCAST_INLINE std::uint16_t float_to_bf16_bits(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  std::uint16_t r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
#else
  std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round half to even on the 16 dropped bits
  return static_cast<std::uint16_t>(u >> 16);
#endif
}

DUALCAST_HD DUALCAST_INLINE float bf16_bits_to_float(std::uint16_t b) {
  return bits_float(static_cast<std::uint32_t>(b) << 16);
}

DUALCAST_HD DUALCAST_INLINE std::uint16_t float_to_fp16_bits(float f) {
#if defined(__CUDA_ARCH__)
  std::uint16_t r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
#else
  std::uint32_t u = float_bits(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  std::uint32_t h;
  if (u >= 0x47800000u) {  // |f| >= 65536, infinity or NaN
    h = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (u < 0x38800000u) {
    // Below float16's smallest normal (2^-14): adding 0.5 lines the float16 subnormal grid up with
    // float's last mantissa bits, and the float addition itself rounds half to even.
    const float shifted = bits_float(u) + 0.5f;
    h = float_bits(shifted) - 0x3f000000u;
  } else {
    // Rebias the exponent and round the 13 dropped mantissa bits half to even; a carry out of the
    // mantissa moves into the exponent, up to infinity for 65520 <= |f| < 65536.
    const std::uint32_t odd = (u >> 13) & 1u;
    u += 0xc8000fffu + odd;  // (15 - 127) << 23, plus the rounding increment
    h = u >> 13;
  }
  return static_cast<std::uint16_t>(h | sign);
#endif
}

DUALCAST_HD DUALCAST_INLINE float fp16_bits_to_float(std::uint16_t h) {
#if defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#else
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24 is exact in float.
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return bits_float(float_bits(v) | sign);
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
#endif
}

}  // namespace detail

/// Brain floating point: float's sign and 8-bit exponent with 7 mantissa bits (float's range,
/// about 3 significant digits).
struct bfloat16 {
  std::uint16_t bits;

  bfloat16() = default;
  template <class A, std::enable_if_t<std::is_arithmetic_v<A>, int> = 0>
  DUALCAST_HD DUALCAST_INLINE explicit bfloat16(A value)
      : bits(detail::float_to_bf16_bits(static_cast<float>(value))) {}
  DUALCAST_HD DUALCAST_INLINE operator float() const { return detail::bf16_bits_to_float(bits); }
  DUALCAST_HD static constexpr bfloat16 from_bits(std::uint16_t b) {
    bfloat16 r{};
    r.bits = b;
    return r;
  }
};

/// IEEE 754 binary16: 5-bit exponent, 10 mantissa bits (largest finite 65504, smallest normal
/// 2^-14): more digits than bfloat16, far less range, hence loss scaling (GradScaler).
struct float16 {
  std::uint16_t bits;

  float16() = default;
  template <class A, std::enable_if_t<std::is_arithmetic_v<A>, int> = 0>
  DUALCAST_HD DUALCAST_INLINE explicit float16(A value)
      : bits(detail::float_to_fp16_bits(static_cast<float>(value))) {}
  DUALCAST_HD DUALCAST_INLINE operator float() const { return detail::fp16_bits_to_float(bits); }
  DUALCAST_HD static constexpr float16 from_bits(std::uint16_t b) {
    float16 r{};
    r.bits = b;
    return r;
  }
};

static_assert(sizeof(bfloat16) == 2 && sizeof(float16) == 2, "16-bit storage types");

/// Whether T is one of the 16-bit storage types.
template <class T>
inline constexpr bool is_half_v =
    std::is_same_v<std::remove_cv_t<T>, bfloat16> || std::is_same_v<std::remove_cv_t<T>, float16>;

/// The type arithmetic on stored T happens in: float for the 16-bit types, T itself otherwise.
template <class T>
using compute_t = std::conditional_t<is_half_v<T>, float, T>;

/// x converted to To through From's compute type (a 16-bit value becomes a float first), so that any
/// pair of dtypes converts with one expression. A floating value converted to an integer type is
/// truncated toward zero and saturates at the type's range, NaN becoming 0: C++ leaves the
/// conversion of a value outside the range undefined, and the host (which wraps: 300.0 -> 44 in
/// uint8) and the GPU (which saturates) would disagree.
template <class To, class From>
DUALCAST_HD DUALCAST_INLINE To convert(From x) {
  using C = compute_t<From>;
  const C v = static_cast<C>(x);
  if constexpr (std::is_integral_v<To> && !std::is_same_v<To, bool> && std::is_floating_point_v<C>) {
    // To's range without <limits>, which NVRTC (dualcast.torch's kernels) does not have.
    using U = std::make_unsigned_t<To>;
    constexpr bool is_signed = To(-1) < To(0);
    constexpr To hi = is_signed ? To(U(~U(0)) >> 1) : To(~U(0));
    constexpr To lo = is_signed ? To(-hi - 1) : To(0);
    if (!(v == v)) return To{0};
    if (v <= static_cast<C>(lo)) return lo;
    if (v >= static_cast<C>(hi)) return hi;  // hi may round up in C (int64 in float): then equal
  }
  return static_cast<To>(v);
}

}  // namespace dualcast
