"""dualcast.torch_library: an elementwise function as two torch.library custom ops (PyTorch >= 2.4),
so that torch.compile keeps it as one node of its graph, without a graph break.

dualcast.torch.Elementwise calls these ops only while torch.compile traces (eager calls take the
lighter torch.autograd.Function path: a custom op's dispatch costs host time on every call). The ops:

  dualcast::elementwise_<key>(Tensor[] xs, str dtype) -> Tensor[]           the outputs
  dualcast::elementwise_<key>_grad(Tensor[] xs, Tensor[] grads, bool[] wanted, str dtype) -> Tensor[]
                                                                           the wanted gradients

<key> names the function (its body, inputs, differentiated inputs and outputs). Their fake (meta)
implementations give the broadcast shapes without compiling or running anything, and the forward's
autograd formula calls the gradient op: the recompute policy (dualcast.jit's Spec.gradient), so
nothing but the inputs is saved. Both run on PyTorch's current stream and never synchronise, so a
compiled graph that contains them can also be captured in torch.cuda.graph.
"""

import hashlib
import threading
import warnings
from typing import List

import torch

from . import cuda, jit

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}

_ops = {}
_ops_lock = threading.Lock()  # registering the same function from two threads at once fails


def available():
    """Whether this PyTorch has torch.library.custom_op (2.4 and later)."""
    return hasattr(torch, "library") and hasattr(torch.library, "custom_op")


def compiled_kernel(spec, dtype_name, device):
    """dualcast's kernel of spec for tensors of dtype_name on device (compiled or cached)."""
    if device.type == "cuda":
        with torch.cuda.device(device):
            return cuda.compile_kernel(spec, dtype_name, torch.cuda.current_device())
    return jit.compile_kernel(spec, dtype_name)


def _arch(device):
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    return major * 10 + minor, index


def start_compile(spec, dtype_name, device):
    """Starts compiling spec's kernel for dtype_name on device on a worker thread, for a later
    compiled_kernel of it to wait for (jit.compile_ahead): the gradient kernel, while the first call
    compiles its values kernel."""
    if device.type == "cuda":
        arch, index = _arch(device)
        cuda.start_compile(spec, dtype_name, arch, index)
    else:
        jit.start_compile(spec, dtype_name)


def discard_compile(spec, dtype_name, device):
    """Drops start_compile's compile of spec (the call that wanted it failed)."""
    if device.type == "cuda":
        cuda.discard_compile(spec, dtype_name, _arch(device)[0])
    else:
        jit.discard_compile(spec, dtype_name)


def strides_over(t, shape):
    """t's element strides read over the broadcast `shape` (0 where t is broadcast), without a view."""
    sh, st = t.shape, t.stride()
    return [0] * (len(shape) - len(sh)) + [0 if n == 1 else s for n, s in zip(sh, st)]


def same_dtype(xs, dtype):
    return [x if x.dtype == dtype else x.to(dtype) for x in xs]


_dual_only = set()  # (body, ..., dtype, target): the values kernel does not compile there


def value_kernel(spec, dtype_name, device):
    """The kernel of spec's outputs alone: Spec.values() (no derivative computed), or, for a body
    that needs dual numbers as such (.val, .d: it does not compile on Num), spec's own kernel
    launched without partials, with a warning the first time. A body that compiles in neither form
    raises the dual kernel's error: the user's mistake, reported as itself."""
    key = (spec.body, tuple(spec.inputs), tuple(spec.differentiable), spec.outputs, dtype_name, device.type)
    if key not in _dual_only:
        try:
            return compiled_kernel(spec.values(), dtype_name, device)
        except jit.CompileError as e:
            dual = compiled_kernel(spec, dtype_name, device)  # raises if the body is simply wrong
            _dual_only.add(key)
            warnings.warn("dualcast.elementwise: the body does not compile on plain numbers, so its forward "
                          "evaluates dual numbers and drops the derivatives (slower): %s" % str(e).split("\n")[0])
            return dual
    return compiled_kernel(spec, dtype_name, device)


def plan_for(kernel, shape, inputs, n_out, n_partials):
    """The launch of `kernel` over the broadcast `shape` for inputs of these shapes and strides (None:
    an empty call on a GPU), made ready once per layout: a model's every step only reads addresses."""
    key = (shape, tuple([(x.shape, x.stride()) for x in inputs]), n_out, n_partials)
    return kernel.plans.by_layout(key, shape, lambda: [strides_over(x, shape) for x in inputs], n_out, n_partials)


def describe(kernel, shape, inputs, n_out, n_partials):
    """plan_for's launch as dualcast.native's compiled launcher takes it (its describe())."""
    go = plan_for(kernel, shape, inputs, n_out, n_partials)
    return ("none",) if go is None else go.describe()


def launch(kernel, device, shape, inputs, outputs, partials):
    """One kernel over the broadcast `shape` (a tuple): inputs (of the kernel's dtype) through their
    strides, contiguous outputs (None: not written)."""
    go = plan_for(kernel, shape, inputs, len(outputs), len(partials))
    ins = [x.data_ptr() for x in inputs]
    outs = [o.data_ptr() if o is not None else 0 for o in outputs]
    parts = [p.data_ptr() if p is not None else 0 for p in partials]
    if device.type == "cuda":
        if go is not None:  # None: an empty call
            go(_current_stream(device), ins, outs, parts)
    else:
        go(ins, outs, parts)


def _current_stream(device):
    """PyTorch's current stream on `device` as a CUstream handle (the raw call skips making a
    torch.cuda.Stream object per launch; it is what torch.compile's generated code calls)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(device.index if device.index is not None else torch.cuda.current_device())
    return torch.cuda.current_stream(device).cuda_stream


def ops_for(spec):
    """(forward op, gradient op) of a jit.Spec with differentiated inputs, registered once."""
    key = hashlib.sha256(repr((spec.body, spec.inputs, spec.differentiable, spec.outputs)).encode()).hexdigest()[:20]
    with _ops_lock:
        if key not in _ops:
            _ops[key] = _register(spec, "dualcast::elementwise_" + key)
        return _ops[key]


def _register(spec, name):
    grad_spec = spec.gradient()
    kernels = {}  # (role, dtype name, device) -> kernel: an op call does not regenerate the source

    def kernel_of(role, dtype, device):
        key = (role, dtype, device)
        if key not in kernels:
            kernels[key] = (value_kernel(spec, dtype, device) if role == "values"
                            else compiled_kernel(grad_spec, dtype, device))
        return kernels[key]

    @torch.library.custom_op(name, mutates_args=())
    def forward(xs: List[torch.Tensor], dtype: str) -> List[torch.Tensor]:
        shape = torch.broadcast_shapes(*[x.shape for x in xs])
        device, dt = xs[0].device, DTYPES[dtype]
        outs = [torch.empty(shape, dtype=dt, device=device) for _ in range(spec.outputs)]
        k = kernel_of("values", dtype, device)
        launch(k, device, shape, same_dtype(xs, dt), outs, [None] * k.spec.n_partials)
        return outs

    @forward.register_fake
    def _(xs, dtype):
        shape = torch.broadcast_shapes(*[x.shape for x in xs])
        return [xs[0].new_empty(shape, dtype=DTYPES[dtype]) for _ in range(spec.outputs)]

    @torch.library.custom_op(name + "_grad", mutates_args=())
    def gradient(xs: List[torch.Tensor], grads: List[torch.Tensor], wanted: List[bool],
                 dtype: str) -> List[torch.Tensor]:
        shape = torch.broadcast_shapes(*[x.shape for x in xs])
        device, dt = xs[0].device, DTYPES[dtype]
        full = [torch.empty(shape, dtype=dt, device=device) if w else None for w in wanted]
        launch(kernel_of("gradient", dtype, device), device, shape,
               same_dtype(list(xs) + list(grads), dt), full, [])
        return [g for g in full if g is not None]

    @gradient.register_fake
    def _(xs, grads, wanted, dtype):
        shape = torch.broadcast_shapes(*[x.shape for x in xs])
        return [xs[0].new_empty(shape, dtype=DTYPES[dtype]) for w in wanted if w]

    def setup_context(ctx, inputs, output):
        xs, dtype = inputs
        ctx.save_for_backward(*xs)
        ctx.dtype = dtype
        ctx.wanted = [n in spec.differentiable and x.requires_grad for n, x in zip(spec.inputs, xs)]

    def backward(ctx, grad_outs):
        xs = list(ctx.saved_tensors)
        dt = DTYPES[ctx.dtype]
        gs = [g if g is not None else torch.zeros((), dtype=dt, device=xs[0].device) for g in grad_outs]
        wanted_k = [w for n, w in zip(spec.inputs, ctx.wanted) if n in spec.differentiable]
        got = iter(gradient(xs, gs, wanted_k, ctx.dtype))
        # The wanted gradients come in the inputs' order (a Spec keeps its differentiated inputs so).
        return [next(got).sum_to_size(x.shape).to(x.dtype) if w else None for x, w in zip(xs, ctx.wanted)], None

    forward.register_autograd(backward, setup_context=setup_context)
    return forward, gradient
