// tensor.hpp: Tensor, an N-dimensional array (rank 0..kMaxRank) of any DType (dtype.hpp) on the
// CPU or a CUDA device. A Tensor is a handle: copies share storage (like a shared_ptr); clone() copies
// the data. Storage is row-major contiguous; strides are kept for views to come.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dualcast/device.hpp"
#include "dualcast/dtype.hpp"
#include "dualcast/memory.hpp"
#include "dualcast/shape.hpp"

namespace dualcast {

class Tensor {
 public:
  /// An undefined tensor (no storage); `defined()` is false. Most operations reject it.
  Tensor() = default;

  // ---- construction ------------------------------------------------------------------------
  /// Uninitialised storage (contents unspecified).
  static Tensor empty(const Shape& shape, DType dtype = DType::float32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::float32, Device device = Device::cpu());
  static Tensor ones(const Shape& shape, DType dtype = DType::float32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::float32,
                     Device device = Device::cpu());
  /// 0-d tensor holding `value`.
  static Tensor scalar(double value, DType dtype = DType::float32, Device device = Device::cpu());
  /// 1-d [start, start+step, ...) below `stop`.
  static Tensor arange(double start, double stop, double step = 1.0, DType dtype = DType::float32,
                       Device device = Device::cpu());
  static Tensor arange(std::int64_t n, DType dtype = DType::float32, Device device = Device::cpu());
  /// Copies `values` (row-major) into a new tensor; values.size() must equal shape.numel().
  template <class T>
  static Tensor from_vector(const Shape& shape, const std::vector<T>& values,
                            Device device = Device::cpu());
  /// Standard normal values; element i depends only on (seed, i): the same on CPU and GPU.
  static Tensor randn(const Shape& shape, Device device, std::uint64_t seed,
                      DType dtype = DType::float32);
  /// Uniform values in (lo, hi]; same counter-based stream as randn.
  static Tensor uniform(const Shape& shape, Device device, std::uint64_t seed, double lo = 0.0,
                        double hi = 1.0, DType dtype = DType::float32);
  /// 1 with probability p, else 0 (float32 by default, so flags mix with float arguments).
  static Tensor bernoulli(const Shape& shape, double p, Device device, std::uint64_t seed,
                          DType dtype = DType::float32);
  /// A contiguous tensor over memory owned elsewhere: `shape` of `dtype` at `data` on `device`, no
  /// copy, never freed by dualcast. `release` (may be empty) runs once, when the last handle sharing
  /// it goes, as Buffer::adopt says (a DLPack deleter: dlpack.hpp checks a DLPack tensor before it
  /// comes here). `data` must hold the shape's bytes and be aligned to its elements; null only for an
  /// empty shape. On an error `release` does not run.
  static Tensor wrap(void* data, const Shape& shape, DType dtype, Device device, std::function<void()> release);

  // ---- queries -----------------------------------------------------------------------------
  [[nodiscard]] bool defined() const { return static_cast<bool>(storage_); }
  [[nodiscard]] const Shape& shape() const { return shape_; }
  [[nodiscard]] const Shape& strides() const { return strides_; }
  [[nodiscard]] int rank() const { return shape_.rank(); }
  [[nodiscard]] std::int64_t numel() const { return shape_.numel(); }
  [[nodiscard]] DType dtype() const { return dtype_; }
  [[nodiscard]] Device device() const { return device_; }
  [[nodiscard]] std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  [[nodiscard]] bool is_contiguous() const { return strides_ == contiguous_strides(shape_); }
  /// Whether two handles share storage.
  [[nodiscard]] bool shares_storage(const Tensor& other) const { return storage_ == other.storage_; }
  [[nodiscard]] std::string str() const;  ///< "Tensor[2, 3] float32 cuda:0"

  /// Typed pointer to the first element (on the tensor's device). T must match dtype().
  template <class T>
  [[nodiscard]] T* data() const;
  [[nodiscard]] void* raw_data() const;

  // ---- movement and conversion -------------------------------------------------------------
  /// A copy on `device` (shares storage when already there).
  [[nodiscard]] Tensor to(Device device) const;
  /// A converted copy (shares storage when already of that dtype).
  [[nodiscard]] Tensor to(DType dtype) const;
  /// Deep copy on the same device.
  [[nodiscard]] Tensor clone() const;
  /// A handle with a new shape of the same numel sharing storage (contiguous tensors).
  [[nodiscard]] Tensor view(const Shape& shape) const;
  /// Rows [start, start + length) along the first dimension, sharing storage: the result is again
  /// contiguous (its data starts `start` rows in). For writing into, or reading, one block of a
  /// larger buffer without a copy (e.g. one time step of a [T*B, K] stack).
  [[nodiscard]] Tensor narrow(std::int64_t start, std::int64_t length) const;
  /// All elements converted to T, copied to the host (waits for the device; a dualcast::Error while a
  /// Graph captures on the tensor's device, like every host read).
  template <class T = double>
  [[nodiscard]] std::vector<T> to_vector() const;
  /// The value of a one-element tensor as double (waits for the device; an Error during capture).
  [[nodiscard]] double item() const;

  // ---- in place ----------------------------------------------------------------------------
  /// Sets every element to `value`.
  Tensor& fill_(double value);
  /// Copies `src` (same shape, dtype; any device) into this tensor's storage. During a Graph capture
  /// only a copy within the capturing device can be recorded (from or to the host: an Error).
  Tensor& copy_(const Tensor& src);

 private:
  Tensor(std::shared_ptr<Buffer> storage, Shape shape, DType dtype, Device device);
  /// Tensor::empty on behalf of `op`: checks the shape and byte count, and names op, shape, dtype
  /// and device when the allocation fails.
  static Tensor allocate(const char* op, const Shape& shape, DType dtype, Device device);
  std::shared_ptr<Buffer> storage_;
  Shape shape_;
  Shape strides_;
  std::int64_t offset_ = 0;  // elements; room for views
  DType dtype_ = DType::float32;
  Device device_{};
};

/// Euclidean norm of all elements, as a double (waits for the device).
double norm(const Tensor& t);

/// Throws dualcast::Error unless the tensor is defined (naming op and argument).
void check_defined(const Tensor& t, const char* op, const char* arg);
/// Throws unless a and b live on the same device and have the same dtype (naming op and arguments).
void check_same_device_dtype(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                             const Tensor& b);

}  // namespace dualcast
