// ops/conv.hpp: 2-D convolution on the tape, PyTorch's semantics (cross-correlation, as
// torch.nn.functional.conv2d), float32, float64, bfloat16 and float16, CPU and CUDA.
//
//   x [N, C, H, W], w [O, C / groups, KH, KW]  ->  y [N, O, OH, OW],
//   OH = (H + 2 * padding.h - dilation.h * (KH - 1) - 1) / stride.h + 1   (likewise OW).
//
// Conv2dOptions::layout = ConvLayout::nhwc puts the channels last, as PyTorch's channels_last
// memory format does (dualcast tensors are contiguous, so the shapes say it):
//   x [N, H, W, C], w [O, KH, KW, C / groups]  ->  y [N, OH, OW, O].
// cuDNN's 16-bit and TF32 tensor-core convolutions are NHWC kernels: given NCHW tensors it either
// transposes them around each call or takes older kernels (on an H200, ResNet-18's bf16
// convolutions: 8.4 ms of kernel time in NCHW against PyTorch's 2.3 ms in NHWC, h200-2026-11-29h).
// On cuDNN an nhwc convolution is one cuDNN call on NHWC descriptors (float64 excepted: below);
// elsewhere (the CPU, im2col + GEMM, and float64) it is the NCHW convolution between two permutes
// on the tape, which costs two copies each way.
//
// A bias is a broadcast add (the conv2d overload with a bias [O] adds reshape(bias, {1, O, 1, 1}),
// or the bias itself along the last dimension in nhwc).
//
// Precision (precision.hpp). float32 on cuDNN follows set_float32_matmul_precision: "highest" (the
// default) in CUDNN_FMA_MATH, no TF32; "high" and "medium" in CUDNN_DEFAULT_MATH, TF32 allowed.
// bfloat16 and float16 on cuDNN: 16-bit tensors, float32 compute, tensor-op math; gradients in the
// operands' dtype. Elsewhere (the CPU, or im2col + GEMM on a GPU) a 16-bit convolution runs on
// float32 copies of x and w (cast() on the tape) and its result is rounded to the 16-bit dtype: two
// extra conversion passes each way. A 16-bit result's bias add is a 16-bit broadcast. Under
// Autocast, float32 x, w and bias are cast() to the autocast dtype first (their gradients come back
// float32) and the result has that dtype.
//
// Backends (the fastest available unless set_conv_backend() or the environment says otherwise):
//  * CUDA with cuDNN (found by the build, which says so): cudnnConvolutionForward / BackwardData /
//    BackwardFilter with one handle per device on dualcast's stream, descriptors and algorithms
//    cached per shape (cudnnFind*AlgorithmEx on first use, or the v7 heuristics with
//    DUALCAST_CUDNN_ALGO=heuristic and always while a stream is being captured), in the forward
//    only algorithms that sum directly, in the two float32 backward directions FFT and Winograd
//    transforms too (in the forward they moved a ResNet-18 step's float32 gradients 10x further from float64
//    than PyTorch's; in the backward they did not: src/conv_cudnn.cpp; DUALCAST_CUDNN_FAST_ALGOS
//    changes the rule; 16-bit dtypes follow float32's), workspace from dualcast's caching
//    allocator, float32 math as set by the precision (above).
//  * otherwise ("gemm"): im2col of a chunk of the batch into a column matrix, then GEMMs (cuBLAS on
//    the GPU, the CPU BLAS on the host), per group; the input gradient is gathered back from the
//    column gradient (each input element sums the columns that read it: no atomics, deterministic);
//    the weight gradient is one GEMM per chunk and group. im2col and col2im run on dualcast's thread
//    pool; BLAS calls are made outside it, so OpenBLAS's own threads never compete with the pool.
// The environment variable DUALCAST_CONV=gemm (or cudnn) sets the starting backend, so the fallback
// can be tested where cuDNN exists.
//
// Bad input is a dualcast::Error naming conv2d and the shapes: x or w not 4-D, a channel or group
// mismatch, stride or dilation < 1, padding < 0, a (dilated) kernel larger than the padded input.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dualcast/shape.hpp"
#include "dualcast/tape.hpp"
#include "dualcast/tensor.hpp"

namespace dualcast {

/// A (height, width) pair; one number means both.
struct Size2 {
  std::int64_t h = 0;
  std::int64_t w = 0;
  constexpr Size2() = default;
  constexpr Size2(std::int64_t v) : h(v), w(v) {}  // NOLINT(google-explicit-constructor)
  constexpr Size2(std::int64_t h_, std::int64_t w_) : h(h_), w(w_) {}
  [[nodiscard]] std::string str() const;
  friend constexpr bool operator==(const Size2& a, const Size2& b) { return a.h == b.h && a.w == b.w; }
};

/// Where a convolution's tensors keep their channels (see the top of this header).
enum class ConvLayout {
  nchw,  ///< x [N, C, H, W], w [O, C/groups, KH, KW], y [N, O, OH, OW]
  nhwc,  ///< x [N, H, W, C], w [O, KH, KW, C/groups], y [N, OH, OW, O]
};

/// conv2d's geometry, e.g. Conv2dOptions{.stride = 2, .padding = 1} or {.groups = C} (depthwise).
struct Conv2dOptions {
  Size2 stride{1};
  Size2 padding{0};
  Size2 dilation{1};
  std::int64_t groups = 1;
  ConvLayout layout = ConvLayout::nchw;
};

/// y = conv2d(x, w): see the top of this header.
Var conv2d(const Var& x, const Var& w, const Conv2dOptions& options = {});
/// conv2d(x, w) + bias viewed as [1, O, 1, 1] (a broadcast add).
Var conv2d(const Var& x, const Var& w, const Var& bias, const Conv2dOptions& options = {});
/// The same convolution of Tensors, recording nothing.
Tensor conv2d(const Tensor& x, const Tensor& w, const Conv2dOptions& options = {});

/// The output shape of conv2d for these shapes (checks them as conv2d does).
Shape conv2d_output_shape(const Shape& x, const Shape& w, const Conv2dOptions& options = {});

/// Which implementation GPU convolutions use (the CPU always uses im2col + GEMM).
enum class ConvBackend {
  automatic,  ///< cuDNN when the build found it, else gemm
  cudnn,      ///< cuDNN (an Error at the first GPU convolution when the build has none)
  gemm,       ///< dualcast's im2col + cuBLAS GEMM
};
/// Sets the backend for later convolutions (process-wide). The starting value comes from the
/// environment variable DUALCAST_CONV (cudnn, gemm or auto), else automatic.
void set_conv_backend(ConvBackend backend);
[[nodiscard]] ConvBackend conv_backend();
/// Whether this dualcast was built with cuDNN.
[[nodiscard]] bool cudnn_available();
/// What convolutions on `device` run on, for reports: "cuDNN 9.14.0 (algorithms: find)",
/// "im2col + cuBLAS GEMM", "im2col + CPU BLAS GEMM".
[[nodiscard]] std::string conv_backend_name(Device device);
/// The cuDNN algorithms chosen so far in this process, one entry per convolution shape and direction
/// in the order chosen: "forward:IMPLICIT_PRECOMP_GEMM (bfloat16, tensor-op math, nhwc, x [256, 28,
/// 28, 64], O 64, 3x3 stride 1x1, groups 1, 0.09 ms in the search)" (or "heuristic)" where the v7
/// heuristics chose). Empty without cuDNN. For reports: a benchmark records which kernels it timed.
[[nodiscard]] std::vector<std::string> conv_algorithms_chosen();

}  // namespace dualcast
