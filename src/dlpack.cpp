// dlpack.cpp: to_dlpack and from_dlpack (dlpack.hpp): DLPack's structures filled from a dualcast
// tensor, and a dualcast tensor made over a checked DLPack tensor's memory.
#include "dualcast/dlpack.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dualcast/error.hpp"

namespace dualcast {
namespace dlpack {
// The layout of DLPack's own header (dlpack.h) on every 64-bit platform, which a caller's
// reinterpret_cast relies on.
static_assert(sizeof(DLDevice) == 8 && sizeof(DLDataType) == 4);
static_assert(offsetof(DLTensor, device) == 8 && offsetof(DLTensor, ndim) == 16 &&
              offsetof(DLTensor, dtype) == 20 && offsetof(DLTensor, shape) == 24 &&
              offsetof(DLTensor, strides) == 32 && offsetof(DLTensor, byte_offset) == 40 &&
              sizeof(DLTensor) == 48);
static_assert(offsetof(DLManagedTensor, manager_ctx) == 48 && offsetof(DLManagedTensor, deleter) == 56 &&
              sizeof(DLManagedTensor) == 64);
}  // namespace dlpack

namespace {

using dlpack::DLDataType;
using dlpack::DLManagedTensor;

// What a handed-out tensor owns until its deleter runs: a handle of the tensor (its memory) and the
// shape and strides DLTensor points into.
struct Exported {
  Tensor tensor;
  std::vector<std::int64_t> shape, strides;
  DLManagedTensor managed{};
};

DLDataType dl_dtype(DType t) {
  switch (t) {
    case DType::float32: return {dlpack::kDLFloat, 32, 1};
    case DType::float64: return {dlpack::kDLFloat, 64, 1};
    case DType::bfloat16: return {dlpack::kDLBfloat, 16, 1};
    case DType::float16: return {dlpack::kDLFloat, 16, 1};
    case DType::uint8: return {dlpack::kDLUInt, 8, 1};
  }
  DUALCAST_FAIL("to_dlpack: unknown dtype");
}

std::string describe(DLDataType t) {
  const char* code = t.code == dlpack::kDLInt ? "int" : t.code == dlpack::kDLUInt ? "uint"
                     : t.code == dlpack::kDLFloat ? "float" : t.code == dlpack::kDLBfloat ? "bfloat" : nullptr;
  std::string s = code ? std::string(code) + std::to_string(t.bits)
                       : "type code " + std::to_string(t.code) + " (" + std::to_string(t.bits) + " bits)";
  if (t.lanes != 1) s += " x " + std::to_string(t.lanes) + " lanes";
  return s;
}

DType dualcast_dtype(DLDataType t) {
  if (t.lanes == 1) {
    if (t.code == dlpack::kDLFloat && t.bits == 32) return DType::float32;
    if (t.code == dlpack::kDLFloat && t.bits == 64) return DType::float64;
    if (t.code == dlpack::kDLBfloat && t.bits == 16) return DType::bfloat16;
    if (t.code == dlpack::kDLFloat && t.bits == 16) return DType::float16;
    if (t.code == dlpack::kDLUInt && t.bits == 8) return DType::uint8;
  }
  DUALCAST_FAIL("from_dlpack: argument m: dtype ", describe(t),
                " is not one of dualcast's (float32, float64, bfloat16, float16, uint8)");
}

std::string list(const std::int64_t* v, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

DLManagedTensor* to_dlpack(const Tensor& t) {
  check_defined(t, "to_dlpack", "t");
  auto owned = std::make_unique<Exported>(Exported{t, {}, {}, {}});  // freed if filling it throws
  Exported* e = owned.get();
  for (int d = 0; d < t.rank(); ++d) {
    e->shape.push_back(t.shape()[d]);
    e->strides.push_back(t.strides()[d]);
  }
  dlpack::DLTensor& dl = e->managed.dl_tensor;
  dl.data = t.numel() > 0 ? t.raw_data() : nullptr;
  dl.device = t.device().is_cuda() ? dlpack::DLDevice{dlpack::kDLCUDA, t.device().index}
                                   : dlpack::DLDevice{dlpack::kDLCPU, 0};
  dl.ndim = t.rank();
  dl.dtype = dl_dtype(t.dtype());
  dl.shape = e->shape.data();
  dl.strides = e->strides.data();
  dl.byte_offset = 0;
  e->managed.manager_ctx = e;
  e->managed.deleter = [](DLManagedTensor* self) { delete static_cast<Exported*>(self->manager_ctx); };
  return &owned.release()->managed;
}

Tensor from_dlpack(DLManagedTensor* m) {
  DUALCAST_CHECK(m != nullptr, "from_dlpack: argument m is null");
  const dlpack::DLTensor& dl = m->dl_tensor;
  DUALCAST_CHECK(dl.ndim >= 0 && (dl.ndim == 0 || dl.shape != nullptr), "from_dlpack: argument m: ndim ",
                 dl.ndim, (dl.ndim > 0 ? " without a shape" : ""));
  DUALCAST_CHECK(dl.ndim <= kMaxRank, "from_dlpack: argument m: ", dl.ndim, " dimensions; dualcast's tensors have at most ",
                 kMaxRank);
  std::vector<std::int64_t> dims(dl.shape, dl.shape + dl.ndim);
  for (std::int64_t n : dims) DUALCAST_CHECK(n >= 0, "from_dlpack: argument m: shape ", list(dl.shape, dl.ndim));
  const Shape shape(dims);
  const std::int64_t numel = checked_numel("from_dlpack", "m", shape);  // before any product of dims
  const DType dtype = dualcast_dtype(dl.dtype);
  Device device = Device::cpu();
  if (dl.device.device_type == dlpack::kDLCUDA || dl.device.device_type == dlpack::kDLCUDAManaged) {
    try {
      device = Device::cuda(dl.device.device_id);  // an Error where this process cannot use that GPU
    } catch (const Error& e) {
      std::string why = e.what();
      if (why.rfind("dualcast: ", 0) == 0) why.erase(0, 10);
      throw Error("dualcast: from_dlpack: argument m is a CUDA tensor: " + why);
    }
  } else {
    DUALCAST_CHECK(dl.device.device_type == dlpack::kDLCPU || dl.device.device_type == dlpack::kDLCUDAHost,
                   "from_dlpack: argument m: device type ", dl.device.device_type,
                   " (dualcast takes CPU, CUDA-pinned host, CUDA and CUDA managed memory: types 1, 3, 2 and 13)");
  }
  if (dl.strides != nullptr && numel > 0) {
    // Row-major and compact; a dimension of size 1 may carry any stride (PyTorch gives them odd ones).
    std::int64_t expect = 1;
    for (int d = dl.ndim - 1; d >= 0; --d) {
      DUALCAST_CHECK(dims[d] == 1 || dl.strides[d] == expect, "from_dlpack: argument m: strides ",
                     list(dl.strides, dl.ndim), " of shape ", shape.str(),
                     " are not contiguous (row-major); make the tensor contiguous first");
      expect *= dims[d];
    }
  }
  void* data = dl.data ? static_cast<char*>(dl.data) + dl.byte_offset : nullptr;
  DUALCAST_CHECK(data != nullptr || numel == 0, "from_dlpack: argument m: no data for shape ", shape.str());
  DUALCAST_CHECK(reinterpret_cast<std::uintptr_t>(data) % dtype_size(dtype) == 0, "from_dlpack: argument m: data at ",
                 data, " is not aligned to its ", dtype_name(dtype), " elements");
  // Tensor::wrap leaves m with the caller when it throws (it checks the same again).
  return Tensor::wrap(data, shape, dtype, device, [m] {
    if (m->deleter) m->deleter(m);
  });
}

}  // namespace dualcast
