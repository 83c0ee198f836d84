"""`pip install .`: the installed package carries the headers its kernels compile against and works
from any folder; where this Python can build the compiled module (cmake, a C++ compiler, pybind11),
the installed package's dualcast.core loads it and exchanges a tensor. Builds offline
(--no-build-isolation), so it needs setuptools >= 61 and wheel in this Python; skips itself otherwise."""

import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)

from skip import Skip, skip_module  # noqa: E402

if importlib.util.find_spec("setuptools") is None or importlib.util.find_spec("wheel") is None:
    skip_module("pip install . offline needs setuptools and wheel in %s" % sys.executable)
import setuptools  # noqa: E402

if int(setuptools.__version__.split(".")[0]) < 61:
    skip_module("pip install . needs setuptools >= 61 (this Python has %s)" % setuptools.__version__)


def copy_checkout(src, with_library):
    """A copy of what the package is built from, so that the build's by-products (build/, *.egg-info)
    do not land in the checkout; with_library adds what setup.py's CMake build needs."""
    for f in ("pyproject.toml", "setup.py") + (("CMakeLists.txt",) if with_library else ()):
        shutil.copy(os.path.join(ROOT, f), os.path.join(src, f))
    shutil.copytree(os.path.join(ROOT, "python", "dualcast"), os.path.join(src, "python", "dualcast"),
                    ignore=shutil.ignore_patterns("__pycache__", "_core*.so"))
    shutil.copy(os.path.join(ROOT, "python", "README.md"), os.path.join(src, "python", "README.md"))
    for d in ("include",) + (("cmake", "kernels", "src") if with_library else ()):
        shutil.copytree(os.path.join(ROOT, d), os.path.join(src, d))


def install(tmp, build_core):
    """`pip install` of a copy of the checkout into tmp/site, from tmp/work (with the library's sources
    when the core is to be built); the pip run and (site, work)."""
    target, work, src = os.path.join(tmp, "site"), os.path.join(tmp, "work"), os.path.join(tmp, "src")
    os.makedirs(work)
    os.makedirs(src)
    copy_checkout(src, with_library=build_core != "0")
    env = dict(os.environ, DUALCAST_BUILD_CORE=build_core)
    env.pop("DUALCAST_CORE_DIR", None)
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps",
                        "--target", target, src], capture_output=True, text=True, cwd=work, env=env)
    return r, target, work


def run_installed(code, target, work, **env):
    """`code` in a fresh Python that finds only the installed package (no DUALCAST_* from this one)."""
    env = dict(os.environ, PYTHONPATH=target, **env)
    for k in ("DUALCAST_INCLUDE_DIR", "DUALCAST_CORE_DIR"):
        env.pop(k, None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=work, env=env)


def test_the_installed_package_compiles_a_kernel_from_any_folder():
    with tempfile.TemporaryDirectory() as tmp:
        r, target, work = install(tmp, build_core="0")  # the pure-Python install
        assert r.returncode == 0, r.stdout + r.stderr
        assert os.path.isfile(os.path.join(target, "dualcast", "include", "dualcast", "dual.hpp"))
        # The compiled launcher's source travels with the package (dualcast.native builds it at run time).
        assert os.path.isfile(os.path.join(target, "dualcast", "csrc", "launcher.cpp"))
        assert not glob.glob(os.path.join(target, "dualcast", "_core*"))
        code = ("from dualcast import jit, native, core\n"
                "assert jit.include_dir().startswith(%r), jit.include_dir()\n"
                "assert native._SOURCE.startswith(%r) and __import__('os').path.isfile(native._SOURCE)\n"
                "k = jit.compile_kernel(jit.Spec('return x * x;', 'x', 'x'), 'float64')\n"
                "assert not core.available() and 'DUALCAST_CORE_DIR' in str(core._missing('Tensor'))\n"
                "print('ok')\n") % (target, target)
        r = run_installed(code, target, work, DUALCAST_CACHE_DIR=os.path.join(tmp, "cache"))
        assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def can_build_core():
    """Why this Python cannot build dualcast._core, or None: what setup.py and CMake look for."""
    if shutil.which("cmake") is None:
        return "no cmake on PATH"
    if not any(shutil.which(c) for c in (os.environ.get("CXX") or "c++", "g++")):
        return "no C++ compiler"
    configs = glob.glob("/usr/lib/cmake/pybind11") + glob.glob("/usr/share/cmake/pybind11") + \
        glob.glob("/usr/local/lib/cmake/pybind11") + glob.glob("/usr/local/share/cmake/pybind11")
    if not configs and importlib.util.find_spec("pybind11") is None and importlib.util.find_spec("torch") is None:
        return "no pybind11 (CMake config, Python package or PyTorch's bundled headers)"
    if not os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
        return "no Python.h for %s" % sys.executable
    return None


def test_the_installed_package_builds_and_loads_the_compiled_module():
    why = can_build_core()
    if why:
        raise Skip("this Python cannot build dualcast._core: %s" % why)
    with tempfile.TemporaryDirectory() as tmp:
        r, target, work = install(tmp, build_core="1")  # a missing toolchain is an error
        assert r.returncode == 0, r.stdout + r.stderr
        assert len(glob.glob(os.path.join(target, "dualcast", "_core*.so"))) == 1, os.listdir(
            os.path.join(target, "dualcast"))
        code = ("from dualcast import core\n"
                "assert core.available(), core.reason()\n"
                "assert core.__file__.startswith(%r)\n"
                "x = core.arange(6.0).to('float64')\n"
                "y = core.from_dlpack(x.__dlpack__())\n"
                "assert y.data_ptr() == x.data_ptr() and y.sum().item() == 15.0\n"
                "print('ok', core.build_info()['cuda'])\n") % target
        r = run_installed(code, target, work)
        assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout + r.stderr
