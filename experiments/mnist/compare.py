#!/usr/bin/env python3
"""Compares the per-epoch curves of two mnist_train runs of the same configuration and seed, e.g.
the CPU and the GPU run, and says whether they agree:

    python3 experiments/mnist/compare.py results/mnist/mlp_adam_cosine_cpu.csv \\
        results/studies/mnist/mlp_adam_cosine_cuda.csv

Both runs start from the same weights and visit the batches in the same order, so their curves
differ only through float32 rounding (the CPU and GPU sum in different orders), which grows slowly
over training. The tolerances below bound that drift; a real bug (a wrong gradient, a different
shuffle) moves the curves far more. Exit status 0 when every epoch agrees, 1 when not, 2 on bad
input. Uses only the standard library.
"""
import argparse
import csv
import sys

# Largest relative difference of a per-epoch mean loss, and largest difference of test accuracy
# (fraction of the 10,000 test images), accepted as float32 rounding drift.
LOSS_RTOL = 0.02
ACCURACY_ATOL = 0.005


def read(path):
    need = ("epoch", "train_loss", "test_loss", "test_accuracy", "epoch_seconds")
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        if not rows or any(k not in rows[0] for k in need):
            raise ValueError(f"not an mnist_train CSV (needs columns {', '.join(need)})")
        return [{k: float(r[k]) for k in need} for r in rows]
    except (OSError, ValueError) as exc:  # bad input is status 2; 1 means the curves differ
        print(f"compare.py: {path}: {exc}", file=sys.stderr)
        sys.exit(2)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", help="first run's CSV (e.g. the CPU run)")
    ap.add_argument("b", help="second run's CSV (e.g. the GPU run)")
    ap.add_argument("--loss-rtol", type=float, default=LOSS_RTOL,
                    help="relative loss tolerance (default %(default)s; a data-parallel run against "
                         "one process on the same batches differs only in summation order: 1e-4)")
    args = ap.parse_args(argv)
    ra, rb = read(args.a), read(args.b)
    if len(ra) != len(rb):
        print(f"compare.py: {args.a} has {len(ra)} epochs, {args.b} has {len(rb)}", file=sys.stderr)
        return 2
    worst_loss = worst_acc = 0.0
    print("epoch  train_loss a / b          test_loss a / b           accuracy a / b     seconds a / b")
    for x, y in zip(ra, rb):
        for k in ("train_loss", "test_loss"):
            worst_loss = max(worst_loss, abs(x[k] - y[k]) / max(abs(x[k]), 1e-12))
        worst_acc = max(worst_acc, abs(x["test_accuracy"] - y["test_accuracy"]))
        print(f"{int(x['epoch']):5d}  {x['train_loss']:.6f} / {y['train_loss']:.6f}   "
              f"{x['test_loss']:.6f} / {y['test_loss']:.6f}   "
              f"{x['test_accuracy']:.4f} / {y['test_accuracy']:.4f}   "
              f"{x['epoch_seconds']:.2f} / {y['epoch_seconds']:.2f}")
    ok = worst_loss <= args.loss_rtol and worst_acc <= ACCURACY_ATOL
    print(f"largest loss difference {worst_loss:.2e} (relative, tolerance {args.loss_rtol}), largest accuracy "
          f"difference {worst_acc:.4f} (tolerance {ACCURACY_ATOL}): {'agree' if ok else 'DIFFER'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
