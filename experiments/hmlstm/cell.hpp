// cell.hpp: the HM-LSTM cell (c', h' from the flags and the gate pre-activations), written once and
// shared by workload b of the driver (workloads.hpp: hmexp::Cell / hmexp::CellSelect) and by the
// 3-layer network of workload e (network.hpp / network.cu: HmCell, reverse_cell).
//
// Two forms of the same math:
//   HmCell        the if-form functor (data-dependent control flow), for mixed mode: one broadcast,
//                 one fused forward and one fused backward kernel.
//   HmCellSelect  the select form on Vars, for pure reverse mode: one kernel and one tape node per
//                 primitive (the peers' cell_b / hm_pointwise).
#pragma once

#include <tuple>
#include <utility>

#include "dualcast/config.hpp"
#include "dualcast/math.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "dualcast/tape.hpp"
#include "dualcast/tensor.hpp"

namespace hmlstm {

/// The cell. z = z^l_{t-1}, zb = zb_l: plain 0/1 flags (Tensors or the number 1), never
/// differentiated; c, h: the previous state; f, i, o, g: gate pre-activations. Returns (c', h'),
/// both outputs from one kernel. Written with `auto` parameters, it runs on plain numbers (no
/// gradient needed) and on Dual<T, K> (Var arguments). Data-dependent control flow: only the taken
/// branch is evaluated, and in COPY rows the partials of c', h' are exactly those of c, h (the gate
/// pre-activations get zero gradient).
struct HmCell {
  // (namespace-scope functor: nvcc rejects generic __host__ __device__ lambdas)
  DUALCAST_HD auto operator()(auto z, auto zb, auto c, auto h, auto f, auto i, auto o,
                              auto g) const {
    using dualcast::sigmoid;
    using dualcast::tanh;
    using D = decltype(c * f);
    if (z == 1) {  // FLUSH
      const D cn = sigmoid(i) * tanh(g);
      return std::tuple<D, D>(cn, sigmoid(o) * tanh(cn));
    }
    if (zb == 0) return std::tuple<D, D>(c, h);  // COPY
    const D cn = sigmoid(f) * c + sigmoid(i) * tanh(g);  // UPDATE
    return std::tuple<D, D>(cn, sigmoid(o) * tanh(cn));
  }
};

/// The same cell in select form on Vars (pure reverse mode: one kernel and one tape node per
/// primitive; sig(i) * tanh(g) computed once). z, zb: 0/1 flags of the Vars' dtype, broadcastable
/// against them. Returns (c', h').
struct HmCellSelect {
  std::pair<dualcast::Var, dualcast::Var> operator()(const dualcast::Tensor& z,
                                                     const dualcast::Tensor& zb,
                                                     const dualcast::Var& c, const dualcast::Var& h,
                                                     const dualcast::Var& f, const dualcast::Var& i,
                                                     const dualcast::Var& o,
                                                     const dualcast::Var& g) const {
    using namespace dualcast;
    const Var ig = sigmoid(i) * tanh(g);
    const Tensor flush = z == 1.0;
    const Tensor keep = zb == 0.0;
    const Var c_new = select(flush, ig, select(keep, c, sigmoid(f) * c + ig));
    const Var h_cand = sigmoid(o) * tanh(c_new);
    const Var h_new = select(flush, h_cand, select(keep, h, h_cand));
    return {c_new, h_new};
  }
};

}  // namespace hmlstm
