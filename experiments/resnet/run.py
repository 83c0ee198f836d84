#!/usr/bin/env python3
"""Runs the ResNet-18 Fashion-MNIST training end to end: resnet_train (already built), then plot.py.

    python3 experiments/resnet/run.py [--build DIR] [--out DIR] [--data DIR] [--device auto|cpu|cuda]
                                      [--no-plots] [DRIVER OPTIONS...]

On a GPU (--device auto finds one with nvidia-smi and a CUDA build of the driver) it trains the real
model: ResNet-18 (width 64), 10 epochs, batch 128, SGD momentum 0.9, one-cycle lr 0.1, weight decay
5e-4, random crop (pad 2) and flips; the target is >= 93% test accuracy. On the CPU it runs the
reduced study the CPU-sized main job can afford: width 8, a fixed random subset of 2000 training
images, 1000 test images, 3 epochs, batch 64, and fails unless the training loss falls. Driver
options given after these override the defaults. Data: --data DIR, else .data/fashion-mnist (a
git-ignored copy the device tool can carry), else /usr/share/datasets/fashion-mnist. Results
(CSV, JSON, PNG) land in --out (default results/resnet).
"""

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "experiments", "common"))
import runner  # noqa: E402

REL_BIN = os.path.join("experiments", "resnet", "resnet_train")

GPU_ARGS = ["--width", "64", "--epochs", "10", "--batch", "128"]
CPU_ARGS = ["--width", "8", "--train-subset", "2000", "--test-subset", "1000", "--epochs", "3",
            "--batch", "64", "--expect-loss-decrease"]


def find_driver(build, want_cuda):
    return runner.find_binary(ROOT, REL_BIN, build, runner.BUILD_FOLDERS, want_cuda)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", help="build folder holding experiments/resnet/resnet_train")
    ap.add_argument("--out", default=os.path.join("results", "resnet"))
    ap.add_argument("--data")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--no-plots", action="store_true")
    args, rest = ap.parse_known_args()
    if rest and rest[0] == "--":
        rest = rest[1:]
    gpu = args.device == "cuda" or (args.device == "auto" and runner.gpu_present())
    driver = find_driver(args.build, gpu)
    if driver is None:
        print("run.py: error: resnet_train not found; build it first, e.g.\n"
              "  cmake --preset release && cmake --build build/release --target resnet_train", file=sys.stderr)
        return 2
    if gpu and not runner.is_cuda_build(os.path.dirname(os.path.dirname(os.path.dirname(driver)))):
        print("run.py: note: no CUDA build of resnet_train; running the CPU study", file=sys.stderr)
        gpu = False
    data = args.data
    if not data:
        for d in (os.path.join(ROOT, ".data", "fashion-mnist"), "/usr/share/datasets/fashion-mnist"):
            if os.path.isdir(d):
                data = d
                break
    if not data:
        print("run.py: error: no Fashion-MNIST found (install dataset-fashion-mnist or pass --data)", file=sys.stderr)
        return 1
    name = "resnet18_gpu" if gpu else "resnet_cpu_reduced"
    cmd = [driver, "--device", "cuda" if gpu else "cpu", "--data", data, "--out", args.out, "--name", name,
           "--quiet"] + (GPU_ARGS if gpu else CPU_ARGS) + rest
    print("run.py: " + " ".join(cmd), file=sys.stderr, flush=True)
    rc = subprocess.call(cmd)
    if rc != 0:
        print("run.py: resnet_train exited with status %d" % rc, file=sys.stderr)
        return rc
    if args.no_plots:
        return 0
    py = runner.python_with("matplotlib")
    if py is None:
        print("run.py: matplotlib is not installed: plots skipped")
        return 0
    return subprocess.call([py, os.path.join(HERE, "plot.py"), os.path.join(args.out, name + ".csv"),
                            "-o", os.path.join(args.out, name + ".png")])


if __name__ == "__main__":
    sys.exit(main())
