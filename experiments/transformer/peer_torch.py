#!/usr/bin/env python3
"""The PyTorch side of experiments/transformer: the same attention op and the same transformer
training step as dualcast, timed on the same GPU after checking that they compute the same numbers.

    peer_torch.py attention --valdir DIR --seqs 128,... --heads 8 --head-dim 64 --tokens 32768
                            --causal 0,1 --reps 30 --warmup 5 --out FILE.json
    peer_torch.py step --valdir DIR --layers 4 --heads 4 --width 256 --context 128 --batch 64
                       --lr 1e-3 --methods eager,compile --reps 20 [--precision P] --out FILE.json

fp32 throughout, TF32 off (the legacy switches, as experiments/peers does), except step's timing
at --precision (transformer_experiment --precision passes it): tf32 turns TF32 on for matmuls;
bf16 and fp16 run the loss under torch.autocast("cuda", dtype=...) (float32 weights and Adam; fp16
scales its loss with torch.amp.GradScaler; no channels_last: there are no convolutions). step's
validation is always the fp32 step. attention: whatever
backend torch.nn.functional.scaled_dot_product_attention picks for fp32 (recorded per record);
validated against dualcast's dumped outputs and gradients (DIR/manifest.json, raw float32 arrays
c{0,1}_{q,k,v,dout,out,dq,dk,dv} at S = 256, B = 2). step: forward, backward and an Adam update
(torch.optim.Adam, its default foreach implementation) of the model of model.hpp written
functionally with dualcast's parameter layout ([in, out] matrices, packed [Wq | Wk | Wv]); validated
first at the configuration of DIR (dualcast's parameters, tokens, loss and gradients), then timed at
the requested size from a fresh GPT-2 initialisation on random tokens (3 rotating batches).
`compile` is torch.compile(fullgraph=True, dynamic=False) of the loss function (AOTAutograd compiles
the backward); compilation is excluded by the warm-up.

Timing: each repetition starts from an idle GPU (synchronize), CUDA events around it; median, p10,
p90, and a pipelined mean (reps back to back). Writes {"meta": ..., "records": [...]}; a method
that fails is recorded with "skipped": reason and the exit status stays 0.
"""

import argparse
import contextlib
import json
import math
import os
import sys
import time
import warnings

import numpy as np

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the driver only calls this script with a python that has torch
    torch = None


def set_precision(tf32=False):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if tf32:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            torch.set_float32_matmul_precision("high")
            return "tf32 on (legacy flags)"
        try:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            torch.set_float32_matmul_precision("highest")
            return "tf32 off (legacy flags)"
        except Exception as exc:
            try:
                torch.backends.fp32_precision = "ieee"
                torch.backends.cuda.matmul.fp32_precision = "ieee"
                return "tf32 off (fp32_precision=ieee; legacy failed: %s)" % exc
            except Exception as exc2:
                return "WARNING: could not disable tf32: %s / %s" % (exc, exc2)


def load_valdir(path):
    with open(os.path.join(path, "manifest.json")) as fh:
        m = json.load(fh)
    types = {"float32": "<f4", "int32": "<i4", "float64": "<f8"}

    def array(name):
        meta = m["arrays"][name]
        data = np.fromfile(os.path.join(path, meta["file"]), dtype=np.dtype(types[meta["dtype"]]))
        return data.reshape([int(s) for s in meta["shape"]])

    return m, array


def rel_err(got, want):
    got = got.detach().double().cpu().numpy()
    want = np.asarray(want, dtype=np.float64)
    scale = max(1e-30, float(np.max(np.abs(want))) if want.size else 0.0)
    d = float(np.max(np.abs(got - want))) if want.size else 0.0
    return d / scale if np.isfinite(d) else math.inf


def sync(cuda):
    if cuda:
        torch.cuda.synchronize()


def time_loop(fn, prepare, reps, warmup, cuda):
    for w in range(warmup):
        prepare(w)
        fn(w)
    sync(cuda)
    times = []
    for k in range(reps):
        prepare(k)
        sync(cuda)
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn(k)
            e1.record()
            torch.cuda.synchronize()
            times.append(e0.elapsed_time(e1))
        else:
            t0 = time.perf_counter()
            fn(k)
            times.append((time.perf_counter() - t0) * 1e3)
    sync(cuda)
    t0 = time.perf_counter()
    if cuda:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
    for k in range(reps):
        prepare(k)
        fn(k)
    if cuda:
        e1.record()
        torch.cuda.synchronize()
        pipelined = e0.elapsed_time(e1) / reps
    else:
        pipelined = (time.perf_counter() - t0) * 1e3 / reps
    t = np.array(times)
    return {"median_ms": float(np.median(t)), "p10_ms": float(np.percentile(t, 10)),
            "p90_ms": float(np.percentile(t, 90)), "pipelined_ms": pipelined, "reps": reps,
            "timer": "cuda-events" if cuda else "cpu-wall"}


# ------------------------------------------------------------------------------------------------
# attention
# ------------------------------------------------------------------------------------------------
def sdpa_backend(q, k, v, causal):
    """The backend PyTorch picks for these arguments (an internal API: best effort)."""
    try:
        choice = torch._fused_sdp_choice(q, k, v, None, 0.0, causal)
        names = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}
        return names.get(int(choice), str(choice))
    except Exception as exc:
        return "unknown (%s)" % type(exc).__name__


# Largest difference from dualcast's validation arrays that the peer's attention may show, per
# --precision: float32 the same sums in another order; 16-bit both sides' own rounding (P and dS
# rounded to 16 bits before their products, 16-bit outputs).
ATTENTION_TOL = {"fp32": 2e-4, "tf32": 2e-4, "bf16": 4e-2, "fp16": 5e-3}


def run_attention(args, dev, cuda):
    """SDPA on q, k, v of --precision's dtype (float32 at fp32 and tf32: attention has no TF32 mode)."""
    records = []
    notes = []
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision, torch.float32)
    tol = ATTENTION_TOL[args.precision]
    _, array = load_valdir(args.valdir) if args.valdir else (None, None)
    valid = {}
    for c in args.causal:
        p = "c%d_" % c
        try:
            q, k, v, g = (torch.tensor(array(p + n), device=dev).to(dtype).requires_grad_(n != "dout")
                          for n in ("q", "k", "v", "dout"))
            out = F.scaled_dot_product_attention(q, k, v, is_causal=bool(c))
            out.backward(g)
            err = max(rel_err(out, array(p + "out")), rel_err(q.grad, array(p + "dq")),
                      rel_err(k.grad, array(p + "dk")), rel_err(v.grad, array(p + "dv")))
            valid[c] = (err <= tol, err)
            notes.append("causal=%d: max rel err %.2e vs dualcast at S=%d" % (c, err, q.shape[2]))
        except Exception as exc:
            valid[c] = (None, None)
            notes.append("causal=%d: not validated (%s)" % (c, exc))
    H, D = args.heads, args.head_dim
    for S in args.seqs:
        for c in args.causal:
            B = max(1, args.tokens // S)
            base = {"seq": S, "causal": c, "batch": B, "method": "torch_sdpa", "precision": args.precision,
                    "validated": valid.get(c, (None, None))[0], "max_rel_err": valid.get(c, (None, None))[1]}
            try:
                gen = torch.Generator(device=dev).manual_seed(S * 2 + c)
                q, k, v = (torch.randn(B, H, S, D, device=dev, generator=gen, dtype=dtype, requires_grad=True)
                           for _ in range(3))
                g = torch.randn(B, H, S, D, device=dev, generator=gen, dtype=dtype)
                base["backend"] = sdpa_backend(q, k, v, bool(c))
                flops_fwd = 4.0 * B * H * S * S * D * (0.5 if c else 1.0)

                def fwd(_):
                    with torch.no_grad():
                        F.scaled_dot_product_attention(q, k, v, is_causal=bool(c))

                def fwd_bwd(_):
                    F.scaled_dot_product_attention(q, k, v, is_causal=bool(c)).backward(g)

                def prepare(_):
                    q.grad = k.grad = v.grad = None

                for phase, fn, flops in (("fwd", fwd, flops_fwd), ("fwd+bwd", fwd_bwd, 3.5 * flops_fwd)):
                    t = time_loop(fn, prepare, args.reps, args.warmup, cuda)
                    r = dict(base, phase=phase, **t)
                    r["tflops"] = flops / (t["median_ms"] * 1e-3) / 1e12
                    records.append(r)
                    print("peer: torch sdpa S=%d causal=%d %s: %.3f ms (%s)" % (S, c, phase, t["median_ms"],
                                                                               base["backend"]), file=sys.stderr)
                del q, k, v, g
            except Exception as exc:
                records.append(dict(base, phase="fwd+bwd", skipped="%s: %s" % (type(exc).__name__, exc)))
            if cuda:
                torch.cuda.empty_cache()
    return records, notes


# ------------------------------------------------------------------------------------------------
# the transformer training step
# ------------------------------------------------------------------------------------------------
def param_shapes(L, C, T, V, ratio):
    shapes = [("E", (V, C)), ("P", (T, C))]
    for l in range(L):
        p = "l%d." % l
        shapes += [(p + "ln1_g", (C,)), (p + "ln1_b", (C,)), (p + "Wqkv", (C, 3 * C)), (p + "bqkv", (3 * C,)),
                   (p + "Wo", (C, C)), (p + "bo", (C,)), (p + "ln2_g", (C,)), (p + "ln2_b", (C,)),
                   (p + "W1", (C, ratio * C)), (p + "c1", (ratio * C,)), (p + "W2", (ratio * C, C)), (p + "c2", (C,))]
    shapes += [("lnf_g", (C,)), ("lnf_b", (C,)), ("Wout", (C, V)), ("bout", (V,))]
    return shapes


def make_loss(L, H, C):
    """The model of model.hpp as a function of (list of parameters in param_shapes order, tokens [T+1, B])."""

    def loss_fn(params, tokens):
        E, P = params[0], params[1]
        Tp1, B = tokens.shape
        T = Tp1 - 1
        bt = tokens.t()
        x = E[bt[:, :T]] + P[:T]                      # [B, T, C]
        h = x.reshape(B * T, C)
        for l in range(L):
            g1, b1, Wqkv, bqkv, Wo, bo, g2, b2, W1, c1, W2, c2 = params[2 + 12 * l: 14 + 12 * l]
            a = F.layer_norm(h, (C,), g1, b1, 1e-5)
            qkv = (a @ Wqkv + bqkv).view(B, T, 3, H, C // H).permute(2, 0, 3, 1, 4)
            o = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
            h = h + o.permute(0, 2, 1, 3).reshape(B * T, C) @ Wo + bo
            u = F.gelu(F.layer_norm(h, (C,), g2, b2, 1e-5) @ W1 + c1)   # exact (erf) gelu
            h = h + u @ W2 + c2
        gf, bf, Wout, bout = params[2 + 12 * L: 6 + 12 * L]
        logits = F.layer_norm(h, (C,), gf, bf, 1e-5) @ Wout + bout
        return F.cross_entropy(logits, bt[:, 1:].reshape(-1))

    return loss_fn


def init_params(shapes, L, dev, seed):
    """GPT-2's initialisation, as model.cu (values differ from dualcast's: a different generator)."""
    gen = torch.Generator(device=dev).manual_seed(seed)
    out = []
    for name, shape in shapes:
        base = name.split(".")[-1]
        if base.startswith("ln") and base.endswith("_g") or name == "lnf_g":
            t = torch.ones(shape, device=dev)
        elif len(shape) == 1:
            t = torch.zeros(shape, device=dev)
        else:
            std = 0.02 / math.sqrt(2.0 * L) if base in ("Wo", "W2") else 0.02
            t = torch.randn(shape, device=dev, generator=gen) * std
        out.append(t.requires_grad_(True))
    return out


def run_step(args, dev, cuda):
    records = []
    m, array = load_valdir(args.valdir)
    sc = m["scalars"]
    L, H, C, T, V, R = (int(sc[k]) for k in ("layers", "heads", "width", "context", "vocab", "mlp_ratio"))
    names = m["param_names"]
    if [n for n, _ in param_shapes(L, C, T, V, R)] != names:
        raise SystemExit("peer_torch.py: the validation directory's parameters are not this model's")
    for method in args.methods:
        rec = {"method": method, "phase": "step", "precision": args.precision}
        set_precision()  # the validation below is the fp32 step, whatever the timing's precision
        try:
            # ---- validation at the directory's size, dualcast's parameters and tokens ----
            loss_small = make_loss(L, H, C)
            if method == "compile":
                loss_small = torch.compile(loss_small, fullgraph=True, dynamic=False)
            params = [torch.tensor(array("param_" + n), device=dev, requires_grad=True) for n in names]
            tokens = torch.tensor(array("tokens").astype(np.int64), device=dev)
            loss = loss_small(params, tokens)
            loss.backward()
            errs = [abs(loss.item() - float(sc["loss"])) / abs(float(sc["loss"]))]
            worst = "loss"
            for n, p in zip(names, params):
                e = rel_err(p.grad, array("grad_" + n))
                if e > max(errs):
                    worst = n
                errs.append(e)
            rec["max_rel_err"] = max(errs)
            rec["validated"] = max(errs) <= 1e-3
            rec["note"] = "loss and %d gradients vs dualcast at L=%d C=%d T=%d: max rel err %.2e (%s)" % (
                len(names), L, C, T, max(errs), worst)
            del params, tokens, loss
            # ---- timing at the requested size, at --precision ----
            set_precision(tf32=args.precision == "tf32")
            half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
            scaler = torch.amp.GradScaler("cuda") if args.precision == "fp16" else None
            autocast = (lambda: torch.autocast(dev.type, dtype=half)) if half is not None else contextlib.nullcontext
            shapes = param_shapes(args.layers, args.width, args.context, V, R)
            params = init_params(shapes, args.layers, dev, 1)
            opt = torch.optim.Adam(params, lr=args.lr)
            fn = make_loss(args.layers, args.heads, args.width)
            if method == "compile":
                fn = torch.compile(fn, fullgraph=True, dynamic=False)
            gen = torch.Generator(device=dev).manual_seed(5)
            sets = [torch.randint(0, V, (args.context + 1, args.batch), device=dev, generator=gen) for _ in range(3)]

            def step(k):
                with autocast():
                    loss = fn(params, sets[k % 3])  # autocast computes the cross-entropy in float32
                if scaler is None:
                    loss.backward()
                    opt.step()
                else:
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    scaler.update()

            def prepare(_):
                opt.zero_grad(set_to_none=True)

            warmup = max(args.warmup, 3 if method == "compile" else 1)
            rec.update(time_loop(step, prepare, args.reps, warmup, cuda))
            print("peer: torch %s step: %.3f ms (%s)" % (method, rec["median_ms"], rec["note"]), file=sys.stderr)
            del params, opt, sets
        except Exception as exc:
            rec["skipped"] = "%s: %s" % (type(exc).__name__, exc)
            print("peer: torch %s: skipped: %s" % (method, rec["skipped"]), file=sys.stderr)
        records.append(rec)
        if cuda:
            torch.cuda.empty_cache()
    return records


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("attention", "step"))
    ap.add_argument("--valdir", default="")
    ap.add_argument("--seqs", default="128,256,512,1024,2048,4096")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--methods", default="eager,compile")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--precision", default="fp32", choices=("fp32", "tf32", "bf16", "fp16"),
                    help="step: of the timed steps (validation is always fp32); attention: the dtype of "
                         "q, k, v (bf16, fp16; float32 otherwise)")
    ap.add_argument("--allow-cpu", action="store_true", help="run on the CPU when there is no GPU (tests only)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    args.seqs = [int(s) for s in args.seqs.split(",") if s]
    args.causal = [int(s) for s in args.causal.split(",") if s]
    args.methods = [s for s in args.methods.split(",") if s]
    if torch is None:
        raise SystemExit("peer_torch.py: torch is not installed")
    cuda = torch.cuda.is_available()
    if not cuda and not args.allow_cpu:
        raise SystemExit("peer_torch.py: no CUDA device (pass --allow-cpu to run on the CPU)")
    dev = torch.device("cuda" if cuda else "cpu")
    meta = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0) if cuda else "cpu",
            "precision": args.precision, "precision_settings": set_precision(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if args.what == "attention":
        records, notes = run_attention(args, dev, cuda)
        meta["validation"] = notes
    else:
        records = run_step(args, dev, cuda)
    with open(args.out, "w") as fh:
        json.dump({"meta": meta, "records": records}, fh, indent=1)


if __name__ == "__main__":
    main()
