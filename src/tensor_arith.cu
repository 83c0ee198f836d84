// tensor_arith.cu: gradient accumulation kernels used by the tape.
#include "tensor_arith.hpp"

#include "dualcast/error.hpp"
#include "dualcast/parallel.hpp"

namespace dualcast::detail {

namespace {
// Extended lambdas may not sit inside the generic lambdas of dtype dispatch: named templates do.
template <class T>
void add_kernel(Device d, T* out, const T* a, const T* b, std::int64_t n) {
  parallel_for(d, n, [=] DUALCAST_HD(std::int64_t i) { out[i] = static_cast<T>(a[i] + b[i]); });
}

void check_pair(const char* op, const Tensor& a, const Tensor& b) {
  check_same_device_dtype(op, "a", a, "b", b);
  DUALCAST_CHECK(a.shape() == b.shape(), op, ": shapes differ: ", a.shape().str(), " vs ",
                 b.shape().str());
}
}  // namespace

Tensor add_tensors(const Tensor& a, const Tensor& b) {
  check_pair("add_tensors", a, b);
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  dispatch_floating_storage(a.dtype(), "add_tensors", [&](auto tag) {
    using T = decltype(tag);
    add_kernel<T>(a.device(), out.data<T>(), a.data<T>(), b.data<T>(), a.numel());
  });
  return out;
}

void add_inplace(Tensor& dst, const Tensor& src) {
  check_pair("add_inplace", dst, src);
  dispatch_floating_storage(dst.dtype(), "add_inplace", [&](auto tag) {
    using T = decltype(tag);
    add_kernel<T>(dst.device(), dst.data<T>(), dst.data<T>(), src.data<T>(), dst.numel());
  });
}

}  // namespace dualcast::detail
