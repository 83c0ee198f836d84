// test_dlpack.cu: to_dlpack and from_dlpack (dlpack.hpp). What goes out describes the tensor's own
// memory (shape, strides, dtype, device) and keeps it alive until the consumer's deleter runs; what
// comes in is used in place, its deleter runs exactly once when the last dualcast handle goes, and
// a tensor dualcast cannot take is a clear error that leaves it with the caller. CPU and CUDA.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dualcast/dlpack.hpp"
#include "dualcast/error.hpp"
#include "dualcast/ops/elementwise.hpp"
#include "dualcast/ops/reduce.hpp"
#include "test_util.hpp"

namespace dualcast {
namespace {

using dlpack::DLManagedTensor;

// A producer's tensor, as another library hands one out: floats owned by the test, a deleter that
// counts its calls.
struct Produced {
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  int deleted = 0;
  DLManagedTensor m{};

  Produced(void* data, std::vector<std::int64_t> dims, dlpack::DLDataType dtype,
           dlpack::DLDevice device = {dlpack::kDLCPU, 0})
      : shape(std::move(dims)) {
    m.dl_tensor.data = data;
    m.dl_tensor.device = device;
    m.dl_tensor.ndim = static_cast<std::int32_t>(shape.size());
    m.dl_tensor.dtype = dtype;
    m.dl_tensor.shape = shape.data();
    m.manager_ctx = this;
    m.deleter = [](DLManagedTensor* self) { ++static_cast<Produced*>(self->manager_ctx)->deleted; };
  }
  void set_strides(std::vector<std::int64_t> s) {
    strides = std::move(s);
    m.dl_tensor.strides = strides.data();
  }
};

constexpr dlpack::DLDataType kF32{dlpack::kDLFloat, 32, 1};

class DlpackOnDevices : public ::testing::TestWithParam<Device> {};

TEST_P(DlpackOnDevices, ExportDescribesTheTensorsOwnMemoryForEveryDtype) {
  const Device dev = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(dev);
  const std::vector<std::pair<DType, dlpack::DLDataType>> dtypes = {
      {DType::float32, {dlpack::kDLFloat, 32, 1}}, {DType::float64, {dlpack::kDLFloat, 64, 1}},
      {DType::bfloat16, {dlpack::kDLBfloat, 16, 1}}, {DType::float16, {dlpack::kDLFloat, 16, 1}},
      {DType::uint8, {dlpack::kDLUInt, 8, 1}}};
  for (const auto& [dtype, dl] : dtypes) {
    const Tensor t = Tensor::zeros({3, 5, 2}, dtype, dev);
    DLManagedTensor* m = to_dlpack(t);
    const dlpack::DLTensor& d = m->dl_tensor;
    EXPECT_EQ(d.data, t.raw_data());
    EXPECT_EQ(d.byte_offset, 0u);
    EXPECT_EQ(d.ndim, 3);
    EXPECT_EQ(std::vector<std::int64_t>(d.shape, d.shape + 3), (std::vector<std::int64_t>{3, 5, 2}));
    EXPECT_EQ(std::vector<std::int64_t>(d.strides, d.strides + 3), (std::vector<std::int64_t>{10, 2, 1}));
    EXPECT_EQ(d.dtype.code, dl.code) << dtype_name(dtype);
    EXPECT_EQ(d.dtype.bits, dl.bits) << dtype_name(dtype);
    EXPECT_EQ(d.dtype.lanes, 1);
    EXPECT_EQ(d.device.device_type, dev.is_cuda() ? dlpack::kDLCUDA : dlpack::kDLCPU);
    EXPECT_EQ(d.device.device_id, dev.is_cuda() ? dev.index : 0);
    m->deleter(m);
  }
}

TEST_P(DlpackOnDevices, AnExportedTensorOutlivesItsLastDualcastHandleUntilTheDeleterRuns) {
  const Device dev = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(dev);
  DLManagedTensor* m = nullptr;
  {
    const Tensor t = Tensor::from_vector<float>({2, 3}, {1, 2, 3, 4, 5, 6}, dev);
    m = to_dlpack(t);
  }
  // Only the DLPack tensor holds the memory now; taking it back reads the same values in place.
  void* data = m->dl_tensor.data;
  const Tensor back = from_dlpack(m);
  EXPECT_EQ(back.raw_data(), data);
  EXPECT_EQ(back.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

TEST_P(DlpackOnDevices, ARoundTripIsZeroCopyAndWritesShowOnBothSides) {
  const Device dev = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(dev);
  Tensor t = Tensor::from_vector<double>({4}, {1, 2, 3, 4}, dev);
  Tensor u = from_dlpack(to_dlpack(t));
  EXPECT_TRUE(u.raw_data() == t.raw_data() && u.dtype() == DType::float64 && u.device() == dev);
  u.fill_(7.0);
  EXPECT_EQ(t.to_vector<double>(), (std::vector<double>{7, 7, 7, 7}));
  // An op on the imported tensor is an ordinary dualcast op.
  EXPECT_DOUBLE_EQ(sum(u * t).item(), 4 * 49.0);
}

TEST_P(DlpackOnDevices, ZeroDimensionalAndEmptyTensorsRoundTrip) {
  const Device dev = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(dev);
  const Tensor s = Tensor::scalar(2.5, DType::float32, dev);
  const Tensor s2 = from_dlpack(to_dlpack(s));
  EXPECT_EQ(s2.rank(), 0);
  EXPECT_EQ(s2.item(), 2.5);
  const Tensor e = Tensor::empty({0, 3}, DType::float32, dev);
  const Tensor e2 = from_dlpack(to_dlpack(e));
  EXPECT_EQ(e2.shape(), (Shape{0, 3}));
  EXPECT_EQ(e2.numel(), 0);
}

INSTANTIATE_TEST_SUITE_P(Devices, DlpackOnDevices, ::testing::ValuesIn(testing::all_devices()),
                         [](const auto& info) { return std::string(testing::device_label(info.param)); });

TEST(Dlpack, AnImportedTensorIsUsedInPlaceAndItsDeleterRunsOnceWithTheLastHandle) {
  std::vector<float> data = {1, 2, 3, 4, 5, 6};
  Produced p(data.data(), {2, 3}, kF32);
  {
    const Tensor t = from_dlpack(&p.m);
    EXPECT_EQ(t.raw_data(), data.data());
    EXPECT_EQ(t.shape(), (Shape{2, 3}));
    const Tensor view = t;  // a second handle of the same memory
    data[4] = 50;
    EXPECT_EQ(view.to_vector<float>()[4], 50.0f);
    EXPECT_EQ(p.deleted, 0);
  }
  EXPECT_EQ(p.deleted, 1);
}

TEST(Dlpack, AnImportedTensorHonoursTheByteOffsetAndUnitStridesOfSizeOneDimensions) {
  std::vector<float> data = {9, 9, 1, 2, 3, 4};
  Produced p(data.data(), {2, 1, 2}, kF32);
  p.m.dl_tensor.byte_offset = 2 * sizeof(float);
  p.set_strides({2, 77, 1});  // a size-1 dimension's stride means nothing (PyTorch gives such)
  const Tensor t = from_dlpack(&p.m);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 2, 3, 4}));
}

TEST(Dlpack, WhatDualcastCannotTakeIsAClearErrorAndStaysWithTheCaller) {
  std::vector<float> data(12, 1.0f);
  const auto expect_error = [](Produced& p, const std::string& words) {
    try {
      (void)from_dlpack(&p.m);
      ADD_FAILURE() << "no error; expected one naming: " << words;
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("from_dlpack"), std::string::npos) << what;
      EXPECT_NE(what.find(words), std::string::npos) << what;
    }
    EXPECT_EQ(p.deleted, 0) << "a refused tensor stays the caller's: its deleter must not run";
  };
  {
    Produced p(data.data(), {3, 4}, {dlpack::kDLInt, 32, 1});
    expect_error(p, "int32");
  }
  {
    Produced p(data.data(), {3, 4}, {dlpack::kDLFloat, 32, 4});
    expect_error(p, "4 lanes");
  }
  {
    Produced p(data.data(), {3, 4}, kF32);
    p.set_strides({1, 3});  // a transposed (column-major) view
    expect_error(p, "not contiguous");
  }
  {
    Produced p(data.data(), {3, 4}, kF32, {10, 0});  // ROCm memory
    expect_error(p, "device type 10");
  }
  {
    Produced p(reinterpret_cast<char*>(data.data()) + 2, {2}, kF32);
    expect_error(p, "aligned");
  }
  {
    Produced p(nullptr, {3, 4}, kF32);
    expect_error(p, "no data");
  }
  {
    Produced p(data.data(), {3, -4}, kF32);
    expect_error(p, "shape [3, -4]");
  }
  {
    Produced p(data.data(), {1, 1, 1, 1, 1, 1, 1, 1, 1}, kF32);
    expect_error(p, "at most 8");
  }
  if (!cuda_available()) {
    Produced p(data.data(), {3, 4}, kF32, {dlpack::kDLCUDA, 0});
    try {
      (void)from_dlpack(&p.m);
      ADD_FAILURE() << "a CUDA tensor taken without a usable GPU";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("Device::cuda(0)"), std::string::npos) << e.what();
    }
    EXPECT_EQ(p.deleted, 0);
  }
  EXPECT_THROW((void)from_dlpack(nullptr), Error);
  EXPECT_THROW((void)to_dlpack(Tensor()), Error);
  // And the library keeps working.
  Produced ok(data.data(), {3, 4}, kF32);
  EXPECT_DOUBLE_EQ(sum(from_dlpack(&ok.m)).item(), 12.0);
}

}  // namespace
}  // namespace dualcast
