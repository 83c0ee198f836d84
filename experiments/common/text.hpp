// text.hpp: the drivers' printed text: one number in printf form (for tables and log lines built as
// std::string), and a progress line on stderr (flushed at once, so it interleaves with a child
// process's output in order).
#pragma once

#include <cstdio>
#include <iostream>
#include <string>

namespace dcexp {

/// snprintf(f, x) as a std::string, e.g. fmt("%.3f", ms).
inline std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

/// s and a newline on stderr, flushed.
inline void log_line(const std::string& s) { std::cerr << s << std::endl; }

}  // namespace dcexp
