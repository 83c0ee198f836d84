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
evaluates the body on dual numbers. With partials="recompute" (the default, as the C++ library's
Partials::recompute) it writes only the outputs, and the backward is a second fused kernel that
evaluates the body again and writes each differentiated input's gradient, sum_m grad_m * partial:
the bytes of two passes and nothing stored between them. With partials="store" the forward also
writes the partials and the backward multiplies them by the incoming gradients with torch ops (for
bodies too costly to evaluate twice). Either way a gradient is summed back to its input's shape. It
is a torch.autograd.Function; float32, float64, bfloat16 and float16 (the 16-bit types read into
float, computed in float, stored rounded once), on the CPU and on CUDA GPUs. On a GPU the kernels
run on PyTorch's current stream and never synchronise.
"""

import functools
import weakref

import torch

from . import jit, native, torch_library
from .torch_library import (compiled_kernel, describe, discard_compile, launch, same_dtype, start_compile,
                            value_kernel)

__all__ = ["elementwise", "Elementwise", "launcher", "set_native"]

_DTYPES = {t: name for name, t in torch_library.DTYPES.items()}  # torch dtype -> dualcast.jit's name
# read into float, computed in float, stored rounded once (jit.HALF_DTYPES)
_HALF = tuple(t for t, name in _DTYPES.items() if name in jit.HALF_DTYPES)


class Elementwise:
    """A compiled broadcast function: call it on tensors (or numbers) named by `inputs`."""

    def __init__(self, body, inputs, differentiable, outputs=1, partials="recompute"):
        self.spec = jit.Spec(body, inputs, differentiable, outputs)
        if partials not in ("recompute", "store"):
            raise ValueError("dualcast.elementwise: partials must be 'recompute' or 'store', not %r" % (partials,))
        self.partials = partials
        self._gradient = self.spec.gradient() if partials == "recompute" and self.spec.k else None
        self._kernels = {}  # (dtype, device, gradient wanted) -> the kernels a call launches
        self._calls = {}  # call signature -> _Call: the checks and decisions of a call, made once
        # Registered now, outside any torch.compile trace (which cannot run the registration).
        self._ops = torch_library.ops_for(self.spec) if self._gradient and torch_library.available() else None
        # The compiled launcher's table of this function's signatures (dualcast.native), made once the
        # launcher is loaded; until then, and for the calls it does not take, the Python path below.
        self._native = None
        _functions.add(self)
        if _native_enabled:
            native.start()

    def __repr__(self):
        s = self.spec
        return "dualcast.torch.elementwise(inputs=%r, differentiable=%r, outputs=%d)" % (
            " ".join(s.inputs), " ".join(s.differentiable), s.outputs)

    def __call__(self, *args):
        if self._ops is not None and _compiling():
            # torch.compile is tracing: the custom ops (one graph node each, shapes from their fakes).
            call = self._prepare(args)
            xs = [a if isinstance(a, torch.Tensor) else torch.full((), a, dtype=call.dtype, device=call.device)
                  for a in args]
            outs = self._ops[0](xs, _DTYPES[call.dtype])
            return outs[0] if self.spec.outputs == 1 else tuple(outs)
        # A signature the compiled launcher knows runs there, key to autograd node (None: not known).
        fn = self._native
        if fn is not None:
            outs = fn.call(args)
            if outs is not None:
                return outs
        elif native.MODULE is not None and _native_enabled:
            fn = self._native = native.MODULE.Function()
        # A model calls the function with the same kinds of arguments step after step: the checks, the
        # type promotion, the broadcast shape and the kernels are decided once per call signature (the
        # shape, dtype, device and requires_grad of each tensor, the type of each number, grad mode).
        try:  # all tensors, the common case (a list, not a generator: this runs on every call)
            key = (torch.is_grad_enabled(), *[(a.shape, a.dtype, a.device, a.requires_grad) for a in args])
        except AttributeError:  # a number among them
            key = (torch.is_grad_enabled(), *[(a.shape, a.dtype, a.device, a.requires_grad)
                                              if isinstance(a, torch.Tensor) else type(a) for a in args])
        call = self._calls.get(key)
        if call is None:
            call = self._prepare(args)
            if len(self._calls) >= _MAX_SIGNATURES:  # a model with ever new shapes: start again
                self._calls.clear()
            self._calls[key] = call
        if fn is not None and call.native:
            self._hand_over(fn, call, args)
        # No tensor that wants a gradient from autograd (grad mode off, or none requires one): the
        # kernel alone, without an autograd node.
        run = _values if call.plain else _Function.apply
        device = call.device
        if device.type == "cuda" and device.index != torch.cuda.current_device():
            # On another GPU than the current one: outputs, gradients and launches on the inputs'.
            with torch.cuda.device(device):
                outs = run(call, *args)
        else:
            outs = run(call, *args)
        return outs[0] if self.spec.outputs == 1 else outs

    def _hand_over(self, fn, call, args):
        """Gives the compiled launcher what this call decided, for the calls of its signature and
        layout after it (the kernels' launches for these strides; the gradient kernel's per layout of
        the incoming gradients, asked for by the backward)."""
        s = call.spec
        value = describe(call.value, call.shape, args, s.outputs, call.value.spec.n_partials)

        def gradient_launch(xs, gs):
            return describe(call.gradient, call.shape, list(xs) + list(gs), s.k, 0)

        wanted_k = [s.differentiable.index(s.inputs[i]) for i in call.wanted]
        fn.add(tuple(args), list(call.shape), value, s.outputs, s.k, not call.plain, call.wanted, wanted_k,
               [i in call.reduce for i in call.wanted], gradient_launch if call.wanted else None)

    def _prepare(self, args):
        """The checks and decisions of a call with these kinds of arguments (raises on bad ones)."""
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
                raise TypeError("%s: dtype %s is not supported yet (float32, float64, bfloat16, float16)"
                                % (who, dtype))
        shapes = [tuple(a.shape) if isinstance(a, torch.Tensor) else () for a in args]
        shape = _broadcast(shapes)
        if shape is None:
            raise ValueError("%s: the inputs' shapes do not broadcast: %s" % (
                who, ", ".join("%s %s" % (n, list(sh)) for n, sh in zip(s.inputs, shapes))))
        if len(shape) > jit.MAX_DIMS:
            raise ValueError("%s: a %d-dimensional broadcast shape %s; at most %d" % (who, len(shape), list(shape),
                                                                                    jit.MAX_DIMS))
        wanted = [i for i, (n, a) in enumerate(zip(s.inputs, args)) if n in s.differentiable and
                  isinstance(a, torch.Tensor) and a.requires_grad] if torch.is_grad_enabled() else []
        key = (dtype, device, bool(wanted))
        kernels = self._kernels.get(key)
        if kernels is None and not (self._ops is not None and _compiling()):
            name = _DTYPES[dtype]
            store = bool(wanted) and not self._gradient
            ahead = bool(self._gradient and wanted)
            if ahead:
                start_compile(self._gradient, name, device)  # side by side with the values kernel
            try:
                kernels = self._kernels[key] = (
                    compiled_kernel(s, name, device) if store else value_kernel(s, name, device),
                    compiled_kernel(self._gradient, name, device) if ahead else None,
                    store)
            except BaseException:  # a compile error, or Ctrl-C: nothing should wait for the gradient's compile
                if ahead:
                    try:
                        discard_compile(self._gradient, name, device)
                    except Exception:  # never in place of the error being raised
                        pass
                raise
        return _Call(s, kernels, shape, dtype, device, wanted,
                     [tuple(a.shape) if isinstance(a, torch.Tensor) else None for a in args],
                     [a.dtype if isinstance(a, torch.Tensor) else None for a in args],
                     plain=not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)))


class _Call:
    """What one call signature decided: the kernels (value, gradient, whether partials are stored),
    the broadcast shape and dtype, the inputs that want a gradient, the inputs' shapes and dtypes
    (the gradients are summed back to them and converted to them), whether the inputs go to the
    kernel as they are (all tensors of the kernel's dtype), and whether the call needs no autograd
    node (plain: no tensor input wants a gradient)."""

    __slots__ = ("spec", "value", "gradient", "store", "shape", "dtype", "device", "wanted", "wanted_k",
                 "input_shapes", "input_dtypes", "as_is", "plain", "reduce", "native")

    def __init__(self, spec, kernels, shape, dtype, device, wanted, input_shapes, input_dtypes, plain):
        self.spec = spec
        self.value, self.gradient, self.store = kernels if kernels is not None else (None, None, False)
        self.shape, self.dtype, self.device = shape, dtype, device
        self.wanted = wanted
        self.wanted_k = {spec.differentiable.index(spec.inputs[i]) for i in wanted}
        self.input_shapes, self.input_dtypes = input_shapes, input_dtypes
        self.as_is = all(d == dtype for d in input_dtypes)
        self.plain = plain
        # The wanted gradients that must be summed back to a broadcast input's shape or converted to
        # its dtype; the others are the gradient kernel's output as it is.
        self.reduce = [i for i in wanted if input_shapes[i] != shape or input_dtypes[i] != dtype]
        # The compiled launcher takes the common calls: tensors only, all of the kernel's dtype, and
        # either no autograd node or one whose backward is the gradient kernel. Numbers, conversions
        # and stored partials stay on the Python path.
        self.native = (self.value is not None and self.as_is and None not in input_shapes and
                       (plain or (self.gradient is not None and bool(wanted))) and
                       (device.type == "cpu" or native.CUDA_READY))


# Call signatures remembered per function before the memory is cleared.
_MAX_SIGNATURES = 256


def _broadcast(shapes):
    """The broadcast of the shapes as PyTorch's (None if they do not broadcast); plain Python: the
    library call costs more than the rest of a small call."""
    out = [1] * max(len(sh) for sh in shapes)
    for sh in shapes:
        for d, size in enumerate(sh, len(out) - len(sh)):
            if size != 1:
                if out[d] == 1:
                    out[d] = size
                elif out[d] != size:
                    return None
    return tuple(out)


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


_native_enabled = True
_functions = weakref.WeakSet()  # every Elementwise, for set_native


def set_native(enabled):
    """Whether calls may take the compiled launcher (True, the default, once dualcast.native has built
    it). False sends every call through the Python launcher, to compare the two or measure the
    difference; the signatures handed over so far are dropped when it is turned on again."""
    global _native_enabled
    _native_enabled = bool(enabled)
    if _native_enabled:
        native.start()
    _drop_native_tables()


def _drop_native_tables():
    for f in list(_functions):
        f._native = None


native.on_plans_changed(_drop_native_tables)


def launcher():
    """Which launcher calls take: 'compiled: <module>' or 'python: <why>' (dualcast.native)."""
    return native.status() if _native_enabled else "python: dualcast.torch.set_native(False)"


def elementwise(body, inputs, differentiable, outputs=1, partials="recompute"):
    """The body of a broadcast function as C++ source, its inputs and the differentiated ones (space-
    separated names) and its number of outputs: a callable on tensors (dualcast.jit says what the
    body may use). partials: "recompute" (a fused gradient kernel evaluates the body again) or
    "store" (the forward writes the partials for the backward)."""
    return Elementwise(body, inputs, differentiable, outputs, partials)


def _compiling():
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and hasattr(compiler, "is_compiling"):
        return compiler.is_compiling()
    return False


def _kernel_args(call, args):
    """The inputs as tensors of the kernel's dtype (read through their own strides: no expand). A
    number becomes a 0-dim tensor by a fill, not a copy from the host: no synchronisation, and it
    can be captured in a CUDA graph."""
    if call.as_is:
        return list(args)
    dtype, device = call.dtype, call.device
    return same_dtype([a if isinstance(a, torch.Tensor) else torch.full((), a, dtype=dtype, device=device)
                       for a in args], dtype)


def _values(call, *args):
    """The outputs of a call that needs no autograd node: the values kernel alone."""
    shape, dtype, device = call.shape, call.dtype, call.device
    outs = tuple(torch.empty(shape, dtype=dtype, device=device) for _ in range(call.spec.outputs))
    launch(call.value, device, shape, _kernel_args(call, args), outs, [None] * call.value.spec.n_partials)
    return outs


class _Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, call, *args):
        # call: the _Call of this signature. The value kernel computes values only unless partials are
        # stored (store: a gradient is wanted and there is no gradient kernel).
        s = call.spec
        xs = _kernel_args(call, args)
        outs = [torch.empty(call.shape, dtype=call.dtype, device=call.device) for _ in range(s.outputs)]
        parts = None
        if call.store:
            kk = max(s.k, 1)
            parts = [torch.empty(call.shape, dtype=call.dtype, device=call.device) if j in call.wanted_k else None
                     for _ in range(s.outputs) for j in range(kk)]
        launch(call.value, call.device, call.shape, xs, outs, parts if parts is not None else
               [None] * call.value.spec.n_partials)
        ctx.call = call
        if call.wanted and call.store:
            ctx.save_for_backward(*[p for p in parts if p is not None])
        elif call.wanted:  # the inputs themselves, so that PyTorch refuses a backward after one changed in place
            ctx.numbers = [None if isinstance(a, torch.Tensor) else a for a in args]
            ctx.save_for_backward(*[a for a in args if isinstance(a, torch.Tensor)])
        return tuple(outs)

    @staticmethod
    @torch.autograd.function.once_differentiable  # the partials are values: no second derivative
    def backward(ctx, *grad_outs):
        call = ctx.call
        s = call.spec
        grads = [None] * len(s.inputs)
        if not call.wanted:
            return (None,) + tuple(grads)
        if call.gradient is not None:
            saved = iter(ctx.saved_tensors)
            args = [next(saved) if n is None else n for n in ctx.numbers]
            xs = _kernel_args(call, args)
            if any(go is None for go in grad_outs):
                zero = torch.zeros((), dtype=call.dtype, device=call.device)
                grad_outs = [go if go is not None else zero for go in grad_outs]
            gs = same_dtype(list(grad_outs), call.dtype)
            full = [None] * s.k
            for i in call.wanted:
                full[s.differentiable.index(s.inputs[i])] = torch.empty(call.shape, dtype=call.dtype,
                                                                        device=call.device)
            launch(call.gradient, call.device, call.shape, xs + gs, full, [])
            for i in call.wanted:
                grads[i] = full[s.differentiable.index(s.inputs[i])]
        else:
            kk = max(s.k, 1)
            saved = iter(ctx.saved_tensors)
            parts = [next(saved) if j in call.wanted_k else None for _ in range(s.outputs) for j in range(kk)]
            acc = torch.float32 if call.dtype in _HALF else call.dtype  # 16-bit products and sums in float
            for i in call.wanted:
                j = s.differentiable.index(s.inputs[i])
                for m, go in enumerate(grad_outs):
                    if go is not None:
                        term = go.to(acc) * parts[m * kk + j].to(acc)
                        grads[i] = term if grads[i] is None else grads[i] + term
        # (The stored partials' products are in acc, so all of them go back to their inputs' dtype.)
        for i in call.reduce if call.gradient is not None else call.wanted:
            if grads[i] is not None:
                grads[i] = grads[i].sum_to_size(call.input_shapes[i]).to(call.input_dtypes[i])
        return (None,) + tuple(grads)
