// combos_narrow.cu: broadcast calls with K = 1..3 differentiated arguments (combos.hpp).
#include "combos.hpp"
#include "functors.hpp"

namespace fuzz {
using fuzzref::Family;

std::vector<Combo> combos_narrow() {
  return {
      combo<BranchChain, 'V'>("BranchChain", Family::branch_chain),
      combo<BranchChain, 'V', 'N'>("BranchChain", Family::branch_chain),
      combo<BranchChain, 'T', 'V'>("BranchChain", Family::branch_chain),
      combo<BranchChain, 'V', 'V'>("BranchChain", Family::branch_chain),
      combo<BranchChain, 'N', 'V', 'T', 'V'>("BranchChain", Family::branch_chain),
      combo<BranchChain, 'V', 'V', 'V'>("BranchChain", Family::branch_chain),
      combo<EarlyExit, 'V', 'N'>("EarlyExit", Family::early_exit),
      combo<EarlyExit, 'N', 'V', 'T', 'V'>("EarlyExit", Family::early_exit),
      combo<PairOut, 'V'>("PairOut", Family::pair_out),
      combo<PairOut, 'V', 'V'>("PairOut", Family::pair_out),
      combo<TripleOut, 'T', 'V'>("TripleOut", Family::triple_out),
  };
}

}  // namespace fuzz
