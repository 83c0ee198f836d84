#!/usr/bin/env python3
"""Where a ResNet-18 training step spends its GPU time, from Nsight Compute's per-kernel durations.

    ncu --profile-from-start off --metrics gpu__time_duration.sum --cache-control none \
        --clock-control none --csv  PROGRAM --profile-step ...  > LABEL.ncu.csv
    python3 experiments/resnet/breakdown.py dualcast=D.ncu.csv torch_eager=E.ncu.csv ... [--json OUT]

Both resnet_train (--profile-step) and peer_torch.py (--profile METHOD:BATCH) bracket exactly one
training step with cudaProfilerStart/Stop, so each file lists one step's kernels. Kernels are sorted by
name into: convolution (cuDNN's kernels and its layout transforms), fused elementwise (dualcast's
channel_broadcast kernels; Triton kernels under torch.compile), batch-norm statistics (dualcast's
statistics passes; PyTorch/cuDNN batch-norm kernels), other elementwise (PyTorch eager ReLU, add,
...), optimizer, matmul (the linear head), loss, other. The groups the issue asks for are printed
first: convolutions, the elementwise and normalisation kernels, everything else. Reads both CSV
layouts ncu writes (--page details, one row per metric; --page raw, one column per metric).
"""

import argparse
import csv
import json
import re
import sys

RULES = [  # (category, regex), first match wins; dualcast's own kernels first (their template
           # arguments name functors such as BatchNormRelu that the PyTorch rules would also match)
    ("fused elementwise", r"ChannelForwardBody|channel_backward_kernel|ChannelPartialSum"),
    ("batch-norm statistics", r"norm_detail|StatsBody|stats_kernel|StatsFinish|StatsBackward|RstdOf"),
    ("optimizer", r"optim::|sgd_momentum|sgd_plain|adam_update|multi_tensor_apply|_fused_sgd|_fused_adam"),
    ("fused elementwise", r"triton_"),
    ("batch-norm statistics", r"bn_fw|bn_bw|batch_norm|batchnorm|BatchNorm"),
    ("convolution", r"conv|cudnn|fprop|dgrad|wgrad|[Ww]inograd|fft|implicit|nchwToNhwc|nhwcToNchw|"
                    r"flip_filter|computeOffsets|computeBOffsets|scalePackedTensor|im2col|Im2col|Col2im|OutputRows"),
    ("matmul", r"gemm|gemv|Gemm"),
    ("loss", r"cross_entropy|softmax|nll_loss|ce_forward|ce_backward|ce_row"),
    ("other elementwise", r"elementwise_kernel|vectorized_elementwise|unrolled_elementwise|BackwardBody|ForwardBody"),
]
GROUPS = {
    "convolution": "convolutions",
    "fused elementwise": "elementwise + normalisation",
    "batch-norm statistics": "elementwise + normalisation",
    "other elementwise": "elementwise + normalisation",
}
UNITS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0,
         "second": 1e3, "s": 1e3}


def classify(name):
    for cat, rx in RULES:
        if re.search(rx, name):
            return cat
    return "other"


def read_ncu_csv(path):
    """[(kernel name, milliseconds)] of one ncu --csv output (either page layout)."""
    with open(path, newline="", errors="replace") as fh:
        lines = [l for l in fh if l.startswith('"')]  # drop ==PROF== and program output
    rows = list(csv.reader(lines))
    if not rows:
        raise SystemExit("breakdown.py: %s holds no ncu CSV rows" % path)
    head = rows[0]
    if "Kernel Name" not in head:
        raise SystemExit("breakdown.py: %s: no 'Kernel Name' column in %s" % (path, head[:6]))
    k = head.index("Kernel Name")
    out = []
    if "Metric Name" in head:  # details page: one row per (kernel, metric)
        mn, mu, mv = head.index("Metric Name"), head.index("Metric Unit"), head.index("Metric Value")
        for r in rows[1:]:
            if len(r) > mv and r[mn] == "gpu__time_duration.sum":
                out.append((r[k], float(r[mv].replace(",", "")) * UNITS.get(r[mu], 1e-6)))
    else:  # raw page: a units row after the header
        col = head.index("gpu__time_duration.sum")
        unit = rows[1][col] if len(rows) > 1 else "nsecond"
        for r in rows[2:]:
            if len(r) > col and r[col]:
                out.append((r[k], float(r[col].replace(",", "")) * UNITS.get(unit, 1e-6)))
    if not out:
        raise SystemExit("breakdown.py: %s has no gpu__time_duration.sum values" % path)
    return out


def summarise(kernels):
    total = sum(ms for _, ms in kernels)
    cats, groups, per_name = {}, {}, {}
    for name, ms in kernels:
        c = classify(name)
        cats[c] = cats.get(c, 0.0) + ms
        g = GROUPS.get(c, "everything else")
        groups[g] = groups.get(g, 0.0) + ms
        short = re.sub(r"\(.*", "", name)[:110]
        per_name[short] = per_name.get(short, 0.0) + ms
    top = sorted(per_name.items(), key=lambda t: -t[1])[:15]
    return {"kernels": len(kernels), "total_ms": total,
            "groups": {g: {"ms": v, "share": v / total} for g, v in groups.items()},
            "categories": {c: {"ms": v, "share": v / total} for c, v in sorted(cats.items(), key=lambda t: -t[1])},
            "top_kernels": [{"name": n, "ms": v, "share": v / total} for n, v in top]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="LABEL=FILE.csv (or FILE.csv)")
    ap.add_argument("--json", help="write the summaries here")
    args = ap.parse_args()
    result = {}
    for spec in args.files:
        label, _, path = spec.rpartition("=")
        label = label or path
        result[label] = summarise(read_ncu_csv(path))
    for label, s in result.items():
        print("\n%s: %d kernels, %.3f ms of kernel time in one step" % (label, s["kernels"], s["total_ms"]))
        for g in ("convolutions", "elementwise + normalisation", "everything else"):
            v = s["groups"].get(g, {"ms": 0.0, "share": 0.0})
            print("  %-30s %9.3f ms  %5.1f %%" % (g, v["ms"], 100 * v["share"]))
        print("  by category:")
        for c, v in s["categories"].items():
            print("    %-28s %9.3f ms  %5.1f %%" % (c, v["ms"], 100 * v["share"]))
        print("  largest kernels:")
        for t in s["top_kernels"][:8]:
            print("    %8.3f ms %5.1f %%  %s" % (t["ms"], 100 * t["share"], t["name"]))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
        print("\nbreakdown.py: wrote %s" % args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
