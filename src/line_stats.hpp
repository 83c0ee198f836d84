// line_stats.hpp (private): the online max-and-sum statistics of softmax-like lines, shared by
// src/loss.cu's CPU and CUDA drivers and by tests/test_nonfinite_logits.cu, which replays the GPU's
// lane layout and merge order on the host.
#pragma once

#include <math.h>

#include <cstdint>
#include <limits>

#include "dualcast/config.hpp"

namespace dualcast::detail {

DUALCAST_HD DUALCAST_INLINE float lexp(float v) { return ::expf(v); }
DUALCAST_HD DUALCAST_INLINE double lexp(double v) { return ::exp(v); }
DUALCAST_HD DUALCAST_INLINE float llog(float v) { return ::logf(v); }
DUALCAST_HD DUALCAST_INLINE double llog(double v) { return ::log(v); }

template <class T>
DUALCAST_HD DUALCAST_INLINE T neg_inf() {
  return -std::numeric_limits<T>::infinity();
}

// Non-finite logits, the same on every path (CPU, and each GPU line shape): the running maximum m
// never holds a NaN, and an element equal to m counts exp(0) = 1 without forming m - m, so that
// +inf - +inf never arises in the statistics. Hence, per line:
//  - a NaN anywhere makes s NaN: the whole line's output is NaN;
//  - k >= 1 elements equal to +inf give m = +inf, s = k: softmax is NaN at those elements
//    (exp(inf - inf)) and 0 elsewhere, log_softmax NaN there and -inf elsewhere;
//  - a line of -inf only gives m = -inf, s = 0: NaN throughout;
//  - -inf among finite values gives exactly 0 (softmax) / -inf (log_softmax) there.
// Lines never share statistics, so nothing spreads to other lines.

/// Adds v to a running (max m, sum of exp(x - m) s); s is rescaled when the maximum grows.
template <class T>
DUALCAST_HD DUALCAST_INLINE void online_add(T& m, T& s, T v) {
  if (v > m) {
    s = s * lexp(m - v) + T(1);  // m < v: exp(m - v) is finite or exp(-inf) = 0, never NaN
    m = v;
  } else if (v == m) {
    if (m != neg_inf<T>()) s += T(1);  // exp(v - m) = 1, also for +inf (inf - inf would be NaN);
                                       // -inf against -inf adds nothing
  } else {
    s += lexp(v - m);  // v < m, or v NaN: NaN propagates into s
  }
}

/// Merges two running (max, sum) pairs (of two threads' parts of one line). The part holding the
/// larger maximum keeps its sum unscaled: with m == mm forming exp(m - mm) would be NaN for +inf.
/// A part with the smaller maximum is scaled by exp(-inf) = 0 or less than 1; a NaN sum stays NaN
/// (0 * NaN), also for a part that saw only NaN and -inf (m = -inf).
template <class T>
DUALCAST_HD DUALCAST_INLINE void online_merge(T& m, T& s, T m2, T s2) {
  const T mm = m > m2 ? m : m2;
  const T a = m == mm ? s : s * lexp(m - mm);
  const T b = m2 == mm ? s2 : s2 * lexp(m2 - mm);
  m = (m != m || m2 != m2) ? (m != m ? m : m2) : mm;
  s = a + b;
}

/// Forward partial stats of one thread. Four elements at a time (four loads in flight, one rescale
/// per four); a group whose running maximum is not finite (all -inf, or a +inf) or that holds a NaN
/// takes the exact one-by-one path, so wide rows treat infinities as short rows do.
template <class T>
DUALCAST_HD DUALCAST_INLINE void line_stats(const T* x, std::int64_t base, std::int64_t stride,
                                            std::int64_t C, int lane, int G, T& m, T& s) {
  m = neg_inf<T>();
  s = T(0);
  std::int64_t c = lane;
  for (; c + 3 * G < C; c += 4 * G) {
    const T v0 = x[base + c * stride], v1 = x[base + (c + G) * stride];
    const T v2 = x[base + (c + 2 * G) * stride], v3 = x[base + (c + 3 * G) * stride];
    T mx = m;
    mx = v0 > mx ? v0 : mx;
    mx = v1 > mx ? v1 : mx;
    mx = v2 > mx ? v2 : mx;
    mx = v3 > mx ? v3 : mx;
    if (!(mx > neg_inf<T>() && mx < -neg_inf<T>()) || v0 != v0 || v1 != v1 || v2 != v2 || v3 != v3) {
      online_add(m, s, v0);
      online_add(m, s, v1);
      online_add(m, s, v2);
      online_add(m, s, v3);
    } else {
      const T scaled = m == neg_inf<T>() ? T(0) * s : s * lexp(m - mx);
      s = scaled + ((lexp(v0 - mx) + lexp(v1 - mx)) + (lexp(v2 - mx) + lexp(v3 - mx)));
      m = mx;
    }
  }
  for (; c < C; c += G) online_add(m, s, x[base + c * stride]);
}

}  // namespace dualcast::detail
