// core.cpp: dualcast._core, the pybind11 binding of the C++ library: dualcast.Tensor (factories,
// conversions, sum, item) and zero-copy DLPack exchange both ways (include/dualcast/dlpack.hpp)
// with the DLPack Python protocol's stream semantics. python/dualcast/core.py is its Python face.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dualcast/dlpack.hpp"
#include "dualcast/half.hpp"
#include "dualcast/ops/reduce.hpp"
#include "dualcast/stream.hpp"
#include "dualcast/tensor.hpp"

namespace py = pybind11;

namespace {

using dualcast::Device;
using dualcast::DType;
using dualcast::Error;
using dualcast::Tensor;
namespace dl = dualcast::dlpack;

// Leaked on purpose: a static py::object would be released after the interpreter has gone.
PyObject* error_type = nullptr;

// DLPack >= 1.0's versioned structure (dlpack.h), which the C++ half does not declare: producers
// asked with max_version=(1, 0) (NumPy 2, PyTorch >= 2.9) hand it out, and it is unwrapped here.
struct DLPackVersion {
  std::uint32_t major, minor;
};
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  std::uint64_t flags;
  dl::DLTensor dl_tensor;
};
constexpr std::uint64_t kReadOnly = 1;  // DLPACK_FLAG_BITMASK_READ_ONLY

const char* const kLegacy = "dltensor";
const char* const kLegacyUsed = "used_dltensor";
const char* const kVersioned = "dltensor_versioned";
const char* const kVersionedUsed = "used_dltensor_versioned";

std::string strip_prefix(std::string s) {
  if (s.rfind("dualcast: ", 0) == 0) s.erase(0, 10);
  return s;
}

[[noreturn]] void fail(const std::string& message) { throw Error("dualcast: " + message); }

// ---- arguments ----------------------------------------------------------------------------------

// Strings, and anything whose str() is one (torch.float32, torch.device, numpy.dtype), so that a
// caller may pass the other library's objects.
std::string spelling(const py::handle& obj) {
  std::string s = py::str(obj);
  if (s.rfind("torch.", 0) == 0) s.erase(0, 6);
  return s;
}

DType parse_dtype(const py::handle& obj, const char* op) {
  const std::string s = spelling(obj);
  for (DType t : {DType::float32, DType::float64, DType::bfloat16, DType::float16, DType::uint8})
    if (s == dualcast::dtype_name(t)) return t;
  fail(std::string(op) + ": argument dtype: '" + s +
       "' is not a dualcast dtype (float32, float64, bfloat16, float16, uint8)");
}

Device parse_device(const py::handle& obj, const char* op) {
  const std::string s = spelling(obj);
  try {
    return Device::parse(s);
  } catch (const Error& e) {
    fail(std::string(op) + ": argument device: " + strip_prefix(e.what()));
  }
}

// Python ints and whatever has __index__ (numpy.int64, a 0-d integer tensor), but not bools; one
// that does not fit 64 bits is an error naming the argument rather than pybind11's cast failure.
bool is_index(const py::handle& v) { return PyIndex_Check(v.ptr()) && !PyBool_Check(v.ptr()); }

std::int64_t index_arg(const py::handle& v, const std::string& op, const std::string& arg) {
  if (!is_index(v))
    throw py::type_error(op + ": argument " + arg + ": " + std::string(py::repr(v)) + " is not an int");
  const py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));
  if (!i) throw py::error_already_set();
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow != 0) fail(op + ": argument " + arg + ": " + std::string(py::repr(v)) + " does not fit 64 bits");
  return x;
}

dualcast::Shape parse_shape(const py::handle& obj, const char* op) {
  std::vector<std::int64_t> dims;
  if (is_index(obj)) {
    dims.push_back(index_arg(obj, op, "shape"));
  } else if (py::isinstance<py::sequence>(obj) && !py::isinstance<py::str>(obj)) {
    for (const py::handle d : obj) {
      if (!is_index(d))
        throw py::type_error(std::string(op) + ": argument shape: " + std::string(py::repr(obj)) +
                             " is not a sequence of ints");
      dims.push_back(index_arg(d, op, "shape"));
    }
  } else {
    throw py::type_error(std::string(op) + ": argument shape: " + std::string(py::repr(obj)) +
                         " is not an int or a sequence of ints");
  }
  if (dims.size() > static_cast<std::size_t>(dualcast::kMaxRank))
    fail(std::string(op) + ": argument shape: " + std::to_string(dims.size()) +
         " dimensions; dualcast's tensors have at most " + std::to_string(dualcast::kMaxRank));
  const dualcast::Shape shape(dims);
  dualcast::checked_numel(op, "shape", shape);
  return shape;
}

py::tuple shape_tuple(const dualcast::Shape& s) {
  py::tuple t(s.rank());
  for (int i = 0; i < s.rank(); ++i) t[i] = py::int_(s[i]);
  return t;
}

// ---- DLPack: producer ---------------------------------------------------------------------------

void capsule_destructor(PyObject* capsule) {
  // A capsule nobody consumed still owns its tensor. The error indicator is kept: this may run
  // while an exception is on its way out.
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  if (PyCapsule_IsValid(capsule, kLegacy)) {
    auto* m = static_cast<dl::DLManagedTensor*>(PyCapsule_GetPointer(capsule, kLegacy));
    if (m != nullptr && m->deleter != nullptr) m->deleter(m);
  }
  PyErr_Restore(type, value, traceback);
}

/// The capsule of t; `prepare` adjusts the managed tensor first (it must not throw after changing it).
py::capsule make_capsule(const Tensor& t, const std::function<void(dl::DLManagedTensor*)>& prepare = {}) {
  dl::DLManagedTensor* m = dualcast::to_dlpack(t);
  if (prepare) {
    try {
      prepare(m);
    } catch (...) {
      m->deleter(m);
      throw;
    }
  }
  PyObject* capsule = PyCapsule_New(m, kLegacy, capsule_destructor);
  if (capsule == nullptr) {
    m->deleter(m);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(capsule);
}

#if DUALCAST_WITH_CUDA
// Makes the consumer's stream wait for what dualcast has queued on `device` so far (DLPack's
// __dlpack__(stream=...)), and returns that stream, or null where no ordering is needed. None and 1
// name the legacy default stream, which already waits for dualcast's stream because that one is a
// blocking stream (stream.hpp), and is waited for by it; -1 asks for no ordering. Any other stream,
// the per-thread default (2) included, waits on an event.
cudaStream_t order_for_consumer(Device device, const py::object& stream) {
  if (stream.is_none()) return nullptr;
  const auto s = static_cast<std::intptr_t>(index_arg(stream, "Tensor.__dlpack__", "stream"));
  if (s == -1 || s == 1) return nullptr;
  if (s == 0 || s < -1)
    throw py::value_error("Tensor.__dlpack__: argument stream=" + std::to_string(s) + " for a tensor on " +
                          device.str() + ": CUDA streams are None, -1, 1 (legacy default), 2 (per-thread "
                          "default) or a cudaStream_t; 0 is ambiguous and not allowed by DLPack");
  const cudaStream_t ours = dualcast::detail::stream(device);
  const cudaStream_t consumer = s == 2 ? cudaStreamPerThread : reinterpret_cast<cudaStream_t>(s);
  if (consumer == ours) return nullptr;
  dualcast::detail::DeviceGuard guard(device);  // the event must belong to the stream's device
  cudaEvent_t event = nullptr;
  DUALCAST_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  cudaError_t status = cudaEventRecord(event, ours);
  if (status == cudaSuccess) status = cudaStreamWaitEvent(consumer, event, 0);
  cudaEventDestroy(event);  // CUDA keeps it until the wait is satisfied
  DUALCAST_CUDA_CHECK(status);
  return consumer;
}

// A CUDA tensor handed to a consumer on another stream: when the consumer drops it, its block goes
// back to dualcast's caching allocator, which hands blocks out again in the order of dualcast's
// stream. So before the tensor is released, dualcast's stream is made to wait for everything the
// consumer has queued on its stream so far (its reads and writes of the block): the next owner of
// the block cannot start before them. The consumer's stream must still exist when it drops the
// tensor, which DLPack asks of it anyway.
struct StreamedExport {
  void* inner_ctx;
  void (*inner_deleter)(dl::DLManagedTensor*);
  Device device;
  cudaStream_t consumer;
};

void release_after_consumer(dl::DLManagedTensor* m) {
  auto* e = static_cast<StreamedExport*>(m->manager_ctx);
  {
    dualcast::detail::DeviceGuard guard(e->device);
    cudaEvent_t event = nullptr;
    cudaError_t status = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (status == cudaSuccess) status = cudaEventRecord(event, e->consumer);
    if (status == cudaSuccess) status = cudaStreamWaitEvent(dualcast::detail::stream(e->device), event, 0);
    if (event != nullptr) cudaEventDestroy(event);
    // A deleter cannot throw; where the ordering failed, wait for the whole device instead (slower,
    // still safe).
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      (void)cudaDeviceSynchronize();
    }
  }
  m->manager_ctx = e->inner_ctx;
  m->deleter = e->inner_deleter;
  delete e;
  m->deleter(m);
}

/// Makes m's deleter order dualcast's stream after `consumer` first (see StreamedExport).
void release_after(dl::DLManagedTensor* m, Device device, cudaStream_t consumer) {
  m->manager_ctx = new StreamedExport{m->manager_ctx, m->deleter, device, consumer};
  m->deleter = release_after_consumer;
}
#endif

py::capsule export_dlpack(const Tensor& t, const py::object& stream, const py::object& max_version,
                          const py::object& dl_device, const py::object& copy) {
  if (!stream.is_none() && !is_index(stream))
    throw py::type_error("Tensor.__dlpack__: argument stream must be an int or None, not " +
                         std::string(py::repr(stream)));
  // Only unversioned capsules are made: a consumer that passes max_version=(1, x) must accept one
  // (the DLPack protocol says so, and NumPy and PyTorch do). The argument is still checked.
  if (!max_version.is_none() &&
      !(py::isinstance<py::tuple>(max_version) && py::len(max_version) == 2 &&
        py::isinstance<py::int_>(max_version[py::int_(0)]) && py::isinstance<py::int_>(max_version[py::int_(1)])))
    throw py::type_error("Tensor.__dlpack__: argument max_version must be None or a (major, minor) tuple of ints, not " +
                         std::string(py::repr(max_version)));
  if (!copy.is_none() && !py::isinstance<py::bool_>(copy))
    throw py::type_error("Tensor.__dlpack__: argument copy must be None, True or False, not " +
                         std::string(py::repr(copy)));
  Tensor out = t;
  bool copied = false;
  if (!dl_device.is_none()) {
    if (!py::isinstance<py::tuple>(dl_device) || py::len(dl_device) != 2 || !is_index(dl_device[py::int_(0)]) ||
        !is_index(dl_device[py::int_(1)]))
      throw py::type_error("Tensor.__dlpack__: argument dl_device must be None or a (device type, index) tuple "
                           "of ints, not " + std::string(py::repr(dl_device)));
    const auto type = index_arg(dl_device[py::int_(0)], "Tensor.__dlpack__", "dl_device");
    const auto index = static_cast<int>(index_arg(dl_device[py::int_(1)], "Tensor.__dlpack__", "dl_device"));
    Device want = Device::cpu();
    if (type == dl::kDLCUDA) {
      try {
        want = Device::cuda(index);
      } catch (const Error& e) {
        throw py::buffer_error("Tensor.__dlpack__: argument dl_device=(2, " + std::to_string(index) +
                               ") for a tensor on " + t.device().str() + ": " + strip_prefix(e.what()));
      }
    } else if (type != dl::kDLCPU) {
      throw py::buffer_error("Tensor.__dlpack__: argument dl_device=" + std::string(py::repr(dl_device)) +
                             ": dualcast exports to CPU (1, 0) and CUDA (2, N) only; the tensor is on " +
                             t.device().str());
    }
    if (want != t.device()) {
      if (!copy.is_none() && !copy.cast<bool>())
        throw py::buffer_error("Tensor.__dlpack__: the tensor is on " + t.device().str() + ", dl_device is " +
                               want.str() + ", and copy=False forbids the copy that needs");
      out = t.to(want);
      copied = true;
    }
  }
  if (!copy.is_none() && copy.cast<bool>() && !copied) out = t.clone();
  if (out.device().is_cuda()) {
#if DUALCAST_WITH_CUDA
    const cudaStream_t consumer = order_for_consumer(out.device(), stream);
    if (consumer != nullptr)
      return make_capsule(out, [&](dl::DLManagedTensor* m) { release_after(m, out.device(), consumer); });
#endif
  }
  // On the CPU dualcast's operations have finished when they return, so there is nothing to order:
  // DLPack allows no stream there but None (and -1, "no synchronisation", does no harm).
  if (!out.device().is_cuda() && !stream.is_none() && index_arg(stream, "Tensor.__dlpack__", "stream") != -1)
    throw py::buffer_error("Tensor.__dlpack__: argument stream=" + std::string(py::repr(stream)) +
                           " for a tensor on cpu: a CPU tensor takes stream=None");
  return make_capsule(out);
}

py::tuple dlpack_device(const Tensor& t) {
  return t.device().is_cuda() ? py::make_tuple(static_cast<int>(dl::kDLCUDA), t.device().index)
                              : py::make_tuple(static_cast<int>(dl::kDLCPU), 0);
}

// ---- DLPack: consumer ---------------------------------------------------------------------------

// What dualcast::from_dlpack is handed: a copy of the producer's DLTensor (its shape and strides
// still point into the producer's structure) whose deleter calls the producer's.
struct Imported {
  dl::DLManagedTensor managed{};
  dl::DLManagedTensor* legacy = nullptr;
  DLManagedTensorVersioned* versioned = nullptr;
};

void release_imported(dl::DLManagedTensor* self) {
  auto* imported = static_cast<Imported*>(self->manager_ctx);
  // A producer's deleter may touch Python objects (NumPy's drops its array), and dualcast may drop
  // the last handle on a thread without the GIL. Once the interpreter is gone the producer's memory
  // is left to the process's end rather than freed through a dead interpreter.
  if (Py_IsInitialized()) {
    const PyGILState_STATE gil = PyGILState_Ensure();
    if (imported->legacy != nullptr && imported->legacy->deleter != nullptr) imported->legacy->deleter(imported->legacy);
    if (imported->versioned != nullptr && imported->versioned->deleter != nullptr)
      imported->versioned->deleter(imported->versioned);
    PyGILState_Release(gil);
  }
  delete imported;
}

std::string describe(const dl::DLTensor& t) {
  std::string s = "shape [";
  for (int i = 0; i < t.ndim && t.shape != nullptr; ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  const int code = t.dtype.code;
  const char* kind = code == dl::kDLInt ? "int" : code == dl::kDLUInt ? "uint" : code == dl::kDLFloat ? "float"
                     : code == dl::kDLBfloat ? "bfloat" : code == 5 ? "complex" : code == 6 ? "bool" : nullptr;
  s += "], dtype " + (kind ? std::string(kind) : "code " + std::to_string(code) + " ") + std::to_string(t.dtype.bits);
  if (t.dtype.lanes != 1) s += "x" + std::to_string(t.dtype.lanes);
  const int type = t.device.device_type;
  s += ", device " + (type == dl::kDLCPU ? std::string("cpu")
                      : type == dl::kDLCUDA ? "cuda:" + std::to_string(t.device.device_id)
                      : "DLPack type " + std::to_string(type) + " index " + std::to_string(t.device.device_id));
  return s;
}

// `source` names what the capsule came from, in errors only (made there: a round trip is a few
// microseconds, and the name is two attribute lookups and a concatenation).
Tensor import_capsule(const py::object& capsule, const std::function<std::string()>& source) {
  const char* name = PyCapsule_GetName(capsule.ptr());
  if (name == nullptr) throw py::error_already_set();
  const std::string n(name);
  if (n == kLegacyUsed || n == kVersionedUsed)
    fail("from_dlpack: argument obj (" + source() + ") was already consumed: a DLPack capsule can be imported once");
  auto imported = std::make_unique<Imported>();
  const dl::DLTensor* producer = nullptr;
  if (n == kLegacy) {
    imported->legacy = static_cast<dl::DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), kLegacy));
    if (imported->legacy == nullptr) throw py::error_already_set();
    producer = &imported->legacy->dl_tensor;
  } else if (n == kVersioned) {
    auto* v = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(capsule.ptr(), kVersioned));
    if (v == nullptr) throw py::error_already_set();
    if (v->version.major != 1)
      fail("from_dlpack: argument obj (" + source() + "): DLPack version " + std::to_string(v->version.major) + "." +
           std::to_string(v->version.minor) + "; dualcast reads 0.x and 1.x");
    if (v->flags & kReadOnly)
      fail("from_dlpack: argument obj (" + source() + ", " + describe(v->dl_tensor) +
           ") is read-only, and dualcast tensors are writable; pass a writable array or a copy");
    imported->versioned = v;
    producer = &v->dl_tensor;
  } else {
    throw py::type_error("dualcast.core.from_dlpack: argument obj is a capsule named '" + n +
                         "', not a DLPack tensor ('dltensor' or 'dltensor_versioned')");
  }
  imported->managed.dl_tensor = *producer;
  imported->managed.manager_ctx = imported.get();
  imported->managed.deleter = release_imported;
  Tensor t;
  try {
    t = dualcast::from_dlpack(&imported->managed);  // on an Error nothing is taken: the capsule still owns it
  } catch (const Error& e) {
    std::string why = strip_prefix(e.what());
    if (why.rfind("from_dlpack: argument m: ", 0) == 0) why.erase(0, 25);
    fail("from_dlpack: argument obj (" + source() + ", " + describe(*producer) + "): " + why);
  }
  imported.release();  // now the tensor's: release_imported deletes it
  PyCapsule_SetName(capsule.ptr(), n == kLegacy ? kLegacyUsed : kVersionedUsed);
  return t;
}

Tensor from_dlpack(const py::object& obj) {
  const auto what = [&obj] {
    return std::string(py::str(py::type::handle_of(obj).attr("__module__"))) + "." +
           std::string(py::str(py::type::handle_of(obj).attr("__qualname__")));
  };
  if (PyCapsule_CheckExact(obj.ptr())) return import_capsule(obj, [] { return std::string("a capsule"); });
  if (!py::hasattr(obj, "__dlpack__"))
    throw py::type_error("dualcast.core.from_dlpack: argument obj (" + what() +
                         ") has no __dlpack__ method and is not a DLPack capsule");
  // The producer orders its work before the stream named here: dualcast's, for a CUDA tensor
  // (DLPack's consumer side); None for host memory.
  py::object stream = py::none();
  if (py::hasattr(obj, "__dlpack_device__")) {
    py::tuple device = obj.attr("__dlpack_device__")();
    const int type = device[0].cast<int>(), index = device[1].cast<int>();
    if (type == dl::kDLCUDA || type == dl::kDLCUDAManaged) {
#if DUALCAST_WITH_CUDA
      Device d;
      try {
        d = Device::cuda(index);
      } catch (const Error& e) {
        fail("from_dlpack: argument obj (" + what() + ") is on cuda:" + std::to_string(index) + ": " +
             strip_prefix(e.what()));
      }
      stream = py::int_(reinterpret_cast<std::intptr_t>(dualcast::detail::stream(d)));
#else
      fail("from_dlpack: argument obj (" + what() + ") is on cuda:" + std::to_string(index) +
           ", and this dualcast was built without CUDA");
#endif
    } else if (type != dl::kDLCPU && type != dl::kDLCUDAHost) {
      fail("from_dlpack: argument obj (" + what() + ") is on DLPack device type " + std::to_string(type) +
           " (dualcast takes CPU, CUDA-pinned host, CUDA and CUDA managed memory: types 1, 3, 2 and 13)");
    }
  }
  // max_version=(1, 0) first (a versioned capsule, or an unversioned one from older producers);
  // producers that predate the keyword (PyTorch < 2.9, NumPy < 2) raise TypeError and are asked again
  // without it, as NumPy's and PyTorch's own from_dlpack do.
  py::object capsule;
  try {
    capsule = obj.attr("__dlpack__")(py::arg("stream") = stream, py::arg("max_version") = py::make_tuple(1, 0));
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;
    capsule = obj.attr("__dlpack__")(py::arg("stream") = stream);
  }
  if (!PyCapsule_CheckExact(capsule.ptr()))
    throw py::type_error("dualcast.core.from_dlpack: argument obj (" + what() + "): __dlpack__ returned " +
                         std::string(py::repr(capsule)) + ", not a capsule");
  return import_capsule(capsule, what);
}

// ---- values -------------------------------------------------------------------------------------

py::object nested(const std::vector<double>& v, const dualcast::Shape& s, int dim, std::size_t& at, bool integral) {
  if (dim == s.rank()) {
    const double x = v[at++];
    return integral ? py::object(py::int_(static_cast<long long>(x))) : py::object(py::float_(x));
  }
  py::list out;
  for (std::int64_t i = 0; i < s[dim]; ++i) out.append(nested(v, s, dim + 1, at, integral));
  return out;
}

py::object tolist(const Tensor& t) {
  const std::vector<double> v = t.to_vector<double>();
  std::size_t at = 0;
  return nested(v, t.shape(), 0, at, t.dtype() == DType::uint8);
}

// Tensor::to converts without checking range, so the values `dtype` cannot hold are refused here:
// for the 16-bit types by Tensor::fill_'s rule (a finite value that the library's own rounding makes
// infinite), for uint8 anything but the integers 0 to 255 (a conversion would wrap).
void check_representable(const std::vector<double>& values, DType dtype) {
  for (const double v : values) {
    if (dtype == DType::uint8 && !(std::isfinite(v) && v == std::floor(v) && v >= 0 && v <= 255))
      fail("tensor: argument data holds " + std::string(py::repr(py::float_(v))) +
           ", which uint8 cannot hold (integers 0 to 255)");
    if (dualcast::is_half(dtype) && std::isfinite(v)) {
      const float stored = dtype == DType::float16 ? static_cast<float>(dualcast::float16(v))
                                                   : static_cast<float>(dualcast::bfloat16(v));
      if (!std::isfinite(stored))
        fail("tensor: argument data holds " + std::string(py::repr(py::float_(v))) + ", outside " +
             dualcast::dtype_name(dtype) + "'s finite range (largest " +
             (dtype == DType::float16 ? "65504" : "3.39e38") +
             "); it would be stored as infinity (scale the values, or use bfloat16 or float32)");
    }
  }
}

Tensor from_values(const std::vector<double>& values, const py::object& shape, const py::object& dtype,
                   const py::object& device) {
  const dualcast::Shape s = parse_shape(shape, "tensor");
  if (static_cast<std::int64_t>(values.size()) != s.numel())
    fail("tensor: " + std::to_string(values.size()) + " values for shape " + s.str());
  const DType t = parse_dtype(dtype, "tensor");
  check_representable(values, t);
  return Tensor::from_vector<double>(s, values, Device::cpu()).to(t).to(parse_device(device, "tensor"));
}

std::string repr(const Tensor& t) {
  std::string shape = "(";  // as Python writes a tuple
  for (int i = 0; i < t.rank(); ++i) shape += (i ? ", " : "") + std::to_string(t.shape()[i]);
  shape += t.rank() == 1 ? ",)" : ")";
  return "dualcast.Tensor(shape=" + shape + ", dtype=" + dualcast::dtype_name(t.dtype()) + ", device=" +
         t.device().str() + ")";
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "dualcast's C++ tensors with zero-copy DLPack exchange (python/dualcast/core.py is its face)";

  // dualcast::Error covers argument errors (ValueError in Python's terms) and CUDA failures
  // (RuntimeError), so the class is both: `except ValueError` catches a bad shape or dtype.
  py::tuple bases = py::make_tuple(py::handle(PyExc_RuntimeError), py::handle(PyExc_ValueError));
  error_type = PyErr_NewExceptionWithDoc("dualcast._core.Error", "An error dualcast's C++ library raised",
                                         bases.ptr(), nullptr);
  if (error_type == nullptr) throw py::error_already_set();
  m.attr("Error") = py::handle(error_type);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      PyErr_SetString(error_type, e.what());
    }
  });

  m.def("build_info", [] {
    py::dict info;
    info["version"] = std::to_string(DUALCAST_VERSION_MAJOR) + "." + std::to_string(DUALCAST_VERSION_MINOR) + "." +
                      std::to_string(DUALCAST_VERSION_PATCH);
    info["cuda"] = static_cast<bool>(DUALCAST_WITH_CUDA);
    info["cuda_devices"] = dualcast::cuda_device_count();
    info["pybind11"] = std::to_string(PYBIND11_VERSION_MAJOR) + "." + std::to_string(PYBIND11_VERSION_MINOR) + "." +
                       std::to_string(PYBIND11_VERSION_PATCH);
    return info;
  });

  py::class_<Tensor>(m, "Tensor", "A dualcast tensor: a handle (copies share memory), CPU or CUDA")
      .def_property_readonly("shape", [](const Tensor& t) { return shape_tuple(t.shape()); })
      .def_property_readonly("dtype", [](const Tensor& t) { return std::string(dualcast::dtype_name(t.dtype())); })
      .def_property_readonly("device", [](const Tensor& t) { return t.device().str(); })
      .def_property_readonly("ndim", &Tensor::rank)
      .def_property_readonly("nbytes", &Tensor::nbytes)
      .def("numel", &Tensor::numel)
      .def("data_ptr", [](const Tensor& t) { return reinterpret_cast<std::uintptr_t>(t.raw_data()); })
      .def("__repr__", &repr)
      .def("to", [](const Tensor& t, const py::object& where) {
             // A dtype or a device: the dtype names and "cpu"/"cuda[:N]" do not overlap.
             const std::string s = spelling(where);
             if (s == "cpu" || s.rfind("cuda", 0) == 0) return t.to(parse_device(where, "Tensor.to"));
             return t.to(parse_dtype(where, "Tensor.to"));
           }, py::arg("dtype_or_device"))
      .def("clone", &Tensor::clone)
      .def("sum", [](const Tensor& t) { return dualcast::sum(t); })
      .def("item", &Tensor::item)
      .def("tolist", &tolist)
      .def("fill_", [](Tensor& t, double v) -> Tensor& { return t.fill_(v); }, py::arg("value"),
           py::return_value_policy::reference_internal)
      .def("copy_", [](Tensor& t, const Tensor& src) -> Tensor& { return t.copy_(src); }, py::arg("src"),
           py::return_value_policy::reference_internal)
      .def("__dlpack__", &export_dlpack, py::arg("stream") = py::none(), py::kw_only(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(), py::arg("copy") = py::none())
      .def("__dlpack_device__", &dlpack_device);

  m.def("from_dlpack", &from_dlpack, py::arg("obj"),
        "A dualcast tensor sharing obj's memory: anything with __dlpack__, or a 'dltensor' capsule");
  m.def("zeros", [](const py::object& shape, const py::object& dtype, const py::object& device) {
    return Tensor::zeros(parse_shape(shape, "zeros"), parse_dtype(dtype, "zeros"), parse_device(device, "zeros"));
  }, py::arg("shape"), py::arg("dtype") = "float32", py::arg("device") = "cpu");
  m.def("ones", [](const py::object& shape, const py::object& dtype, const py::object& device) {
    return Tensor::ones(parse_shape(shape, "ones"), parse_dtype(dtype, "ones"), parse_device(device, "ones"));
  }, py::arg("shape"), py::arg("dtype") = "float32", py::arg("device") = "cpu");
  m.def("empty", [](const py::object& shape, const py::object& dtype, const py::object& device) {
    return Tensor::empty(parse_shape(shape, "empty"), parse_dtype(dtype, "empty"), parse_device(device, "empty"));
  }, py::arg("shape"), py::arg("dtype") = "float32", py::arg("device") = "cpu");
  m.def("full", [](const py::object& shape, double value, const py::object& dtype, const py::object& device) {
    return Tensor::full(parse_shape(shape, "full"), value, parse_dtype(dtype, "full"), parse_device(device, "full"));
  }, py::arg("shape"), py::arg("value"), py::arg("dtype") = "float32", py::arg("device") = "cpu");
  m.def("arange", [](double start, const py::object& stop, double step, const py::object& dtype,
                     const py::object& device) {
    const double lo = stop.is_none() ? 0.0 : start, hi = stop.is_none() ? start : stop.cast<double>();
    return Tensor::arange(lo, hi, step, parse_dtype(dtype, "arange"), parse_device(device, "arange"));
  }, py::arg("start"), py::arg("stop") = py::none(), py::arg("step") = 1.0, py::arg("dtype") = "float32",
        py::arg("device") = "cpu");
  m.def("randn", [](const py::object& shape, std::uint64_t seed, const py::object& dtype, const py::object& device) {
    return Tensor::randn(parse_shape(shape, "randn"), parse_device(device, "randn"), seed, parse_dtype(dtype, "randn"));
  }, py::arg("shape"), py::arg("seed") = 0, py::arg("dtype") = "float32", py::arg("device") = "cpu");
  m.def("_from_values", &from_values, py::arg("values"), py::arg("shape"), py::arg("dtype"), py::arg("device"));
}
