// dualcast's compiled launcher for PyTorch (python/dualcast/native.py builds it with
// torch.utils.cpp_extension at first use). A call of an elementwise function whose signature has
// been seen before runs here from start to end: the signature's key, the output allocation, the
// kernel launch (the CPU kernel's entry point, or cuLaunchKernel on PyTorch's current stream) and
// the autograd node, whose backward launches the gradient kernel. The Python path (dualcast/torch.py)
// decides everything once per signature and hands it over with Function.add; the kernels, their
// launch plans and every check stay in Python. Why: a call through Python costs 14-27 us of host
// time, most of it interpreter work around a launch of a few microseconds (python/README.md).
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#ifdef DUALCAST_NATIVE_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace py = pybind11;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// The CUDA driver's entry points, as dualcast.cuda loaded them (their addresses, set once by
// set_driver): the launcher links no CUDA library of its own, so it uses the driver the kernels were
// loaded with.
using CuCtxPush = int (*)(void*);
using CuCtxPop = int (*)(void**);
using CuLaunch = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                         void**, void**);
using CuErrorName = int (*)(int, const char**);
CuCtxPush cu_push = nullptr;
CuCtxPop cu_pop = nullptr;
CuLaunch cu_launch = nullptr;
CuErrorName cu_error_name = nullptr;

void set_driver(std::uintptr_t push, std::uintptr_t pop, std::uintptr_t launch, std::uintptr_t error_name) {
  cu_push = reinterpret_cast<CuCtxPush>(push);
  cu_pop = reinterpret_cast<CuCtxPop>(pop);
  cu_launch = reinterpret_cast<CuLaunch>(launch);
  cu_error_name = reinterpret_cast<CuErrorName>(error_name);
}

// One kernel over one layout of its arguments: what dualcast.jit._Launch (CPU) or
// dualcast.cuda._Launch (CUDA) holds, read from its describe(). Addresses come per call.
struct Launch {
  enum Kind { none, cpu, cuda } kind = none;  // none: an empty call, nothing to launch
  std::size_t nin = 0, nout = 0, npart = 0;
  // CPU: dualcast_jit_run(int64 words): ndim, &shape, &in, &strides, &out, &partials, threads.
  int (*run)(std::int64_t*) = nullptr;
  std::vector<std::int64_t> shape, strides;  // never empty (a 0-dimensional call has one word each)
  std::int64_t ndim = 0, threads = 1;
  // CUDA: the Args struct with the shape and strides filled in, and where the addresses go.
  void* ctx = nullptr;
  void* fn = nullptr;
  unsigned grid_x = 0, grid_y = 0, block = 0;
  std::vector<unsigned char> args;
  std::size_t off_in = 0, off_out = 0, off_part = 0, off_vec = 0;
  bool vec_possible = false;  // the plan's strides allow vector accesses; the addresses decide per call
  std::uint64_t unit = 0, vec_bytes = 1;

  static Launch from(const py::tuple& d) {
    Launch l;
    const auto kind = d[0].cast<std::string>();
    if (kind == "none") return l;
    if (kind == "cpu") {
      l.kind = cpu;
      l.run = reinterpret_cast<int (*)(std::int64_t*)>(d[1].cast<std::uintptr_t>());
      l.shape = d[2].cast<std::vector<std::int64_t>>();
      l.strides = d[3].cast<std::vector<std::int64_t>>();
      l.nin = d[4].cast<std::size_t>();
      l.nout = d[5].cast<std::size_t>();
      l.npart = d[6].cast<std::size_t>();
      l.threads = d[7].cast<std::int64_t>();
      l.ndim = static_cast<std::int64_t>(l.shape.size());
      if (l.shape.empty()) l.shape.push_back(1);
      if (l.strides.empty()) l.strides.push_back(0);
      return l;
    }
    TORCH_CHECK(kind == "cuda", "dualcast native launcher: unknown launch kind ", kind);
    l.kind = cuda;
    l.ctx = reinterpret_cast<void*>(d[1].cast<std::uintptr_t>());
    l.fn = reinterpret_cast<void*>(d[2].cast<std::uintptr_t>());
    l.grid_x = d[3].cast<unsigned>();
    l.grid_y = d[4].cast<unsigned>();
    l.block = d[5].cast<unsigned>();
    const auto bytes = d[6].cast<std::string>();
    l.args.assign(bytes.begin(), bytes.end());
    l.off_in = d[7].cast<std::size_t>();
    l.off_out = d[8].cast<std::size_t>();
    l.off_part = d[9].cast<std::size_t>();
    l.off_vec = d[10].cast<std::size_t>();
    l.vec_possible = d[11].cast<bool>();
    l.unit = d[12].cast<std::uint64_t>();
    l.vec_bytes = d[13].cast<std::uint64_t>();
    l.nin = d[14].cast<std::size_t>();
    l.nout = d[15].cast<std::size_t>();
    l.npart = d[16].cast<std::size_t>();
    TORCH_CHECK(cu_launch != nullptr, "dualcast native launcher: a CUDA launch before set_driver");
    return l;
  }

  // ins: nin addresses; outs: nout (0: not written); parts: up to npart (the rest 0).
  void operator()(const std::int64_t* ins, const std::int64_t* outs, const std::int64_t* parts,
                  std::size_t nparts, void* stream) const {
    if (kind == cpu) {
      // The seven words, then the addresses the three pointers point into (as jit._Launch).
      std::vector<std::int64_t> a(7 + nin + nout + npart, 0);
      std::int64_t* first = a.data() + 7;
      std::memcpy(first, ins, nin * 8);
      std::memcpy(first + nin, outs, nout * 8);
      if (nparts) std::memcpy(first + nin + nout, parts, nparts * 8);
      a[0] = ndim;
      a[1] = reinterpret_cast<std::int64_t>(shape.data());
      a[2] = reinterpret_cast<std::int64_t>(first);
      a[3] = reinterpret_cast<std::int64_t>(strides.data());
      a[4] = reinterpret_cast<std::int64_t>(first + nin);
      a[5] = reinterpret_cast<std::int64_t>(first + nin + nout);
      a[6] = threads;
      const int rc = run(a.data());
      TORCH_CHECK(rc == 0, "dualcast.jit: the kernel returned ", rc);
    } else if (kind == cuda) {
      std::vector<unsigned char> a(args);
      std::memcpy(a.data() + off_in, ins, nin * 8);
      std::memcpy(a.data() + off_out, outs, nout * 8);
      if (nparts) std::memcpy(a.data() + off_part, parts, nparts * 8);
      // cuda_kernel.vector_ok: a view may start mid-vector, so the addresses decide.
      std::int64_t vec = 0;
      if (vec_possible) {
        std::uint64_t bits = 0;
        for (std::size_t k = 0; k < nin; ++k)
          if (unit >> k & 1) bits |= static_cast<std::uint64_t>(ins[k]);
        for (std::size_t m = 0; m < nout; ++m) bits |= static_cast<std::uint64_t>(outs[m]);
        for (std::size_t j = 0; j < nparts; ++j) bits |= static_cast<std::uint64_t>(parts[j]);
        vec = bits % vec_bytes == 0;
      }
      std::memcpy(a.data() + off_vec, &vec, 8);
      void* params[1] = {a.data()};  // one parameter: the Args struct, by value
      int rc = cu_push(ctx);
      TORCH_CHECK(rc == 0, "dualcast.cuda: cuCtxPushCurrent_v2 failed: ", error_text(rc));
      rc = cu_launch(fn, grid_x, grid_y, 1, block, 1, 1, 0, stream, params, nullptr);
      void* popped = nullptr;
      cu_pop(&popped);
      TORCH_CHECK(rc == 0, "dualcast.cuda: cuLaunchKernel of ", grid_x, " x ", grid_y,
                  " blocks failed: ", error_text(rc));
    }
  }

  static std::string error_text(int rc) {
    const char* name = nullptr;
    if (cu_error_name && cu_error_name(rc, &name) == 0 && name) return std::string(name);
    return "CUDA driver error " + std::to_string(rc);
  }
};

// Keys: each tensor's dims, sizes, strides, dtype, device and requires_grad, as 64-bit words.
struct KeyHash {
  std::size_t operator()(const std::vector<std::int64_t>& k) const {
    std::uint64_t h = 1469598103934665603ull;
    for (auto w : k) h = (h ^ static_cast<std::uint64_t>(w)) * 1099511628211ull;
    return static_cast<std::size_t>(h);
  }
};
using Key = std::vector<std::int64_t>;

void append_layout(Key& key, const at::Tensor& t) {
  key.push_back(t.dim());
  for (auto s : t.sizes()) key.push_back(s);
  for (auto s : t.strides()) key.push_back(s);
}

// What one call signature decided (torch.py's _Call), for the calls after the first.
struct Entry : torch::CustomClassHolder {
  std::vector<std::int64_t> shape;  // the broadcast shape: every output's and full gradient's
  at::TensorOptions options;        // the kernel's dtype, the inputs' device
  std::size_t n_in = 0, n_out = 0, k = 0;
  Launch value;
  bool autograd = false;  // the call makes an autograd node (a differentiated input wants a gradient)
  std::vector<std::int64_t> wanted, wanted_k;  // inputs that want a gradient; their index among the k
  std::vector<bool> reduce;                    // per wanted input: sum the gradient back to its shape
  std::vector<std::vector<std::int64_t>> input_shapes;
  py::object gradient_launch;  // (xs, grads) -> describe(): the gradient kernel's launch for a layout
  std::mutex mutex;            // guards gradient (backward passes may run on several threads)
  // Shared, so that a launch in use stays alive when another thread's miss clears the map.
  std::unordered_map<Key, std::shared_ptr<const Launch>, KeyHash> gradient;

  ~Entry() override {
    // The last reference may go on a thread without the GIL (the autograd engine's).
    if (gradient_launch && Py_IsInitialized() && !finalizing()) {
      py::gil_scoped_acquire gil;
      gradient_launch = py::object();
    } else {
      gradient_launch.release();  // interpreter gone: leak the reference rather than touch it
    }
  }

  static bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
  }

  // The gradient kernel's launch for the layouts of the saved inputs (a saved-tensor hook may give
  // them back in another layout than the forward's) and of the incoming gradients.
  std::shared_ptr<const Launch> gradient_for(const variable_list& xs, const variable_list& gs) {
    Key key;
    for (const auto& x : xs) append_layout(key, x);
    for (const auto& g : gs) append_layout(key, g);
    {
      std::lock_guard<std::mutex> lock(mutex);
      auto it = gradient.find(key);
      if (it != gradient.end()) return it->second;
    }
    std::shared_ptr<const Launch> l;
    {
      py::gil_scoped_acquire gil;
      l = std::make_shared<const Launch>(Launch::from(gradient_launch(xs, gs).cast<py::tuple>()));
    }
    std::lock_guard<std::mutex> lock(mutex);
    if (gradient.size() >= 64) gradient.clear();  // ever new gradient layouts: start again
    gradient[std::move(key)] = l;
    return l;
  }
};

void* current_stream(const at::Device& device) {
#ifdef DUALCAST_NATIVE_CUDA
  if (device.is_cuda()) return c10::cuda::getCurrentCUDAStream(device.index()).stream();
#endif
  (void)device;
  return nullptr;
}

std::int64_t address(const at::Tensor& t) { return reinterpret_cast<std::int64_t>(t.data_ptr()); }

variable_list run_values(Entry& e, const variable_list& xs) {
  variable_list outs;
  outs.reserve(e.n_out);
  std::vector<std::int64_t> ins(xs.size()), out(e.n_out);
  for (std::size_t i = 0; i < xs.size(); ++i) ins[i] = address(xs[i]);
  for (std::size_t m = 0; m < e.n_out; ++m) {
    outs.push_back(at::empty(e.shape, e.options));
    out[m] = address(outs.back());
  }
  const std::int64_t no_partials = 0;
  e.value(ins.data(), out.data(), &no_partials, 0, current_stream(e.options.device()));
  return outs;
}

struct EntryArg {
  c10::intrusive_ptr<Entry> entry;
};

// The gradients of a backward with create_graph=True: the same tensors, with a node whose backward
// (a second derivative through the gradient kernel) is an error that says so.
struct NoSecondDerivative : public torch::autograd::Function<NoSecondDerivative> {
  static variable_list forward(AutogradContext*, at::TensorList results, at::TensorList) {
    return results.vec();
  }
  static variable_list backward(AutogradContext*, variable_list) {
    TORCH_CHECK(false, "dualcast.elementwise: a second derivative: the gradient kernel's results have no "
                "derivative of their own (the first derivative with create_graph=True is given)");
  }
  // The defined results, each connected to the incoming gradients (which want a gradient).
  static variable_list wrap(const variable_list& result, const variable_list& incoming) {
    std::vector<std::size_t> at;
    variable_list defined;
    for (std::size_t i = 0; i < result.size(); ++i)
      if (result[i].defined()) {
        at.push_back(i);
        defined.push_back(result[i]);
      }
    variable_list inputs;
    for (const auto& g : incoming)
      if (g.defined()) inputs.push_back(g);
    const auto wrapped = apply(at::TensorList(defined), at::TensorList(inputs));
    variable_list out(result.size());
    for (std::size_t j = 0; j < at.size(); ++j) out[at[j]] = wrapped[j];
    return out;
  }
};

// The autograd node of a call: its backward is the gradient kernel over the saved inputs and the
// incoming gradients, each wanted gradient summed back to its input's shape.
struct ElementwiseFunction : public torch::autograd::Function<ElementwiseFunction> {
  static variable_list forward(AutogradContext* ctx, EntryArg arg, at::TensorList xs) {
    ctx->set_materialize_grads(false);  // an unused output's gradient stays undefined: a 0-dim zero
    ctx->saved_data["entry"] = c10::IValue::make_capsule(arg.entry);
    // The inputs, so that a backward after one of them changed in place is an error.
    ctx->save_for_backward(xs.vec());
    return run_values(*arg.entry, xs.vec());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto entry = c10::static_intrusive_pointer_cast<Entry>(ctx->saved_data["entry"].toCapsule());
    Entry& e = *entry;
    // With create_graph=True the gradients are computed as always, and differentiating them again
    // is the error (as torch.autograd.function.once_differentiable does on the Python path).
    const bool graph = torch::autograd::GradMode::is_enabled() &&
                       std::any_of(grads.begin(), grads.end(), [](const at::Tensor& g) {
                         return g.defined() && g.requires_grad();
                       });
    const variable_list incoming = grads;
    variable_list result(1 + e.n_in);  // the entry first: not a tensor, no gradient
    {
      at::NoGradGuard no_grad;
      const variable_list xs = ctx->get_saved_variables();
      at::Tensor zero;
      for (auto& g : grads) {
        if (!g.defined()) {
          if (!zero.defined()) zero = at::zeros({}, e.options);
          g = zero;
        } else if (g.scalar_type() != e.options.dtype().toScalarType()) {
          g = g.to(e.options.dtype());
        }
      }
      const auto launch = e.gradient_for(xs, grads);
      std::vector<std::int64_t> ins, full_addr(e.k, 0);
      for (const auto& x : xs) ins.push_back(address(x));
      for (const auto& g : grads) ins.push_back(address(g));
      variable_list full(e.k);
      for (auto j : e.wanted_k) {
        full[j] = at::empty(e.shape, e.options);
        full_addr[j] = address(full[j]);
      }
      (*launch)(ins.data(), full_addr.data(), nullptr, 0, current_stream(e.options.device()));
      for (std::size_t w = 0; w < e.wanted.size(); ++w) {
        at::Tensor g = full[e.wanted_k[w]];
        if (e.reduce[w]) g = g.sum_to_size(e.input_shapes[e.wanted[w]]);
        result[1 + e.wanted[w]] = g;
      }
    }
    if (graph) result = NoSecondDerivative::wrap(result, incoming);
    return result;
  }
};

// One elementwise function's signatures (dualcast.torch.Elementwise holds one of these).
class Function {
 public:
  // The outputs of a call whose signature was added (a Tensor, or a tuple of them), or None: a new
  // signature, a number among the arguments, or anything else the Python path decides.
  py::object call(const py::tuple& args) {
    if (entries_.empty()) return py::none();
    variable_list xs;
    xs.reserve(args.size());
    Key key;
    key.reserve(8 * args.size() + 2);
    if (!key_of(args, xs, key)) return py::none();
    auto it = entries_.find(key);
    if (it == entries_.end()) return py::none();
    ++calls_;
    const c10::intrusive_ptr<Entry> keep = it->second;  // add() may clear the table meanwhile
    Entry& e = *keep;
#ifdef DUALCAST_NATIVE_CUDA
    c10::cuda::OptionalCUDAGuard guard;
    if (e.options.device().is_cuda()) guard.set_device(e.options.device());
#endif
    variable_list outs;
    {
      // A CPU kernel runs here, so other Python threads run meanwhile (as ctypes lets them); a GPU
      // launch is queued in microseconds and keeps the GIL.
      std::unique_ptr<py::gil_scoped_release> released;  // (C++14: PyTorch 1.13 builds with it)
      if (!e.options.device().is_cuda()) released.reset(new py::gil_scoped_release);
      if (e.autograd) {
        outs = ElementwiseFunction::apply(EntryArg{keep}, at::TensorList(xs));
      } else {
        outs = run_values(e, xs);
      }
    }
    if (e.n_out == 1) return py::cast(outs[0]);
    py::tuple t(outs.size());
    for (std::size_t m = 0; m < outs.size(); ++m) t[m] = py::cast(outs[m]);
    return t;
  }

  // What the Python path decided for the signature of `args` (all tensors of the kernel's dtype,
  // which the outputs take).
  void add(const py::tuple& args, const std::vector<std::int64_t>& shape, const py::tuple& value, std::size_t n_out, std::size_t k, bool autograd,
           const std::vector<std::int64_t>& wanted, const std::vector<std::int64_t>& wanted_k,
           const std::vector<bool>& reduce, const py::object& gradient_launch) {
    variable_list xs;
    Key key;
    TORCH_CHECK(key_of(args, xs, key), "dualcast native launcher: add() takes tensors only");
    TORCH_CHECK(!xs.empty(), "dualcast native launcher: add() without tensors");
    auto e = c10::make_intrusive<Entry>();
    e->shape = shape;
    e->options = at::TensorOptions().dtype(xs[0].scalar_type()).device(xs[0].device());  // all of one dtype
    e->n_in = xs.size();
    e->n_out = n_out;
    e->k = k;
    e->value = Launch::from(value);
    e->autograd = autograd;
    e->wanted = wanted;
    e->wanted_k = wanted_k;
    e->reduce = reduce;
    for (const auto& x : xs) e->input_shapes.push_back(x.sizes().vec());
    e->gradient_launch = gradient_launch;
    if (entries_.size() >= 256) entries_.clear();  // a model with ever new shapes: start again
    entries_[std::move(key)] = std::move(e);
  }

  void clear() { entries_.clear(); }
  std::size_t size() const { return entries_.size(); }
  std::uint64_t calls() const { return calls_; }

 private:
  static bool key_of(const py::tuple& args, variable_list& xs, Key& key) {
    key.push_back(at::GradMode::is_enabled());
    key.push_back(static_cast<std::int64_t>(args.size()));
    for (const auto& a : args) {
      PyObject* p = a.ptr();
      if (!THPVariable_Check(p)) return false;
      const at::Tensor& t = THPVariable_Unpack(p);
      append_layout(key, t);
      key.push_back(static_cast<std::int64_t>(t.scalar_type()));
      key.push_back(static_cast<std::int64_t>(t.device().type()));
      key.push_back(t.device().index());
      key.push_back(t.requires_grad());
      xs.push_back(t);
    }
    return true;
  }

  std::unordered_map<Key, c10::intrusive_ptr<Entry>, KeyHash> entries_;
  std::uint64_t calls_ = 0;  // calls taken here (tests check which path ran)
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "dualcast's compiled launcher for PyTorch (python/dualcast/native.py)";
  m.def("set_driver", &set_driver, "the CUDA driver's cuCtxPushCurrent_v2, cuCtxPopCurrent_v2, "
        "cuLaunchKernel and cuGetErrorName, by address");
#ifdef DUALCAST_NATIVE_CUDA
  m.attr("cuda") = true;
#else
  m.attr("cuda") = false;
#endif
  py::class_<Function>(m, "Function")
      .def(py::init<>())
      .def("call", &Function::call)
      .def("add", &Function::add)
      .def("clear", &Function::clear)
      .def("__len__", &Function::size)
      .def_property_readonly("calls", &Function::calls);
}
