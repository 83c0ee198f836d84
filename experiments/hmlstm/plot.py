#!/usr/bin/env python3
"""Plots of the HM-LSTM experiment from the driver's results.json (matplotlib; PNGs beside it).

  time_vs_size.png   a and b: time per forward+backward vs dims, every method, the memory floor
  speedup.png        a, b and d: reverse/mixed and best-peer/mixed vs dims
  arity.png          c: time vs K (mixed recompute, mixed store, reverse, floor 3K+2 values)
  divergence.png     d: row-uniform vs divergent flags, per method
  training.png       e: train / validation bits per character vs step, mixed and reverse

Usage: plot.py [RESULTS_DIR]   (default results/hmlstm).  Exits 0 with a message when matplotlib is
missing; plots whose data are absent are skipped.
"""

import json
import math
import os
import sys

PEERS = ("eager", "compile", "jax", "jax_remat", "numpy")
STYLE = {
    "mixed": dict(color="C0", marker="o", label="dualcast mixed (recompute)"),
    "mixed_store": dict(color="C0", marker="s", ls="--", label="dualcast mixed (store)"),
    "reverse": dict(color="C3", marker="^", label="dualcast reverse (select form)"),
    "mixed_graph": dict(color="C0", marker="o", ls=":", label="dualcast mixed, captured (Graph replay)"),
    "reverse_graph": dict(color="C3", marker="^", ls=":", label="dualcast reverse, captured (Graph replay)"),
    "eager": dict(color="C1", marker="v", label="PyTorch eager"),
    "compile": dict(color="C2", marker="D", label="torch.compile"),
    "jax": dict(color="C4", marker="P", label="JAX jit(vjp)"),
    "jax_remat": dict(color="C5", marker="X", label="JAX + checkpoint"),
    "numpy": dict(color="C7", marker=".", label="numpy (test double)"),
}


def finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


def main(argv):
    d = argv[1] if len(argv) > 1 else os.path.join("results", "hmlstm")
    path = os.path.join(d, "results.json")
    if not os.path.isfile(path):
        print("plot.py: %s not found (run the driver first)" % path, file=sys.stderr)
        return 1
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot.py: matplotlib is not installed for %s: plots skipped "
              "(apt-get install python3-matplotlib, or run with /usr/bin/python3)" % sys.executable)
        return 0
    with open(path) as fh:
        res = json.load(fh)
    meas = res.get("measurements", [])
    meta = res.get("meta", {})
    dev = "%s (%s)" % (meta.get("device", "?"), meta.get("device_name", "?"))
    written = []

    def save(fig, name):
        fig.tight_layout()
        out = os.path.join(d, name)
        fig.savefig(out, dpi=120)
        plt.close(fig)
        written.append(out)

    def series(workload, method, variant=None):
        pts = {}
        for m in meas:
            if m["workload"] != workload or m["method"] != method:
                continue
            if variant is not None and m.get("variant", "") != variant:
                continue
            if finite(m.get("median_ms")):
                pts[m["dims"]] = m["median_ms"]
        return sorted(pts.items())

    def floors(workload, variant=None):
        pts = {}
        for m in meas:
            if m["workload"] == workload and finite(m.get("floor_ms")) and m["floor_ms"] > 0:
                if variant is None or m.get("variant", "") == variant:
                    pts[m["dims"]] = m["floor_ms"]
        return sorted(pts.items())

    methods = [k for k in STYLE if any(m["method"] == k for m in meas)]

    # ---- time vs size ----
    wl = [w for w in ("a", "b") if any(m["workload"] == w for m in meas)]
    if wl:
        fig, axes = plt.subplots(1, len(wl), figsize=(6.5 * len(wl), 4.8), squeeze=False)
        for ax, w in zip(axes[0], wl):
            for meth in methods:
                s = series(w, meth, "")
                if s:
                    ax.plot([x for x, _ in s], [y * 1e3 for _, y in s], **STYLE[meth])
            fl = floors(w, "")
            if fl:
                ax.plot([x for x, _ in fl], [y * 1e3 for _, y in fl], color="k", ls=":", label="memory floor")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("dims (inputs are dims x dims)")
            ax.set_ylabel("time per forward+backward (us)")
            ax.set_title({"a": "a: cell update (K=4)", "b": "b: full cell (K=6, 2 outputs)"}[w])
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle("HM-LSTM cell, fp32, " + dev)
        save(fig, "time_vs_size.png")

    # ---- speedup ----
    wl = [w for w in ("a", "b", "d") if any(m["workload"] == w for m in meas)]
    if wl:
        fig, ax = plt.subplots(figsize=(7, 4.8))
        for w in wl:
            variant = "uniform" if w == "d" else ""
            mixed = dict(series(w, "mixed", variant))
            rev = dict(series(w, "reverse", variant))
            xs = sorted(k for k in mixed if k in rev)
            if xs:
                ax.plot(xs, [rev[x] / mixed[x] for x in xs], marker="o",
                        label="%s: reverse / mixed" % (w if w != "d" else "d (uniform)"))
            peer = {}
            for p in PEERS:
                for x, y in series(w, p):
                    peer[x] = min(peer.get(x, float("inf")), y)
            xs = sorted(k for k in mixed if k in peer)
            if xs:
                ax.plot(xs, [peer[x] / mixed[x] for x in xs], marker="s", ls="--",
                        label="%s: best peer / mixed" % w)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("dims")
        ax.set_ylabel("speedup of mixed mode (x)")
        ax.set_title("Mixed-mode speedup, " + dev)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        save(fig, "speedup.png")

    # ---- arity ----
    arity = [m for m in meas if m["workload"] == "c"]
    if arity:
        fig, ax = plt.subplots(figsize=(7, 4.8))

        def k_of(m):
            return int(m["variant"].split("=")[1])
        for meth in ("mixed", "mixed_store", "reverse"):
            pts = sorted((k_of(m), m["median_ms"]) for m in arity if m["method"] == meth and finite(m["median_ms"]))
            if pts:
                ax.plot([k for k, _ in pts], [t * 1e3 for _, t in pts], **STYLE[meth])
        fl = sorted({k_of(m): m["floor_ms"] for m in arity if finite(m.get("floor_ms"))}.items())
        if fl:
            ax.plot([k for k, _ in fl], [t * 1e3 for _, t in fl], color="k", ls=":", label="memory floor (3K+2 values)")
        ax.set_xlabel("K (differentiated arguments)")
        ax.set_ylabel("time per forward+backward (us)")
        ax.set_title("c: prod_k tanh(x_k > 0.5 ? x_k : -x_k) at %d^2, %s" % (arity[0]["dims"], dev))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        save(fig, "arity.png")

    # ---- divergence ----
    dm = [m for m in meas if m["workload"] == "d"]
    if dm:
        dims = sorted({m["dims"] for m in dm})
        meths = [x for x in ("mixed", "mixed_store", "reverse") if any(m["method"] == x for m in dm)]
        fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(dims) * len(meths)), 4.8))
        width = 0.8 / (2 * len(meths))
        for i, meth in enumerate(meths):
            for j, variant in enumerate(("uniform", "divergent")):
                s = dict(series("d", meth, variant))
                ys = [s.get(x, float("nan")) * 1e3 for x in dims]
                pos = [q + (2 * i + j) * width for q in range(len(dims))]
                ax.bar(pos, ys, width, color={"mixed": "C0", "mixed_store": "C9", "reverse": "C3"}[meth], alpha=1.0 if j == 0 else 0.5,
                       hatch=None if j == 0 else "//", label="%s, %s flags" % (meth, variant))
        ax.set_xticks([q + 0.4 - width / 2 for q in range(len(dims))])
        ax.set_xticklabels([str(x) for x in dims])
        ax.set_yscale("log")
        ax.set_xlabel("dims")
        ax.set_ylabel("time per forward+backward (us)")
        ax.set_title("d: row-uniform [dims,1] vs divergent [1,dims] flags, " + dev)
        ax.legend(fontsize=7, ncol=2)
        save(fig, "divergence.png")

    # ---- training ----
    tr = res.get("training") or {}
    if tr.get("mixed") and tr.get("reverse"):
        fig, ax = plt.subplots(figsize=(7, 4.8))
        # mixed drawn wide underneath, reverse thin on top: identical curves stay visible
        for mode, color, lw, ms in (("mixed", "C0", 4.0, 6), ("reverse", "C3", 1.3, 3)):
            l = tr[mode]
            ax.plot(l["step"], l["train_bpc"], color=color, lw=lw, marker="o", ms=ms, alpha=0.8,
                    label="%s: train" % mode)
            if l.get("valid_bpc"):
                ax.plot(l["step"], l["valid_bpc"], color=color, lw=lw, ls="--", alpha=0.8,
                        label="%s: validation" % mode)
        diff = tr.get("max_abs_diff_bpc")
        ax.set_xlabel("update")
        ax.set_ylabel("bits per character")
        ax.set_title("e: HM-LSTM character LM (%s)\nmixed vs reverse: max |diff| %s bits/char, curves %s"
                     % (tr.get("config", ""), "%.2g" % diff if finite(diff) else "?",
                        "agree" if tr.get("curves_agree") else "DISAGREE"), fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        save(fig, "training.png")

    for w in written:
        print("plot.py: wrote", w)
    if not written:
        print("plot.py: nothing to plot in", path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
