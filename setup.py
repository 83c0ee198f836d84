"""setup.py: what pyproject.toml cannot say. (1) The package carries a copy of the library's
dual-number headers (dualcast.jit compiles against them at run time), taken from include/dualcast.
(2) The compiled module dualcast._core (dualcast.core: the C++ library's tensors and DLPack) is built
with CMake when it can be: the whole library, Release, CUDA when nvcc is found. $DUALCAST_BUILD_CORE:
auto (default: without cmake, a C++ compiler or pybind11 it says so and installs the pure-Python
package), 1 (their absence is an error), 0 (never built). $DUALCAST_CMAKE_ARGS adds configure
arguments; $DUALCAST_CUDA_DEVICE_CODE overrides run/check (see CMakeLists.txt). python/README.md says
why setuptools + CMake + pybind11 and not scikit-build-core + nanobind."""
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
HEADERS = ("config.hpp", "dual.hpp", "math.hpp", "vector_math.hpp", "half.hpp")  # dualcast.jit.HEADERS
MODE = os.environ.get("DUALCAST_BUILD_CORE", "auto").lower()
if MODE not in ("auto", "0", "1"):
    sys.exit("setup.py: DUALCAST_BUILD_CORE must be auto, 0 or 1, not %r" % MODE)


def say(msg):
    # pip shows a build's output with -v only, and stderr when it fails; both get it.
    print("dualcast setup.py: " + msg, flush=True)
    print("dualcast setup.py: " + msg, file=sys.stderr, flush=True)


class BuildWithHeaders(build_py):
    def run(self):
        super().run()
        dst = os.path.join(self.build_lib, "dualcast", "include", "dualcast")
        os.makedirs(dst, exist_ok=True)
        for h in HEADERS:
            shutil.copy(os.path.join(ROOT, "include", "dualcast", h), dst)


def missing_toolchain():
    """What the core build lacks that can be seen before CMake runs (pybind11 is CMake's to find)."""
    if not os.path.isfile(os.path.join(ROOT, "CMakeLists.txt")):
        return "the library's sources (CMakeLists.txt) are not in %s" % ROOT
    if shutil.which("cmake") is None:
        return "cmake is not on PATH"
    cxx = os.environ.get("CXX") or next((c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)
    if cxx is None or shutil.which(shlex.split(cxx)[0]) is None:
        return "no C++ compiler (c++, g++, clang++ or $CXX) is on PATH"
    return None


class BuildCore(build_ext):
    """Configures and builds the project with CMake and copies python/dualcast/_core*.so into the
    package. The build folder is build/py-core-<tag>-<interpreter> inside the source tree, at the
    depth of the presets' build/<preset>, so that ccache (base_dir: the source tree) finds the CI
    build's objects."""

    def build_extension(self, ext):
        try:
            self._build(ext)
        except (OSError, subprocess.CalledProcessError, RuntimeError) as e:
            if MODE == "1":
                raise RuntimeError("dualcast setup.py: DUALCAST_BUILD_CORE=1 and the core did not build: %s" % e) from e
            say("the compiled module dualcast._core was NOT built (%s); installing the pure-Python package "
                "(dualcast.jit and dualcast.torch work; dualcast.core.available() is False)" % e)

    def _build(self, ext):
        # One folder per interpreter, not per ABI tag: CMake caches what it found through this Python
        # (its headers, pybind11 or PyTorch's copy of it), which another Python of the same tag lacks.
        tag = sysconfig.get_config_var("SOABI") or "py%d%d" % sys.version_info[:2]
        who = hashlib.sha1(os.path.realpath(sys.executable).encode() + sys.prefix.encode()).hexdigest()[:8]
        build = os.path.join(ROOT, "build", "py-core-%s-%s" % (tag, who))
        nvcc = shutil.which("nvcc") or (os.path.isfile("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc")
        gpu = shutil.which("nvidia-smi") and b"GPU" in subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True).stdout
        device_code = os.environ.get("DUALCAST_CUDA_DEVICE_CODE") or ("run" if gpu else "check")
        args = ["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DDUALCAST_BUILD_TESTS=OFF",
                "-DDUALCAST_BUILD_EXPERIMENTS=OFF", "-DDUALCAST_INSTALL_TEST=OFF", "-DDUALCAST_PYTHON=ON",
                "-DPython3_EXECUTABLE=" + sys.executable, "-DDUALCAST_CUDA_DEVICE_CODE=" + device_code]
        if nvcc:
            args += ["-DDUALCAST_ENABLE_CUDA=ON", "-DCMAKE_CUDA_COMPILER=" + nvcc]
        else:
            args += ["-DDUALCAST_ENABLE_CUDA=OFF"]
        if shutil.which("ninja") and not os.path.isfile(os.path.join(build, "CMakeCache.txt")):
            args += ["-G", "Ninja"]  # as the presets; a configured folder keeps its generator
        args += shlex.split(os.environ.get("DUALCAST_CMAKE_ARGS", ""))
        say("building the C++ library and dualcast._core with CMake in %s (%s; this takes minutes)"
            % (build, "CUDA with nvcc %s, device code %s" % (nvcc, device_code) if nvcc else "CPU only: no nvcc found"))
        r = subprocess.run(args, capture_output=True, text=True)
        if r.returncode != 0:
            # CMake writes its errors, each over several wrapped lines, to stderr: all of them, whole.
            raise RuntimeError("CMake's configure failed:\n" + "\n".join(r.stderr.strip().splitlines()[-40:]))
        backend = "CUDA" if "dualcast: CUDA backend ON" in r.stdout else "CPU-only"
        for line in r.stdout.splitlines():
            if "dualcast: Python module" in line or "dualcast: CUDA backend" in line:
                say(line.strip("- "))
        r = subprocess.run(["cmake", "--build", build, "--target", "dualcast_core", "-j", str(os.cpu_count() or 2)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("the build failed:\n" + "\n".join((r.stdout + r.stderr).splitlines()[-30:]))
        folder = os.path.join(build, "python", "dualcast")
        built = [f for f in os.listdir(folder) if f.startswith("_core.") and f.endswith(".so")]
        if len(built) != 1:
            raise RuntimeError("expected one _core*.so in %s, found %s" % (folder, built))
        dst = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy(os.path.join(folder, built[0]), dst)
        say("built dualcast._core (%s backend) -> %s" % (backend, dst))


ext_modules = []
if MODE != "0":
    why = missing_toolchain()
    if why is None:
        ext_modules = [Extension("dualcast._core", sources=[])]
    elif MODE == "1":
        sys.exit("dualcast setup.py: DUALCAST_BUILD_CORE=1, but the compiled module cannot be built: " + why)
    else:
        say("the compiled module dualcast._core is NOT built: %s; installing the pure-Python package "
            "(dualcast.core.available() will be False)" % why)
else:
    say("DUALCAST_BUILD_CORE=0: the compiled module dualcast._core is not built")

setup(cmdclass={"build_py": BuildWithHeaders, "build_ext": BuildCore}, ext_modules=ext_modules)
