#!/usr/bin/env python3
"""Peer side of dualcast's HM-LSTM experiment: PyTorch eager, torch.compile and JAX on

  a  the 2018 paper's HM-LSTM cell update (K = 4), forward + backward
  b  the full cell with two outputs (K = 6), forward + backward
  e  one SGD training step of a 3-layer HM-LSTM character model (MODEL.md)

Every result is validated before it is timed.  numpy is the only hard dependency: a framework that
is not installed is reported as skipped.  See README.md.
"""

import argparse
import json
import math
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

try:
    import numpy as np  # noqa: E402
except ModuleNotFoundError:  # the one hard dependency
    sys.stderr.write("peers.py: error: numpy is required (python3 -m pip install numpy)\n")
    sys.exit(2)

import reference as R  # noqa: E402
import valdir as VD  # noqa: E402
from checks import (FRAMEWORK, check_cell_dir, check_cell_ref, check_model_dir,  # noqa: E402
                    check_model_ref, load_backend)

WORKLOADS = ("a", "b", "e")
METHODS = ("eager", "compile", "torch_dualcast", "jax", "jax_remat", "numpy", "numpy_hand")
DEFAULT_METHODS = ("eager", "compile", "jax")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
PRECISION = "fp32"  # of this run (--precision): every record says it
L2_BYTES = 50 * 2 ** 20          # H100 / H200 L2 is 50 MB


# --------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------
def _csv(kind, allowed=None, conv=str):
    def parse(text):
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError("empty %s list" % kind)
        out = []
        for x in items:
            try:
                v = conv(x)
            except ValueError:
                raise argparse.ArgumentTypeError("bad %s %r" % (kind, x))
            if allowed is not None and v not in allowed:
                raise argparse.ArgumentTypeError("unknown %s %r (choose from %s)"
                                                 % (kind, x, ", ".join(allowed)))
            if conv is int and v <= 0:
                raise argparse.ArgumentTypeError("%s must be positive: %r" % (kind, x))
            if v not in out:
                out.append(v)
        return out
    return parse


def _pos_int(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not an integer: %r" % text)
    if v <= 0:
        raise argparse.ArgumentTypeError("must be positive: %r" % text)
    return v


def _nonneg_int(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not an integer: %r" % text)
    if v < 0:
        raise argparse.ArgumentTypeError("must be >= 0: %r" % text)
    return v


def _pos_float(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not a number: %r" % text)
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError("must be a positive number: %r" % text)
    return v


def build_parser():
    p = argparse.ArgumentParser(
        prog="peers.py",
        description="Time and validate the peers (PyTorch eager, torch.compile, JAX) of dualcast's "
                    "HM-LSTM experiment. All fp32, TF32 off. A missing framework is reported as "
                    "'skipped' and the run goes on (exit 0).",
        epilog="Workloads: a = the 2018 paper's cell update (K=4, fwd+bwd); b = the full cell with "
               "two outputs (K=6, fwd+bwd); e = one SGD step of the 3-layer HM-LSTM model of "
               "MODEL.md. Methods: eager = PyTorch autograd; compile = torch.compile of the forward "
               "(AOTAutograd compiles the backward); jax = jit(vjp) with forward and backward as "
               "separate jitted phases (a, b) and jit(value_and_grad) over lax.scan (e); jax_remat = "
               "jax with the broadcast function under jax.checkpoint (not in the default set); "
               "numpy = a CPU test double (needs --allow-cpu; timings meaningless); numpy_hand = "
               "workload a with a hand-written derivative, the CPU peer (needs --allow-cpu). "
               "Output: a JSON list of records, see README.md.")
    p.add_argument("--workloads", type=_csv("workload", WORKLOADS), default=None,
                   help="comma-separated subset of a,b,e (default: a,b,e)")
    p.add_argument("--dims", type=_csv("dims", conv=int), default=None,
                   help="matrix sizes for workloads a and b: each input is dims x dims "
                        "(default: 512,1024,2048,4096,8192; with --quick: 256,512)")
    p.add_argument("--methods", type=_csv("method", METHODS), default=None,
                   help="comma-separated subset of eager,compile,torch_dualcast,jax,jax_remat,numpy "
                        "(default: eager,compile,jax)")
    p.add_argument("--reps", type=_pos_int, default=None,
                   help="timed repetitions per measurement (default 50; with --quick 10)")
    p.add_argument("--warmup", type=_nonneg_int, default=None,
                   help="untimed repetitions before timing, compilation included (default 10; "
                        "with --quick 2; compile and jax always do at least 3 and 2)")
    p.add_argument("--validate", metavar="DIR", default=None,
                   help="validation directory written by dualcast's driver (manifest.json + .bin "
                        "files); each peer recomputes its gradients / loss and compares")
    p.add_argument("--out", metavar="FILE.json", default="peers_results.json",
                   help="where to write the JSON list of records (rewritten after every record; "
                        "default peers_results.json)")
    p.add_argument("--append", action="store_true",
                   help="add to the records already in --out instead of replacing them (e.g. one "
                        "invocation per framework)")
    p.add_argument("--quick", action="store_true",
                   help="small sizes for a smoke run (dims 256,512; model H=128, B=16, T=20; "
                        "reps 10, warmup 2) unless given explicitly")
    p.add_argument("--e-hidden", type=_csv("hidden size", conv=int), default=None,
                   help="model hidden sizes H for workload e, comma-separated (default 512)")
    p.add_argument("--e-reps", type=_pos_int, default=None,
                   help="timed training steps of workload e (default: --reps; a step takes 50-500 "
                        "ms, so fewer suffice)")
    p.add_argument("--e-warmup", type=_nonneg_int, default=None,
                   help="untimed training steps of workload e first (default: --warmup)")
    p.add_argument("--e-batch", type=_pos_int, default=None, help="model batch B (default 64)")
    p.add_argument("--e-seq", type=_pos_int, default=None, help="model sequence length T (default 100)")
    p.add_argument("--e-vocab", type=_pos_int, default=64, help="model vocabulary V (default 64)")
    p.add_argument("--e-slope", type=_pos_float, default=1.0,
                   help="boundary hard-sigmoid slope a used for timing (default 1.0)")
    p.add_argument("--e-lr", type=_pos_float, default=0.1, help="SGD learning rate (default 0.1)")
    p.add_argument("--sets", type=_pos_int, default=None,
                   help="input sets rotated during timing (default: 3 while a set is under twice "
                        "the 50 MB L2, fewer above; workload e always rotates 3 token sets)")
    p.add_argument("--seed", type=_nonneg_int, default=0, help="seed of the generated inputs (default 0)")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="fp32 (default: float32, TF32 off), tf32 (TF32 products: torch's TF32 "
                        "flags, JAX matmul precision 'tensorfloat32'), bf16 / fp16 (cells a, b on "
                        "16-bit tensors; model e under torch.autocast, JAX matmul precision "
                        "'bfloat16' (JAX has no float16 mode: e is skipped there))")
    p.add_argument("--rtol-cell", type=_pos_float, default=None,
                   help="max relative error accepted for workloads a and b (default 1e-4; "
                        "bf16 5e-2, fp16 1e-2)")
    p.add_argument("--rtol-model", type=_pos_float, default=None,
                   help="max relative error accepted for workload e (default 1e-3; tf32 1e-2, "
                        "bf16 and fp16 5e-2)")
    p.add_argument("--no-refcheck", action="store_true",
                   help="skip the checks against the numpy reference (the --validate DIR check "
                        "still runs)")
    p.add_argument("--compile-mode", choices=("default", "max-autotune-no-cudagraphs"),
                   default="default", help="torch.compile mode for method compile (default: default)")
    p.add_argument("--allow-cpu", action="store_true",
                   help="run torch / jax on the CPU when no GPU is present (smoke runs only)")
    p.add_argument("--time-budget", type=_pos_float, default=None, metavar="S",
                   help="stop starting new measurements S seconds after the start; the ones left "
                        "are recorded as 'skipped: time budget' (default: no limit). Lets a caller "
                        "with a hard wall-clock limit keep what was measured")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 if any measurement failed validation or raised (default: exit 0 "
                        "and record it)")
    return p


def resolve(args):
    q = args.quick
    if args.workloads is None:
        args.workloads = list(WORKLOADS)
    if args.methods is None:
        args.methods = list(DEFAULT_METHODS)
    if args.dims is None:
        args.dims = [256, 512] if q else [512, 1024, 2048, 4096, 8192]
    if args.reps is None:
        args.reps = 10 if q else 50
    if args.warmup is None:
        args.warmup = 2 if q else 10
    if args.e_reps is None:
        args.e_reps = args.reps
    if args.e_warmup is None:
        args.e_warmup = args.warmup
    if args.e_hidden is None:
        args.e_hidden = [128] if q else [512]
    if args.e_batch is None:
        args.e_batch = 16 if q else 64
    if args.e_seq is None:
        args.e_seq = 20 if q else 100
    # 16-bit values keep 8 (bfloat16) or 11 (float16) significant bits, TF32 products 11.
    if args.rtol_cell is None:
        args.rtol_cell = {"bf16": 5e-2, "fp16": 1e-2}.get(args.precision, 1e-4)
    if args.rtol_model is None:
        args.rtol_model = {"tf32": 1e-2, "bf16": 5e-2, "fp16": 5e-2}.get(args.precision, 1e-3)
    # run torch methods first, then jax (frees the GPU memory PyTorch caches before JAX allocates)
    order = {"torch": 0, "jax": 1, "numpy": 2}
    args.methods = sorted(args.methods, key=lambda m: (order[FRAMEWORK[m]], METHODS.index(m)))
    return args


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
def log(msg):
    print(msg, flush=True)


def n_sets(set_bytes, forced):
    if forced:
        return forced
    return int(min(3, max(1, math.ceil(2 * L2_BYTES / max(1, set_bytes)))))


def stats(times):
    t = np.asarray(times, np.float64)
    p10, p50, p90 = np.percentile(t, [10, 50, 90])
    return float(p50), float(p10), float(p90)


def combine(checks):
    """checks: list of (ok, err, text) with ok None = not compared.  -> (validated, max_err, text)."""
    real = [c for c in checks if c[0] is not None]
    text = "; ".join(c[2] for c in checks)
    if not real:
        return None, None, text
    return all(c[0] for c in real), max(c[1] for c in real), text


class Results:
    def __init__(self, path, append=False):
        self.path = path
        self.records = []
        if append and os.path.isfile(path):
            with open(path) as fh:
                old = json.load(fh)
            if not isinstance(old, list):
                raise ValueError("--append: %s does not hold a JSON list" % path)
            self.records = old

    def add(self, rec):
        self.records.append(rec)
        self.flush()

    def flush(self):
        d = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(d, exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(_finite(self.records), fh, indent=1, allow_nan=False)
        os.replace(tmp, self.path)


def _finite(x):
    """Strict JSON: non-finite floats become null (the note says what happened)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def record(workload, key, method, **kw):
    rec = {"workload": workload}
    if workload == "e":
        rec["config"] = key
    else:
        rec["dims"] = key
    rec.update({"method": method, "phase": "step" if workload == "e" else "fwd+bwd",
                "precision": PRECISION,
                "median_ms": None, "p10_ms": None, "p90_ms": None, "reps": 0,
                "validated": None, "max_rel_err": None, "note": ""})
    rec.update(kw)
    return rec


def _fmt(x):
    return "n/a" if x is None else ("%.4f" % x)


# --------------------------------------------------------------------------------------------
# measurements
# --------------------------------------------------------------------------------------------
class InputCache:
    def __init__(self, seed, forced_sets):
        self.seed = seed
        self.forced = forced_sets
        self.cells = {}
        self.models = {}

    def cell_sets(self, workload, dims):
        key = (workload, dims)
        if key not in self.cells:
            first = R.gen_cell_inputs(workload, dims, self.seed)
            k = n_sets(sum(v.nbytes for v in first.values()), self.forced)
            self.cells[key] = [first] + [R.gen_cell_inputs(workload, dims, self.seed + 1000 * j)
                                         for j in range(1, k)]
        return self.cells[key]

    def model(self, H, B, T, V):
        key = (H, B, T, V)
        if key not in self.models:
            P = R.init_e_params(H, V, self.seed)
            toks = [R.gen_tokens(T, B, V, self.seed + j) for j in range(3)]
            self.models[key] = (P, toks)
        return self.models[key]


def measure_cell(be, args, cache, workload, dims, dir_check, res):
    method = be.method
    t0 = time.time()
    try:
        sets = cache.cell_sets(workload, dims)
        sess = be.cell_session(workload, sets)
        checks = [c for c in (dir_check,) if c is not None]
        if not args.no_refcheck:
            checks.append(check_cell_ref(sess, workload, sets[0], args.rtol_cell))
        validated, err, vtext = combine(checks)
        tm = sess.time(args.reps, args.warmup)
        note = getattr(sess, "note", "")
        del sess
        be.end_config()
        med, p10, p90 = stats(tm["times_ms"])
        rec = record(workload, dims, method, median_ms=med, p10_ms=p10, p90_ms=p90,
                     reps=len(tm["times_ms"]), validated=validated, max_rel_err=err,
                     note="; ".join(x for x in (note, vtext) if x),
                     pipelined_ms=tm["pipelined_ms"], timer=tm["timer"], input_sets=len(sets),
                     env=be.describe())
        log("[%s] %s dims=%d: median %s ms (p10 %s, p90 %s; pipelined %s) validated=%s err=%s  (%.1fs)"
            % (method, workload, dims, _fmt(med), _fmt(p10), _fmt(p90), _fmt(tm["pipelined_ms"]),
               validated, "n/a" if err is None else "%.1e" % err, time.time() - t0))
        if validated is False:
            log("    VALIDATION FAILED: " + vtext)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        rec = record(workload, dims, method, note="error: %s: %s" % (type(exc).__name__, str(exc)[:500]),
                     env=be.describe())
        log("[%s] %s dims=%d: ERROR %s: %s" % (method, workload, dims, type(exc).__name__, str(exc)[:200]))
        try:
            be.end_config()
        except Exception:
            pass
    res.add(rec)


def measure_model(be, args, cache, H, checks, res):
    method = be.method
    B, T, V = args.e_batch, args.e_seq, args.e_vocab
    cfg = _e_cfg(args, H)
    t0 = time.time()
    try:
        P, toks = cache.model(H, B, T, V)
        validated, err, vtext = combine([c for c in checks if c is not None])
        sess = be.model_session(P, toks, args.e_slope, args.e_lr)
        loss0, g0 = sess.loss_and_grads()          # before any update
        finite = math.isfinite(loss0) and all(np.all(np.isfinite(v)) for v in g0.values())
        if not finite:
            validated = False
            vtext += "; non-finite loss/gradients at the timing configuration"
        tm = sess.time(args.e_reps, args.e_warmup)
        note = getattr(sess, "note", "")
        del sess, g0
        be.end_config()
        med, p10, p90 = stats(tm["times_ms"])
        rec = record("e", cfg, method, median_ms=med, p10_ms=p10, p90_ms=p90,
                     reps=len(tm["times_ms"]), validated=validated, max_rel_err=err,
                     note="; ".join(x for x in (note, vtext, "step-0 loss %.6f nats" % loss0) if x),
                     loss0=loss0, pipelined_ms=tm["pipelined_ms"], timer=tm["timer"],
                     input_sets=len(toks), env=be.describe())
        log("[%s] e H=%d B=%d T=%d: median %s ms/step (p10 %s, p90 %s; pipelined %s) loss0=%.5f "
            "validated=%s err=%s  (%.1fs)"
            % (method, H, B, T, _fmt(med), _fmt(p10), _fmt(p90), _fmt(tm["pipelined_ms"]), loss0,
               validated, "n/a" if err is None else "%.1e" % err, time.time() - t0))
        if validated is False:
            log("    VALIDATION FAILED: " + vtext)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        rec = record("e", cfg, method, note="error: %s: %s" % (type(exc).__name__, str(exc)[:500]),
                     env=be.describe())
        log("[%s] e H=%d: ERROR %s: %s" % (method, H, type(exc).__name__, str(exc)[:200]))
        try:
            be.end_config()
        except Exception:
            pass
    res.add(rec)


def _e_cfg(args, H):
    return {"L": 3, "H": H, "B": args.e_batch, "T": args.e_seq, "V": args.e_vocab,
            "a": args.e_slope, "lr": args.e_lr}


def _guarded(fn, *a):
    try:
        return fn(*a)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        return (False, float("inf"), "check raised %s: %s" % (type(exc).__name__, str(exc)[:300]))


def run(args):
    vd = VD.ValDir(args.validate) if args.validate else None
    opts = {"allow_cpu": args.allow_cpu, "compile_mode": args.compile_mode,
            "precision": args.precision}
    res = Results(args.out, args.append)
    cache = InputCache(args.seed, args.sets)
    n_before = len(res.records)
    log("peers: workloads=%s methods=%s dims=%s e(H=%s,B=%d,T=%d,V=%d) reps=%d warmup=%d validate=%s out=%s"
        % (",".join(args.workloads), ",".join(args.methods), ",".join(map(str, args.dims)),
           ",".join(map(str, args.e_hidden)), args.e_batch, args.e_seq, args.e_vocab, args.reps,
           args.warmup, args.validate, args.out))
    deadline = time.time() + args.time_budget if args.time_budget else None

    def out_of_time():
        return deadline is not None and time.time() > deadline

    budget_note = "skipped: time budget of %s s spent" % (args.time_budget,)

    def skip_all(method, workloads, note):
        """One 'skipped' record per size (a, b) or hidden size (e) of `workloads`."""
        for w in workloads:
            for key in (args.e_hidden if w == "e" else args.dims):
                res.add(record(w, _e_cfg(args, key) if w == "e" else key, method, note=note))

    for method in args.methods:
        if out_of_time():
            log("[%s] %s" % (method, budget_note))
            skip_all(method, args.workloads, budget_note)
            continue
        be, skip = load_backend(method, opts)
        if be is None:
            log("[%s] %s" % (method, skip))
            skip_all(method, args.workloads, skip)
            continue
        log("[%s] %s" % (method, be.describe()))
        for w in args.workloads:
            # checked before the workload's validation too: that alone may compile (torch.compile)
            if out_of_time():
                log("[%s] %s: %s" % (method, w, budget_note))
                skip_all(method, [w], budget_note)
                continue
            if w in ("a", "b"):
                dir_check = _guarded(check_cell_dir, be, w, vd, args.rtol_cell) if vd else None
                if dir_check is not None:
                    log("[%s] %s %s" % (method, w, dir_check[2]))
                for d in args.dims:
                    if out_of_time():
                        log("[%s] %s dims=%d: %s" % (method, w, d, budget_note))
                        res.add(record(w, d, method, note=budget_note))
                        continue
                    measure_cell(be, args, cache, w, d, dir_check, res)
            else:
                checks = []
                if vd is not None:
                    checks.append(_guarded(check_model_dir, be, vd, args.e_lr, args.rtol_model))
                    log("[%s] e %s" % (method, checks[-1][2]))
                if not args.no_refcheck:
                    checks.append(_guarded(check_model_ref, be, args.e_vocab, args.e_slope, args.e_lr,
                                           args.seed, args.rtol_model))
                    log("[%s] e %s" % (method, checks[-1][2]))
                for H in args.e_hidden:
                    measure_model(be, args, cache, H, checks, res)
    mine = res.records[n_before:]
    failed = [r for r in mine if r["validated"] is False]
    log("peers: wrote %d records to %s (%d failed validation, %d skipped or errored)"
        % (len(mine), args.out, len(failed), sum(1 for r in mine if r["median_ms"] is None)))
    errored = [r for r in mine if r["note"].startswith("error:")]
    if args.strict and (failed or errored):
        return 1
    return 0


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    args = resolve(args)
    global PRECISION
    PRECISION = args.precision
    if args.validate:
        try:
            VD.ValDir(args.validate)
        except Exception as exc:
            parser.error("--validate: %s" % exc)
    if args.append and os.path.isfile(args.out):
        try:
            Results(args.out, append=True)
        except Exception as exc:
            parser.error("--append: cannot read %s: %s" % (args.out, exc))
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
