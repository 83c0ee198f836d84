"""dualcast.cuda_kernel's host-side choices, which need neither a GPU nor NVRTC: which walk a call
shape takes (fast or general, 32- or 64-bit indices, worked out symbolically up to 2^31 elements and
past), when vectors are allowed (16 bytes, 8 for the 16-bit types: odd lengths, views starting
mid-vector, broadcast inputs, null partials), the grids, and that the ctypes Args matches the
kernel's C++ struct byte for byte (compiled with the host compiler)."""

import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from dualcast import cuda_kernel as ck, jit  # noqa: E402

SMS = 132  # an H100 / H200
F32, F64, F16 = 4, 8, 2  # F16: bfloat16 and float16 alike
BASE = 0x7F3A00000000  # an allocation (PyTorch's are 512-byte aligned)


def coalesced(shape, strides):
    return jit.coalesce(shape, strides)


def test_lanes_and_index_bits():
    assert (ck.lanes(F32), ck.lanes(F64), ck.lanes(F16)) == (4, 2, 4)  # 16-bit: computed in float
    assert (ck.vector_bytes(F32), ck.vector_bytes(F64), ck.vector_bytes(F16)) == (16, 16, 8)
    assert ck.index_bits(1) == 32
    assert ck.index_bits(2 ** 31 - 1) == 32
    assert ck.index_bits(2 ** 31) == 64
    assert ck.index_bits(2 ** 40) == 64


def test_a_contiguous_call_is_one_fast_row_with_vectors():
    # (4, 8191) contiguous with a scalar: coalesced to one row; 8191 is odd (a tail of 3 / 1).
    shape, strides = coalesced([4, 8191], [[8191, 1], [0, 0]])
    assert shape == [4 * 8191]
    for itemsize in (F32, F64):
        p = ck.plan(shape, strides, itemsize, SMS)
        assert p.walk == "fast" and p.bits == 32 and p.unit == 0b01 and p.vec_strides, p
        tile = ck.THREADS * ck.lanes(itemsize)
        assert p.grid == (min(-(-4 * 8191 // tile), SMS * ck.FAST_BLOCKS_PER_SM), 1), p


def test_the_index_width_at_2_to_the_31_symbolically():
    # The fast walk below 2^31 elements (32-bit); from 2^31 on, the general walk's 64-bit entry.
    p = ck.plan([2 ** 31 - 1], [[1], [0]], F32, SMS)
    assert p.walk == "fast" and p.bits == 32 and p.grid == (SMS * ck.FAST_BLOCKS_PER_SM, 1), p
    for n in (2 ** 31, 2 ** 31 + 3):
        p = ck.plan([n], [[1], [0]], F32, SMS)
        assert p.walk == "flat" and p.bits == 64 and p.grid == (SMS * ck.GENERAL_BLOCKS_PER_SM, 1), (n, p)
    # 2-D: 2^16 rows of 2^15 is 2^31 elements; one fewer row is not.
    p = ck.plan([2 ** 16 - 1, 2 ** 15], [[2 ** 15, 1], [1, 0]], F32, SMS)
    assert p.walk == "fast" and p.bits == 32, p
    p = ck.plan([2 ** 16, 2 ** 15], [[2 ** 15, 1], [1, 0]], F32, SMS)
    assert p.walk == "rowwise" and p.bits == 64, p
    # The general walk too.
    assert ck.plan([2 ** 31 - 1], [[3]], F32, SMS).bits == 32
    assert ck.plan([2 ** 31], [[3]], F32, SMS).bits == 64


def test_32_bit_indices_never_wrap_in_the_fast_walk():
    # The kernel's c runs below cols < 2^31 and steps by gx * THREADS * W: its last value plus a step
    # and a vector must stay below 2^32 (unsigned), whatever the GPU's size.
    for sms in (1, SMS, 1000):
        for itemsize in (F32, F64, F16):
            n = 2 ** 31 - 1
            p = ck.plan([n], [[1]], itemsize, sms)
            step = p.grid[0] * ck.THREADS * ck.lanes(itemsize)
            assert p.walk == "fast" and p.bits == 32 and n + step + ck.lanes(itemsize) < 2 ** 32, (sms, p)


def test_empty_and_zero_dimensional_calls():
    assert ck.plan([0], [[1]], F32, SMS) is None
    shape, strides = coalesced([5, 0, 3], [[0, 3, 1], [3, 1, 0]])
    assert ck.plan(shape, strides, F32, SMS) is None
    shape, strides = coalesced([], [[], []])  # a 0-dim call: one element, general walk
    p = ck.plan(shape, strides, F64, SMS)
    assert p.n == 1 and p.walk == "flat" and p.grid == (1, 1), p
    shape, strides = coalesced([1, 1], [[1, 1]])
    p = ck.plan(shape, strides, F32, SMS)
    assert p.n == 1 and p.walk == "fast" and p.grid == (1, 1), p


def test_rows_with_broadcast_columns_take_the_fast_walk_with_vectors():
    # Workload a: (8192, 8192) with [n, 1] inputs (strides 1, 0) and contiguous ones.
    shape, strides = coalesced([8192, 8192], [[1, 0], [1, 0], [8192, 1], [8192, 1], [8192, 1], [8192, 1]])
    assert shape == [8192, 8192]
    p = ck.plan(shape, strides, F32, SMS)
    assert p.walk == "fast" and p.bits == 32 and p.unit == 0b111100 and p.vec_strides, p
    gx, gy = p.grid
    assert gx == 8 and gy == SMS * ck.FAST_BLOCKS_PER_SM // 8 and gx * gy <= SMS * ck.FAST_BLOCKS_PER_SM, p
    # A row vector broadcast down the rows (stride 0, 1) is a unit input: a vector load per chunk.
    p = ck.plan([64, 2048], [[0, 1], [2048, 1]], F64, SMS)
    assert p.walk == "fast" and p.unit == 0b11 and p.vec_strides, p
    # 3-D rows (the GPU test's long rows): one decomposition per row, then the fast walk.
    shape, strides = coalesced([3, 5, 300], [[1, 0, 0], [0, 1, 0], [1500, 300, 1], [0, 0, 1], [0, 300, 1],
                                             [300, 0, 1]])
    assert len(shape) == 3
    p = ck.plan(shape, strides, F64, SMS)
    assert p.walk == "fast" and p.unit == 0b111100 and p.vec_strides, p
    assert ck.plan(shape, strides, F32, SMS).walk == "rowwise"  # 300 < half a float32 tile (512)


def test_a_view_starting_mid_vector_reads_lane_by_lane():
    # x[:, 1:] of a (513, 1025) tensor: rows 1024 long, 1025 apart: the rows cannot all be aligned.
    shape, strides = coalesced([513, 1024], [[1025, 1], [1, 0], [0, 1]])
    p = ck.plan(shape, strides, F32, SMS)
    assert p.walk == "fast" and p.unit == 0b101 and not p.vec_strides, p
    assert not ck.vector_ok(p, [BASE, BASE, BASE], [BASE], [])
    # x[1:] of a contiguous vector: one row, the strides allow vectors, its address does not.
    p = ck.plan([8191], [[1], [0]], F32, SMS)
    assert p.vec_strides
    assert ck.vector_ok(p, [BASE, BASE + 4], [BASE], [])      # a scalar's address does not matter
    assert not ck.vector_ok(p, [BASE + 4, BASE], [BASE], [])  # element 1 of a float32 tensor
    assert ck.vector_ok(p, [BASE + 16, BASE], [BASE], [])     # element 4
    p64 = ck.plan([8191], [[1], [0]], F64, SMS)
    assert not ck.vector_ok(p64, [BASE + 8, BASE], [BASE], [])  # element 1 of a float64 tensor
    assert ck.vector_ok(p64, [BASE + 16, BASE], [BASE], [])     # element 2
    # Outputs and wanted partials count; null partials (not wanted) do not.
    assert not ck.vector_ok(p, [BASE, BASE], [BASE + 8], [])
    assert ck.vector_ok(p, [BASE, BASE], [BASE], [0, None, BASE + 32])
    assert not ck.vector_ok(p, [BASE, BASE], [BASE], [0, BASE + 4])
    # Rows whose length is not a multiple of the vector: vectors only within one row.
    p = ck.plan([37, 1031], [[1031, 1], [1, 0]], F32, SMS)
    assert p.walk == "fast" and not p.vec_strides, p
    p = ck.plan([37, 1030], [[1030, 1], [1, 0]], F64, SMS)
    assert p.walk == "fast" and p.vec_strides, p  # 1030 is a multiple of 2 doubles
    # A unit input whose rows are an odd number of elements apart (a padded layout).
    p = ck.plan([64, 2048], [[2049, 1], [2048, 1]], F32, SMS)
    assert p.walk == "fast" and not p.vec_strides, p
    assert not ck.vector_ok(p, [BASE, BASE], [BASE], [])


def test_16_bit_vectors_are_8_bytes_of_4_lanes():
    # bfloat16 / float16 compute in float: 4 lanes per thread as float32 (the same tiles and short-
    # row threshold), moved as one 8-byte uint2, so addresses need 8-byte alignment, not 16.
    shape, strides = coalesced([4, 8191], [[8191, 1], [0, 0]])
    p = ck.plan(shape, strides, F16, SMS)
    assert p.walk == "fast" and p.vec_strides and p.vec_bytes == 8, p
    assert p.grid == ck.plan(shape, strides, F32, SMS).grid, p
    assert ck.vector_ok(p, [BASE, BASE + 2], [BASE], [])
    assert not ck.vector_ok(p, [BASE + 2, BASE], [BASE], [])     # element 1
    assert not ck.vector_ok(p, [BASE + 4, BASE], [BASE], [])     # element 2
    assert ck.vector_ok(p, [BASE + 8, BASE], [BASE], [])         # element 4: a uint2 boundary...
    assert not ck.vector_ok(ck.plan(shape, strides, F32, SMS), [BASE + 8, BASE], [BASE], [])  # ...not a float4's
    assert not ck.vector_ok(p, [BASE, BASE], [BASE + 6], [])     # an output from element 3
    assert not ck.vector_ok(p, [BASE, BASE], [BASE], [0, BASE + 2])  # a wanted partial from element 1
    # Rows: whole vectors of 4 elements in every row and unit input, or vectors within one row only.
    assert ck.plan([64, 2048], [[2048, 1], [1, 0]], F16, SMS).vec_strides
    assert not ck.plan([37, 1030], [[1030, 1], [1, 0]], F16, SMS).vec_strides  # 1030 is no multiple of 4
    assert not ck.plan([64, 2048], [[2050, 1], [2048, 1]], F16, SMS).vec_strides
    # The short-row threshold is float32's (half a tile of 4 lanes).
    assert ck.plan([1000, 512], [[512, 1], [1, 0]], F16, SMS).walk == "fast"
    assert ck.plan([1000, 300], [[300, 1], [1, 0]], F16, SMS).walk == "rowwise"


def test_what_stays_on_the_general_walk():
    # A last stride other than 0 or 1 (a transposed or sliced input).
    p = ck.plan([4096], [[2], [1]], F32, SMS)
    assert p.walk == "flat" and not ck.vector_ok(p, [BASE, BASE], [BASE], []), p
    p = ck.plan([300, 4096], [[1, 300], [4096, 1]], F32, SMS)
    assert p.walk == "rowwise", p
    # Short rows: a fast block would idle; rows of at least half a block walk rowwise, shorter flat.
    assert ck.plan([1000, 100], [[100, 1], [1, 0]], F32, SMS).walk == "flat"
    assert ck.plan([1000, 300], [[300, 1], [1, 0]], F32, SMS).walk == "rowwise"
    assert ck.plan([1000, 512], [[512, 1], [1, 0]], F32, SMS).walk == "fast"
    assert ck.plan([1000, 256], [[256, 1], [1, 0]], F64, SMS).walk == "fast"
    # More inputs than Args::unit has bits.
    many = ck.MAX_FAST_INPUTS + 1
    assert ck.plan([4096], [[1]] * many, F32, SMS).walk == "flat"
    assert ck.plan([4096], [[1]] * ck.MAX_FAST_INPUTS, F32, SMS).walk == "fast"
    # fast=False (cuda.set_fast_walk(False)): the general walk with the same grid as before.
    p = ck.plan([8192, 8192], [[1, 0], [8192, 1]], F32, SMS, fast=False)
    assert p.walk == "rowwise" and p.unit == 0 and p.grid == (32, SMS * ck.GENERAL_BLOCKS_PER_SM // 32), p
    assert not ck.vector_ok(p, [BASE, BASE], [BASE], [])
    p = ck.plan([8191], [[1]], F32, SMS, fast=False)
    assert p.walk == "flat" and p.grid == (32, 1), p
    assert not ck.vector_ok(None, [], [], [])


def test_the_fast_grid_is_one_wave_of_resident_blocks():
    # cuda.CudaKernel passes the driver's occupancy of the fast entry point (4 blocks of 256 threads
    # at 64 registers): the grid is then every resident block once, each looping over its rows.
    shape, strides = [8192, 8192], [[1, 0], [8192, 1]]
    for per_sm in (1, 3, 4, 8):
        gx, gy = ck.plan(shape, strides, F32, SMS, fast_blocks_per_sm=per_sm).grid
        assert gx == 8 and gy == SMS * per_sm // 8, (per_sm, gx, gy)
        gx, gy = ck.plan([10 ** 8], [[1]], F32, SMS, fast_blocks_per_sm=per_sm).grid
        assert (gx, gy) == (SMS * per_sm, 1)
    # Unknown (None, 0) takes the default; more than the default is capped at it.
    for per_sm in (None, 0, 100):
        assert ck.plan([10 ** 8], [[1]], F32, SMS, fast_blocks_per_sm=per_sm).grid == (
            SMS * ck.FAST_BLOCKS_PER_SM, 1)
    # The general walk's grid does not depend on it.
    assert ck.plan([4096], [[2]], F32, SMS, fast_blocks_per_sm=2).grid == (16, 1)


def test_grids_stay_within_the_hardware_limits():
    for shape in ([10 ** 9], [10 ** 6, 1024], [3, 2 ** 20], [70000, 600], [2, 70000, 600]):
        strides = [[0] * (len(shape) - 1) + [1]]
        for itemsize in (F32, F64, F16):
            p = ck.plan(shape, strides, itemsize, SMS)
            gx, gy = p.grid
            assert 1 <= gx <= SMS * ck.FAST_BLOCKS_PER_SM and 1 <= gy <= 65535, (shape, p)


def test_the_ctypes_args_match_the_kernels_struct():
    # The kernel takes Args by value: a field out of place would read garbage on the GPU. The C++
    # struct from the generated CUDA source, compiled by the host compiler, against ctypes' offsets.
    import ctypes
    from dualcast import cuda
    cxx = (os.environ.get("CXX") or "c++").split()
    for spec in (jit.Spec("return x * y;", "x y", "x"), jit.Spec("return {a, a * b};", "a b", "a b", outputs=2)):
        for s in (spec, spec.values(), spec.gradient()):
            src = s.source("float32", "cuda")
            struct = re.search(r"struct Args \{.*?\n\};", src, re.S).group(0)
            consts = "\n".join(re.findall(r"^constexpr int (?:NIN|NOUT|NPART|MAXDIM) = \d+;", src, re.M))
            fields = [f for f, _ in cuda.args_type(s)._fields_]
            cname = {"in_": "in"}
            prog = "#include <cstdint>\n#include <cstddef>\n#include <cstdio>\n%s\n%s\nint main() {\n%s\n}\n" % (
                consts, struct, "\n".join('  std::printf("%%zu\\n", offsetof(Args, %s));' % cname.get(f, f)
                                          for f in fields) + '\n  std::printf("%zu\\n", sizeof(Args));')
            with tempfile.TemporaryDirectory() as d:
                cpp, exe = os.path.join(d, "a.cpp"), os.path.join(d, "a")
                with open(cpp, "w") as fh:
                    fh.write(prog)
                subprocess.run(cxx + ["-std=c++20", cpp, "-o", exe], check=True)
                got = [int(x) for x in subprocess.run([exe], capture_output=True, text=True, check=True).stdout.split()]
            Args = cuda.args_type(s)
            want = [getattr(Args, f).offset for f in fields] + [ctypes.sizeof(Args)]
            assert got == want, (s.body, type(s).__name__, got, want)
