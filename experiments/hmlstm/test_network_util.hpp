// test_network_util.hpp: what the HM-LSTM tests share (test_network.cu, test_gates.cu): a tiny
// network configuration, the relative difference of two tensors, and the device-parameterised fixture.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "network.hpp"
#include "../../tests/test_util.hpp"  // DUALCAST_SKIP_IF_UNAVAILABLE, all_devices(), device_label

namespace hmlstm::testing {

inline NetworkConfig tiny(dualcast::Device d, dualcast::DType dt = dualcast::DType::float64,
                          CellMode mode = CellMode::mixed) {
  NetworkConfig c;
  c.hidden = 8;
  c.batch = 3;
  c.seq = 5;
  c.vocab = 64;
  c.dtype = dt;
  c.device = d;
  c.seed = 3;
  c.mode = mode;
  return c;
}

/// max |got - want| / max |want| (absolute when want is all zeros).
inline double rel_err(const dualcast::Tensor& got, const dualcast::Tensor& want) {
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  double num = 0.0, den = 0.0;
  for (std::size_t j = 0; j < g.size(); ++j) {
    num = std::max(num, std::fabs(g[j] - w[j]));
    den = std::max(den, std::fabs(w[j]));
  }
  return den == 0.0 ? num : num / den;
}

inline std::string device_name_param(const ::testing::TestParamInfo<dualcast::Device>& info) {
  return dualcast::testing::device_label(info.param);
}

}  // namespace hmlstm::testing
