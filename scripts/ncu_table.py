"""ncu_table.py: what scripts/ncu-broadcast, scripts/ncu-attention and scripts/paper share: running a
program under Nsight Compute with a list of metrics (CSV, raw page, base units, clocks as the card
runs them), turning its rows into a table with the largest stall reason of each kernel, and reading
back the CSV files scripts/ncu-broadcast writes."""
import csv
import io
import re
import shutil
import subprocess
import sys

STALLS = ["long_scoreboard", "short_scoreboard", "wait", "math_pipe_throttle", "lg_throttle",
          "mio_throttle", "not_selected", "selected", "branch_resolving", "no_instruction",
          "dispatch_stall", "drain", "barrier", "membar", "imc_miss", "tex_throttle", "sleeping",
          "misc"]
STALL_METRIC = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"

# scripts/ncu-broadcast's counters, by the names its tables use.
BROADCAST_METRICS = {
    "time_us": "gpu__time_duration.sum",
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "regs": "launch__registers_per_thread",
    "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "inst": "smsp__inst_executed.sum",
}
# The line scripts/ncu-broadcast writes before each configuration's raw CSV.
BROADCAST_SECTION = re.compile(r"^# (\S+) (\S+) dims (\d+)$")


def default_ncu():
    return shutil.which("ncu") or "/usr/local/cuda/bin/ncu"


def number(v):
    try:
        return float(str(v).replace(",", ""))
    except ValueError:
        return float("nan")


def profile(ncu, metrics, program, extra=(), label="ncu"):
    """Runs `program` (a list) under ncu collecting `metrics` (name -> ncu metric) and every stall
    reason; returns (rows, raw CSV text). Each row has 'Kernel Name', the metrics by name (time in
    µs as 'time_us' when 'time_us' is asked for as gpu__time_duration.sum) and 'top_stall'."""
    wanted = list(metrics.values()) + [STALL_METRIC.format(s) for s in STALLS]
    cmd = [ncu, "--clock-control", "none", "--csv", "--page", "raw", "--print-units", "base",
           "--metrics", ",".join(wanted), *extra, *program]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        print(f"{label}: ncu failed ({res.returncode}):\n{res.stderr[-2000:]}", file=sys.stderr)
        return [], ""
    text = res.stdout[res.stdout.find('"ID"'):] if '"ID"' in res.stdout else ""
    return parse_rows(text, metrics), text


def parse_rows(text, metrics):
    """The kernels of ncu's raw CSV page `text` (from its "ID" header on): per kernel 'Kernel Name',
    the metrics by name (time_us in µs) and 'top_stall', the largest stall reason and its value."""
    reader = list(csv.DictReader(io.StringIO(text)))
    rows = []
    # The raw page's second line holds units; skip it.
    for r in reader[1:] if reader and reader[0].get("ID", "").strip() == "" else reader:
        if not r.get("Kernel Name"):
            continue
        row = {"Kernel Name": r["Kernel Name"]}
        for key, m in metrics.items():
            row[key] = number(r.get(m, "nan"))
        if "time_us" in row:
            row["time_us"] /= 1e3  # base unit: ns
        stalls = {s: number(r.get(STALL_METRIC.format(s), "nan")) for s in STALLS}
        top = max(stalls.items(), key=lambda kv: (kv[1] if kv[1] == kv[1] else -1))
        row["top_stall"] = f"{top[0]} {top[1]:.2f}"
        rows.append(row)
    return rows


def broadcast_kernel_role(name):
    """forward/backward and fast/general path of a broadcast kernel, from its mangled name."""
    role = "backward" if "BackwardBody" in name else "forward" if "ForwardBody" in name else "other"
    path = "fast" if "broadcast_fast_kernel" in name else "general" if "parallel_for_kernel" in name else "?"
    return f"{role}/{path}"


def is_broadcast_csv(path):
    with open(path, encoding="utf-8") as fh:
        return bool(BROADCAST_SECTION.match(fh.readline().rstrip("\n")))


def read_broadcast_csv(path):
    """The rows of a CSV file scripts/ncu-broadcast wrote, each with its label, config, dims and kernel
    role added, in the file's order."""
    rows, head, body = [], None, []

    def flush():
        if head:
            for r in parse_rows("".join(body), BROADCAST_METRICS):
                rows.append({**r, "label": head[0], "config": head[1], "dims": int(head[2]),
                             "kernel": broadcast_kernel_role(r["Kernel Name"])})
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            m = BROADCAST_SECTION.match(line.rstrip("\n"))
            if m:
                flush()
                head, body = m.groups(), []
            else:
                body.append(line)
    flush()
    return rows
