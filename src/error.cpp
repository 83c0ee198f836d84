// error.cpp: formatting of dualcast::Error messages for argument, CUDA and cuBLAS failures.
#include "dualcast/error.hpp"

#include <string>

#if DUALCAST_WITH_CUDA
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#endif

namespace dualcast::detail {

namespace {
std::string where(const char* file, int line) {
  std::string f(file);
  // Project-relative paths read better than the build machine's absolute ones.
  if (const auto pos = f.rfind("/include/dualcast/"); pos != std::string::npos) f = f.substr(pos + 1);
  else if (const auto p2 = f.rfind("/src/"); p2 != std::string::npos) f = f.substr(p2 + 1);
  else if (const auto p3 = f.rfind("/kernels/"); p3 != std::string::npos) f = f.substr(p3 + 1);
  return f + ":" + std::to_string(line);
}
}  // namespace

void throw_error(const char* file, int line, const std::string& message) {
  throw Error("dualcast: " + message + " [" + where(file, line) + "]");
}

void throw_cuda_error(const char* file, int line, const char* expr, int code) {
#if DUALCAST_WITH_CUDA
  const auto err = static_cast<cudaError_t>(code);
  cudaGetLastError();  // clear a sticky launch error so the next call is judged on its own
  const std::string what = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
#else
  const std::string what = "CUDA error " + std::to_string(code);
#endif
  throw Error("dualcast: CUDA call failed at " + where(file, line) + ": " + expr + " -> " + what);
}

void throw_cublas_error(const char* file, int line, const char* expr, int code) {
#if DUALCAST_WITH_CUDA
  const std::string what = cublasGetStatusString(static_cast<cublasStatus_t>(code));
#else
  const std::string what = "cuBLAS status " + std::to_string(code);
#endif
  throw Error("dualcast: cuBLAS call failed at " + where(file, line) + ": " + expr + " -> " + what);
}

}  // namespace dualcast::detail
