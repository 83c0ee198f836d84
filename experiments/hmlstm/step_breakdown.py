#!/usr/bin/env python3
"""step_breakdown.py: where the time of the captured HM-LSTM training step goes (issue 11, item 4).

Runs hmlstm_step_profile twice:
  1. plainly: the step's time (median of CUDA-event-timed replays) and its graph node count;
  2. under a profiler, replaying the step once between cudaProfilerStart/Stop: the duration of every
     kernel of that replay (graph kernel nodes profiled one by one),
then sums the kernel durations by category and prints the table, with
  gaps = step time - sum of kernel durations
(launch latency between graph nodes, memcpy/memset nodes when ncu is used, idle time).

Profilers:
  --tool ncu   (default) ncu --metrics gpu__time_duration.sum --csv --graph-profiling node
               --profile-from-start off --cache-control none --clock-control none. Kernels run one at
               a time (each is replayed by ncu): durations are those of each kernel alone at the
               boost clock; copies and memsets are not kernels and end up in "gaps".
  --tool nsys  nsys profile --cuda-graph-trace=node --capture-range=cudaProfilerApi, then
               nsys stats --report cuda_gpu_trace: kernels, copies and memsets as they ran in the
               replay; the step time is also taken from the trace (last end - first start).

Usage (on the GPU machine, after building the release or ci preset):
  python3 experiments/hmlstm/step_breakdown.py --binary build/ci/experiments/hmlstm/hmlstm_step_profile \\
      --mode mixed [--hidden 512 --batch 64 --seq 100] [--tool ncu|nsys] [--csv out.csv]

Exit status: 0 done; 1 a run failed; 2 bad usage or the profiler is missing.
"""
import argparse
import csv
import glob
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile

# First matching pattern wins (matched against the kernel's demangled name).
CATEGORIES = [
    ("matmul (dualcast's skinny tensor-core kernel)", r"skinny_gemm"),
    ("matmul (cuBLAS)", r"gemm|cutlass|xmma|cublas|splitKreduce|gemv|Kernel2"),
    ("fused cell + boundary (mixed broadcasts)", r"HmCell|BoundarySte|BoundarySoft|cell_forward|cell_backward"),
    ("gate inputs / adjoints (LayerGates)", r"gate_input|pack_adjoints"),
    ("optimizer", r"sgd_|adam_|optim::"),
    ("loss (cross-entropy, softmax)", r"ce_forward|ce_backward|softmax"),
    ("reductions", r"reduce|cub::|Reduce"),
    ("copies / memsets", r"memcpy|memset|CUDA mem"),
    ("elementwise (op library, fills, casts, concat/split)", r"parallel_for_kernel|ForwardBody|BackwardBody|transpose"),
]


def categorize(name):
    for label, pattern in CATEGORIES:
        if re.search(pattern, name):
            return label
    return "other"


def run(cmd, **kw):
    print("+ " + " ".join(cmd), file=sys.stderr)
    return subprocess.run(cmd, check=False, text=True, capture_output=True, **kw)


def step_args(a):
    return ["--mode", a.mode, "--hidden", str(a.hidden), "--batch", str(a.batch), "--seq", str(a.seq)] + (
        ["--unfused-cell"] if a.unfused_cell else []) + (["--autocast", a.autocast] if a.autocast else [])


def time_step(a):
    r = run([a.binary] + step_args(a) + ["--reps", str(a.reps)])
    if r.returncode != 0:
        sys.stderr.write(r.stdout + r.stderr)
        raise SystemExit(f"step_breakdown: {a.binary} failed (status {r.returncode})")
    sys.stderr.write(r.stderr)
    line = next((l for l in r.stdout.splitlines() if l.startswith("step_ms=")), None)
    if line is None:
        raise SystemExit("step_breakdown: no step_ms= line in the output:\n" + r.stdout)
    fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
    return fields


def to_ns(value, unit):
    v = float(value.replace(",", ""))
    scale = {"ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9, "second": 1e9}
    if unit not in scale:
        raise SystemExit(f"step_breakdown: unknown time unit '{unit}'")
    return v * scale[unit]


def profile_ncu(a):
    ncu = shutil.which(a.ncu) or (a.ncu if os.path.exists(a.ncu) else None)
    if ncu is None:
        raise SystemExit(2)
    cmd = [ncu, "--profile-from-start", "off", "--graph-profiling", "node", "--metrics", "gpu__time_duration.sum",
           "--csv", "--print-units", "base", "--cache-control", "none", "--clock-control", "none",
           a.binary] + step_args(a) + ["--profile"]
    r = run(cmd)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-4000:] + r.stderr[-4000:])
        raise SystemExit(f"step_breakdown: ncu failed (status {r.returncode})")
    lines = [l for l in r.stdout.splitlines() if l.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if not rows:
        raise SystemExit("step_breakdown: ncu printed no CSV rows (no kernel profiled?)\n" + r.stdout[-2000:])
    head = rows[0]
    iname, imetric, iunit, ivalue = (head.index(c) for c in ("Kernel Name", "Metric Name", "Metric Unit", "Metric Value"))
    kernels = []
    for row in rows[1:]:
        if len(row) <= ivalue or row[imetric] != "gpu__time_duration.sum":
            continue
        kernels.append((row[iname], to_ns(row[ivalue], row[iunit])))
    return kernels, None


def profile_nsys(a):
    nsys = shutil.which(a.nsys) or (a.nsys if os.path.exists(a.nsys) else None)
    if nsys is None:
        raise SystemExit(2)
    tmp = tempfile.mkdtemp(prefix="step_breakdown_")
    rep = os.path.join(tmp, "step")
    r = run([nsys, "profile", "--capture-range=cudaProfilerApi", "--capture-range-end=stop", "--cuda-graph-trace=node",
             "--trace=cuda", "-o", rep, "--force-overwrite=true", a.binary] + step_args(a) + ["--profile"])
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-4000:] + r.stderr[-4000:])
        raise SystemExit(f"step_breakdown: nsys profile failed (status {r.returncode})")
    reps = glob.glob(rep + "*.nsys-rep")
    if not reps:
        raise SystemExit("step_breakdown: nsys wrote no report")
    r = run([nsys, "stats", "--report", "cuda_gpu_trace", "--format", "csv", "--output", os.path.join(tmp, "stats"),
             "--force-export=true", reps[0]])
    files = glob.glob(os.path.join(tmp, "stats*cuda_gpu_trace*.csv"))
    if r.returncode != 0 or not files:
        sys.stderr.write(r.stdout[-4000:] + r.stderr[-4000:])
        raise SystemExit("step_breakdown: nsys stats failed")
    with open(files[0], newline="") as f:
        rows = list(csv.DictReader(f))
    kernels, first, last = [], None, None
    for row in rows:
        start, dur = float(row["Start (ns)"]), float(row["Duration (ns)"])
        kernels.append((row["Name"], dur))
        first = start if first is None else min(first, start)
        last = start + dur if last is None else max(last, start + dur)
    shutil.rmtree(tmp, ignore_errors=True)
    return kernels, (last - first) if kernels else None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--binary", required=True, help="path to hmlstm_step_profile")
    p.add_argument("--mode", default="mixed", choices=["mixed", "reverse"])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=100)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--unfused-cell", action="store_true",
                   help="the cell and boundary as library broadcasts (NetworkConfig::fused_cell = false)")
    p.add_argument("--autocast", choices=["bf16", "fp16"],
                   help="the step's products under Autocast (NetworkConfig::autocast)")
    p.add_argument("--tool", default="ncu", choices=["ncu", "nsys"])
    p.add_argument("--ncu", default="ncu", help="ncu executable (default: ncu on PATH)")
    p.add_argument("--nsys", default="nsys", help="nsys executable (default: nsys on PATH)")
    p.add_argument("--csv", help="also write every kernel (name, category, ns) to this CSV file")
    a = p.parse_args()
    if not os.path.exists(a.binary):
        print(f"step_breakdown: {a.binary} does not exist (build hmlstm_step_profile first)", file=sys.stderr)
        return 2

    timing = time_step(a)
    try:
        kernels, span_ns = profile_ncu(a) if a.tool == "ncu" else profile_nsys(a)
    except SystemExit as e:
        if e.code == 2:
            print(f"step_breakdown: {a.tool} not found (try --{a.tool} /usr/local/cuda/bin/{a.tool})", file=sys.stderr)
        raise
    step_ms = float(timing["step_ms"])
    sums, counts = {}, {}
    for name, ns in kernels:
        c = categorize(name)
        sums[c] = sums.get(c, 0.0) + ns
        counts[c] = counts.get(c, 0) + 1
    total_ms = sum(sums.values()) / 1e6
    print(f"\ncaptured training step, {a.mode} mode, H={a.hidden} B={a.batch} T={a.seq} on "
          f"{timing.get('device', '?')}: {timing.get('graph_nodes', '?')} graph nodes, "
          f"{len(kernels)} {'kernels' if a.tool == 'ncu' else 'kernels/copies'} profiled ({a.tool})")
    print(f"step time (CUDA events, median of {a.reps} replays): {step_ms:.3f} ms "
          f"(p10 {float(timing['p10']):.3f}, p90 {float(timing['p90']):.3f}; back to back "
          f"{float(timing['pipelined_ms']):.3f} ms)")
    if span_ns is not None:
        print(f"profiled replay span (first start to last end): {span_ns / 1e6:.3f} ms")
    print(f"\n{'category':56s} {'count':>6s} {'ms':>9s} {'% step':>7s}")
    for label, _ in CATEGORIES + [("other", None)]:
        if label in sums:
            print(f"{label:56s} {counts[label]:6d} {sums[label] / 1e6:9.3f} {100 * sums[label] / 1e6 / step_ms:6.1f}%")
    print(f"{'sum of durations (the floor with no gaps)':56s} {len(kernels):6d} {total_ms:9.3f} {100 * total_ms / step_ms:6.1f}%")
    print(f"{'gaps = step - sum':56s} {'':6s} {step_ms - total_ms:9.3f} {100 * (step_ms - total_ms) / step_ms:6.1f}%")
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["name", "category", "ns"])
            for name, ns in kernels:
                w.writerow([name, categorize(name), f"{ns:.0f}"])
        print(f"\nwrote {a.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
