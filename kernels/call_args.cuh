// call_args.cuh: how the fused elementwise kernels (broadcast.cuh, channel_broadcast.cuh) pass the
// arguments they loaded to the user's f: each argument's compile-time slot says whether it is
// differentiated (a dual seeded with unit partial `Slot`) or passed as a plain T.
#pragma once

#include <cstddef>
#include <utility>

#include "dualcast/config.hpp"
#include "dualcast/dual.hpp"

namespace dualcast::detail {

/// Slot of an argument that is not differentiated: a Tensor, or a plain number (known at compile
/// time to be one value for the whole call).
inline constexpr int kTensorSlot = -1;
inline constexpr int kNumberSlot = -2;

/// Argument a of f: a dual seeded with unit partial `Slot` for a differentiated argument, else T.
template <class T, int K, bool DUAL, int Slot>
DUALCAST_HD DUALCAST_INLINE auto make_arg(T v) {
  if constexpr (DUAL && Slot >= 0) return Dual<T, K>::variable(v, Slot);
  else return v;
}

template <class T, int K, bool DUAL, class F, int... Slots, std::size_t... A>
DUALCAST_HD DUALCAST_INLINE auto invoke_at(const F& f, const T* x, std::integer_sequence<int, Slots...>,
                                           std::index_sequence<A...>) {
  return f(make_arg<T, K, DUAL, Slots>(x[A])...);
}

}  // namespace dualcast::detail
