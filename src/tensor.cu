// tensor.cu: Tensor construction, movement and conversion. Fills, random numbers and casts are
// parallel_for bodies, so the CPU and the GPU run the same code.
#include "dualcast/tensor.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <utility>

#include "dualcast/error.hpp"
#include "dualcast/graph.hpp"
#include "dualcast/parallel.hpp"
#include "dualcast/random.hpp"

namespace dualcast {

namespace detail {

template <class T>
void fill_range(Device device, T* p, std::int64_t n, T value) {
  parallel_for(device, n, [=] DUALCAST_HD(std::int64_t i) { p[i] = value; });
}

template <class T>
void arange_fill(Device device, T* p, std::int64_t n, double start, double step) {
  parallel_for(device, n, [=] DUALCAST_HD(std::int64_t i) {
    p[i] = static_cast<T>(start + step * static_cast<double>(i));
  });
}

template <class T>
void normal_fill(Device device, T* p, std::int64_t n, std::uint64_t seed) {
  parallel_for(device, n, [=] DUALCAST_HD(std::int64_t i) {
    p[i] = static_cast<T>(random::normal(seed, static_cast<std::uint64_t>(i)));
  });
}

template <class T>
void uniform_fill(Device device, T* p, std::int64_t n, std::uint64_t seed, double lo, double hi) {
  parallel_for(device, n, [=] DUALCAST_HD(std::int64_t i) {
    p[i] = static_cast<T>(lo + (hi - lo) * random::uniform(seed, static_cast<std::uint64_t>(i)));
  });
}

template <class T>
void bernoulli_fill(Device device, T* p, std::int64_t n, std::uint64_t seed, double prob) {
  parallel_for(device, n, [=] DUALCAST_HD(std::int64_t i) {
    // uniform() is in (0, 1], so p = 0 never fires and p = 1 always does.
    p[i] = static_cast<T>(random::uniform(seed, static_cast<std::uint64_t>(i)) <= prob ? 1 : 0);
  });
}

template <class To, class From>
void cast_range(Device device, To* dst, const From* src, std::int64_t n) {
  parallel_for(device, n, [=] DUALCAST_HD(std::int64_t i) { dst[i] = convert<To>(src[i]); });
}

}  // namespace detail

Tensor::Tensor(std::shared_ptr<Buffer> storage, Shape shape, DType dtype, Device device)
    : storage_(std::move(storage)), shape_(shape), strides_(contiguous_strides(shape)),
      dtype_(dtype), device_(device) {}

Tensor Tensor::allocate(const char* op, const Shape& shape, DType dtype, Device device) {
  const std::int64_t n = checked_numel(op, "shape", shape);
  const std::size_t item = dtype_size(dtype);
  DUALCAST_CHECK(static_cast<std::uint64_t>(n) <= SIZE_MAX / item, op, ": shape ", shape.str(),
                 " of ", dtype_name(dtype), " needs ", n, " x ", item,
                 " bytes, more than a 64-bit byte count holds");
  const std::size_t bytes = static_cast<std::size_t>(n) * item;
  const auto describe = [&] {
    return detail::concat("dualcast: ", op, ": cannot allocate a tensor of shape ", shape.str(), " ",
                          dtype_name(dtype), " on ", device.str(), " (", bytes, " bytes): ");
  };
  std::shared_ptr<Buffer> storage;
  try {
    storage = std::make_shared<Buffer>(bytes, device);
  } catch (const Error& e) {
    // The allocator's message (request, statistics, where) after what asked for it.
    std::string why = e.what();
    if (why.rfind("dualcast: ", 0) == 0) why.erase(0, 10);
    throw Error(describe() + why);
  } catch (const std::bad_alloc&) {
    throw Error(describe() + "std::bad_alloc");
  }
  return Tensor(std::move(storage), shape, dtype, device);
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype, Device device, std::function<void()> release) {
  const std::int64_t n = checked_numel("Tensor::wrap", "shape", shape);
  const std::size_t item = dtype_size(dtype);
  DUALCAST_CHECK(data != nullptr || n == 0, "Tensor::wrap: no data for a tensor of shape ", shape.str());
  DUALCAST_CHECK(reinterpret_cast<std::uintptr_t>(data) % item == 0, "Tensor::wrap: data at ", data,
                 " is not aligned to its ", dtype_name(dtype), " elements (", item, " bytes)");
  DUALCAST_CHECK(static_cast<std::uint64_t>(n) <= SIZE_MAX / item, "Tensor::wrap: shape ", shape.str(),
                 " of ", dtype_name(dtype), " needs more bytes than a 64-bit byte count holds");
  // The shared Buffer exists before it adopts the memory: an allocation failure here must leave the
  // memory with its owner, and `release` unrun.
  auto storage = std::make_shared<Buffer>();
  *storage = Buffer::adopt(data, static_cast<std::size_t>(n) * item, device, std::move(release));
  return Tensor(std::move(storage), shape, dtype, device);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  return allocate("Tensor::empty", shape, dtype, device);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return allocate("Tensor::zeros", shape, dtype, device).fill_(0.0);
}
Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
  return allocate("Tensor::ones", shape, dtype, device).fill_(1.0);
}
Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  return allocate("Tensor::full", shape, dtype, device).fill_(value);
}
Tensor Tensor::scalar(double value, DType dtype, Device device) {
  return full(Shape{}, value, dtype, device);
}

Tensor Tensor::arange(double start, double stop, double step, DType dtype, Device device) {
  DUALCAST_CHECK(step != 0.0 && std::isfinite(step) && std::isfinite(start) && std::isfinite(stop),
                 "arange: invalid range start=", start, " stop=", stop, " step=", step);
  const double count = std::ceil((stop - start) / step);
  DUALCAST_CHECK(count < 9.2e18, "arange: start=", start, " stop=", stop, " step=", step,
                 " gives ", count, " elements, more than a 64-bit count holds");
  const auto n = static_cast<std::int64_t>(count > 0 ? count : 0);
  Tensor t = allocate("arange", Shape{n}, dtype, device);
  dispatch_all(dtype, "arange", [&](auto tag) {
    using T = decltype(tag);
    detail::arange_fill<T>(device, t.data<T>(), n, start, step);
  });
  return t;
}

Tensor Tensor::arange(std::int64_t n, DType dtype, Device device) {
  return arange(0.0, static_cast<double>(n), 1.0, dtype, device);
}

template <class T>
Tensor Tensor::from_vector(const Shape& shape, const std::vector<T>& values, Device device) {
  const std::int64_t n = checked_numel("from_vector", "shape", shape);
  DUALCAST_CHECK(static_cast<std::int64_t>(values.size()) == n, "from_vector: ", values.size(),
                 " values do not fill shape ", shape.str(), " (", n, " elements)");
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> ||
                std::is_same_v<T, std::uint8_t> || is_half_v<T>) {
    detail::check_not_capturing(device, "Tensor::from_vector (a copy from the host)");
    Tensor t = allocate("from_vector", shape, dtype_of<T>(), device);
    copy_bytes(t.raw_data(), device, values.data(), Device::cpu(), t.nbytes());
    return t;
  } else {
    // Integers become float32 (labels, token ids stay exact up to 2^24).
    std::vector<float> f(values.begin(), values.end());
    return from_vector<float>(shape, f, device);
  }
}
template Tensor Tensor::from_vector<float>(const Shape&, const std::vector<float>&, Device);
template Tensor Tensor::from_vector<double>(const Shape&, const std::vector<double>&, Device);
template Tensor Tensor::from_vector<std::uint8_t>(const Shape&, const std::vector<std::uint8_t>&, Device);
template Tensor Tensor::from_vector<bfloat16>(const Shape&, const std::vector<bfloat16>&, Device);
template Tensor Tensor::from_vector<float16>(const Shape&, const std::vector<float16>&, Device);
template Tensor Tensor::from_vector<int>(const Shape&, const std::vector<int>&, Device);
template Tensor Tensor::from_vector<std::int64_t>(const Shape&, const std::vector<std::int64_t>&, Device);

Tensor Tensor::randn(const Shape& shape, Device device, std::uint64_t seed, DType dtype) {
  Tensor t = allocate("Tensor::randn", shape, dtype, device);
  dispatch_floating_storage(dtype, "randn", [&](auto tag) {
    using T = decltype(tag);
    detail::normal_fill<T>(device, t.data<T>(), t.numel(), seed);
  });
  return t;
}

Tensor Tensor::uniform(const Shape& shape, Device device, std::uint64_t seed, double lo, double hi,
                       DType dtype) {
  DUALCAST_CHECK(lo <= hi, "uniform: lo=", lo, " must not exceed hi=", hi);
  Tensor t = allocate("Tensor::uniform", shape, dtype, device);
  dispatch_floating_storage(dtype, "uniform", [&](auto tag) {
    using T = decltype(tag);
    detail::uniform_fill<T>(device, t.data<T>(), t.numel(), seed, lo, hi);
  });
  return t;
}

Tensor Tensor::bernoulli(const Shape& shape, double p, Device device, std::uint64_t seed,
                         DType dtype) {
  DUALCAST_CHECK(p >= 0.0 && p <= 1.0, "bernoulli: probability p=", p, " is outside [0, 1]");
  Tensor t = allocate("Tensor::bernoulli", shape, dtype, device);
  dispatch_all(dtype, "bernoulli", [&](auto tag) {
    using T = decltype(tag);
    detail::bernoulli_fill<T>(device, t.data<T>(), t.numel(), seed, p);
  });
  return t;
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  return "Tensor" + shape_.str() + " " + dtype_name(dtype_) + " " + device_.str();
}

template <class T>
T* Tensor::data() const {
  DUALCAST_CHECK(defined(), "Tensor::data: the tensor is undefined");
  DUALCAST_CHECK(dtype_of<T>() == dtype_, "Tensor::data: requested ", dtype_name(dtype_of<T>()),
                 " from a ", dtype_name(dtype_), " tensor of shape ", shape_.str());
  return static_cast<T*>(storage_->data()) + offset_;
}
template float* Tensor::data<float>() const;
template double* Tensor::data<double>() const;
template std::uint8_t* Tensor::data<std::uint8_t>() const;
template bfloat16* Tensor::data<bfloat16>() const;
template float16* Tensor::data<float16>() const;

void* Tensor::raw_data() const {
  DUALCAST_CHECK(defined(), "Tensor::raw_data: the tensor is undefined");
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<std::int64_t>(dtype_size(dtype_));
}

Tensor Tensor::to(Device device) const {
  check_defined(*this, "Tensor::to", "self");
  if (device == device_) return *this;
  if (device_.is_cuda())
    detail::check_not_capturing(device_, device.is_cpu() ? "Tensor::to(cpu) (a copy to the host)"
                                                         : "Tensor::to (a copy to another device)");
  if (device.is_cuda())
    detail::check_not_capturing(device, device_.is_cpu() ? "Tensor::to (a copy from the host)"
                                                         : "Tensor::to (a copy from another device)");
  Tensor t = allocate("Tensor::to", shape_, dtype_, device);
  copy_bytes(t.raw_data(), device, raw_data(), device_, nbytes());
  return t;
}

Tensor Tensor::to(DType dtype) const {
  check_defined(*this, "Tensor::to", "self");
  if (dtype == dtype_) return *this;
  Tensor t = allocate("Tensor::to", shape_, dtype, device_);
  dispatch_all(dtype, "Tensor::to", [&](auto to_tag) {
    using To = decltype(to_tag);
    dispatch_all(dtype_, "Tensor::to", [&](auto from_tag) {
      using From = decltype(from_tag);
      detail::cast_range<To, From>(device_, t.data<To>(), data<From>(), numel());
    });
  });
  return t;
}

Tensor Tensor::clone() const {
  check_defined(*this, "Tensor::clone", "self");
  Tensor t = allocate("Tensor::clone", shape_, dtype_, device_);
  copy_bytes(t.raw_data(), device_, raw_data(), device_, nbytes());
  return t;
}

Tensor Tensor::view(const Shape& shape) const {
  check_defined(*this, "Tensor::view", "self");
  const std::int64_t n = checked_numel("view", "shape", shape);
  DUALCAST_CHECK(n == numel(), "view: cannot view a tensor of shape ", shape_.str(), " (", numel(),
                 " elements) as shape ", shape.str(), " (", n, " elements)");
  Tensor t = *this;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

Tensor Tensor::narrow(std::int64_t start, std::int64_t length) const {
  check_defined(*this, "Tensor::narrow", "self");
  DUALCAST_CHECK(rank() >= 1 && is_contiguous(), "narrow: needs a contiguous tensor of rank >= 1, got ",
                 str());
  DUALCAST_CHECK(start >= 0 && length >= 0 && start + length <= shape_[0], "narrow: rows [", start,
                 ", ", start + length, ") are outside the first dimension of ", str());
  Tensor t = *this;
  t.shape_[0] = length;
  t.strides_ = contiguous_strides(t.shape_);
  t.offset_ = offset_ + start * strides_[0];
  return t;
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  check_defined(*this, "Tensor::to_vector", "self");
  detail::check_not_capturing(device_, "Tensor::to_vector (a host read of device values)");
  const Tensor host = to(Device::cpu());
  std::vector<T> out(static_cast<std::size_t>(numel()));
  dispatch_all(dtype_, "Tensor::to_vector", [&](auto tag) {
    using S = decltype(tag);
    const S* p = host.data<S>();
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = convert<T>(p[i]);
  });
  return out;
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<std::uint8_t> Tensor::to_vector<std::uint8_t>() const;
template std::vector<bfloat16> Tensor::to_vector<bfloat16>() const;
template std::vector<float16> Tensor::to_vector<float16>() const;
template std::vector<int> Tensor::to_vector<int>() const;
template std::vector<std::int64_t> Tensor::to_vector<std::int64_t>() const;

double Tensor::item() const {
  check_defined(*this, "Tensor::item", "self");
  detail::check_not_capturing(device_, "Tensor::item (a host read of a device value)");
  DUALCAST_CHECK(numel() == 1, "item: tensor of shape ", shape_.str(), " has ", numel(),
                 " elements, item() needs exactly one");
  return to_vector<double>()[0];
}

Tensor& Tensor::fill_(double value) {
  check_defined(*this, "Tensor::fill_", "self");
  if (is_half(dtype_) && std::isfinite(value)) {
    // A finite value that rounds to infinity is almost always a float16 range mistake (a loss
    // scale, a large constant); infinity itself may be asked for.
    const float stored = dtype_ == DType::float16 ? static_cast<float>(float16(value)) : static_cast<float>(bfloat16(value));
    DUALCAST_CHECK(std::isfinite(stored), "Tensor::fill_: ", value, " is outside ", dtype_name(dtype_),
                   "'s finite range (largest ", dtype_ == DType::float16 ? 65504.0 : 3.3895313892515355e38,
                   ") and would be stored as infinity in a tensor of shape ", shape_.str(),
                   " (scale the values, or use bfloat16 or float32)");
  }
  dispatch_all(dtype_, "fill_", [&](auto tag) {
    using T = decltype(tag);
    detail::fill_range<T>(device_, data<T>(), numel(), static_cast<T>(value));
  });
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src) {
  check_defined(*this, "Tensor::copy_", "self");
  check_defined(src, "Tensor::copy_", "src");
  DUALCAST_CHECK(src.shape() == shape_ && src.dtype() == dtype_, "copy_: source ", src.str(),
                 " does not match destination ", str());
  if (src.device() != device_) {
    const char* what = device_.is_cpu()        ? "Tensor::copy_ to the host"
                       : src.device().is_cpu() ? "Tensor::copy_ from the host"
                                               : "Tensor::copy_ between devices";
    if (device_.is_cuda()) detail::check_not_capturing(device_, what);
    if (src.device().is_cuda()) detail::check_not_capturing(src.device(), what);
  }
  copy_bytes(raw_data(), device_, src.raw_data(), src.device(), nbytes());
  return *this;
}

double norm(const Tensor& t) {
  check_defined(t, "norm", "t");
  detail::check_not_capturing(t.device(), "norm (a host read of device values)");
  double s = 0.0;
  for (double v : t.to_vector<double>()) s += v * v;
  return std::sqrt(s);
}

void check_defined(const Tensor& t, const char* op, const char* arg) {
  DUALCAST_CHECK(t.defined(), op, ": argument '", arg, "' is an undefined tensor");
}

void check_same_device_dtype(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                             const Tensor& b) {
  check_defined(a, op, a_name);
  check_defined(b, op, b_name);
  DUALCAST_CHECK(a.device() == b.device(), op, ": arguments on different devices: '", a_name, "' ",
                 a.shape().str(), " on ", a.device().str(), ", '", b_name, "' ", b.shape().str(),
                 " on ", b.device().str());
  DUALCAST_CHECK(a.dtype() == b.dtype(), op, ": arguments of different dtypes: '", a_name, "' ",
                 a.shape().str(), " ", dtype_name(a.dtype()), ", '", b_name, "' ", b.shape().str(),
                 " ", dtype_name(b.dtype()));
}

}  // namespace dualcast
