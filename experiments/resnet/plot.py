#!/usr/bin/env python3
"""Curves of resnet_train runs: training and test loss, test accuracy and seconds per epoch.

    python3 experiments/resnet/plot.py RUN.csv [RUN2.csv ...] -o curves.png

Each CSV is one run (resnet_train --out DIR --name STEM writes DIR/STEM.csv); runs share the axes,
labelled by file stem. Needs matplotlib.
"""

import argparse
import csv
import os
import sys


def read(path):
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        raise SystemExit("plot.py: %s has no epochs" % path)
    cols = {k: [float(r[k]) for r in rows] for k in rows[0]}
    return cols


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+")
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    for path in args.csv:
        c = read(path)
        label = os.path.splitext(os.path.basename(path))[0]
        ax[0].plot(c["epoch"], c["train_loss"], "-o", ms=3, label=label + " train")
        ax[0].plot(c["epoch"], c["test_loss"], "--s", ms=3, label=label + " test")
        ax[1].plot(c["epoch"], [100 * a for a in c["test_accuracy"]], "-o", ms=3, label=label)
        ax[2].plot(c["epoch"], c["epoch_seconds"], "-o", ms=3, label=label)
    ax[0].set(xlabel="epoch", ylabel="cross-entropy", title="loss", yscale="log")
    ax[1].set(xlabel="epoch", ylabel="test accuracy (%)", title="Fashion-MNIST test accuracy")
    ax[1].axhline(93, color="grey", lw=0.8, ls=":")
    ax[2].set(xlabel="epoch", ylabel="seconds", title="training time per epoch")
    for a in ax:
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print("plot.py: wrote %s" % args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
