// conv_impl.hpp (private): what conv.cu (checks, tape node, im2col + GEMM) and conv_cudnn.cpp (the
// cuDNN backend) share: the checked geometry of one convolution and the cuDNN entry points.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dualcast/device.hpp"
#include "dualcast/dtype.hpp"

namespace dualcast::detail {

/// Every size of one convolution, checked (see ops/conv.hpp).
struct ConvGeometry {
  std::int64_t N = 0, C = 0, H = 0, W = 0;  ///< input
  std::int64_t O = 0, KH = 0, KW = 0;       ///< weight [O, C / groups, KH, KW]
  std::int64_t OH = 0, OW = 0;              ///< output spatial size
  std::int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
  std::int64_t groups = 1;
  /// Channels last: x [N, H, W, C], w [O, KH, KW, C / groups], y [N, OH, OW, O] (cuDNN's NHWC and
  /// KRSC formats; the im2col + GEMM code never sees it: conv.cu permutes around it).
  bool nhwc = false;

  [[nodiscard]] std::int64_t Cg() const { return C / groups; }
  [[nodiscard]] std::int64_t Og() const { return O / groups; }
  /// Rows of a group's column matrix: Cg * KH * KW.
  [[nodiscard]] std::int64_t CgKK() const { return Cg() * KH * KW; }
  [[nodiscard]] std::int64_t OHW() const { return OH * OW; }
  [[nodiscard]] std::int64_t HW() const { return H * W; }
  friend bool operator<(const ConvGeometry& a, const ConvGeometry& b);
};

/// Whether the library was built with cuDNN, and its version ("9.14.0", or "" without).
bool cudnn_compiled();
std::string cudnn_version_string();
/// How cuDNN algorithms are chosen: "find" or "heuristic" (DUALCAST_CUDNN_ALGO), and which FFT and
/// Winograd algorithms may be (DUALCAST_CUDNN_FAST_ALGOS: parse_cudnn_fast_algos below).
std::string cudnn_algo_search_name();
/// Which FFT and Winograd algorithms a value of DUALCAST_CUDNN_FAST_ALGOS allows, per direction
/// (0 forward, 1 backward data, 2 backward filter). Null or empty: the default, both transforms in
/// the two backward directions and none in the forward, for float32 (float64 sums directly
/// everywhere by default; conv_cudnn.cpp says why). "0" or "none":
/// none. "1" or "all": every one. Else a comma list of kinds (fft, winograd) and directions
/// (forward, backward_data, backward_filter), each part meaning all of its kind when absent:
/// "winograd" is Winograd in every direction, "fft,forward" FFT in the forward only. For studies of
/// what the transforms cost in accuracy and give in time (experiments/resnet/README.md). Throws
/// naming the variable on an unknown word.
struct CudnnFastAlgos {
  bool fft[3] = {};
  bool winograd[3] = {};
  bool float64 = false;  ///< whether the rule applies to float64 too (the default: float32 only)
  std::string text;      ///< the variable's value ("" for the default)
  [[nodiscard]] bool none() const {
    for (int d = 0; d < 3; ++d)
      if (fft[d] || winograd[d]) return false;
    return true;
  }
  [[nodiscard]] bool all() const {
    for (int d = 0; d < 3; ++d)
      if (!fft[d] || !winograd[d]) return false;
    return true;
  }
};
CudnnFastAlgos parse_cudnn_fast_algos(const char* value);
/// The algorithms chosen so far, "direction:NAME (details)" (e.g. "forward:IMPLICIT_PRECOMP_GEMM
/// (bfloat16, tensor-op math, nhwc, x [256, 28, 28, 64], O 64, 3x3 stride 1x1, groups 1, 0.09 ms
/// in the search)"), one per convolution shape and direction, in the order chosen
/// (conv_algorithms_chosen() in ops/conv.hpp hands them out).
std::vector<std::string> cudnn_chosen_algorithms();

/// y = conv(x, w) (all contiguous, NCHW or NHWC as g.nhwc says, on `device`).
void cudnn_conv_forward(Device device, DType dtype, const ConvGeometry& g, const void* x,
                        const void* w, void* y);
/// dx = conv_transpose(dy, w), added to dx when `accumulate`.
void cudnn_conv_backward_data(Device device, DType dtype, const ConvGeometry& g, const void* w,
                              const void* dy, void* dx, bool accumulate);
/// dw = the weight gradient of dy against x (overwrites dw).
void cudnn_conv_backward_filter(Device device, DType dtype, const ConvGeometry& g, const void* x,
                                const void* dy, void* dw);

/// Whether cuDNN offers, in each of the three directions, an algorithm dualcast's rule accepts for
/// this NHWC geometry and dtype (the v7 heuristics, asked once per plan). When not, conv.cu runs the
/// convolution as the NCHW one between permutes, and the list of choices says so ("nhwc:NONE ...").
bool cudnn_conv_nhwc_supported(Device device, DType dtype, const ConvGeometry& g);

/// Number of cuDNN algorithm searches made so far (each new shape and direction costs one; tests
/// use it to check the cache).
int cudnn_algorithm_searches();

}  // namespace dualcast::detail
