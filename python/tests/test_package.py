"""`pip install .`: the installed package carries the headers its kernels compile against and works
from any folder. Builds offline (--no-build-isolation), so it needs setuptools >= 61 and wheel in this
Python; skips itself otherwise."""

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)

from skip import skip_module  # noqa: E402

if importlib.util.find_spec("setuptools") is None or importlib.util.find_spec("wheel") is None:
    skip_module("pip install . offline needs setuptools and wheel in %s" % sys.executable)
import setuptools  # noqa: E402

if int(setuptools.__version__.split(".")[0]) < 61:
    skip_module("pip install . needs setuptools >= 61 (this Python has %s)" % setuptools.__version__)


def test_the_installed_package_compiles_a_kernel_from_any_folder():
    with tempfile.TemporaryDirectory() as tmp:
        target, work, src = os.path.join(tmp, "site"), os.path.join(tmp, "work"), os.path.join(tmp, "src")
        os.makedirs(work)
        os.makedirs(src)
        # A copy of what the package is built from, so that the build's by-products (build/,
        # *.egg-info) do not land in the checkout.
        for f in ("pyproject.toml", "setup.py"):
            shutil.copy(os.path.join(ROOT, f), os.path.join(src, f))
        shutil.copytree(os.path.join(ROOT, "python", "dualcast"), os.path.join(src, "python", "dualcast"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(os.path.join(ROOT, "python", "README.md"), os.path.join(src, "python", "README.md"))
        shutil.copytree(os.path.join(ROOT, "include", "dualcast"), os.path.join(src, "include", "dualcast"))
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps",
                            "--target", target, src], capture_output=True, text=True, cwd=work)
        assert r.returncode == 0, r.stdout + r.stderr
        assert os.path.isfile(os.path.join(target, "dualcast", "include", "dualcast", "dual.hpp"))
        # The compiled launcher's source travels with the package (dualcast.native builds it at run time).
        assert os.path.isfile(os.path.join(target, "dualcast", "csrc", "launcher.cpp"))
        code = ("from dualcast import jit, native\n"
                "assert jit.include_dir().startswith(%r), jit.include_dir()\n"
                "assert native._SOURCE.startswith(%r) and __import__('os').path.isfile(native._SOURCE)\n"
                "k = jit.compile_kernel(jit.Spec('return x * x;', 'x', 'x'), 'float64')\n"
                "print('ok')\n") % (target, target)
        env = dict(os.environ, PYTHONPATH=target, DUALCAST_CACHE_DIR=os.path.join(tmp, "cache"))
        env.pop("DUALCAST_INCLUDE_DIR", None)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=work, env=env)
        assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
