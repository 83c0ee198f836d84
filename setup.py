"""setup.py: only what pyproject.toml cannot say: the package carries a copy of the library's
dual-number headers (dualcast.jit compiles against them at run time), taken from include/dualcast."""
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
HEADERS = ("config.hpp", "dual.hpp", "math.hpp", "vector_math.hpp", "half.hpp")  # dualcast.jit.HEADERS


class BuildWithHeaders(build_py):
    def run(self):
        super().run()
        dst = os.path.join(self.build_lib, "dualcast", "include", "dualcast")
        os.makedirs(dst, exist_ok=True)
        for h in HEADERS:
            shutil.copy(os.path.join(ROOT, "include", "dualcast", h), dst)


setup(cmdclass={"build_py": BuildWithHeaders})
