// cli.hpp: the command-line walk the experiment drivers share (hmlstm_experiment, mnist_train,
// ops_bench): options as `--opt value` or `--opt=value`, bad usage reported as a UsageError that the
// driver prints before exiting with status 2. Each driver keeps its own option table and value
// parsers; only the walk is common.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

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

}  // namespace dcexp::cli
