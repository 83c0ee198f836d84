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
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CANDIDATES = ("build/release", "build/ci", "build/cpu-only", "build-cuda", "build")


def gpu_present():
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        r = subprocess.run([smi, "-L"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0 and b"GPU" in r.stdout


def cuda_build(d):
    try:
        with open(os.path.join(d, "CMakeCache.txt")) as fh:
            text = fh.read()
    except OSError:
        return False
    return "DUALCAST_ENABLE_CUDA:BOOL=OFF" not in text and any(
        line.startswith("CMAKE_CUDA_COMPILER:") and not line.rstrip().endswith(("NOTFOUND", "="))
        for line in text.splitlines())


def find(binary, build):
    rel = os.path.join("experiments", "transformer", binary)
    if build:
        p = os.path.join(build, rel)
        return p if os.path.isfile(p) else None
    found = [os.path.join(ROOT, b) for b in CANDIDATES if os.path.isfile(os.path.join(ROOT, b, rel))]
    if gpu_present():
        found = [f for f in found if cuda_build(f)] + [f for f in found if not cuda_build(f)]
    return os.path.join(found[0], rel) if found else None


def plot_python():
    for c in (sys.executable, "python3", "/usr/bin/python3"):
        exe = c if os.path.isabs(c) else shutil.which(c)
        if exe and subprocess.run([exe, "-c", "import matplotlib"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL).returncode == 0:
            return exe
    return None


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
    py = None if args.no_plots else plot_python()
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
