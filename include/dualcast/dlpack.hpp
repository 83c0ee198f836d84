// dlpack.hpp: zero-copy exchange of tensors with other libraries (PyTorch, JAX, NumPy, CuPy, ...)
// through DLPack's C structures (https://dmlc.github.io/dlpack/latest/c_api.html), declared here
// with the same layout, so that nothing needs DLPack's header: a caller that has it passes its
// ::DLManagedTensor* through reinterpret_cast (the static_asserts in src/dlpack.cpp hold the layout).
//
// Ownership follows DLPack: to_dlpack hands out a DLManagedTensor whose deleter the consumer calls
// once (the dualcast tensor's memory stays alive until then); from_dlpack takes a producer's tensor
// and calls its deleter when the last dualcast handle goes, on the thread that drops it (for a CUDA
// tensor after dualcast's stream has finished with it; dropped during a Graph capture, when the
// graph's memory pool goes: Buffer::adopt). No copy either way. These are the unversioned structures
// (DLPack's "dltensor" capsules): a DLPack >= 1.0 DLManagedTensorVersioned has another layout and
// must not be passed here.
//
// Streams: a CUDA tensor handed out is complete once dualcast's stream of its device (stream.hpp)
// reaches the point of the call; a consumer on another stream waits for that stream first (what
// Python's __dlpack__(stream=...) does). A tensor taken in must already be complete for dualcast's
// stream: the producer's side of the protocol.
#pragma once

#include <cstdint>

#include "dualcast/tensor.hpp"

namespace dualcast {
namespace dlpack {

/// DLDeviceType values dualcast reads or writes.
enum DeviceType : std::int32_t { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13 };
/// DLDataTypeCode values dualcast reads or writes.
enum TypeCode : std::uint8_t { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4 };

struct DLDevice {
  std::int32_t device_type;  ///< a DeviceType
  std::int32_t device_id;
};

struct DLDataType {
  std::uint8_t code;  ///< a TypeCode
  std::uint8_t bits;
  std::uint16_t lanes;
};

struct DLTensor {
  void* data;
  DLDevice device;
  std::int32_t ndim;
  DLDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;  ///< in elements; null: compact row-major
  std::uint64_t byte_offset;
};

struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

}  // namespace dlpack

/// `t` as a DLPack tensor sharing its memory: shape, strides and dtype as dualcast has them, device
/// kDLCPU or kDLCUDA with the GPU's index. The result owns a handle of `t` until its deleter runs.
[[nodiscard]] dlpack::DLManagedTensor* to_dlpack(const Tensor& t);

/// A dualcast tensor over a DLPack tensor's memory (no copy). On success dualcast owns `m` and calls
/// its deleter once the last handle goes; on a dualcast::Error (null, an unsupported device or
/// dtype, a strided or misaligned tensor, a GPU this process cannot use) `m` is untouched and still
/// the caller's. float32, float64, bfloat16, float16 and uint8, one lane; CPU (and CUDA-pinned
/// host memory), CUDA or CUDA managed memory; contiguous (row-major; strides of size-1 dimensions do
/// not matter).
[[nodiscard]] Tensor from_dlpack(dlpack::DLManagedTensor* m);

}  // namespace dualcast
