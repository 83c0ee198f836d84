// test_network_util.hpp: what the HM-LSTM tests share (test_network.cu, test_gates.cu): a tiny
// network configuration and the device-parameterised fixture (tensors are compared with
// dualcast::array_error, gradcheck.hpp).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "dualcast/gradcheck.hpp"
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

inline std::string device_name_param(const ::testing::TestParamInfo<dualcast::Device>& info) {
  return dualcast::testing::device_label(info.param);
}

}  // namespace hmlstm::testing
