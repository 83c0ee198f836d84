// json_lite.hpp: a small JSON value (null, bool, number, string, array, object) with a strict parser
// and a writer, enough for the experiments' result files and for reading the peers' records.
// Header-only; no dependencies. Non-finite numbers are written as null (strict JSON), except a number
// made with raw_number (or parsed with keep_number_text), which is written exactly as its text.
#pragma once

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace dcexp::json {

class Value {
 public:
  enum class Kind { null, boolean, number, string, array, object };

  Value() = default;
  Value(std::nullptr_t) {}
  Value(bool b) : kind_(Kind::boolean), b_(b) {}
  Value(double d) : kind_(Kind::number), d_(d) {}
  Value(int i) : kind_(Kind::number), d_(i) {}
  Value(long i) : kind_(Kind::number), d_(static_cast<double>(i)) {}
  Value(long long i) : kind_(Kind::number), d_(static_cast<double>(i)) {}
  Value(unsigned long i) : kind_(Kind::number), d_(static_cast<double>(i)) {}
  Value(const char* s) : kind_(Kind::string), s_(s) {}
  Value(std::string s) : kind_(Kind::string), s_(std::move(s)) {}

  static Value array() {
    Value v;
    v.kind_ = Kind::array;
    return v;
  }
  static Value object() {
    Value v;
    v.kind_ = Kind::object;
    return v;
  }
  /// A number written exactly as `text` (a JSON number, or NaN / Infinity / -Infinity as Python's
  /// json module writes them): for values that must keep every digit, or a number read from a file
  /// and written back unchanged. Its value is strtod(text).
  static Value raw_number(std::string text) {
    Value v(std::strtod(text.c_str(), nullptr));
    v.text_ = std::move(text);
    return v;
  }

  [[nodiscard]] Kind kind() const { return kind_; }
  [[nodiscard]] bool is_null() const { return kind_ == Kind::null; }
  [[nodiscard]] bool is_number() const { return kind_ == Kind::number; }
  [[nodiscard]] bool is_string() const { return kind_ == Kind::string; }
  [[nodiscard]] bool is_array() const { return kind_ == Kind::array; }
  [[nodiscard]] bool is_object() const { return kind_ == Kind::object; }
  [[nodiscard]] bool is_bool() const { return kind_ == Kind::boolean; }

  [[nodiscard]] double number(double fallback = NAN) const { return kind_ == Kind::number ? d_ : fallback; }
  [[nodiscard]] bool boolean(bool fallback = false) const { return kind_ == Kind::boolean ? b_ : fallback; }
  [[nodiscard]] const std::string& str() const {
    static const std::string empty;
    return kind_ == Kind::string ? s_ : empty;
  }

  // arrays
  void push_back(Value v) {
    expect(Kind::array, "push_back");
    a_.push_back(std::move(v));
  }
  [[nodiscard]] std::size_t size() const { return kind_ == Kind::array ? a_.size() : kind_ == Kind::object ? o_.size() : 0; }
  [[nodiscard]] const Value& at(std::size_t i) const { return a_.at(i); }
  [[nodiscard]] const std::vector<Value>& items() const { return a_; }

  // objects (insertion order kept)
  Value& operator[](const std::string& key) {
    if (kind_ == Kind::null) kind_ = Kind::object;
    expect(Kind::object, "operator[]");
    for (auto& kv : o_)
      if (kv.first == key) return kv.second;
    o_.emplace_back(key, Value());
    return o_.back().second;
  }
  [[nodiscard]] const Value* find(const std::string& key) const {
    if (kind_ != Kind::object) return nullptr;
    for (const auto& kv : o_)
      if (kv.first == key) return &kv.second;
    return nullptr;
  }
  [[nodiscard]] const Value& get(const std::string& key) const {
    static const Value null_value;
    const Value* v = find(key);
    return v ? *v : null_value;
  }
  [[nodiscard]] const std::vector<std::pair<std::string, Value>>& members() const { return o_; }

  // ---- writing ----------------------------------------------------------------------------------
  void dump(std::ostream& os, int indent = 1, int depth = 0) const {
    const std::string pad = indent > 0 ? std::string(static_cast<std::size_t>(indent * (depth + 1)), ' ') : "";
    const std::string pad_end = indent > 0 ? std::string(static_cast<std::size_t>(indent * depth), ' ') : "";
    const char* nl = indent > 0 ? "\n" : "";
    switch (kind_) {
      case Kind::null: os << "null"; break;
      case Kind::boolean: os << (b_ ? "true" : "false"); break;
      case Kind::number:
        if (text_.empty()) write_number(os, d_);
        else os << text_;
        break;
      case Kind::string: write_string(os, s_); break;
      case Kind::array: {
        if (a_.empty()) {
          os << "[]";
          break;
        }
        // arrays of plain numbers on one line
        bool flat = true;
        for (const auto& v : a_) flat = flat && (v.kind_ != Kind::array && v.kind_ != Kind::object);
        os << "[";
        for (std::size_t i = 0; i < a_.size(); ++i) {
          if (i) os << (flat ? ", " : ",");
          if (!flat) os << nl << pad;
          a_[i].dump(os, indent, depth + 1);
        }
        if (!flat) os << nl << pad_end;
        os << "]";
        break;
      }
      case Kind::object: {
        if (o_.empty()) {
          os << "{}";
          break;
        }
        os << "{";
        for (std::size_t i = 0; i < o_.size(); ++i) {
          if (i) os << ",";
          os << nl << pad;
          write_string(os, o_[i].first);
          os << (indent > 0 ? ": " : ":");
          o_[i].second.dump(os, indent, depth + 1);
        }
        os << nl << pad_end << "}";
        break;
      }
    }
  }
  [[nodiscard]] std::string dumps(int indent = 1) const {
    std::ostringstream os;
    dump(os, indent);
    return os.str();
  }

  static void write_number(std::ostream& os, double d) {
    if (!std::isfinite(d)) {
      os << "null";
      return;
    }
    if (d == std::floor(d) && std::fabs(d) < 9.0e15) {
      os << static_cast<long long>(d);
      return;
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", d);
    os << buf;
  }
  static void write_string(std::ostream& os, const std::string& s) {
    os << '"';
    for (const unsigned char c : s) {
      switch (c) {
        case '"': os << "\\\""; break;
        case '\\': os << "\\\\"; break;
        case '\n': os << "\\n"; break;
        case '\r': os << "\\r"; break;
        case '\t': os << "\\t"; break;
        default:
          if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            os << buf;
          } else {
            os << c;
          }
      }
    }
    os << '"';
  }

 private:
  void expect(Kind k, const char* what) const {
    if (kind_ != k) throw std::logic_error(std::string("json::Value::") + what + ": wrong kind");
  }
  Kind kind_ = Kind::null;
  bool b_ = false;
  double d_ = 0;
  std::string text_;  // number: what is written for it (empty: formatted from d_)
  std::string s_;
  std::vector<Value> a_;
  std::vector<std::pair<std::string, Value>> o_;
};

// ---- parsing ----------------------------------------------------------------------------------------

class Parser {
 public:
  /// keep_number_text: every number keeps its source text (Value::raw_number), so a file read and
  /// written back keeps its numbers exactly as they were (NaN and Infinity included).
  explicit Parser(const std::string& text, bool keep_number_text = false)
      : t_(text), keep_number_text_(keep_number_text) {}
  Value parse() {
    Value v = value();
    ws();
    if (p_ != t_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("JSON parse error at offset " + std::to_string(p_) + ": " + what);
  }
  void ws() {
    while (p_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[p_]))) ++p_;
  }
  bool lit(const char* s) {
    const std::string l(s);
    if (t_.compare(p_, l.size(), l) == 0) {
      p_ += l.size();
      return true;
    }
    return false;
  }
  Value value() {
    ws();
    if (p_ >= t_.size()) fail("unexpected end");
    const char c = t_[p_];
    if (c == '{') return object();
    if (c == '[') return array();
    if (c == '"') return Value(string());
    if (lit("true")) return Value(true);
    if (lit("false")) return Value(false);
    if (lit("null")) return Value();
    // Python's json.dump default; accepted when reading
    if (lit("NaN")) return keep_number_text_ ? Value::raw_number("NaN") : Value(NAN);
    if (lit("Infinity")) return keep_number_text_ ? Value::raw_number("Infinity") : Value(INFINITY);
    if (lit("-Infinity")) return keep_number_text_ ? Value::raw_number("-Infinity") : Value(-INFINITY);
    return number();
  }
  Value number() {
    const std::size_t start = p_;
    if (t_[p_] == '-' || t_[p_] == '+') ++p_;
    while (p_ < t_.size() && (std::isdigit(static_cast<unsigned char>(t_[p_])) || t_[p_] == '.' ||
                              t_[p_] == 'e' || t_[p_] == 'E' || t_[p_] == '-' || t_[p_] == '+'))
      ++p_;
    if (p_ == start) fail("unexpected character");
    const std::string s = t_.substr(start, p_ - start);
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (end != s.c_str() + s.size()) fail("bad number '" + s + "'");
    return keep_number_text_ ? Value::raw_number(s) : Value(d);
  }
  std::string string() {
    ++p_;  // opening quote
    std::string out;
    while (true) {
      if (p_ >= t_.size()) fail("unterminated string");
      const char c = t_[p_++];
      if (c == '"') break;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (p_ >= t_.size()) fail("bad escape");
      const char e = t_[p_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          if (p_ + 4 > t_.size()) fail("bad \\u escape");
          unsigned cp = static_cast<unsigned>(std::stoul(t_.substr(p_, 4), nullptr, 16));
          p_ += 4;
          if (cp >= 0xD800 && cp <= 0xDBFF && p_ + 6 <= t_.size() && t_[p_] == '\\' && t_[p_ + 1] == 'u') {
            const unsigned lo = static_cast<unsigned>(std::stoul(t_.substr(p_ + 2, 4), nullptr, 16));
            p_ += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          // UTF-8 encode
          if (cp < 0x80) {
            out += static_cast<char>(cp);
          } else if (cp < 0x800) {
            out += static_cast<char>(0xC0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3F));
          } else if (cp < 0x10000) {
            out += static_cast<char>(0xE0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
          } else {
            out += static_cast<char>(0xF0 | (cp >> 18));
            out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
          }
          break;
        }
        default: fail("bad escape");
      }
    }
    return out;
  }
  Value array() {
    ++p_;
    Value a = Value::array();
    ws();
    if (p_ < t_.size() && t_[p_] == ']') {
      ++p_;
      return a;
    }
    while (true) {
      a.push_back(value());
      ws();
      if (p_ >= t_.size()) fail("unterminated array");
      if (t_[p_] == ',') {
        ++p_;
        continue;
      }
      if (t_[p_] == ']') {
        ++p_;
        return a;
      }
      fail("expected , or ]");
    }
  }
  Value object() {
    ++p_;
    Value o = Value::object();
    ws();
    if (p_ < t_.size() && t_[p_] == '}') {
      ++p_;
      return o;
    }
    while (true) {
      ws();
      if (p_ >= t_.size() || t_[p_] != '"') fail("expected a key");
      std::string key = string();
      ws();
      if (p_ >= t_.size() || t_[p_] != ':') fail("expected :");
      ++p_;
      o[key] = value();
      ws();
      if (p_ >= t_.size()) fail("unterminated object");
      if (t_[p_] == ',') {
        ++p_;
        continue;
      }
      if (t_[p_] == '}') {
        ++p_;
        return o;
      }
      fail("expected , or }");
    }
  }
  const std::string& t_;
  bool keep_number_text_ = false;
  std::size_t p_ = 0;
};

inline Value parse(const std::string& text, bool keep_number_text = false) {
  return Parser(text, keep_number_text).parse();
}

inline Value parse_file(const std::string& path, bool keep_number_text = false) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), keep_number_text);
}

inline void write_file(const std::string& path, const Value& v) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) throw std::runtime_error("cannot write " + tmp);
    v.dump(out, 1);
    out << "\n";
    if (!out) throw std::runtime_error("error writing " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error("cannot rename " + tmp + " to " + path);
}

}  // namespace dcexp::json
