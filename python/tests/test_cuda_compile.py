"""dualcast.cuda's compile half, which needs NVRTC but no GPU: the generated CUDA source of every kind
of body compiles to a cubin for the H100/H200 (sm_90), is cached on disk, and a body error names the
user's line as on the CPU. Launching the kernels needs a GPU: test_torch.py, on the GPU machine."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from skip import skip_module  # noqa: E402

from dualcast import cuda, jit  # noqa: E402

if not cuda.available():
    skip_module("NVRTC is not installed (no CUDA toolkit: set CUDA_HOME)")

ARCH = 90  # H100 and H200
CELL = """
    if (z == 1) return sigmoid(i) * tanh(g);
    if (zb == 0) return c;
    return sigmoid(f) * c + sigmoid(i) * tanh(g);
"""


def is_cubin(blob):
    return blob[:4] == b"\x7fELF" and len(blob) > 1000


def test_every_kind_of_body_compiles_to_a_cubin():
    specs = [jit.Spec(CELL, "z zb c f i g", "c f i g"),
             jit.Spec("return {a * b, sin(a) + exp(b)};", "a b", "a b", outputs=2),
             jit.Spec("if (x > y) return x * x * y; return 0;", "x y", "x"),
             jit.Spec("return pow(x, 3.0) + log1p(abs(x)) + erf(x) - sqrt(x * x + 1);", "x", "x")]
    for spec in specs + [spec.gradient() for spec in specs] + [spec.values() for spec in specs]:
        for dtype in ("float32", "float64"):
            assert is_cubin(cuda.compile_cubin(spec, dtype, ARCH)), (spec.body, dtype)


def test_a_cubin_comes_from_the_disk_cache_the_second_time():
    spec = jit.Spec("return x * 7;", "x", "x")
    before = dict(jit.stats)
    a = cuda.compile_cubin(spec, "float32", ARCH)
    b = cuda.compile_cubin(spec, "float32", ARCH)
    assert a == b
    assert jit.stats["compiled"] - before["compiled"] == 1
    assert jit.stats["loaded_from_disk"] - before["loaded_from_disk"] == 1


def test_an_nvrtc_error_names_the_users_line():
    body = "T s = x * 2;\nif (s > 1)\n  return undefined_function(s);\nreturn s;"
    try:
        cuda.compile_cubin(jit.Spec(body, "x", "x"), "float32", ARCH)
    except jit.CompileError as e:
        msg = str(e)
        assert "NVRTC" in msg and "line 3 of the body: return undefined_function(s);" in msg, msg
    else:
        raise AssertionError("an undefined function compiled under NVRTC")


def test_a_body_without_a_return_on_some_path_is_an_error_under_nvrtc_too():
    try:
        cuda.compile_cubin(jit.Spec("if (x > 0) return x;", "x", "x"), "float32", ARCH)
    except jit.CompileError as e:
        assert "missing return statement" in str(e), str(e)
    else:
        raise AssertionError("NVRTC compiled a body that can end without a return")


def test_the_generated_source_compiles_in_a_second_process_from_the_cache():
    spec_args = ("return x + 1;", "x", "x")
    cuda.compile_cubin(jit.Spec(*spec_args), "float64", ARCH)
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from dualcast import cuda, jit\n"
            "cuda.compile_cubin(jit.Spec(%r, %r, %r), 'float64', %d)\n"
            "print(jit.stats['compiled'], jit.stats['loaded_from_disk'])\n") % (
        os.path.join(HERE, ".."), *spec_args, ARCH)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "1"], r.stdout


def test_every_driver_call_names_the_symbol_cuda_h_maps_it_to():
    # A ctypes call skips cuda.h's #define cuX cuX_v2: calling the legacy cuCtxPushCurrent failed on
    # the GPU. Every cu* name dualcast.cuda calls must be one cuda.h does not rename.
    import re
    header = os.path.join(cuda.cuda_home(), "include", "cuda.h")
    renamed = dict(re.findall(r"^\s*#\s*define\s+(cu[A-Za-z0-9]+)\s+(cu[A-Za-z0-9_]+)\s*$",
                              open(header).read(), re.M))
    source = open(cuda.__file__).read()
    called = set(re.findall(r"\.(cu[A-Z][A-Za-z0-9_]*)\(", source))
    assert "cuLaunchKernel" in called and "cuCtxPushCurrent_v2" in called, sorted(called)
    stale = sorted(name for name in called if name in renamed)
    assert not stale, "call %s instead" % ", ".join("%s as %s" % (n, renamed[n]) for n in stale)
