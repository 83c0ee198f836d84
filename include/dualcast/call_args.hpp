// call_args.hpp (internal): the compile-time description of a fused call's argument list, shared
// by broadcast(f, args...) and channel_broadcast(f, args...): which arguments are Vars
// (differentiated, one partial slot each), Tensors or plain numbers, and the types f is called with.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "dualcast/dual.hpp"
#include "dualcast/tape.hpp"
#include "dualcast/tensor.hpp"
#include "dualcast/kernels/call_args.cuh"

namespace dualcast::detail {

enum ArgKind : int { kVarArg = 0, kTensorArg = 1, kNumberArg = 2, kBadArg = -1 };

template <class A>
inline constexpr int arg_kind_v = std::is_same_v<std::remove_cvref_t<A>, Var>      ? kVarArg
                                  : std::is_same_v<std::remove_cvref_t<A>, Tensor> ? kTensorArg
                                  : std::is_arithmetic_v<std::remove_cvref_t<A>>   ? kNumberArg
                                                                                   : kBadArg;

template <class... Args>
struct ArgList {
  static constexpr int count = static_cast<int>(sizeof...(Args));
  static constexpr std::array<int, sizeof...(Args)> kinds{arg_kind_v<Args>...};
  static constexpr int vars = ((arg_kind_v<Args> == kVarArg ? 1 : 0) + ... + 0);
  static constexpr std::array<int, sizeof...(Args)> slots = [] {
    std::array<int, sizeof...(Args)> s{};
    int k = 0;
    for (std::size_t a = 0; a < s.size(); ++a)
      s[a] = kinds[a] == kVarArg ? k++ : kinds[a] == kNumberArg ? kNumberSlot : kTensorSlot;
    return s;
  }();
  template <std::size_t... I>
  static auto slot_seq(std::index_sequence<I...>) -> std::integer_sequence<int, slots[I]...>;
  using Slots = decltype(slot_seq(std::make_index_sequence<sizeof...(Args)>{}));
};

/// The type argument a is passed to f as: Dual<T, K> for a Var (when differentiating), else T.
template <class T, int K, bool DUAL, class A>
using arg_type_t = std::conditional_t<DUAL && arg_kind_v<A> == kVarArg && (K > 0), Dual<T, (K > 0 ? K : 1)>, T>;

template <class F, class T, int K, bool DUAL, class... Args>
inline constexpr bool callable_v = std::is_invocable_v<const F&, arg_type_t<T, K, DUAL, Args>...>;

/// Appends a to vars when it is a Var (the inputs of the call's tape node).
template <class A>
void collect_var(std::vector<Var>& vars, const A& a) {
  if constexpr (arg_kind_v<A> == kVarArg) vars.push_back(a);
}

/// One argument of a call at run time: its tensor (Var or Tensor) or its number.
struct ArgInfo {
  Tensor tensor;          ///< undefined for a number
  double number = 0.0;    ///< the number, for a number argument
  int kind = kNumberArg;
};

template <class A>
ArgInfo describe_arg(const A& a) {
  ArgInfo info;
  info.kind = arg_kind_v<A>;
  if constexpr (arg_kind_v<A> == kVarArg) {
    if (a.defined()) info.tensor = a.value();  // an undefined Var: the call's plan names it
  }
  else if constexpr (arg_kind_v<A> == kTensorArg) info.tensor = a;
  else info.number = static_cast<double>(a);
  return info;
}

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace dualcast::detail
