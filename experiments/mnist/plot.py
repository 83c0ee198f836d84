#!/usr/bin/env python3
"""Plots the per-epoch metrics that mnist_train --out writes: training loss, test loss and test
accuracy against the epoch, one line per CSV file (a run), into one PNG.

    python3 experiments/mnist/plot.py results/mnist/*.csv -o results/mnist/curves.png

Arguments are CSV files or directories (every *.csv inside is taken). Each run is labelled with its
file stem (mlp_sgd_cpu, ...) unless --labels gives names. Needs matplotlib (Debian python3-matplotlib).
"""
import argparse
import csv
import os
import sys


def read_run(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    need = {"epoch", "train_loss", "test_loss", "test_accuracy"}
    if not rows:
        raise ValueError(f"{path}: no rows")
    missing = need - set(rows[0])
    if missing:
        raise ValueError(f"{path}: not an mnist_train CSV (missing columns {sorted(missing)})")
    run = {k: [float(r[k]) for r in rows] for k in rows[0] if k in need | {"epoch_seconds"}}
    return run


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", help="mnist_train CSV files or directories of them")
    ap.add_argument("-o", "--output", default="mnist_curves.png", help="PNG to write")
    ap.add_argument("--labels", nargs="*", help="one label per CSV, in order")
    ap.add_argument("--title", default="Fashion-MNIST training (dualcast)")
    args = ap.parse_args(argv)

    files = []
    for p in args.inputs:
        if os.path.isdir(p):
            files += sorted(os.path.join(p, f) for f in os.listdir(p) if f.endswith(".csv"))
        elif os.path.isfile(p):
            files.append(p)
        else:
            ap.error(f"{p}: no such file or directory")
    if not files:
        ap.error("no CSV files found")
    if args.labels and len(args.labels) != len(files):
        ap.error(f"--labels gives {len(args.labels)} names for {len(files)} files")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, path in enumerate(files):
        try:
            run = read_run(path)
        except (OSError, ValueError, KeyError) as e:
            print(f"plot.py: {e}", file=sys.stderr)
            return 1
        label = args.labels[i] if args.labels else os.path.splitext(os.path.basename(path))[0]
        line, = ax_loss.plot(run["epoch"], run["train_loss"], marker="o", ms=3, label=f"{label} train")
        ax_loss.plot(run["epoch"], run["test_loss"], ls="--", color=line.get_color(), label=f"{label} test")
        ax_acc.plot(run["epoch"], [100 * a for a in run["test_accuracy"]], marker="o", ms=3,
                    color=line.get_color(), label=label)
    for ax in (ax_loss, ax_acc):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_loss.set_xlabel("epoch")
    ax_loss.set_ylabel("cross-entropy")
    ax_loss.set_title("loss (solid: train mean over the epoch, dashed: test)")
    ax_loss.grid(alpha=0.3)
    ax_loss.legend(fontsize=7)
    ax_acc.set_xlabel("epoch")
    ax_acc.set_ylabel("test accuracy (%)")
    ax_acc.set_title("test accuracy")
    ax_acc.grid(alpha=0.3)
    ax_acc.legend(fontsize=7)
    fig.suptitle(args.title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    fig.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
