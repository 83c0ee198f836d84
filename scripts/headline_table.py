"""headline_table.py: the README's table of headline results, which scripts/paper writes between the
README's headline markers (and `scripts/paper --check` compares) from the measured runs, like the
paper's tables, so the front page cannot drift from the data either.

HEADLINE_RUNS names the run behind each GPU's numbers: when a newer run replaces one (experiments/history.md
says which runs are current), change the folder there and run scripts/paper. HEADLINE_ROWS says what
each row shows. Only machine-readable result files are read; a row whose data is not in one has no
place here (a hand-typed number would drift)."""
import json
import os
import re

# The source runs, folders under paper/measured/, by GPU. The key is what the table calls the GPU; the
# run's device name must contain it (checked), so a folder cannot be credited to the wrong card.
HEADLINE_RUNS = {
    "H200": {"kernels": "h200-2026-11-27/hmlstm-a-d",   # workloads a-d with the peers
             "hmlstm step": "h200-2026-11-29e/final/e_fp32",  # workload e, captured, with JAX (float32, 2026-11-29, fifth session)
             "resnet": "h200-2026-11-25/resnet"},       # resnet-study bench, PyTorch in the same call
    "H100": {"kernels": "h100-2026-11-27/hmlstm-a-d",
             "hmlstm step": "h100-2026-11-25c/hm",
             "resnet": "h100-2026-11-25b/resnet"},
}
# (what the row shows, its short name in the note below the table, which run of HEADLINE_RUNS, the
# HM-LSTM table row or the ResNet batch size, dualcast's method, dualcast's reverse-mode method).
HEADLINE_ROWS = [
    ("HM-LSTM cell update (workload a), forward+backward, {size}", "cell update", "kernels", "a 8192",
     "mixed", "reverse"),
    ("full HM-LSTM cell, two outputs (workload b), forward+backward, {size}", "full cell", "kernels",
     "b 8192", "mixed", "reverse"),
    ("3-layer HM-LSTM training step (workload e: H, B, T = {size}), captured", "HM-LSTM step", "hmlstm step",
     "e H=512 B=64 T=100", "mixed_graph", "reverse_graph"),
    ("ResNet-18 training step (Fashion-MNIST, batch {size}), captured", "ResNet-18 step", "resnet", 256,
     "captured", None),
]
BEGIN = "<!-- headline: begin (scripts/paper writes this table) -->"
END = "<!-- headline: end -->"
# The peers' names in the HM-LSTM results (method) and the ResNet records ((framework, method)).
PEERS = {"eager": "PyTorch eager", "compile": "torch.compile", "jax": "JAX jit", "jax_remat": "JAX + remat",
         "numpy": "NumPy", "numpy_hand": "NumPy by hand",
         ("pytorch", "eager"): "PyTorch eager", ("pytorch", "compile"): "torch.compile"}


class HeadlineError(Exception):
    pass


def _read(path):
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError) as e:
        raise HeadlineError("cannot read %s: %s" % (path, e)) from e


def number(x, unit_scale=1.0):
    """A time as every generated table writes it (scripts/paper uses this one too): four significant
    figures at most, no decimals from 1000 up."""
    v = x * unit_scale
    return "%.0f" % v if v >= 1000 else "%.1f" % v if v >= 10 else "%.2f" % v


def _time(ms, unit):
    return number(ms, 1000.0 if unit == "µs" else 1.0) + " " + unit


def _hmlstm(folder, gpu, row, method, reverse):
    path = os.path.join(folder, "results.json")
    res = _read(path)
    meta = res.get("meta", {})
    if meta.get("tool") != "hmlstm_experiment" or meta.get("dtype") != "float32":
        raise HeadlineError("%s: not a float32 run of the HM-LSTM driver" % path)
    if gpu not in meta.get("device_name", ""):
        raise HeadlineError("%s ran on %s, not an %s" % (path, meta.get("device_name", "?"), gpu))
    r = next((r for r in res.get("table", []) if r.get("row") == row), None)
    if r is None:
        raise HeadlineError("%s has no row %r" % (path, row))
    # Every number shown must have been validated before it was timed (the driver and the peers
    # record it per measurement).
    recs = {m.get("method"): m for m in res.get("measurements", [])
            if m.get("workload") == r["workload"] and m.get("variant") == r["variant"] and m.get("dims") == r["dims"]}
    peers = {m: r[m + "_ms"] for m in PEERS if isinstance(m, str) and isinstance(r.get(m + "_ms"), (int, float))}
    for m in [method, reverse] + list(peers):
        if not isinstance(r.get(m + "_ms"), (int, float)) or not recs.get(m, {}).get("validated"):
            raise HeadlineError("%s, %s: %s is missing or was not validated" % (path, row, m))
    if not peers:
        raise HeadlineError("%s, %s: no peer measured in this run" % (path, row))
    unit = "ms" if r["workload"] == "e" else "µs"
    size = r["variant"].replace("H=", "").replace(" B=", ", ").replace(" T=", ", ") if r["workload"] == "e" \
        else "%d²" % r["dims"]
    floor = r.get("floor_ms")
    return {"size": size, "unit": unit, "ms": r[method + "_ms"], "reverse_ms": r[reverse + "_ms"],
            "floor_ms": floor if isinstance(floor, (int, float)) and floor > 0 else None,
            "peers": {PEERS[m]: v for m, v in peers.items()}, "reps": recs[method].get("reps"),
            "source": os.path.dirname(path), "kind": "hmlstm"}


def _resnet(folder, gpu, batch, method):
    ours, torch = (_read(os.path.join(folder, f)) for f in ("dualcast_bench.json", "torch_bench.json"))
    for name, rec in (("dualcast_bench.json", ours), ("torch_bench.json", torch)):
        if "fp32" not in rec.get("what", "") or gpu not in rec.get("device_name", ""):
            raise HeadlineError("%s/%s: not an fp32 step on an %s" % (folder, name, gpu))
    if ours["device_name"] != torch["device_name"]:
        raise HeadlineError("%s: dualcast and PyTorch ran on different GPUs" % folder)
    # peer_torch.py once wrote its settings under "precision"; now the name (fp32, ...) is there and
    # the settings under "precision_settings".
    settings = torch.get("precision_settings", torch.get("precision", ""))
    name = torch.get("precision") if "precision_settings" in torch else "fp32"
    if name != "fp32" or "tf32 off" not in settings or not torch.get("validation", {}).get("ok"):
        raise HeadlineError("%s: PyTorch's run is not float32 (TF32 off) or its validation failed" % folder)
    r = next((r for r in ours.get("results", []) if r.get("batch") == batch), None)
    step = r.get(method) if r and method == "captured" else r
    if not isinstance(step, dict) or "step_ms" not in step:
        raise HeadlineError("%s: no dualcast %s step at batch %s" % (folder, method, batch))
    peers = {PEERS[("pytorch", p["method"])]: p["step_ms"]["median"] for p in torch.get("results", [])
             if p.get("batch") == batch and p.get("status") == "ok" and ("pytorch", p.get("method")) in PEERS}
    if not peers:
        raise HeadlineError("%s: no PyTorch step at batch %s" % (folder, batch))
    return {"size": str(batch), "unit": "ms", "ms": step["step_ms"]["median"], "reverse_ms": None,
            "floor_ms": None, "peers": peers, "reps": step.get("reps"), "source": folder, "kind": "resnet"}


def rows(measured):
    """The table's rows, each a dict, in the order of HEADLINE_ROWS and, within one, of HEADLINE_RUNS."""
    out = []
    for label, short, run, which, method, reverse in HEADLINE_ROWS:
        for gpu, runs in HEADLINE_RUNS.items():
            folder = os.path.join(measured, runs[run])
            r = (_resnet(folder, gpu, which, method) if run == "resnet"
                 else _hmlstm(folder, gpu, which, method, reverse))
            r.update(label=label.format(size=r["size"]), short=short, gpu=gpu)
            out.append(r)
    return out


def table(measured, root, table_name):
    """The Markdown between the markers. table_name(folder, kind) is scripts/paper's name of the
    table generated from that folder, which each row links to."""
    lines = ["| measured (float32) | GPU | dualcast | x floor | reverse mode / mixed | fastest peer, same run "
             "| peer / dualcast | data |", "|---|---|---:|---:|---:|---|---:|---|"]
    reps = {}
    for r in rows(measured):
        peer, peer_ms = min(r["peers"].items(), key=lambda kv: kv[1])
        link = "paper/tables/" + table_name(r["source"], r["kind"])
        if not os.path.isfile(os.path.join(root, link)):
            raise HeadlineError("%s: no generated table %s to link to" % (os.path.relpath(r["source"], root), link))
        lines.append("| %s | %s | %s | %s | %s | %s %s | %.2fx | [table](%s) |" % (
            r["label"], r["gpu"], _time(r["ms"], r["unit"]),
            "%.2f" % (r["ms"] / r["floor_ms"]) if r["floor_ms"] else "–",
            "%.2fx" % (r["reverse_ms"] / r["ms"]) if r["reverse_ms"] else "–",
            peer, _time(peer_ms, r["unit"]), peer_ms / r["ms"], link))
        reps.setdefault(r["reps"], [])
        if r["short"] not in reps[r["reps"]]:
            reps[r["reps"]].append(r["short"])
    lines += ["", "Medians of " + " and ".join("%s timed steps (%s)" % (n, ", ".join(s)) for n, s in reps.items())
              + "; every peer ran in the same run on the same GPU and was validated against dualcast before it "
              "was timed. The floor is the bytes a step must move over the copy bandwidth measured in that run."]
    return "\n".join(lines)


def into_readme(text, measured, root, table_name):
    """The README's text with the table between its markers replaced by what the data gives."""
    pattern = re.compile(re.escape(BEGIN) + r"\n.*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise HeadlineError("README.md has no '%s' ... '%s' lines to write the table between" % (BEGIN, END))
    body = table(measured, root, table_name)
    return pattern.sub(lambda _: "%s\n%s\n%s" % (BEGIN, body, END), text, count=1)


def sources(measured):
    """The folders the table is generated from (scripts/paper --list)."""
    return sorted({os.path.join(measured, runs[row[2]]) for runs in HEADLINE_RUNS.values() for row in HEADLINE_ROWS})
