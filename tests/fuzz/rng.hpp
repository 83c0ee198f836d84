// rng.hpp: the fuzzer's source of randomness. Two streams: `decide` draws the structure of a case
// (ranks, shapes, ops, kinds), `data` draws tensor values. Seeded mode (the GoogleTest driver) runs
// both from SplitMix64; byte mode (the libFuzzer target) takes every decision from the fuzzer's input
// bytes while they last, so libFuzzer's mutations steer the structure, and draws the rest and all
// values from a SplitMix64 seeded by a hash of those bytes. Plain C++, no dualcast code.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace fuzz {

inline std::uint64_t splitmix64(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// The seed of case `index` of a run with master seed `master`.
inline std::uint64_t case_seed(std::uint64_t master, std::uint64_t index) {
  std::uint64_t s = master ^ (index * 0xd1342543de82ef95ULL);
  return splitmix64(s);
}

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed), data_state_(seed ^ 0x5851f42d4c957f2dULL) {}
  /// Byte mode: decisions come from data[0..size) first.
  Rng(const std::uint8_t* data, std::size_t size) : bytes_(data), left_(size) {
    std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
    for (std::size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 0x100000001b3ULL;
    state_ = h;
    data_state_ = h ^ 0x5851f42d4c957f2dULL;
  }

  /// Uniform integer in [lo, hi] (a decision).
  std::int64_t uniform(std::int64_t lo, std::int64_t hi) {
    if (hi <= lo) return lo;
    const auto range = static_cast<std::uint64_t>(hi - lo) + 1;
    std::uint64_t r;
    if (left_ > 0) {
      r = 0;
      for (std::uint64_t span = range - 1; span > 0 && left_ > 0; span >>= 8) {
        r = (r << 8) | *bytes_++;
        --left_;
      }
    } else {
      r = splitmix64(state_);
    }
    return lo + static_cast<std::int64_t>(r % range);
  }
  int uniform_int(int lo, int hi) { return static_cast<int>(uniform(lo, hi)); }
  /// True with probability p (a decision; p in steps of 1/256).
  bool chance(double p) { return uniform(0, 255) < static_cast<std::int64_t>(p * 256.0); }
  template <class V>
  const auto& pick(const V& v) {
    return v[static_cast<std::size_t>(uniform(0, static_cast<std::int64_t>(v.size()) - 1))];
  }

  // ---- the data stream ---------------------------------------------------------------------------
  /// Uniform in [0, 1).
  double real() { return static_cast<double>(splitmix64(data_state_) >> 11) * 0x1.0p-53; }
  double real(double lo, double hi) { return lo + (hi - lo) * real(); }
  /// Standard normal (Box-Muller).
  double normal() {
    const double u = 1.0 - real(), v = real();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
  }
  /// An integer from the data stream (values, not structure).
  std::int64_t data_int(std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(splitmix64(data_state_) % static_cast<std::uint64_t>(hi - lo + 1));
  }

 private:
  std::uint64_t state_ = 0;
  std::uint64_t data_state_ = 0;
  const std::uint8_t* bytes_ = nullptr;
  std::size_t left_ = 0;
};

}  // namespace fuzz
