// driver_util.hpp: what the two drivers of experiments/transformer (transformer_experiment,
// attention_bench) share: device choice, list parsing, and running the PyTorch peer
// (peer_torch.py) as a subprocess whose JSON they read back.
#pragma once

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "common/cli.hpp"
#include "common/json.hpp"
#include "common/python.hpp"
#include "dualcast/device.hpp"

#ifndef DCEXP_SOURCE_DIR
#define DCEXP_SOURCE_DIR "."
#endif

namespace transformer::driver {

using dcexp::cli::split_csv;
using dcexp::find_python;
using dcexp::shell_quote;

/// A positive integer option value (UsageError otherwise).
inline long long positive(const std::string& opt, const std::string& v, bool allow_zero = false) {
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || x < (allow_zero ? 0 : 1))
    throw dcexp::cli::UsageError(opt + ": expected a " + (allow_zero ? "non-negative" : "positive") +
                                 " integer, got '" + v + "'");
  return x;
}

inline double positive_real(const std::string& opt, const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !(x > 0) || !std::isfinite(x))
    throw dcexp::cli::UsageError(opt + ": expected a positive number, got '" + v + "'");
  return x;
}

/// --device auto|cpu|cuda; a CUDA request without a device is a UsageError (exit 2).
inline dualcast::Device pick_device(const std::string& name) {
  if (name == "cpu") return dualcast::Device::cpu();
  if (name == "cuda") {
    if (!dualcast::cuda_available())
      throw dcexp::cli::UsageError(std::string("--device cuda: ") +
                                   (DUALCAST_WITH_CUDA ? "no CUDA device is available"
                                                       : "this build has no CUDA backend"));
    return dualcast::Device::cuda(0);
  }
  if (name != "auto") throw dcexp::cli::UsageError("--device: expected auto, cpu or cuda, got '" + name + "'");
  return dualcast::cuda_available() ? dualcast::Device::cuda(0) : dualcast::Device::cpu();
}

/// Runs experiments/transformer/peer_torch.py with `args` (already quoted) and --out JSON; returns
/// the parsed JSON, or an object {"skipped": reason} when python/torch is missing or it failed.
inline dcexp::json run_peer(const std::string& python, const std::string& args, const std::string& json_path) {
  using dcexp::json;
  json skipped = json::object();
  const std::string py = find_python(python, "torch");
  if (py.empty()) {
    skipped["skipped"] = "no python3 with torch";
    std::cerr << "peers: skipped: no python3 with torch\n";
    return skipped;
  }
  std::error_code ec;
  std::filesystem::remove(json_path, ec);
  const std::string cmd = shell_quote(py) + " " +
                          shell_quote(std::string(DCEXP_SOURCE_DIR) + "/experiments/transformer/peer_torch.py") +
                          " " + args + " --out " + shell_quote(json_path);
  std::cerr << "peers: " << cmd << "\n";
  const int rc = std::system(cmd.c_str());
  if (rc != 0 || !std::filesystem::exists(json_path)) {
    skipped["skipped"] = "peer_torch.py exited with status " + std::to_string(rc);
    return skipped;
  }
  try {
    return dcexp::read_json_file(json_path);
  } catch (const std::exception& e) {
    skipped["skipped"] = std::string("unreadable peer output: ") + e.what();
    return skipped;
  }
}

}  // namespace transformer::driver
