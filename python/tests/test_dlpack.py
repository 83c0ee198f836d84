"""dualcast.core, the binding of the C++ library (python/dualcast/csrc/core.cpp): dualcast tensors and
their zero-copy DLPack exchange with themselves (runs everywhere the module is built, CI included),
NumPy and PyTorch (where installed), and on CUDA with DLPack's stream protocol (where a GPU is).
The module is found through $DUALCAST_CORE_DIR (ctest sets it to the build's python/dualcast); the
whole file skips where it is not built, and fails where ctest says it was (DUALCAST_CORE_REQUIRED)."""

import gc
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from skip import Skip, skip_module  # noqa: E402

from dualcast import core  # noqa: E402

if not core.available():
    if os.environ.get("DUALCAST_CORE_REQUIRED") == "1":
        raise AssertionError("the build made dualcast._core, but it does not load: %s" % core.reason())
    skip_module("dualcast._core is not built (%s)" % core.reason())

try:
    import numpy as np
except ImportError:
    np = None
try:
    import torch
except ImportError:
    torch = None
# JAX would take most of a GPU's memory at its first array; the CUDA tests share the GPU with it.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
try:
    import jax
    import jax.numpy as jnp
except ImportError:
    jax = None

DTYPES = ("float32", "float64", "bfloat16", "float16", "uint8")
SHAPES = ((), (0,), (1,), (7,), (3, 5), (2, 0, 3), (2, 1, 3), (3, 1, 1, 129))
# sum() of small integers is exact in every dtype; of random values, a few float32 roundings.
SUM_RTOL_FLOAT32 = 1e-5
SUM_RTOL_FLOAT64 = 1e-12


def needs_numpy():
    if np is None:
        raise Skip("NumPy is not installed")


def needs_torch():
    if torch is None:
        raise Skip("PyTorch is not installed")


def needs_jax():
    if jax is None:
        raise Skip("JAX is not installed")


def jax_devices(kind):
    try:
        return jax.devices(kind)
    except RuntimeError:  # no backend of that kind
        return []


def needs_cuda():
    needs_torch()
    if not torch.cuda.is_available():
        raise Skip("no CUDA device")
    if not core.build_info()["cuda"]:
        raise Skip("dualcast._core was built without CUDA")


def raises(exc, fn, *words):
    """fn() raises exc, and its message contains every word."""
    try:
        fn()
    except exc as e:
        for w in words:
            assert w in str(e), (w, str(e))
        return e
    raise AssertionError("%s did not raise %s" % (fn, exc.__name__))


def numbered(shape, dtype, device="cpu"):
    """A tensor of small integers 0, 1, ..., 6, 0, ... (exact in every dtype)."""
    if 0 in shape:
        return core.zeros(shape, dtype, device)
    flat = iter(float(i % 7) for i in range(10 ** 6))

    def nest(dims):
        return [nest(dims[1:]) for _ in range(dims[0])] if dims else next(flat)

    return core.tensor(nest(list(shape)), dtype, device)


def flat(x):
    return [y for z in x for y in flat(z)] if isinstance(x, list) else [x]


# ---- dualcast with itself (no NumPy or PyTorch needed) --------------------------------------------

def test_a_tensor_round_trips_through_its_own_capsule_without_a_copy_in_every_dtype_and_shape():
    for dtype in DTYPES:
        for shape in SHAPES:
            x = numbered(shape, dtype)
            y = core.from_dlpack(x.__dlpack__())
            assert (y.shape, y.dtype, y.device) == (shape, dtype, "cpu"), (y, shape, dtype)
            z = core.from_dlpack(x)  # the object itself, through its __dlpack__
            assert y.tolist() == x.tolist() and z.tolist() == x.tolist()
            if x.numel():  # an empty tensor goes out with no address (to_dlpack)
                assert y.data_ptr() == x.data_ptr() == z.data_ptr()


def test_writes_are_seen_through_an_imported_tensor():
    x = core.zeros((2, 3), "float64")
    y = core.from_dlpack(x)
    y.fill_(2.5)
    assert x.tolist() == [[2.5] * 3] * 2
    x.copy_(core.full((2, 3), -1.0, "float64"))
    assert y.tolist() == [[-1.0] * 3] * 2


def test_an_imported_tensor_keeps_the_memory_alive_after_the_source_is_gone():
    x = core.full((1000,), 3.0, "float32")
    y = core.from_dlpack(x.__dlpack__())
    del x
    gc.collect()
    core.zeros((1000,), "float32").fill_(9.0)  # would reuse freed memory
    assert y.sum().item() == 3000.0


def test_a_capsule_is_consumed_once_and_an_unconsumed_one_frees_its_tensor():
    x = core.ones(4)
    capsule = x.__dlpack__()
    y = core.from_dlpack(capsule)
    assert "used_dltensor" in repr(capsule)
    raises(core.Error, lambda: core.from_dlpack(capsule), "from_dlpack", "already consumed")
    for _ in range(100):  # dropped without a consumer: the capsule's destructor calls the deleter
        core.ones(1 << 16).__dlpack__()
    gc.collect()
    assert y.tolist() == [1.0] * 4 and x.tolist() == [1.0] * 4


def test_the_tensor_reports_shape_dtype_device_and_dlpack_device():
    x = core.zeros((2, 3), dtype="bfloat16")
    assert x.shape == (2, 3) and x.dtype == "bfloat16" and x.device == "cpu" and x.ndim == 2
    assert x.numel() == 6 and x.nbytes == 12
    assert repr(x) == "dualcast.Tensor(shape=(2, 3), dtype=bfloat16, device=cpu)"
    assert repr(core.zeros(())) == "dualcast.Tensor(shape=(), dtype=float32, device=cpu)"
    assert repr(core.zeros(3)) == "dualcast.Tensor(shape=(3,), dtype=float32, device=cpu)"
    assert x.__dlpack_device__() == (1, 0)
    info = core.build_info()
    assert isinstance(info["cuda"], bool) and info["version"] == __import__("dualcast").__version__


def test_factories_conversions_sum_and_item():
    assert core.arange(5.0).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert core.arange(1.0, 2.0, 0.25, dtype="float64").tolist() == [1.0, 1.25, 1.5, 1.75]
    assert core.full((2, 2), 1.5, "float16").tolist() == [[1.5, 1.5], [1.5, 1.5]]
    assert core.tensor([[1, 2], [3, 4]], "uint8").tolist() == [[1, 2], [3, 4]]
    x = core.tensor([[0.5, 1.5, 2.5]], "float64")
    assert x.to("float32").dtype == "float32" and x.to("float32").tolist() == [[0.5, 1.5, 2.5]]
    assert x.to("cpu").data_ptr() == x.data_ptr()  # already there: shares memory
    assert x.to("float64").data_ptr() == x.data_ptr()
    s = x.sum()
    assert isinstance(s, core.Tensor) and s.shape == () and s.item() == 4.5
    r = core.randn((1000,), seed=3, dtype="float64")
    assert r.tolist() == core.randn((1000,), seed=3, dtype="float64").tolist()
    mean = r.sum().item() / 1000
    assert abs(mean) < 0.2, mean  # 6 standard deviations of the mean of 1000 normals
    assert core.zeros(()).item() == 0.0


def test_the_dlpack_arguments_max_version_dl_device_copy_and_stream():
    x = core.arange(4.0)
    for kwargs in ({}, {"stream": None}, {"stream": -1}, {"max_version": (1, 0)}, {"max_version": (0, 8)},
                   {"max_version": (1, 3), "dl_device": (1, 0), "copy": False}, {"copy": None}):
        c = x.__dlpack__(**kwargs)
        assert 'capsule object "dltensor"' in repr(c), (kwargs, c)  # unversioned whatever is asked
        assert core.from_dlpack(c).data_ptr() == x.data_ptr(), kwargs
    y = core.from_dlpack(x.__dlpack__(copy=True))
    assert y.data_ptr() != x.data_ptr() and y.tolist() == x.tolist()
    raises(TypeError, lambda: x.__dlpack__(max_version=1), "max_version")
    raises(TypeError, lambda: x.__dlpack__(stream="s"), "stream")
    raises(TypeError, lambda: x.__dlpack__(copy="yes"), "copy")
    raises(BufferError, lambda: x.__dlpack__(dl_device=(7, 0)), "dl_device", "cpu")
    raises(TypeError, lambda: x.__dlpack__(dl_device=5), "dl_device", "tuple")
    raises(TypeError, lambda: x.__dlpack__(dl_device=(2, "a")), "dl_device", "tuple")
    raises(TypeError, lambda: x.__dlpack__(stream=True), "stream")  # a bool is not a stream
    raises(BufferError, lambda: x.__dlpack__(stream=1), "stream=1", "cpu", "None")  # DLPack: None on the CPU
    raises(core.Error, lambda: x.__dlpack__(stream=2 ** 70), "stream", "64 bits")
    if core.build_info()["cuda_devices"] == 0:
        raises(BufferError, lambda: x.__dlpack__(dl_device=(2, 0)), "dl_device", "cpu")


def test_the_module_exports_its_entry_point_and_nothing_else():
    # Every other exported symbol (libstdc++'s, where the compiler links it statically; libdualcast's;
    # GNU unique ones, which bind process-wide) could be bound by a library loaded after it: on the GPU
    # machine `import torch` after dualcast._core crashed so (cmake/DualcastPython.cmake).
    nm = shutil.which("nm")
    if not sys.platform.startswith("linux") or nm is None:
        raise Skip("needs Linux and nm")
    path = core._core.__file__
    out = subprocess.run([nm, "-D", "--defined-only", path], capture_output=True, text=True, check=True).stdout
    names = sorted(line.split()[-1] for line in out.splitlines() if line.strip())
    assert names == ["PyInit__core"], (path, len(names), names[:10])


def test_bad_input_is_an_exception_that_names_the_operation_and_the_argument():
    raises(TypeError, lambda: core.from_dlpack([1, 2]), "from_dlpack", "obj", "builtins.list", "__dlpack__")
    import datetime
    capsule = datetime.datetime_CAPI  # a capsule of another kind
    raises(TypeError, lambda: core.from_dlpack(capsule), "from_dlpack", "datetime.datetime_CAPI")
    raises(core.Error, lambda: core.zeros(3, dtype="int64"), "zeros", "dtype", "int64")
    raises(ValueError, lambda: core.zeros(3, dtype="complex64"), "zeros", "dtype")  # Error is a ValueError
    raises(RuntimeError, lambda: core.zeros(3, device="tpu"), "zeros", "device", "tpu")  # and a RuntimeError
    raises(core.Error, lambda: core.zeros((2, -1)), "zeros", "shape")
    raises(core.Error, lambda: core.zeros((1,) * 9), "zeros", "shape", "9 dimensions")
    raises(TypeError, lambda: core.zeros("abc"), "zeros", "shape")
    raises(TypeError, lambda: core.zeros((2, True)), "zeros", "shape")
    raises(core.Error, lambda: core.zeros(2 ** 70), "zeros", "shape", "64 bits")
    raises(core.Error, lambda: core.tensor([1, 2]).to("int8"), "Tensor.to", "int8")
    raises(ValueError, lambda: core.tensor([[1, 2], [3]]), "ragged")
    raises(core.Error, lambda: core.tensor([300, 1], dtype="uint8"), "tensor", "300", "uint8", "0 to 255")
    raises(ValueError, lambda: core.tensor([-1], dtype="uint8"), "tensor", "-1", "uint8")
    raises(ValueError, lambda: core.tensor([0.5], dtype="uint8"), "tensor", "0.5", "uint8")
    raises(core.Error, lambda: core.tensor([1e5], dtype="float16"), "tensor", "100000", "float16", "65504")
    raises(core.Error, lambda: core.tensor([1e39], dtype="bfloat16"), "tensor", "bfloat16", "infinity")
    assert core.tensor([65519.0], dtype="float16").tolist() == [65504.0]  # rounds to the largest, as fill_
    assert core.tensor([255, 0], dtype="uint8").tolist() == [255, 0]
    assert core.tensor([65504.0, float("inf")], dtype="float16").tolist() == [65504.0, float("inf")]
    if core.build_info()["cuda_devices"] == 0:
        raises(core.Error, lambda: core.zeros(3, device="cuda:0"), "zeros", "device", "cuda")
        raises(core.Error, lambda: core.zeros(3).to("cuda"), "Tensor.to", "cuda")
    assert core.ones(2).sum().item() == 2.0  # the module keeps working


# ---- NumPy ---------------------------------------------------------------------------------------

NUMPY_DTYPES = ("float32", "float64", "float16", "uint8")  # NumPy has no bfloat16


def test_numpy_arrays_come_in_and_go_out_without_a_copy():
    needs_numpy()
    for dtype in NUMPY_DTYPES:
        for shape in SHAPES:
            a = (np.arange(int(np.prod(shape))) % 7).astype(dtype).reshape(shape)
            x = core.from_dlpack(a)
            assert (x.shape, x.dtype) == (shape, dtype)
            assert x.tolist() == a.tolist()
            b = np.from_dlpack(x)
            assert b.dtype == np.dtype(dtype) and b.shape == shape and np.array_equal(a, b)
            if a.size:
                assert x.data_ptr() == a.ctypes.data == b.ctypes.data
    a = np.zeros((3, 4), np.float32)
    x = core.from_dlpack(a)
    a[1, 2] = 5.0  # NumPy's writes seen by dualcast
    assert x.tolist()[1][2] == 5.0
    b = np.from_dlpack(x)
    x.fill_(-2.0)  # dualcast's seen by NumPy, through both arrays
    assert (a == -2.0).all() and (b == -2.0).all()


def test_numpy_lifetimes_both_ways():
    needs_numpy()
    a = np.full(1000, 2.0)
    x = core.from_dlpack(a)
    del a
    gc.collect()
    assert x.sum().item() == 2000.0
    y = core.full((1000,), 3.0, "float64")
    b = np.from_dlpack(y)
    del y
    gc.collect()
    assert b.sum() == 3000.0


def test_numpy_integers_are_shapes():
    needs_numpy()
    assert core.zeros(np.int64(3)).shape == (3,)
    assert core.zeros((np.int32(2), np.int64(5)), "float64").shape == (2, 5)


def test_sum_of_an_imported_numpy_array_equals_numpys():
    needs_numpy()
    rng = np.random.default_rng(5)
    for dtype, rtol in (("float32", SUM_RTOL_FLOAT32), ("float64", SUM_RTOL_FLOAT64)):
        for n in (1, 7, 1000, 4099):
            a = rng.standard_normal(n).astype(dtype)
            got, want = core.from_dlpack(a).sum().item(), float(a.astype(np.float64).sum())
            assert abs(got - want) <= rtol * float(np.abs(a).sum()), (dtype, n, got, want)


def test_numpy_arrays_dualcast_cannot_hold_are_refused_with_their_shape_and_dtype():
    needs_numpy()
    raises(core.Error, lambda: core.from_dlpack(np.zeros((4, 6), np.float32)[:, ::2]),
           "from_dlpack", "obj", "numpy.ndarray", "shape [4, 3]", "not contiguous")
    raises(core.Error, lambda: core.from_dlpack(np.zeros(3, np.int64)), "from_dlpack", "int64")
    raises(core.Error, lambda: core.from_dlpack(np.zeros(3, np.complex64)), "from_dlpack", "complex64")
    ro = np.zeros(3)
    ro.flags.writeable = False
    raises((core.Error, BufferError), lambda: core.from_dlpack(ro), "read")
    assert core.from_dlpack(np.ones(2)).sum().item() == 2.0


# ---- PyTorch -------------------------------------------------------------------------------------

def test_torch_tensors_come_in_and_go_out_without_a_copy_in_every_dtype():
    needs_torch()
    for dtype in DTYPES:
        for shape in SHAPES:
            t = (torch.arange(int(torch.tensor(shape).prod()) if shape else 1) % 7).to(getattr(torch, dtype))
            t = t.reshape(shape)
            x = core.from_dlpack(t)
            assert (x.shape, x.dtype, x.device) == (shape, dtype, "cpu")
            assert x.tolist() == t.tolist()
            u = torch.from_dlpack(x)
            assert u.dtype == t.dtype and tuple(u.shape) == shape and torch.equal(u, t)
            if t.numel():
                assert x.data_ptr() == t.data_ptr() == u.data_ptr()
    t = torch.zeros(2, 5)
    x = core.from_dlpack(t)
    t[1, 3] = 4.0
    assert x.tolist()[1][3] == 4.0
    u = torch.from_dlpack(x)
    u.fill_(6.0)
    assert x.sum().item() == 60.0 and (t == 6.0).all()


def test_torch_lifetimes_both_ways():
    needs_torch()
    t = torch.full((1000,), 2.0)
    x = core.from_dlpack(t)
    del t
    gc.collect()
    torch.full((1000,), 9.0)  # would reuse freed memory
    assert x.sum().item() == 2000.0
    y = core.full((1000,), 3.0)
    u = torch.from_dlpack(y)
    del y
    gc.collect()
    assert u.sum().item() == 3000.0


def test_torch_capsules_of_either_version_are_taken():
    needs_torch()
    t = torch.arange(3.0)
    assert core.from_dlpack(torch.utils.dlpack.to_dlpack(t)).tolist() == [0.0, 1.0, 2.0]
    try:
        versioned = t.__dlpack__(max_version=(1, 0))  # PyTorch >= 2.9
    except TypeError:
        return
    assert "dltensor_versioned" in repr(versioned)
    x = core.from_dlpack(versioned)
    assert x.data_ptr() == t.data_ptr() and "used_dltensor_versioned" in repr(versioned)


def test_torch_tensors_dualcast_cannot_hold_are_refused_with_their_shape_and_dtype():
    needs_torch()
    raises(core.Error, lambda: core.from_dlpack(torch.zeros(3, 4).t()), "from_dlpack", "torch.Tensor",
           "shape [4, 3]", "not contiguous")
    raises(core.Error, lambda: core.from_dlpack(torch.zeros(3, dtype=torch.int64)), "int64")
    raises(core.Error, lambda: core.from_dlpack(torch.zeros(3, dtype=torch.complex64)), "complex")
    raises((RuntimeError, BufferError), lambda: core.from_dlpack(torch.zeros(3, requires_grad=True)), "grad")
    assert core.from_dlpack(torch.ones(2)).sum().item() == 2.0


# ---- JAX -----------------------------------------------------------------------------------------

JAX_DTYPES = ("float32", "bfloat16", "float16", "uint8")  # float64 needs JAX's x64 mode


def test_jax_arrays_come_in_and_go_out_without_a_copy():
    needs_jax()
    cpu = jax_devices("cpu")[0]  # on a GPU machine JAX puts arrays on the GPU unless told
    for dtype in JAX_DTYPES:
        a = jax.device_put(jnp.arange(12, dtype=dtype).reshape(3, 4), cpu)
        x = core.from_dlpack(a)
        assert (x.shape, x.dtype, x.device) == ((3, 4), dtype, "cpu")
        assert x.data_ptr() == a.unsafe_buffer_pointer()
        assert x.tolist() == [[float(4 * i + j) for j in range(4)] for i in range(3)]
        b = jnp.from_dlpack(x)
        assert b.dtype == a.dtype and b.shape == (3, 4) and b.unsafe_buffer_pointer() == x.data_ptr()
        assert bool((b == a).all())
    x = core.full((5, 7), 1.5)
    b = jnp.from_dlpack(x)
    del x
    gc.collect()
    assert float(b.sum()) == 52.5  # the array keeps dualcast's memory alive


def test_a_jax_gpu_array_goes_through_dualcast_and_back():
    needs_jax()
    gpus = jax_devices("gpu")
    if not gpus or not core.build_info()["cuda"] or core.build_info()["cuda_devices"] == 0:
        raise Skip("no JAX GPU backend, or dualcast._core without CUDA")
    a = jax.device_put(jnp.arange(1 << 20, dtype="float32") % 7, gpus[0])
    x = core.from_dlpack(a)  # JAX orders its work before dualcast's stream
    assert x.device == "cuda:%d" % gpus[0].id and x.data_ptr() == a.unsafe_buffer_pointer()
    assert x.sum().item() == float(a.sum())
    b = jnp.from_dlpack(x)
    assert float(b.sum()) == float(a.sum())


# ---- CUDA ----------------------------------------------------------------------------------------

def test_a_torch_cuda_tensor_from_a_side_stream_goes_through_dualcast_and_back():
    needs_cuda()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        t = torch.randn(1 << 22, device="cuda", dtype=torch.float64)
        t.mul_(2.0).add_(1.0)  # queued on the side stream when dualcast imports it
        x = core.from_dlpack(t)  # PyTorch orders its side stream before dualcast's
        assert x.device == "cuda:%d" % t.device.index and x.data_ptr() == t.data_ptr()
        got = x.sum().item()
    want = t.sum().item()
    assert abs(got - want) <= SUM_RTOL_FLOAT64 * t.abs().sum().item(), (got, want)
    with torch.cuda.stream(side):
        u = torch.from_dlpack(x)  # the side stream is ordered after dualcast's
        assert u.data_ptr() == t.data_ptr()
        del t, x
        gc.collect()
        assert u.sum().item() == want


def test_a_consumer_on_another_stream_sees_what_dualcast_wrote():
    needs_cuda()
    for stream_kind in ("side", "default"):
        for _ in range(5):
            x = core.zeros((1 << 24,), "float32", "cuda")
            x.fill_(1.0)  # queued on dualcast's stream
            s = torch.cuda.Stream() if stream_kind == "side" else torch.cuda.default_stream()
            with torch.cuda.stream(s):
                u = torch.from_dlpack(x)  # __dlpack__(stream=s): s waits for dualcast's stream
                total = u.sum()
                got = total.item()  # read on s (PyTorch's side streams do not wait for the default one)
            assert got == float(1 << 24), (stream_kind, got)
    x = core.ones(3, device="cuda")
    for stream in (None, -1, 1, 2, torch.cuda.Stream().cuda_stream):
        assert core.from_dlpack(x.__dlpack__(stream=stream)).data_ptr() == x.data_ptr()
    raises(ValueError, lambda: x.__dlpack__(stream=0), "stream", "0")
    y = core.from_dlpack(x.__dlpack__(dl_device=(1, 0)))  # copied to the host
    assert y.device == "cpu" and y.tolist() == [1.0] * 3
    raises(BufferError, lambda: x.__dlpack__(dl_device=(1, 0), copy=False), "copy=False")


def test_a_block_a_side_stream_consumer_drops_is_not_reused_before_its_work_ends():
    # The consumer queues a long wait and then a read of dualcast's memory on its side stream, and drops
    # the tensor before that read has run. dualcast's next tensor of that size gets the same block back
    # from its cache, and its fill must come after the consumer's read, not before.
    needs_cuda()
    n = 1 << 24
    x = core.zeros((n,), "float32", "cuda")
    x.fill_(1.0)
    block = x.data_ptr()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        u = torch.from_dlpack(x)  # __dlpack__(stream=side)
        torch.cuda._sleep(200_000_000)  # ~0.1 s of spinning on the side stream
        total = u.sum()
    del u, x
    gc.collect()
    y = core.zeros((n,), "float32", "cuda")
    assert y.data_ptr() == block, "the test needs the block reused (dualcast's cache hands it back)"
    y.fill_(5.0)
    assert total.item() == float(n), total.item()
    assert y.sum().item() == 5.0 * n


def test_cuda_tensors_convert_and_sum_like_the_cpu():
    needs_cuda()
    x = numbered((3, 129), "float32")
    y = x.to("cuda")
    assert y.device == "cuda:0" and y.to("cpu").tolist() == x.tolist()
    assert y.sum().item() == x.sum().item()
    assert y.to("bfloat16").to("cpu").tolist() == x.to("bfloat16").tolist()
