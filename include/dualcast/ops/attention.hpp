// ops/attention.hpp: scaled dot-product attention on tensors and on the tape.
//
//   out = softmax(scale * q k^T + additive_mask, masked) v      per (batch, head)
//
// q [B, H, Sq, D], k [B, H, Sk, D], v [B, H, Sk, Dv] -> out [B, H, Sq, Dv]; float32, float64,
// bfloat16 or float16, all of one dtype on one device. Gradients flow to q, k and v (any subset may be
// constants).
//
// 16-bit q, k, v (bfloat16 or float16) run on tensor cores on CUDA devices where the fused kernels
// apply and head_dim is a multiple of 8 (implementation fused or automatic): mma.sync products of
// 16-bit operands with float32 sums; softmax, the log-sum-exp and dq's sums in float32; P and dS
// rounded to 16 bits before the products that use them, as FlashAttention-2 does; the output and
// the gradients in the inputs' dtype. Elsewhere (the CPU, other head dims, `composed`) they are
// cast() to float32 copies, the float32 attention runs, and the output is rounded back. A float mask
// is converted to float32 in both cases.
// Under Autocast, float32 q, k, v on a CUDA device where the tensor-core kernels apply are cast to
// the autocast dtype and run there (the output is 16-bit, their gradients float32), as PyTorch's
// autocast does with scaled_dot_product_attention; elsewhere attention stays float32 (the composed
// path's matmuls are not autocast either).
//
// Masking (AttentionOptions):
//  - causal: query i attends to keys j <= i (top-left aligned, as PyTorch's is_causal, also when
//    Sq != Sk).
//  - mask: a tensor that broadcasts (NumPy rules, aligned at the back) to [B, H, Sq, Sk], e.g.
//    [Sq, Sk], [B, 1, 1, Sk] (key padding) or [B, H, Sq, Sk]. A uint8 mask is boolean: nonzero =
//    attend, 0 = masked (PyTorch's bool convention). A float32/float64 mask is additive: added to the
//    scaled scores (converted to q's dtype; -inf masks). causal and mask combine.
//  - A row whose keys are all masked (boolean, causal or -inf) gives an output row of ZEROS and zero
//    gradients for everything it touches, never NaN (PyTorch gives NaN there). Finite additive
//    masks (e.g. -1e9) are ordinary scores: such a row is a softmax over them.
//  - scale: 0 (default) means 1 / sqrt(D).
//
// Implementations (AttentionOptions::impl; attention_impl_for says which `automatic` picks):
//  - fused (CUDA only): one forward kernel (online softmax; saves only the output and each row's
//    log-sum-exp, never the Sq x Sk matrix) and one backward kernel that recomputes the scores
//    (FlashAttention-2's structure; float32 and float64 in SIMT FFMA, no TF32; 16-bit inputs on
//    tensor cores), plus a small kernel for
//    rowsum(dout * out). Causal and mask handled inside the kernels; causal tiles above the diagonal
//    are skipped. Head dims up to kFusedAttentionMaxHeadDim with D == Dv (64 is the tuned case;
//    others are padded to 32, 64 or 128). dq is accumulated with atomic adds, so its last bits may
//    differ from run to run (dk, dv and the output are deterministic).
//  - composed: matmul, a masked softmax (one kernel forward, one backward) and matmul on the tape:
//    three nodes, the Sq x Sk probabilities kept for the backward. The reference the fused kernels
//    are tested against; what the CPU runs.
//  - automatic: fused where it applies (a CUDA device, D == Dv <= kFusedAttentionMaxHeadDim),
//    composed otherwise.
// Throws dualcast::Error naming the argument and the shapes on a rank, size, dtype or device
// mismatch, a mask that does not broadcast, a non-finite scale, or `fused` where it does not apply.
#pragma once

#include "dualcast/tape.hpp"
#include "dualcast/tensor.hpp"

namespace dualcast {

enum class AttentionImpl { automatic, fused, composed };

struct AttentionOptions {
  bool causal = false;
  Tensor mask;          ///< undefined: no mask; uint8: boolean (nonzero = attend); float: additive
  double scale = 0.0;   ///< 0: 1 / sqrt(head_dim)
  AttentionImpl impl = AttentionImpl::automatic;
};

/// The largest head dimension the fused kernels take.
inline constexpr int kFusedAttentionMaxHeadDim = 128;

Var scaled_dot_product_attention(const Var& q, const Var& k, const Var& v,
                                 const AttentionOptions& options = {});
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options = {});

/// The implementation a call with these arguments runs (never `automatic`); checks the arguments.
AttentionImpl attention_impl_for(const Tensor& q, const Tensor& k, const Tensor& v,
                                 const AttentionOptions& options = {});
/// "automatic", "fused" or "composed".
const char* attention_impl_name(AttentionImpl impl);

}  // namespace dualcast
