// hmlstm_update.hpp: the HM-LSTM cell update of Revels et al. 2018 as a user writes it (data-dependent
// if/else on dual numbers), the functor the broadcast tests and the CPU SIMD tests share.
#pragma once

#include "dualcast/math.hpp"

namespace dualcast::testing {

struct HmlstmUpdate {
  DUALCAST_HD auto operator()(auto z, auto zb, auto c, auto f, auto i, auto g) const {
    if (z == 1) return sigmoid(i) * tanh(g);       // FLUSH
    if (zb == 0) return c;                         // COPY
    return sigmoid(f) * c + sigmoid(i) * tanh(g);  // UPDATE
  }
};

}  // namespace dualcast::testing
