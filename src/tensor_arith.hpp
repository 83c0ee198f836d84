// tensor_arith.hpp (private): the few tensor kernels the tape itself needs (gradient accumulation).
#pragma once

#include "dualcast/tensor.hpp"

namespace dualcast::detail {
/// a + b for two tensors of the same shape, dtype and device (new storage).
Tensor add_tensors(const Tensor& a, const Tensor& b);
/// dst += src, same shape, dtype and device.
void add_inplace(Tensor& dst, const Tensor& src);
}  // namespace dualcast::detail
