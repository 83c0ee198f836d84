// workload_steps.cu: the mixed-mode steps of workloads a and b (workloads.hpp), compiled once for the
// driver, bench_broadcast and profile_broadcast (the hmlstm_workloads library).
#include "workloads.hpp"

namespace hmexp {

Var forward_a_mixed(const CellSet& s, Partials p) {
  return dualcast::broadcast(p, CellUpdate{}, s.z, s.zb, s.x[0], s.x[1], s.x[2], s.x[3]);
}

Var step_a_mixed(const CellSet& s, Partials p) {
  Var out = forward_a_mixed(s, p);
  out.backward(s.adj[0]);
  return out;
}

std::array<Var, 2> step_b_mixed(const CellSet& s, Partials p) {
  auto out = dualcast::broadcast(p, Cell{}, s.z, s.zb, s.x[0], s.x[1], s.x[2], s.x[3], s.x[4], s.x[5]);
  backward_multi({out[0], out[1]}, s.adj);
  return out;
}

}  // namespace hmexp
