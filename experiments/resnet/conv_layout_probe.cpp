// conv_layout_probe.cpp: how fast cuDNN convolves ResNet-18's (CIFAR form, 28x28, batch 256) shapes
// with the activations in NCHW (dualcast today) and in NHWC (PyTorch's channels_last), in bfloat16
// and in TF32, each direction timed by cudnnFind*AlgorithmEx on real buffers. A standalone study of
// the cuDNN API alone (no dualcast), for issue 30's ResNet targets: the bf16 profile of
// h200-2026-11-29h has dualcast's convolutions at 8.4 ms of kernel time against PyTorch's 2.3 ms.
//
//   nvcc -O2 -std=c++17 conv_layout_probe.cpp -lcudnn -o conv_layout_probe && ./conv_layout_probe
//
// For each shape, direction and layout it takes the fastest algorithm of the search that sums directly
// (dualcast's rule in 16 bits), then times it with CUDA events over 50 runs after 5 warm-up runs
// (Find's own times include first launches); it prints that time in microseconds with Find's, and the
// sums over the network (each shape times its count; the stem's data gradient is not needed).
#include <cudnn.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CK(x) do { auto s_ = (x); if (s_ != CUDNN_STATUS_SUCCESS) { std::printf("cudnn error %s at %d: %s\n", #x, __LINE__, cudnnGetErrorString(s_)); std::exit(1); } } while (0)
#define CU(x) do { auto e_ = (x); if (e_ != cudaSuccess) { std::printf("cuda error %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e_)); std::exit(1); } } while (0)

struct Shape { int C, O, H, K, S, count; };

// Forward: FFT and Winograd are transforms; everything else sums directly.
bool direct_fwd(cudnnConvolutionFwdAlgo_t a) {
  return a != CUDNN_CONVOLUTION_FWD_ALGO_FFT && a != CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING &&
         a != CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD && a != CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
bool direct_data(cudnnConvolutionBwdDataAlgo_t a) {
  return a != CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT && a != CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING &&
         a != CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD && a != CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}
bool direct_filter(cudnnConvolutionBwdFilterAlgo_t a) {
  return a != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT && a != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING &&
         a != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

template <class Perf, class Direct>
void best(const Perf* r, int n, Direct direct, float& t_direct, int& a_direct, float& t_any, int& a_any) {
  t_direct = t_any = 1e30f;
  a_direct = a_any = -1;
  for (int i = 0; i < n; ++i) {
    if (r[i].status != CUDNN_STATUS_SUCCESS) continue;
    if (r[i].time < t_any) { t_any = r[i].time; a_any = static_cast<int>(r[i].algo); }
    if (direct(r[i].algo) && r[i].time < t_direct) { t_direct = r[i].time; a_direct = static_cast<int>(r[i].algo); }
  }
}

// Microseconds per run of `run` (5 warm-up runs, then 50 between two events).
template <class Run>
float timed(Run run) {
  for (int i = 0; i < 5; ++i) run();
  cudaEvent_t a, b;
  CU(cudaEventCreate(&a));
  CU(cudaEventCreate(&b));
  CU(cudaEventRecord(a));
  for (int i = 0; i < 50; ++i) run();
  CU(cudaEventRecord(b));
  CU(cudaEventSynchronize(b));
  float ms = 0;
  CU(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return 1e3f * ms / 50;
}

int main() {
  const int N = 256;
  const std::vector<Shape> shapes = {
      {1, 64, 28, 3, 1, 1},    {64, 64, 28, 3, 1, 4},   {64, 128, 28, 3, 2, 1},  {128, 128, 14, 3, 1, 3},
      {64, 128, 28, 1, 2, 1},  {128, 256, 14, 3, 2, 1}, {256, 256, 7, 3, 1, 3},  {128, 256, 14, 1, 2, 1},
      {256, 512, 7, 3, 2, 1},  {512, 512, 4, 3, 1, 3},  {256, 512, 7, 1, 2, 1}};
  cudnnHandle_t h;
  CK(cudnnCreate(&h));
  const size_t ws_bytes = size_t(1) << 30;
  void* ws;
  CU(cudaMalloc(&ws, ws_bytes));
  std::printf("cuDNN %zu\n", cudnnGetVersion());
  for (int mode = 0; mode < 2; ++mode) {  // 0: bf16 (float compute, tensor ops); 1: float32 with TF32
    const cudnnDataType_t type = mode == 0 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
    const cudnnMathType_t math = mode == 0 ? CUDNN_TENSOR_OP_MATH : CUDNN_DEFAULT_MATH;
    const size_t es = mode == 0 ? 2 : 4;
    double sum[2][3][2] = {};  // [layout][direction][direct, any]
    for (const Shape& s : shapes) {
      const int OH = (s.H + 2 * (s.K / 2) - s.K) / s.S + 1;
      for (int layout = 0; layout < 2; ++layout) {
        const cudnnTensorFormat_t fmt = layout == 0 ? CUDNN_TENSOR_NCHW : CUDNN_TENSOR_NHWC;
        cudnnTensorDescriptor_t x, y;
        cudnnFilterDescriptor_t w;
        cudnnConvolutionDescriptor_t cv;
        CK(cudnnCreateTensorDescriptor(&x));
        CK(cudnnCreateTensorDescriptor(&y));
        CK(cudnnCreateFilterDescriptor(&w));
        CK(cudnnCreateConvolutionDescriptor(&cv));
        CK(cudnnSetTensor4dDescriptor(x, fmt, type, N, s.C, s.H, s.H));
        CK(cudnnSetTensor4dDescriptor(y, fmt, type, N, s.O, OH, OH));
        CK(cudnnSetFilter4dDescriptor(w, type, fmt, s.O, s.C, s.K, s.K));
        CK(cudnnSetConvolution2dDescriptor(cv, s.K / 2, s.K / 2, s.S, s.S, 1, 1, CUDNN_CROSS_CORRELATION,
                                           CUDNN_DATA_FLOAT));
        CK(cudnnSetConvolutionMathType(cv, math));
        void *px, *py, *pw;
        CU(cudaMalloc(&px, es * N * s.C * s.H * s.H));
        CU(cudaMalloc(&py, es * N * s.O * OH * OH));
        CU(cudaMalloc(&pw, es * s.O * s.C * s.K * s.K));
        CU(cudaMemset(px, 0, es * N * s.C * s.H * s.H));
        CU(cudaMemset(py, 0, es * N * s.O * OH * OH));
        CU(cudaMemset(pw, 0, es * s.O * s.C * s.K * s.K));
        float td[3], ta[3];
        int ad[3], aa[3];
        int n = 0;
        cudnnConvolutionFwdAlgoPerf_t rf[16];
        CK(cudnnFindConvolutionForwardAlgorithmEx(h, x, px, w, pw, cv, y, py, 16, &n, rf, ws, ws_bytes));
        best(rf, n, direct_fwd, td[0], ad[0], ta[0], aa[0]);
        cudnnConvolutionBwdDataAlgoPerf_t rd[16];
        CK(cudnnFindConvolutionBackwardDataAlgorithmEx(h, w, pw, y, py, cv, x, px, 16, &n, rd, ws, ws_bytes));
        best(rd, n, direct_data, td[1], ad[1], ta[1], aa[1]);
        cudnnConvolutionBwdFilterAlgoPerf_t rw[16];
        CK(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, x, px, y, py, cv, w, pw, 16, &n, rw, ws, ws_bytes));
        best(rw, n, direct_filter, td[2], ad[2], ta[2], aa[2]);
        float tf[3] = {td[0], td[1], td[2]};
        // The chosen direct-sum algorithms, timed alone (td: Find's time -> the events' time).
        const float one = 1.0f, zero = 0.0f;
        td[0] = 1e-3f * timed([&] {
          CK(cudnnConvolutionForward(h, &one, x, px, w, pw, cv, static_cast<cudnnConvolutionFwdAlgo_t>(ad[0]), ws,
                                     ws_bytes, &zero, y, py));
        });
        td[1] = 1e-3f * timed([&] {
          CK(cudnnConvolutionBackwardData(h, &one, w, pw, y, py, cv, static_cast<cudnnConvolutionBwdDataAlgo_t>(ad[1]),
                                          ws, ws_bytes, &zero, x, px));
        });
        td[2] = 1e-3f * timed([&] {
          CK(cudnnConvolutionBackwardFilter(h, &one, x, px, y, py, cv,
                                            static_cast<cudnnConvolutionBwdFilterAlgo_t>(ad[2]), ws, ws_bytes, &zero,
                                            w, pw));
        });
        std::printf("%s %s C%-3d O%-3d H%-2d k%d s%d x%d:", mode == 0 ? "bf16" : "tf32", layout == 0 ? "NCHW" : "NHWC",
                    s.C, s.O, s.H, s.K, s.S, s.count);
        const char* dir[3] = {"fwd", "data", "filter"};
        for (int d = 0; d < 3; ++d) {
          std::printf("  %s %7.1f us (a%d; find %7.1f, any %7.1f a%d)", dir[d], 1e3 * td[d], ad[d], 1e3 * tf[d], 1e3 * ta[d], aa[d]);
          if (d == 1 && s.C == 1) continue;  // the stem's input needs no gradient
          sum[layout][d][0] += s.count * 1e3 * td[d];
          sum[layout][d][1] += s.count * 1e3 * ta[d];
        }
        std::printf("\n");
        CU(cudaFree(px));
        CU(cudaFree(py));
        CU(cudaFree(pw));
        cudnnDestroyTensorDescriptor(x);
        cudnnDestroyTensorDescriptor(y);
        cudnnDestroyFilterDescriptor(w);
        cudnnDestroyConvolutionDescriptor(cv);
      }
    }
    for (int layout = 0; layout < 2; ++layout) {
      double td = 0, ta = 0;
      for (int d = 0; d < 3; ++d) { td += sum[layout][d][0]; ta += sum[layout][d][1]; }
      std::printf("SUM %s %s: fwd %.0f data %.0f filter %.0f = %.0f us (direct sum, timed); fastest of any algorithm in the search %.0f us\n",
                  mode == 0 ? "bf16" : "tf32", layout == 0 ? "NCHW" : "NHWC", sum[layout][0][0], sum[layout][1][0],
                  sum[layout][2][0], td, ta);
    }
  }
  return 0;
}
