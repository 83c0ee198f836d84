"""dualcast.cuda: the CUDA path of dualcast.jit. The same generated source (jit.Spec.source(dtype,
"cuda")) compiled by NVRTC into a cubin for the GPU's architecture, loaded and launched through the
CUDA driver API, both through ctypes: no compiled extension, no nvcc at run time.

NVRTC has no C++ standard library: dualcast/nvrtc_include/ maps the few standard headers dualcast's
dual.hpp and math.hpp include onto CUDA's libcu++ (include/cccl). Cubins are cached in memory and on
disk next to the CPU kernels, keyed by the source, NVRTC's version, the architecture, the options, the
headers and dualcast's version. A kernel runs on the stream it is given (dualcast.torch passes
PyTorch's current stream) and never synchronises.
"""

import ctypes
import ctypes.util
import glob
import hashlib
import os
import threading

from . import cuda_kernel, jit, native

SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nvrtc_include")
THREADS = cuda_kernel.THREADS
# Bytes per stored element of each of jit.DTYPES (the 16-bit types compute in float, stored in 2).
ITEMSIZE = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}


def cuda_home():
    for d in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if d and os.path.isdir(os.path.join(d, "include")):
            return d
    raise RuntimeError("dualcast.cuda: no CUDA toolkit found (set CUDA_HOME)")


def _load(env, names, what):
    tried = []
    cand = [os.environ.get(env)] if os.environ.get(env) else []
    for n in names:
        cand += sorted(glob.glob(os.path.join(cuda_home(), "lib64", n)), reverse=True) if "*" in n else [
            os.path.join(cuda_home(), "lib64", n)]
        cand.append(ctypes.util.find_library(n.split(".so")[0][3:]) or "")
    for c in cand:
        if not c:
            continue
        tried.append(c)
        try:
            return ctypes.CDLL(c)
        except OSError:
            continue
    raise RuntimeError("dualcast.cuda: cannot load %s (tried %s; set %s)" % (what, ", ".join(tried) or "nothing", env))


_nvrtc = None
_cuda = None
_lock = threading.Lock()


def nvrtc():
    global _nvrtc
    if _nvrtc is None:
        _nvrtc = _load("DUALCAST_NVRTC", ["libnvrtc.so", "libnvrtc.so.*"], "NVRTC")
    return _nvrtc


def nvrtc_version():
    major, minor = ctypes.c_int(), ctypes.c_int()
    nvrtc().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return "%d.%d" % (major.value, minor.value)


def include_dirs():
    home = os.path.join(cuda_home(), "include")
    cccl = os.path.join(home, "cccl")
    return [jit.include_dir(), SHIM] + ([cccl] if os.path.isdir(cccl) else []) + [home]


def options(arch):
    # --diag-error=940: a body that can end without a return is an error, as on the CPU
    # (-Werror=return-type), not a warning and undefined behaviour.
    return ["--gpu-architecture=sm_%d" % arch, "-std=c++20", "-default-device", "--diag-error=940",
            "-DNDEBUG"] + ["-I" + d for d in include_dirs()]


def _cubin_path(spec, dtype, arch):
    """(source, NVRTC options, cache file) of (spec, dtype)'s cubin for sm_<arch>."""
    src = spec.source(dtype, "cuda")
    opts = options(arch)
    h = hashlib.sha256()
    for part in (src, nvrtc_version(), " ".join(opts), jit.headers_digest()):
        h.update(part.encode() + b"\0")
    for name in sorted(os.listdir(SHIM)):
        with open(os.path.join(SHIM, name), "rb") as fh:
            h.update(fh.read())
    return src, opts, os.path.join(jit.cache_dir(), "dc_%s.sm%d.cubin" % (h.hexdigest()[:32], arch))


def _compile_and_cache(spec, src, opts, path):
    cubin = _nvrtc_compile(src, spec.body, opts)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = "%s.%d.%d.tmp" % (path, os.getpid(), threading.get_ident())
    with open(tmp, "wb") as fh:
        fh.write(cubin)
    os.replace(tmp, path)
    with jit._lock:
        jit.stats["compiled"] += 1
    return cubin


def start_compile(spec, dtype, arch, device=None):
    """Starts compiling (spec, dtype)'s cubin for sm_<arch> on a worker thread (jit.compile_ahead):
    NVRTC only, no GPU context; a later compile_cubin of it waits for it instead of compiling.
    Nothing to do where GPU `device` (an index) has the kernel loaded already."""
    with _lock:
        if (spec.source(dtype, "cuda"), device) in _kernels:
            return
    src, opts, path = _cubin_path(spec, dtype, arch)
    jit.compile_ahead(path, lambda: _compile_and_cache(spec, src, opts, path))


def discard_compile(spec, dtype, arch):
    """Drops start_compile(spec, dtype, arch)'s compile (jit.discard_ahead)."""
    jit.discard_ahead(_cubin_path(spec, dtype, arch)[2])


def compile_cubin(spec, dtype, arch):
    """The cubin of (spec, dtype) for sm_<arch> (e.g. 90): from a compile started ahead, else from
    the disk cache, else compiled now."""
    src, opts, path = _cubin_path(spec, dtype, arch)
    started, cubin = jit.compiled_ahead(path)
    if started:
        return cubin
    if os.path.isfile(path):
        with open(path, "rb") as fh:
            jit.stats["loaded_from_disk"] += 1
            return fh.read()
    return _compile_and_cache(spec, src, opts, path)


def _nvrtc_compile(src, body, opts):
    lib = nvrtc()
    prog = ctypes.c_void_p()
    _nv_check(lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"dualcast_jit.cu", 0, None, None),
              "nvrtcCreateProgram")
    try:
        arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
        n = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetProgramLog(prog, log)
        if rc != 0:
            raise jit.CompileError(jit.explain(log.value.decode(errors="replace"), body, "NVRTC " + nvrtc_version()))
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
        out = ctypes.create_string_buffer(n.value)
        _nv_check(lib.nvrtcGetCUBIN(prog, out), "nvrtcGetCUBIN")
        return out.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _nv_check(rc, what):
    if rc != 0:
        nvrtc().nvrtcGetErrorString.restype = ctypes.c_char_p
        raise RuntimeError("dualcast.cuda: %s failed: %s" % (what, nvrtc().nvrtcGetErrorString(rc).decode()))


# ---- the driver API ----------------------------------------------------------------------------

# cuda.h renames some entry points to later versions (#define cuCtxPushCurrent cuCtxPushCurrent_v2):
# a C caller gets the new symbol through the macro, a ctypes caller must name it. The unversioned
# symbols are the legacy ABI kept for old binaries; cuCtxPushCurrent's failed with "invalid device
# context" on the primary context (an H200, CUDA 13). tests/test_cuda_compile.py checks every cu*
# name this file calls against cuda.h.
def driver():
    global _cuda
    if _cuda is None:
        try:
            _cuda = ctypes.CDLL(os.environ.get("DUALCAST_LIBCUDA") or "libcuda.so.1")
        except OSError as e:
            raise RuntimeError("dualcast.cuda: cannot load the CUDA driver (libcuda.so.1): %s" % e) from e
        _cu_check(_cuda.cuInit(0), "cuInit")
        # Typed once, so that a launch passes Python ints (addresses, the stream) without wrapping
        # each in a ctypes object: an untyped int argument would be a C int, too narrow for them.
        vp, u = ctypes.c_void_p, ctypes.c_uint
        _cuda.cuLaunchKernel.argtypes = [vp, u, u, u, u, u, u, u, vp, vp, vp]
        _cuda.cuCtxPushCurrent_v2.argtypes = [vp]
        _cuda.cuCtxPopCurrent_v2.argtypes = [ctypes.POINTER(vp)]
    return _cuda


def _cu_check(rc, what):
    if rc != 0:
        s = ctypes.c_char_p()
        _cuda.cuGetErrorString(rc, ctypes.byref(s))
        raise RuntimeError("dualcast.cuda: %s failed: %s (%d)" % (what, (s.value or b"?").decode(), rc))


def _device(index):
    d = ctypes.c_int()
    _cu_check(driver().cuDeviceGet(ctypes.byref(d), index), "cuDeviceGet(%d)" % index)
    return d.value


def _attribute(device, attr):
    v = ctypes.c_int()
    _cu_check(driver().cuDeviceGetAttribute(ctypes.byref(v), attr, device), "cuDeviceGetAttribute")
    return v.value


def arch_of(device):
    return _attribute(device, 75) * 10 + _attribute(device, 76)  # compute capability major, minor


class _InContext:
    """The kernel's context pushed for the duration of a driver call and popped after, so that the
    caller's current context (PyTorch's current device) is left as it was."""

    def __init__(self, ctx):
        self.ctx = ctx

    def __enter__(self):
        _cu_check(driver().cuCtxPushCurrent_v2(ctypes.c_void_p(self.ctx)), "cuCtxPushCurrent_v2")

    def __exit__(self, *exc):
        popped = ctypes.c_void_p()
        driver().cuCtxPopCurrent_v2(ctypes.byref(popped))


def _resident_blocks(fn):
    """Blocks of THREADS threads of fn that fit on one multiprocessor at once (its registers decide;
    cuda_kernel's default where the driver cannot say)."""
    n = ctypes.c_int()
    rc = driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(n), fn, THREADS, ctypes.c_size_t(0))
    return n.value if rc == 0 and n.value > 0 else cuda_kernel.FAST_BLOCKS_PER_SM


def args_type(spec):
    """The ctypes twin of cuda_kernel.KERNEL's Args for spec, field for field (a test compares the
    two layouts)."""
    nin, nout, npart = spec.n_in, spec.n_out, max(spec.n_partials, 1)

    class Args(ctypes.Structure):
        _fields_ = [("n", ctypes.c_int64), ("ndim", ctypes.c_int64), ("rowwise", ctypes.c_int64),
                    ("unit", ctypes.c_uint64), ("vec", ctypes.c_int64),
                    ("shape", ctypes.c_int64 * jit.MAX_DIMS),
                    ("in_", ctypes.c_void_p * nin), ("in_strides", ctypes.c_int64 * (nin * jit.MAX_DIMS)),
                    ("out", ctypes.c_void_p * nout), ("partials", ctypes.c_void_p * npart)]
    return Args


class CudaKernel:
    """(spec, dtype) on one GPU: a loaded module and its three entry points (the general walk with 32-
    and 64-bit indices, the fast walk with 32: cuda_kernel.py), one picked per call shape."""

    def __init__(self, spec, dtype, device):
        self.spec, self.dtype, self.device = spec, dtype, device
        cu = driver()
        dev = _device(device)
        # The device's primary context (PyTorch's), held for as long as this kernel's module lives
        # in it: the module would dangle if the context were reset under it.
        ctx = ctypes.c_void_p()
        _cu_check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        self._ctx = ctx.value
        self.arch = arch_of(dev)
        self.sms = _attribute(dev, 16)  # multiprocessor count
        cubin = compile_cubin(spec, dtype, self.arch)
        self._module = ctypes.c_void_p()
        self._fn = {}
        with _InContext(self._ctx):
            _cu_check(cu.cuModuleLoadData(ctypes.byref(self._module), ctypes.c_char_p(cubin)), "cuModuleLoadData")
            for walk, name, bits in (("general", "kernel", 32), ("general", "kernel", 64), ("fast", "fast", 32)):
                f = ctypes.c_void_p()
                _cu_check(cu.cuModuleGetFunction(ctypes.byref(f), self._module, b"dualcast_jit_%s%d" % (
                    name.encode(), bits)), "cuModuleGetFunction")
                self._fn[(walk, bits)] = f
            self._fast_blocks = _resident_blocks(self._fn[("fast", 32)])
        self._Args = args_type(spec)
        self._itemsize = ITEMSIZE[dtype]
        # Its launches (_Launch, None for an empty call): call one with the stream and the input,
        # output and partial addresses.
        self.plans = jit.LaunchPlans(spec, self._launch)

    def _launch(self, shape, in_strides):
        """The _Launch of a coalesced call shape (None for an empty one: nothing to compute)."""
        nd = len(shape)
        if nd > jit.MAX_DIMS:
            raise ValueError("dualcast.elementwise: a %d-dimensional broadcast shape; at most %d" % (nd, jit.MAX_DIMS))
        p = cuda_kernel.plan(shape, in_strides, self._itemsize, self.sms, fast=_fast_walk,
                             fast_blocks_per_sm=self._fast_blocks)
        if p is None:
            return None
        a = self._Args()
        a.n, a.ndim, a.rowwise, a.unit = p.n, nd, int(p.walk == "rowwise"), p.unit
        for d, size in enumerate(shape):
            a.shape[d] = size
        for i, st in enumerate(in_strides):
            for d, x in enumerate(st):
                a.in_strides[i * jit.MAX_DIMS + d] = x
        return _Launch(self, bytes(a), p, self._fn[("fast" if p.walk == "fast" else "general", p.bits)])

    def run(self, stream, shape, inputs, in_strides, outputs, partials):
        """As jit.Kernel.run, on device memory, queued on `stream` (a CUstream handle; 0: the legacy
        default stream). Returns without waiting for the GPU."""
        go = self.plans.get(shape, inputs, in_strides, outputs, partials)
        if go is not None:
            go(stream, inputs, outputs, [p or 0 for p in partials])


_popped = ctypes.c_void_p()  # cuCtxPopCurrent_v2's answer, not read (every thread writes its own context)


class _Launch:
    """One call shape of a CudaKernel: the Args bytes with the shape, strides and walk filled in, the
    cuda_kernel.Plan (walk, grid) and the entry point; the addresses per call."""

    __slots__ = ("_kernel", "_template", "plan", "_fn")

    def __init__(self, kernel, template, plan, fn):
        self._kernel, self._template, self.plan, self._fn = kernel, template, plan, fn

    def describe(self):
        """This launch for dualcast.native's compiled launcher (csrc/launcher.cpp, Launch::from): the
        context, entry point, grid, the Args bytes and where in them the addresses and `vec` go, what
        vector_ok needs, and the address counts."""
        k, p = self._kernel, self.plan
        A = k._Args
        return ("cuda", k._ctx, self._fn.value, p.grid[0], p.grid[1], THREADS, self._template, A.in_.offset,
                A.out.offset, A.partials.offset, A.vec.offset, bool(p.walk == "fast" and p.vec_strides), p.unit,
                p.vec_bytes, k.spec.n_in, k.spec.n_out, max(k.spec.n_partials, 1))

    def __call__(self, stream, inputs, outputs, partials):
        k, p = self._kernel, self.plan
        a = k._Args.from_buffer_copy(self._template)
        a.in_[:] = inputs
        a.out[:] = outputs
        a.partials[:len(partials)] = partials
        a.vec = cuda_kernel.vector_ok(p, inputs, outputs, partials)  # a view may start mid-vector
        params = (ctypes.c_void_p * 1)(ctypes.addressof(a))  # one parameter: the Args struct, by value
        # _InContext's push and pop, written out: a context manager costs a microsecond per launch.
        cu = _cuda
        _cu_check(cu.cuCtxPushCurrent_v2(k._ctx), "cuCtxPushCurrent_v2")
        try:
            _cu_check(cu.cuLaunchKernel(self._fn, p.grid[0], p.grid[1], 1, THREADS, 1, 1, 0, stream, params, None),
                      "cuLaunchKernel of %d x %d blocks" % p.grid)
        finally:
            cu.cuCtxPopCurrent_v2(_popped)


_kernels = {}
_fast_walk = True


def set_fast_walk(enabled):
    """Whether calls may take the fast walk (True, the default). False sends every call through the
    general walk, to compare the two bit for bit (tests/test_torch.py) or to measure the difference;
    the call-shape plans made so far are dropped, and the signatures handed to the compiled launcher
    (dualcast.native) with them."""
    global _fast_walk
    with _lock:
        _fast_walk = bool(enabled)
        for k in _kernels.values():
            k.plans = jit.LaunchPlans(k.spec, k._launch)
    native.plans_changed()  # the compiled launcher holds launches made from the old plans


def compile_kernel(spec, dtype, device):
    """The CudaKernel of (spec, dtype) on GPU `device` (an index), compiled or loaded once."""
    key = (spec.source(dtype, "cuda"), device)
    with _lock:
        k = _kernels.get(key)
        if k is None:
            k = _kernels[key] = CudaKernel(spec, dtype, device)
        else:
            jit.stats["from_memory"] += 1
        return k


def available():
    """Whether NVRTC can be loaded (a GPU is not needed to compile)."""
    try:
        nvrtc()
        return True
    except RuntimeError:
        return False

