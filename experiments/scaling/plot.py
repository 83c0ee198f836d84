#!/usr/bin/env python3
"""Figure of the scaling study from study.py's scaling.json: weak-scaling efficiency (with the
targets), throughput at a fixed batch per GPU, and strong-scaling speedup (with the ideal line),
against the number of GPUs, for both models and both frameworks.

    python3 experiments/scaling/plot.py results/scaling/scaling.json -o results/scaling/scaling.png

Needs matplotlib (exit status 1 with a message without it).
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from derive import UNIT, WEAK_TARGETS  # noqa: E402

NAMES = {"resnet": "ResNet-18", "hmlstm": "HM-LSTM"}
COLORS = {"resnet": "tab:blue", "hmlstm": "tab:orange"}
# dualcast: solid lines; PyTorch DDP: dashed, so a model keeps its colour across frameworks
STYLES = {"dualcast": "-", "torch": "--"}


def series(rows, key):
    """(gpus, values) of the rows where `key` has a value: a failed or skipped run leaves a gap."""
    pts = [(r["gpus"], r[key]) for r in rows if r.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", help="scaling.json written by study.py")
    ap.add_argument("-o", "--out", default="", help="PNG to write (default: scaling.png beside the JSON)")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot.py: matplotlib is not installed (pip install matplotlib); no figure written", file=sys.stderr)
        return 1
    with open(args.json) as fh:
        study = json.load(fh)
    derived = study["derived"]["models"]
    gpus_list = study.get("gpus_list") or [1]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    ax_eff, ax_thr, ax_strong = axes

    for model, tables in derived.items():
        c, name = COLORS.get(model, "k"), NAMES.get(model, model)
        for fw, key in (("dualcast", "dualcast_eff"), ("torch", "torch_eff")):
            x, y = series(tables["weak"], key)
            if x:
                ax_eff.plot(x, y, STYLES[fw], marker="o", color=c, label="%s %s" % (name, fw))
        for fw, key in (("dualcast", "dualcast_throughput"), ("torch", "torch_throughput")):
            x, y = series(tables["weak"], key)
            if x:
                ax_thr.plot(x, y, STYLES[fw], marker="o", color=c, label="%s %s (%s)" % (name, fw, UNIT[model]))
        for fw, key in (("dualcast", "dualcast_speedup"), ("torch", "torch_speedup")):
            x, y = series(tables["strong"], key)
            if x:
                ax_strong.plot(x, y, STYLES[fw], marker="o", color=c, label="%s %s" % (name, fw))
    for model, n, thr in WEAK_TARGETS:
        if model in derived:
            ax_eff.plot([n], [thr], marker="v", markersize=10, linestyle="none", color=COLORS[model],
                        markeredgecolor="k", label="target %s, %d GPUs: %.2f" % (NAMES[model], n, thr))

    ax_eff.axhline(1.0, color="0.6", linewidth=0.8)
    ax_eff.set_title("Weak scaling: efficiency t(1) / t(N)\n(fixed batch per GPU; dualcast captured step)")
    ax_eff.set_ylabel("efficiency")
    lo = min([min(line.get_ydata()) for line in ax_eff.get_lines() if len(line.get_ydata())] + [0.9])
    ax_eff.set_ylim(max(0.0, lo - 0.05), 1.05)
    ax_thr.set_yscale("log")
    ax_thr.set_title("Throughput at a fixed batch per GPU (weak scaling)")
    ax_thr.set_ylabel("items per second (global)")
    ax_strong.plot(gpus_list, gpus_list, ":", color="0.4", label="ideal (speedup = N)")
    ax_strong.set_title("Strong scaling: speedup t(1) / t(N)\n(fixed global batch)")
    ax_strong.set_ylabel("speedup")
    for ax in axes:
        ax.set_xlabel("GPUs")
        ax.set_xticks(gpus_list)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Data-parallel scaling, dualcast vs PyTorch DDP: %s; float32, TF32 off, same machine, same run"
                 % (study.get("device_name") or "GPU unknown"), fontsize=10)
    fig.tight_layout()
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(args.json)), "scaling.png")
    fig.savefig(out, dpi=130)
    print("plot.py: wrote %s" % out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
