"""dualcast.cuda's compile half, which needs NVRTC but no GPU: the generated CUDA source of every kind
of body compiles to a cubin for the H100/H200 (sm_90) with all three entry points (the fast walk:
vectors or lane by lane, a row's tail element by element, rows with broadcast columns; the general
walk with 32- and 64-bit indices: every path is in every cubin), in float32, float64, bfloat16 and
float16; the fast walk's PTX has the vector loads and stores (16 bytes; 8 for the 16-bit types, with
their conversions) and ptxas neither spills nor runs away with registers; cubins are cached on
disk, and a body error names the user's line as on the CPU. Launching the kernels needs a GPU:
test_torch.py and test_torch_16_bit_gpu.py, on the GPU machine."""

import ctypes
import os
import re
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


ENTRIES = [b"dualcast_jit_kernel32", b"dualcast_jit_kernel64", b"dualcast_jit_fast32"]


def is_cubin(blob):
    return blob[:4] == b"\x7fELF" and len(blob) > 1000 and all(e in blob for e in ENTRIES)


def kinds():
    """Every kind of kernel: bodies with one to three outputs, a branch, nothing differentiated, math
    functions; each as the dual kernel, its gradient kernel (where something is differentiated) and
    its values kernel."""
    specs = [jit.Spec(CELL, "z zb c f i g", "c f i g"),
             jit.Spec("return {a * b, sin(a) + exp(b)};", "a b", "a b", outputs=2),
             jit.Spec("return {a * b, a - c, T(2) * c};", "a b c", "a c", outputs=3),
             jit.Spec("if (x > y) return x * x * y; return 0;", "x y", "x"),
             jit.Spec("return x * y + 1;", "x y", ""),  # nothing differentiated: no gradient kernel
             jit.Spec("return pow(x, 3.0) + log1p(abs(x)) + erf(x) - sqrt(x * x + 1);", "x", "x")]
    return specs + [spec.gradient() for spec in specs if spec.k] + [spec.values() for spec in specs]


def test_every_kind_of_body_compiles_to_a_cubin():
    for spec in kinds():
        for dtype in ("float32", "float64"):
            assert is_cubin(cuda.compile_cubin(spec, dtype, ARCH)), (spec.body, dtype)


def test_every_kind_of_body_compiles_to_a_cubin_in_16_bits():
    # half.hpp's conversions under NVRTC (no __builtin_memcpy there) and the fast walk's 8-byte
    # vectors, in every kind of kernel.
    for spec in kinds():
        for dtype in ("bfloat16", "float16"):
            assert is_cubin(cuda.compile_cubin(spec, dtype, ARCH)), (spec.body, type(spec).__name__, dtype)


def nvrtc_ptx(spec, dtype):
    """(PTX, ptxas's -v report) of spec's CUDA source, compiled as compile_cubin does."""
    lib = cuda.nvrtc()
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), spec.source(dtype, "cuda").encode(), b"t.cu", 0, None,
                                  None) == 0
    try:
        opts = cuda.options(ARCH) + ["--ptxas-options=-v"]
        rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts]))
        n = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetProgramLog(prog, log)
        assert rc == 0, log.value.decode()
        lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
        ptx = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetPTX(prog, ptx)
        return ptx.value.decode(), log.value.decode()
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def entry(ptx, name):
    m = re.search(r"\.entry %s\(.*?\n\}\n" % name, ptx, re.S)
    assert m, name
    return m.group(0)


def ptxas_report(log, name):
    """(registers, spill bytes) of one entry point in ptxas's -v report."""
    m = re.search(r"Compiling entry function '%s'.*?(\d+) bytes spill stores, (\d+) bytes spill loads.*?"
                  r"Used (\d+) registers" % name, log, re.S)
    assert m, (name, log)
    return int(m.group(3)), int(m.group(1)) + int(m.group(2))


def test_the_fast_walk_moves_16_byte_vectors_and_fits_its_registers():
    # Workload a's two kernels (the recompute policy's values forward and its gradient): the fast
    # walk reads each input and writes each output with one 16-byte access per W elements, the
    # general walk keeps scalar accesses, and the unrolled lanes neither spill nor need more than
    # half the register file's share of a 256-thread block.
    spec = jit.Spec(CELL, "z zb c f i g", "c f i g")
    for kernel, nin, nout in ((spec.values(), 6, 1), (spec.gradient(), 7, 4)):
        for dtype, v in (("float32", "v4.f32"), ("float64", "v2.f64")):
            ptx, log = nvrtc_ptx(kernel, dtype)
            fast = entry(ptx, "dualcast_jit_fast32")
            assert fast.count("ld.global.nc.%s" % v) == nin, (kernel, dtype)
            assert fast.count("st.global.%s" % v) == nout, (kernel, dtype)
            for bits in (32, 64):
                general = entry(ptx, "dualcast_jit_kernel%d" % bits)
                assert "ld.global.nc.%s" % v not in general and "st.global.%s" % v not in general
            regs, spill = ptxas_report(log, "dualcast_jit_fast32")
            assert regs <= 128 and spill == 0, (type(kernel).__name__, dtype, regs, spill)


def test_the_16_bit_fast_walk_moves_8_byte_vectors_and_converts_in_registers():
    # Workload a's kernels in bfloat16 and float16: each input read and each output (and stored
    # partial) written with one 8-byte access of 4 lanes, each lane converted by one cvt (bfloat16 to
    # float is a shift: its 16 bits are float's upper half), nothing in local memory, no spill.
    spec = jit.Spec(CELL, "z zb c f i g", "c f i g")
    cvt = {"bfloat16": ("", "cvt.rn.bf16.f32"), "float16": ("cvt.f32.f16", "cvt.rn.f16.f32")}
    for kernel, nin, nout in ((spec.values(), 6, 1), (spec.gradient(), 7, 4), (spec, 6, 5)):
        for dtype, (load_cvt, store_cvt) in cvt.items():
            ptx, log = nvrtc_ptx(kernel, dtype)
            fast = entry(ptx, "dualcast_jit_fast32")
            what = (type(kernel).__name__, dtype)
            assert fast.count("ld.global.nc.v2.u32") == nin and fast.count("st.global.v2.u32") == nout, what
            assert "v4." not in fast and store_cvt in fast and load_cvt in fast, what
            for bits in (32, 64):
                general = entry(ptx, "dualcast_jit_kernel%d" % bits)
                assert "v2.u32" not in general and store_cvt in general and load_cvt in general, what
            assert ".local" not in ptx, what
            for name in ENTRIES:
                regs, spill = ptxas_report(log, name.decode())
                assert regs <= 128 and spill == 0, what + (name, regs, spill)


def test_a_cubin_comes_from_the_disk_cache_the_second_time():
    spec = jit.Spec("return x * 7;", "x", "x")
    before = dict(jit.stats)
    a = cuda.compile_cubin(spec, "float32", ARCH)
    b = cuda.compile_cubin(spec, "float32", ARCH)
    assert a == b
    assert jit.stats["compiled"] - before["compiled"] == 1
    assert jit.stats["loaded_from_disk"] - before["loaded_from_disk"] == 1


def test_a_cubin_compiled_ahead_is_the_one_compiled_in_turn():
    spec = jit.Spec(CELL.replace("return c;", "return c * T(0.5);"), "z zb c f i g", "c f i g")  # in no cache
    grad = spec.gradient()
    before = dict(jit.stats)
    cuda.start_compile(grad, "float32", ARCH)  # NVRTC on a worker thread, beside the values kernel
    values = cuda.compile_cubin(spec.values(), "float32", ARCH)
    ahead = cuda.compile_cubin(grad, "float32", ARCH)
    assert jit.stats["compiled"] - before["compiled"] == 2, jit.stats
    assert jit.stats["loaded_from_disk"] - before["loaded_from_disk"] == 0, jit.stats
    assert is_cubin(values) and is_cubin(ahead) and not jit._ahead
    _, _, path = cuda._cubin_path(grad, "float32", ARCH)
    os.remove(path)  # compiled again in turn: the same program (NVRTC's cubins differ run to run in
    again = cuda.compile_cubin(grad, "float32", ARCH)  # about 128 bytes of identifiers, so not bytewise)
    assert is_cubin(again) and len(again) == len(ahead)


def test_an_nvrtc_error_started_ahead_is_raised_where_the_cubin_is_asked_for():
    spec = jit.Spec("T s = x;\nreturn not_a_function(s);", "x", "x")
    cuda.start_compile(spec, "float32", ARCH)
    try:
        cuda.compile_cubin(spec, "float32", ARCH)
    except jit.CompileError as e:
        assert "NVRTC" in str(e) and "line 2 of the body: return not_a_function(s);" in str(e), str(e)
    else:
        raise AssertionError("an undefined function compiled under NVRTC")


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


class FakeDriver:
    """The few driver calls dualcast.cuda makes, answered in Python: a CudaKernel is made and
    launched on a machine without a GPU, and each launch's entry point, grid and Args are recorded."""

    def __init__(self):
        self.names, self.launches = {}, []

    def __getattr__(self, name):  # cuInit, cuCtxPushCurrent_v2, cuCtxPopCurrent_v2, cuModuleLoadData
        return lambda *args: 0

    def cuDeviceGet(self, ref, index):
        ref._obj.value = index
        return 0

    def cuDevicePrimaryCtxRetain(self, ref, dev):
        ref._obj.value = 0x1000
        return 0

    def cuDeviceGetAttribute(self, ref, attr, dev):
        ref._obj.value = {75: 9, 76: 0, 16: 132}[attr]  # compute capability 9.0, 132 multiprocessors
        return 0

    def cuModuleGetFunction(self, ref, module, name):
        ref._obj.value = 0x2000 + len(self.names)
        self.names[ref._obj.value] = name.decode()
        return 0

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, ref, fn, threads, smem):
        ref._obj.value = 4
        return 0

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        self.launches.append((self.names[fn.value], (gx, gy, gz), (bx, by, bz), params[0]))
        return 0


def test_a_launch_picks_its_entry_point_grid_and_vectors_per_call():
    # dualcast.cuda's host half against a fake driver: the Args bytes each launch passes, read back.
    from dualcast import cuda_kernel
    spec = jit.Spec("if (x > y) return x * y; return y - x;", "x y", "x y")
    fake, saved = FakeDriver(), cuda._cuda
    cuda._cuda = fake
    try:
        for kernel_spec, dtype in ((spec.values(), "float32"), (spec.gradient(), "float64"),
                                   (spec.values(), "bfloat16"), (spec.gradient(), "float16")):
            k = cuda.CudaKernel(kernel_spec, dtype, 0)
            nin, nout = kernel_spec.n_in, kernel_spec.n_out
            w = cuda_kernel.lanes(k._itemsize)
            base = 0x7F0000000000

            def launch(shape, strides, offset=0):
                fake.launches.clear()
                ins = [base + 4096 * i + (offset if i == 0 else 0) for i in range(nin)]
                outs = [base + 2 ** 30 + 4096 * m for m in range(nout)]
                k.run(0, shape, ins, [strides[i % len(strides)] for i in range(nin)], outs, [])
                if not fake.launches:
                    return None
                (name, grid, block, addr), = fake.launches
                a = k._Args.from_buffer_copy(ctypes.string_at(addr, ctypes.sizeof(k._Args)))
                assert block == (cuda.THREADS, 1, 1) and list(a.in_) == ins and list(a.out) == outs
                return name, grid, a

            name, grid, a = launch([4, 8191], [[8191, 1], [0, 0]])  # coalesced: one row, aligned
            assert name == "dualcast_jit_fast32" and a.ndim == 1 and a.shape[0] == 4 * 8191, name
            assert a.vec == 1 and a.unit == sum(1 << i for i in range(nin) if i % 2 == 0) and a.rowwise == 0
            assert grid == (min(-(-4 * 8191 // (cuda.THREADS * w)), 132 * 4), 1, 1), grid
            # The same call shape from a view starting at element 1: the plan is reused, vectors are not.
            name, _, a = launch([4, 8191], [[8191, 1], [0, 0]], offset=k._itemsize)
            assert name == "dualcast_jit_fast32" and a.vec == 0
            # From 8 bytes in: a 16-bit type's vector boundary (element 4), not a 16-byte one.
            name, _, a = launch([4, 8191], [[8191, 1], [0, 0]], offset=8)
            assert name == "dualcast_jit_fast32" and a.vec == (k._itemsize == 2), (dtype, a.vec)
            # Rows with a broadcast column; the rows' strides and the grid over blockIdx.y.
            name, grid, a = launch([8192, 8192], [[8192, 1], [1, 0]])
            assert name == "dualcast_jit_fast32" and a.ndim == 2 and a.vec == 1, name
            assert list(a.in_strides[:2]) == [8192, 1] and list(a.in_strides[cuda.jit.MAX_DIMS:][:2]) == [1, 0]
            assert grid[0] * grid[1] <= 132 * 4 and grid[1] > 1, grid
            # 2^31 elements: the general walk's 64-bit entry (nothing is read: the driver is a fake).
            name, _, a = launch([2 ** 16, 2 ** 15], [[2 ** 15, 1], [1, 0]])
            assert name == "dualcast_jit_kernel64" and a.rowwise == 1 and a.vec == 0, name
            # A strided last dimension: the general walk; a short row: flat.
            name, _, a = launch([300, 4096], [[1, 300], [4096, 1]])
            assert name == "dualcast_jit_kernel32" and a.rowwise == 1 and a.vec == 0, name
            assert launch([0, 5], [[5, 1], [0, 1]]) is None  # empty: no launch
            cuda._kernels[("test", id(k))] = k  # (so that set_fast_walk drops its plans)
            try:
                cuda.set_fast_walk(False)
                name, _, a = launch([4, 8191], [[8191, 1], [0, 0]])
                assert name == "dualcast_jit_kernel32" and a.vec == 0 and a.rowwise == 0, name
            finally:
                cuda.set_fast_walk(True)
                del cuda._kernels[("test", id(k))]
            assert launch([4, 8191], [[8191, 1], [0, 0]])[0] == "dualcast_jit_fast32"
    finally:
        cuda._cuda = saved
