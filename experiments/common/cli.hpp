// cli.hpp: the command-line walk every experiment driver uses: options as `--opt value` or
// `--opt=value`, bad usage reported as a UsageError that the driver prints before exiting with status
// 2; the value parsers more than one driver spells the same way; and the main() around a driver's
// parse and run (the messages and exit statuses of docs/bad-input.md). Each driver keeps its own
// option table.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dualcast/device.hpp"
#include "dualcast/error.hpp"

namespace dcexp::cli {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Walks argv[1..argc) one option at a time:
///   ArgWalker args(argc, argv);
///   while (args.next()) { if (args.option() == "--n") n = parse(args.value()); ... }
class ArgWalker {
 public:
  ArgWalker(int argc, char** argv) : args_(argv + 1, argv + argc) {}

  /// Moves to the next argument; false after the last. `--opt=value` is split here, so option()
  /// never holds the value (only arguments starting with "--" are split: "-x=1" stays whole).
  bool next() {
    if (++i_ >= args_.size()) return false;
    opt_ = args_[i_];
    inline_.clear();
    has_inline_ = false;
    if (const auto eq = opt_.find('='); opt_.rfind("--", 0) == 0 && eq != std::string::npos) {
      inline_ = opt_.substr(eq + 1);
      opt_.resize(eq);
      has_inline_ = true;
    }
    return true;
  }

  [[nodiscard]] const std::string& option() const { return opt_; }

  /// The option's value: the part after '=' or the next argument (consumed).
  std::string value() {
    if (has_inline_) return inline_;
    if (i_ + 1 >= args_.size()) throw UsageError(opt_ + " needs a value");
    return args_[++i_];
  }

  /// For flags: a value given as `--flag=x` is an error rather than silently ignored.
  void no_value() const {
    if (has_inline_) throw UsageError(opt_ + " takes no value");
  }

 private:
  std::vector<std::string> args_;
  std::size_t i_ = static_cast<std::size_t>(-1);
  std::string opt_, inline_;
  bool has_inline_ = false;
};

// ---- values ------------------------------------------------------------------------------------

/// The comma-separated items of s, empty ones dropped ("a,,b," gives a, b).
inline std::vector<std::string> split_csv(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

/// s as an integer in [lo, hi]; otherwise a UsageError naming `opt`: "'s' is not an integer", "s is
/// outside [lo, hi]", or, without an upper bound, "s is below the minimum lo".
inline long long parse_int(const std::string& opt, const std::string& s, long long lo,
                           long long hi = LLONG_MAX) {
  std::size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size()) throw UsageError(opt + ": '" + s + "' is not an integer");
  if (hi == LLONG_MAX && v < lo)
    throw UsageError(opt + ": " + s + " is below the minimum " + std::to_string(lo));
  if (v < lo || v > hi)
    throw UsageError(opt + ": " + s + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

/// s as a number (any double stod reads, inf and nan included: the caller judges the range).
inline double parse_double(const std::string& opt, const std::string& s) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size()) throw UsageError(opt + ": '" + s + "' is not a number");
  return v;
}

/// --device cpu|cuda|cuda:K (Device::parse); a bad spelling, or a GPU that is not there, is a usage
/// error (status 2).
inline dualcast::Device parse_device(const std::string& s) {
  try {
    return dualcast::Device::parse(s);
  } catch (const dualcast::Error& e) {
    std::string m = e.what();
    if (m.rfind("dualcast: ", 0) == 0) m.erase(0, 10);
    throw UsageError("--device: " + m);
  }
}

// ---- main() ------------------------------------------------------------------------------------

/// run(), reported as the drivers do: a UsageError as "NAME: message", status 2; any other exception
/// as "NAME: error: message", status 1 (stdout flushed first, so that the message follows what the
/// run printed, as std::cerr would have it).
template <class Run>
int report_errors(const char* name, Run&& run) {
  try {
    return run();
  } catch (const UsageError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: error: %s\n", name, e.what());
    return 1;
  }
}

/// The front of a driver's main(): options = parse(argc, argv, help). Returns the exit status when
/// the driver is done: 2 after a UsageError (printed as "NAME: message" and a pointer to --help), 0
/// after printing `usage` for --help; -1 when `options` hold a command line to run.
template <class Options, class Parse>
int parse_command_line(const char* name, const char* usage, int argc, char** argv, Parse&& parse,
                       Options& options) {
  bool help = false;
  try {
    options = parse(argc, argv, help);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s\n(run %s --help for the options)\n", name, e.what(), name);
    return 2;
  }
  if (help) {
    std::fputs(usage, stdout);
    return 0;
  }
  return -1;
}

/// main() of a driver: parse_command_line, then report_errors(run(options)).
template <class Parse, class Run>
int driver_main(const char* name, const char* usage, int argc, char** argv, Parse&& parse, Run&& run) {
  bool help_unused = false;
  decltype(parse(argc, argv, help_unused)) options{};
  if (const int status = parse_command_line(name, usage, argc, argv, parse, options); status >= 0) return status;
  return report_errors(name, [&] { return run(options); });
}

}  // namespace dcexp::cli
