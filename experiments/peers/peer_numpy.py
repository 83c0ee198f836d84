"""NumPy on the CPU, two methods with the peers' interface.

'numpy': a test double (for selftest.py and smoke runs). It runs the backend-generic code of
hmlstm.py on npad (numpy autodiff) in float32 and times with wall-clock. It is not a peer and its
timings mean nothing; it lets the whole orchestration (validation, timing loop, JSON records) run on
a machine without torch and jax.

'numpy_hand': the CPU peer of issue 10, workload a only: the cell update and its four gradients
written out by hand as a NumPy user would (float32, one array expression after another, each a pass
over memory; NumPy's elementwise loops are single-threaded), timed by wall clock. Any CPU
implementation of mixed mode should beat it.
"""

import time

import numpy as np

import hmlstm
import npad
from reference import CELL_SPEC

PARAM_NAMES = hmlstm.PARAM_NAMES
O = npad.NPOps


def time_loop(call, args_list, reps, warmup):
    n = len(args_list)
    for w in range(warmup):
        call(args_list[w % n])
    times = []
    for k in range(reps):
        t0 = time.perf_counter()
        call(args_list[k % n])
        times.append((time.perf_counter() - t0) * 1e3)
    t0 = time.perf_counter()
    for k in range(reps):
        call(args_list[k % n])
    return {"times_ms": times, "pipelined_ms": (time.perf_counter() - t0) * 1e3 / reps,
            "timer": "cpu-wall"}


class Backend:
    framework = "numpy"

    def __init__(self, method, opts):
        self.method = method
        self.opts = opts
        self.skip_reason = None
        if not opts.get("allow_cpu"):
            self.skip_reason = "skipped: 'numpy' is a CPU test double (pass --allow-cpu)"

    def describe(self):
        if self.method == "numpy_hand":
            return "numpy %s, hand-written derivative (float32, single-threaded, CPU wall time)" % np.__version__
        return "numpy %s test double (npad autodiff, float32, CPU wall time)" % np.__version__

    def begin_config(self):
        pass

    def end_config(self):
        pass

    def cell_session(self, workload, host_sets):
        if self.method == "numpy_hand":
            if workload != "a":
                raise NotImplementedError("numpy_hand implements workload a only (pass --workloads a)")
            return _HandCellSession(host_sets)
        return _CellSession(workload, host_sets)

    def model_session(self, P, token_sets, a, lr):
        return _ModelSession(P, token_sets, a, lr)


class _CellSessionBase:
    """What both cell sessions share: the input sets as float32, and gradients and timing through
    `call(d)`, which returns the gradients by argument name."""
    note = ""

    def __init__(self, host_sets):
        self.sets = [{k: np.asarray(v, np.float32) for k, v in hs.items()} for hs in host_sets]

    def grads(self, rows=None):
        g = self.call(self.sets[0])
        return {n: (v if rows is None else v[rows]) for n, v in g.items()}

    def time(self, reps, warmup):
        return time_loop(self.call, self.sets, reps, warmup)


class _CellSession(_CellSessionBase):
    def __init__(self, workload, host_sets):
        super().__init__(host_sets)
        self.workload = workload
        spec = CELL_SPEC[workload]
        self.diff, self.adj, self.flags = spec["diff"], spec["adj"], spec["flags"]

    def call(self, d):
        vs = {n: npad.Var(d[n]) for n in self.diff}
        if self.workload == "a":
            out = hmlstm.cell_a(O, d["z"], d["zb"], *[vs[n] for n in self.diff])
            seed = out * d["adj"]
        else:
            c, h = hmlstm.cell_b(O, d["z"], d["zb"], *[vs[n] for n in self.diff])
            seed = c * d["adj_c"] + h * d["adj_h"]
        total = npad.reshape(seed, (1, -1)) @ np.ones((seed.shape[0] * seed.shape[1], 1), np.float32)
        npad.backward(total)
        return {n: vs[n].grad for n in self.diff}


class _HandCellSession(_CellSessionBase):
    """Workload a: out = z ? sig(i) tanh(g) : (zb == 0 ? c : sig(f) c + sig(i) tanh(g)) with its
    gradients for c, f, i, g given the adjoint, derivative rules written out by hand. The output is
    computed (and kept on the session) because a forward+backward is what is timed."""
    note = "hand-written derivative"

    def call(self, d):
        one, zero = np.float32(1), np.float32(0)
        flush = d["z"] == 1                  # [dims, 1]: broadcast over columns
        keep = np.logical_and(~flush, d["zb"] == 0)
        update = np.logical_and(~flush, ~keep)
        si = one / (one + np.exp(-d["i"]))
        sf = one / (one + np.exp(-d["f"]))
        tg = np.tanh(d["g"])
        c, adj = d["c"], d["adj"]
        self.out = np.where(flush, si * tg, np.where(keep, c, sf * c + si * tg))
        return {"c": adj * np.where(flush, zero, np.where(keep, one, sf)),
                "f": adj * np.where(update, c * sf * (one - sf), zero),
                "i": adj * np.where(keep, zero, tg * si * (one - si)),
                "g": adj * np.where(keep, zero, si * (one - tg * tg))}


class _ModelSession:
    note = ""

    def __init__(self, P, token_sets, a, lr):
        self.P = {k: np.asarray(P[k], np.float32).copy() for k in PARAM_NAMES}
        self.tok = token_sets
        self.a, self.lr = a, lr

    def _vg(self, tokens):
        return npad.value_and_grad(lambda Pv: hmlstm.hm_loss(O, Pv, tokens, self.a), self.P)

    def loss_and_grads(self):
        return self._vg(self.tok[0])

    def train_step(self, tokens):
        loss, g = self._vg(tokens)
        for k in PARAM_NAMES:
            self.P[k] = self.P[k] - np.float32(self.lr) * g[k].astype(np.float32)
        return loss

    def time(self, reps, warmup):
        return time_loop(self.train_step, self.tok, reps, warmup)
