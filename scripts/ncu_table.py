"""ncu_table.py: what scripts/ncu-broadcast and scripts/ncu-attention share: running a program under
Nsight Compute with a list of metrics (CSV, raw page, base units, clocks as the card runs them) and
turning its rows into a table with the largest stall reason of each kernel."""
import csv
import io
import shutil
import subprocess
import sys

STALLS = ["long_scoreboard", "short_scoreboard", "wait", "math_pipe_throttle", "lg_throttle",
          "mio_throttle", "not_selected", "selected", "branch_resolving", "no_instruction",
          "dispatch_stall", "drain", "barrier", "membar", "imc_miss", "tex_throttle", "sleeping",
          "misc"]
STALL_METRIC = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"


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
    return rows, text
