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
CUDA_READY = False  # its CUDA half is built and has the driver's entry points: it takes CUDA calls
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
        torch = sys.modules.get("torch")
        gpu = torch is not None and torch.cuda.is_available()
        return "compiled: %s%s" % (getattr(MODULE, "__file__", "?"), " (CPU calls; CUDA calls take the Python "
                                   "launcher)" if gpu and not CUDA_READY else "")
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


def _cuda_headers():
    """Whether a CUDA toolkit's runtime headers are there (the launcher's CUDA half includes them)."""
    from . import cuda
    try:
        home = cuda.cuda_home()
    except RuntimeError:  # no CUDA toolkit: a CPU-only launcher
        return False
    return os.path.isfile(os.path.join(home, "include", "cuda_runtime_api.h"))


def _spec(with_cuda):
    """(name, build folder) of the launcher for the PyTorch in use, with or without its CUDA half."""
    import torch
    with open(_SOURCE, "rb") as f:
        source = f.read()
    tag = hashlib.sha256(repr((source, torch.__version__, sys.version, with_cuda)).encode()).hexdigest()[:16]
    name = "dualcast_native_" + tag
    return name, os.path.join(build_dir(), name)


def _compile(name, where, with_cuda):
    """Builds the launcher (run in a child process by _build_in_child)."""
    from torch.utils import cpp_extension
    flags = ["-O2"] + (["-DDUALCAST_NATIVE_CUDA"] if with_cuda else [])
    cpp_extension.load(name=name, sources=[_SOURCE], extra_cflags=flags, build_directory=where,
                       with_cuda=with_cuda, verbose=False)


# A lock file older than this is a build that died; a build that takes longer than _BUILD_S failed.
_STALE_LOCK_S = 300
_BUILD_S = 1200


def _build_in_child(name, where, with_cuda):
    """The launcher's library, built by a child process if it is not there yet: the build finishes (and
    releases its lock) even if this process ends first, so a short script leaves no half-made build."""
    so = os.path.join(where, name + ".so")
    os.makedirs(where, exist_ok=True)
    lock = os.path.join(where, "lock")
    # PyTorch 1.13 and 2.11 lock by the lock file's existence (FileBaton), so a build killed midway
    # would make every later one wait forever; 2.15 holds an OS lock on a file that stays.
    from torch.utils import cpp_extension
    if hasattr(cpp_extension, "FileBaton"):
        while not os.path.isfile(so) and os.path.exists(lock):
            try:
                if time.time() - os.path.getmtime(lock) > _STALE_LOCK_S:
                    os.replace(lock, lock + ".stale")  # one process takes it away; the others see it gone
                    continue
            except OSError:  # released or taken away meanwhile
                continue
            time.sleep(0.5)
    if os.path.isfile(so):
        return so
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # No .cu file is compiled, but with_cuda asks for an architecture list, which a machine without
    # a GPU cannot answer: set for the child only.
    env = dict(os.environ)
    if with_cuda and not env.get("TORCH_CUDA_ARCH_LIST"):
        env["TORCH_CUDA_ARCH_LIST"] = "9.0"
    r = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r)\n"
                        "from dualcast import native; native._compile(%r, %r, %r)" % (here, name, where, with_cuda)],
                       capture_output=True, text=True, env=env, timeout=_BUILD_S)
    if r.returncode != 0 or not os.path.isfile(so):
        raise RuntimeError((r.stderr or r.stdout or "exit status %d" % r.returncode).strip())
    return so


def _import(name, so):
    """The built library, imported as a module (PyTorch's own loader would take its build lock)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, so)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _build():
    global MODULE, CUDA_READY, _error
    try:
        import torch
        with_cuda = bool(torch.version.cuda) and _cuda_headers()
        try:
            name, where = _spec(with_cuda)
            mod = _import(name, _build_in_child(name, where, with_cuda))
        except Exception as e:
            if not with_cuda:
                raise
            # The CUDA half did not build (headers of another CUDA, say): the CPU half, said once.
            warnings.warn("dualcast: the compiled launcher's CUDA half did not build (%s); CUDA calls take "
                          "the Python launcher" % _last_lines(e), RuntimeWarning)
            with_cuda = False
            name, where = _spec(False)
            mod = _import(name, _build_in_child(name, where, False))
        if with_cuda and mod.cuda and torch.cuda.is_available():
            from . import cuda
            import ctypes
            cu = cuda.driver()

            def addr(f):
                return ctypes.cast(f, ctypes.c_void_p).value

            mod.set_driver(addr(cu.cuCtxPushCurrent_v2), addr(cu.cuCtxPopCurrent_v2), addr(cu.cuLaunchKernel),
                           addr(cu.cuGetErrorName))
            CUDA_READY = True
        MODULE = mod
    except Exception as e:  # any failure leaves the Python launcher, said once
        _error = "the compiled launcher did not build: %s" % _last_lines(e)
        warnings.warn("dualcast: %s; calls take the Python launcher (slower)" % _error, RuntimeWarning)


def _last_lines(e):
    text = [t for t in str(e).strip().splitlines() if t.strip()]
    return " | ".join(text[-6:]) if text else type(e).__name__


_listeners = []


def on_plans_changed(fn):
    """fn() is called when launch plans made so far no longer hold (dualcast.cuda.set_fast_walk):
    dualcast.torch drops the signatures it handed to the compiled launcher."""
    _listeners.append(fn)


def plans_changed():
    for fn in _listeners:
        fn()
