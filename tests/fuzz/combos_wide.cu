// combos_wide.cu: broadcast calls with K = 7..10 differentiated arguments (combos.hpp).
#include "combos.hpp"
#include "functors.hpp"

namespace fuzz {
using fuzzref::Family;

std::vector<Combo> combos_wide() {
  return {
      combo<BranchChain, 'V', 'V', 'V', 'V', 'V', 'V', 'V'>("BranchChain", Family::branch_chain),
      combo<BranchChain, 'T', 'V', 'V', 'V', 'V', 'V', 'V', 'V', 'V', 'N'>("BranchChain", Family::branch_chain),
      combo<BranchChain, 'V', 'V', 'V', 'V', 'V', 'V', 'V', 'V', 'V'>("BranchChain", Family::branch_chain),
      combo<BranchChain, 'V', 'V', 'V', 'V', 'V', 'V', 'V', 'V', 'V', 'V', 'T', 'N'>("BranchChain", Family::branch_chain),
      combo<EarlyExit, 'T', 'V', 'V', 'V', 'V', 'V', 'V', 'V', 'V', 'N'>("EarlyExit", Family::early_exit),
      combo<EarlyExit, 'V', 'V', 'V', 'V', 'V', 'V', 'V', 'V', 'V', 'V', 'T', 'N'>("EarlyExit", Family::early_exit),
      combo<PairOut, 'V', 'V', 'V', 'V', 'V', 'V', 'V', 'V', 'V'>("PairOut", Family::pair_out),
      combo<TripleOut, 'V', 'V', 'V', 'V', 'V', 'V', 'V', 'V', 'V', 'V', 'T', 'N'>("TripleOut", Family::triple_out),
  };
}

}  // namespace fuzz
