// combos.hpp: the broadcast calls the fuzzer can make. A Combo is one functor of functors.hpp with one
// fixed list of argument kinds ('V' a Var: differentiated, 'T' a Tensor: constant, 'N' a plain
// number), instantiated at compile time; shapes, values, dtypes, constness of each Var, aliasing and
// the partials policy are drawn at run time. The instantiations are spread over three translation
// units (combos_*.cu) so nvcc compiles them in parallel.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "dualcast/broadcast.hpp"
#include "reference_functions.hpp"

namespace fuzz {

/// The arguments of one call, by position (only the entry matching each position's kind is used).
struct BroadcastArgs {
  std::vector<dualcast::Var> vars;
  std::vector<dualcast::Tensor> tensors;
  std::vector<double> numbers;
};

using ComboRun = std::vector<dualcast::Var> (*)(dualcast::Partials, const BroadcastArgs&);

struct Combo {
  const char* functor;
  fuzzref::Family family;
  std::string kinds;
  ComboRun run;
};

template <char Kind>
decltype(auto) combo_arg(const BroadcastArgs& a, std::size_t i) {
  if constexpr (Kind == 'V') return static_cast<const dualcast::Var&>(a.vars[i]);
  else if constexpr (Kind == 'T') return static_cast<const dualcast::Tensor&>(a.tensors[i]);
  else return a.numbers[i];
}

template <class F, char... K, std::size_t... I>
std::vector<dualcast::Var> run_combo_impl(dualcast::Partials p, const BroadcastArgs& a,
                                          std::index_sequence<I...>) {
  auto r = dualcast::broadcast(p, F{}, combo_arg<K>(a, I)...);
  if constexpr (std::is_same_v<decltype(r), dualcast::Var>) return {r};
  else return std::vector<dualcast::Var>(r.begin(), r.end());
}

template <class F, char... K>
std::vector<dualcast::Var> run_combo(dualcast::Partials p, const BroadcastArgs& a) {
  return run_combo_impl<F, K...>(p, a, std::make_index_sequence<sizeof...(K)>{});
}

template <class F, char... K>
Combo combo(const char* functor, fuzzref::Family family) {
  return {functor, family, std::string{K...}, &run_combo<F, K...>};
}

std::vector<Combo> combos_narrow();  // K = 1..3
std::vector<Combo> combos_middle();  // K = 3..7
std::vector<Combo> combos_wide();    // K = 7..10

inline std::vector<Combo> all_combos() {
  std::vector<Combo> all;
  for (auto part : {combos_narrow, combos_middle, combos_wide})
    for (auto& c : part()) all.push_back(std::move(c));
  return all;
}

}  // namespace fuzz
