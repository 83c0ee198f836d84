// precision.cpp: the float32 matmul precision (one process-wide atomic) and the per-thread Autocast
// state (precision.hpp).
#include "dualcast/precision.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "dualcast/error.hpp"

namespace dualcast {

namespace {
std::atomic<int> g_precision{static_cast<int>(detail::Float32Precision::highest)};
std::atomic<bool> g_autotune{[] {
  const char* v = std::getenv("DUALCAST_MATMUL_AUTOTUNE");
  return v == nullptr || std::strcmp(v, "0") != 0;
}()};

// Per thread, as torch.autocast's state: one thread's mixed-precision region must not change the
// products another thread computes.
thread_local bool t_autocast_enabled = false;
thread_local DType t_autocast_dtype = DType::bfloat16;

const char* precision_name(detail::Float32Precision p) {
  switch (p) {
    case detail::Float32Precision::high: return "high";
    case detail::Float32Precision::medium: return "medium";
    default: return "highest";
  }
}
}  // namespace

void set_float32_matmul_precision(const std::string& name) {
  detail::Float32Precision p;
  if (name == "highest") p = detail::Float32Precision::highest;
  else if (name == "high") p = detail::Float32Precision::high;
  else if (name == "medium") p = detail::Float32Precision::medium;
  else
    DUALCAST_FAIL("set_float32_matmul_precision: unknown precision '", name,
                  "' (expected \"highest\", \"high\" or \"medium\")");
  g_precision.store(static_cast<int>(p));
}

std::string get_float32_matmul_precision() { return precision_name(detail::float32_precision()); }

void set_matmul_autotune(bool on) { g_autotune.store(on); }
bool matmul_autotune() { return g_autotune.load(); }

Autocast::Autocast(DType dtype, bool enabled)
    : prev_enabled_(t_autocast_enabled), prev_dtype_(t_autocast_dtype) {
  DUALCAST_CHECK(is_half(dtype), "Autocast: dtype ", dtype_name(dtype),
                 " is not a 16-bit dtype (expected bfloat16 or float16)");
  t_autocast_enabled = enabled;
  t_autocast_dtype = dtype;
}

Autocast::~Autocast() {
  t_autocast_enabled = prev_enabled_;
  t_autocast_dtype = prev_dtype_;
}

bool autocast_enabled() { return t_autocast_enabled; }
DType autocast_dtype() { return t_autocast_dtype; }

namespace detail {
Float32Precision float32_precision() { return static_cast<Float32Precision>(g_precision.load()); }

DType autocast_target(DType t) {
  return t_autocast_enabled && t == DType::float32 ? t_autocast_dtype : t;
}
}  // namespace detail

}  // namespace dualcast
