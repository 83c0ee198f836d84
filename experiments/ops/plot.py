#!/usr/bin/env python3
"""Figures of the per-op CPU vs GPU analysis (ops_bench) and of the Fashion-MNIST MLP's epoch time.

    python3 experiments/ops/plot.py                                   # results/ops/ops.csv
    python3 experiments/ops/plot.py --csv results/ops/ops.csv --mnist results/mnist

From ops_bench's CSV (only rows marked valid):
  speedup.png  GPU speedup over the CPU (CPU median / GPU median) against n, log-log, one line per
               op; forward and backward panels. Needs a run that timed both devices.
  time.png     median time against n, one panel per op, one line per device and direction, with the
               p10-p90 band.
With --mnist DIR, from mnist_train's per-epoch CSVs in DIR (mlp_*_cpu.csv beside mlp_*_cuda.csv or
mlp_*_cuda-K.csv, the names mnist_train --out gives):
  mlp_epoch_time.png  training time per epoch, CPU vs GPU, for each MLP configuration found (left),
                      and the median epoch time per configuration and device with the speedup (right).
A configuration with only one device's CSV is drawn for that device alone (with a notice).

Figures go to --out (default: the CSV's folder). Needs matplotlib (Debian: python3-matplotlib, which
serves /usr/bin/python3). Exit status: 0 done, 1 missing or unreadable input, 2 bad usage.
"""
import argparse
import csv
import math
import os
import re
import statistics
import sys

OPS_ORDER = ["add", "mul", "transpose", "pow", "broadcast", "sum", "sum_axis1", "matmul"]
MNIST_NAME = re.compile(r"^(mlp_.+?)_(cpu|cuda(?:-\d+)?)\.csv$")


class InputError(Exception):
    pass


def read_ops(path):
    """Valid, timed rows of ops_bench's CSV as {(op, dir, device): [(n, median, p10, p90)]}."""
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file (run ops_bench first, e.g. "
                         f"build/experiments/ops/ops_bench --out {os.path.dirname(path) or '.'})")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    need = {"op", "direction", "n", "device", "median_ms", "p10_ms", "p90_ms", "valid"}
    if not rows:
        raise InputError(f"{path}: no rows")
    missing = need - set(rows[0])
    if missing:
        raise InputError(f"{path}: not an ops_bench CSV (missing columns {sorted(missing)})")
    series = {}
    skipped = 0
    for r in rows:
        if r["valid"] != "true" or not r["median_ms"]:
            skipped += 1
            continue
        key = (r["op"], r["direction"], r["device"])
        series.setdefault(key, []).append(
            (int(r["n"]), float(r["median_ms"]), float(r["p10_ms"]), float(r["p90_ms"])))
    for v in series.values():
        v.sort()
    if not series:
        raise InputError(f"{path}: no valid timed rows ({skipped} rows failed a check, did not fit or "
                         "were skipped)")
    if skipped:
        print(f"plot.py: {path}: left out {skipped} rows that are not valid timings", file=sys.stderr)
    return series


def ordered_ops(series):
    ops = {k[0] for k in series}
    return [o for o in OPS_ORDER if o in ops] + sorted(ops - set(OPS_ORDER))


def log2_axis(ax, sizes):
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([str(n) for n in sizes], fontsize=7)
    ax.minorticks_off()


def plot_speedup(plt, series, out):
    ops = ordered_ops(series)
    have = any((op, d, "cuda") in series and (op, d, "cpu") in series for op in ops for d in ("fwd", "bwd"))
    if not have:
        print("plot.py: no op was timed on both the CPU and the GPU; speedup.png needs an ops_bench run "
              "with --devices cpu,cuda (skipped)", file=sys.stderr)
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), sharey=True)
    sizes = set()
    cmap = plt.get_cmap("tab10")
    for ax, d, title in zip(axes, ("fwd", "bwd"), ("forward", "backward")):
        for i, op in enumerate(ops):
            cpu = {n: m for n, m, _, _ in series.get((op, d, "cpu"), [])}
            gpu = {n: m for n, m, _, _ in series.get((op, d, "cuda"), [])}
            ns = sorted(set(cpu) & set(gpu))
            if not ns:
                continue
            sizes.update(ns)
            ax.plot(ns, [cpu[n] / gpu[n] for n in ns], marker="o", ms=3, color=cmap(i % 10), label=op)
        ax.axhline(1.0, color="k", lw=0.8, ls=":")
        ax.set_yscale("log")
        ax.set_xlabel("n (operands n x n, float32)")
        ax.set_title(f"{title}: GPU speedup = CPU time / GPU time")
        ax.grid(alpha=0.3, which="both")
    for ax in axes:
        log2_axis(ax, sorted(sizes))
    axes[0].set_ylabel("speedup (x)")
    axes[1].legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    path = os.path.join(out, "speedup.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_time(plt, series, out):
    ops = ordered_ops(series)
    cols = 4 if len(ops) > 4 else len(ops)
    rows = math.ceil(len(ops) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.2 * rows), squeeze=False)
    colors = {"cpu": "tab:blue", "cuda": "tab:orange"}
    styles = {"fwd": "-", "bwd": "--"}
    for ax, op in zip(axes.flat, ops):
        sizes = set()
        for dev in ("cpu", "cuda"):
            for d in ("fwd", "bwd"):
                pts = series.get((op, d, dev))
                if not pts:
                    continue
                ns = [p[0] for p in pts]
                sizes.update(ns)
                ax.plot(ns, [p[1] for p in pts], ls=styles[d], marker="o", ms=2.5, color=colors[dev],
                        label=f"{'GPU' if dev == 'cuda' else 'CPU'} {d}")
                ax.fill_between(ns, [p[2] for p in pts], [p[3] for p in pts], color=colors[dev], alpha=0.15,
                                lw=0)
        ax.set_yscale("log")
        log2_axis(ax, sorted(sizes))
        ax.set_title(op, fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.set_xlabel("n", fontsize=8)
        ax.set_ylabel("ms (median; band p10-p90)", fontsize=8)
    for ax in list(axes.flat)[len(ops):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle("dualcast per-op time, forward (solid) and backward (dashed)")
    fig.tight_layout()
    path = os.path.join(out, "time.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def read_mnist(folder):
    """{config: {device: [(epoch, epoch_seconds)]}} from mnist_train's MLP CSVs in `folder`."""
    if not os.path.isdir(folder):
        raise InputError(f"--mnist {folder}: no such folder (mnist_train --out writes one)")
    runs = {}
    for name in sorted(os.listdir(folder)):
        m = MNIST_NAME.match(name)
        if not m:
            continue
        config, dev = m.group(1), "cpu" if m.group(2) == "cpu" else "cuda"
        path = os.path.join(folder, name)
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        if not rows or not {"epoch", "epoch_seconds"} <= set(rows[0]):
            raise InputError(f"{path}: not an mnist_train CSV (needs columns epoch and epoch_seconds)")
        runs.setdefault(config, {})[dev] = [(int(r["epoch"]), float(r["epoch_seconds"])) for r in rows]
    if not runs:
        raise InputError(f"--mnist {folder}: no MLP CSVs (mlp_*_cpu.csv, mlp_*_cuda.csv) found; write them "
                         "with mnist_train --model mlp --out " + folder + " (and --device cuda on a GPU)")
    for config, devs in sorted(runs.items()):
        for dev in ("cpu", "cuda"):
            if dev not in devs:
                print(f"plot.py: {config}: no {'GPU' if dev == 'cuda' else 'CPU'} CSV in {folder}; "
                      f"mlp_epoch_time.png shows its {'CPU' if dev == 'cuda' else 'GPU'} run only", file=sys.stderr)
    return runs


def plot_mnist(plt, runs, out):
    from matplotlib.ticker import MaxNLocator

    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(12, 4.6))
    cmap = plt.get_cmap("tab10")
    configs = sorted(runs)
    for i, config in enumerate(configs):
        for dev, ls in (("cpu", "-"), ("cuda", "--")):
            pts = runs[config].get(dev)
            if pts:
                ax_t.plot([p[0] for p in pts], [p[1] for p in pts], ls=ls, marker="o", ms=3, color=cmap(i % 10),
                          label=f"{config} {'GPU' if dev == 'cuda' else 'CPU'}")
    ax_t.set_yscale("log")
    ax_t.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_t.set_xlabel("epoch")
    ax_t.set_ylabel("training time per epoch (s)")
    ax_t.set_title("MLP 784-256-100-10, epoch time (solid: CPU, dashed: GPU)")
    ax_t.grid(alpha=0.3, which="both")
    ax_t.legend(fontsize=7)

    width = 0.38
    labelled = set()
    for i, config in enumerate(configs):
        med = {dev: statistics.median(p[1] for p in pts) for dev, pts in runs[config].items()}
        for j, (dev, color) in enumerate((("cpu", "tab:blue"), ("cuda", "tab:orange"))):
            if dev in med:
                ax_b.bar(i + (j - 0.5) * width, med[dev], width, color=color,
                         label=None if dev in labelled else ("GPU" if dev == "cuda" else "CPU"))
                labelled.add(dev)
        if "cpu" in med and "cuda" in med:
            ax_b.annotate(f"{med['cpu'] / med['cuda']:.1f}x", (i, max(med.values())), ha="center",
                          va="bottom", fontsize=8)
    ax_b.set_xticks(range(len(configs)))
    ax_b.set_xticklabels(configs, rotation=20, ha="right", fontsize=8)
    ax_b.set_yscale("log")
    ax_b.set_ylabel("median epoch time (s)")
    ax_b.set_title("median over epochs; label: GPU speedup")
    ax_b.grid(alpha=0.3, axis="y", which="both")
    ax_b.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, "mlp_epoch_time.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--csv", default="results/ops/ops.csv", help="ops_bench's CSV (default %(default)s)")
    ap.add_argument("--out", help="folder for the PNGs (default: the folder of --csv)")
    ap.add_argument("--mnist", metavar="DIR", help="also draw mlp_epoch_time.png from mnist_train's CSVs in DIR")
    ap.add_argument("--mnist-only", action="store_true", help="draw only mlp_epoch_time.png (needs --mnist)")
    args = ap.parse_args(argv)
    if args.mnist_only and not args.mnist:
        ap.error("--mnist-only needs --mnist DIR")
    out = args.out or os.path.dirname(os.path.abspath(args.csv))

    try:
        series = None if args.mnist_only else read_ops(args.csv)
        runs = read_mnist(args.mnist) if args.mnist else None
    except (InputError, OSError, ValueError, KeyError) as e:
        print(f"plot.py: {e}", file=sys.stderr)
        return 1

    try:
        import matplotlib
    except ImportError:
        print(f"plot.py: matplotlib is not installed for {sys.executable}; install it (Debian: apt-get install "
              "python3-matplotlib, then run with /usr/bin/python3; or pip install matplotlib)", file=sys.stderr)
        return 1
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out, exist_ok=True)
    written = []
    if series is not None:
        written.append(plot_speedup(plt, series, out))
        written.append(plot_time(plt, series, out))
    if runs is not None:
        written.append(plot_mnist(plt, runs, out))
    for p in written:
        if p:
            print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
