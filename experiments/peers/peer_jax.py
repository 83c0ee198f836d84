"""JAX peers: 'jax' (jit of vjp, forward and backward as separate jitted phases for the cells;
jit(value_and_grad) over lax.scan for the model) and 'jax_remat' (the same with the broadcast
function under jax.checkpoint, so only its inputs are saved and the backward recomputes it).
Imported lazily by peers.py; importing this module imports jax.  Interface: see peer_torch.py.
"""

import os
import time

# Do not let JAX grab 75% of the GPU up front: the PyTorch peers share the process.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import hmlstm  # noqa: E402
from reference import CELL_SPEC  # noqa: E402

PARAM_NAMES = hmlstm.PARAM_NAMES

jax.config.update("jax_default_matmul_precision", "highest")

# --precision -> (dtype of cells a and b, JAX matmul precision of model e; None: e is skipped).
# JAX has no autocast: its way to bf16 products of float32 data is the "bfloat16" precision (one
# bf16 pass, float32 accumulation), and it has no float16 product mode.
PRECISIONS = {"fp32": (np.float32, "highest"), "tf32": (np.float32, "tensorfloat32"),
              "bf16": (jnp.bfloat16, "bfloat16"), "fp16": (jnp.float16, None)}

_tree_map = jax.tree.map if hasattr(jax, "tree") and hasattr(jax.tree, "map") else jax.tree_util.tree_map


class JaxOps:
    sigmoid = staticmethod(jax.nn.sigmoid)
    tanh = staticmethod(jnp.tanh)
    where = staticmethod(jnp.where)
    reshape = staticmethod(jnp.reshape)
    sg = staticmethod(jax.lax.stop_gradient)

    @staticmethod
    def fmask(cond, like):
        return cond.astype(like.dtype)

    @staticmethod
    def zeros(shape, like):
        return jnp.zeros(shape, dtype=like.dtype)

    @staticmethod
    def ones_like(x):
        return jnp.ones_like(x)

    @staticmethod
    def cat(xs, axis):
        return jnp.concatenate(list(xs), axis=axis)

    @staticmethod
    def take_rows(E, idx):
        return E[idx]

    @staticmethod
    def xent_mean(logits, targets):
        lse = jax.nn.logsumexp(logits, axis=1)
        picked = jnp.take_along_axis(logits, targets[:, None], axis=1)[:, 0]
        return jnp.mean(lse - picked)

    @staticmethod
    def scan(f, carry, xs):
        return jax.lax.scan(f, carry, xs)


def _cell_fn(workload, z, zb):
    """The cell as a function of its differentiated inputs only (flags closed over: no cotangent)."""
    if workload == "a":
        def f(c, fg, ig, gg):
            return hmlstm.cell_a(JaxOps, z, zb, c, fg, ig, gg)
    else:
        def f(c, h, fg, ig, og, gg):
            return hmlstm.cell_b(JaxOps, z, zb, c, h, fg, ig, og, gg)
    return f


def make_cell_phases(workload, remat, split=True):
    """(fwd, bwd): fwd(z, zb, *diff) -> (out, res); bwd(res, ct) -> grads tuple.

    split=True : res is the VJP function returned by jax.vjp inside the forward jit (a pytree whose
                 leaves are the residuals JAX chose); bwd = jit(lambda vjp_fn, ct: vjp_fn(ct)).
    split=False: fallback if a JAX version refuses to return the VJP from jit: res = the inputs, and
                 bwd re-runs jax.vjp (XLA then recomputes the forward inside the backward).
    """
    def wrap(f):
        return jax.checkpoint(f) if remat else f

    if split:
        def fwd(z, zb, *diff):
            return jax.vjp(wrap(_cell_fn(workload, z, zb)), *diff)

        def bwd(vjp_fn, ct):
            return vjp_fn(ct)
    else:
        def fwd(z, zb, *diff):
            return _cell_fn(workload, z, zb)(*diff), (z, zb, diff)

        def bwd(res, ct):
            z, zb, diff = res
            return jax.vjp(wrap(_cell_fn(workload, z, zb)), *diff)[1](ct)
    return jax.jit(fwd), jax.jit(bwd)


def time_loop(call, args_list, reps, warmup):
    """Wall time per repetition around call(args) + block_until_ready (device idle at the start of
    each repetition), and a pipelined mean (reps calls back to back, one block at the end)."""
    n = len(args_list)
    for w in range(warmup):
        jax.block_until_ready(call(args_list[w % n]))
    times = []
    for k in range(reps):
        t0 = time.perf_counter()
        r = call(args_list[k % n])
        jax.block_until_ready(r)
        times.append((time.perf_counter() - t0) * 1e3)
        del r
    t0 = time.perf_counter()
    r = None
    for k in range(reps):
        r = call(args_list[k % n])
    jax.block_until_ready(r)
    pipelined = (time.perf_counter() - t0) * 1e3 / reps
    return {"times_ms": times, "pipelined_ms": pipelined, "timer": "wall+block_until_ready"}


class Backend:
    framework = "jax"

    def __init__(self, method, opts):
        assert method in ("jax", "jax_remat")
        self.method = method
        self.remat = method == "jax_remat"
        self.opts = opts
        self.skip_reason = None
        self.backend = jax.default_backend()
        if self.backend == "cpu" and not opts.get("allow_cpu"):
            self.skip_reason = "skipped: jax has no GPU backend (pass --allow-cpu to run on the CPU)"
        self.device = jax.devices()[0]
        self.split_ok = None   # learned on first use: can the VJP cross the jit boundary?
        self.precision = opts.get("precision", "fp32")
        self.cell_dtype, self.matmul_precision = PRECISIONS[self.precision]
        if self.matmul_precision:
            jax.config.update("jax_default_matmul_precision", self.matmul_precision)

    def describe(self):
        import jaxlib
        return "jax %s (jaxlib %s) on %s; cells in %s, matmul precision %s%s" % (
            jax.__version__, getattr(jaxlib, "__version__", "?"), self.device.device_kind,
            np.dtype(self.cell_dtype).name, self.matmul_precision or "n/a (no float16 mode)",
            ", jax.checkpoint on the broadcast function" if self.remat else "")

    def begin_config(self):
        pass

    def end_config(self):
        pass

    def _put(self, x):
        return jax.device_put(np.ascontiguousarray(x), self.device)

    def cell_session(self, workload, host_sets):
        return _CellSession(self, workload, host_sets)

    def model_session(self, P, token_sets, a, lr):
        if self.matmul_precision is None:
            raise RuntimeError("not run: JAX has no float16 product mode for float32 data "
                               "(--precision fp16); see the bf16 run")
        return _ModelSession(self, P, token_sets, a, lr)


class _CellSession:
    def __init__(self, be, workload, host_sets):
        self.be = be
        self.workload = workload
        spec = CELL_SPEC[workload]
        self.diff, self.adj, self.flags = spec["diff"], spec["adj"], spec["flags"]
        self.sets = [{n: be._put(hs[n].astype(be.cell_dtype)) for n in self.flags + self.diff + self.adj}
                     for hs in host_sets]
        self.note = ""
        if be.split_ok is not False:
            self.fwd, self.bwd = make_cell_phases(workload, be.remat, split=True)
            try:
                jax.block_until_ready(self.call(self.sets[0]))
                be.split_ok = True
            except Exception as exc:  # pragma: no cover - depends on the JAX version
                be.split_ok = False
                self.note = ("VJP could not cross the jit boundary (%s: %s); fell back to "
                             "recompute-in-backward" % (type(exc).__name__, str(exc)[:200]))
        if be.split_ok is False:
            self.fwd, self.bwd = make_cell_phases(workload, be.remat, split=False)
            if not self.note:
                self.note = "fallback phases (recompute-in-backward)"

    def call(self, d):
        out, res = self.fwd(*[d[n] for n in self.flags + self.diff])
        ct = d["adj"] if self.workload == "a" else tuple(d[n] for n in self.adj)
        return out, self.bwd(res, ct)

    def grads(self, rows=None):
        _, g = self.call(self.sets[0])
        sel = (lambda x: x) if rows is None else (lambda x: x[rows])
        return {n: np.asarray(sel(gi)).astype(np.float32) for n, gi in zip(self.diff, g)}

    def time(self, reps, warmup):
        return time_loop(self.call, self.sets, reps, max(warmup, 2))


class _ModelSession:
    def __init__(self, be, P, token_sets, a, lr):
        self.be = be
        self.note = ""
        self.P = {k: be._put(P[k].astype(np.float32)) for k in PARAM_NAMES}
        self.tok = [be._put(t.astype(np.int32)) for t in token_sets]

        def pointwise(zf, zbf, c, h, s):
            return hmlstm.hm_pointwise(JaxOps, zf, zbf, c, h, s, a)
        if be.remat:
            pointwise = jax.checkpoint(pointwise)

        def loss_fn(P, tokens):
            return hmlstm.hm_loss(JaxOps, P, tokens, a, pointwise)

        self.value_and_grad = jax.jit(jax.value_and_grad(loss_fn))

        def train(P, tokens):
            loss, g = jax.value_and_grad(loss_fn)(P, tokens)
            return _tree_map(lambda p, gi: p - lr * gi, P, g), loss
        self.train = jax.jit(train, donate_argnums=(0,))

    def loss_and_grads(self):
        loss, g = self.value_and_grad(self.P, self.tok[0])
        return float(loss), {k: np.asarray(g[k]) for k in PARAM_NAMES}

    def train_step(self, tokens):
        self.P, loss = self.train(self.P, tokens)
        return loss, self.P

    def time(self, reps, warmup):
        return time_loop(self.train_step, self.tok, reps, max(warmup, 2))
