// error.hpp: dualcast::Error and the checking macros that throw it (argument checks, CUDA, cuBLAS).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "dualcast/config.hpp"

namespace dualcast {

/// The one exception type dualcast throws. Messages name the operation, the argument and the shapes
/// (argument errors) or the file, line, failing expression and library message (CUDA/cuBLAS errors).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Parts>
[[nodiscard]] std::string concat(Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  return os.str();
}

[[noreturn]] void throw_error(const char* file, int line, const std::string& message);
[[noreturn]] void throw_cuda_error(const char* file, int line, const char* expr, int code);
[[noreturn]] void throw_cublas_error(const char* file, int line, const char* expr, int code);
}  // namespace detail

}  // namespace dualcast

/// Throws dualcast::Error with the concatenated message parts when `cond` is false.
#define DUALCAST_CHECK(cond, ...)                                                          \
  do {                                                                                     \
    if (!(cond)) ::dualcast::detail::throw_error(__FILE__, __LINE__,                       \
                                                 ::dualcast::detail::concat(__VA_ARGS__)); \
  } while (0)

/// Throws dualcast::Error unconditionally (for switch defaults and unreachable dtype branches).
#define DUALCAST_FAIL(...) \
  ::dualcast::detail::throw_error(__FILE__, __LINE__, ::dualcast::detail::concat(__VA_ARGS__))

#if DUALCAST_WITH_CUDA || defined(__CUDACC__)
#include <cuda_runtime_api.h>
/// Wraps a CUDA runtime call; throws with file:line, the expression and cudaGetErrorString.
#define DUALCAST_CUDA_CHECK(expr)                                                       \
  do {                                                                                  \
    const cudaError_t dualcast_status_ = (expr);                                        \
    if (dualcast_status_ != cudaSuccess)                                                \
      ::dualcast::detail::throw_cuda_error(__FILE__, __LINE__, #expr,                   \
                                           static_cast<int>(dualcast_status_));         \
  } while (0)
/// Wraps a cuBLAS call; throws with file:line, the expression and cublasGetStatusString.
#define DUALCAST_CUBLAS_CHECK(expr)                                                     \
  do {                                                                                  \
    const auto dualcast_status_ = (expr);                                               \
    if (static_cast<int>(dualcast_status_) != 0)                                        \
      ::dualcast::detail::throw_cublas_error(__FILE__, __LINE__, #expr,                 \
                                             static_cast<int>(dualcast_status_));       \
  } while (0)
/// Checks the last kernel launch (configuration errors surface here, not at the next sync).
#define DUALCAST_CUDA_CHECK_LAUNCH() DUALCAST_CUDA_CHECK(cudaGetLastError())
#endif
