"""The compiled launcher (dualcast.native, csrc/launcher.cpp) against the Python launcher it stands in
for: the same kernels, so the same bits, for values and gradients on every broadcast pattern, several
outputs, other strides, and the CPU and the GPU; the calls it leaves to Python; the in-place check and
the errors. A signature's first call always takes the Python path (it decides what the compiled one
replays), so each comparison calls twice and checks which path ran (Function.calls). Skips itself
where PyTorch is not installed."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

os.environ.setdefault("DUALCAST_NATIVE", "wait")

from skip import import_torch  # noqa: E402

torch = import_torch()

from dualcast import native  # noqa: E402
from dualcast.torch import elementwise, launcher, set_native  # noqa: E402
from test_torch import CELL_SRC, SHAPES, expect_a_changed_input_refused, inputs, needs_cuda  # noqa: E402


def native_calls(f):
    return f._native.calls if f._native is not None else 0


def run(f, args, weights=None):
    """f(*args), then a backward with fixed weights on each output: the outputs and every input's
    gradient (None where it has none), the gradients cleared afterwards."""
    outs = f(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    loss = 0
    for m, o in enumerate(outs):
        w = weights[m] if weights is not None else torch.linspace(-1, 1, o.numel(), dtype=o.dtype,
                                                                    device=o.device).reshape(o.shape)
        if w is not None:
            loss = loss + (o * w).sum()
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        loss.backward()
    grads = [a.grad.clone() if isinstance(a, torch.Tensor) and a.grad is not None else None for a in args]
    for a in args:
        if isinstance(a, torch.Tensor):
            a.grad = None
    return [o.detach().clone() for o in outs], grads


def same_bits(a, b, what):
    (oa, ga), (ob, gb) = a, b
    for x, y in zip(oa, ob):
        assert torch.equal(x, y), what
    for x, y in zip(ga, gb):
        assert (x is None) == (y is None), what
        if x is not None:
            assert torch.equal(x, y), (what, (x - y).abs().max())


def compiled_equals_python(f, args, what, weights=None):
    """The second call of args' signature runs compiled; the same call with set_native(False) runs
    the Python launcher. Both give the same bits."""
    run(f, args, weights)  # the signature's first call: the Python path, which hands it over
    before = native_calls(f)
    compiled = run(f, args, weights)
    assert native_calls(f) == before + 1, ("the compiled launcher did not take the call", what)
    set_native(False)
    try:
        python = run(f, args, weights)
    finally:
        set_native(True)
    same_bits(compiled, python, what)
    return compiled


def test_the_compiled_launcher_builds_and_says_which_launcher_calls_take():
    f = elementwise("return x * y;", inputs="x y", differentiable="x y")
    assert native.module() is not None, launcher()
    assert launcher().startswith("compiled: "), launcher()
    set_native(False)
    try:
        assert launcher() == "python: dualcast.torch.set_native(False)", launcher()
    finally:
        set_native(True)
    x = torch.ones(3)
    f(x, x)
    f(x, x)
    assert native_calls(f) == 1


def test_compiled_equals_python_bit_for_bit_on_every_broadcast_pattern():
    cell = elementwise(CELL_SRC, inputs="z zb c f i g", differentiable="c f i g")
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        for shapes in SHAPES:
            compiled_equals_python(cell, inputs(shapes, dtype, seed=3), (dtype, shapes))


def test_compiled_equals_python_on_other_strides_of_the_same_shapes():
    # Transposed, sliced and expanded views: each layout is its own launch.
    f = elementwise("if (x > y) return x * y; return x - 2 * y;", inputs="x y", differentiable="x y")
    base = torch.randn(9, 8, dtype=torch.float64)
    y = torch.randn(8, 9, dtype=torch.float64)
    for x, yy in ((base, y.t()), (base.t().contiguous().t(), y.t()), (base[:, ::2], y.t()[:, 1::2]),
                  (base[:1].expand(9, 8), y.t())):
        x = x.detach().requires_grad_()
        yy = yy.detach().requires_grad_()
        compiled_equals_python(f, [x, yy], (x.stride(), yy.stride()))


def test_several_outputs_and_an_output_without_gradient():
    f = elementwise("return {x * y, sin(x) + y};", inputs="x y", differentiable="x y", outputs=2)
    x = torch.randn(5, 6, requires_grad=True)
    y = torch.randn(6, requires_grad=True)
    compiled_equals_python(f, [x, y], "both outputs")
    w = torch.linspace(-1, 1, 30).reshape(5, 6)
    compiled_equals_python(f, [x, y], "the second output unused", weights=[None, w])
    compiled_equals_python(f, [x, y], "the first output unused", weights=[w, None])


def test_gradcheck_in_float64_through_the_compiled_launcher():
    cell = elementwise(CELL_SRC, inputs="z zb c f i g", differentiable="c f i g")
    for shapes in SHAPES:
        args = inputs(shapes, torch.float64, seed=5)
        cell(*args)  # hands the signature over: gradcheck's calls run compiled
        before = native_calls(cell)
        assert torch.autograd.gradcheck(lambda *a: cell(*a), args, eps=1e-6, atol=1e-7), shapes
        assert native_calls(cell) > before, shapes


def test_calls_the_compiled_launcher_leaves_to_python_still_work():
    # A number among the inputs, inputs of two dtypes, stored partials and a gradient wanted only by
    # an input that is not differentiated: the Python path, every time.
    f = elementwise("return x * y + 1;", inputs="x y", differentiable="x")
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    for args in ([x, 2.0], [x, torch.ones(4, dtype=torch.float32)], [x.detach(), torch.ones(4, requires_grad=True)]):
        for _ in range(2):
            out = f(*args)
        want = args[0] * (args[1] if isinstance(args[1], torch.Tensor) else torch.tensor(args[1])) + 1
        torch.testing.assert_close(out, want.to(out.dtype), rtol=0, atol=1e-12)
    assert native_calls(f) == 0
    stored = elementwise("return x * y;", inputs="x y", differentiable="x y", partials="store")
    y = torch.randn(4, dtype=torch.float64, requires_grad=True)
    for _ in range(2):
        stored(x, y).sum().backward()
    assert native_calls(stored) == 0
    torch.testing.assert_close(x.grad, 2 * y.detach())


def test_a_call_without_gradients_makes_no_autograd_node():
    f = elementwise("return x * y;", inputs="x y", differentiable="x y")
    x = torch.randn(3, requires_grad=True)
    for _ in range(2):
        with torch.no_grad():
            out = f(x, x)
    assert out.grad_fn is None and not out.requires_grad
    for _ in range(2):
        out = f(x, x)
    assert out.grad_fn is not None and out.requires_grad
    assert native_calls(f) == 2


def test_a_backward_after_an_input_changed_in_place_is_refused_on_the_compiled_path():
    f = elementwise("return x * y;", inputs="x y", differentiable="x")
    expect_a_changed_input_refused(f, calls_before=1)
    assert native_calls(f) == 1


def test_create_graph_gives_the_first_derivative_and_a_second_one_is_a_clear_error():
    # As the Python path's once_differentiable: with create_graph=True and an incoming gradient that
    # wants a gradient itself, the first derivative, and an error only when it is differentiated.
    f = elementwise("return x * x;", inputs="x", differentiable="x")
    x = torch.randn(3, requires_grad=True)
    v = torch.ones(3, requires_grad=True)
    for compiled in (True, False):
        set_native(compiled)
        try:
            f(x)
            before = native_calls(f)
            (g,) = torch.autograd.grad(f(x), x, v, create_graph=True)
            assert native_calls(f) == before + compiled
            torch.testing.assert_close(g, 2 * x.detach())
            assert g.requires_grad
            try:
                g.sum().backward()
            except RuntimeError as e:
                want = "a second derivative" if compiled else "once_differentiable"
                assert want in str(e), str(e)
            else:
                raise AssertionError("a second derivative through the gradient kernel ran")
        finally:
            set_native(True)
    (g,) = torch.autograd.grad(f(x).sum(), x)  # still works afterwards
    torch.testing.assert_close(g, 2 * x.detach())


def test_saved_inputs_given_back_in_another_layout_read_right():
    # A saved-tensor hook may give the inputs back in another layout (a contiguous copy of a
    # transposed or expanded view): the gradient kernel's launch follows the layout it is given.
    f = elementwise("return x * y;", inputs="x y", differentiable="x y")
    for make in (lambda: torch.randn(6, 5, dtype=torch.float64).t(),
                 lambda: torch.randn(1, 7, dtype=torch.float64).expand(5, 7)):
        x = make().requires_grad_()
        y = torch.randn(x.shape, dtype=torch.float64, requires_grad=True)
        want = [y.detach().clone(), x.detach().clone()]
        for hooked in (False, True, False):  # two calls each, the first of all on the Python path
            f(x, y)  # the signature handed over (the first time)
            if hooked:
                with torch.autograd.graph.saved_tensors_hooks(lambda t: t.contiguous().clone(), lambda t: t):
                    out = f(x, y)
            else:
                out = f(x, y)
            gx, gy = torch.autograd.grad(out.sum(), [x, y])
            torch.testing.assert_close(gx, want[0], rtol=0, atol=0)
            torch.testing.assert_close(gy, want[1], rtol=0, atol=0)
    assert native_calls(f) == 2 * (3 * 2 - 1)


def test_backward_passes_on_several_threads_with_new_gradient_layouts():
    # The gradient launches are kept per layout and dropped when there are many: a launch in use on
    # one thread must outlive another thread's clearing (run long enough to clear many times).
    import threading
    f = elementwise("return x * y + x;", inputs="x y", differentiable="x y")
    x = torch.randn(64, 64, requires_grad=True)
    y = torch.randn(64, 64, requires_grad=True)
    f(x, y)
    errors = []

    def work(seed):
        gen = torch.Generator().manual_seed(seed)
        try:
            for k in range(150):
                out = f(x, y)
                base = torch.randn(64 * (64 + 40), generator=gen)
                g = base.as_strided((64, 64), (64 + (k % 40 if seed % 2 else 0), 1))
                gx, gy = torch.autograd.grad(out, [x, y], g)
                if not (torch.equal(gx, g * (y.detach() + 1)) and torch.equal(gy, g * x.detach())):
                    errors.append(seed)
        except Exception as e:  # reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert native_calls(f) == 6 * 150


def test_the_backward_outlives_the_function_object():
    # The autograd node holds what its backward needs, not the Elementwise that made it.
    x = torch.randn(5, requires_grad=True)
    f = elementwise("return exp(x);", inputs="x", differentiable="x")
    f(x)
    out = f(x)
    del f
    import gc
    gc.collect()
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.exp(x.detach()))


def test_empty_and_zero_dimensional_calls():
    f = elementwise("return x * y;", inputs="x y", differentiable="x y")
    for shape in ((0, 3), ()):
        x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
        y = torch.randn(shape, dtype=torch.float64, requires_grad=True)
        compiled_equals_python(f, [x, y], shape)


def test_gpu_compiled_equals_python_and_the_cpu_bit_for_bit():
    needs_cuda()
    cell = elementwise(CELL_SRC, inputs="z zb c f i g", differentiable="c f i g")
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        for shapes in SHAPES + [[(257, 1), (257, 1), (257, 1030), (1030,), (257, 1030), (257, 1030)]]:
            args = [a.detach().to("cuda").requires_grad_(a.requires_grad) for a in inputs(shapes, dtype, seed=7)]
            compiled_equals_python(cell, args, ("cuda", dtype, shapes))


def test_gpu_compiled_launches_on_the_current_stream():
    # A side stream: the launch queues there, so a result read after that stream's work is right.
    needs_cuda()
    f = elementwise("return x * y + 1;", inputs="x y", differentiable="x y")
    x = torch.randn(4096, 513, device="cuda", requires_grad=True)
    y = torch.randn(513, device="cuda", requires_grad=True)
    f(x, y)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            out = f(x, y)
        out.sum().backward()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert native_calls(f) == 3
    torch.testing.assert_close(out, x * y + 1)
    torch.testing.assert_close(y.grad, x.detach().sum(0))


def test_a_launcher_that_cannot_be_built_leaves_the_python_launcher_and_says_why():
    # In a fresh process whose build folder cannot be made: a warning, launcher() says why, and the
    # function works through Python.
    import subprocess
    code = ("import sys, warnings; sys.path.insert(0, %r)\n"
            "import torch\n"
            "from dualcast.torch import elementwise, launcher\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    f = elementwise('return x * 2;', inputs='x', differentiable='x')\n"
            "print(launcher())\n"
            "print(any('did not build' in str(x.message) for x in w))\n"
            "print(f(torch.ones(2)).tolist(), f(torch.ones(2)).tolist())\n") % os.path.join(HERE, "..")
    env = dict(os.environ, DUALCAST_NATIVE="wait", DUALCAST_NATIVE_DIR="/proc/dualcast-cannot-be-made")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[-3].startswith("python: the compiled launcher did not build: "), lines
    assert lines[-2] == "True" and lines[-1] == "[2.0, 2.0] [2.0, 2.0]", lines


def test_an_unknown_launcher_mode_is_a_clear_error():
    old = os.environ.get("DUALCAST_NATIVE")
    os.environ["DUALCAST_NATIVE"] = "sometimes"
    try:
        elementwise("return x;", inputs="x", differentiable="x")
    except ValueError as e:
        assert "DUALCAST_NATIVE must be auto, wait or off, not 'sometimes'" in str(e), str(e)
    else:
        raise AssertionError("no error for DUALCAST_NATIVE=sometimes")
    finally:
        if old is None:
            os.environ.pop("DUALCAST_NATIVE", None)
        else:
            os.environ["DUALCAST_NATIVE"] = old
    assert elementwise("return x;", inputs="x", differentiable="x")(torch.ones(1)).tolist() == [1.0]
