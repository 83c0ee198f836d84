"""PyTorch peers: 'eager' (autograd), 'compile' (torch.compile of the forward; AOTAutograd
compiles the backward) and 'torch_dualcast' (the cells as dualcast.torch.elementwise kernels:
dualcast from PyTorch, issue 33; the model's matmuls, embedding and loss stay PyTorch's). Imported
lazily by peers.py; importing this module imports torch.

Interface used by peers.py (same as peer_jax.py):
  Backend(method, opts)                .skip_reason (None when usable), .describe()
  .cell_session(workload, host_sets)   -> session with .grads(rows) and .time(reps, warmup)
  .model_session(P, token_sets, a, lr) -> session with .loss_and_grads() and .time(reps, warmup)
  .end_config()                        frees memory between configurations
"""

import time
import warnings

import numpy as np
import torch
import torch.nn.functional as F

import hmlstm
from reference import CELL_SPEC

PARAM_NAMES = hmlstm.PARAM_NAMES


# --------------------------------------------------------------------------------------------
# precision: fp32 (TF32 off), tf32 (TF32 on), bf16 / fp16 (16-bit cells, autocast model)
# --------------------------------------------------------------------------------------------
CELL_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def set_precision(precision="fp32"):
    """TF32 off for fp32 (and under autocast, where only float32 leftovers see it), on for tf32,
    through the legacy switches.  The legacy API is deprecated from torch 2.9 on but still honoured;
    mixing it with the new fp32_precision API can raise inside Inductor, so only the new API is
    tried, and only if the legacy one is gone."""
    notes = []
    tf32 = precision == "tf32"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.backends.cudnn.allow_tf32 = tf32
            torch.set_float32_matmul_precision("high" if tf32 else "highest")
            notes.append("tf32 %s (legacy flags)" % ("on" if tf32 else "off"))
            if precision in CELL_DTYPES:
                notes.append("cells a, b in %s; model under torch.autocast(%s)"
                             % (precision, CELL_DTYPES[precision]))
        except Exception as exc:  # legacy API removed
            mode = "tf32" if tf32 else "ieee"
            try:
                torch.backends.fp32_precision = mode
                torch.backends.cuda.matmul.fp32_precision = mode
                notes.append("fp32_precision=%s (legacy failed: %s)" % (mode, exc))
            except Exception as exc2:
                notes.append("WARNING: could not disable tf32: %s / %s" % (exc, exc2))
    return "; ".join(notes)


class TorchOps:
    sigmoid = staticmethod(torch.sigmoid)
    tanh = staticmethod(torch.tanh)
    where = staticmethod(torch.where)
    reshape = staticmethod(torch.reshape)

    @staticmethod
    def sg(x):
        return x.detach()

    @staticmethod
    def fmask(cond, like):
        return cond.to(like.dtype)

    @staticmethod
    def zeros(shape, like):
        return torch.zeros(shape, dtype=like.dtype, device=like.device)

    @staticmethod
    def ones_like(x):
        return torch.ones_like(x)

    @staticmethod
    def cat(xs, axis):
        return torch.cat(list(xs), dim=axis)

    @staticmethod
    def take_rows(E, idx):
        return F.embedding(idx, E)

    @staticmethod
    def xent_mean(logits, targets):
        return F.cross_entropy(logits, targets)

    @staticmethod
    def scan(f, carry, xs):
        ys = []
        for t in range(xs.shape[0]):
            carry, y = f(carry, xs[t])
            ys.append(y)
        return carry, torch.stack(ys, 0)


# plain module-level functions: what torch.compile traces
def _cell_a(z, zb, c, f, i, g):
    return hmlstm.cell_a(TorchOps, z, zb, c, f, i, g)


def _cell_b(z, zb, c, h, f, i, o, g):
    return hmlstm.cell_b(TorchOps, z, zb, c, h, f, i, o, g)


def _make_pointwise(a, cell=None):
    def pointwise(zflag, zbflag, c, h, s):
        return hmlstm.hm_pointwise(TorchOps, zflag, zbflag, c, h, s, a, cell=cell)
    return pointwise


# The same two cells (hmlstm.cell_a, cell_b) as C++ bodies for dualcast.torch.elementwise: a fused
# forward kernel writing the outputs and a fused gradient kernel that evaluates the cell again (the
# recompute policy, dualcast's default), as the native mixed mode does.
DUALCAST_CELL_A = """
    if (z == 1) return sigmoid(i) * tanh(g);
    if (zb == 0) return c;
    return sigmoid(f) * c + sigmoid(i) * tanh(g);
"""
DUALCAST_CELL_B = """
    if (z == 1) {
      const D c1 = sigmoid(i) * tanh(g);
      return {c1, sigmoid(o) * tanh(c1)};
    }
    if (zb == 0) return {c, h};
    const D c1 = sigmoid(f) * c + sigmoid(i) * tanh(g);
    return {c1, sigmoid(o) * tanh(c1)};
"""


def _dualcast_cells():
    """(cell_a, cell_b) compiled by dualcast (the checkout's python/ package)."""
    import os
    import sys
    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    if os.path.join(root, "python") not in sys.path:
        sys.path.insert(0, os.path.join(root, "python"))
    # The compiled launcher (dualcast.native) loaded before anything is timed, not built meanwhile.
    os.environ.setdefault("DUALCAST_NATIVE", "wait")
    from dualcast.torch import elementwise
    return (elementwise(DUALCAST_CELL_A, inputs="z zb c f i g", differentiable="c f i g"),
            elementwise(DUALCAST_CELL_B, inputs="z zb c h f i o g", differentiable="c h f i o g", outputs=2))


def _raise_dynamo_limits():
    """Recompilations beyond the limit silently fall back to eager: raise it (the name changed
    across versions: cache_size_limit -> recompile_limit)."""
    try:
        import torch._dynamo as dyn
    except Exception:
        return
    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if hasattr(dyn.config, name):
                    setattr(dyn.config, name, max(64, int(getattr(dyn.config, name))))
        except Exception:
            pass


# --------------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------------
def _sync(cuda):
    if cuda:
        torch.cuda.synchronize()


def time_loop(fn, args_list, reps, warmup, cuda):
    """Per-repetition times (ms) and a pipelined mean.

    Per repetition: the stream is drained (synchronize), then CUDA events are recorded around the
    call, so each sample is one step's latency from an idle GPU, launch gaps included.
    Pipelined: `reps` calls back to back between two events, divided by reps (throughput, launch
    overhead hidden where the GPU is the bottleneck).  On the CPU, wall time replaces events."""
    n = len(args_list)
    for w in range(warmup):
        fn(args_list[w % n])
    _sync(cuda)
    times = []
    if cuda:
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
               for _ in range(reps)]
        for k in range(reps):
            torch.cuda.synchronize()
            evs[k][0].record()
            fn(args_list[k % n])          # outputs are dropped; the allocator is stream-ordered
            evs[k][1].record()
        torch.cuda.synchronize()
        times = [a.elapsed_time(b) for a, b in evs]
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for k in range(reps):
            fn(args_list[k % n])
        e1.record()
        torch.cuda.synchronize()
        pipelined = e0.elapsed_time(e1) / reps
    else:
        for k in range(reps):
            t0 = time.perf_counter()
            fn(args_list[k % n])
            times.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        for k in range(reps):
            fn(args_list[k % n])
        pipelined = (time.perf_counter() - t0) * 1e3 / reps
    return {"times_ms": times, "pipelined_ms": pipelined,
            "timer": "cuda-events" if cuda else "cpu-wall"}


# --------------------------------------------------------------------------------------------
# backend
# --------------------------------------------------------------------------------------------
class Backend:
    framework = "torch"

    def __init__(self, method, opts):
        assert method in ("eager", "compile", "torch_dualcast")
        self.method = method
        self.opts = opts
        self.skip_reason = None
        self.cuda = torch.cuda.is_available()
        if not self.cuda and not opts.get("allow_cpu"):
            self.skip_reason = "skipped: torch has no CUDA device (pass --allow-cpu to run on the CPU)"
        self.device = torch.device("cuda" if self.cuda else "cpu")
        self.precision = opts.get("precision", "fp32")
        self.cell_dtype = CELL_DTYPES.get(self.precision)  # None: float32
        self.dualcast_cells = None
        if method == "torch_dualcast":
            if self.cell_dtype is not None:
                self.skip_reason = "skipped: dualcast.torch has no %s kernels yet" % self.precision
            else:
                self.dualcast_cells = _dualcast_cells()
        self.precision_note = set_precision(self.precision)
        if method == "compile":
            if not hasattr(torch, "compile"):  # e.g. Debian's python3-torch 1.13
                self.skip_reason = "skipped: torch %s has no torch.compile (2.0 and later)" % torch.__version__
            _raise_dynamo_limits()
        self.compile_kwargs = {"fullgraph": True, "dynamic": False}
        mode = opts.get("compile_mode", "default")
        if mode and mode != "default":
            self.compile_kwargs["mode"] = mode

    def describe(self):
        dev = torch.cuda.get_device_name(0) if self.cuda else "cpu"
        extra = ""
        if self.method == "compile":
            extra = ", torch.compile(%s)" % ", ".join("%s=%r" % kv for kv in self.compile_kwargs.items())
        elif self.method == "torch_dualcast":
            extra = ", cells as dualcast.torch.elementwise kernels"
        return "torch %s (cuda %s) on %s%s; %s" % (torch.__version__, torch.version.cuda, dev, extra,
                                                    self.precision_note)

    def _compile(self, fn):
        return torch.compile(fn, **self.compile_kwargs)

    def begin_config(self):
        if self.method == "compile":
            import torch._dynamo
            torch._dynamo.reset()   # fresh caches: one static-shape graph per configuration

    def end_config(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def _t(self, x, grad=False, dtype=None):
        t = torch.from_numpy(np.ascontiguousarray(x)).to(self.device)
        if dtype is not None:
            t = t.to(dtype)
        if grad:
            t.requires_grad_(True)
        return t

    # ---- workloads a and b --------------------------------------------------------------------
    def cell_session(self, workload, host_sets):
        self.begin_config()
        return _CellSession(self, workload, host_sets)

    # ---- workload e ---------------------------------------------------------------------------
    def model_session(self, P, token_sets, a, lr):
        self.begin_config()
        return _ModelSession(self, P, token_sets, a, lr)


class _CellSession:
    def __init__(self, be, workload, host_sets):
        self.be = be
        self.workload = workload
        spec = CELL_SPEC[workload]
        self.diff, self.adj, self.flags = spec["diff"], spec["adj"], spec["flags"]
        self.sets = []
        for hs in host_sets:
            d = {n: be._t(hs[n], dtype=be.cell_dtype) for n in self.flags + self.adj}
            d.update({n: be._t(hs[n], grad=True, dtype=be.cell_dtype) for n in self.diff})
            self.sets.append(d)
        if be.dualcast_cells is not None:
            self.fn = be.dualcast_cells[0 if workload == "a" else 1]
        else:
            fn = _cell_a if workload == "a" else _cell_b
            self.fn = be._compile(fn) if be.method == "compile" else fn

    def step(self, d):
        ins = [d[n] for n in self.flags + self.diff]
        out = self.fn(*ins)
        if self.workload == "a":
            return torch.autograd.grad(out, [d[n] for n in self.diff], d["adj"])
        return torch.autograd.grad(out, [d[n] for n in self.diff], [d[n] for n in self.adj])

    def grads(self, rows=None):
        g = self.step(self.sets[0])
        _sync(self.be.cuda)
        sel = (lambda x: x) if rows is None else (lambda x: x[rows])
        return {n: sel(gi.detach()).float().cpu().numpy() for n, gi in zip(self.diff, g)}

    def time(self, reps, warmup):
        if self.be.method == "compile":
            warmup = max(warmup, 3)
        return time_loop(self.step, self.sets, reps, warmup, self.be.cuda)


class _ModelSession:
    def __init__(self, be, P, token_sets, a, lr):
        self.be = be
        self.a, self.lr = a, lr
        self.P = {k: be._t(P[k].astype(np.float32), grad=True) for k in PARAM_NAMES}
        self.plist = [self.P[k] for k in PARAM_NAMES]
        self.tok = [be._t(t.astype(np.int64)) for t in token_sets]
        pw = _make_pointwise(a, cell=be.dualcast_cells[1] if be.dualcast_cells is not None else None)
        self.pointwise = be._compile(pw) if be.method == "compile" else pw

    def _loss(self, tokens):
        if self.be.cell_dtype is None:
            return hmlstm.hm_loss(TorchOps, self.P, tokens, self.a, self.pointwise)
        with torch.autocast(self.be.device.type, dtype=self.be.cell_dtype):
            return hmlstm.hm_loss(TorchOps, self.P, tokens, self.a, self.pointwise)

    def loss_and_grads(self):
        """Loss and gradients at the current parameters on token set 0 (no update)."""
        loss = self._loss(self.tok[0])
        g = torch.autograd.grad(loss, self.plist)
        return float(loss.detach().cpu()), {k: gi.detach().cpu().numpy() for k, gi in zip(PARAM_NAMES, g)}

    def train_step(self, tokens):
        loss = self._loss(tokens)
        g = torch.autograd.grad(loss, self.plist)
        with torch.no_grad():
            if hasattr(torch, "_foreach_add_"):
                torch._foreach_add_(self.plist, list(g), alpha=-self.lr)
            else:
                for p, gi in zip(self.plist, g):
                    p.add_(gi, alpha=-self.lr)
        return loss

    def time(self, reps, warmup):
        if self.be.method == "compile":
            warmup = max(warmup, 3)
        return time_loop(self.train_step, self.tok, reps, warmup, self.be.cuda)
