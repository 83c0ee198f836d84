"""dualcast.native: the compiled launcher (csrc/launcher.cpp), which runs the calls of an elementwise
function whose signature PyTorch has seen before without the interpreter: key, outputs, launch and
autograd node in C++ (python/README.md, "Call overhead").

It is built with torch.utils.cpp_extension against the PyTorch in use (about 30-60 s, once per PyTorch,
Python and source: the build is cached under $DUALCAST_NATIVE_DIR, default
~/.cache/dualcast/native) and loaded in the process. $DUALCAST_NATIVE chooses when:

    auto (default)  the first elementwise function starts the build on a worker thread; calls take
                    the Python launcher until it is loaded, then the compiled one
    wait            the first elementwise function waits for the build (tests, benchmarks)
    off             the Python launcher only

status() says which launcher calls take and why; a build that fails warns once, with the
compiler's message, and leaves the Python launcher in place.
"""
import hashlib
import os
import subprocess
import sys
import threading
import time
import warnings

__all__ = ["status", "start", "module"]

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "launcher.cpp")

MODULE = None  # the loaded extension module, once built (read on every call: a plain global)
_error = None  # why there is none: the build's failure, or the mode
_thread = None
_lock = threading.Lock()


def mode():
    m = os.environ.get("DUALCAST_NATIVE", "auto").strip().lower() or "auto"
    if m not in ("auto", "wait", "off"):
        raise ValueError("DUALCAST_NATIVE must be auto, wait or off, not %r" % m)
    return m


def build_dir():
    return os.environ.get("DUALCAST_NATIVE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "dualcast",
                                                                  "native")


def status():
    """'compiled: <module file>', or 'python: <why>' (building, off, or the build's error)."""
    if MODULE is not None:
        return "compiled: %s" % getattr(MODULE, "__file__", "?")
    if _error is not None:
        return "python: %s" % _error
    if _thread is not None and _thread.is_alive():
        return "python: the compiled launcher is being built"
    return "python: the compiled launcher was not asked for yet" if mode() != "off" else "python: DUALCAST_NATIVE=off"


def start():
    """Starts (auto) or runs (wait) the build, once per process; nothing with DUALCAST_NATIVE=off."""
    global _thread, _error
    m = mode()
    if m == "off":
        return
    with _lock:
        if MODULE is not None or _error is not None:
            return
        if _thread is None:
            _thread = threading.Thread(target=_build, name="dualcast-native-build", daemon=True)
            _thread.start()
        t = _thread
    if m == "wait":
        t.join()


def module():
    """The loaded module, waiting for a build under way; None if there is none."""
    t = _thread
    if t is not None:
        t.join()
    return MODULE


def _cuda_include():
    from . import cuda
    home = cuda.cuda_home()
    inc = os.path.join(home, "include") if home else None
    return inc if inc and os.path.isfile(os.path.join(inc, "cuda_runtime_api.h")) else None


def _spec():
    """(name, build folder, with_cuda) of the launcher for the PyTorch in use."""
    import torch
    with_cuda = bool(torch.version.cuda) and _cuda_include() is not None
    with open(_SOURCE, "rb") as f:
        source = f.read()
    tag = hashlib.sha256(repr((source, torch.__version__, sys.version, with_cuda)).encode()).hexdigest()[:16]
    name = "dualcast_native_" + tag
    return name, os.path.join(build_dir(), name), with_cuda


def _load(name, where, with_cuda):
    from torch.utils import cpp_extension
    flags = ["-O2"] + (["-DDUALCAST_NATIVE_CUDA"] if with_cuda else [])
    # No .cu file is compiled, but with_cuda asks for an architecture list, which a machine without
    # a GPU cannot answer.
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if with_cuda and not arch:
        os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0"
    try:
        return cpp_extension.load(name=name, sources=[_SOURCE], extra_cflags=flags, build_directory=where,
                                  with_cuda=with_cuda, verbose=False)
    finally:
        if with_cuda and not arch:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)


# A lock file older than this is a build that died.
_STALE_LOCK_S = 900


def _build():
    global MODULE, _error
    try:
        import torch
        name, where, with_cuda = _spec()
        os.makedirs(where, exist_ok=True)
        if not os.path.isfile(os.path.join(where, name + ".so")):
            from torch.utils import cpp_extension
            lock = os.path.join(where, "lock")
            # PyTorch 1.13 and 2.11 lock by the lock file's existence (FileBaton), so a build
            # killed midway blocks every later one; 2.15 holds an OS lock on a file that stays.
            if (hasattr(cpp_extension, "FileBaton") and os.path.exists(lock) and
                    time.time() - os.path.getmtime(lock) > _STALE_LOCK_S):
                os.remove(lock)
            # A child process builds it, so that the build finishes (and releases its lock) even if
            # this process ends first: a short script must not leave a half-made build behind.
            here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            r = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r)\n"
                                "from dualcast import native; native._load(*native._spec())" % here],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError((r.stderr or r.stdout or "exit status %d" % r.returncode).strip())
        mod = _load(name, where, with_cuda)
        if with_cuda and torch.cuda.is_available():
            from . import cuda
            import ctypes
            cu = cuda.driver()

            def addr(f):
                return ctypes.cast(f, ctypes.c_void_p).value

            mod.set_driver(addr(cu.cuCtxPushCurrent_v2), addr(cu.cuCtxPopCurrent_v2), addr(cu.cuLaunchKernel),
                           addr(cu.cuGetErrorName))
        MODULE = mod
    except Exception as e:  # any failure leaves the Python launcher, said once
        text = [t for t in str(e).strip().splitlines() if t.strip()]
        _error = "the compiled launcher did not build: %s" % (" | ".join(text[-6:]) if text else type(e).__name__)
        warnings.warn("dualcast: %s; calls take the Python launcher (slower)" % _error, RuntimeWarning)


_listeners = []


def on_plans_changed(fn):
    """fn() is called when launch plans made so far no longer hold (dualcast.cuda.set_fast_walk):
    dualcast.torch drops the signatures it handed to the compiled launcher."""
    _listeners.append(fn)


def plans_changed():
    for fn in _listeners:
        fn()
