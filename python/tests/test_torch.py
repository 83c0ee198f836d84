"""dualcast.torch.elementwise against PyTorch: gradcheck in float64, fused equal to the same function
composed from torch ops (values and gradients), broadcasting, numbers as inputs, several outputs,
and clear errors. Skips itself where PyTorch is not installed."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from skip import import_torch  # noqa: E402

torch = import_torch()

from dualcast.torch import elementwise  # noqa: E402

F32_RTOL, F32_ATOL = 1e-5, 1e-6  # the fused float32 kernel against torch's composed float32 ops

CELL_SRC = """
    if (z == 1) return sigmoid(i) * tanh(g);
    if (zb == 0) return c;
    return sigmoid(f) * c + sigmoid(i) * tanh(g);
"""


def cell_composed(z, zb, c, f, i, g):
    upd = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.where(z == 1, torch.sigmoid(i) * torch.tanh(g), torch.where(zb == 0, c + 0 * upd, upd))


def inputs(shapes, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for name, sh in zip("z zb c f i g".split(), shapes):
        if name in ("z", "zb"):
            out.append((torch.rand(sh, generator=gen) < 0.5).to(dtype))
        else:
            out.append((torch.rand(sh, generator=gen, dtype=dtype) * 4 - 2).requires_grad_())
    return out


SHAPES = [
    [(4, 7)] * 6,
    [(4, 1), (4, 1), (4, 7), (1, 7), (7,), (4, 7)],
    [(), (), (3, 1, 5), (5,), (1, 5), (3, 1, 1)],
]


POLICIES = ("recompute", "store")  # a fused gradient kernel; partials stored by the forward


def test_gradcheck_in_float64_on_every_broadcast_pattern():
    for policy in POLICIES:
        cell = elementwise(CELL_SRC, inputs="z zb c f i g", differentiable="c f i g", partials=policy)
        for shapes in SHAPES:
            args = inputs(shapes, torch.float64, seed=1)
            assert torch.autograd.gradcheck(lambda *a: cell(*a), args, eps=1e-6, atol=1e-7), (policy, shapes)


def test_fused_equals_composed_in_float32_values_and_gradients():
    for policy in POLICIES:
        cell = elementwise(CELL_SRC, inputs="z zb c f i g", differentiable="c f i g", partials=policy)
        for shapes in SHAPES:
            a = inputs(shapes, torch.float32, seed=2)
            b = [t.detach().clone().requires_grad_(t.requires_grad) for t in a]
            fused, composed = cell(*a), cell_composed(*b)
            torch.testing.assert_close(fused, composed, rtol=F32_RTOL, atol=F32_ATOL)
            w = torch.randn(fused.shape)
            (fused * w).sum().backward()
            (composed * w).sum().backward()
            for x, y in zip(a, b):
                if x.requires_grad:
                    torch.testing.assert_close(x.grad, y.grad, rtol=F32_RTOL, atol=F32_ATOL)


# 16-bit tensors (CPU): one rounding of the float result, so the fused result is the float32 result
# of the same 16-bit inputs rounded to the dtype, within this many ulps (libmvec's and torch's tanh
# and sigmoid may round a last float bit apart); gradients summed over broadcast dimensions carry
# a few more (the fused path rounds each element before the sum).
HALF_ULP = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def test_16_bit_tensors_compute_in_float_and_round_once():
    for dtype, ulp in HALF_ULP.items():
        for policy in POLICIES:
            cell = elementwise(CELL_SRC, inputs="z zb c f i g", differentiable="c f i g", partials=policy)
            for shapes in SHAPES:
                a = inputs(shapes, dtype, seed=5)
                b = [t.detach().float().requires_grad_(t.requires_grad) for t in a]
                fused, composed = cell(*a), cell_composed(*b)
                assert fused.dtype == dtype, (fused.dtype, dtype)
                torch.testing.assert_close(fused.float(), composed.to(dtype).float(), rtol=2 * ulp, atol=2 * ulp)
                w = torch.randn(fused.shape).to(dtype)
                (fused * w).sum().backward()
                (composed * w.float()).sum().backward()
                for x, y in zip(a, b):
                    if x.requires_grad:
                        assert x.grad.dtype == dtype
                        scale = max(y.grad.abs().max().item(), 1.0)
                        torch.testing.assert_close(x.grad.float(), y.grad.to(dtype).float(), rtol=8 * ulp,
                                                   atol=8 * ulp * scale)


def test_16_bit_type_promotion_follows_pytorch():
    f = elementwise("return a + b;", inputs="a b", differentiable="a")
    bf, hf, f32 = torch.ones(2, dtype=torch.bfloat16), torch.ones(2, dtype=torch.float16), torch.ones(2)
    assert f(bf, bf).dtype == torch.bfloat16
    assert f(bf, 2.5).dtype == torch.bfloat16  # a number never promotes
    assert f(bf, f32).dtype == torch.float32
    assert f(bf, hf).dtype == torch.float32  # as torch.promote_types
    assert f(hf, torch.tensor(1.0)).dtype == torch.float16  # a 0-dim float32 tensor: same category
    assert f(bf, bf).tolist() == [2.0, 2.0]


def test_numbers_and_inputs_without_gradients():
    f = elementwise("return a * b + c;", inputs="a b c", differentiable="a b")
    a = torch.tensor([1.0, 2.0], requires_grad=True)
    out = f(a, 3.0, torch.tensor([0.5, 0.25]))  # b a number; c not differentiated
    assert out.tolist() == [3.5, 6.25]
    out.sum().backward()
    assert a.grad.tolist() == [3.0, 3.0]


def test_a_call_without_gradients_makes_no_autograd_node_and_keeps_the_others():
    # The kernel alone when no input wants a gradient (grad mode off, or none requires one); an input
    # that requires a gradient but is not differentiated still gets a node (its gradient is None).
    f = elementwise("return a * b;", inputs="a b", differentiable="a")
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0], requires_grad=True)
    out = f(a, a)
    assert out.grad_fn is None and not out.requires_grad and out.tolist() == [1.0, 4.0]
    with torch.no_grad():
        out = f(a.clone().requires_grad_(), a)
    assert out.grad_fn is None and out.tolist() == [1.0, 4.0]
    out = f(a, b)
    assert out.requires_grad and out.grad_fn is not None
    out.sum().backward()
    assert b.grad is None  # b is not differentiated: no gradient, no error


def test_the_same_signature_with_other_strides_reads_each_layout_right():
    # One call signature (shapes, dtypes, devices), many layouts: contiguous, transposed views, a
    # broadcast expand and a sliced view. Each layout gets its own launch.
    f = elementwise("return x * 2 + y;", inputs="x y", differentiable="x y")
    gen = torch.Generator().manual_seed(3)
    def rand(*shape):
        return torch.rand(*shape, generator=gen, dtype=torch.float64)

    base, tall = rand(6, 5), rand(10, 5)
    layouts = [base[:5].clone(), base[:5].t(), base[1:6], tall[::2], rand(1, 5).expand(5, 5),
               rand(5, 1).expand(5, 5)]
    for x in layouts:
        for y in layouts:
            assert torch.equal(f(x, y), x * 2 + y), (x.stride(), y.stride())  # the views themselves
            xg, yg = x.clone().requires_grad_(), y.clone().requires_grad_()
            out = f(xg, yg)
            out.backward(torch.ones_like(out))
            assert torch.equal(xg.grad, torch.full_like(xg, 2.0)) and torch.equal(yg.grad, torch.ones_like(yg))


def test_type_promotion_over_many_tensors_follows_pytorch():
    f = elementwise("return a + b + c;", inputs="a b c", differentiable="a")
    x32, x64 = torch.ones(2), torch.ones(2, dtype=torch.float64)
    assert f(x32, x32, x64).dtype == torch.float64
    assert f(x32, x32, torch.tensor(1.0, dtype=torch.float64)).dtype == torch.float32  # 0-dim: same category
    assert f(torch.ones(2, dtype=torch.int64), x32, 2.0).dtype == torch.float32
    assert f(x32, 1, 2.5).dtype == torch.float32  # numbers never promote


def test_several_outputs():
    for policy in POLICIES:
        f = elementwise("return {x * y, x - y};", inputs="x y", differentiable="x y", outputs=2, partials=policy)
        x = torch.tensor([2.0, -1.0], dtype=torch.float64, requires_grad=True)
        y = torch.tensor([[3.0], [5.0]], dtype=torch.float64, requires_grad=True)
        p, q = f(x, y)
        assert p.shape == (2, 2) and q.shape == (2, 2)
        (p.sum() + 2 * q.sum()).backward()
        assert x.grad.tolist() == [3.0 + 5.0 + 4.0, 3.0 + 5.0 + 4.0], policy
        assert y.grad.tolist() == [[2.0 - 1.0 - 4.0], [2.0 - 1.0 - 4.0]], policy
        # One output unused: PyTorch passes zeros (an expanded, stride-0 tensor) as its gradient.
        x.grad = None
        p, q = f(x, y)
        q.sum().backward()
        assert x.grad.tolist() == [2.0, 2.0], policy


def test_a_body_that_needs_dual_numbers_still_works_with_a_warning():
    # Its forward cannot run on plain numbers (.val is a dual's member): the dual kernel runs
    # without partials instead, and the user is told once.
    import warnings
    f = elementwise("if (x.val > 0) return x * y; return y - x;", inputs="x y", differentiable="x y")
    x = torch.tensor([1.5, -2.0], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([3.0, 4.0], dtype=torch.float64, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = f(x, y)
    assert any("does not compile on plain numbers" in str(w.message) for w in caught), [str(w.message) for w in caught]
    assert out.tolist() == [4.5, 6.0]
    out.sum().backward()
    assert x.grad.tolist() == [3.0, -1.0] and y.grad.tolist() == [1.5, 1.0]


def test_a_body_with_a_plain_error_reports_the_error_not_the_values_fallback():
    import warnings
    f = elementwise("return x * undefined_name;", inputs="x", differentiable="x")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            f(torch.ones(2, requires_grad=True))
        except Exception as e:  # noqa: BLE001 (jit.CompileError, checked by its message)
            assert "undefined_name" in str(e) and "line 1 of the body" in str(e), str(e)
        else:
            raise AssertionError("a body naming an undefined variable compiled")
    assert not any("plain numbers" in str(w.message) for w in caught), [str(w.message) for w in caught]


def test_a_backward_after_an_input_changed_in_place_is_refused():
    # The recompute policy evaluates the body again on the inputs: PyTorch's saved-tensor check
    # must see them, so that a changed input is an error rather than a wrong gradient.
    f = elementwise("return x * y;", inputs="x y", differentiable="x")
    expect_a_changed_input_refused(f, calls_before=0)


def expect_a_changed_input_refused(f, calls_before):
    """f(x, y) after calls_before calls of the same signature, then y changed in place: the backward
    is an error (test_native calls it after one call, so that the compiled launcher takes it)."""
    x = torch.ones(3, requires_grad=True)
    y = torch.full((3,), 2.0)
    for _ in range(calls_before):
        f(x, y)
    out = f(x, y)
    y.add_(1.0)
    try:
        out.sum().backward()
    except RuntimeError as e:
        assert "modified by an inplace operation" in str(e), str(e)
    else:
        raise AssertionError("a backward on a changed input ran")


def test_bad_shapes_and_arguments_are_clear_errors():
    f = elementwise("return x + y;", inputs="x y", differentiable="x")
    cases = [
        (lambda: f(torch.zeros(3), torch.zeros(4)), ValueError, "do not broadcast: x [3], y [4]"),
        (lambda: f(torch.zeros(3)), TypeError, "takes 2 inputs (x y), got 1"),
        (lambda: f(1.0, 2.0), TypeError, "at least one input must be a tensor"),
        (lambda: f(torch.zeros(3), "y"), TypeError, "input y is a str"),
        (lambda: f(torch.zeros(3, dtype=torch.complex64), torch.zeros(3)), TypeError, "complex tensors"),
        (lambda: elementwise("return x;", inputs="x", differentiable="x", partials="keep"), ValueError,
         "partials must be 'recompute' or 'store', not 'keep'"),
    ]
    for call, kind, want in cases:
        try:
            call()
        except kind as e:
            assert want in str(e), (want, str(e))
        else:
            raise AssertionError("no error: " + want)
    assert f(torch.ones(2), torch.ones(2)).tolist() == [2.0, 2.0]  # still works afterwards


def needs_custom_ops():
    from dualcast import torch_library
    if not torch_library.available():
        from skip import Skip
        raise Skip("PyTorch %s has no torch.library.custom_op (2.4 and later)" % torch.__version__)


def test_torch_compile_keeps_the_function_in_one_graph_with_its_gradients():
    # fullgraph=True: a graph break is an error. The function is the custom op (its fake gives the
    # shapes while tracing) and its backward the gradient op; both must equal the eager results.
    needs_custom_ops()
    cell = elementwise(CELL_SRC, inputs="z zb c f i g", differentiable="c f i g")

    def model(z, zb, c, f, i, g):
        return (cell(z, zb, c, f, i, g) * 2.0 + 1.0).tanh()

    compiled = torch.compile(model, fullgraph=True)
    for shapes in SHAPES[:2]:
        a = inputs(shapes, torch.float32, seed=6)
        b = [t.detach().clone().requires_grad_(t.requires_grad) for t in a]
        ya, yb = model(*a), compiled(*b)
        torch.testing.assert_close(yb, ya, rtol=F32_RTOL, atol=F32_ATOL)
        ya.sum().backward()
        yb.sum().backward()
        for x, y in zip(a, b):
            if x.requires_grad:
                torch.testing.assert_close(y.grad, x.grad, rtol=F32_RTOL, atol=F32_ATOL)


def test_threads_making_the_same_function_at_once_share_its_ops():
    # The custom ops of a body are registered once, whichever thread gets there first.
    needs_custom_ops()
    import threading
    body = "return x * y + %d;" % os.getpid()  # a body no other test registered
    made, errors = [], []

    def make():
        try:
            made.append(elementwise(body, inputs="x y", differentiable="x"))
        except Exception as e:  # noqa: BLE001 (the test reports whatever a thread raised)
            errors.append(e)

    threads = [threading.Thread(target=make) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len({id(f._ops[0]) for f in made}) == 1
    assert made[0](torch.ones(2), 2.0).tolist() == [2.0 + os.getpid()] * 2


def needs_cuda():
    if not torch.cuda.is_available():
        from skip import Skip
        raise Skip("no CUDA device")


def _first_call_compiles_both_kernels(device, scale):
    """A function's first call with gradients wanted compiles its values kernel and, beside it on a
    worker thread, its gradient kernel; `scale` makes the body one no cache holds yet."""
    from dualcast import jit
    cell = elementwise("return sigmoid(x) * y + T(%r) * x;" % scale, inputs="x y", differentiable="x y")
    x = torch.randn(7, 5, dtype=torch.float64, device=device, requires_grad=True)
    y = torch.randn(5, dtype=torch.float64, device=device, requires_grad=True)
    before = dict(jit.stats)
    out = cell(x, y)
    assert jit.stats["compiled"] - before["compiled"] == 2, jit.stats
    assert not jit._ahead, "the gradient kernel's compile was not waited for"
    out.sum().backward()
    xr, yr = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
    (torch.sigmoid(xr) * yr + scale * xr).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)
    torch.testing.assert_close(y.grad, yr.grad)


def test_the_first_call_compiles_the_gradient_kernel_beside_the_values_kernel():
    _first_call_compiles_both_kernels("cpu", 0.375)


def test_on_the_gpu_the_first_call_compiles_the_gradient_kernel_beside_the_values_kernel():
    needs_cuda()
    _first_call_compiles_both_kernels("cuda", 0.625)


def test_gpu_equals_cpu_values_and_gradients():
    needs_cuda()
    for policy in POLICIES:
        cell = elementwise(CELL_SRC, inputs="z zb c f i g", differentiable="c f i g", partials=policy)
        for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 2e-6)):
            for shapes in SHAPES:
                a = inputs(shapes, dtype, seed=4)
                b = [t.detach().cuda().requires_grad_(t.requires_grad) for t in a]
                ya, yb = cell(*a), cell(*b)
                torch.testing.assert_close(yb.cpu(), ya, rtol=tol, atol=tol)
                w = torch.randn(ya.shape, dtype=dtype)
                (ya * w).sum().backward()
                (yb * w.cuda()).sum().backward()
                for x, y in zip(a, b):
                    if x.requires_grad:
                        torch.testing.assert_close(y.grad.cpu(), x.grad, rtol=tol, atol=tol)


def test_gpu_equals_cpu_on_long_rows_of_three_dimensional_broadcasts():
    # Rows of at least half a block take the GPU kernel's rowwise walk (offsets per row, then the
    # last stride per element); 3-D broadcasts keep three dimensions after coalescing.
    needs_cuda()
    for policy in POLICIES:
        cell = elementwise(CELL_SRC, inputs="z zb c f i g", differentiable="c f i g", partials=policy)
        for shapes in ([(3, 1, 1), (1, 5, 1), (3, 5, 300), (300,), (1, 5, 300), (3, 1, 300)],
                       [(2, 3, 1), (), (1, 1, 129), (2, 3, 129), (3, 129), (2, 1, 1)]):
            a = inputs(shapes, torch.float64, seed=7)
            b = [t.detach().cuda().requires_grad_(t.requires_grad) for t in a]
            ya, yb = cell(*a), cell(*b)
            torch.testing.assert_close(yb.cpu(), ya, rtol=1e-12, atol=1e-12)
            w = torch.randn(ya.shape, dtype=torch.float64)
            (ya * w).sum().backward()
            (yb * w.cuda()).sum().backward()
            for x, y in zip(a, b):
                if x.requires_grad:
                    torch.testing.assert_close(y.grad.cpu(), x.grad, rtol=1e-12, atol=1e-12)


def _fast_walk_cases(dtype):
    """(name, the cell's six inputs on the GPU, the walk and vectors the call should take) for
    dualcast.cuda's fast walk: odd lengths (a tail), views starting mid-vector, rows with broadcast
    columns, numbers (stride 0), and one call the general walk keeps."""
    gen = torch.Generator(device="cuda").manual_seed(11)

    def r(*shape):
        return torch.rand(shape, generator=gen, device="cuda", dtype=dtype) * 4 - 2

    def flag(*shape):
        return (torch.rand(shape, generator=gen, device="cuda") < 0.5).to(dtype)

    big = 4096 * 4096 + 3
    cases = [("1-D 8191", [flag(8191), flag(8191), r(8191), r(8191), r(8191), r(8191)], ("fast", True)),
             ("1-D from element 1", [flag(8192)[1:], flag(8191), r(8192)[1:], r(8191), r(8192)[1:], r(8191)],
              ("fast", False)),
             ("x[:, 1:] rows, [n, 1] flags", [flag(513, 1), flag(513, 1), r(513, 1025)[:, 1:], r(1024),
                                             r(513, 1025)[:, 1:], r(513, 1024)], ("fast", False)),
             ("aligned rows, [n, 1] flags", [flag(64, 1), flag(64, 1), r(64, 2048), r(2048), r(64, 2048),
                                             r(64, 1)], ("fast", True)),
             ("rows of 1031 (tails)", [flag(37, 1), flag(37, 1031), r(37, 1031), r(37, 1), r(37, 1031),
                                       r(1031)], ("fast", False)),
             ("numbers", [0.0, 1.0, r(4099), r(4099), r(4099), r(4099)], ("fast", True)),
             ("short rows", [flag(300, 1), flag(300, 1), r(300, 100), r(100), r(300, 100), r(300, 100)],
              ("flat", False))]
    if dtype == torch.float32:
        cases.append(("1-D 4096^2 + 3", [flag(big), flag(big), r(big), r(big), r(big), r(big)], ("fast", True)))
    return cases


def _walk_of(args, dtype):
    """The walk and vector choice dualcast.cuda makes for these inputs (freshly allocated outputs
    are aligned): the case list above says what it tests, this checks that it does."""
    from dualcast import cuda_kernel, jit
    from dualcast.torch_library import strides_over
    ts = [a for a in args if isinstance(a, torch.Tensor)]
    shape = torch.broadcast_shapes(*[t.shape for t in ts])
    tensors = [a if isinstance(a, torch.Tensor) else torch.zeros((), dtype=dtype) for a in args]
    p = cuda_kernel.plan(*jit.coalesce(list(shape), [strides_over(t, shape) for t in tensors]),
                         torch.tensor([], dtype=dtype).element_size(), 132)
    addrs = [t.data_ptr() if isinstance(a, torch.Tensor) else 0 for t, a in zip(tensors, args)]
    return p.walk, cuda_kernel.vector_ok(p, addrs, [0], [])


def test_gpu_fast_walk_equals_the_general_walk_bit_for_bit_and_the_cpu():
    # The fast walk evaluates the same body on the same numbers as the general walk: values,
    # gradients (recompute) and stored partials (store) must be equal bit for bit.
    needs_cuda()
    from dualcast import cuda
    try:
        for policy in POLICIES:
            cell = elementwise(CELL_SRC, inputs="z zb c f i g", differentiable="c f i g", partials=policy)
            for dtype, tol in ((torch.float32, 2e-6), (torch.float64, 1e-12)):
                for name, args, want in _fast_walk_cases(dtype):
                    assert _walk_of(args, dtype) == want, (name, _walk_of(args, dtype), want)
                    results = []
                    for fast in (True, False):
                        cuda.set_fast_walk(fast)
                        xs = [a.detach().requires_grad_(k >= 2) if isinstance(a, torch.Tensor) else a
                              for k, a in enumerate(args)]  # views stay views (their strides, offset)
                        y = cell(*xs)
                        w = torch.linspace(-1, 1, y.numel(), device="cuda", dtype=dtype).reshape(y.shape)
                        (y * w).sum().backward()
                        results.append([y.detach()] + [x.grad for x in xs[2:] if isinstance(x, torch.Tensor)])
                    for a, b in zip(*results):
                        assert torch.equal(a, b), (policy, dtype, name, (a - b).abs().max().item())
                    if results[0][0].numel() < 10 ** 6:
                        cpu = [a.detach().cpu().requires_grad_(k >= 2) if isinstance(a, torch.Tensor) else a
                               for k, a in enumerate(args)]
                        y = cell(*cpu)
                        (y * w.cpu()).sum().backward()
                        torch.testing.assert_close(results[0][0].cpu(), y.detach(), rtol=tol, atol=tol)
                        gtol = 1e-4 if dtype == torch.float32 else 1e-10  # sums over up to 513 rows
                        for got, x in zip(results[0][1:], [x for x in cpu[2:] if isinstance(x, torch.Tensor)]):
                            torch.testing.assert_close(got.cpu(), x.grad, rtol=gtol, atol=gtol)
    finally:
        cuda.set_fast_walk(True)


def test_gpu_fast_walk_with_several_outputs_bit_for_bit():
    needs_cuda()
    from dualcast import cuda
    f = elementwise("return {sigmoid(a) * b, tanh(a - c), exp(c) * b + a};", inputs="a b c",
                    differentiable="a c", outputs=3)
    try:
        for dtype in (torch.float32, torch.float64):
            base = torch.randn(257, 2049, device="cuda", dtype=dtype)
            for a, b, c in ((torch.randn(8191, device="cuda", dtype=dtype), 0.5,
                             torch.randn(8191, device="cuda", dtype=dtype)),
                            (base[:, 1:], torch.randn(257, 1, device="cuda", dtype=dtype), base[:, :-1]),
                            (torch.randn(257, 2048, device="cuda", dtype=dtype), torch.randn(2048, device="cuda",
                             dtype=dtype), torch.randn(257, 2048, device="cuda", dtype=dtype))):
                results = []
                for fast in (True, False):
                    cuda.set_fast_walk(fast)
                    xa, xc = a.detach().requires_grad_(), c.detach().requires_grad_()
                    ys = f(xa, b, xc)
                    sum(((k + 1.5) * y).sum() for k, y in enumerate(ys)).backward()
                    results.append([y.detach() for y in ys] + [xa.grad, xc.grad])
                for u, v in zip(*results):
                    assert torch.equal(u, v), (dtype, a.shape, (u - v).abs().max().item())
    finally:
        cuda.set_fast_walk(True)


def test_gradcheck_on_the_gpu_in_float64():
    needs_cuda()
    cell = elementwise(CELL_SRC, inputs="z zb c f i g", differentiable="c f i g")
    args = [t.detach().cuda().requires_grad_(t.requires_grad) for t in inputs(SHAPES[1], torch.float64, seed=5)]
    assert torch.autograd.gradcheck(lambda *a: cell(*a), args, eps=1e-6, atol=1e-7)


def test_large_odd_sizes_on_the_gpu_and_a_side_stream():
    needs_cuda()
    f = elementwise("if (x > 0) return x * y; return y - x;", inputs="x y", differentiable="x y")
    x = torch.randn(1237, 4099, device="cuda", requires_grad=True)
    y = torch.randn(4099, device="cuda", requires_grad=True)
    y_old = y.detach().clone()
    big = torch.randn(4096, 4096, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())  # y, y_old and big are ready
    with torch.cuda.stream(s):  # the kernel must run on PyTorch's current stream, this one
        # Slow work on this stream first, then new values of y: a kernel queued on another stream
        # would read the old y (PyTorch's side streams do not wait for the default stream).
        torch.cuda._sleep(50_000_000)
        for _ in range(20):
            big = big @ big * 1e-3
        with torch.no_grad():
            y.mul_(2.0 + 0.0 * big[0, 0])
        out = f(x, y)
        out.sum().backward()
    torch.cuda.current_stream().wait_stream(s)
    y_new = 2.0 * y_old
    want = torch.where(x > 0, x * y_new, y_new - x)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(x.grad, torch.where(x > 0, y_new.expand_as(x), -torch.ones_like(x)))
    torch.testing.assert_close(y.grad, torch.where(x > 0, x, torch.ones_like(x)).sum(0), rtol=1e-5, atol=1e-3)


def test_a_tensor_on_another_device_is_refused():
    needs_cuda()
    f = elementwise("return x + y;", inputs="x y", differentiable="x")
    try:
        f(torch.zeros(2, device="cuda"), torch.zeros(2))
    except ValueError as e:
        assert "input y is on cpu, input x on cuda:0" in str(e), str(e)
    else:
        raise AssertionError("mixed devices were accepted")


def test_a_call_can_be_captured_in_a_cuda_graph():
    # Nothing in a call synchronises or allocates outside PyTorch's allocator: forward and backward
    # replay from a torch.cuda.graph with new input values.
    needs_cuda()
    for rows, cols in ((513, 77), (512, 1024)):  # the general walk; the fast walk with vectors
        _capture_and_replay(rows, cols)


def _capture_and_replay(rows, cols):
    f = elementwise("if (x > 0) return x * y + 0.5; return y - x;", inputs="x y", differentiable="x y")
    x = torch.randn(rows, cols, device="cuda", requires_grad=True)
    y = torch.randn(cols, device="cuda", requires_grad=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compiles and loads the kernels before the capture
        for _ in range(2):
            f(x, y).sum().backward()
    torch.cuda.current_stream().wait_stream(side)
    x.grad = y.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = f(x, y)
        out.sum().backward()
    with torch.no_grad():
        x.copy_(torch.randn_like(x))
        y.copy_(torch.randn_like(y))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, torch.where(x > 0, x * y + 0.5, y - x))
    torch.testing.assert_close(x.grad, torch.where(x > 0, y.expand_as(x), -torch.ones_like(x)))


def test_the_pytorch_hmlstm_trains_alike_with_the_dualcast_and_the_eager_cell():
    # experiments/torch_elementwise/train_hmlstm.py, a few steps at a tiny size: the same parameters
    # and minibatches give the same bits/char curve with either cell (float32 rounding apart).
    root = os.path.normpath(os.path.join(HERE, "..", ".."))
    if not os.path.isdir("/usr/share/common-licenses"):
        from skip import Skip
        raise Skip("no /usr/share/common-licenses corpus")
    sys.path.insert(0, os.path.join(root, "experiments", "torch_elementwise"))
    import types
    import train_hmlstm as th
    o = types.SimpleNamespace(steps=4, hidden=8, batch=4, seq=6, lr=2e-3, slope_final=5.0, data_seed=7)
    train_text, valid_text = th.load_corpus("/usr/share/common-licenses")
    valid = [torch.tensor(th.windows(valid_text, [b * o.seq for b in range(4)], o.seq))]
    P0 = th.initial_params(o.hidden, 64, 1)
    runs = [th.train(kind, o, P0, train_text, valid, torch.device("cpu")) for kind in ("dualcast", "eager")]
    for a, b in zip(runs[0]["curve"], runs[1]["curve"]):
        assert abs(a["valid_bpc"] - b["valid_bpc"]) <= 1e-5, (a, b)
    assert runs[0]["curve"][-1]["valid_bpc"] < runs[0]["curve"][0]["valid_bpc"]
