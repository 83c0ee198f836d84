// accuracy.cpp: the HM-LSTM step's accuracy at each float32 matmul precision (issue 30, item 6): the
// float32 step's loss and parameter gradients against the float64 step's, same parameters (the
// float32 values, exactly representable in float64) and tokens, one float32 step per precision.
// Host code only: it drives the network (network.hpp) and compares what comes back.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "dualcast/gradcheck.hpp"
#include "dualcast/precision.hpp"
#include "network.hpp"

namespace hmlstm {

using dualcast::DType;
using dualcast::Tensor;
using dualcast::Var;

namespace {
/// Puts the process's float32 matmul precision back however the study ends.
struct RestorePrecision {
  std::string was = dualcast::get_float32_matmul_precision();
  ~RestorePrecision() { dualcast::set_float32_matmul_precision(was); }
};
}  // namespace

std::vector<PrecisionAccuracy> precision_accuracy(const NetworkConfig& config, const Tensor& tokens,
                                                  const std::vector<std::string>& precisions) {
  NetworkConfig c32 = config, c64 = config;
  c32.dtype = DType::float32;
  c64.dtype = DType::float64;
  HmlstmNetwork net(c32), ref(c64);
  ref.load_params_from(net);  // float64 copies of the float32 values: both start from the same numbers
  Var l64 = ref.loss(tokens);
  l64.backward();
  const double loss64 = l64.item();
  const std::vector<std::uint8_t> flags64 = ref.boundary_flags();
  const std::vector<std::string> names = net.param_names();

  const RestorePrecision restore;
  std::vector<PrecisionAccuracy> out;
  for (const std::string& p : precisions) {
    dualcast::set_float32_matmul_precision(p);  // an unknown name is the library's Error
    net.zero_grad();
    Var l = net.loss(tokens);
    l.backward();
    PrecisionAccuracy a;
    a.precision = p;
    a.loss = l.item();
    a.loss_rel_err = std::isfinite(a.loss) ? std::fabs(a.loss - loss64) / std::max(std::fabs(loss64), 1e-300) : INFINITY;
    for (std::size_t k = 0; k < names.size(); ++k) {
      const Var& g = net.params()[k];
      const Var& g64 = ref.params()[k];
      double err;
      if (!g.has_grad() || !g64.has_grad()) err = g.has_grad() == g64.has_grad() ? 0.0 : INFINITY;
      else err = dualcast::array_error(g.grad(), g64.grad(), dualcast::ErrorScale::largest);
      a.grad_rel_err.emplace_back(names[k], err);
      if (a.worst_param.empty() || err > a.max_grad_rel_err) {
        a.max_grad_rel_err = std::max(a.max_grad_rel_err, err);
        a.worst_param = names[k];
      }
    }
    a.same_boundaries = net.boundary_flags() == flags64;
    out.push_back(std::move(a));
  }
  net.zero_grad();
  return out;
}

}  // namespace hmlstm
