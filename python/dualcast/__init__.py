"""dualcast from Python: broadcast functions written as C++ source text, compiled at run time into
fused forward-mode kernels (values and partials) over dual numbers.

    from dualcast.torch import elementwise   # the PyTorch front end (needs torch)
    from dualcast import jit                 # the run-time compiler underneath (no PyTorch needed)

What works and what does not yet: python/README.md.
"""

__version__ = "0.1.0"  # dualcast's version (include/dualcast/config.hpp): part of the kernel cache key

__all__ = ["__version__", "jit"]
