"""The pure half of study.py: what the study runs per model, how its records are read, what is derived
from them (efficiencies, speedups, ratios, targets, time to the 1-GPU bits/char) and the markdown
report. Standard library only, no GPU: test_study.py runs it on fabricated records; plot.py reads the
derived tables that study.py writes into scaling.json."""

import json

MODELS = ("resnet", "hmlstm")
PER_GPU = {"resnet": 256, "hmlstm": 64}  # weak: per GPU; strong: the global batch
SEQ = 100
TRAIN_STEPS, TRAIN_LR = 300, 2e-3
# The N-GPU run keeps the 1-GPU learning rate at N times the batch. Measured on 4 x H200
# (measured/h200x4-2026-11-28/train-lr): with 4 x the batch, lr 2e-3 * sqrt(4) and 2e-3 * 4 fit the
# small corpus's training split faster and its validation bits/char stop short of the 1-GPU run's
# (best 1.798 and 1.863 against 1.762), while 2e-3 reaches 1.760 at step 200.
TRAIN_LR_RULE = "Adam lr 2e-3 at any N (the 1-GPU rate kept at N times the batch)"
UNIT = {"resnet": "images/s", "hmlstm": "tokens/s"}
TITLE = {"resnet": "ResNet-18 (CIFAR form, 1x28x28, width 64, SGD)",
         "hmlstm": "HM-LSTM char model (3 layers, H 512, T 100, vocab 64, Adam + clip 1.0)"}
WEAK_TARGETS = (("resnet", 2, 0.98), ("resnet", 4, 0.97), ("hmlstm", 4, 0.95))


# ---- plan ---------------------------------------------------------------------------------------

def plan_runs(gpus_list, models, skip_torch=False, skip_train=False):
    """Every run of the study, in order, as dicts without command lines (study.py adds those)."""
    runs = []
    for model in models:
        per = PER_GPU[model]
        for scaling in ("weak", "strong"):
            for n in gpus_list:
                if scaling == "strong" and n == 1:
                    continue  # the weak N = 1 run is the strong baseline
                glob = per * n if scaling == "weak" else per
                fws = ("dualcast",) + (() if skip_torch else ("torch",))
                for fw in fws:
                    name = "%s%s_%s_g%d" % ("" if fw == "dualcast" else "torch_", model, scaling, n)
                    runs.append({"name": name, "framework": fw, "model": model, "scaling": scaling, "gpus": n,
                                 "global_batch": glob, "batch_per_gpu": glob // n if glob % n == 0 else None})
    if not skip_train and "hmlstm" in models:
        for n in sorted({1, max(gpus_list)}):
            runs.append({"name": "train_g%d" % n, "framework": "dualcast", "model": "hmlstm", "scaling": "train",
                         "gpus": n, "global_batch": 64 * n, "batch_per_gpu": 64, "lr": TRAIN_LR})
    return runs


# ---- parsing and derivation (pure: test_study.py runs them without GPUs) -----------------------

def med(s):
    return s.get("median") if isinstance(s, dict) else None


def ratio(a, b):
    return a / b if a is not None and b not in (None, 0) else None


def parse_record(run, js):
    """The numbers the study uses from one run's JSON (formats: README.md), or raises ValueError."""
    p = {"device_name": js.get("device_name")}
    if run["framework"] == "torch":
        st = js.get("status", "ok")
        if st != "ok":
            raise ValueError(st)
    gpus = js.get("world_size" if run["framework"] == "torch" else "gpus")
    if gpus != run["gpus"]:  # a record left from another run must not fill this row
        raise ValueError("the record is for %s GPU(s), the run for %d" % (gpus, run["gpus"]))
    if run["framework"] == "torch":
        ms = med(js.get("step_ms"))
        items = js["global_batch"] * (js.get("seq", SEQ) if run["model"] == "hmlstm" else 1)
        p.update({"step_ms": ms, "throughput": ratio(items * 1e3, ms), "gpus": js.get("world_size"),
                  "torch_version": js.get("torch_version"), "nccl_version": js.get("nccl_version"),
                  "exposed_comm_ms": js.get("exposed_comm_ms"), "hidden_comm_share": js.get("hidden_comm_share"),
                  "allreduce_alone_ms": med(js.get("allreduce_alone_ms")),
                  "allreduce_bus_gb_per_s": js.get("allreduce_bus_gb_per_s")})
        return p
    p.update({"gpus": js.get("gpus"), "comm_backend": js.get("comm_backend")})
    if run["scaling"] == "train":
        p["training"] = js["training"]
        return p
    if run["model"] == "resnet":
        r = js["results"][0]
        cap = r.get("captured")
        eager, dp, items = med(r.get("step_ms")), r.get("data_parallel"), r["batch"]
        captured = med(cap.get("step_ms")) if isinstance(cap, dict) else None  # a string when not captured
        p["comm_of"] = "eager"
    else:
        bench = js["bench"]
        eager, captured, dp = med(bench.get("eager_ms")), med(bench.get("captured_ms")), bench.get("data_parallel")
        items = js["batch"] * js.get("seq", SEQ)
        p["comm_of"] = "captured"
    if eager is None and captured is None:
        raise ValueError("no step time in the record")
    p.update({"eager_ms": eager, "captured_ms": captured, "step_ms": captured if captured is not None else eager,
              "throughput": ratio(items * 1e3, captured if captured is not None else eager)})
    if isinstance(dp, dict):
        p.update({k: dp.get(k) for k in ("exposed_comm_ms", "hidden_comm_share", "allreduce_bus_gb_per_s",
                                         "buckets", "buckets_launched_during_backward", "gradient_bytes")})
        p["compute_only_ms"] = med(dp.get("compute_only_ms"))
        p["allreduce_alone_ms"] = med(dp.get("allreduce_alone_ms"))
    return p


def load_record(run):
    """run["status"] "ok" with run["parsed"], or the reason why not, from the JSON at run["json"]."""
    if run.get("status", "ok") != "ok":
        return run
    try:
        with open(run["json"]) as fh:
            run["parsed"] = parse_record(run, json.load(fh))
        run["status"] = "ok"
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        msg = str(exc)
        run["status"] = msg if msg.startswith(("skipped", "failed")) else "failed: bad record: %s: %s" % (
            type(exc).__name__, msg)
        run.pop("parsed", None)
    return run


def _find(runs, fw, model, scaling, n):
    for r in runs:
        if (r["framework"], r["model"], r["scaling"], r["gpus"]) == (fw, model, scaling, n):
            return r
    return None


def _get(run, key):
    return run["parsed"].get(key) if run and run.get("status") == "ok" else None


def _status(run):
    return run["status"] if run else "not run"


def derive_training(one, many):
    """Time to the 1-GPU run's final validation bits/char: wall time = step * ms_per_step / 1000."""
    t1, tn = one["training"], many["training"]
    target = t1["valid_bpc"][-1]
    res = {"gpus": many["gpus"], "target_valid_bpc": target, "steps_1": t1["step"][-1], "lr_1": t1.get("lr"),
           "lr_n": tn.get("lr"), "ms_per_step_1": t1["ms_per_step"], "ms_per_step_n": tn["ms_per_step"],
           "wall_1_s": t1["step"][-1] * t1["ms_per_step"] / 1e3, "final_valid_bpc_n": tn["valid_bpc"][-1],
           "reached_step": None, "reached_valid_bpc": None, "wall_n_s": None, "faster": False,
           "lr_rule": TRAIN_LR_RULE}
    for step, v in zip(tn["step"], tn["valid_bpc"]):
        if v is not None and v <= target:
            res.update({"reached_step": step, "reached_valid_bpc": v, "wall_n_s": step * tn["ms_per_step"] / 1e3})
            res["faster"] = res["wall_n_s"] < res["wall_1_s"]
            break
    return res


def derive(runs, gpus_list, models):
    """Tables, targets and the training result from loaded runs (load_record)."""
    out = {"models": {}, "targets": [], "training": None}
    for model in models:
        w1 = {fw: _find(runs, fw, model, "weak", 1) for fw in ("dualcast", "torch")}
        weak, strong = [], []
        for n in gpus_list:
            d, t = _find(runs, "dualcast", model, "weak", n), _find(runs, "torch", model, "weak", n)
            weak.append({"gpus": n, "batch_per_gpu": PER_GPU[model], "global_batch": PER_GPU[model] * n,
                         "dualcast_captured_ms": _get(d, "captured_ms"), "dualcast_eager_ms": _get(d, "eager_ms"),
                         "torch_ms": _get(t, "step_ms"),
                         "dualcast_eff": ratio(_get(w1["dualcast"], "captured_ms"), _get(d, "captured_ms")),
                         "dualcast_eager_eff": ratio(_get(w1["dualcast"], "eager_ms"), _get(d, "eager_ms")),
                         "torch_eff": ratio(_get(w1["torch"], "step_ms"), _get(t, "step_ms")),
                         "torch_over_dualcast": ratio(_get(t, "step_ms"), _get(d, "captured_ms")),
                         "torch_over_dualcast_eager": ratio(_get(t, "step_ms"), _get(d, "eager_ms")),
                         "dualcast_throughput": _get(d, "throughput"), "torch_throughput": _get(t, "throughput"),
                         "exposed_comm_ms": _get(d, "exposed_comm_ms"),
                         "hidden_comm_share": _get(d, "hidden_comm_share"),
                         "comm_of": _get(d, "comm_of"), "allreduce_alone_ms": _get(d, "allreduce_alone_ms"),
                         "allreduce_bus_gb_per_s": _get(d, "allreduce_bus_gb_per_s"),
                         "torch_exposed_comm_ms": _get(t, "exposed_comm_ms"),
                         "torch_hidden_comm_share": _get(t, "hidden_comm_share"),
                         "dualcast_status": _status(d), "torch_status": _status(t)})
            if n == 1:
                d, t = w1["dualcast"], w1["torch"]
            else:
                d, t = _find(runs, "dualcast", model, "strong", n), _find(runs, "torch", model, "strong", n)
            sp = ratio(_get(w1["dualcast"], "captured_ms"), _get(d, "captured_ms"))
            tsp = ratio(_get(w1["torch"], "step_ms"), _get(t, "step_ms"))
            strong.append({"gpus": n, "global_batch": PER_GPU[model], "batch_per_gpu": PER_GPU[model] / n,
                           "dualcast_captured_ms": _get(d, "captured_ms"), "dualcast_eager_ms": _get(d, "eager_ms"),
                           "torch_ms": _get(t, "step_ms"), "dualcast_speedup": sp,
                           "dualcast_eff": ratio(sp, n), "torch_speedup": tsp, "torch_eff": ratio(tsp, n),
                           "dualcast_eager_speedup": ratio(_get(w1["dualcast"], "eager_ms"), _get(d, "eager_ms")),
                           "torch_over_dualcast": ratio(_get(t, "step_ms"), _get(d, "captured_ms")),
                           "dualcast_throughput": _get(d, "throughput"), "torch_throughput": _get(t, "throughput"),
                           "dualcast_status": _status(d), "torch_status": _status(t)})
        out["models"][model] = {"weak": weak, "strong": strong}
    for model, n, thr in WEAK_TARGETS:
        if model not in models:
            continue
        row = next((r for r in out["models"][model]["weak"] if r["gpus"] == n), None)
        _target(out, "%s weak-scaling efficiency at %d GPUs (dualcast, captured step) >= %.2f" % (model, n, thr),
                row and row["dualcast_eff"], thr, ran=row is not None, label="efficiency")
    for model in models:
        for scaling in ("weak", "strong"):
            for row in out["models"][model][scaling]:
                if row["gpus"] > 1:
                    _target(out, "%s %s, %d GPUs: dualcast step (captured) faster than torch DDP"
                            % (model, scaling, row["gpus"]), row["torch_over_dualcast"], 1.0, strict=True,
                            label="torch / dualcast")
    trains = sorted((r for r in runs if r["scaling"] == "train"), key=lambda r: r["gpus"])
    if len(trains) >= 2:
        one, many = trains[0], trains[-1]
        if one.get("status") == "ok" and many.get("status") == "ok":
            try:
                out["training"] = derive_training(one["parsed"], many["parsed"])
            except (KeyError, IndexError, TypeError) as exc:  # an empty curve, a null (non-finite) bpc
                out["training"] = {"gpus": many["gpus"], "status": "no curve to compare (%s: %s)"
                                   % (type(exc).__name__, exc)}
        else:
            out["training"] = {"gpus": many["gpus"], "status": "1 GPU: %s; %d GPUs: %s"
                               % (_status(one), many["gpus"], _status(many))}
    return out


def _target(out, name, value, thr, ran=True, strict=False, label="value"):
    verdict = "NOT RUN" if not ran else "NO DATA" if value is None else \
        "PASS" if (value > thr if strict else value >= thr) else "MISS"
    out["targets"].append({"name": name, "value": value, "label": label, "threshold": thr, "verdict": verdict})


# ---- markdown --------------------------------------------------------------------------------

def fmt(v, spec="%.3f"):
    return "-" if v is None else spec % v


def pct(v):
    return "-" if v is None else "%.0f%%" % (100 * v)


def table(head, rows):
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def render_markdown(study):
    d = study["derived"]
    lines = ["# Data-parallel scaling: dualcast vs PyTorch DDP", "",
             "GPU: %s. float32, TF32 off, same machine, same run. dualcast communicator: %s; PyTorch %s, NCCL %s."
             % (study.get("device_name") or "unknown", study.get("comm_backend") or "-",
                study.get("torch_version") or "-", study.get("nccl_version") or "-"),
             "dualcast's headline is the captured step (CUDA graph replay); PyTorch DDP is eager. Times are "
             "medians of %s repetitions (ms per training step); dualcast commit %s."
             % (study.get("reps", "?"), study.get("commit") or "unknown"), ""]
    for model, m in d["models"].items():
        lines += ["## %s: weak scaling, %d per GPU" % (TITLE[model], PER_GPU[model]), ""]
        lines += table(["GPUs", "dualcast captured ms", "dualcast eager ms", "torch DDP ms",
                        "weak eff. dualcast", "weak eff. torch", "torch / dualcast",
                        "exposed comm ms (%s)" % ("eager" if model == "resnet" else "captured"), "hidden share",
                        "dualcast %s" % UNIT[model], "torch %s" % UNIT[model]],
                       [[str(r["gpus"]), fmt(r["dualcast_captured_ms"]), fmt(r["dualcast_eager_ms"]),
                         fmt(r["torch_ms"]),
                         fmt(r["dualcast_eff"]), fmt(r["torch_eff"]), fmt(r["torch_over_dualcast"], "%.2f"),
                         fmt(r["exposed_comm_ms"]), pct(r["hidden_comm_share"]),
                         fmt(r["dualcast_throughput"], "%.0f"), fmt(r["torch_throughput"], "%.0f")] for r in m["weak"]])
        lines.append("")
    lines += ["## Strong scaling (global batch fixed: ResNet-18 256 images, HM-LSTM 64 sequences)", ""]
    rows = []
    for model, m in d["models"].items():
        rows += [[model, str(r["gpus"]), "%g" % r["batch_per_gpu"], fmt(r["dualcast_captured_ms"]),
                  fmt(r["dualcast_speedup"], "%.2f"), fmt(r["dualcast_eff"]), fmt(r["torch_ms"]),
                  fmt(r["torch_speedup"], "%.2f"), fmt(r["torch_eff"]), fmt(r["torch_over_dualcast"], "%.2f")]
                 for r in m["strong"]]
    lines += table(["model", "GPUs", "per GPU", "dualcast captured ms", "speedup", "efficiency", "torch DDP ms",
                    "torch speedup", "torch efficiency", "torch / dualcast"], rows)
    lines += ["", "## Targets", ""]
    lines += ["- %s: %s (%s %s)" % (t["verdict"], t["name"], t.get("label", "value"), fmt(t["value"], "%.4f"))
              for t in d["targets"]]
    tr = d.get("training")
    if tr:
        lines += ["", "## Character-LM training (hmlstm_dp --train-steps %d)" % TRAIN_STEPS, ""]
        if "status" in tr:
            lines.append("- not compared: %s" % tr["status"])
        else:
            lines += ["- %s; 1 GPU: batch 64, lr %s; %d GPUs: batch %d, lr %s."
                      % (tr["lr_rule"], fmt(tr["lr_1"], "%.4g"), tr["gpus"], 64 * tr["gpus"], fmt(tr["lr_n"], "%.4g")),
                      "- 1 GPU: final validation %.4f bits/char after %d steps, %.1f s (%.3f ms/step)."
                      % (tr["target_valid_bpc"], tr["steps_1"], tr["wall_1_s"], tr["ms_per_step_1"])]
            if tr["reached_step"] is None:
                lines.append("- %d GPUs: never reached %.4f bits/char (final %s): not faster."
                             % (tr["gpus"], tr["target_valid_bpc"], fmt(tr["final_valid_bpc_n"], "%.4f")))
            else:
                lines.append("- %d GPUs: reached %.4f bits/char at step %d, %.1f s (%.3f ms/step): %s."
                             % (tr["gpus"], tr["reached_valid_bpc"], tr["reached_step"], tr["wall_n_s"],
                                tr["ms_per_step_n"], "less wall time (faster)" if tr["faster"] else "not faster"))
            lines.append("- both runs validate on the same windows (the first 4 x 64 of the validation split).")
    bad = [r for r in study["runs"] if r.get("status") != "ok"]
    if bad:
        lines += ["", "## Runs that failed or were skipped", ""]
        lines += ["- %s: %s" % (r["name"], r["status"]) for r in bad]
    return "\n".join(lines) + "\n"
