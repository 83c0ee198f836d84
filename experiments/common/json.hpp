// json.hpp: the experiments' JSON (nlohmann-json), with the one reader and the one writer of every
// result file, manifest and peer record they read or write.
// ordered_json: members keep their insertion order, as the result files always have (readable diffs
// of committed results). Reading accepts the NaN / Infinity / -Infinity tokens Python's json module
// writes; writing gives strict JSON (a non-finite number is written as null).
#pragma once

#include <cstddef>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

namespace dcexp {

using json = nlohmann::ordered_json;

namespace json_detail {

// Stand-ins for Python's non-finite tokens, which nlohmann's parser rejects: a string nobody writes
// (it starts with a NUL), swapped back for the number after parsing.
inline const char* const kNonFinite[3][2] = {
    {"-Infinity", "\"\\u0000dcexp:-Infinity\""},
    {"Infinity", "\"\\u0000dcexp:Infinity\""},
    {"NaN", "\"\\u0000dcexp:NaN\""},
};

/// text with each NaN / Infinity / -Infinity token outside a string replaced by its stand-in;
/// false (text untouched) when there is none.
inline bool replace_nonfinite_tokens(std::string& text) {
  std::string out;
  bool in_string = false, found = false;
  std::size_t copied = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
      continue;
    }
    // Outside strings, N and I begin nothing else in JSON (literals are lower case; numbers use e/E).
    if (c != 'N' && c != 'I' && c != '-') continue;
    for (const auto& tok : kNonFinite) {
      const std::string t = tok[0];
      if (text.compare(i, t.size(), t) != 0) continue;
      out.append(text, copied, i - copied);
      out += tok[1];
      i += t.size() - 1;
      copied = i + 1;
      found = true;
      break;
    }
  }
  if (!found) return false;
  out.append(text, copied, std::string::npos);
  text = std::move(out);
  return true;
}

inline void restore_nonfinite(json& j) {
  if (j.is_structured()) {
    for (auto& v : j) restore_nonfinite(v);
    return;
  }
  if (!j.is_string()) return;
  const std::string& s = j.get_ref<const std::string&>();
  if (s.size() < 7 || s[0] != '\0' || s.compare(1, 6, "dcexp:") != 0) return;
  const std::string name = s.substr(7);
  const double inf = std::numeric_limits<double>::infinity();
  if (name == "NaN") j = std::numeric_limits<double>::quiet_NaN();
  else if (name == "Infinity") j = inf;
  else if (name == "-Infinity") j = -inf;
}

inline void write_value(std::ostream& os, const json& j, int depth) {
  // Strings: invalid UTF-8 (a path, a device name) is replaced, never a reason to lose the file.
  const auto leaf = [&](const json& v) { os << v.dump(-1, ' ', false, json::error_handler_t::replace); };
  const std::string pad(static_cast<std::size_t>(depth + 1), ' ');
  const std::string pad_end(static_cast<std::size_t>(depth), ' ');
  if (j.is_array()) {
    if (j.empty()) {
      os << "[]";
      return;
    }
    // An array of plain values (a curve, a shape) on one line.
    bool flat = true;
    for (const auto& v : j) flat = flat && !v.is_structured();
    os << "[";
    bool first = true;
    for (const auto& v : j) {
      if (!first) os << (flat ? ", " : ",");
      first = false;
      if (!flat) os << "\n" << pad;
      write_value(os, v, depth + 1);
    }
    if (!flat) os << "\n" << pad_end;
    os << "]";
  } else if (j.is_object()) {
    if (j.empty()) {
      os << "{}";
      return;
    }
    os << "{";
    bool first = true;
    for (const auto& [key, v] : j.items()) {
      if (!first) os << ",";
      first = false;
      os << "\n" << pad;
      leaf(json(key));
      os << ": ";
      write_value(os, v, depth + 1);
    }
    os << "\n" << pad_end << "}";
  } else {
    leaf(j);  // a non-finite number: null
  }
}

}  // namespace json_detail

// ---- lenient access to what another program wrote (a peer's records, a manifest) -----------------
// A missing member or one of another type gives the fallback (a non-finite number comes back as
// null from write_json_file, and as NaN from Python).

/// j[key] where j is an object holding key; else null.
inline const json& member(const json& j, const std::string& key) {
  static const json null_value;
  if (!j.is_object()) return null_value;
  const auto it = j.find(key);
  return it == j.end() ? null_value : *it;
}
inline double number_or(const json& v, double fallback = std::numeric_limits<double>::quiet_NaN()) {
  return v.is_number() ? v.get<double>() : fallback;
}
inline std::string string_or(const json& v, const std::string& fallback = {}) {
  return v.is_string() ? v.get<std::string>() : fallback;
}
inline bool bool_or(const json& v, bool fallback = false) { return v.is_boolean() ? v.get<bool>() : fallback; }

/// The JSON document in `path`. Throws std::runtime_error naming the file when it cannot be opened
/// or parsed.
inline json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw std::runtime_error("error reading " + path);
  std::string text = ss.str();
  const bool nonfinite = json_detail::replace_nonfinite_tokens(text);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw std::runtime_error("cannot parse JSON in " + path + ": " + e.what());
  }
  if (nonfinite) json_detail::restore_nonfinite(j);
  return j;
}

/// Writes `value` to `path` through path.tmp, renamed over path once complete (a reader never sees
/// half a file): indent 1, an array of plain values on one line, a final newline. Throws
/// std::runtime_error naming the file on failure.
inline void write_json_file(const std::string& path, const json& value) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) throw std::runtime_error("cannot write " + tmp);
    json_detail::write_value(out, value, 0);
    out << "\n";
    if (!out) throw std::runtime_error("error writing " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error("cannot rename " + tmp + " to " + path);
}

}  // namespace dcexp
