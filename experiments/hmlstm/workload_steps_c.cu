// workload_steps_c.cu: the mixed-mode step of workload c, the arity sweep (K = 1..10: ten broadcast
// instantiations), in a translation unit of its own so that it compiles beside workload_steps.cu.
#include <stdexcept>
#include <utility>

#include "workloads.hpp"

namespace hmexp {
namespace {

template <std::size_t... I>
Var arity_broadcast(Partials p, const std::vector<Var>& x, std::index_sequence<I...>) {
  return dualcast::broadcast(p, ArityProduct{}, x[I]...);
}

}  // namespace

Var step_c_mixed(const CellSet& s, Partials p) {
  Var out;
  switch (s.x.size()) {
    case 1: out = arity_broadcast(p, s.x, std::make_index_sequence<1>{}); break;
    case 2: out = arity_broadcast(p, s.x, std::make_index_sequence<2>{}); break;
    case 3: out = arity_broadcast(p, s.x, std::make_index_sequence<3>{}); break;
    case 4: out = arity_broadcast(p, s.x, std::make_index_sequence<4>{}); break;
    case 5: out = arity_broadcast(p, s.x, std::make_index_sequence<5>{}); break;
    case 6: out = arity_broadcast(p, s.x, std::make_index_sequence<6>{}); break;
    case 7: out = arity_broadcast(p, s.x, std::make_index_sequence<7>{}); break;
    case 8: out = arity_broadcast(p, s.x, std::make_index_sequence<8>{}); break;
    case 9: out = arity_broadcast(p, s.x, std::make_index_sequence<9>{}); break;
    case 10: out = arity_broadcast(p, s.x, std::make_index_sequence<10>{}); break;
    default: throw std::invalid_argument("step_c_mixed: arity must be 1..10");
  }
  out.backward(s.adj[0]);
  return out;
}

}  // namespace hmexp
