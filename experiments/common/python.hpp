// python.hpp: what the drivers need to run a Python peer (peers.py, peer_torch.py) as a subprocess:
// an argument quoted for the shell, and the first interpreter that can import a module.
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

namespace dcexp {

/// s in single quotes for /bin/sh (a quote inside becomes '\'').
inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') q += "'\\''";
    else q += c;
  }
  return q + "'";
}

/// The first of `preferred` (when not empty), python3, /usr/bin/python3 that can import `module`;
/// "" when none can.
inline std::string find_python(const std::string& preferred, const std::string& module) {
  std::vector<std::string> cands;
  if (!preferred.empty()) cands.push_back(preferred);
  cands.push_back("python3");
  cands.push_back("/usr/bin/python3");
  for (const auto& c : cands) {
    const std::string cmd = shell_quote(c) + " -c 'import " + module + "' >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) return c;
  }
  return "";
}

}  // namespace dcexp
