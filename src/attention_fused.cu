// attention_fused.cu: the fused attention kernels (FlashAttention-2's structure, written for SIMT
// FFMA: fp32 without tensor cores, and fp64) and their launchers. Compiled as plain C++ in a
// CPU-only build, where only fused_supported() (false) and failing stubs remain.
//
// Forward: a block of 4 warps owns BR = 16 * TM query rows of one (batch, head) and sweeps the key
// tiles (64 keys): S = Q K^T, online softmax (running max m and sum l per row, O rescaled when m
// grows), O += P V. Only O and each row's log-sum-exp (log2 domain) are written: nothing of size
// Sq x Sk ever reaches device memory. Causal blocks stop at the diagonal tile.
// Backward: a block owns BC = 16 * TK keys and sweeps the query tiles (64 rows): it recomputes
// S^T = K Q^T (bit for bit the forward's S: the same FMAs in the same order, scaled after) and
// P^T = 2^(S^T - lse), forms dP^T = V dO^T and dS^T = P^T (dP^T - rowsum(dO o O)),
// accumulates dV += P^T dO and dK += dS^T Q in registers, and adds its share of dQ = dS K to a
// zeroed dQ with atomic adds (float4 atomics on sm_90). Atomics were chosen over a second pass over
// the keys for dQ (which would recompute S and dP once more: +40% FLOPs): blocks of one head start
// their query sweep at staggered tiles so they rarely add to the same rows at once.
//
// Register tiling (the lane layout of every product): lane = 8 * ri + ci (ri 0..3, ci 0..7). In a
// product over the head dimension the lane owns TM (or TK) consecutive rows of its warp's slice,
// which every lane of its quarter-warp reads at once (a shared-memory broadcast), and the 8 strided
// columns ci + 8j, whose rows the quarter-warp reads as 8 consecutive 16-byte rows. Tiles are
// row-major in shared memory with a pitch of D_PAD + 16 bytes, so those 8 rows fall in 8 distinct
// 16-byte bank groups (no conflicts) and every operand moves as a 16-byte load (ld4); products over
// keys or queries read a row of P (or dS) at a time. Per four columns of the reduction a lane does
// 32 TM FMAs for TM + 8 16-byte loads (S: 256 for 16 at TM = 8) and 4 TM D_PAD / 8 FMAs for
// TM + D_PAD / 8 loads (P V); the reduction loops are unrolled (kUnroll*) so that a warp's next loads
// overlap its FMAs. Tiles wholly inside Sq x Sk with no mask to apply (interior_tile: no mask, and
// with causal masking below the diagonal) skip the per-element mask checks, which cost the forward
// about 15 % and the backward about 10 % at seq 1024-4096. Tiles arrive by cp.async while the block computes (the next K during
// P V, the next V during S; the next Q and dO during dQ), into the same buffers, so pipelining costs
// no shared memory; shared memory then sets the occupancy (2 blocks of 4 warps per SM at head_dim
// 64), and __launch_bounds__ says so to ptxas (see blocks_per_sm).
#include "attention_internal.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <mutex>
#include <string>
#include <type_traits>

#include "dualcast/error.hpp"

#if defined(__CUDACC__)
#include "attention_kernels.cuh"
#include "attention_launch.cuh"
#endif

namespace dualcast::attention_detail {

bool fused_supported(Device device, const Dims& dims) {
#if defined(__CUDACC__)
  return device.is_cuda() && dims.D == dims.Dv && dims.D >= 1 && dims.D <= 128;
#else
  (void)device;
  (void)dims;
  return false;
#endif
}

#if defined(__CUDACC__)
namespace {

using namespace kernels;

// =================================================================================================
// launchers
// =================================================================================================

/// Whether every pointer is 16-byte aligned (rows then are too when D % 4 == 0).
bool aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* ptr : ptrs)
    if (reinterpret_cast<std::uintptr_t>(ptr) % 16 != 0) return false;
  return true;
}

/// Tile shapes per element type and padded head dimension (each checked with -Xptxas -v: no spills).
template <class T, int D_PAD>
struct Config {
  static constexpr bool kFloat = std::is_same_v<T, float>;
  static constexpr int TM = kFloat ? 4 : (D_PAD <= 64 ? 4 : 2);  // float D64 also 8: forward_rows_per_lane
  static constexpr int TK = kFloat ? (D_PAD <= 64 ? 4 : 2) : (D_PAD <= 64 ? 2 : 1);
};

/// The fields FwdParams and BwdParams share: inputs, sizes, mask and the log2-domain constants.
template <class T, template <class> class Params>
void set_common(Params<T>& p, const Dims& d, const MaskView& mask, const Tensor& q, const Tensor& k,
                const Tensor& v, const Tensor& lse) {
  p.q = q.data<T>();
  p.k = k.data<T>();
  p.v = v.data<T>();
  p.lse = lse.data<T>();
  p.mask = mask;
  p.heads = d.heads();
  p.H = d.H;
  p.Sq = d.Sq;
  p.Sk = d.Sk;
  p.D = d.D;
  p.causal = d.causal;
  p.smul = static_cast<T>(d.scale * kLog2e);
  p.mask_mul = static_cast<T>(kLog2e);
}

template <class T, int D_PAD, int TM>
void launch_forward(const Dims& d, const MaskView& mask, const Tensor& q, const Tensor& k, const Tensor& v,
                    Tensor& o, Tensor& lse) {
  constexpr int BR = kWarps * 4 * TM;
  constexpr int smem = fwd_smem_bytes<T, D_PAD, TM>();
  const Device dev = q.device();
  allow_smem<attention_forward_kernel<T, D_PAD, TM>>(dev, smem);
  FwdParams<T> p{};
  set_common(p, d, mask, q, k, v, lse);
  p.o = o.data<T>();
  p.q_tiles = static_cast<int>((d.Sq + BR - 1) / BR);
  p.vec = d.D % 4 == 0 && aligned16({p.q, p.k, p.v, p.o});
  launch_blocks(attention_forward_kernel<T, D_PAD, TM>, p.heads * p.q_tiles, smem, dev, p);
}

template <class T, int D_PAD>
void launch_backward(const Dims& d, const MaskView& mask, const Tensor& q, const Tensor& k,
                     const Tensor& v, const Tensor& o, const Tensor& lse, const Tensor& dout, Tensor& dq,
                     Tensor& dk, Tensor& dv) {
  constexpr int TK = Config<T, D_PAD>::TK;
  constexpr int BC = kWarps * 4 * TK;
  constexpr int smem = bwd_smem_bytes<T, D_PAD, TK>();
  const Device dev = q.device();
  allow_smem<attention_backward_kernel<T, D_PAD, TK>>(dev, smem);

  const std::int64_t rows = d.heads() * d.Sq;
  Tensor delta = Tensor::empty(Shape{rows}, q.dtype(), dev);
  {
    const std::int64_t cap = static_cast<std::int64_t>(multiprocessor_count(dev)) * 16;
    const auto blocks = static_cast<unsigned>(std::max<std::int64_t>(1, std::min((rows + 7) / 8, cap)));
    attention_backward_delta_kernel<T><<<blocks, 256, 0, detail::stream(dev)>>>(o.data<T>(), dout.data<T>(),
                                                                                 delta.data<T>(), rows, d.D);
    DUALCAST_CUDA_CHECK_LAUNCH();
  }
  BwdParams<T> p{};
  set_common(p, d, mask, q, k, v, lse);
  p.dout = dout.data<T>();
  p.delta = delta.data<T>();
  p.dq = dq.data<T>();
  p.dk = dk.data<T>();
  p.dv = dv.data<T>();
  p.k_tiles = static_cast<int>((d.Sk + BC - 1) / BC);
  p.vec = d.D % 4 == 0 && aligned16({p.q, p.k, p.v, p.dout, p.dq, p.dk, p.dv});
  p.scale = static_cast<T>(d.scale);
  launch_blocks(attention_backward_kernel<T, D_PAD, TK>, p.heads * p.k_tiles, smem, dev, p);
}

/// The float32, head_dim 64 forward comes in two tile shapes: 8 rows per lane (128 query rows per
/// block, 2 blocks per SM) or 4 (64 rows, 3 blocks per SM). Measured on an H200 (2026-11-26,
/// paper/measured/h200-2026-11-26b/): 8 rows took 4-9 % less time at seq 1024-4096 without causal
/// masking and 2-3 % less with it from seq 2048; 4 rows took 3-16 % less with causal masking up to
/// seq 1024 (a causal block's diagonal tile is half wasted, and short sequences have few blocks).
/// DUALCAST_ATTENTION_FWD_TM=4 or 8 forces a shape, for benchmarks that compare them (read at every
/// call: a benchmark may switch).
int forward_rows_per_lane(const Dims& d) {
  const char* e = std::getenv("DUALCAST_ATTENTION_FWD_TM");
  if (e && std::string(e) == "8") return 8;
  if (e && std::string(e) == "4") return 4;
  return d.causal && d.Sq <= 1024 ? 4 : 8;
}

/// Calls fn.template operator()<T, D_PAD>() for q's dtype and the padded head dimension.
template <class Fn>
void dispatch(DType dt, std::int64_t D, Fn&& fn) {
  dispatch_floating(dt, "scaled_dot_product_attention", [&](auto tag) {
    using T = decltype(tag);
    if (D <= 32) fn.template operator()<T, 32>();
    else if (D <= 64) fn.template operator()<T, 64>();
    else fn.template operator()<T, 128>();
  });
}

}  // namespace

void fused_forward(const Dims& d, const MaskView& mask, const Tensor& q, const Tensor& k, const Tensor& v,
                   Tensor& o, Tensor& lse) {
  DUALCAST_CHECK(fused_supported(q.device(), d), "scaled_dot_product_attention: the fused kernels do not "
                 "take head_dim ", d.D, " / ", d.Dv, " on ", q.device().str());
  if (d.heads() == 0 || d.Sq == 0) return;
  if (d.Sk == 0) {  // no key at all: every row is fully masked
    o.fill_(0.0);
    lse.fill_(-INFINITY);
    return;
  }
  detail::DeviceGuard guard(q.device());
  dispatch(q.dtype(), d.D, [&]<class T, int D_PAD>() {
    if constexpr (std::is_same_v<T, float> && D_PAD == 64) {
      if (forward_rows_per_lane(d) == 8) return launch_forward<T, D_PAD, 8>(d, mask, q, k, v, o, lse);
    }
    launch_forward<T, D_PAD, Config<T, D_PAD>::TM>(d, mask, q, k, v, o, lse);
  });
}

void fused_backward(const Dims& d, const MaskView& mask, const Tensor& q, const Tensor& k, const Tensor& v,
                    const Tensor& o, const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,
                    Tensor& dv) {
  dq = Tensor::zeros(q.shape(), q.dtype(), q.device());
  dk = Tensor::empty(k.shape(), k.dtype(), k.device());
  dv = Tensor::empty(v.shape(), v.dtype(), v.device());
  if (d.heads() == 0 || d.Sk == 0) return;
  if (d.Sq == 0) {
    dk.fill_(0.0);
    dv.fill_(0.0);
    return;
  }
  detail::DeviceGuard guard(q.device());
  dispatch(q.dtype(), d.D, [&]<class T, int D_PAD>() {
    launch_backward<T, D_PAD>(d, mask, q, k, v, o, lse, dout, dq, dk, dv);
  });
}

#else  // no CUDA backend: never called (fused_supported is false)

void fused_forward(const Dims&, const MaskView&, const Tensor&, const Tensor&, const Tensor&, Tensor&,
                   Tensor&) {
  DUALCAST_FAIL("scaled_dot_product_attention: the fused kernels need dualcast's CUDA backend");
}
void fused_backward(const Dims&, const MaskView&, const Tensor&, const Tensor&, const Tensor&,
                    const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&, Tensor&) {
  DUALCAST_FAIL("scaled_dot_product_attention: the fused kernels need dualcast's CUDA backend");
}

#endif

}  // namespace dualcast::attention_detail
