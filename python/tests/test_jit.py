"""dualcast.jit without PyTorch: kernels compiled from source text, run on plain Python buffers
(array.array), checked against Python references and central differences in float64."""

import array
import math
import os
import random
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from dualcast import jit  # noqa: E402

# Named tolerances (the C++ tests' rule: one place, named).
VALUE_RTOL_F64 = 1e-12     # the kernel's float64 values against Python's math (same formulas)
FD_STEP = 1e-6             # central-difference step in float64
FD_RTOL = 1e-6             # partials against central differences (relative to max(1, |partial|))
F32_RTOL = 2e-6            # float32 values against float64, relative to max(1, |value|)

CELL = """
    if (z == 1) return sigmoid(i) * tanh(g);
    if (zb == 0) return c;
    return sigmoid(f) * c + sigmoid(i) * tanh(g);
"""


def sig(x):
    return 1.0 / (1.0 + math.exp(-x))


def cell_ref(z, zb, c, f, i, g):
    if z == 1:
        return sig(i) * math.tanh(g)
    if zb == 0:
        return c
    return sig(f) * c + sig(i) * math.tanh(g)


# ---- broadcasting plain buffers (what dualcast.torch gets from torch's expand) -------------------

def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def broadcast_strides(shape, out):
    """Element strides of a contiguous `shape` read over `out` (0 where broadcast)."""
    strides, acc = [0] * len(out), 1
    for d in range(1, len(shape) + 1):
        size = shape[-d]
        assert size in (1, out[-d]), (shape, out)
        strides[-d] = acc if size != 1 else 0
        acc *= size
    return strides


def index_of(e, out, strides):
    off = 0
    for d in range(len(out) - 1, -1, -1):
        off += (e % out[d]) * strides[d]
        e //= out[d]
    return off


class Buf:
    def __init__(self, values, typecode="d"):
        self.a = array.array(typecode, values)

    @property
    def ptr(self):
        return self.a.buffer_info()[0]


def run(kernel, out_shape, inputs, typecode="d"):
    """inputs: (shape, values) per input; returns (outputs, partials) as lists of lists."""
    s = kernel.spec
    n = numel(out_shape)
    bufs = [Buf(v, typecode) for _, v in inputs]
    outs = [Buf([math.nan] * n, typecode) for _ in range(s.outputs)]  # poisoned
    parts = [Buf([math.nan] * n, typecode) for _ in range(s.outputs * max(s.k, 1))]
    kernel.run(list(out_shape), [b.ptr for b in bufs], [broadcast_strides(sh, out_shape) for sh, _ in inputs],
               [o.ptr for o in outs], [p.ptr for p in parts])
    return [list(o.a) for o in outs], [list(p.a) for p in parts]


def run_gradient(kernel, out_shape, inputs, grads, wanted=None, typecode="d"):
    """A gradient kernel (Spec.gradient) on inputs and output gradients, each (shape, values);
    returns the K input gradients at out_shape (None where not wanted; the rest poisoned first)."""
    s = kernel.spec
    n = numel(out_shape)
    bufs = [Buf(v, typecode) for _, v in list(inputs) + list(grads)]
    wanted = range(s.k) if wanted is None else wanted
    outs = [Buf([math.nan] * n, typecode) if j in wanted else None for j in range(s.k)]
    kernel.run(list(out_shape), [b.ptr for b in bufs],
               [broadcast_strides(sh, out_shape) for sh, _ in list(inputs) + list(grads)],
               [o.ptr if o else 0 for o in outs], [])
    return [list(o.a) if o else None for o in outs]


def cell_inputs(rng, out_shape, shapes):
    vals = []
    for name, sh in zip("z zb c f i g".split(), shapes):
        k = numel(sh)
        if name in ("z", "zb"):
            vals.append((sh, [float(rng.random() < 0.5) for _ in range(k)]))
        else:
            vals.append((sh, [rng.uniform(-2, 2) for _ in range(k)]))
    return vals


# Per input (z zb c f i g): its shape over an output of OUT. 37 columns: a float64 row is two
# tiles of 16 lanes and 5 single elements, a float32 row one tile of 32 and 5 (on AVX-512; AVX2
# tiles are half as wide), so both paths of the CPU kernel are checked.
OUT = (3, 37)
PATTERNS = {
    "all full": [OUT] * 6,
    "flags per row, c full": [(3, 1), (3, 1), OUT, OUT, OUT, OUT],
    "gates per column": [OUT, OUT, OUT, (1, 37), (37,), (1, 37)],
    "scalars": [(), (), OUT, (), (1, 1), ()],
    "one of each": [(3, 1), (), (1, 37), OUT, (37,), (3, 1)],
}


def close(a, b, rtol):
    return abs(a - b) <= rtol * max(1.0, abs(a), abs(b))


# ---- tests --------------------------------------------------------------------------------------

def test_values_match_a_python_reference_on_every_broadcast_pattern():
    k = jit.compile_kernel(jit.Spec(CELL, "z zb c f i g", "c f i g"), "float64")
    rng = random.Random(1)
    out_shape = OUT
    for pattern, shapes in PATTERNS.items():
        ins = cell_inputs(rng, out_shape, shapes)
        outs, _ = run(k, out_shape, ins)
        for e in range(numel(out_shape)):
            args = [v[index_of(e, out_shape, broadcast_strides(sh, out_shape))] for sh, v in ins]
            assert close(outs[0][e], cell_ref(*args), VALUE_RTOL_F64), (pattern, e, outs[0][e], cell_ref(*args))


def test_partials_equal_central_differences_in_float64():
    k = jit.compile_kernel(jit.Spec(CELL, "z zb c f i g", "c f i g"), "float64")
    rng = random.Random(2)
    out_shape = OUT
    for pattern, shapes in PATTERNS.items():
        ins = cell_inputs(rng, out_shape, shapes)
        _, parts = run(k, out_shape, ins)
        # Each output element reads one element of each input, so moving a whole input by h moves
        # every output by its own partial times h, broadcast or not.
        for j, idx in enumerate((2, 3, 4, 5)):
            plus = [(sh, [x + FD_STEP for x in v]) if n == idx else (sh, v) for n, (sh, v) in enumerate(ins)]
            minus = [(sh, [x - FD_STEP for x in v]) if n == idx else (sh, v) for n, (sh, v) in enumerate(ins)]
            hi, lo = run(k, out_shape, plus)[0][0], run(k, out_shape, minus)[0][0]
            for e in range(numel(out_shape)):
                fd = (hi[e] - lo[e]) / (2 * FD_STEP)
                assert close(parts[j][e], fd, FD_RTOL), (pattern, "partial", j, e, parts[j][e], fd)


def test_a_data_dependent_branch_on_a_differentiated_input():
    body = "if (x > y) return x * x * y; return 0;"  # `return 0`: a constant, partials 0
    k = jit.compile_kernel(jit.Spec(body, "x y", "x y"), "float64")
    rng = random.Random(5)  # 101 elements: tiles (branches taken lane by lane) and single elements
    xs = [1.5, -0.5, 2.0, 0.25] + [rng.uniform(-2, 2) for _ in range(97)]
    ys = [1.0, 0.5, -3.0, 0.75] + [rng.uniform(-2, 2) for _ in range(97)]
    outs, parts = run(k, (101,), [((101,), xs), ((101,), ys)])
    for e, (x, y) in enumerate(zip(xs, ys)):
        want = (x * x * y, 2 * x * y, x * x) if x > y else (0.0, 0.0, 0.0)
        assert (outs[0][e], parts[0][e], parts[1][e]) == want, (e, outs[0][e], parts[0][e], parts[1][e], want)


def test_several_outputs_each_with_its_partials():
    body = "return {a * b, sin(a) + exp(b)};"
    k = jit.compile_kernel(jit.Spec(body, "a b", "a b", outputs=2), "float64")
    a, b = [0.3, -1.2, 2.5], [0.7, 0.1, -0.4]
    outs, parts = run(k, (3,), [((3,), a), ((3,), b)])
    for e in range(3):
        assert close(outs[0][e], a[e] * b[e], VALUE_RTOL_F64)
        assert close(outs[1][e], math.sin(a[e]) + math.exp(b[e]), VALUE_RTOL_F64)
        # partials: output m, input j at m * K + j
        assert close(parts[0][e], b[e], VALUE_RTOL_F64) and close(parts[1][e], a[e], VALUE_RTOL_F64)
        assert close(parts[2][e], math.cos(a[e]), VALUE_RTOL_F64)
        assert close(parts[3][e], math.exp(b[e]), VALUE_RTOL_F64)


def test_float32_agrees_with_float64_on_odd_sizes_and_the_threaded_path():
    spec = jit.Spec(CELL, "z zb c f i g", "c f i g")
    k64, k32 = jit.compile_kernel(spec, "float64"), jit.compile_kernel(spec, "float32")
    rng = random.Random(3)
    # 37 x 1001 elements: above the kernel's threading threshold; odd row length; a 3-D broadcast;
    # long rows.
    for out_shape, shapes in [((37, 1001), [(37, 1), (1,), (37, 1001), (1001,), (37, 1001), (37, 1)]),
                              ((3, 1, 7), [(3, 1, 7), (1, 7), (3, 1, 1), (7,), (), (3, 1, 7)]),
                              # rows of several segments (2048 floats, 1024 doubles) and a partial tile
                              ((2, 4500), [(2, 1), (), (2, 4500), (4500,), (2, 4500), (1, 1)]),
                              ((9001,), [(9001,)] * 6),  # one coalesced row over the threads
                              ((1,), [(1,)] * 6)]:
        ins = cell_inputs(rng, out_shape, shapes)
        ins32 = [(sh, list(array.array("f", v))) for sh, v in ins]  # the float32 inputs, exactly
        o64, p64 = run(k64, out_shape, ins32)
        o32, p32 = run(k32, out_shape, ins32, typecode="f")
        for e in range(numel(out_shape)):
            assert close(o32[0][e], o64[0][e], F32_RTOL), (out_shape, e, o32[0][e], o64[0][e])
            for j in range(4):
                assert close(p32[j][e], p64[j][e], F32_RTOL), (out_shape, "partial", j, e)


def bits16(x, dtype):
    """x (a float) rounded to nearest even in bfloat16 or float16, as its 16 bits."""
    if dtype == "float16":
        return struct.unpack("<H", struct.pack("<e", x))[0]
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF  # finite values only


def value16(b, dtype):
    return struct.unpack("<e", struct.pack("<H", b))[0] if dtype == "float16" else \
        struct.unpack("<f", struct.pack("<I", b << 16))[0]


NAN16 = {"bfloat16": 0x7FC0, "float16": 0x7E00}  # poison for the outputs


def test_16_bit_kernels_are_the_float32_kernels_rounded_once():
    # The same float computation as the float32 kernel on the same (16-bit) values, each result
    # rounded once: bit for bit the float32 kernel's results rounded, outputs, partials and
    # gradients, and the values kernel's outputs, on tiles and single elements and every broadcast
    # pattern (OUT's rows of 37 hold a whole tile of float lanes and single elements).
    spec = jit.Spec(CELL, "z zb c f i g", "c f i g")
    rng = random.Random(16)
    for dtype in ("bfloat16", "float16"):
        k16, k32 = jit.compile_kernel(spec, dtype), jit.compile_kernel(spec, "float32")
        g16, g32 = jit.compile_kernel(spec.gradient(), dtype), jit.compile_kernel(spec.gradient(), "float32")
        v16, v32 = jit.compile_kernel(spec.values(), dtype), jit.compile_kernel(spec.values(), "float32")
        for name, shapes in PATTERNS.items():
            raw = cell_inputs(rng, OUT, shapes)
            ins16 = [(sh, [bits16(v, dtype) for v in vals]) for sh, vals in raw]
            ins32 = [(sh, [value16(b, dtype) for b in vals]) for sh, vals in ins16]
            n = numel(OUT)
            bufs = [Buf(v, "H") for _, v in ins16]
            outs = [Buf([NAN16[dtype]] * n, "H")]
            parts = [Buf([NAN16[dtype]] * n, "H") for _ in range(4)]
            strides = [broadcast_strides(sh, OUT) for sh, _ in ins16]
            k16.run(list(OUT), [b.ptr for b in bufs], strides, [o.ptr for o in outs], [p.ptr for p in parts])
            o32, p32 = run(k32, OUT, ins32, typecode="f")
            assert list(outs[0].a) == [bits16(v, dtype) for v in o32[0]], (dtype, name)
            vouts = [Buf([NAN16[dtype]] * n, "H")]
            v16.run(list(OUT), [b.ptr for b in bufs], strides, [o.ptr for o in vouts], [])
            bufs32, vo32 = [Buf(v, "f") for _, v in ins32], Buf([math.nan] * n, "f")
            v32.run(list(OUT), [b.ptr for b in bufs32], strides, [vo32.ptr], [])
            assert list(vouts[0].a) == [bits16(v, dtype) for v in vo32.a], (dtype, name, "values kernel")
            for j in range(4):
                assert list(parts[j].a) == [bits16(v, dtype) for v in p32[j]], (dtype, name, "partial", j)
            grad16 = [(OUT, [bits16(rng.uniform(-1, 1), dtype) for _ in range(n)])]
            grad32 = [(OUT, [value16(b, dtype) for b in grad16[0][1]])]
            gb = [Buf(v, "H") for _, v in ins16 + grad16]
            gouts = [Buf([NAN16[dtype]] * n, "H") for _ in range(4)]
            g16.run(list(OUT), [b.ptr for b in gb], strides + [broadcast_strides(OUT, OUT)], [o.ptr for o in gouts], [])
            want = run_gradient(g32, OUT, ins32, grad32, typecode="f")
            for j in range(4):
                assert list(gouts[j].a) == [bits16(v, dtype) for v in want[j]], (dtype, name, "gradient", j)


def test_16_bit_kernels_have_a_cuda_source_and_other_dtypes_are_refused():
    # The CUDA text of a 16-bit kernel stores in half.hpp's types and computes in float (compiled by
    # NVRTC in test_cuda_compile.py); a dtype outside jit.DTYPES is a TypeError naming the ones there are.
    spec = jit.Spec("return x * 2;", "x", "x")
    for dtype, storage in (("bfloat16", "dualcast::bfloat16"), ("float16", "dualcast::float16")):
        src = spec.source(dtype, "cuda")
        assert '#include "dualcast/half.hpp"' in src and "using S = %s;" % storage in src, dtype
        assert "using T = float;" in src, dtype
    assert '#include "dualcast/half.hpp"' not in spec.source("float32", "cuda")
    try:
        spec.source("int32")
    except TypeError as e:
        assert "int32" in str(e) and "bfloat16" in str(e), str(e)
    else:
        raise AssertionError("an int32 kernel was generated")


def test_the_gradient_kernel_contracts_the_partials_with_the_output_gradients():
    # Spec.gradient() recomputes the partials and writes sum_m g_m * d out_m / d x_k: equal to the
    # value kernel's partials times the gradients, on every broadcast pattern, with gradients that
    # are full, broadcast rows or one number (stride 0, as torch's sum().backward() passes them).
    spec = jit.Spec(CELL, "z zb c f i g", "c f i g")
    value, grad = jit.compile_kernel(spec, "float64"), jit.compile_kernel(spec.gradient(), "float64")
    rng = random.Random(11)
    for pattern, shapes in PATTERNS.items():
        ins = cell_inputs(rng, OUT, shapes)
        _, parts = run(value, OUT, ins)
        for gshape in (OUT, (1, 37), ()):
            g = [rng.uniform(-1, 1) for _ in range(numel(gshape))]
            got = run_gradient(grad, OUT, ins, [(gshape, g)])
            for e in range(numel(OUT)):
                ge = g[index_of(e, OUT, broadcast_strides(gshape, OUT))]
                for j in range(4):
                    assert close(got[j][e], ge * parts[j][e], VALUE_RTOL_F64), (pattern, gshape, j, e)


def test_the_gradient_kernel_sums_over_several_outputs_and_skips_unwanted_inputs():
    body = "return {a * b, sin(a) + exp(b)};"
    spec = jit.Spec(body, "a b", "a b", outputs=2)
    for dtype, typecode, rtol in (("float64", "d", VALUE_RTOL_F64), ("float32", "f", F32_RTOL)):
        k = jit.compile_kernel(spec.gradient(), dtype)
        rng = random.Random(12)
        n = 1001  # tiles, a partial tile and the threaded path's rows
        a = [rng.uniform(-2, 2) for _ in range(n)]
        b = [rng.uniform(-2, 2) for _ in range(n)]
        g0 = [rng.uniform(-1, 1) for _ in range(n)]
        g1 = [rng.uniform(-1, 1) for _ in range(n)]
        ins = [((n,), list(array.array(typecode, v))) for v in (a, b)]
        gs = [((n,), list(array.array(typecode, v))) for v in (g0, g1)]
        (ga, gb) = run_gradient(k, (n,), ins, gs, typecode=typecode)
        only_b = run_gradient(k, (n,), ins, gs, wanted=[1], typecode=typecode)
        assert only_b[0] is None and only_b[1] == gb
        for e in range(n):
            x, y, u, v = ins[0][1][e], ins[1][1][e], gs[0][1][e], gs[1][1][e]
            assert close(ga[e], u * y + v * math.cos(x), rtol), (dtype, e, ga[e])
            assert close(gb[e], u * x + v * math.exp(y), rtol), (dtype, e, gb[e])


def test_the_values_kernel_equals_the_dual_kernels_outputs():
    # Spec.values() evaluates the body on plain numbers (D names T): the same outputs as the dual
    # kernel, on every broadcast pattern, in float64 and on float32's tiles and odd sizes.
    spec = jit.Spec(CELL, "z zb c f i g", "c f i g")
    rng = random.Random(13)
    for dtype, typecode, rtol in (("float64", "d", VALUE_RTOL_F64), ("float32", "f", F32_RTOL)):
        dual, values = jit.compile_kernel(spec, dtype), jit.compile_kernel(spec.values(), dtype)
        for out_shape, shapes in list(zip([OUT] * len(PATTERNS), PATTERNS.values())) + [
                ((2, 4500), [(2, 1), (), (2, 4500), (4500,), (2, 4500), (1, 1)])]:
            ins = [(sh, list(array.array(typecode, v))) for sh, v in cell_inputs(rng, out_shape, shapes)]
            want, _ = run(dual, out_shape, ins, typecode)
            n = numel(out_shape)
            got = Buf([math.nan] * n, typecode)
            bufs = [Buf(v, typecode) for _, v in ins]
            values.run(list(out_shape), [b.ptr for b in bufs], [broadcast_strides(sh, out_shape) for sh, _ in ins],
                       [got.ptr], [])
            for e in range(n):
                assert close(got.a[e], want[0][e], rtol), (dtype, out_shape, e, got.a[e], want[0][e])


def test_the_values_kernel_takes_a_number_of_another_type_where_the_dual_kernel_does():
    # pow(x, 3.0) with a float x: a dual base and a double exponent in the dual kernel, a float and a
    # double in the values kernel, computed in T as the dual kernel computes its value.
    spec = jit.Spec("return pow(x, 3.0) + hypot(x, 2.0) + fma(x, 2.0, y) + max(0, x);", "x y", "x")
    for dtype, typecode in (("float32", "f"), ("float64", "d")):
        dual, values = jit.compile_kernel(spec, dtype), jit.compile_kernel(spec.values(), dtype)
        xs, ys = [-1.5, 0.25, 2.0], [0.5, -0.75, 3.0]
        ins = [((3,), list(array.array(typecode, xs))), ((3,), list(array.array(typecode, ys)))]
        want, _ = run(dual, (3,), ins, typecode)
        got = Buf([math.nan] * 3, typecode)
        bufs = [Buf(v, typecode) for _, v in ins]
        values.run([3], [b.ptr for b in bufs], [[1], [1]], [got.ptr], [])
        assert list(got.a) == want[0], (dtype, list(got.a), want[0])


def test_the_values_kernel_computes_the_dual_kernels_values():
    # Numbers of another type next to a differentiated input are converted to T first, as a dual
    # does: x * 0.1 is x * 0.1f in float32, so a branch on it takes the same side in the forward
    # (values) and in the backward (duals): arithmetic bit for bit. Every function of math.hpp, with
    # literals mixed in, to the last ulp: GCC may vectorise a values kernel's row tail (libmvec)
    # where the dual kernel's runs libm's scalar functions, as the dual kernel's own tiles and tails
    # differ.
    exact = ["if (x * 0.1 > y) return x; return -x;",
             "D s = x; s *= 1.1; s += 0.1; s -= y; s /= 3.0; return +s - (-y) + 2.5 * x - 1 / (x + 3.0);"]
    bodies = exact + [
        "return exp(x * 0.1) + tanh(x * 0.7) * 1.3 - y / 3.0;",
        "return sigmoid(x) + abs(x) + cbrt(x) + cos(x) + erf(x) + exp(x * 0.5) + expm1(x * 0.25) + gelu(x) "
        "+ log(abs(x) + 0.5) + log1p(abs(x)) + relu(x) + sin(x) + softplus(x) + sqrt(abs(x) + 1e-3) + tan(x * 0.3);",
        "return pow(abs(x) + 0.1, 2.5) + hypot(x, 0.3) + min(x, 0.2) + max(0, x) + clamp(x, -0.5, 0.7) "
        "+ fma(x, 0.3, y) + select(x > y, x, 0.25) + value(x) * 0.5;",
    ]
    rng = random.Random(14)
    n = 1000
    xs = list(array.array("f", [rng.uniform(-2, 2) for _ in range(n)]))
    # y = the float product x * 0.1f for some elements: the tie the double product would break
    ys = list(array.array("f", [x * 0.1 if e % 3 == 0 else rng.uniform(-2, 2) for e, x in enumerate(xs)]))
    ys = [float(array.array("f", [v])[0]) if e % 3 else float(array.array("f", [array.array("f", [xs[e]])[0] *
          array.array("f", [0.1])[0]])[0]) for e, v in enumerate(ys)]
    for body in bodies:
        spec = jit.Spec(body, "x y", "x y")
        for dtype, typecode in (("float32", "f"), ("float64", "d")):
            dual, values = jit.compile_kernel(spec, dtype), jit.compile_kernel(spec.values(), dtype)
            ins = [((n,), list(array.array(typecode, xs))), ((n,), list(array.array(typecode, ys)))]
            want, _ = run(dual, (n,), ins, typecode)
            got = Buf([math.nan] * n, typecode)
            bufs = [Buf(v, typecode) for _, v in ins]
            values.run([n], [b.ptr for b in bufs], [[1], [1]], [got.ptr], [])
            if body in exact:
                diff = [e for e in range(n) if got.a[e] != want[0][e]]
            else:  # a few ulps of the terms' size (sums of transcendental terms cancel)
                rtol = 4.8e-7 if dtype == "float32" else 1e-15
                diff = [e for e in range(n) if not close(got.a[e], want[0][e], rtol)]
            assert not diff, (body, dtype, diff[:3], [(got.a[e], want[0][e]) for e in diff[:3]])


def test_partial_is_not_a_values_kernels_function():
    try:
        jit.compile_kernel(jit.Spec("return x * (1 + partial(x, 0));", "x", "x").values(), "float64")
    except jit.CompileError as e:
        assert "partial" in str(e), str(e)
    else:
        raise AssertionError("partial() compiled in a values kernel, where it would mean 0")


def test_a_body_that_needs_dual_numbers_has_no_values_kernel():
    body = "if (x.val > 0) return x * x; return x;"  # .val: a dual's member
    jit.compile_kernel(jit.Spec(body, "x", "x"), "float64")  # the dual kernel compiles
    try:
        jit.compile_kernel(jit.Spec(body, "x", "x").values(), "float64")
    except jit.CompileError as e:
        assert "line 1 of the body" in str(e), str(e)
    else:
        raise AssertionError("a body using .val compiled on plain numbers")


def test_a_function_without_differentiated_inputs_has_no_gradient_kernel():
    try:
        jit.Spec("return x * 2;", "x", "").gradient()
    except ValueError as e:
        assert "no input is differentiated" in str(e), e
    else:
        raise AssertionError("a gradient kernel of nothing")


def test_an_empty_shape_writes_nothing():
    k = jit.compile_kernel(jit.Spec("return x * 2;", "x", "x"), "float64")
    outs, parts = run(k, (0, 3), [((0, 3), [])])
    assert outs == [[]] and parts == [[]]


def test_unwanted_partials_are_not_written():
    k = jit.compile_kernel(jit.Spec("return x * y;", "x y", "x y"), "float64")
    x, y, out, p1 = Buf([2.0, 3.0]), Buf([5.0, 7.0]), Buf([math.nan] * 2), Buf([math.nan] * 2)
    k.run([2], [x.ptr, y.ptr], [[1], [1]], [out.ptr], [0, p1.ptr])
    assert list(out.a) == [10.0, 21.0] and list(p1.a) == [2.0, 3.0]


def test_a_compile_error_names_the_users_line():
    body = "T s = x * 2;\nif (s > 1)\n  return undefined_function(s);\nreturn s;"
    try:
        jit.compile_kernel(jit.Spec(body, "x", "x"), "float64")
    except jit.CompileError as e:
        msg = str(e)
        assert "line 3 of the body: return undefined_function(s);" in msg, msg
        assert "undefined_function" in msg and jit.BODY_FILE + ":3" in msg, msg
    else:
        raise AssertionError("a body calling an undefined function compiled")
    # ... and the next kernel compiles as if nothing had happened.
    jit.compile_kernel(jit.Spec("return x + 1;", "x", "x"), "float64")


def test_a_body_without_a_return_on_some_path_is_a_compile_error():
    try:
        jit.compile_kernel(jit.Spec("if (x > 0) return x;", "x", "x"), "float64")
    except jit.CompileError as e:
        assert "return" in str(e), str(e)
        assert "of the body: }" not in str(e), str(e)  # never a line of the generated code as the user's
    else:
        raise AssertionError("a body that can fall off its end compiled")


def test_bad_names_are_refused_with_the_name():
    cases = [
        (("return x;", "x", "y"), "differentiable input 'y' is not one of the inputs"),
        (("return x;", "x x", "x"), "names an input twice"),
        (("return x;", "x 2y", "x"), "'2y' is not a usable C++ name"),
        (("return x;", "x T", "x"), "'T' is not a usable C++ name"),
        (("return x;", "x int", "x"), "'int' is not a usable C++ name"),
        (("return x;", "errno x", "x"), "'errno' is not a usable C++ name"),
        (("return x;", "", ""), "inputs names no input"),
        (("  ", "x", "x"), "the body must be non-empty"),
        (("return x;", "x", "x", 0), "outputs must be an integer in [1, 16]"),
        (("return x;", " ".join("x%d" % i for i in range(17)), " ".join("x%d" % i for i in range(17))),
         "17 differentiated inputs; at most 16"),
    ]
    for args, want in cases:
        try:
            jit.Spec(*args)
        except ValueError as e:
            assert want in str(e), (args, str(e))
        else:
            raise AssertionError("accepted: %r" % (args,))
    try:
        jit.Spec("return x;", "x", "x").source("int32")
    except TypeError as e:
        assert "int32 is not supported" in str(e)
    else:
        raise AssertionError("accepted dtype int32")


def test_the_differentiated_order_is_the_inputs_order():
    # differentiable listed backwards: partial 0 is still d/da (a comes first among the inputs)
    k = jit.compile_kernel(jit.Spec("return a * a * b;", "a b", "b a"), "float64")
    outs, parts = run(k, (1,), [((1,), [3.0]), ((1,), [5.0])])
    assert parts[0] == [30.0] and parts[1] == [9.0], parts


def test_a_second_process_compiles_nothing():
    spec_args = (CELL, "z zb c f i g", "c f i g")
    jit.compile_kernel(jit.Spec(*spec_args), "float32")  # in the disk cache now
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from dualcast import jit\n"
            "jit.compile_kernel(jit.Spec(%r, %r, %r), 'float32')\n"
            "print(jit.stats['compiled'], jit.stats['loaded_from_disk'])\n") % (
        os.path.join(HERE, ".."), *spec_args)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "1"], r.stdout


def test_a_compile_started_ahead_is_waited_for_not_repeated():
    spec = jit.Spec("return x * 11 + 1;", "x", "x")
    before = dict(jit.stats)
    jit.start_compile(spec, "float64")
    jit.start_compile(spec, "float64")  # under way already: nothing more
    k = jit.compile_kernel(spec, "float64")
    assert jit.stats["compiled"] - before["compiled"] == 1, jit.stats
    assert jit.stats["loaded_from_disk"] - before["loaded_from_disk"] == 0, jit.stats
    assert not jit._ahead, "a finished compile stayed in the queue"
    outs, parts = run(k, (2,), [((2,), [1.0, 2.0])])
    assert outs[0] == [12.0, 23.0] and parts[0] == [11.0, 11.0], (outs, parts)
    jit.start_compile(spec, "float64")  # in memory: nothing to do
    assert not jit._ahead and jit.compile_kernel(spec, "float64") is k


def test_a_compile_error_started_ahead_is_raised_where_the_kernel_is_asked_for():
    spec = jit.Spec("T s = x;\nreturn not_a_function(s);", "x", "x")
    jit.start_compile(spec, "float64")
    try:
        jit.compile_kernel(spec, "float64")
    except jit.CompileError as e:
        assert "line 2 of the body: return not_a_function(s);" in str(e), str(e)
    else:
        raise AssertionError("a body calling an undefined function compiled")
    jit.compile_kernel(jit.Spec("return x + 5;", "x", "x"), "float64")  # and the next one works


def test_threads_asking_for_a_kernel_compiled_ahead_share_one_compile():
    import threading
    spec = jit.Spec("return x * 13 - 2;", "x", "x")
    before = dict(jit.stats)
    jit.start_compile(spec, "float64")
    got = []
    threads = [threading.Thread(target=lambda: got.append(jit.compile_kernel(spec, "float64"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 4 and all(k is got[0] for k in got)
    assert jit.stats["compiled"] - before["compiled"] == 1, jit.stats
    assert not jit._ahead, "a finished compile stayed in the queue"


def test_a_forked_child_compiles_ahead_with_workers_of_its_own():
    import time
    first = jit.Spec("return x * 17;", "x", "x")
    jit.start_compile(first, "float64")  # the parent's workers exist now
    jit.compile_kernel(first, "float64")
    pid = os.fork()
    if pid == 0:  # the child: its parent's worker threads did not come along
        try:
            spec = jit.Spec("return x * 19;", "x", "x")
            jit.start_compile(spec, "float64")
            outs, _ = run(jit.compile_kernel(spec, "float64"), (1,), [((1,), [2.0])])
            os._exit(0 if outs[0] == [38.0] else 1)
        except BaseException:
            os._exit(2)
    deadline = time.time() + 120
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.time() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child hung waiting for a compile started ahead")
        time.sleep(0.05)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def test_the_memory_cache_returns_the_same_kernel():
    a = jit.compile_kernel(jit.Spec("return x * 3;", "x", "x"), "float64")
    b = jit.compile_kernel(jit.Spec("return x * 3;", "x", "x"), "float64")
    c = jit.compile_kernel(jit.Spec("return x * 4;", "x", "x"), "float64")
    assert a is b and a is not c


def test_coalescing_merges_only_what_walks_as_one_run():
    c = jit.coalesce
    assert c([4, 5, 6], [[30, 6, 1], [0, 0, 0]]) == ([120], [[1], [0]])  # contiguous and broadcast
    assert c([3, 37], [[37, 1], [0, 0], [1, 0], [0, 1]]) == ([3, 37], [[37, 1], [0, 0], [1, 0], [0, 1]])
    assert c([2, 1, 3], [[3, 0, 1]]) == ([6], [[1]])  # a size-1 dimension is dropped
    assert c([5, 4], [[1, 5]]) == ([5, 4], [[1, 5]])  # a transposed input stays two-dimensional
    assert c([1, 1], [[0, 0]]) == ([1], [[0]]) and c([], [[]]) == ([], [[]])
    assert c([0, 3], [[3, 1]]) == ([0], [[1]])
