// train_log_json.hpp: a character-LM run's log (charlm.hpp: TrainLog) as the JSON object every
// driver writes for it (hmlstm_experiment's workload e, hmlstm_dp).
#pragma once

#include "../common/json.hpp"
#include "charlm.hpp"

namespace hmlstm {

/// {"step", "train_bpc", "valid_bpc", "slope", "seconds", "train_seconds", "ms_per_step"}.
inline dcexp::json train_log_json(const TrainLog& l) {
  dcexp::json v = dcexp::json::object();
  v["step"] = l.step;
  v["train_bpc"] = l.train_bpc;
  v["valid_bpc"] = l.valid_bpc;
  v["slope"] = l.slope;
  v["seconds"] = l.seconds;
  v["train_seconds"] = l.train_seconds;
  v["ms_per_step"] = l.ms_per_step;
  return v;
}

}  // namespace hmlstm
