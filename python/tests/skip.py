"""Skip: what a test module (at import) or a test raises when its requirements are missing; run.py
reports it as skipped. Under pytest, pytest's own skip is used instead (skip_module)."""


class Skip(Exception):
    pass


def skip_module(reason):
    """Skips the importing test module: pytest's module-level skip under pytest, else Skip."""
    try:
        import pytest
    except ImportError:
        raise Skip(reason) from None
    pytest.skip(reason, allow_module_level=True)


def import_torch(cuda=False):
    """PyTorch for a test module, or the module skipped: without PyTorch, or (cuda=True) without a
    CUDA device."""
    try:
        import torch
    except ImportError:
        skip_module("PyTorch is not installed (python3 -c 'import torch' fails)")
    if cuda and not torch.cuda.is_available():
        skip_module("no CUDA device")
    return torch
