"""dualcast.core: the C++ library's tensors from Python, with zero-copy DLPack exchange both ways
(NumPy, PyTorch, JAX, CuPy: anything with __dlpack__). The work is done by dualcast._core, a pybind11
extension that `pip install .` builds when it finds CMake, a C++ compiler and pybind11
(python/README.md, "dualcast tensors and DLPack"); without it `import dualcast.core` still works and
`available()` is False, `reason()` says why, and every other name raises ImportError saying what to do.

    from dualcast import core
    x = core.from_dlpack(torch_tensor)      # no copy; CUDA work ordered by DLPack's stream protocol
    y = torch.from_dlpack(x.sum())          # and back
    core.build_info()["cuda"]               # whether the library was built with CUDA

$DUALCAST_CORE_DIR names a folder to load the module from instead of the package (a CMake build's
python/dualcast, as the tests do)."""

import glob
import importlib.machinery
import importlib.util
import os
import sys

_NAMES = ("Tensor", "Error", "from_dlpack", "zeros", "ones", "empty", "full", "arange", "randn", "tensor")
_core = None
_reason = None


def _load():
    folder = os.environ.get("DUALCAST_CORE_DIR")
    if not folder:
        from . import _core as module  # noqa: PLC0415 - optional: a pure-Python install has none
        return module
    # A module built for another Python ABI has another suffix, so only this Python's are looked for.
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(folder, "_core" + suffix)
        if os.path.isfile(path):
            # module_from_spec sets __spec__, which pybind11 >= 3's multi-phase initialisation reads.
            spec = importlib.util.spec_from_file_location(__package__ + "._core", path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[spec.name]
                raise
            return module
    others = sorted(os.path.basename(p) for p in glob.glob(os.path.join(folder, "_core*")))
    raise ImportError("DUALCAST_CORE_DIR=%s holds no _core module for this Python (%s looks for _core%s)%s"
                      % (folder, sys.executable, importlib.machinery.EXTENSION_SUFFIXES[0],
                         "; it holds %s, built for another Python" % ", ".join(others) if others else ""))


try:
    _core = _load()
except Exception as e:  # noqa: BLE001 - a module that fails to initialise is missing too, and says why
    _reason = "%s: %s" % (type(e).__name__, e)


def available():
    """Whether the compiled module dualcast._core is loaded."""
    return _core is not None


def reason():
    """Why dualcast._core is missing (None when it is loaded)."""
    return _reason


def _missing(name):
    return ImportError(
        "dualcast.core.%s needs the compiled module dualcast._core, which did not load: %s. Install with "
        "`pip install .` where CMake, a C++ compiler and pybind11 are found (DUALCAST_BUILD_CORE=1 makes a "
        "missing one an error), or set DUALCAST_CORE_DIR to a CMake build's python/dualcast folder." % (name, _reason))


def build_info():
    """What the library was built with: {'cuda': bool (DUALCAST_WITH_CUDA), 'cuda_devices': int,
    'version': str, 'pybind11': str}."""
    if _core is None:
        raise _missing("build_info")
    return _core.build_info()


def tensor(data, dtype="float32", device="cpu"):
    """A new tensor holding a copy of `data`: a number or nested lists of numbers."""
    if _core is None:
        raise _missing("tensor")
    shape, flat = [], []

    def walk(x, dim):
        if isinstance(x, (list, tuple)):
            if len(shape) == dim:
                shape.append(len(x))
            elif shape[dim] != len(x):
                raise ValueError("dualcast.core.tensor: argument data is ragged (%d and %d elements at depth %d)"
                                 % (shape[dim], len(x), dim))
            for y in x:
                walk(y, dim + 1)
        else:
            if dim != len(shape):
                raise ValueError("dualcast.core.tensor: argument data is ragged (a number at depth %d)" % dim)
            flat.append(float(x))

    walk(data, 0)
    return _core._from_values(flat, shape, dtype, device)


if _core is not None:
    Tensor, Error, from_dlpack = _core.Tensor, _core.Error, _core.from_dlpack
    zeros, ones, empty, full, arange, randn = _core.zeros, _core.ones, _core.empty, _core.full, _core.arange, _core.randn


def __getattr__(name):
    if name in _NAMES:
        raise _missing(name)
    raise AttributeError("module 'dualcast.core' has no attribute %r" % name)


__all__ = ["available", "reason", "build_info"] + list(_NAMES)
