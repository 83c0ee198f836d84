// test_bad_input.cu: the table of misuses behind docs/bad-input.md. Each row is code a user might
// write (kept as the code that runs: the macro below stringifies it), run on every device: it must
// raise a dualcast::Error whose message holds the row's words (the op, the argument, the shapes), and
// right after it a small training step must still give the right answer. The markdown table is this
// table's messages as seen on the CPU, plus the experiment drivers' command-line rows of
// experiments/common/bad_command_lines.txt (checked by the <driver>.rejects_* ctests); a test fails
// when docs/bad-input.md differs. To rewrite the file after changing a message or a row:
//     DUALCAST_WRITE_BAD_INPUT_DOC=1 build/cpu-only/tests/test_bad_input --gtest_filter='BadInputDoc.*'
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "dualcast/dualcast.hpp"
#include "test_util.hpp"

#ifndef DUALCAST_SOURCE_DIR
#error "tests are built with DUALCAST_SOURCE_DIR (tests/CMakeLists.txt)"
#endif

// An impossible host allocation is one of the rows; under AddressSanitizer it would abort instead of
// returning null.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }

namespace dualcast {

/// The broadcast function of the table's rows (namespace scope: it runs on the GPU too).
struct Square {
  DUALCAST_HD auto operator()(auto a, auto b) const { return a * a + b; }
};

namespace {

const std::string kDataDir = std::string(DUALCAST_SOURCE_DIR) + "/tests/data";

/// What every row may use; made afresh (on the row's device) for every row.
struct Fixtures {
  explicit Fixtures(Device dev)
      : d(dev),
        x(Tensor::randn({2, 3}, dev, 1)),
        y(Tensor::randn({4, 3}, dev, 2)),
        x64(Tensor::randn({2, 3}, dev, 3, DType::float64)),
        p(Var::param(x.clone())),
        q(Var::param(y.clone())),
        labels(Tensor::from_vector<int>({2}, {0, 2}, dev)),
        dl(to_dlpack(x), [](dlpack::DLManagedTensor* m) { m->deleter(m); }) {}
  Device d;
  Tensor x, y, x64;
  Var p, q;
  Tensor labels;
  std::string data_dir = kDataDir;
  /// x handed out through DLPack, for the rows that take it back altered: a tensor from_dlpack
  /// refuses stays its caller's, so it is released here.
  std::unique_ptr<dlpack::DLManagedTensor, void (*)(dlpack::DLManagedTensor*)> dl;
};

struct BadInput {
  const char* area;
  std::string code;                           ///< what the user did (the code that runs)
  std::function<void(Fixtures&)> run;         ///< must throw dualcast::Error
  std::vector<std::string> says;              ///< words the message must hold: op, argument, shape
  bool per_device = true;                     ///< false: host-only (files), run once, on the CPU
};

std::vector<std::string> S(std::initializer_list<const char*> words) { return {words.begin(), words.end()}; }

#define DC_BIND                                                                             \
  [[maybe_unused]] const Device d = fx.d;                                                 \
  [[maybe_unused]] const Tensor &x = fx.x, &y = fx.y, &x64 = fx.x64, &labels = fx.labels; \
  [[maybe_unused]] Var &p = fx.p, &q = fx.q;                                                \
  [[maybe_unused]] const std::string& data_dir = fx.data_dir;                            \
  [[maybe_unused]] auto& dl = fx.dl
/// A row: area, the words, then the code: an expression (DC_ROW, DC_HOST_ROW: run once, on the
/// CPU) or statements (DC_STMTS).
#define DC_ROW(area, says, ...) \
  BadInput { area, #__VA_ARGS__, [](Fixtures& fx) { DC_BIND; (void)(__VA_ARGS__); }, says }
#define DC_STMTS(area, says, ...) \
  BadInput { area, #__VA_ARGS__, [](Fixtures& fx) { DC_BIND; __VA_ARGS__; }, says }
#define DC_HOST_ROW(area, says, ...) \
  BadInput { area, #__VA_ARGS__, [](Fixtures& fx) { DC_BIND; (void)(__VA_ARGS__); }, says, false }

std::vector<BadInput> bad_inputs() {
  return {
      // ---- tensors -------------------------------------------------------------------------------
      DC_ROW("tensor", S({"Tensor::empty", "[4611686018427387904, 4611686018427387904]", "64-bit"}),
             Tensor::empty({1LL << 62, 1LL << 62})),
      DC_ROW("tensor", S({"Tensor::zeros", "[-1, 3]", "negative dimension"}), Tensor::zeros({-1, 3})),
      DC_ROW("tensor", S({"Tensor::empty", "[281474976710656]", "out of", "memory", "bytes"}),
             Tensor::empty({1LL << 48}, DType::float32, d)),
      DC_ROW("tensor", S({"Tensor::zeros", "[274877906944]", "out of", "memory", "bytes"}),
             Tensor::zeros({1LL << 38}, DType::float32, d)),
      DC_ROW("tensor", S({"from_vector", "3 values", "[2, 3]"}), Tensor::from_vector<float>({2, 3}, {1, 2, 3}, d)),
      DC_ROW("tensor", S({"view", "[2, 3]", "[4, 2]"}), x.view({4, 2})),
      DC_ROW("tensor", S({"item", "[2, 3]", "6 elements"}), x.item()),
      DC_ROW("tensor", S({"Tensor::data", "float64", "float32", "[2, 3]"}), x.data<double>()),
      DC_ROW("tensor", S({"copy_", "Tensor[4, 3]", "Tensor[2, 3]"}), Tensor(x).copy_(y)),
      DC_ROW("tensor", S({"Tensor::clone", "'self'", "undefined"}), Tensor().clone()),
      DC_ROW("tensor", S({"uniform", "lo=1", "hi=0"}), Tensor::uniform({2}, d, 1, 1.0, 0.0)),
      DC_ROW("tensor", S({"bernoulli", "p=1.5"}), Tensor::bernoulli({2}, 1.5, d, 1)),
      DC_ROW("tensor", S({"arange", "step=0"}), Tensor::arange(0.0, 10.0, 0.0)),
      DC_ROW("tensor", S({"fill_", "100000", "float16", "65504", "[2, 3]"}),
             Tensor::full({2, 3}, 1e5, DType::float16, d)),
      // ---- DLPack ----------------------------------------------------------------------------------
      DC_STMTS("dlpack", S({"from_dlpack", "strides [1, 2]", "[2, 3]", "not contiguous"}),
               dl->dl_tensor.strides[0] = 1; dl->dl_tensor.strides[1] = 2; Tensor t = from_dlpack(dl.get());
               (void)dl.release()),
      DC_STMTS("dlpack", S({"from_dlpack", "int32", "float32, float64"}),
               dl->dl_tensor.dtype = {dlpack::kDLInt, 32, 1}; Tensor t = from_dlpack(dl.get()); (void)dl.release()),
      // ---- broadcast (mixed mode) ------------------------------------------------------------------
      DC_ROW("broadcast", S({"broadcast", "'#0'", "[2, 3]", "'#1'", "[4, 3]"}), broadcast(Square{}, p, y)),
      DC_ROW("broadcast", S({"broadcast", "float64", "float32", "[2, 3]"}), broadcast(Square{}, p, x64)),
      DC_ROW("broadcast", S({"broadcast", "float64", "bfloat16", "[2, 3]"}),
             broadcast(Square{}, Var::param(x.to(DType::bfloat16)), x64)),
      DC_ROW("broadcast", S({"broadcast", "argument #1", "undefined Var"}), broadcast(Square{}, p, Var())),
      DC_ROW("broadcast", S({"broadcast", "plain numbers"}), broadcast(Square{}, 1.0f, 2.0f)),
      DC_ROW("broadcast", S({"broadcast", "[0, 1099511627776, 1099511627776]", "64-bit"}),
             broadcast(Square{}, Var::param(Tensor::zeros({0, 1LL << 40, 1}, DType::float32, d)),
                       Tensor::zeros({0, 1, 1LL << 40}, DType::float32, d))),
      // ---- the tape --------------------------------------------------------------------------------
      DC_ROW("tape", S({"Var::grad", "[2, 3]", "constant"}), Var(x).grad()),
      DC_ROW("tape", S({"Var::grad", "[2, 3]", "no gradient"}), p.grad()),
      DC_ROW("tape", S({"backward", "[2, 3]", "non-scalar"}), (p * 2.0).backward()),
      DC_ROW("tape", S({"backward", "grad_output", "[4, 3]", "[2, 3]"}), (p * 2.0).backward(y)),
      DC_ROW("tape", S({"backward", "[]", "does not require a gradient"}), sum(Var(x)).backward()),
      DC_STMTS("tape", S({"backward", "already freed", "retain_graph"}),
             Var l = sum(p * p); l.backward(); l.backward()),
      DC_ROW("tape", S({"Var::param", "uint8", "[2, 3]"}), Var::param(Tensor::zeros({2, 3}, DType::uint8, d))),
      DC_ROW("tape", S({"Var::param", "'value'", "undefined"}), Var::param(Tensor())),
      DC_ROW("tape", S({"Var::value", "undefined"}), Var().value()),
      // ---- ops -------------------------------------------------------------------------------------
      DC_ROW("ops", S({"operator+", "'a'", "[2, 3]", "'b'", "[4, 3]", "dimension -2"}), p + q),
      DC_ROW("ops", S({"operator*", "'b'", "undefined Var"}), p * Var()),
      DC_ROW("ops", S({"operator-", "float32", "float64", "[2, 3]"}), p - Var(x64)),
      DC_ROW("ops", S({"select", "'mask'", "float64", "float32"}),
             select(Tensor::ones({2, 3}, DType::float64, d), p, p)),
      DC_ROW("ops", S({"fma", "'c'", "[4, 3]", "[2, 3]"}), fma(p, p, q)),
      DC_ROW("ops", S({"matmul", "inner dimensions", "[2, 3]", "[4, 3]"}), matmul(p, q)),
      DC_ROW("ops", S({"matmul", "'a'", "[3]", "rank 1"}), matmul(Tensor::ones({3}, DType::float32, d), y)),
      DC_ROW("ops", S({"matmul", "batch", "[2, 2, 3]", "[3, 3, 4]"}),
             matmul(Tensor::ones({2, 2, 3}, DType::float32, d), Tensor::ones({3, 3, 4}, DType::float32, d))),
      DC_ROW("ops", S({"matmul", "dtypes", "float32", "float64"}), matmul(p, transpose(Var(x64)))),
      DC_ROW("ops", S({"matmul", "dtypes", "bfloat16", "float32", "[2, 3]", "[3, 4]"}),
             matmul(Var(x.to(DType::bfloat16)), transpose(q))),
      DC_ROW("precision", S({"matmul_rounded", "'dtype'", "float32", "bfloat16 or float16"}),
             matmul_rounded(x, transpose(y), DType::float32)),
      DC_ROW("precision", S({"matmul_rounded", "'a' [2, 3]", "float64", "float32 or bfloat16"}),
             matmul_rounded(x64, transpose(y), DType::bfloat16)),
      DC_ROW("precision", S({"set_float32_matmul_precision", "'fastest'", "\"highest\"", "\"medium\""}),
             set_float32_matmul_precision("fastest")),
      DC_ROW("precision", S({"Autocast", "float32", "bfloat16 or float16"}), Autocast(DType::float32)),
      DC_ROW("precision", S({"GradScaler::update", "no optimizer"}), GradScaler(d).update()),
      DC_ROW("ops", S({"conv2d", "channel mismatch", "[1, 4, 4, 3]", "[2, 3, 3, 4]", "layout nhwc"}),
             conv2d(Tensor::ones({1, 4, 4, 3}, DType::float32, d), Tensor::ones({2, 3, 3, 4}, DType::float32, d),
                    {.layout = ConvLayout::nhwc})),
      DC_ROW("ops", S({"channel_broadcast", "different dtypes", "float64", "bfloat16", "may also be float32"}),
             channel_broadcast(ChannelOptions{.keep_activation_dtype = true}, BatchNormRelu{}, Var(x.to(DType::bfloat16)),
                               Tensor::ones({3}, DType::float64, d), Tensor::ones({3}, DType::float32, d),
                               Tensor::ones({3}, DType::float32, d), Tensor::ones({3}, DType::float32, d))),
      DC_ROW("ops", S({"reshape", "[2, 3]", "[4, 2]"}), reshape(p, {4, 2})),
      DC_ROW("ops", S({"reshape", "more than one -1", "[2, 3]"}), reshape(p, {-1, -1})),
      DC_ROW("ops", S({"permute", "[0, 0]", "[2, 3]"}), permute(p, {0, 0})),
      DC_ROW("ops", S({"transpose", "[3]", "rank 1"}), transpose(Var(Tensor::ones({3}, DType::float32, d)))),
      DC_ROW("ops", S({"slice", "[1, 5)", "axis 1", "[2, 3]"}), slice(p, 1, 1, 5)),
      DC_ROW("ops", S({"concat", "'xs[1]'", "[4, 3]", "[2, 3]", "axis 1"}), concat({p, q}, 1)),
      DC_ROW("ops", S({"concat", "empty list"}), concat(std::vector<Var>{}, 0)),
      DC_ROW("ops", S({"split", "{1, 1}", "sum to 2", "[2, 3]"}), split(p, 1, {1, 1})),
      DC_ROW("ops", S({"broadcast_to", "[2, 3]", "[4, 3]"}), broadcast_to(p, Shape{4, 3})),
      DC_ROW("ops", S({"sum", "axis 2", "[2, 3]"}), sum(p, 2)),
      DC_ROW("ops", S({"mean", "axis -1", "twice", "[2, 3]"}), mean(p, {1, -1})),
      DC_ROW("ops", S({"amax", "empty dimension", "[0, 3]"}), amax(Var::param(Tensor::zeros({0, 3}, DType::float32, d)), 0)),
      DC_ROW("ops", S({"sum_to", "[2, 3]", "[4, 3]"}), sum_to(p, Shape{4, 3})),
      DC_ROW("ops", S({"sum", "uint8", "[2, 3]"}), sum(Tensor::zeros({2, 3}, DType::uint8, d))),
      // ---- losses ----------------------------------------------------------------------------------
      DC_ROW("losses", S({"softmax", "axis 2", "[2, 3]"}), softmax(p, 2)),
      DC_ROW("losses", S({"cross_entropy", "labels", "[4]", "[2, 3]"}),
             cross_entropy(p, Tensor::zeros({4}, DType::float32, d))),
      DC_ROW("losses", S({"cross_entropy", "label 3", "position 1", "[0, 3)", "[2, 3]"}),
             cross_entropy(p, Tensor::from_vector<int>({2}, {0, 3}, d))),
      DC_ROW("losses", S({"cross_entropy", "label 0.5", "[2, 3]"}),
             cross_entropy(p, Tensor::from_vector<float>({2}, {0.5f, 1.0f}, d))),
      DC_ROW("losses", S({"cross_entropy", "logits", "[2, 3, 1]"}), cross_entropy(reshape(p, {2, 3, 1}), labels)),
      DC_ROW("losses", S({"mse", "[2, 3]", "[4, 3]"}), mse(p, q)),
      DC_ROW("losses", S({"mse", "[2]", "[2, 1]"}), mse(sum(p, 1), sum(p, 1, true))),
      // ---- optimizers ------------------------------------------------------------------------------
      DC_ROW("optimizers", S({"SGD", "parameter list is empty"}), SGD({}, 0.1)),
      DC_ROW("optimizers", S({"SGD", "learning rate", "-0.1"}), SGD({p}, -0.1)),
      DC_ROW("optimizers", S({"SGD", "parameter 0", "[2, 3]", "gradient"}), SGD({Var(x)}, 0.1)),
      DC_ROW("optimizers", S({"SGD", "parameter 1", "[2, 3]", "twice"}), SGD({p, p}, 0.1)),
      DC_ROW("optimizers", S({"SGD", "momentum", "1"}), SGD({p}, 0.1, 1.0)),
      DC_ROW("optimizers", S({"Adam", "beta1", "1"}), Adam({p}, 1e-3, 1.0)),
      DC_ROW("optimizers", S({"Adam", "eps", "0"}), Adam({p}, 1e-3, 0.9, 0.999, 0.0)),
      DC_STMTS("optimizers", S({"Adam", "learning rate", "nan"}), Adam opt({p}); opt.set_lr(NAN)),
      // ---- data loading ----------------------------------------------------------------------------
      DC_HOST_ROW("data", S({"read_idx", "/nonexistent/train-images-idx3-ubyte", "no such file"}),
                  data::read_idx("/nonexistent/train-images-idx3-ubyte")),
      DC_HOST_ROW("data", S({"read_idx", "'labels'", "magic"}), data::parse_idx({0x12, 0x34, 0x08, 0x01}, "labels")),
      DC_HOST_ROW("data", S({"read_idx", "'labels'", "type code"}), data::parse_idx({0, 0, 0x07, 0x01}, "labels")),
      DC_HOST_ROW("data", S({"read_idx", "'labels'", "5"}),
                  data::parse_idx({0, 0, 0x08, 0x01, 0, 0, 0, 5, 1, 2}, "labels")),
      DC_HOST_ROW("data", S({"read_idx", "'images.gz'", "gzip"}),
                  data::parse_idx({0x1f, 0x8b, 0x08, 0x00, 0x01}, "images.gz")),
      DC_HOST_ROW("data", S({"load_fashion_mnist", "/nonexistent/fmnist", "does not exist"}),
                  data::load_fashion_mnist("/nonexistent/fmnist", true)),
      DC_HOST_ROW("data", S({"load", "image count 8", "label count 7", "bad-count-mnist"}),
                  data::load_idx_pair(data_dir + "/bad-count-mnist/train-images-idx3-ubyte",
                                      data_dir + "/bad-count-mnist/train-labels-idx1-ubyte")),
      DC_HOST_ROW("data", S({"load", "20x20", "28x28", "bad-size-mnist"}),
                  data::load_fashion_mnist(data_dir + "/bad-size-mnist", true)),
      DC_HOST_ROW("data", S({"load", "t10k-images-idx3-ubyte", "tried"}),
                  data::find_idx_file(data_dir, "t10k-images-idx3-ubyte")),
      // ---- devices -------------------------------------------------------------------------------
      DC_HOST_ROW("device", S({"Device::parse", "'tpu'", "cpu, cuda or cuda:N"}), Device::parse("tpu")),
      DC_HOST_ROW("device", S({"Device::parse", "'cuda:one'", "cpu, cuda or cuda:N"}), Device::parse("cuda:one")),
  };
}

#undef DC_HOST_ROW
#undef DC_STMTS
#undef DC_ROW
#undef DC_BIND

/// One training step of a small regression, on `dev`: the "right answer" checked after every error.
double train_step_loss(Device dev) {
  const Var w = Var::param(Tensor::from_vector<double>({3, 2}, {0.5, -0.25, 0.125, 1.0, -0.5, 0.75}, dev));
  const Tensor in = Tensor::from_vector<double>({4, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, dev);
  const Tensor target = Tensor::from_vector<double>({4, 2}, {1, 0, 0, 1, 1, 1, 0, 0}, dev);
  SGD opt({w}, 0.01);
  const Var h = broadcast(Square{}, matmul(in, w), 0.5);
  mse(h, target).backward();
  opt.step();
  NoGradGuard no_grad;
  return mse(broadcast(Square{}, matmul(in, w), 0.5), target).item();
}

/// The message without its trailing " [src/file.cpp:123]" and with this checkout's paths made
/// relative, as the table shows it.
std::string normalize(std::string msg) {
  msg = std::regex_replace(msg, std::regex(R"( \[[A-Za-z0-9_./-]+:[0-9]+\]$)"), "");
  for (std::string::size_type at; (at = msg.find(std::string(DUALCAST_SOURCE_DIR) + "/")) != std::string::npos;)
    msg.erase(at, std::string(DUALCAST_SOURCE_DIR).size() + 1);
  return msg;
}

/// Runs a row; returns its (normalized) message, or records a failure.
std::string run_row(const BadInput& row, Device dev) {
  Fixtures fx(dev);
  try {
    row.run(fx);
  } catch (const Error& e) {
    return normalize(e.what());
  } catch (const std::exception& e) {
    ADD_FAILURE() << row.code << ": threw a non-dualcast exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << row.code << ": raised no error";
  return {};
}

class BadInputTable : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override { DUALCAST_SKIP_IF_UNAVAILABLE(GetParam()); }
};

TEST_P(BadInputTable, EveryMisuseIsAnErrorNamingOpArgumentAndShapeAndTheLibraryKeepsWorking) {
  const Device dev = GetParam();
  const double want = train_step_loss(dev);
  ASSERT_TRUE(std::isfinite(want));
  const auto rows = bad_inputs();
  EXPECT_GE(rows.size(), 40u);
  for (const BadInput& row : rows) {
    if (!row.per_device && dev.is_cuda()) continue;
    const std::string msg = run_row(row, dev);
    for (const std::string& w : row.says)
      EXPECT_NE(msg.find(w), std::string::npos) << row.code << ": '" << w << "' is not in: " << msg;
    EXPECT_EQ(msg.rfind("dualcast: ", 0), 0u) << row.code << ": " << msg;
    // The library keeps working: the same training step gives the same loss.
    EXPECT_LE(relative_error(train_step_loss(dev), want), 1e-12) << "after " << row.code;
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, BadInputTable, ::testing::ValuesIn(testing::all_devices()),
                         [](const auto& info) { return std::string(testing::device_label(info.param)); });

// ---- docs/bad-input.md ---------------------------------------------------------------------------

/// A markdown code span holding s (| escaped for the table).
std::string code_span(const std::string& s) {
  std::string body;
  for (char c : s) body += c == '|' ? std::string("\\|") : std::string(1, c);
  const std::string fence = body.find('`') != std::string::npos ? "``" : "`";
  return fence + (fence.size() > 1 ? " " : "") + body + (fence.size() > 1 ? " " : "") + fence;
}

struct DriverRow {
  std::string driver, name, status, line, args;
};

/// The rows of experiments/common/bad_command_lines.txt (the format cmake/DriverRejections.cmake
/// reads).
std::vector<DriverRow> driver_rows() {
  const std::string path = std::string(DUALCAST_SOURCE_DIR) + "/experiments/common/bad_command_lines.txt";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::vector<DriverRow> rows;
  const std::regex re(R"(^([^|]+) \| ([^|]+) \| ([0-9]+) \| (.+) \| (.*)$)");
  for (std::string l; std::getline(in, l);) {
    if (l.empty() || l[0] == '#') continue;
    std::smatch m;
    if (!std::regex_match(l, m, re)) {
      ADD_FAILURE() << path << ": malformed row: " << l;
      continue;
    }
    const auto data = [](std::string s) { return std::regex_replace(s, std::regex("@DATA@"), "tests/data"); };
    rows.push_back({m[1], m[2], m[3], data(m[4]), data(m[5])});
  }
  return rows;
}

/// A message as the table shows it: counts that depend on the run or the machine (the allocator's
/// statistics in an out-of-memory message) become N.
std::string for_doc(std::string msg) {
  const auto at = msg.find("statistics: ");
  if (at != std::string::npos)
    msg = msg.substr(0, at) + std::regex_replace(msg.substr(at), std::regex("[0-9]+"), "N");
  return msg;
}

std::string render_doc() {
  std::ostringstream os;
  os << "# Bad input: what dualcast says\n\n"
     << "Every row is checked by a test, and this file is generated: the library rows by\n"
     << "`tests/test_bad_input.cu` (each misuse must raise a `dualcast::Error` naming the op, the\n"
     << "argument and the shapes, and a training step right after it must give the same loss as\n"
     << "before, on the CPU and on a CUDA device), the command-line rows from\n"
     << "`experiments/common/bad_command_lines.txt` by the `<driver>.rejects_*` ctests (exit status and\n"
     << "message). Messages are shown as on the CPU, without the `[src/file:line]` that ends each one.\n"
     << "After changing a message or a row, rewrite this file with\n"
     << "`DUALCAST_WRITE_BAD_INPUT_DOC=1 build/cpu-only/tests/test_bad_input --gtest_filter='BadInputDoc.*'`.\n\n"
     << "In the code, `d` is the device, `x` a float32 tensor of shape [2, 3], `y` one of shape [4, 3],\n"
     << "`x64` a float64 tensor of shape [2, 3], `p = Var::param(x.clone())`, `q = Var::param(y.clone())`,\n"
     << "`labels` the class indices {0, 2}, `data_dir` the folder `tests/data`, `dl` a\n"
     << "`std::unique_ptr` holding `to_dlpack(x)`, and `Square` the broadcast function `a * a + b`.\n\n"
     << "| # | area | what the user did | what dualcast says |\n"
     << "|---|---|---|---|\n";
  int n = 0;
  for (const BadInput& row : bad_inputs())
    os << "| " << ++n << " | " << row.area << " | " << code_span(row.code) << " | "
       << code_span(for_doc(run_row(row, Device::cpu()))) << " |\n";
  for (const DriverRow& r : driver_rows())
    os << "| " << ++n << " | command line | " << code_span(r.driver + " " + r.args) << " | "
       << code_span(r.line) << " (exit status " << r.status << ") |\n";
  return os.str();
}

TEST(BadInputDoc, DocsBadInputMdIsTheTableOfTheseTests) {
  const std::string path = std::string(DUALCAST_SOURCE_DIR) + "/docs/bad-input.md";
  const std::string doc = render_doc();
  if (const char* w = std::getenv("DUALCAST_WRITE_BAD_INPUT_DOC"); w && std::string(w) == "1") {
    std::ofstream(path) << doc;
    std::printf("wrote %s\n", path.c_str());
  }
  std::ifstream in(path);
  std::stringstream have;
  have << in.rdbuf();
  EXPECT_EQ(have.str(), doc) << path << " is out of date; rewrite it with DUALCAST_WRITE_BAD_INPUT_DOC=1 "
                             << "build/cpu-only/tests/test_bad_input --gtest_filter='BadInputDoc.*'";
  EXPECT_GE(bad_inputs().size() + driver_rows().size(), 40u);
}

TEST(BadInputDoc, EveryDriverRowNamesItsDriverAndHasATest) {
  for (const DriverRow& r : driver_rows()) {
    EXPECT_EQ(r.line.rfind(r.driver + ":", 0), 0u) << r.line;
    EXPECT_TRUE(r.status == "1" || r.status == "2") << r.name;
  }
}

}  // namespace
}  // namespace dualcast
