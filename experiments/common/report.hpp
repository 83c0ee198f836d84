// report.hpp: what the experiment drivers' result files have in common: the UTC time of the run
// and a timing Summary (gpu_timing.hpp) as a JSON object (json.hpp).
#pragma once

#include <ctime>
#include <string>

#include "gpu_timing.hpp"
#include "json.hpp"

namespace dcexp {

/// Now, as 2026-11-22T05:52:35Z.
inline std::string iso_time() {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return buf;
}

/// {"median", "p10", "p90", "min", "max", "n"} of a Summary.
inline json summary_json(const Summary& s) {
  json v = json::object();
  v["median"] = s.median;
  v["p10"] = s.p10;
  v["p90"] = s.p90;
  v["min"] = s.min;
  v["max"] = s.max;
  v["n"] = s.n;
  return v;
}

}  // namespace dcexp
