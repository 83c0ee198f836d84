#!/usr/bin/env python3
"""Compares the bits/char curves of two hmlstm_dp --train-steps runs on the same global batches (one
process against N ranks, each on batch/N sequences): they differ only in the order of sums, so every
logged training and validation entry must agree within --tol bits/char. Exit status 0 when they do,
1 when not, 2 on bad input. Standard library only.

    python3 experiments/hmlstm/compare_dp.py OUT/g1.json OUT/g2.json [--tol 1e-4]
"""
import argparse
import json
import sys


def curve(path):
    try:
        with open(path) as f:
            t = json.load(f)["training"]
        return t["step"], t["train_bpc"], t["valid_bpc"]
    except (OSError, ValueError, KeyError) as exc:
        print(f"compare_dp.py: {path}: not an hmlstm_dp training record ({exc})", file=sys.stderr)
        sys.exit(2)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--tol", type=float, default=1e-4, help="bits/char (default %(default)s)")
    args = ap.parse_args()
    sa, ta, va = curve(args.a)
    sb, tb, vb = curve(args.b)
    if sa != sb or not sa:
        print(f"compare_dp.py: the runs logged different steps ({sa} vs {sb})", file=sys.stderr)
        return 2
    worst = max(abs(x - y) for x, y in zip(ta + va, tb + vb))
    ok = worst <= args.tol
    print(f"{len(sa)} entries, steps {sa[0]}..{sa[-1]}: largest difference {worst:.2e} bits/char "
          f"(tolerance {args.tol}): {'curves agree' if ok else 'curves DIFFER'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
