"""Which kernels of the HM-LSTM step slow down once DataParallel exists (issue 32's probe)?

    ncu --profile-from-start off --csv --page raw \\
        --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct \\
        --target-processes all \\
        scripts/launch --gpus 4 -- build/release/experiments/hmlstm/hmlstm_dp --bench --gpus 4 --batch 256 \\
        --compute-first --profile-first --reps 3 --warmup 1  > ncu.csv
    python3 experiments/scaling/compare_ncu.py ncu.csv

hmlstm_dp --profile-first profiles rank 0's graph, captured before DataParallel existed, once then
and once after: the CSV holds the same kernels twice, in order. Prints the total kernel time of each
half, then per kernel name (summed over its launches) before, after and the change, largest first,
and the mean of every other metric before and after.
"""

import csv
import sys
from collections import defaultdict


def rows_of(path):
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu's own messages are not CSV
    table = list(csv.reader(lines))
    header, body = table[0], table[2:]  # row 1: units
    return [dict(zip(header, r)) for r in body if len(r) == len(header)]


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def main():
    rows = rows_of(sys.argv[1])
    if len(rows) < 2 or len(rows) % 2:
        sys.exit("compare_ncu: %d kernel rows; expected the same kernels twice" % len(rows))
    half = len(rows) // 2
    before, after = rows[:half], rows[half:]
    names = [r["Kernel Name"] for r in before]
    if names != [r["Kernel Name"] for r in after]:
        sys.exit("compare_ncu: the two halves are not the same kernels in the same order")
    metrics = [k for k in before[0] if number(before[0][k]) is not None and "." in k]
    time_key = next(k for k in metrics if k.startswith("gpu__time_duration"))
    per = defaultdict(lambda: [0.0, 0.0, 0])
    for b, a in zip(before, after):
        p = per[b["Kernel Name"][:90]]
        p[0] += number(b[time_key])
        p[1] += number(a[time_key])
        p[2] += 1
    tb, ta = sum(p[0] for p in per.values()), sum(p[1] for p in per.values())
    print("kernels %d per replay; summed %s: before %.1f, after %.1f (%+.2f%%)" % (half, time_key, tb, ta,
                                                                              100 * (ta / tb - 1)))
    print("%-90s %6s %12s %12s %8s" % ("kernel", "count", "before", "after", "change"))
    for name, (b, a, n) in sorted(per.items(), key=lambda kv: -(kv[1][1] - kv[1][0]))[:25]:
        print("%-90s %6d %12.1f %12.1f %+7.2f%%" % (name, n, b, a, 100 * (a / b - 1) if b else 0.0))
    for k in metrics:
        if k == time_key:
            continue
        mb = sum(number(r[k]) for r in before) / half
        ma = sum(number(r[k]) for r in after) / half
        print("mean %-60s before %12.3f after %12.3f" % (k, mb, ma))


if __name__ == "__main__":
    main()
