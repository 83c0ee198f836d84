"""bfloat16 and float16 tensors through dualcast.torch.elementwise on a CUDA GPU: the kernels load 16
bits, compute in float and store rounded once, as on the CPU. Each 16-bit kernel (dual with its
partials, values, gradient) is the float32 kernel on the same values rounded once, bit for bit, on
every walk: the fast walk with 8-byte vectors and lane by lane, a row's tail, the general walk. A call
equals the same call on the CPU: values and per-element gradients bit for bit wherever the float32
results of the two devices round to the same 16-bit value, and one 16-bit step apart elsewhere;
gradients summed over broadcast dimensions within the rounding of the sum. Cases: 1, 7 and 1027
elements, views from element 1 (no vectors) and from element 4 (8 bytes in: vectors, where float32
has none), rows with broadcast columns, numbers, short rows, a transposed input. Skips itself
without PyTorch or a GPU."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from skip import import_torch  # noqa: E402

torch = import_torch(cuda=True)

from dualcast import cuda, cuda_kernel, jit  # noqa: E402
from dualcast.torch import elementwise  # noqa: E402
from dualcast.torch_library import compiled_kernel, launch, strides_over  # noqa: E402
from test_torch import CELL_SRC, POLICIES, SHAPES, inputs  # noqa: E402

HALF = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
# The largest gap between neighbouring values, relative to the value (normal numbers): 2^-7 for
# bfloat16's 8 significant bits, 2^-10 for float16's 11; float16's subnormals are 2^-24 apart.
STEP = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}
TINY = 2.0 ** -24
SPEC = jit.Spec(CELL_SRC, "z zb c f i g", "c f i g")


def _cases(dtype):
    """(name, the cell's six inputs on the GPU in dtype (numbers as such), the walk and vector choice
    the call takes, None where not checked)."""
    gen = torch.Generator(device="cuda").manual_seed(16)

    def r(*shape):
        return (torch.rand(shape, generator=gen, device="cuda") * 4 - 2).to(dtype)

    def flag(*shape):
        return (torch.rand(shape, generator=gen, device="cuda") < 0.5).to(dtype)

    def full(n, cut=0):
        return [flag(n + cut)[cut:], flag(n), r(n + cut)[cut:], r(n), r(n + cut)[cut:], r(n)]

    cases = [("1 element", full(1), ("fast", True)),  # the tail alone
             ("7 elements", full(7), ("fast", True)),  # one vector and a tail of 3
             ("1027 elements", full(1027), ("fast", True)),
             ("from element 1", full(1027, 1), ("fast", False)),  # 2 bytes in: lane by lane
             ("from element 4", full(1027, 4), ("fast", True)),  # 8 bytes in: a uint2 boundary
             ("aligned rows, [n, 1] flags", [flag(64, 1), flag(64, 1), r(64, 2048), r(2048), r(64, 2048), r(64, 1)],
              ("fast", True)),
             ("x[:, 1:] rows", [flag(129, 1), flag(129, 1), r(129, 1025)[:, 1:], r(1024), r(129, 1025)[:, 1:],
                                r(129, 1024)], ("fast", False)),
             ("rows of 1031 (tails)", [flag(37, 1), flag(37, 1031), r(37, 1031), r(37, 1), r(37, 1031), r(1031)],
              ("fast", False)),
             ("numbers", [0.0, 1.0, r(4099), r(4099), r(4099), r(4099)], ("fast", True)),
             ("short rows", [flag(300, 1), flag(300, 1), r(300, 100), r(100), r(300, 100), r(300, 100)],
              ("flat", False)),
             ("transposed", [flag(600, 1), 1.0, r(300, 600).t(), r(300), r(600, 300), r(600, 1)], ("rowwise", False))]
    for k, shapes in enumerate(SHAPES):  # test_torch's broadcast patterns (0-dim tensors among them)
        cases.append(("SHAPES[%d]" % k, [t.detach().cuda() for t in inputs(shapes, dtype, seed=17 + k)], None))
    return cases


def _tensors(args, dtype):
    """The kernel's inputs: numbers as 0-dim tensors of dtype, as dualcast.torch passes them."""
    return [a if isinstance(a, torch.Tensor) else torch.full((), a, dtype=dtype, device="cuda") for a in args]


def _walk_of(xs):
    """The walk and vector choice dualcast.cuda makes for inputs xs (fresh outputs are aligned)."""
    shape = torch.broadcast_shapes(*[x.shape for x in xs])
    p = cuda_kernel.plan(*jit.coalesce(list(shape), [strides_over(x, shape) for x in xs]), xs[0].element_size(), 132)
    return p.walk, cuda_kernel.vector_ok(p, [x.data_ptr() for x in xs], [], [])


def _run(spec, dtype, xs):
    """spec's kernel for dtype launched on the GPU tensors xs (of that dtype): its outputs, then its
    partials, each poisoned with NaN first."""
    shape = torch.broadcast_shapes(*[x.shape for x in xs])
    outs = [torch.full(shape, float("nan"), dtype=dtype, device="cuda") for _ in range(spec.n_out + spec.n_partials)]
    launch(compiled_kernel(spec, HALF.get(dtype, "float32"), xs[0].device), xs[0].device, shape, xs,
           outs[:spec.n_out], outs[spec.n_out:])
    return outs


def _bits(t):
    return t.contiguous().view(torch.int16)


def test_16_bit_gpu_kernels_are_the_float32_kernels_rounded_once_on_every_walk():
    # Same float operations on the same values as the float32 kernel, rounded once by cvt.rn: equal
    # to the float32 kernel's results rounded by torch (nearest even) in every bit, through each walk.
    try:
        for dtype, name in HALF.items():
            for case, args, want in _cases(dtype):
                xs = _tensors(args, dtype)
                if want is not None:
                    assert _walk_of(xs) == want, (name, case, _walk_of(xs), want)
                shape = torch.broadcast_shapes(*[x.shape for x in xs])
                g = (torch.rand(shape, device="cuda") * 2 - 1).to(dtype)  # the output gradient
                for spec in (SPEC, SPEC.values(), SPEC.gradient()):
                    ins = xs + [g] if spec.gradient_kernel else xs
                    cuda.set_fast_walk(True)
                    ref = [o.to(dtype) for o in _run(spec, torch.float32, [x.float() for x in ins])]
                    for fast in (True, False):
                        cuda.set_fast_walk(fast)
                        got = _run(spec, dtype, ins)
                        for k, (u, v) in enumerate(zip(got, ref)):
                            what = (name, case, type(spec).__name__, "fast" if fast else "general", k)
                            assert not torch.isnan(u).any(), what + ("not written",)
                            assert torch.equal(_bits(u), _bits(v)), what + ((u.float() - v.float()).abs().max().item(),)
    finally:
        cuda.set_fast_walk(True)


def _rounded_alike(a16, b16, a32, b32, what):
    """a16 and b16 (the two devices' 16-bit results) are each their float32 result (a32, b32) rounded
    once: equal in every bit where a32 and b32 round alike, else neighbours (a32 and b32 differ in a
    last float bit or so: the GPU contracts a * b + c into an FMA where the CPU kernels do not, and
    CUDA's exp and tanh are not libmvec's). Returns how many round apart: the most that may differ."""
    dtype = a16.dtype
    a16, b16, a32, b32 = a16.detach().cpu(), b16.detach().cpu(), a32.detach().cpu(), b32.detach().cpu()
    alike = _bits(a32.to(dtype)) == _bits(b32.to(dtype))
    assert torch.equal(_bits(a16)[alike], _bits(b16)[alike]), what
    gap = (a16.float() - b16.float()).abs()
    assert bool((gap <= STEP[dtype] * b16.float().abs() + TINY).all()), what + (gap.max().item(),)
    return int((~alike).sum())


def test_16_bit_calls_on_the_gpu_equal_the_cpu_values_and_gradients():
    # Both policies; the float32 calls on the same 16-bit values say where the devices may differ.
    differ, total = 0, 0
    for dtype in HALF:
        for policy in POLICIES:
            cell = elementwise(CELL_SRC, inputs="z zb c f i g", differentiable="c f i g", partials=policy)
            for case, args, _ in _cases(dtype):
                runs = {}
                for device, dt in (("cuda", dtype), ("cpu", dtype), ("cuda", torch.float32), ("cpu", torch.float32)):
                    xs = [a.detach().to(device, dt).requires_grad_(k >= 2) if isinstance(a, torch.Tensor) else a
                          for k, a in enumerate(args)]
                    y = cell(*xs)
                    # Made in float and rounded: a float16 linspace overflows its index past 65504.
                    w = torch.linspace(-1, 1, y.numel()).to(dtype).reshape(y.shape)
                    (y * w.to(device, dt)).sum().backward()
                    assert y.dtype == dt and all(x.grad.dtype == dt for x in xs[2:] if isinstance(x, torch.Tensor))
                    runs[device, dt] = [y] + [x.grad for x in xs[2:] if isinstance(x, torch.Tensor)]
                what = (HALF[dtype], policy, case)
                y16 = (runs["cuda", dtype], runs["cpu", dtype])
                y32 = (runs["cuda", torch.float32], runs["cpu", torch.float32])
                differ += _rounded_alike(y16[0][0], y16[1][0], y32[0][0], y32[1][0], what + ("values",))
                shape = y16[1][0].shape
                total += y16[1][0].numel()
                for k, (gpu, cpu) in enumerate(zip(y16[0][1:], y16[1][1:])):
                    if policy == "recompute" and cpu.shape == shape:
                        # One gradient kernel's element each, rounded once: as the values.
                        differ += _rounded_alike(gpu, cpu, y32[0][1 + k], y32[1][1 + k], what + ("gradient", k))
                        total += cpu.numel()
                    else:
                        # Summed by torch over broadcast dimensions (in float, rounded once, in another
                        # order on each device) from elements that may be one step apart; or (store)
                        # 16-bit partials times the gradient in float: a step or two of the largest.
                        scale = max(cpu.float().abs().max().item(), 1.0)
                        torch.testing.assert_close(gpu.cpu().float(), cpu.float(), rtol=2 * STEP[dtype],
                                                   atol=2 * STEP[dtype] * scale, msg=str(what + ("gradient", k)))
    print("16-bit GPU against CPU: %d of %d values and per-element gradients may be a step apart" % (differ, total))


def test_16_bit_promotion_and_a_side_stream_on_the_gpu():
    # Type promotion as on the CPU; a 16-bit call queued on PyTorch's current (side) stream behind
    # slow work reads the values that stream wrote.
    f = elementwise("if (x > 0) return x * y; return y - x;", inputs="x y", differentiable="x y")
    bf = torch.ones(2, dtype=torch.bfloat16, device="cuda")
    assert f(bf, 2.5).dtype == torch.bfloat16 and f(bf, bf.half()).dtype == torch.float32
    for dtype in HALF:
        x = torch.randn(1237, 4099, device="cuda").to(dtype).requires_grad_()
        y = torch.randn(4099, device="cuda").to(dtype).requires_grad_()
        y_old = y.detach().clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            torch.cuda._sleep(50_000_000)
            with torch.no_grad():
                y.mul_(2.0)
            out = f(x, y)
            out.sum().backward()
        torch.cuda.current_stream().wait_stream(s)
        xf, yf = x.detach().float(), (2 * y_old).float()
        want = torch.where(xf > 0, xf * yf, yf - xf).to(dtype)  # one rounding of the float result
        assert torch.equal(_bits(out), _bits(want)), HALF[dtype]
        assert torch.equal(_bits(x.grad), _bits(torch.where(xf > 0, yf.expand_as(xf), -torch.ones_like(xf)).to(dtype)))
