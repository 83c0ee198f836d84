#!/usr/bin/env python3
"""Runs experiments/transformer end to end: transformer_experiment (training curves, step timing,
HM-LSTM at equal time), optionally attention_bench, then plot.py on each results folder. Builds
nothing itself.

    python3 experiments/transformer/run.py [--build DIR] [--bench] [--no-plots] [--out DIR]
                                           [--bench-out DIR] [-- DRIVER OPTIONS...]

The drivers are looked for in --build DIR, else in build/release, build/ci, build/cpu-only,
build-cuda, build (a CUDA-enabled build first when a GPU is present). Options after `--` go to
transformer_experiment (e.g. --peers, --steps 3000); --bench-args "..." go to attention_bench.
"""

import argparse
import os
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CANDIDATES = ("build/release", "build/ci", "build/cpu-only", "build-cuda", "build")
sys.path.insert(0, os.path.join(ROOT, "experiments", "common"))
from runner import find_binary, gpu_present, python_with  # noqa: E402


def find(binary, build):
    return find_binary(ROOT, os.path.join("experiments", "transformer", binary), build, CANDIDATES, gpu_present())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", help="build folder holding experiments/transformer/*")
    ap.add_argument("--out", default=os.path.join("results", "transformer"))
    ap.add_argument("--bench", action="store_true", help="also run attention_bench")
    ap.add_argument("--bench-out", default=os.path.join("results", "attention"))
    ap.add_argument("--bench-args", default="", help="options for attention_bench (one string)")
    ap.add_argument("--no-plots", action="store_true")
    args, rest = ap.parse_known_args()
    if rest and rest[0] == "--":
        rest = rest[1:]
    jobs = [("transformer_experiment", ["--out", args.out] + rest, args.out)]
    if args.bench:
        jobs.append(("attention_bench", ["--out", args.bench_out] + shlex.split(args.bench_args), args.bench_out))
    py = None if args.no_plots else python_with("matplotlib")
    status = 0
    for binary, opts, out in jobs:
        exe = find(binary, args.build)
        if exe is None:
            print("run.py: error: %s not found (build it first: cmake --build --preset cpu-only --target %s)"
                  % (binary, binary), file=sys.stderr)
            return 2
        cmd = [exe] + opts
        print("run.py: " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
        rc = subprocess.call(cmd)
        if rc != 0:
            print("run.py: %s exited with status %d" % (binary, rc), file=sys.stderr)
            status = status or rc
            continue
        if py:
            subprocess.call([py, os.path.join(HERE, "plot.py"), out])
        elif not args.no_plots:
            print("run.py: no python with matplotlib: plots skipped", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
