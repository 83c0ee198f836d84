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
#include "dualcast/graph.hpp"
#include "dualcast/memory.hpp"
#include "dualcast/stream.hpp"
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
  // Only the DLPack tensor holds the memory now: a new tensor of the same size must get other memory
  // (the caching allocator would hand back a freed block), and taking the DLPack tensor back reads
  // the same values in place.
  const Tensor other = Tensor::full({2, 3}, -1.0, DType::float32, dev);
  void* data = m->dl_tensor.data;
  EXPECT_NE(other.raw_data(), data);
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

TEST_P(DlpackOnDevices, ANarrowedTensorExportsItsOwnFirstElement) {
  const Device dev = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(dev);
  const Tensor t = Tensor::from_vector<float>({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8}, dev);
  const Tensor rows = t.narrow(1, 2);  // rows 1 and 2: 8 bytes into t's memory
  const Tensor back = from_dlpack(to_dlpack(rows));
  EXPECT_EQ(back.raw_data(), static_cast<char*>(t.raw_data()) + 2 * sizeof(float));
  EXPECT_EQ(back.to_vector<float>(), (std::vector<float>{3, 4, 5, 6}));
}

TEST_P(DlpackOnDevices, ARoundTripGivesBackEveryByteItHeld) {
  const Device dev = GetParam();
  DUALCAST_SKIP_IF_UNAVAILABLE(dev);
  const std::int64_t before = memory_stats(dev).bytes_in_use;
  {
    const Tensor u = from_dlpack(to_dlpack(Tensor::ones({64, 33}, DType::float32, dev)));
    EXPECT_GT(memory_stats(dev).bytes_in_use, before);
  }
  EXPECT_EQ(memory_stats(dev).bytes_in_use, before);
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

TEST(Dlpack, WrappedMemoryWithoutAReleaseIsNeverFreedByDualcast) {
  // The owner frees it itself (here: the vector); dualcast must not free or cache it.
  std::vector<float> data = {1, 2, 3, 4};
  {
    const Tensor t = Tensor::wrap(data.data(), {4}, DType::float32, Device::cpu(), {});
    EXPECT_EQ(t.to_vector<float>(), data);
  }
  data.push_back(5);  // the vector still owns (and may grow) its memory
  EXPECT_EQ(data.size(), 5u);
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
  {
    // A GPU this process cannot use: device 0 without CUDA, one past the last GPU with it.
    const std::int32_t id = cuda_available() ? cuda_device_count() : 0;
    Produced p(data.data(), {3, 4}, kF32, {dlpack::kDLCUDA, id});
    try {
      (void)from_dlpack(&p.m);
      ADD_FAILURE() << "a CUDA tensor taken without a usable GPU";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("from_dlpack"), std::string::npos) << what;
      EXPECT_NE(what.find("Device::cuda(" + std::to_string(id) + ")"), std::string::npos) << what;
    }
    EXPECT_EQ(p.deleted, 0);
  }
  EXPECT_THROW((void)from_dlpack(nullptr), Error);
  EXPECT_THROW((void)to_dlpack(Tensor()), Error);
  // And the library keeps working.
  Produced ok(data.data(), {3, 4}, kF32);
  EXPECT_DOUBLE_EQ(sum(from_dlpack(&ok.m)).item(), 12.0);
}

#if DUALCAST_WITH_CUDA
}  // namespace
}  // namespace dualcast
#include <cuda_runtime_api.h>
namespace dualcast {
namespace {

// Another library's GPU memory (cudaMalloc'd here), freed by its deleter.
struct ForeignGpu {
  float* data = nullptr;
  Produced* p = nullptr;
  static inline int freed = 0;
  explicit ForeignGpu(std::int64_t n) {
    EXPECT_EQ(cudaMalloc(&data, static_cast<std::size_t>(n) * sizeof(float)), cudaSuccess);
    p = new Produced(data, {n}, kF32, {dlpack::kDLCUDA, 0});
    p->m.manager_ctx = this;
    p->m.deleter = [](DLManagedTensor* self) {
      auto* f = static_cast<ForeignGpu*>(self->manager_ctx);
      // An owner may hand the memory out again at once, on its own stream: everything dualcast
      // queued on it must be finished by now (cudaFree itself would wait, so it cannot tell).
      EXPECT_EQ(cudaStreamQuery(detail::stream(Device::cuda(0))), cudaSuccess);
      EXPECT_EQ(cudaFree(f->data), cudaSuccess);
      ++freed;
      delete f->p;
      delete f;
    };
  }
};

TEST(DlpackCuda, AnImportedGpuTensorIsFreedByItsOwnerOnlyAfterDualcastsWorkOnIt) {
  DUALCAST_REQUIRE_CUDA();
  const Device dev = Device::cuda(0);
  ForeignGpu::freed = 0;
  constexpr std::int64_t n = 1 << 22;
  Tensor total;
  {
    Tensor u = from_dlpack(&(new ForeignGpu(n))->p->m);
    u.fill_(2.0);
    total = sum(u * u * u);  // queued on dualcast's stream; the deleter must wait for it
  }
  EXPECT_EQ(ForeignGpu::freed, 1);
  EXPECT_DOUBLE_EQ(total.item(), 8.0 * static_cast<double>(n));
  (void)dev;
}

TEST(DlpackCuda, AnImportedGpuTensorDroppedDuringACaptureLivesAsLongAsTheGraph) {
  DUALCAST_REQUIRE_CUDA();
  const Device dev = Device::cuda(0);
  ForeignGpu::freed = 0;
  Tensor out = Tensor::zeros({1024}, DType::float32, dev);
  {
    Graph g;
    Tensor imported = from_dlpack(&(new ForeignGpu(1024))->p->m);
    imported.fill_(3.0);
    g.capture(dev, [&] {
      out.copy_(imported * 2.0);
      imported = Tensor();  // the last handle goes while capturing: the replays still read it
    });
    EXPECT_EQ(ForeignGpu::freed, 0);
    out.fill_(0.0);
    g.replay();
    EXPECT_EQ(out.to_vector<float>()[1023], 6.0f);
    EXPECT_EQ(ForeignGpu::freed, 0);
  }
  EXPECT_EQ(ForeignGpu::freed, 1);  // with the graph's memory pool
}
#endif

}  // namespace
}  // namespace dualcast
