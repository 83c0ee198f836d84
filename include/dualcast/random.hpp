// random.hpp: a counter-based generator (Philox4x32-10, Salmon et al. SC'11). Element i of a random
// tensor depends only on (seed, i), so the CPU and the GPU produce the same values in any order.
#pragma once

#include <cmath>
#include <cstdint>

#include "dualcast/config.hpp"

namespace dualcast::random {

struct U32x4 {
  std::uint32_t v[4];
};

DUALCAST_HD inline std::uint32_t mulhilo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi) {
  const std::uint64_t p = static_cast<std::uint64_t>(a) * b;
  hi = static_cast<std::uint32_t>(p >> 32);
  return static_cast<std::uint32_t>(p);
}

/// Philox4x32 with 10 rounds: 4 independent 32-bit words for counter `ctr` under key `key`.
DUALCAST_HD inline U32x4 philox4x32(std::uint64_t ctr, std::uint64_t key, std::uint32_t stream = 0) {
  std::uint32_t c0 = static_cast<std::uint32_t>(ctr), c1 = static_cast<std::uint32_t>(ctr >> 32),
                c2 = stream, c3 = 0;
  std::uint32_t k0 = static_cast<std::uint32_t>(key), k1 = static_cast<std::uint32_t>(key >> 32);
  for (int r = 0; r < 10; ++r) {
    std::uint32_t hi0, hi1;
    const std::uint32_t lo0 = mulhilo(0xD2511F53u, c0, hi0);
    const std::uint32_t lo1 = mulhilo(0xCD9E8D57u, c2, hi1);
    const std::uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return U32x4{{c0, c1, c2, c3}};
}

/// Uniform double in (0, 1] from two words (53 random bits; never 0, so log() is safe).
DUALCAST_HD inline double to_unit_double(std::uint32_t a, std::uint32_t b) {
  const std::uint64_t bits = (static_cast<std::uint64_t>(a) << 21) ^ (b >> 11);
  return (static_cast<double>(bits & ((1ull << 53) - 1)) + 1.0) * (1.0 / 9007199254740992.0);
}

/// Uniform double in (0, 1] for element i of the stream `seed`.
DUALCAST_HD inline double uniform(std::uint64_t seed, std::uint64_t i) {
  const U32x4 r = philox4x32(i, seed);
  return to_unit_double(r.v[0], r.v[1]);
}

/// Standard normal for element i (Box-Muller in double, cosine branch). Double arithmetic on both
/// backends makes float results agree bit for bit in practice; doubles can differ in the last ulp
/// where the host libm and CUDA round log/cos differently.
DUALCAST_HD inline double normal(std::uint64_t seed, std::uint64_t i) {
  const U32x4 r = philox4x32(i, seed);
  const double u1 = to_unit_double(r.v[0], r.v[1]);
  const double u2 = to_unit_double(r.v[2], r.v[3]);
  return ::sqrt(-2.0 * ::log(u1)) * ::cos(6.283185307179586476925 * u2);
}

}  // namespace dualcast::random
