#!/usr/bin/env python3
"""Runs the HM-LSTM experiment end to end: the driver (hmlstm_experiment, already built), then
plot.py.  Builds nothing itself.

    python3 experiments/hmlstm/run.py [--build DIR] [--out DIR] [--no-plots] [DRIVER OPTIONS...]

The driver binary is looked for in --build DIR, else in build-exp-cuda, build-cuda, build, build-exp,
build-cpu under the repository root (a CUDA-enabled build first when a GPU is present).  Every option
this script does not know is passed to the driver unchanged (e.g. --full, --peers, --workloads a,c,
--dims 512,1024).  The driver chooses the GPU when one is present (--device auto).  Plots need
matplotlib: the first of this interpreter, python3 and /usr/bin/python3 that has it draws them; if
none has it, that is said and the plots are skipped.
"""

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
REL_BIN = os.path.join("experiments", "hmlstm", "hmlstm_experiment")
sys.path.insert(0, os.path.join(ROOT, "experiments", "common"))
from runner import BUILD_FOLDERS, find_binary, gpu_present, is_cuda_build, python_with  # noqa: E402


def find_driver(build):
    gpu = gpu_present()
    driver = find_binary(ROOT, REL_BIN, build, BUILD_FOLDERS, gpu)
    if driver and gpu and not build and not is_cuda_build(driver[: -len(REL_BIN)]):
        print("run.py: note: a GPU is present but no CUDA-enabled build of the driver was found; "
              "running %s on the CPU" % driver, file=sys.stderr)
    return driver


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", help="build folder holding experiments/hmlstm/hmlstm_experiment")
    ap.add_argument("--out", default=os.path.join("results", "hmlstm"), help="results folder (default results/hmlstm)")
    ap.add_argument("--no-plots", action="store_true", help="skip plot.py")
    args, rest = ap.parse_known_args()
    if rest and rest[0] == "--":
        rest = rest[1:]

    driver = find_driver(args.build)
    if driver is None:
        where = args.build or ", ".join(BUILD_FOLDERS)
        print("run.py: error: hmlstm_experiment not found in %s; build it first, e.g.\n"
              "  cmake -S . -B build-exp -G Ninja && cmake --build build-exp --target hmlstm_experiment"
              % where, file=sys.stderr)
        return 2
    cmd = [driver, "--out", args.out] + rest
    if "--peers" in rest and "--python" not in rest:
        py = python_with("numpy")
        if py:
            cmd += ["--python", py]
    print("run.py: " + " ".join(cmd), file=sys.stderr, flush=True)
    rc = subprocess.call(cmd)
    if rc != 0:
        print("run.py: the driver exited with status %d" % rc, file=sys.stderr)
        return rc
    if args.no_plots:
        return 0
    py = python_with("matplotlib")
    if py is None:
        print("run.py: matplotlib is not installed for any of %s, python3, /usr/bin/python3: plots skipped"
              % sys.executable)
        return 0
    return subprocess.call([py, os.path.join(HERE, "plot.py"), args.out])


if __name__ == "__main__":
    sys.exit(main())
