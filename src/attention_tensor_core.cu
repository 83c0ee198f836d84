// attention_tensor_core.cu: the launchers of the tensor-core attention kernels for 16-bit q, k, v
// (attention_mma.cuh holds the kernels and their design notes). Compiled as plain C++ in a CPU-only
// build, where tensor_core_supported() is false and the rest are failing stubs.
//
// Shapes: head dims that are multiples of 8 up to 128 (padded to 32, 64 or 128 in shared memory),
// q, k, v and the outputs 16-byte aligned (their rows then are: D % 8 == 0). The forward writes o in
// q's dtype and lse in float32; the backward computes delta = rowsum(dO o O) in float32, adds dq up
// in a float32 buffer with atomics (rounded to q's dtype once, at the end), and writes dk and dv in
// the inputs' dtype.
#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "attention_internal.hpp"
#include "dualcast/error.hpp"
#include "dualcast/ops/cast.hpp"

#if defined(__CUDACC__)
#include "attention_launch.cuh"
#include "attention_mma.cuh"
#endif

namespace dualcast::attention_detail {

bool tensor_core_supported(Device device, const Dims& dims) {
#if defined(__CUDACC__)
  return device.is_cuda() && dims.D == dims.Dv && dims.D >= 8 && dims.D <= 128 && dims.D % 8 == 0;
#else
  (void)device;
  (void)dims;
  return false;
#endif
}

#if defined(__CUDACC__)
namespace {

using namespace kernels;

void check_aligned(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    DUALCAST_CHECK(reinterpret_cast<std::uintptr_t>(t->raw_data()) % 16 == 0,
                   "scaled_dot_product_attention: the tensor-core kernels need 16-byte aligned tensors; ",
                   t->str(), " is not (an internal error: the caller copies such tensors)");
}

template <class T16, int D_PAD>
void forward(const Dims& d, const MaskView& mask, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& o,
             Tensor& lse) {
  constexpr int BR = kWarps * 16 * kFwdAtoms<D_PAD>;
  constexpr int smem = mma_fwd_smem_bytes<D_PAD>();
  const Device dev = q.device();
  allow_smem<attention_forward_mma_kernel<T16, D_PAD>>(dev, smem);
  MmaFwdParams<T16> p{mma_common(d, mask, q.data<T16>(), k.data<T16>(), v.data<T16>())};
  p.o = o.data<T16>();
  p.lse = lse.data<float>();
  p.q_tiles = static_cast<int>((d.Sq + BR - 1) / BR);
  launch_blocks(attention_forward_mma_kernel<T16, D_PAD>, p.heads * p.q_tiles, smem, dev, p);
}

template <class T16, int D_PAD>
void backward(const Dims& d, const MaskView& mask, const Tensor& q, const Tensor& k, const Tensor& v,
              const Tensor& o, const Tensor& lse, const Tensor& dout, Tensor& dq32, Tensor& dk, Tensor& dv) {
  constexpr int smem = mma_bwd_smem_bytes<D_PAD>();
  const Device dev = q.device();
  allow_smem<attention_backward_mma_kernel<T16, D_PAD>>(dev, smem);
  const std::int64_t rows = d.heads() * d.Sq;
  Tensor delta = Tensor::empty(Shape{rows}, DType::float32, dev);
  {
    const std::int64_t cap = static_cast<std::int64_t>(multiprocessor_count(dev)) * 16;
    const auto blocks = static_cast<unsigned>(std::max<std::int64_t>(1, std::min((rows + 7) / 8, cap)));
    attention_delta16_kernel<T16><<<blocks, 256, 0, detail::stream(dev)>>>(o.data<T16>(), dout.data<T16>(),
                                                                            delta.data<float>(), rows, d.D);
    DUALCAST_CUDA_CHECK_LAUNCH();
  }
  MmaBwdParams<T16> p{mma_common(d, mask, q.data<T16>(), k.data<T16>(), v.data<T16>())};
  p.dout = dout.data<T16>();
  p.lse = lse.data<float>();
  p.delta = delta.data<float>();
  p.dq = dq32.data<float>();
  p.dk = dk.data<T16>();
  p.dv = dv.data<T16>();
  p.k_tiles = static_cast<int>((d.Sk + kMmaKeysPerBlock - 1) / kMmaKeysPerBlock);
  launch_blocks(attention_backward_mma_kernel<T16, D_PAD>, p.heads * p.k_tiles, smem, dev, p);
}

/// Calls fn.template operator()<T16, D_PAD>() for the 16-bit dtype and the padded head dimension.
template <class Fn>
void dispatch16(DType dt, std::int64_t D, Fn&& fn) {
  const auto by_dim = [&]<class T16>() {
    if (D <= 32) fn.template operator()<T16, 32>();
    else if (D <= 64) fn.template operator()<T16, 64>();
    else fn.template operator()<T16, 128>();
  };
  if (dt == DType::bfloat16) by_dim.template operator()<bfloat16>();
  else if (dt == DType::float16) by_dim.template operator()<float16>();
  else DUALCAST_FAIL("scaled_dot_product_attention: the tensor-core kernels take bfloat16 or float16, not ",
                     dtype_name(dt));
}

}  // namespace

void tensor_core_forward(const Dims& d, const MaskView& mask, const Tensor& q, const Tensor& k, const Tensor& v,
                         Tensor& o, Tensor& lse) {
  DUALCAST_CHECK(tensor_core_supported(q.device(), d), "scaled_dot_product_attention: the tensor-core kernels "
                 "do not take head_dim ", d.D, " / ", d.Dv, " on ", q.device().str());
  if (d.heads() == 0 || d.Sq == 0) return;
  if (d.Sk == 0) {  // no key at all: every row is fully masked
    o.fill_(0.0);
    lse.fill_(-INFINITY);
    return;
  }
  check_aligned({&q, &k, &v, &o});
  detail::DeviceGuard guard(q.device());
  dispatch16(q.dtype(), d.D, [&]<class T16, int D_PAD>() { forward<T16, D_PAD>(d, mask, q, k, v, o, lse); });
}

void tensor_core_backward(const Dims& d, const MaskView& mask, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& o, const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,
                          Tensor& dv) {
  Tensor dq32 = Tensor::zeros(q.shape(), DType::float32, q.device());
  dk = Tensor::empty(k.shape(), k.dtype(), k.device());
  dv = Tensor::empty(v.shape(), v.dtype(), v.device());
  if (d.heads() > 0 && d.Sk > 0 && d.Sq == 0) {
    dk.fill_(0.0);
    dv.fill_(0.0);
  } else if (d.heads() > 0 && d.Sk > 0) {
    check_aligned({&q, &k, &v, &o, &dout, &dk, &dv});
    detail::DeviceGuard guard(q.device());
    dispatch16(q.dtype(), d.D, [&]<class T16, int D_PAD>() {
      backward<T16, D_PAD>(d, mask, q, k, v, o, lse, dout, dq32, dk, dv);
    });
  }
  dq = cast(dq32, q.dtype());
}

#else  // no CUDA backend: never called (tensor_core_supported is false)

void tensor_core_forward(const Dims&, const MaskView&, const Tensor&, const Tensor&, const Tensor&, Tensor&,
                         Tensor&) {
  DUALCAST_FAIL("scaled_dot_product_attention: the tensor-core kernels need dualcast's CUDA backend");
}
void tensor_core_backward(const Dims&, const MaskView&, const Tensor&, const Tensor&, const Tensor&,
                          const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&, Tensor&) {
  DUALCAST_FAIL("scaled_dot_product_attention: the tensor-core kernels need dualcast's CUDA backend");
}

#endif

}  // namespace dualcast::attention_detail
