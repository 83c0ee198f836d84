// combos_middle.cu: broadcast calls with K = 3..7 differentiated arguments (combos.hpp).
#include "combos.hpp"
#include "functors.hpp"

namespace fuzz {
using fuzzref::Family;

std::vector<Combo> combos_middle() {
  return {
      combo<BranchChain, 'T', 'T', 'V', 'V', 'V', 'V'>("BranchChain", Family::branch_chain),
      combo<BranchChain, 'V', 'N', 'V', 'T', 'V', 'V', 'V'>("BranchChain", Family::branch_chain),
      combo<BranchChain, 'V', 'V', 'V', 'V', 'V', 'V'>("BranchChain", Family::branch_chain),
      combo<EarlyExit, 'T', 'T', 'V', 'V', 'V', 'V'>("EarlyExit", Family::early_exit),
      combo<EarlyExit, 'V', 'V', 'V', 'V', 'V', 'V'>("EarlyExit", Family::early_exit),
      combo<PairOut, 'V', 'N', 'V', 'T', 'V', 'V', 'V'>("PairOut", Family::pair_out),
      combo<TripleOut, 'V', 'V', 'V'>("TripleOut", Family::triple_out),
      combo<TripleOut, 'V', 'V', 'V', 'V', 'V', 'V', 'V'>("TripleOut", Family::triple_out),
  };
}

}  // namespace fuzz
