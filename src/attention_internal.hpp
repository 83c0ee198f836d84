// attention_internal.hpp (private): what the attention front end (attention.cu: checks, the composed
// path, the tape nodes) and the fused CUDA kernels (attention_fused.cu) share.
#pragma once

#include <cstdint>

#include "dualcast/device.hpp"
#include "dualcast/dtype.hpp"
#include "dualcast/tensor.hpp"

namespace dualcast::attention_detail {

enum class MaskKind : int { none = 0, boolean = 1, additive = 2 };

/// A mask as the kernels read it: element (b, h, i, j) sits at b*sb + h*sh + i*si + j*sj (strides
/// are 0 along broadcast dimensions). `data` is uint8 (boolean) or the element type (additive).
struct MaskView {
  const void* data = nullptr;
  MaskKind kind = MaskKind::none;
  std::int64_t sb = 0, sh = 0, si = 0, sj = 0;
};

/// Sizes of one call (q [B, H, Sq, D], k [B, H, Sk, D], v [B, H, Sk, Dv]).
struct Dims {
  std::int64_t B = 0, H = 0, Sq = 0, Sk = 0, D = 0, Dv = 0;
  bool causal = false;
  double scale = 1.0;
  [[nodiscard]] std::int64_t heads() const { return B * H; }
};

/// log2(e): the kernels work in base 2 (exp2 is one instruction on the GPU).
inline constexpr double kLog2e = 1.44269504088896340736;

/// Whether the fused kernels take these sizes on this device (CUDA, D == Dv <= 128). Sizes only:
/// dtype checks happen earlier.
bool fused_supported(Device device, const Dims& dims);

/// Whether the tensor-core kernels (attention_tensor_core.cu; 16-bit q, k, v) take these sizes on this
/// device: CUDA, D == Dv, D a multiple of 8 up to 128.
bool tensor_core_supported(Device device, const Dims& dims);

/// Tensor-core forward of 16-bit q, k, v (contiguous, 16-byte aligned): o [B, H, Sq, D] in their dtype,
/// lse [B, H, Sq] in float32 (log2 domain, as fused_forward's). An additive mask is float32.
void tensor_core_forward(const Dims& dims, const MaskView& mask, const Tensor& q, const Tensor& k,
                         const Tensor& v, Tensor& o, Tensor& lse);

/// Tensor-core backward: dq, dk, dv (allocated here, in q's dtype) from the saved tensors.
void tensor_core_backward(const Dims& dims, const MaskView& mask, const Tensor& q, const Tensor& k,
                          const Tensor& v, const Tensor& o, const Tensor& lse, const Tensor& do_,
                          Tensor& dq, Tensor& dk, Tensor& dv);

/// Fused forward: o [B, H, Sq, D] and lse [B, H, Sq] (log2 domain: log2 sum_j 2^(s2_ij), s2 the
/// scaled, masked scores times log2(e); -inf for a fully masked row). All tensors contiguous, of
/// q's dtype, on its device.
void fused_forward(const Dims& dims, const MaskView& mask, const Tensor& q, const Tensor& k,
                   const Tensor& v, Tensor& o, Tensor& lse);

/// Fused backward: dq, dk, dv (allocated here) from the saved q, k, v, o, lse and the adjoint do_.
void fused_backward(const Dims& dims, const MaskView& mask, const Tensor& q, const Tensor& k,
                    const Tensor& v, const Tensor& o, const Tensor& lse, const Tensor& do_,
                    Tensor& dq, Tensor& dk, Tensor& dv);

}  // namespace dualcast::attention_detail
