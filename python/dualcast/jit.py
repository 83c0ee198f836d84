"""dualcast.jit: a broadcast function's body, given as C++ source text, compiled at run time.

The body is the inside of a C++ function whose parameters are the named inputs: the differentiated
ones are dual numbers (dualcast::Dual<T, K>, K = the number of differentiated inputs, seeded so that
partial k is d/d(k-th differentiated input)), the others plain T. It returns one value (or, with
outputs=M > 1, a brace list of M values), with ordinary data-dependent if/else. The same dual-number
and math headers as the C++ library's (include/dualcast/dual.hpp, math.hpp) give it +, -, *, /,
comparisons, sigmoid, tanh, exp, log, ... over duals and numbers.

One compiled kernel evaluates the body at every element of the inputs' broadcast shape and writes
each output's value and (where wanted) its K partials: the forward-mode half of dualcast's mixed
mode. Spec.gradient() is the recompute policy's backward: a kernel that evaluates the body again and
writes sum_m grad_m * partial_{m,k} for each differentiated input k, so no partial is stored between
the passes. Summing back to each input's shape belongs to the caller (dualcast.torch).

CPU: the host C++ compiler ($CXX, else c++) builds a shared library, loaded with ctypes. Compiled
kernels are cached in memory and on disk ($DUALCAST_CACHE_DIR, else $XDG_CACHE_HOME/dualcast/jit or
~/.cache/dualcast/jit), keyed by the generated source, the compiler and its flags, the CPU, the
headers' contents and dualcast's version, so a second process compiles nothing.
"""

import ctypes
import hashlib
import os
import platform
import re
import shlex
import subprocess
import tempfile
import threading

from . import __version__, cuda_kernel, kernel_source, results

ABI_VERSION = 1
MAX_DIFFERENTIATED = 16  # partials per dual number: the registers a GPU thread can hold
MAX_DIMS = 8  # dimensions of a broadcast shape (as the C++ library's tensors)
# dtype -> (storage type S, compute type T): 16-bit tensors are read into float and written back
# rounded once, as the C++ library's broadcast does (half.hpp), on both targets.
DTYPES = {"float32": ("float", "float"), "float64": ("double", "double"),
          "bfloat16": ("dualcast::bfloat16", "float"), "float16": ("dualcast::float16", "float")}
HALF_DTYPES = ("bfloat16", "float16")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Names an input cannot take: the generated code's own, C++'s keywords and alternative tokens, and
# the C library's macros a body could meet.
_RESERVED = set("""T D K M NIN NOUT NPART OUTP MAXDIM Num num_scalar as_t any_num num_args Out Outs Ret dualcast std user_body out_at Args tile run
    alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t
    class compl concept const consteval constexpr constinit const_cast continue co_await co_return
    co_yield decltype default delete do double dynamic_cast else enum explicit export extern false float
    for friend goto if inline int long mutable namespace new noexcept not not_eq nullptr operator or
    or_eq private protected public register reinterpret_cast requires return short signed sizeof static
    static_assert static_cast struct switch template this thread_local throw true try typedef typeid
    typename union unsigned using virtual void volatile wchar_t while xor xor_eq
    errno NAN INFINITY HUGE_VAL EOF NULL assert""".split())
HEADERS = ("config.hpp", "dual.hpp", "math.hpp", "vector_math.hpp", "half.hpp")  # what a kernel includes (setup.py copies them)

# Source names in the compiler's messages: the user's body is file "<elementwise>", from line 1.
BODY_FILE = "<elementwise>"


class CompileError(RuntimeError):
    """The body did not compile: the compiler's message, with the user's lines it names."""


class Spec:
    """What identifies a kernel apart from its dtype: the body, the inputs, the differentiated
    inputs (a subset, in the inputs' order) and the number of outputs."""

    def __init__(self, body, inputs, differentiable, outputs=1):
        who = "dualcast.elementwise"
        if not isinstance(body, str) or not body.strip():
            raise ValueError("%s: the body must be non-empty C++ source text" % who)
        self.body = body
        self.inputs = _names(inputs, "inputs", who)
        if not self.inputs:
            raise ValueError("%s: inputs names no input" % who)
        self.differentiable = _names(differentiable, "differentiable", who)
        for n in self.differentiable:
            if n not in self.inputs:
                raise ValueError("%s: differentiable input '%s' is not one of the inputs (%s)"
                                 % (who, n, " ".join(self.inputs)))
        # Partial k belongs to the k-th differentiated input in the inputs' order, whatever order
        # `differentiable` lists them in.
        self.differentiable = [n for n in self.inputs if n in self.differentiable]
        if len(self.differentiable) > MAX_DIFFERENTIATED:
            raise ValueError("%s: %d differentiated inputs; at most %d" % (who, len(self.differentiable),
                                                                         MAX_DIFFERENTIATED))
        if not isinstance(outputs, int) or isinstance(outputs, bool) or not 1 <= outputs <= 16:
            raise ValueError("%s: outputs must be an integer in [1, 16], not %r" % (who, outputs))
        self.outputs = outputs

    @property
    def k(self):
        return len(self.differentiable)

    # What a launch passes (launch_shape checks it): arrays read through strides, contiguous arrays
    # written, partial buffers written (M x K; null where not wanted).
    gradient_kernel = False
    values_only = False

    @property
    def n_in(self):
        return len(self.inputs)

    @property
    def n_out(self):
        return self.outputs

    @property
    def n_partials(self):
        return self.outputs * max(self.k, 1)

    def values(self):
        """The kernel of the outputs alone: the differentiated inputs are Num, plain numbers with a
        dual's rules (D names Num), so no partial is computed (the recompute policy's forward) and
        the values are the dual kernel's. A body that needs dual numbers as such (.val, .d,
        partial()) does not compile as one: dualcast.torch then uses this Spec's kernel with no
        partial wanted."""
        return ValuesSpec(self)

    def gradient(self):
        """The recompute-policy backward of this function: a kernel that reads the inputs and the M
        output gradients and writes, for each differentiated input k, sum_m grad_m * d out_m/d x_k
        (the C++ library's Partials::recompute: no partial is stored between the passes)."""
        return GradientSpec(self)

    def source(self, dtype, target="cpu"):
        """The translation unit for dtype ('float32', 'float64', 'bfloat16' or 'float16': the last
        two stored in 16 bits and computed in float) and target ('cpu': the host compiler's, entry
        dualcast_jit_run; 'cuda': NVRTC's, kernels dualcast_jit_kernel32/64 and dualcast_jit_fast32:
        cuda_kernel.py)."""
        if dtype not in DTYPES:
            raise TypeError("dualcast.elementwise: dtype %s is not supported (float32, float64, bfloat16, "
                            "float16)" % dtype)
        nin = len(self.inputs)
        fields = dict(
            S=DTYPES[dtype][0], T=DTYPES[dtype][1], K=max(self.k, 1), M=self.outputs, NIN=self.n_in, NOUT=self.n_out,
            half_include='#include "dualcast/half.hpp"\n' if dtype in HALF_DTYPES else "",
            NPART=max(self.n_partials, 1), ABI=ABI_VERSION, MAXDIM=MAX_DIMS,
            params=", ".join(("D " if n in self.differentiable else "T ") + n for n in self.inputs),
            args=", ".join("x%d" % i for i in range(nin)), body_file=BODY_FILE, body=self.body)
        ks = kernel_source
        kernel = {"cpu": ks.CPU_KERNEL, "cuda": cuda_kernel.KERNEL}[target]
        store = (ks.GRADIENT_STORES if self.gradient_kernel else
                 ks.VALUES_ONLY_STORES if self.values_only else ks.VALUE_STORES)
        fields["result_type"] = results.VALUE_RESULT if self.values_only else results.DUAL_RESULT
        fields["threads"] = cuda_kernel.THREADS
        # Both targets' tiles (CPU) and chunks (CUDA's fast walk) hold W lanes: xs[input][e].
        for name, where in (("loads", target), ("tile_loads", "tile")):
            lines = [ks.load_line(i, n, self.differentiable, where, self.values_only)
                     for i, n in enumerate(self.inputs)]
            if self.gradient_kernel:  # the output gradients follow the inputs
                lines.append("      const T g[M] = {%s};" % ", ".join(
                    ks.load_expr(nin + m, where) for m in range(self.outputs)))
            fields[name] = "\n".join(lines)
        for name, text in store[target].items():
            fields[name] = text
        return (ks.PRELUDE + kernel).format(**fields)


class ValuesSpec(Spec):
    """Spec.values(): the same body, inputs and outputs; launched as its Spec without partials."""

    values_only = True

    def __init__(self, spec):  # pylint: disable=super-init-not-called (spec was checked when made)
        self.body, self.inputs, self.differentiable, self.outputs = (spec.body, spec.inputs, spec.differentiable,
                                                                     spec.outputs)

    @property
    def n_partials(self):
        return 0


class GradientSpec(Spec):
    """Spec.gradient(): the same body, inputs and outputs; launched with the inputs followed by the
    M output gradients (any strides) and writing K gradients at the broadcast shape (null: not
    wanted), no partials."""

    gradient_kernel = True

    def __init__(self, spec):  # pylint: disable=super-init-not-called (spec was checked when made)
        self.body, self.inputs, self.differentiable, self.outputs = (spec.body, spec.inputs, spec.differentiable,
                                                                     spec.outputs)
        if not self.differentiable:
            raise ValueError("dualcast.elementwise: no input is differentiated: there is no gradient kernel")

    @property
    def n_in(self):
        return len(self.inputs) + self.outputs

    @property
    def n_out(self):
        return self.k

    @property
    def n_partials(self):
        return 0


def _names(text, what, who):
    if isinstance(text, (list, tuple)):
        names = list(text)
    elif isinstance(text, str):
        names = text.split()
    else:
        raise TypeError("%s: %s must be space-separated names, not %r" % (who, what, text))
    for n in names:
        if not isinstance(n, str) or not _IDENT.match(n) or n in _RESERVED:
            raise ValueError("%s: %s: '%s' is not a usable C++ name" % (who, what, n))
    if len(set(names)) != len(names):
        raise ValueError("%s: %s names an input twice: %s" % (who, what, " ".join(names)))
    return names


def coalesce(shape, in_strides):
    """The same element walk over fewer dimensions: size-1 dimensions dropped, and a dimension merged
    into the next one in when every input steps across the boundary as one run (stride[d] ==
    stride[d+1] * shape[d+1]; broadcast inputs have 0 on both sides). A call whose inputs are all
    contiguous or all broadcast becomes one dimension: one row of tiles on the CPU, no index
    arithmetic on the GPU."""
    dims = [(size, [st[d] for st in in_strides]) for d, size in enumerate(shape) if size != 1]
    if not dims:
        return [1] * (1 if shape else 0), [[0] * (1 if shape else 0) for _ in in_strides]
    out = [dims[0]]
    for size, strides in dims[1:]:
        psize, pstrides = out[-1]
        if all(ps == s * size for ps, s in zip(pstrides, strides)):
            out[-1] = (psize * size, strides)
        else:
            out.append((size, strides))
    return [s for s, _ in out], [[st[k] for _, st in out] for k in range(len(in_strides))]


class LaunchPlans:
    """A kernel's launches made ready by call shape: a kernel called again on tensors of the same
    shapes and strides (every step of a model) skips the checks, the coalescing and the packing of
    the shape and strides. `get` looks them up by the call shape and per-input strides over it;
    `by_layout` by a caller's own key of the same information (dualcast.torch's: each tensor's shape
    and strides as PyTorch gives them, cheaper to read than strides over the broadcast shape).
    Bounded: a kernel called on ever new shapes starts over. make(shape, in_strides) makes a launch
    of a coalesced call shape (the kernel's own, given by the kernel)."""

    LIMIT = 512

    def __init__(self, spec, make):
        self.spec, self._make, self._plans, self._layouts = spec, make, {}, {}

    def get(self, shape, inputs, in_strides, outputs, partials):
        key = (tuple(shape), tuple(map(tuple, in_strides)), len(inputs), len(outputs), len(partials))
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= self.LIMIT:
                self._plans = {}
            plan = self._plans[key] = self._make(*launch_shape(self.spec, shape, inputs, in_strides, outputs,
                                                               partials))
        return plan

    def by_layout(self, key, shape, in_strides, n_out, n_partials):
        """The launch for a caller's layout key; on a miss, in_strides() gives the per-input strides
        over `shape` and the launch is made (and its counts checked) as by `get`, which needs only
        the lengths of the address lists."""
        plan = self._layouts.get(key, self)
        if plan is self:
            if len(self._layouts) >= self.LIMIT:
                self._layouts = {}
            strides = in_strides()
            plan = self._layouts[key] = self.get(shape, [0] * len(strides), strides, [0] * n_out, [0] * n_partials)
        return plan


def launch_shape(spec, shape, inputs, in_strides, outputs, partials):
    """Checks one call's arguments against the kernel (both targets take the same ones) and returns
    the coalesced (shape, in_strides) the kernel walks."""
    nin, nout = spec.n_in, spec.n_out
    if len(inputs) != nin or len(in_strides) != nin or len(outputs) != nout:
        raise ValueError("dualcast.jit: %d inputs, %d stride lists and %d outputs given; the kernel "
                         "takes %d, %d and %d" % (len(inputs), len(in_strides), len(outputs), nin, nin, nout))
    if len(partials) != spec.n_partials:
        raise ValueError("dualcast.jit: %d partial buffers given; the kernel writes %d"
                         % (len(partials), spec.n_partials))
    for st in in_strides:
        if len(st) != len(shape):
            raise ValueError("dualcast.jit: a stride list of %d entries for a %d-dimensional shape"
                             % (len(st), len(shape)))
    return coalesce(shape, in_strides)


# dualcast_jit_run's Args (kernel_source.CPU_KERNEL), read as 64-bit words: ndim, shape*, in*,
# in_strides*, out*, partials*, threads. A call passes one array of int64: these seven words, then the
# input, output and partial addresses the three pointers point into (one ctypes object per call).
_ARGS_WORDS = 7


class _Launch:
    """One call shape of a Kernel, coalesced and checked: the shape and strides packed once, the
    addresses per call."""

    __slots__ = ("_run", "_keep", "_nd", "_shape", "_strides", "_nin", "_nout", "_npart", "_type")

    def __init__(self, run, shape, in_strides, n_out, n_partials):
        nd = len(shape)
        c_shape = (ctypes.c_int64 * max(nd, 1))(*shape)
        c_strides = (ctypes.c_int64 * max(len(in_strides) * nd, 1))(*[x for st in in_strides for x in st])
        self._run, self._keep, self._nd = run, (c_shape, c_strides), nd
        self._shape, self._strides = ctypes.addressof(c_shape), ctypes.addressof(c_strides)
        self._nin, self._nout, self._npart = len(in_strides), n_out, max(n_partials, 1)
        self._type = ctypes.c_int64 * (_ARGS_WORDS + self._nin + n_out + self._npart)

    def describe(self):
        """This launch for dualcast.native's compiled launcher (csrc/launcher.cpp, Launch::from):
        the entry point's address, the coalesced shape and strides, the address counts, threads."""
        nin = self._nin
        return ("cpu", ctypes.cast(self._run, ctypes.c_void_p).value, list(self._keep[0])[:self._nd],
                list(self._keep[1])[:nin * self._nd], nin, self._nout, self._npart, _CPUS)

    def __call__(self, inputs, outputs, partials, threads=0):
        a = self._type(self._nd, self._shape, 0, self._strides, 0, 0, threads if threads > 0 else _CPUS,
                       *inputs, *outputs, *partials)
        first = ctypes.addressof(a) + 8 * _ARGS_WORDS
        a[2], a[4], a[5] = first, first + 8 * self._nin, first + 8 * (self._nin + self._nout)
        rc = self._run(a)
        if rc != 0:
            raise RuntimeError("dualcast.jit: the kernel returned %d" % rc)


_CPUS = os.cpu_count() or 1


class Kernel:
    """One compiled (spec, dtype) on the CPU. `run` takes raw addresses: the caller owns the memory
    and has checked shapes (dualcast.torch does both)."""

    def __init__(self, spec, dtype, path):
        self.spec, self.dtype, self.path = spec, dtype, path
        self._lib = ctypes.CDLL(path)
        if self._lib.dualcast_jit_abi() != ABI_VERSION:
            raise RuntimeError("dualcast.jit: %s was built for another ABI" % path)
        self._run = self._lib.dualcast_jit_run
        self._run.argtypes = [ctypes.c_void_p]
        self._run.restype = ctypes.c_int
        # Its launches (_Launch): call one with the input, output and partial addresses (0: a partial
        # not wanted) and optionally threads.
        self.plans = LaunchPlans(spec, self._launch)

    def _launch(self, shape, in_strides):
        return _Launch(self._run, shape, in_strides, self.spec.n_out, self.spec.n_partials)

    def run(self, shape, inputs, in_strides, outputs, partials, threads=0):
        """shape: the broadcast shape; inputs: one address per input; in_strides: per input, its
        element strides over `shape` (0 where broadcast); outputs: M addresses of contiguous
        buffers of prod(shape) elements; partials: M x K addresses or None (not wanted)."""
        go = self.plans.get(shape, inputs, in_strides, outputs, partials)
        go(inputs, outputs, [p or 0 for p in partials], threads)


# ---- compiling and caching ---------------------------------------------------------------------

_lock = threading.Lock()
_loaded = {}  # cache key -> Kernel
stats = {"compiled": 0, "loaded_from_disk": 0, "from_memory": 0}

# Compiles started ahead of their first use (start_compile, cuda.start_compile): a function's first
# call needs its values kernel at once and its gradient kernel at the backward, and the two compile
# side by side on two cores in about the time of the longer one (NVRTC: 1.5 and 1.8 s one after the
# other for workload a's cell, python/README.md). Keyed by the cache file a compile writes.
_ahead_lock = threading.Lock()
_ahead = {}  # cache file -> concurrent.futures.Future of its compile
_pool = None


def _forget_ahead_in_child():
    # A forked child has the parent's bookkeeping but not its worker threads: it starts afresh.
    global _ahead_lock, _ahead, _pool
    _ahead_lock, _ahead, _pool = threading.Lock(), {}, None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_ahead_in_child)


def compile_ahead(path, build):
    """Runs build() (which compiles what `path` caches and returns it) on a worker thread, unless
    `path` is cached already or its compile is under way. Where no worker can start (the
    interpreter is shutting down) nothing happens: the kernel then compiles when it is asked for."""
    global _pool
    with _ahead_lock:
        if path in _ahead or os.path.isfile(path):
            return
        try:
            if _pool is None:
                import concurrent.futures
                _pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="dualcast-compile")
            _ahead[path] = _pool.submit(build)
        except RuntimeError:  # "can't register atexit after shutdown", "cannot schedule new futures"
            pass


def discard_ahead(path):
    """Drops `path`'s compile started ahead, if any, without waiting for it (the call that started
    it failed): cancelled if it has not begun; if it has, it only writes a complete cache file."""
    with _ahead_lock:
        f = _ahead.pop(path, None)
    if f is not None:
        f.cancel()


def compiled_ahead(path):
    """(True, the result of `path`'s compile started by compile_ahead, waited for; its error raised
    here), or (False, None) when none was started. Every thread asking meanwhile waits for the same
    compile; the first to see it finished removes it."""
    with _ahead_lock:
        f = _ahead.get(path)
    if f is None:
        return False, None
    try:
        return True, f.result()
    finally:
        with _ahead_lock:
            if _ahead.get(path) is f:
                del _ahead[path]


def include_dir():
    """The folder holding dualcast/dual.hpp: $DUALCAST_INCLUDE_DIR, else the installed package's copy
    (setup.py), else the checkout's include/ (running from the checkout, or an editable install)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for d in (os.environ.get("DUALCAST_INCLUDE_DIR"), os.path.join(here, "include"),
              os.path.join(here, "..", "..", "include")):
        if d and os.path.isfile(os.path.join(d, "dualcast", "dual.hpp")):
            return os.path.normpath(d)
    raise RuntimeError("dualcast.jit: dualcast/dual.hpp is neither in the package nor in a checkout "
                       "(set DUALCAST_INCLUDE_DIR to the folder that holds dualcast/dual.hpp)")


def cache_dir():
    d = os.environ.get("DUALCAST_CACHE_DIR")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "dualcast", "jit")
    return d


def compiler_command():
    """The host compiler and the flags every kernel is built with."""
    cxx = shlex.split(os.environ.get("CXX") or "c++")
    # -fno-trapping-math lets GCC if-convert the body's branches across lanes and -ffp-contract=off
    # keeps a*b+c two roundings (the C++ library's CPU tiles use the same two flags; values, inf, NaN
    # and signed zeros are unaffected); DUALCAST_CPU_SIMD declares libmvec's vector math.
    x86 = ["-mprefer-vector-width=512"] if platform.machine() in ("x86_64", "AMD64") else []
    return cxx + ["-std=c++20", "-O3", "-march=native"] + x86 + [
        "-fno-trapping-math", "-ffp-contract=off", "-DDUALCAST_CPU_SIMD=1", "-fPIC", "-shared", "-fopenmp",
        "-Werror=return-type"]


_headers_digest = None


def headers_digest():
    """sha256 of the headers a kernel includes and dualcast's version: part of every cache key
    (CPU libraries and cubins)."""
    global _headers_digest
    if _headers_digest is None:
        h = hashlib.sha256(__version__.encode())
        for name in HEADERS:
            with open(os.path.join(include_dir(), "dualcast", name), "rb") as fh:
                h.update(fh.read())
        _headers_digest = h.hexdigest()
    return _headers_digest


_facts = {}


def _toolchain_facts(cmd):
    """What a cached CPU kernel depends on besides its source: the compiler's identity, the CPU and
    the headers (headers_digest)."""
    key = tuple(cmd)
    if key not in _facts:
        try:
            ver = subprocess.run(cmd[:1] + ["--version"], capture_output=True, text=True, timeout=30).stdout
        except OSError as e:
            raise RuntimeError("dualcast.jit: cannot run the C++ compiler %r: %s" % (cmd[0], e)) from e
        cpu = platform.machine()
        try:
            with open("/proc/cpuinfo") as fh:
                cpu += next((l for l in fh if l.startswith("flags")), "")
        except OSError:
            pass
        _facts[key] = "\n".join([" ".join(cmd), ver, cpu, headers_digest()])
    return _facts[key]


def _library_path(spec, dtype):
    """(source, compiler command, cache key, cache file) of (spec, dtype)'s shared library."""
    src = spec.source(dtype)
    cmd = compiler_command()
    key = hashlib.sha256((src + "\n--\n" + _toolchain_facts(cmd)).encode()).hexdigest()[:32]
    return src, cmd, key, os.path.join(cache_dir(), "dc_%s.so" % key)


def start_compile(spec, dtype):
    """Starts compiling (spec, dtype)'s library on a worker thread (see compile_ahead), for a later
    compile_kernel of it to wait for instead of compiling."""
    src, cmd, key, path = _library_path(spec, dtype)
    with _lock:
        if key in _loaded:
            return

    def build():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _build(src, spec.body, cmd, path)
        with _lock:
            stats["compiled"] += 1

    compile_ahead(path, build)


def discard_compile(spec, dtype):
    """Drops start_compile(spec, dtype)'s compile (discard_ahead)."""
    discard_ahead(_library_path(spec, dtype)[3])


def compile_kernel(spec, dtype):
    """The Kernel for (spec, dtype): from memory, else from a compile started ahead, else from the
    disk cache, else compiled now."""
    src, cmd, key, path = _library_path(spec, dtype)
    with _lock:
        k = _loaded.get(key)
        if k is not None:
            stats["from_memory"] += 1
            return k
    started, _ = compiled_ahead(path)  # outside _lock: the worker takes it to count its compile
    with _lock:
        k = _loaded.get(key)
        if k is not None:
            stats["from_memory"] += 1
            return k
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if started:
            pass  # compiled (and counted) by the worker
        elif os.path.isfile(path):
            stats["loaded_from_disk"] += 1
        else:
            _build(src, spec.body, cmd, path)
            stats["compiled"] += 1
        k = Kernel(spec, dtype, path)
        _loaded[key] = k
        return k


def _build(src, body, cmd, path):
    folder = os.path.dirname(path)
    fd, cpp = tempfile.mkstemp(suffix=".cpp", dir=folder)
    with os.fdopen(fd, "w") as fh:
        fh.write(src)
    tmp = cpp[:-4] + ".so"
    try:
        r = subprocess.run(cmd + ["-I", include_dir(), cpp, "-o", tmp, "-lm"], capture_output=True, text=True,
                           timeout=300)
        if r.returncode != 0:
            raise CompileError(explain(r.stderr, body, cmd[0]))
        os.replace(tmp, path)  # atomic: a process reading the cache sees a whole library or none
    finally:
        for f in (cpp, tmp):
            if os.path.exists(f):
                os.remove(f)


def explain(stderr, body_text, compiler):
    """The compiler's errors about the user's body, each followed by the body line it names."""
    body = body_text.split("\n")
    lines, shown = [], set()
    for line in stderr.splitlines():
        if "error" not in line and BODY_FILE not in line:
            continue
        lines.append(line)
        # g++: "<elementwise>:3:12: error: ..."; NVRTC: "<elementwise>(3): error: ..."
        m = re.search(re.escape(BODY_FILE) + r"(?::(\d+):|\((\d+)\))", line)
        if m and "error" in line:
            n = int(m.group(1) or m.group(2))
            if 1 <= n <= len(body) and n not in shown:
                lines.append("    line %d of the body: %s" % (n, body[n - 1].strip()))
                shown.add(n)
    msg = "\n".join(lines[:40]) or stderr.strip()[-4000:]
    return "dualcast.elementwise: the body does not compile (%s):\n%s" % (compiler, msg)
