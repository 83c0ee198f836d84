// conv_cudnn.cpp: the cuDNN backend of conv2d (legacy convolution API, which cuDNN 8 and 9 both have).
//
// One cuDNN handle per device, created on first use and bound to dualcast's stream (like cuBLAS: every
// kernel, copy and library call on a device is ordered on one stream, so the caching allocator may
// reuse a block as soon as it is released). One plan per distinct convolution (geometry, dtype,
// device): its descriptors, and for each direction the algorithm and workspace size, chosen on first
// use and kept for the life of the process. Choosing: cudnnFind*AlgorithmEx times every algorithm on
// the real buffers (default; DUALCAST_CUDNN_ALGO=heuristic uses the v7 heuristics instead, and a
// search while the stream is being captured into a CUDA graph always does, since Find synchronises).
// Either way the forward takes only algorithms that compute the convolution as a direct sum, and
// in float32 the two backward directions may also take FFT and Winograd transforms, which are
// faster for 3x3 kernels but round more (float64 sums directly everywhere: it is chosen for
// accuracy). Measured on a ResNet-18 step (H200, experiments/resnet/README.md,
// "Which convolutions may use transforms"): with transforms in the forward the float32 gradients
// are 6e-3 to 8e-3 off the float64 step (PyTorch's: 5e-4; the likely reason, from an earlier CPU
// study: the forward's rounding moves activations across ReLU switches that the gradient follows);
// with transforms in either backward direction they match PyTorch's error, and each direction
// alone makes the step 1.23x faster than direct sums everywhere.
// DUALCAST_CUDNN_FAST_ALGOS changes the rule (0 or none: direct sums everywhere; 1 or all: every
// algorithm; or a list of kinds and directions: parse_cudnn_fast_algos). Float32 runs in
// CUDNN_FMA_MATH at the "highest" float32 precision (the default; precision.hpp): cuDNN's default
// math would allow TF32 tensor cores, whose 10-bit mantissa is not fp32. At "high" and "medium" it
// runs in CUDNN_DEFAULT_MATH, which allows TF32. bfloat16 and float16 tensors convolve with float32
// compute (the convolution descriptor's type) in CUDNN_TENSOR_OP_MATH. Plans are keyed by dtype and
// math type; in these two newer modes cuDNN may answer a search with another math type than the
// descriptor's (e.g. tensor-op results for DEFAULT), so each direction runs on a descriptor of its
// own set to the chosen result's math type, as PyTorch does. Workspaces come from dualcast's caching allocator, stream-ordered, so a step
// allocates nothing new once the cache is warm.
#include "conv_impl.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "dualcast/error.hpp"
#include "dualcast/precision.hpp"
#include "dualcast/tensor.hpp"

#if DUALCAST_WITH_CUDA && defined(DUALCAST_WITH_CUDNN)
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "dualcast/stream.hpp"
#include "per_device.hpp"
#endif

namespace dualcast::detail {

bool operator<(const ConvGeometry& a, const ConvGeometry& b) {
  const auto key = [](const ConvGeometry& g) {
    return std::make_tuple(g.N, g.C, g.H, g.W, g.O, g.KH, g.KW, g.OH, g.OW, g.sh, g.sw, g.ph, g.pw,
                           g.dh, g.dw, g.groups, g.nhwc);
  };
  return key(a) < key(b);
}

namespace {
std::atomic<int> g_searches{0};

/// "find" (default) or "heuristic", from DUALCAST_CUDNN_ALGO.
bool use_find() {
  static const bool find = [] {
    const char* env = std::getenv("DUALCAST_CUDNN_ALGO");
    return !(env && std::strcmp(env, "heuristic") == 0);
  }();
  return find;
}

}  // namespace

CudnnFastAlgos parse_cudnn_fast_algos(const char* env) {
  CudnnFastAlgos f;
  if (!env || !*env) {  // the default: transforms in the two backward directions only
    f.fft[1] = f.fft[2] = f.winograd[1] = f.winograd[2] = true;
    return f;
  }
  f.text = env;
  f.float64 = true;  // a rule asked for by name applies to both float types
  if (std::strcmp(env, "0") == 0 || std::strcmp(env, "none") == 0) return f;
  bool kinds[2] = {}, dirs[3] = {}, any_kind = false, any_dir = false;  // none named: all of them
  if (std::strcmp(env, "1") != 0 && std::strcmp(env, "all") != 0) {
    const std::string v = env;
    std::size_t at = 0;
    while (at <= v.size()) {
      const std::size_t comma = std::min(v.find(',', at), v.size());
      const std::string w = v.substr(at, comma - at);
      at = comma + 1;
      if (w == "fft") kinds[0] = any_kind = true;
      else if (w == "winograd") kinds[1] = any_kind = true;
      else if (w == "forward") dirs[0] = any_dir = true;
      else if (w == "backward_data") dirs[1] = any_dir = true;
      else if (w == "backward_filter") dirs[2] = any_dir = true;
      else
        DUALCAST_FAIL("DUALCAST_CUDNN_FAST_ALGOS='", v, "': unknown word '", w,
                      "' (expected 0, none, 1, all, or a comma list of fft, winograd, forward, "
                      "backward_data, backward_filter)");
    }
  }
  for (int d = 0; d < 3; ++d) {
    const bool dir = !any_dir || dirs[d];
    f.fft[d] = dir && (!any_kind || kinds[0]);
    f.winograd[d] = dir && (!any_kind || kinds[1]);
  }
  return f;
}

namespace {
const CudnnFastAlgos& fast_algos() {
  static const CudnnFastAlgos f = parse_cudnn_fast_algos(std::getenv("DUALCAST_CUDNN_FAST_ALGOS"));
  return f;
}

/// How the search-rule part of conv_backend_name reads.
std::string fast_algos_phrase() {
  const CudnnFastAlgos& f = fast_algos();
  if (f.none()) return "no FFT or Winograd";
  if (f.all()) return "FFT and Winograd allowed";
  if (f.text.empty()) return "direct-sum forward, FFT and Winograd allowed in float32 backward";
  return "FFT/Winograd allowed: " + f.text;
}

std::mutex g_chosen_mutex;
std::vector<std::string> g_chosen;  // "direction:ALGORITHM", one per plan and direction
}  // namespace

int cudnn_algorithm_searches() { return g_searches.load(); }
std::string cudnn_algo_search_name() {
  return std::string(use_find() ? "find, " : "heuristic, ") + fast_algos_phrase();
}
std::vector<std::string> cudnn_chosen_algorithms() {
  std::lock_guard lock(g_chosen_mutex);
  return g_chosen;
}

#if DUALCAST_WITH_CUDA && defined(DUALCAST_WITH_CUDNN)

#define DUALCAST_CUDNN_CHECK(expr)                                                              \
  do {                                                                                          \
    const cudnnStatus_t dualcast_cudnn_status_ = (expr);                                        \
    if (dualcast_cudnn_status_ != CUDNN_STATUS_SUCCESS)                                         \
      ::dualcast::detail::throw_error(__FILE__, __LINE__,                                       \
                                      ::dualcast::detail::concat("cuDNN error: ", #expr, ": ",  \
                                                                 cudnnGetErrorString(           \
                                                                     dualcast_cudnn_status_))); \
  } while (0)

bool cudnn_compiled() { return true; }

std::string cudnn_version_string() {
  // cuDNN 9 encodes major*10000 + minor*100 + patch (91400 is 9.14.0); cuDNN 8 major*1000 + minor*100.
  const std::size_t v = cudnnGetVersion();
  const bool v9 = v >= 90000;
  const std::size_t major = v9 ? v / 10000 : v / 1000;
  const std::size_t minor = v9 ? (v / 100) % 100 : (v / 100) % 10, patch = v % 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

namespace {

/// The most workspace any algorithm may use (Find is handed this much, when free).
constexpr std::size_t kMaxWorkspace = std::size_t(1) << 30;

/// One handle per device (see PerDevice: created on first use, never destroyed).
cudnnHandle_t handle(Device device) {
  static PerDevice<cudnnHandle_t> handles;
  return handles.get(device, "conv2d", [&] {
    DeviceGuard guard(device);
    cudnnHandle_t h = nullptr;
    DUALCAST_CUDNN_CHECK(cudnnCreate(&h));
    DUALCAST_CUDNN_CHECK(cudnnSetStream(h, stream(device)));
    return h;
  });
}

int as_int(std::int64_t v, const char* what) {
  DUALCAST_CHECK(v >= 0 && v <= 0x7fffffff, "conv2d: ", what, " = ", v,
                 " exceeds the 32-bit range of cuDNN's 4-D descriptors");
  return static_cast<int>(v);
}

struct Plan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;  ///< searches, and every run of a FMA or float64 plan
  /// Per direction, the descriptor a run uses when `follow_choice`: conv's settings with the math
  /// type of the chosen algorithm (made by choose_algo).
  cudnnConvolutionDescriptor_t run_conv[3] = {};
  bool follow_choice = false;  ///< 16-bit, or float32 at "high"/"medium"
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  bool fwd_ready = false, data_ready = false, filter_ready = false;
  int nhwc_ok = -1;  ///< an NHWC plan: -1 not asked yet, 1 every direction has a usable algorithm, 0 not
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t data{};
  cudnnConvolutionBwdFilterAlgo_t filter{};
  std::size_t fwd_ws = 0, data_ws = 0, filter_ws = 0;
  std::mutex mutex;  // guards the lazy algorithm choice
  [[nodiscard]] cudnnConvolutionDescriptor_t conv_for(int direction) const {
    return follow_choice ? run_conv[direction] : conv;
  }
};

cudnnDataType_t cudnn_type(DType dtype) {
  switch (dtype) {
    case DType::float64: return CUDNN_DATA_DOUBLE;
    case DType::bfloat16: return CUDNN_DATA_BFLOAT16;
    case DType::float16: return CUDNN_DATA_HALF;
    default: return CUDNN_DATA_FLOAT;
  }
}

/// The math type of a new plan (see the top of the file); float32 reads the precision setting.
cudnnMathType_t math_for(DType dtype) {
  if (is_half(dtype)) return CUDNN_TENSOR_OP_MATH;
  if (dtype == DType::float32)
    return float32_precision() == Float32Precision::highest ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
  return CUDNN_DEFAULT_MATH;
}

void set_conv_descriptor(cudnnConvolutionDescriptor_t conv, const ConvGeometry& g,
                         cudnnDataType_t compute, cudnnMathType_t math) {
  DUALCAST_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
      conv, as_int(g.ph, "padding"), as_int(g.pw, "padding"), as_int(g.sh, "stride"),
      as_int(g.sw, "stride"), as_int(g.dh, "dilation"), as_int(g.dw, "dilation"),
      CUDNN_CROSS_CORRELATION, compute));
  DUALCAST_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv, as_int(g.groups, "groups")));
  DUALCAST_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, math));
}

Plan& plan_for(Device device, DType dtype, const ConvGeometry& g) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int, ConvGeometry>, std::unique_ptr<Plan>> plans;
  const cudnnMathType_t math = math_for(dtype);
  std::lock_guard lock(mutex);
  auto& slot = plans[{device.index, static_cast<int>(dtype), static_cast<int>(math), g}];
  if (slot) return *slot;
  auto p = std::make_unique<Plan>();
  p->type = cudnn_type(dtype);
  // 16-bit data, float32 arithmetic (cuDNN's PSEUDO_HALF / PSEUDO_BFLOAT16 configurations).
  p->compute = is_half(dtype) ? CUDNN_DATA_FLOAT : p->type;
  p->math = math;
  p->follow_choice = is_half(dtype) || (dtype == DType::float32 && math != CUDNN_FMA_MATH);
  DUALCAST_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->x));
  DUALCAST_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->y));
  DUALCAST_CUDNN_CHECK(cudnnCreateFilterDescriptor(&p->w));
  DUALCAST_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&p->conv));
  as_int(g.N * g.C * g.HW(), "the input's element count");
  as_int(g.N * g.O * g.OHW(), "the output's element count");
  // The sizes are given in N, C, H, W order either way; the format says where the channels sit
  // (NHWC filters are KRSC: [O, KH, KW, C/groups]).
  const cudnnTensorFormat_t format = g.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  DUALCAST_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->x, format, p->type, as_int(g.N, "N"),
                                                  as_int(g.C, "C"), as_int(g.H, "H"), as_int(g.W, "W")));
  DUALCAST_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->y, format, p->type, as_int(g.N, "N"),
                                                  as_int(g.O, "O"), as_int(g.OH, "OH"),
                                                  as_int(g.OW, "OW")));
  DUALCAST_CUDNN_CHECK(cudnnSetFilter4dDescriptor(p->w, p->type, format, as_int(g.O, "O"),
                                                  as_int(g.Cg(), "C/groups"), as_int(g.KH, "KH"),
                                                  as_int(g.KW, "KW")));
  // float32 at "highest": FMA math, no TF32 tensor-core rounding (math_for).
  set_conv_descriptor(p->conv, g, p->compute, p->math);
  int n = 0, c = 0, h = 0, w = 0;
  DUALCAST_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(p->conv, p->x, p->w, &n, &c, &h, &w));
  DUALCAST_CHECK(n == g.N && c == g.O && h == g.OH && w == g.OW,
                 "conv2d: cuDNN computes an output of [", n, ", ", c, ", ", h, ", ", w,
                 "] where dualcast expects [", g.N, ", ", g.O, ", ", g.OH, ", ", g.OW, "]");
  slot = std::move(p);
  return *slot;
}

// Each algorithm's name, whether it sums products directly or through an FFT or Winograd transform
// (see the top of the file), and its direction (0 forward, 1 backward data, 2 backward filter).
enum class Transform { none, fft, winograd, unknown };
struct AlgoInfo {
  const char* name;
  Transform transform;
  int direction;
};
AlgoInfo info(cudnnConvolutionFwdAlgo_t a) {
  switch (a) {
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM: return {"IMPLICIT_GEMM", Transform::none, 0};
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM: return {"IMPLICIT_PRECOMP_GEMM", Transform::none, 0};
    case CUDNN_CONVOLUTION_FWD_ALGO_GEMM: return {"GEMM", Transform::none, 0};
    case CUDNN_CONVOLUTION_FWD_ALGO_DIRECT: return {"DIRECT", Transform::none, 0};
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT: return {"FFT", Transform::fft, 0};
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING: return {"FFT_TILING", Transform::fft, 0};
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD: return {"WINOGRAD", Transform::winograd, 0};
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED: return {"WINOGRAD_NONFUSED", Transform::winograd, 0};
    default: return {"UNKNOWN", Transform::unknown, 0};
  }
}
AlgoInfo info(cudnnConvolutionBwdDataAlgo_t a) {
  switch (a) {
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_0: return {"ALGO_0", Transform::none, 1};
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_1: return {"ALGO_1", Transform::none, 1};
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT: return {"FFT", Transform::fft, 1};
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING: return {"FFT_TILING", Transform::fft, 1};
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD: return {"WINOGRAD", Transform::winograd, 1};
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED: return {"WINOGRAD_NONFUSED", Transform::winograd, 1};
    default: return {"UNKNOWN", Transform::unknown, 1};
  }
}
AlgoInfo info(cudnnConvolutionBwdFilterAlgo_t a) {
  switch (a) {
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0: return {"ALGO_0", Transform::none, 2};
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1: return {"ALGO_1", Transform::none, 2};
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3: return {"ALGO_3", Transform::none, 2};
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT: return {"FFT", Transform::fft, 2};
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING: return {"FFT_TILING", Transform::fft, 2};
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED: return {"WINOGRAD_NONFUSED", Transform::winograd, 2};
    default: return {"UNKNOWN", Transform::unknown, 2};
  }
}

/// Whether a result of an algorithm search may be used: it ran, fits the workspace limit, is a
/// direct sum unless the rule allows its transform in its direction (the default rule: float32
/// backward only; DUALCAST_CUDNN_FAST_ALGOS, when set, for both float types) and
/// (float32) does not use TF32 tensor cores. An algorithm this file does not know is taken only
/// when every transform is allowed.
template <class Perf>
bool usable(const Perf& r, DType dtype, cudnnMathType_t plan_math, std::size_t limit) {
  if (r.status != CUDNN_STATUS_SUCCESS || r.memory > limit) return false;
  const AlgoInfo a = info(r.algo);
  const CudnnFastAlgos& f = fast_algos();
  // float64 is chosen for accuracy (gradient checks, references): the default rule sums directly.
  if (a.transform != Transform::none && dtype == DType::float64 && !f.float64) return false;
  if (a.transform == Transform::fft && !f.fft[a.direction]) return false;
  if (a.transform == Transform::winograd && !f.winograd[a.direction]) return false;
  if (a.transform == Transform::unknown && !f.all()) return false;
  if (dtype == DType::float32 && plan_math == CUDNN_FMA_MATH && r.mathType != CUDNN_FMA_MATH &&
      r.mathType != CUDNN_DEFAULT_MATH)
    return false;
  // TF32 is what "high" allows; converting float32 data to float16 is not.
  if (dtype == DType::float32 && r.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return false;
  return true;
}

/// "x [N, H, W, C], O 64, 3x3 stride 1x1, groups 1" (x in its layout's order): a plan's geometry
/// in the list of choices.
std::string geometry_text(const ConvGeometry& g) {
  const std::string x = g.nhwc ? concat("[", g.N, ", ", g.H, ", ", g.W, ", ", g.C, "]")
                               : concat("[", g.N, ", ", g.C, ", ", g.H, ", ", g.W, "]");
  return concat("x ", x, ", O ", g.O, ", ", g.KH, "x", g.KW, " stride ", g.sh, "x", g.sw, ", groups ", g.groups);
}

/// Records one choice in the list conv_algorithms_chosen() hands out.
void record(std::string entry) {
  std::lock_guard lock(g_chosen_mutex);
  g_chosen.push_back(std::move(entry));
}

template <class Algo>
void record_choice(const char* direction, Algo algo, DType dtype, const ConvGeometry& g, cudnnMathType_t math,
                   float ms, bool searched) {
  // "direction:NAME (details)": what a report needs to tell two processes' choices apart (a profiled
  // run's search may choose otherwise than a timed one's, experiments/resnet/README.md).
  const char* math_name = math == CUDNN_TENSOR_OP_MATH                      ? "tensor-op"
                          : math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION ? "tensor-op with conversion"
                          : math == CUDNN_FMA_MATH                        ? "fma"
                                                                          : "default";
  record(concat(direction, ":", info(algo).name, " (", dtype_name(dtype), ", ", math_name, " math, ",
                g.nhwc ? "nhwc" : "nchw", ", ", geometry_text(g),
                searched ? concat(", ", ms, " ms in the search)") : std::string(", heuristic)")));
}

bool stream_is_capturing(Device device) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  DUALCAST_CUDA_CHECK(cudaStreamIsCapturing(stream(device), &status));
  return status != cudaStreamCaptureStatusNone;
}

/// A workspace buffer for a search: up to kMaxWorkspace, at most a quarter of the free memory.
Tensor search_workspace(Device device, std::size_t& bytes) {
  std::size_t free_b = 0, total_b = 0;
  DUALCAST_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  bytes = std::min(kMaxWorkspace, free_b / 4);
  for (;;) {
    try {
      return Tensor::empty(Shape{static_cast<std::int64_t>(std::max<std::size_t>(bytes, 1))},
                           DType::uint8, device);
    } catch (const Error&) {
      if (bytes < (std::size_t(1) << 20)) throw;
      bytes /= 2;
    }
  }
}

/// Where an algorithm search writes its trial results: a zeroed scratch tensor of the output's shape,
/// never the caller's output (an accumulated gradient stays untouched). Zeroed because some
/// algorithms scale the output by beta = 0, a read, before they write it: compute-sanitizer's
/// initcheck reports that read of uninitialised memory (cuDNN 9.14's scalePackedTensor and
/// wgrad2d_grouped_direct kernels did).
Tensor search_output(Shape shape, DType dtype, Device device) { return Tensor::zeros(shape, dtype, device); }

Tensor workspace(Device device, std::size_t bytes) {
  if (bytes == 0) return Tensor();
  return Tensor::empty(Shape{static_cast<std::int64_t>(bytes)}, DType::uint8, device);
}

void* ptr(const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }

template <class Perf>
[[noreturn]] void no_algorithm(const char* direction, const std::vector<Perf>& results, int returned,
                               const ConvGeometry& g) {
  std::string why;
  for (int i = 0; i < returned; ++i)
    why += std::string(i ? ", " : "") + "algo " + std::to_string(static_cast<int>(results[static_cast<std::size_t>(i)].algo)) +
           ": " + cudnnGetErrorString(results[static_cast<std::size_t>(i)].status);
  DUALCAST_FAIL("conv2d: cuDNN has no usable ", direction, " algorithm for input [", g.N, ", ", g.C,
                ", ", g.H, ", ", g.W, "], weight [", g.O, ", ", g.Cg(), ", ", g.KH, ", ", g.KW,
                "] (", why, "; ", fast_algos_phrase(),
                "); set DUALCAST_CONV=gemm to use dualcast's implicit GEMM");
}

/// alpha and beta in the type cuDNN expects for the data type.
struct Scalars {
  float f[2];
  double d[2];
  const void* alpha(cudnnDataType_t t) const { return t == CUDNN_DATA_DOUBLE ? static_cast<const void*>(&d[0]) : &f[0]; }
  const void* beta(cudnnDataType_t t) const { return t == CUDNN_DATA_DOUBLE ? static_cast<const void*>(&d[1]) : &f[1]; }
};
Scalars scalars(double alpha, double beta) {
  return {{static_cast<float>(alpha), static_cast<float>(beta)}, {alpha, beta}};
}

// ---- the algorithm search --------------------------------------------------------------------------
// The cuDNN calls of each direction, overloaded on its result type: forward (inputs x, w; output
// y), backward data (w, dy; dx), backward filter (x, dy; dw).

void algo_count(cudnnHandle_t h, const cudnnConvolutionFwdAlgoPerf_t*, int* n) {
  DUALCAST_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, n));
}
void algo_count(cudnnHandle_t h, const cudnnConvolutionBwdDataAlgoPerf_t*, int* n) {
  DUALCAST_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, n));
}
void algo_count(cudnnHandle_t h, const cudnnConvolutionBwdFilterAlgoPerf_t*, int* n) {
  DUALCAST_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, n));
}

void find_algos(cudnnHandle_t h, const Plan& p, const void* x, const void* w, void* y, int n, int* returned,
          cudnnConvolutionFwdAlgoPerf_t* r, void* ws, std::size_t limit) {
  DUALCAST_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(h, p.x, x, p.w, w, p.conv, p.y, y, n,
                                                              returned, r, ws, limit));
}
void find_algos(cudnnHandle_t h, const Plan& p, const void* w, const void* dy, void* dx, int n, int* returned,
          cudnnConvolutionBwdDataAlgoPerf_t* r, void* ws, std::size_t limit) {
  DUALCAST_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(h, p.w, w, p.y, dy, p.conv, p.x, dx,
                                                                   n, returned, r, ws, limit));
}
void find_algos(cudnnHandle_t h, const Plan& p, const void* x, const void* dy, void* dw, int n, int* returned,
          cudnnConvolutionBwdFilterAlgoPerf_t* r, void* ws, std::size_t limit) {
  DUALCAST_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, p.x, x, p.y, dy, p.conv, p.w,
                                                                     dw, n, returned, r, ws, limit));
}

void rank_algos(cudnnHandle_t h, const Plan& p, int n, int* returned, cudnnConvolutionFwdAlgoPerf_t* r) {
  DUALCAST_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, p.x, p.w, p.conv, p.y, n, returned, r));
}
void rank_algos(cudnnHandle_t h, const Plan& p, int n, int* returned, cudnnConvolutionBwdDataAlgoPerf_t* r) {
  DUALCAST_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p.w, p.y, p.conv, p.x, n, returned, r));
}
void rank_algos(cudnnHandle_t h, const Plan& p, int n, int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* r) {
  DUALCAST_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p.x, p.y, p.conv, p.w, n, returned,
                                                                     r));
}

// The workspace of the descriptor the direction runs on (conv_for), for its chosen algorithm.
void workspace_size(cudnnHandle_t h, const Plan& p, int dir, cudnnConvolutionFwdAlgo_t a, std::size_t* bytes) {
  DUALCAST_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, p.x, p.w, p.conv_for(dir), p.y, a, bytes));
}
void workspace_size(cudnnHandle_t h, const Plan& p, int dir, cudnnConvolutionBwdDataAlgo_t a, std::size_t* bytes) {
  DUALCAST_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(h, p.w, p.y, p.conv_for(dir), p.x, a, bytes));
}
void workspace_size(cudnnHandle_t h, const Plan& p, int dir, cudnnConvolutionBwdFilterAlgo_t a, std::size_t* bytes) {
  DUALCAST_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p.x, p.y, p.conv_for(dir), p.w, a, bytes));
}

// Whether cuDNN can say how much workspace a candidate of the heuristics needs on conv (the v7
// heuristics may list as supported an algorithm whose workspace query then fails, as PyTorch found).
bool workspace_known(cudnnHandle_t h, const Plan& p, cudnnConvolutionDescriptor_t conv, cudnnConvolutionFwdAlgo_t a) {
  std::size_t bytes = 0;
  return cudnnGetConvolutionForwardWorkspaceSize(h, p.x, p.w, conv, p.y, a, &bytes) == CUDNN_STATUS_SUCCESS;
}
bool workspace_known(cudnnHandle_t h, const Plan& p, cudnnConvolutionDescriptor_t conv, cudnnConvolutionBwdDataAlgo_t a) {
  std::size_t bytes = 0;
  return cudnnGetConvolutionBackwardDataWorkspaceSize(h, p.w, p.y, conv, p.x, a, &bytes) == CUDNN_STATUS_SUCCESS;
}
bool workspace_known(cudnnHandle_t h, const Plan& p, cudnnConvolutionDescriptor_t conv,
                     cudnnConvolutionBwdFilterAlgo_t a) {
  std::size_t bytes = 0;
  return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p.x, p.y, conv, p.w, a, &bytes) == CUDNN_STATUS_SUCCESS;
}

/// The first result of the heuristics (v7) that the rule accepts and whose workspace cuDNN can size;
/// null when none.
template <class Perf>
const Perf* first_heuristic(cudnnHandle_t h, const Plan& p, DType dtype, std::vector<Perf>& r, int max_count) {
  int returned = 0;
  rank_algos(h, p, max_count, &returned, r.data());
  for (int i = 0; i < returned; ++i) {
    const Perf& e = r[static_cast<std::size_t>(i)];
    if (usable(e, dtype, p.math, kMaxWorkspace) && workspace_known(h, p, p.conv, e.algo)) return &e;
  }
  return nullptr;
}

/// Chooses the algorithm of one direction, once per plan (under p.mutex; `ready` records it): the
/// first usable result of cuDNN's Find (timed on a zeroed scratch output of `out_shape`) where Find
/// is on and the stream is not capturing, else of its heuristic ranking; then its workspace size.
/// a and b are the direction's two inputs, in the order of find_algos above.
template <class Perf, class Algo>
void choose_algo(cudnnHandle_t h, Device device, DType dtype, const ConvGeometry& g, Plan& p,
                 const char* direction, int dir, const void* a, const void* b, const Shape& out_shape,
                 bool& ready, Algo& algo, std::size_t& ws_bytes) {
  std::lock_guard lock(p.mutex);
  if (ready) return;
  ++g_searches;
  int max_count = 0, returned = 0;
  algo_count(h, static_cast<const Perf*>(nullptr), &max_count);
  std::vector<Perf> r(static_cast<std::size_t>(std::max(max_count, 1)));
  std::size_t limit = kMaxWorkspace;
  bool searched = use_find() && !stream_is_capturing(device);
  const Perf* it = nullptr;
  if (searched) {
    Tensor ws = search_workspace(device, limit);
    const Tensor scratch = search_output(out_shape, dtype, device);
    find_algos(h, p, a, b, scratch.raw_data(), max_count, &returned, r.data(), ws.raw_data(), limit);
    const auto found = std::find_if(r.begin(), r.begin() + returned,
                                    [&](const auto& e) { return usable(e, dtype, p.math, limit); });
    if (found != r.begin() + returned) it = &*found;
  }
  // The heuristics: by choice, during a capture, or where Find timed nothing the rule accepts (an
  // NHWC plan whose forward already ran on cuDNN must not fail in its backward).
  std::vector<Perf> ranked(r.size());
  if (!it) {
    it = first_heuristic(h, p, dtype, ranked, max_count);
    searched = false;
  }
  if (!it) no_algorithm(direction, r, returned, g);
  algo = it->algo;
  record_choice(direction, algo, dtype, g, it->mathType, it->time, searched);
  if (p.follow_choice) {
    DUALCAST_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&p.run_conv[dir]));
    set_conv_descriptor(p.run_conv[dir], g, p.compute, it->mathType);
  }
  workspace_size(h, p, dir, algo, &ws_bytes);
  ready = true;
}

}  // namespace

namespace {
/// Whether cuDNN's heuristics list, for one direction of plan p, an algorithm that `usable` accepts.
template <class Perf>
bool has_usable(cudnnHandle_t h, const Plan& p, DType dtype) {
  int max_count = 0;
  algo_count(h, static_cast<const Perf*>(nullptr), &max_count);
  std::vector<Perf> r(static_cast<std::size_t>(std::max(max_count, 1)));
  return first_heuristic(h, p, dtype, r, max_count) != nullptr;
}
}  // namespace

bool cudnn_conv_nhwc_supported(Device device, DType dtype, const ConvGeometry& g) {
  cudnnHandle_t h = handle(device);
  DeviceGuard guard(device);
  Plan& p = plan_for(device, dtype, g);
  std::lock_guard lock(p.mutex);
  if (p.nhwc_ok < 0) {
    p.nhwc_ok = has_usable<cudnnConvolutionFwdAlgoPerf_t>(h, p, dtype) &&
                has_usable<cudnnConvolutionBwdDataAlgoPerf_t>(h, p, dtype) &&
                has_usable<cudnnConvolutionBwdFilterAlgoPerf_t>(h, p, dtype);
    if (!p.nhwc_ok) {  // said, not silent: the permuted NCHW convolution runs instead (conv.cu)
      record(concat("nhwc:NONE (", dtype_name(dtype), ", ", geometry_text(g),
                    ": no usable NHWC algorithm in some direction; runs as NCHW between permutes)"));
    }
  }
  return p.nhwc_ok == 1;
}

void cudnn_conv_forward(Device device, DType dtype, const ConvGeometry& g, const void* x,
                        const void* w, void* y) {
  cudnnHandle_t h = handle(device);
  DeviceGuard guard(device);
  Plan& p = plan_for(device, dtype, g);
  choose_algo<cudnnConvolutionFwdAlgoPerf_t>(h, device, dtype, g, p, "forward", 0, x, w,
                                             Shape{g.N, g.O, g.OH, g.OW}, p.fwd_ready, p.fwd, p.fwd_ws);
  const Tensor ws = workspace(device, p.fwd_ws);
  const Scalars s = scalars(1.0, 0.0);
  DUALCAST_CUDNN_CHECK(cudnnConvolutionForward(h, s.alpha(p.type), p.x, x, p.w, w, p.conv_for(0), p.fwd,
                                               ptr(ws), p.fwd_ws, s.beta(p.type), p.y, y));
}

void cudnn_conv_backward_data(Device device, DType dtype, const ConvGeometry& g, const void* w,
                              const void* dy, void* dx, bool accumulate) {
  cudnnHandle_t h = handle(device);
  DeviceGuard guard(device);
  Plan& p = plan_for(device, dtype, g);
  choose_algo<cudnnConvolutionBwdDataAlgoPerf_t>(h, device, dtype, g, p, "backward-data", 1, w, dy,
                                                 Shape{g.N, g.C, g.H, g.W}, p.data_ready, p.data,
                                                 p.data_ws);
  const Tensor ws = workspace(device, p.data_ws);
  const Scalars s = scalars(1.0, accumulate ? 1.0 : 0.0);
  DUALCAST_CUDNN_CHECK(cudnnConvolutionBackwardData(h, s.alpha(p.type), p.w, w, p.y, dy, p.conv_for(1), p.data,
                                                    ptr(ws), p.data_ws, s.beta(p.type), p.x, dx));
}

void cudnn_conv_backward_filter(Device device, DType dtype, const ConvGeometry& g, const void* x,
                                const void* dy, void* dw) {
  cudnnHandle_t h = handle(device);
  DeviceGuard guard(device);
  Plan& p = plan_for(device, dtype, g);
  choose_algo<cudnnConvolutionBwdFilterAlgoPerf_t>(h, device, dtype, g, p, "backward-filter", 2, x, dy,
                                                   Shape{g.O, g.Cg(), g.KH, g.KW}, p.filter_ready,
                                                   p.filter, p.filter_ws);
  const Tensor ws = workspace(device, p.filter_ws);
  const Scalars s = scalars(1.0, 0.0);
  DUALCAST_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, s.alpha(p.type), p.x, x, p.y, dy, p.conv_for(2),
                                                      p.filter, ptr(ws), p.filter_ws, s.beta(p.type),
                                                      p.w, dw));
}

#else  // no cuDNN in this build

bool cudnn_compiled() { return false; }
std::string cudnn_version_string() { return ""; }

namespace {
[[noreturn]] void no_cudnn() {
  DUALCAST_FAIL("conv2d: this dualcast was built without cuDNN (the build said so at configure time); "
                "use set_conv_backend(ConvBackend::gemm) or DUALCAST_CONV=gemm");
}
}  // namespace

void cudnn_conv_forward(Device, DType, const ConvGeometry&, const void*, const void*, void*) {
  no_cudnn();
}
void cudnn_conv_backward_data(Device, DType, const ConvGeometry&, const void*, const void*, void*, bool) {
  no_cudnn();
}
void cudnn_conv_backward_filter(Device, DType, const ConvGeometry&, const void*, const void*, void*) {
  no_cudnn();
}
bool cudnn_conv_nhwc_supported(Device, DType, const ConvGeometry&) { return false; }

#endif

}  // namespace dualcast::detail
