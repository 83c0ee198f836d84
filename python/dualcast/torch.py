"""dualcast.torch: a fused mixed-mode elementwise function for PyTorch tensors.

    from dualcast.torch import elementwise
    cell = elementwise('''
        if (z == 1) return sigmoid(i) * tanh(g);
        if (zb == 0) return c;
        return sigmoid(f) * c + sigmoid(i) * tanh(g);
    ''', inputs="z zb c f i g", differentiable="c f i g")
    c_new = cell(z, zb, c, f, i, g)     # broadcast as PyTorch does
    c_new.sum().backward()              # gradients for c, f, i, g

The forward pass is one compiled kernel (dualcast.jit on the CPU, dualcast.cuda on a GPU) that
evaluates the body on dual numbers and writes the outputs and their partials; the backward multiplies
the incoming gradients by the partials and sums them back to each input's shape (what the C++
library's tape does). It is a torch.autograd.Function; float32 and float64. On a GPU the kernel runs
on PyTorch's current stream and never synchronises.
"""

import functools

import torch

from . import cuda, jit

__all__ = ["elementwise", "Elementwise"]

_DTYPES = {torch.float32: "float32", torch.float64: "float64"}


class Elementwise:
    """A compiled broadcast function: call it on tensors (or numbers) named by `inputs`."""

    def __init__(self, body, inputs, differentiable, outputs=1):
        self.spec = jit.Spec(body, inputs, differentiable, outputs)

    def __repr__(self):
        s = self.spec
        return "dualcast.torch.elementwise(inputs=%r, differentiable=%r, outputs=%d)" % (
            " ".join(s.inputs), " ".join(s.differentiable), s.outputs)

    def __call__(self, *args):
        s = self.spec
        who = "dualcast.elementwise"
        if len(args) != len(s.inputs):
            raise TypeError("%s: takes %d inputs (%s), got %d" % (who, len(s.inputs), " ".join(s.inputs), len(args)))
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if not tensors:
            raise TypeError("%s: at least one input must be a tensor" % who)
        first = next(n for n, a in zip(s.inputs, args) if isinstance(a, torch.Tensor))
        device = tensors[0].device
        for name, a in zip(s.inputs, args):
            if isinstance(a, torch.Tensor):
                if a.device != device:
                    raise ValueError("%s: input %s is on %s, input %s on %s" % (who, name, a.device, first, device))
            elif not isinstance(a, (int, float)) or isinstance(a, bool):
                raise TypeError("%s: input %s is a %s, not a tensor or a number" % (who, name, type(a).__name__))
        if device.type not in ("cpu", "cuda"):
            raise NotImplementedError("%s: tensors on %s: dualcast runs on the CPU and CUDA GPUs" % (who, device))
        dtype = _result_dtype(tensors)
        if dtype.is_complex:
            raise TypeError("%s: complex tensors (%s) are not supported" % (who, dtype))
        if dtype not in _DTYPES:
            if not dtype.is_floating_point:
                dtype = torch.get_default_dtype()
            else:
                raise TypeError("%s: dtype %s is not supported yet (float32, float64)" % (who, dtype))
        shapes = [tuple(a.shape) if isinstance(a, torch.Tensor) else () for a in args]
        try:
            shape = torch.broadcast_shapes(*shapes)
        except RuntimeError:
            raise ValueError("%s: the inputs' shapes do not broadcast: %s" % (
                who, ", ".join("%s %s" % (n, list(sh)) for n, sh in zip(s.inputs, shapes)))) from None
        if len(shape) > jit.MAX_DIMS:
            raise ValueError("%s: a %d-dimensional broadcast shape %s; at most %d" % (who, len(shape), list(shape),
                                                                                    jit.MAX_DIMS))
        if device.type == "cuda":
            with torch.cuda.device(device):  # outputs, partials and the launch on the inputs' GPU
                kernel = cuda.compile_kernel(s, _DTYPES[dtype], torch.cuda.current_device())
                outs = _Function.apply(kernel, tuple(shape), dtype, device, *args)
        else:
            kernel = jit.compile_kernel(s, _DTYPES[dtype])
            outs = _Function.apply(kernel, tuple(shape), dtype, device, *args)
        return outs[0] if s.outputs == 1 else outs


def _result_dtype(tensors):
    """PyTorch's type promotion over any number of tensors (torch.result_type takes two): tensors
    with dimensions decide; a 0-dim tensor counts only when it is of a higher category (a float
    scalar tensor with integer tensors). A plain number never promotes (the caller leaves them out)."""
    dims = [t.dtype for t in tensors if t.dim() > 0]
    zero = [t.dtype for t in tensors if t.dim() == 0]
    dtype = functools.reduce(torch.promote_types, dims or zero)
    if dims and zero:
        def category(d):
            return 3 if d.is_complex else 2 if d.is_floating_point else 1 if d != torch.bool else 0
        higher = [d for d in zero if category(d) > category(dtype)]
        if higher:
            dtype = functools.reduce(torch.promote_types, higher)
    return dtype


def elementwise(body, inputs, differentiable, outputs=1):
    """The body of a broadcast function as C++ source, its inputs and the differentiated ones (space-
    separated names) and its number of outputs: a callable on tensors (dualcast.jit says what the
    body may use)."""
    return Elementwise(body, inputs, differentiable, outputs)


class _Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, kernel, shape, dtype, device, *args):
        s = kernel.spec
        xs = []
        for a in args:
            t = a if isinstance(a, torch.Tensor) else torch.tensor(a, dtype=dtype, device=device)
            xs.append(t.detach().to(dtype).expand(shape))
        outs = [torch.empty(shape, dtype=dtype, device=device) for _ in range(s.outputs)]
        kk = max(s.k, 1)
        wanted = [i for i, n in enumerate(s.inputs) if n in s.differentiable and
                  isinstance(args[i], torch.Tensor) and args[i].requires_grad]
        wanted_k = {s.differentiable.index(s.inputs[i]) for i in wanted}
        parts = [torch.empty(shape, dtype=dtype, device=device) if (j in wanted_k and s.k > 0) else None
                 for _ in range(s.outputs) for j in range(kk)]
        launch = (list(shape), [x.data_ptr() for x in xs], [list(x.stride()) for x in xs],
                  [o.data_ptr() for o in outs], [p.data_ptr() if p is not None else 0 for p in parts])
        if device.type == "cuda":
            kernel.run(torch.cuda.current_stream(device).cuda_stream, *launch)
        else:
            kernel.run(*launch)
        ctx.spec = s
        ctx.input_shapes = [tuple(a.shape) if isinstance(a, torch.Tensor) else None for a in args]
        ctx.input_dtypes = [a.dtype if isinstance(a, torch.Tensor) else None for a in args]
        ctx.wanted = wanted
        ctx.save_for_backward(*[p for p in parts if p is not None])
        ctx.layout = [p is not None for p in parts]
        return tuple(outs)

    @staticmethod
    @torch.autograd.function.once_differentiable  # the partials are values: no second derivative
    def backward(ctx, *grad_outs):
        s = ctx.spec
        kk = max(s.k, 1)
        saved = iter(ctx.saved_tensors)
        parts = [next(saved) if present else None for present in ctx.layout]
        grads = [None] * len(s.inputs)
        for i in ctx.wanted:
            j = s.differentiable.index(s.inputs[i])
            g = None
            for m, go in enumerate(grad_outs):
                if go is None:
                    continue
                term = go * parts[m * kk + j]
                g = term if g is None else g + term
            if g is not None:
                grads[i] = g.sum_to_size(ctx.input_shapes[i]).to(ctx.input_dtypes[i])
        return (None, None, None, None) + tuple(grads)
