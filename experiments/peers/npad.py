"""A tiny reverse-mode autodiff over numpy arrays (test-only).

It exists so that the backend-generic model code in ``hmlstm.py`` -- the very code the PyTorch and
JAX peers run -- can be executed and differentiated on a machine that has neither framework, and
compared against the hand-written reference in ``reference.py`` and against finite differences.

Only the operations ``hmlstm.py`` needs are implemented.  Comparisons on a ``Var`` return plain
boolean arrays (no gradient), ``NPOps.sg`` returns a plain array (stop_gradient).
"""

import numpy as np


def _unbroadcast(g, shape):
    """Sum g over the axes along which an operand of `shape` was broadcast."""
    shape = tuple(shape)
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    for ax, n in enumerate(shape):
        if n == 1 and g.shape[ax] != 1:
            g = g.sum(axis=ax, keepdims=True)
    return g


class Var:
    __array_ufunc__ = None  # make `ndarray op Var` defer to Var's reflected operators
    __hash__ = object.__hash__

    def __init__(self, value, parents=(), grad_fns=()):
        self.value = np.asarray(value)
        self.parents = tuple(parents)
        self.grad_fns = tuple(grad_fns)
        self.grad = None

    # --- array-like attributes -------------------------------------------------------------
    @property
    def shape(self):
        return self.value.shape

    @property
    def dtype(self):
        return self.value.dtype

    @property
    def ndim(self):
        return self.value.ndim

    def __repr__(self):
        return "Var(shape=%s)" % (self.value.shape,)

    # --- arithmetic -------------------------------------------------------------------------
    def __add__(self, o):
        return add(self, o)

    def __radd__(self, o):
        return add(o, self)

    def __sub__(self, o):
        return add(self, neg(o))

    def __rsub__(self, o):
        return add(o, neg(self))

    def __mul__(self, o):
        return mul(self, o)

    def __rmul__(self, o):
        return mul(o, self)

    def __neg__(self):
        return neg(self)

    def __matmul__(self, o):
        return matmul(self, o)

    def __rmatmul__(self, o):
        return matmul(o, self)

    def __getitem__(self, idx):
        return getitem(self, idx)

    # comparisons: plain boolean arrays, no gradient
    def __gt__(self, o):
        return self.value > _val(o)

    def __ge__(self, o):
        return self.value >= _val(o)

    def __lt__(self, o):
        return self.value < _val(o)

    def __le__(self, o):
        return self.value <= _val(o)

    def __eq__(self, o):
        return self.value == _val(o)

    def __ne__(self, o):
        return self.value != _val(o)


def _val(x):
    return x.value if isinstance(x, Var) else np.asarray(x)


def _var(x):
    return x if isinstance(x, Var) else Var(x)


def add(a, b):
    a, b = _var(a), _var(b)
    return Var(a.value + b.value, (a, b),
               (lambda g: _unbroadcast(g, a.shape), lambda g: _unbroadcast(g, b.shape)))


def neg(a):
    a = _var(a)
    return Var(-a.value, (a,), (lambda g: -g,))


def mul(a, b):
    a, b = _var(a), _var(b)
    return Var(a.value * b.value, (a, b),
               (lambda g: _unbroadcast(g * b.value, a.shape),
                lambda g: _unbroadcast(g * a.value, b.shape)))


def matmul(a, b):
    a, b = _var(a), _var(b)
    assert a.ndim == 2 and b.ndim == 2
    return Var(a.value @ b.value, (a, b),
               (lambda g: g @ b.value.T, lambda g: a.value.T @ g))


def getitem(a, idx):
    def back(g):
        out = np.zeros_like(a.value)
        out[idx] += g  # basic indexing (ints, slices): no repeated elements
        return out
    return Var(a.value[idx], (a,), (back,))


def sigmoid(a):
    a = _var(a)
    s = 1.0 / (1.0 + np.exp(-a.value))
    return Var(s, (a,), (lambda g: g * s * (1.0 - s),))


def tanh(a):
    a = _var(a)
    t = np.tanh(a.value)
    return Var(t, (a,), (lambda g: g * (1.0 - t * t),))


def where(cond, x, y):
    cond = np.asarray(_val(cond), dtype=bool)
    x, y = _var(x), _var(y)
    out = np.where(cond, x.value, y.value)
    return Var(out, (x, y),
               (lambda g: _unbroadcast(np.where(cond, g, 0.0), x.shape),
                lambda g: _unbroadcast(np.where(cond, 0.0, g), y.shape)))


def cat(xs, axis):
    xs = [_var(x) for x in xs]
    sizes = [x.shape[axis] for x in xs]
    bounds = np.cumsum([0] + sizes)

    def mk(k):
        def back(g):
            sl = [slice(None)] * g.ndim
            sl[axis] = slice(bounds[k], bounds[k + 1])
            return g[tuple(sl)]
        return back
    return Var(np.concatenate([x.value for x in xs], axis=axis), xs, [mk(k) for k in range(len(xs))])


def stack(xs, axis=0):
    xs = [_var(x) for x in xs]

    def mk(k):
        return lambda g: np.take(g, k, axis=axis)
    return Var(np.stack([x.value for x in xs], axis=axis), xs, [mk(k) for k in range(len(xs))])


def take_rows(E, idx):
    """E[idx] for an integer index array (embedding lookup)."""
    E = _var(E)
    idx = np.asarray(idx)

    def back(g):
        out = np.zeros_like(E.value)
        np.add.at(out, idx, g)
        return out
    return Var(E.value[idx], (E,), (back,))


def reshape(a, shape):
    if not isinstance(a, Var):
        return np.reshape(a, shape)
    return Var(a.value.reshape(shape), (a,), (lambda g: g.reshape(a.shape),))


def xent_mean(logits, targets):
    """Mean over rows of -log softmax(logits)[row, target]."""
    logits = _var(logits)
    t = np.asarray(_val(targets))
    z = logits.value
    m = z.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(z - m).sum(axis=1))
    n = z.shape[0]
    loss = np.mean(lse - z[np.arange(n), t])

    def back(g):
        p = np.exp(z - lse[:, None])
        p[np.arange(n), t] -= 1.0
        return g * p / n
    return Var(np.asarray(loss), (logits,), (back,))


def backward(out):
    """Reverse sweep from scalar `out`; leaves get .grad (summed)."""
    order, seen, stack_ = [], set(), [(out, False)]
    while stack_:
        v, done = stack_.pop()
        if done:
            order.append(v)
            continue
        if id(v) in seen:
            continue
        seen.add(id(v))
        stack_.append((v, True))
        for p in v.parents:
            if id(p) not in seen:
                stack_.append((p, False))
    grads = {id(out): np.ones_like(out.value)}
    for v in reversed(order):
        g = grads.pop(id(v), None)
        if g is None:
            continue
        if not v.parents:
            v.grad = g if v.grad is None else v.grad + g
            continue
        for p, fn in zip(v.parents, v.grad_fns):
            gp = fn(g)
            k = id(p)
            grads[k] = gp if k not in grads else grads[k] + gp


class NPOps:
    """The ops namespace hmlstm.py expects, for npad Vars (see TorchOps / JaxOps)."""
    sigmoid = staticmethod(sigmoid)
    tanh = staticmethod(tanh)
    where = staticmethod(where)
    cat = staticmethod(cat)
    reshape = staticmethod(reshape)
    take_rows = staticmethod(take_rows)
    xent_mean = staticmethod(xent_mean)

    @staticmethod
    def sg(x):
        return np.array(_val(x), copy=True)

    @staticmethod
    def fmask(cond, like):
        return np.asarray(cond).astype(_val(like).dtype)

    @staticmethod
    def zeros(shape, like):
        return np.zeros(shape, dtype=_val(like).dtype)

    @staticmethod
    def ones_like(x):
        return np.ones_like(_val(x))

    @staticmethod
    def scan(f, carry, xs):
        ys = []
        for t in range(xs.shape[0]):
            carry, y = f(carry, xs[t])
            ys.append(y)
        return carry, stack(ys, axis=0)


def value_and_grad(loss_fn, params):
    """loss_fn(dict of Var) -> scalar Var.  Returns (float loss, dict of numpy grads)."""
    vs = {k: Var(np.array(v, copy=True)) for k, v in params.items()}
    out = loss_fn(vs)
    backward(out)
    return float(out.value), {k: (v.grad if v.grad is not None else np.zeros_like(v.value))
                              for k, v in vs.items()}
