#!/usr/bin/env python3
"""The ResNet-18 step table: dualcast's benchmark records and PyTorch's, side by side.

    python3 experiments/resnet/table.py DUALCAST_bench.json [MORE_bench.json ...] TORCH.json -o table.md

Inputs are `resnet_train --bench ... --out DIR` records (framework dualcast; eager, and captured when
measured; --fusion composed gives method eager_composed) and one `peer_torch.py --out` record. Prints
and writes a Markdown table: per batch size and method, the median step time, images/s, and the ratio
of each method's time to dualcast eager's; then the validation and the issue's targets (batch 256:
dualcast eager faster than PyTorch eager, within 1.10x of torch.compile).

Each record's `precision` (fp32, tf32, bf16, fp16: `--precision` of both drivers) is in the header;
records written before the option existed have none, or (PyTorch's) a sentence of settings there,
and were fp32. Records of several precisions get a precision column, and each time is compared with
dualcast eager's at its own precision.
"""

import argparse
import json
import sys


PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
HEADER = {"fp32": "fp32, TF32 off", "tf32": "tf32: TF32 convolutions and matmuls",
          "bf16": "bf16: autocast, float32 master weights",
          "fp16": "fp16: autocast, float32 master weights, loss scaling (GradScaler) in both"}


def precision_of(rec):
    p = rec.get("precision", "fp32")
    return p if p in PRECISIONS else "fp32"


def rows_of(rec):
    """(framework, method, batch, median ms or None, result) of a record; several precisions make the
    batch a (batch, precision) pair."""
    out = []
    fw = rec.get("framework", "?")
    for r in rec.get("results", []):
        if fw == "dualcast":
            out.append(("dualcast", rec.get("method", "eager"), r["batch"], r["step_ms"]["median"], r))
            cap = r.get("captured")
            if isinstance(cap, dict):
                out.append(("dualcast", "captured", r["batch"], cap["step_ms"]["median"], cap))
        elif r.get("status") == "ok":
            out.append((fw, r["method"], r["batch"], r["step_ms"]["median"], r))
        else:
            out.append((fw, r.get("method", "?"), r.get("batch", 0), None, r))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("records", nargs="+")
    ap.add_argument("-o", "--out")
    args = ap.parse_args()
    recs = [json.load(open(p)) for p in args.records]
    precisions = sorted({precision_of(rec) for rec in recs}, key=PRECISIONS.index)
    mixed = len(precisions) > 1
    # With several precisions, rows are keyed by (batch, precision) so that each is compared with its own.
    rows = [(fw, m, (b, precision_of(rec)) if mixed else b, ms, r)
            for rec in recs for fw, m, b, ms, r in rows_of(rec)]
    base = {b: ms for fw, m, b, ms, _ in rows if fw == "dualcast" and m == "eager" and ms}
    lines = []
    dev = [r.get("device_name") for r in recs if r.get("device_name")]
    lines.append("ResNet-18 (CIFAR form, 1x28x28 inputs, %s) training step on %s"
                 % ("; ".join(HEADER[p] for p in precisions), ", ".join(sorted(set(dev))) or "?"))
    lines.append("")
    if mixed:
        lines.append("| batch | precision | framework | method | median ms | images/s | time / dualcast eager |")
        lines.append("|---:|---|---|---|---:|---:|---:|")
    else:
        lines.append("| batch | framework | method | median ms | images/s | time / dualcast eager |")
        lines.append("|---:|---|---|---:|---:|---:|")
    order = lambda b: (b[0], PRECISIONS.index(b[1])) if mixed else b
    for fw, m, b, ms, r in sorted(rows, key=lambda t: (order(t[2]), t[0] != "dualcast", t[1])):
        lead = "%d | %s" % b if mixed else "%d" % b
        n = b[0] if mixed else b
        if ms is None:
            lines.append("| %s | %s | %s | %s | | |" % (lead, fw, m, r.get("status", "?")))
            continue
        ratio = ("%.2fx" % (ms / base[b])) if b in base else ""
        lines.append("| %s | %s | %s | %.2f | %.0f | %s |" % (lead, fw, m, ms, n / (ms * 1e-3), ratio))
    for rec in recs:
        v = rec.get("validation")
        if v:
            lines.append("")
            lines.append("Validation (PyTorch on dualcast's weights and batch, batch %d, width %d): %s; loss rel. "
                         "error %.1e, gradients max %.1e (%s), running statistics %.1e, parameters after one "
                         "SGD step %.1e." % (v["batch"], v["width"], "passed" if v["ok"] else "FAILED",
                                             v["loss_rel_err"], v["grads"]["max_rel_err"], v["grads"]["at"],
                                             v["running_stats"]["max_rel_err"], v["params_after_step"]["max_rel_err"]))
            g64 = v["grads"].get("max_rel_err_vs_float64")
            if g64:
                lines.append("Against PyTorch's float64 run of the same step, the largest gradient error is %.1e for "
                             "dualcast and %.1e for PyTorch float32 (a tensor passes within %gx of PyTorch's own "
                             "error); failed: %s." % (g64["dualcast"], g64["torch"], v.get("float64_slack", 4),
                                                      ", ".join(v["grads"]["failed"]) or "none"))
    # What each dualcast method ran: the method names say what differs from the default, and the
    # default changed ("algorithms: find" before 9214848; no FFT or Winograd until 34522c2; since then
    # a direct-sum forward with transforms allowed in the float32 backward).
    backends = sorted({(rec.get("method", "eager"), rec["conv_backend"]) for rec in recs
                       if rec.get("framework") == "dualcast" and rec.get("conv_backend")})
    if backends:
        lines.append("")
        lines.append("Convolutions: " + "; ".join("%s: %s" % mb for mb in backends) + ".")
    t = {(fw, m, b): ms for fw, m, b, ms, _ in rows if ms}
    for k in [(256, p) for p in precisions] if mixed else [256]:
        if ("dualcast", "eager", k) not in t:
            continue
        d = t[("dualcast", "eager", k)]
        at = "batch 256, %s" % k[1] if mixed else "batch 256"
        lines.append("")
        if ("pytorch", "eager", k) in t:
            e = t[("pytorch", "eager", k)]
            lines.append("Target, %s: faster than PyTorch eager: %s (%.2f vs %.2f ms, %.2fx)."
                         % (at, "met" if d < e else "MISSED", d, e, e / d))
        if ("pytorch", "compile", k) in t:
            c = t[("pytorch", "compile", k)]
            lines.append("Target, %s: within 1.10x of torch.compile: %s (%.2fx)."
                         % (at, "met" if d <= 1.10 * c else "MISSED", d / c))
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
        print("table.py: wrote %s" % args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
