#!/usr/bin/env python3
"""Figures of experiments/transformer from the drivers' results.json.

    plot.py results/transformer   -> training.png (bits/char against training time: transformer and
                                     HM-LSTM, validation solid, training dashed), step.png (ms per
                                     training step: dualcast fused / composed, PyTorch eager / compile)
    plot.py results/attention     -> attention.png (forward+backward ms against sequence length,
                                     fused / composed / PyTorch, without and with the causal mask) and
                                     attention_tflops.png
Needs matplotlib (the Agg backend: no display).
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_training(d, res):
    tr = res.get("training", {})
    if not tr:
        return []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, color in (("transformer", "tab:blue"), ("hmlstm", "tab:orange")):
        log = tr.get(name)
        if not log:
            continue
        label = "transformer" if name == "transformer" else "HM-LSTM"
        ax.plot(log["train_seconds"], log["valid_bpc"], "-o", ms=3, color=color, label=label + " (validation)")
        ax.plot(log["train_seconds"], log["train_bpc"], "--", color=color, alpha=0.6, label=label + " (training)")
    eq = tr.get("equal_time")
    if eq:
        ax.axvline(eq["equal_time_seconds"], color="gray", lw=0.8, ls=":")
    ax.set_xlabel("training time (s)")
    ax.set_ylabel("bits per character")
    ax.set_title("character LM on the license texts, %s" % res.get("meta", {}).get("device", ""))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = os.path.join(d, "training.png")
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return [out]


def plot_steps(d, res):
    recs = [r for r in res.get("step_timing", []) if isinstance(r.get("median_ms"), (int, float))]
    if not recs:
        return []
    names = [r["method"] if r["method"].startswith("dualcast") else "torch " + r["method"] for r in recs]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.barh(names, [r["median_ms"] for r in recs], color=["tab:blue" if n.startswith("dualcast") else "tab:gray" for n in names])
    ax.set_xlabel("ms per training step (forward, backward, Adam)")
    ax.set_title(res.get("meta", {}).get("config", ""), fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    out = os.path.join(d, "step.png")
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return [out]


def plot_attention(d, res):
    recs = [r for r in res.get("records", []) if r.get("phase") == "fwd+bwd" and isinstance(r.get("median_ms"), (int, float))]
    if not recs:
        return []
    outs = []
    for key, ylabel, fname in (("median_ms", "forward+backward (ms)", "attention.png"),
                               ("tflops", "TFLOP/s (14 B H S^2 D, halved when causal)", "attention_tflops.png")):
        fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=(key == "tflops"))
        for ax, causal in zip(axes, (0, 1)):
            for method, color in (("dualcast_fused", "tab:blue"), ("dualcast_composed", "tab:orange"),
                                  ("torch_sdpa", "tab:gray")):
                pts = sorted((r["seq"], r[key]) for r in recs if r["method"] == method and r["causal"] == causal
                             and isinstance(r.get(key), (int, float)))
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], "-o", ms=3, color=color, label=method)
            ax.set_xscale("log", base=2)
            if key == "median_ms":
                ax.set_yscale("log")
            ax.set_xlabel("sequence length")
            ax.set_ylabel(ylabel)
            ax.set_title("causal" if causal else "no mask")
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=8)
        m = res.get("meta", {})
        fig.suptitle("attention fp32, %s heads, head_dim %s, %s tokens/batch, %s" % (
            m.get("heads"), m.get("head_dim"), m.get("tokens"), m.get("device")), fontsize=9)
        fig.tight_layout()
        out = os.path.join(d, fname)
        fig.savefig(out, dpi=130)
        plt.close(fig)
        outs.append(out)
    return outs


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    d = sys.argv[1]
    try:
        with open(os.path.join(d, "results.json")) as fh:
            res = json.load(fh)
    except (OSError, ValueError) as exc:
        print("plot.py: cannot read %s/results.json: %s" % (d, exc), file=sys.stderr)
        return 2
    outs = plot_training(d, res) + plot_steps(d, res) + plot_attention(d, res)
    for o in outs:
        print("wrote " + o)
    return 0


if __name__ == "__main__":
    sys.exit(main())
