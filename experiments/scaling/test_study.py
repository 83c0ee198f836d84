#!/usr/bin/env python3
"""Self-test of the scaling study without GPUs (standard library only):

    python3 experiments/scaling/test_study.py

1. derive.py on fabricated records in the drivers' formats (resnet_train --bench, hmlstm_dp --bench
   and --train-steps, peer_torch_ddp.py), with a failed run, a skipped one (the peer's own "skipped"
   record) and a run without a captured step: weak-scaling efficiencies, strong-scaling speedups,
   dualcast/torch ratios, PASS/MISS/NO DATA/NOT RUN, the time to the 1-GPU bits/char, the markdown.
   Every expected number is worked out by hand here, not by calling the code under test.
2. study.py end to end against fake resnet_train / hmlstm_dp executables: command lines, the child
   environment (multicast off, no launcher variables), a failing run recorded with its stderr tail,
   the exit status, and --time-budget.
Exits 1 on the first failed check.
"""

import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import derive  # noqa: E402

DEVICE = "NVIDIA H100 80GB HBM3"


def check(cond, what):
    if not cond:
        print("test_study: FAILED: %s" % what)
        sys.exit(1)


def close(a, b, tol=1e-6):
    return a is not None and b is not None and abs(a - b) <= tol * max(1.0, abs(b))


def summ(m):
    return {"median": m, "p10": m * 0.99, "p90": m * 1.01, "min": m * 0.98, "max": m * 1.05, "n": 30}


def dp_block(exposed, hidden):
    return {"compute_only_ms": summ(90.0), "allreduce_alone_ms": summ(5.0), "exposed_comm_ms": exposed,
            "hidden_comm_share": hidden, "allreduce_bus_gb_per_s": 300.0, "buckets": 4,
            "buckets_launched_during_backward": 3, "gradient_bytes": 44696360}


def dc_resnet(gpus, batch, eager, captured, dp=None):
    r = {"batch": batch, "batch_per_gpu": batch // gpus, "gpus": gpus, "step_ms": summ(eager), "pipelined_ms": eager,
         "captured": {"step_ms": summ(captured)} if captured is not None else "skipped: no dualcast::Graph"}
    if dp:
        r["data_parallel"] = dp
    return {"framework": "dualcast", "gpus": gpus, "comm_backend": "nccl" if gpus > 1 else "local",
            "device_name": DEVICE, "results": [r]}


def dc_hmlstm(gpus, batch, eager, captured, dp=None):
    b = {"eager_ms": summ(eager), "captured_ms": summ(captured), "tokens_per_s_captured": 0.0}
    if dp:
        b["data_parallel"] = dp
    return {"gpus": gpus, "batch": batch, "batch_per_gpu": batch // gpus, "seq": 100, "hidden": 512,
            "comm_backend": "nccl" if gpus > 1 else "local", "device_name": DEVICE, "bench": b}


def torch_rec(model, world, per, ms, status="ok"):
    r = {"framework": "pytorch-ddp", "model": model, "world_size": world, "batch_per_gpu": per,
         "global_batch": per * world, "status": status, "torch_version": "2.11.0", "nccl_version": "2.27.3",
         "device_name": DEVICE}
    if model == "hmlstm":
        r["seq"] = 100
    if status == "ok":
        r["step_ms"] = summ(ms)
    return r


def train_rec(gpus, valid, ms_per_step, lr):
    steps = [25 * i for i in range(len(valid))]
    return {"gpus": gpus, "batch": 64 * gpus, "comm_backend": "nccl", "device_name": DEVICE,
            "training": {"step": steps, "train_bpc": [v + 0.1 for v in valid], "valid_bpc": valid,
                         "ms_per_step": ms_per_step, "train_seconds": steps[-1] * ms_per_step / 1e3, "lr": lr}}


# name -> fabricated record; None: the run failed before writing one
RECORDS = {
    "resnet_weak_g1": dc_resnet(1, 256, 110.0, 98.0),
    "resnet_weak_g2": dc_resnet(2, 512, 112.0, 100.0, dp_block(1.0, 0.8)),  # 0.98: on the target
    "resnet_weak_g4": dc_resnet(4, 1024, 116.0, 104.0, dp_block(4.0, 0.5)),
    "torch_resnet_weak_g1": torch_rec("resnet", 1, 256, 120.0),
    "torch_resnet_weak_g2": torch_rec("resnet", 2, 256, 125.0),
    "torch_resnet_weak_g4": torch_rec("resnet", 4, 256, 130.0),
    "resnet_strong_g2": dc_resnet(2, 256, 60.0, 55.0, dp_block(2.0, 0.6)),
    "resnet_strong_g4": dc_resnet(4, 256, 40.0, None, dp_block(3.0, 0.4)),   # no captured step
    "torch_resnet_strong_g2": torch_rec("resnet", 2, 128, 70.0),
    "torch_resnet_strong_g4": torch_rec("resnet", 4, 64, 40.0),
    "hmlstm_weak_g1": dc_hmlstm(1, 64, 70.0, 50.0),
    "hmlstm_weak_g2": dc_hmlstm(2, 128, 72.0, 51.0, dp_block(0.5, 0.9)),
    "hmlstm_weak_g4": dc_hmlstm(4, 256, 75.0, 52.0, dp_block(1.5, 0.7)),
    "torch_hmlstm_weak_g1": torch_rec("hmlstm", 1, 64, 80.0),
    "torch_hmlstm_weak_g2": torch_rec("hmlstm", 2, 64, 85.0),
    "torch_hmlstm_weak_g4": torch_rec("hmlstm", 4, 64, 0.0, status="skipped: no CUDA device"),
    "hmlstm_strong_g2": dc_hmlstm(2, 64, 40.0, 30.0),
    "hmlstm_strong_g4": dc_hmlstm(4, 64, 30.0, 20.0),
    "torch_hmlstm_strong_g2": torch_rec("hmlstm", 2, 32, 30.0),  # a tie is not faster
    "torch_hmlstm_strong_g4": None,
    # 1 GPU ends at 4.0 - 0.125 * 12 = 2.5 (exact in binary) after 300 steps at 30 ms: 9.0 s.
    "train_g1": train_rec(1, [4.0 - 0.125 * i for i in range(13)], 30.0, 2e-3),
    # 4 GPUs: just above at step 75, exactly 2.5 at step 100: 100 * 40 ms = 4.0 s.
    "train_g4": train_rec(4, [4.0, 3.5, 3.0, 2.5000001, 2.5, 2.4, 2.3, 2.2, 2.1, 2.0, 1.9, 1.8, 1.7], 40.0, 4e-3),
}


def fabricate(tmp, gpus_list):
    runs = derive.plan_runs(gpus_list, derive.MODELS)
    for run in runs:
        rec = RECORDS.get(run["name"], "absent")
        run["json"] = os.path.join(tmp, run["name"] + ".json")
        if rec == "absent":
            run["status"] = "skipped: time budget (1 s) spent"
            continue
        if rec is None:
            run.update(status="failed: exit status 1", stderr_tail="RuntimeError: NCCL error: unhandled")
            continue
        with open(run["json"], "w") as fh:
            json.dump(rec, fh)
        derive.load_record(run)
    return runs


def md_table(md, heading):
    """The rows (lists of cells) of the first table after the line starting with `heading`."""
    lines = md.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith(heading))
    while not lines[i].startswith("|"):
        i += 1
    rows = []
    for line in lines[i + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def test_derivation(tmp):
    runs = fabricate(tmp, [1, 2, 4])
    check(len(runs) == 22, "plan: 2 models x (3 weak + 2 strong) x 2 frameworks + 2 training runs, got %d" % len(runs))
    check({r["name"] for r in runs} == set(RECORDS), "plan: run names")
    check(runs[-1]["lr"] == 2e-3, "train_g4: lr 2e-3, the 1-GPU rate")
    st = {r["name"]: r["status"] for r in runs}
    check(st["torch_hmlstm_weak_g4"] == "skipped: no CUDA device",
          "the peer's skipped record: %s" % st["torch_hmlstm_weak_g4"])
    check(st["torch_hmlstm_strong_g4"].startswith("failed"), "the failed run stays failed")
    check(sum(s == "ok" for s in st.values()) == 20, "20 runs ok")
    d = derive.derive(runs, [1, 2, 4], list(derive.MODELS))
    rw = {r["gpus"]: r for r in d["models"]["resnet"]["weak"]}
    check(close(rw[1]["dualcast_eff"], 1.0), "resnet weak eff at 1")
    check(close(rw[2]["dualcast_eff"], 0.98), "resnet weak eff at 2: %s" % rw[2]["dualcast_eff"])
    check(close(rw[4]["dualcast_eff"], 98 / 104), "resnet weak eff at 4")
    check(close(rw[2]["dualcast_eager_eff"], 110 / 112), "resnet weak eager eff at 2")
    check(close(rw[4]["torch_eff"], 120 / 130), "torch resnet weak eff at 4")
    check(close(rw[2]["torch_over_dualcast"], 125 / 100), "torch / dualcast at 2")
    check(close(rw[2]["torch_over_dualcast_eager"], 125 / 112), "torch / dualcast eager at 2")
    check(close(rw[2]["dualcast_throughput"], 512 / 0.100), "resnet throughput at 2 (global images / s)")
    check(rw[4]["exposed_comm_ms"] == 4.0 and rw[4]["hidden_comm_share"] == 0.5 and rw[4]["comm_of"] == "eager",
          "resnet exposed / hidden at 4")
    check(rw[1]["exposed_comm_ms"] is None, "no communication on 1 GPU")
    hw = {r["gpus"]: r for r in d["models"]["hmlstm"]["weak"]}
    check(close(hw[4]["dualcast_eff"], 50 / 52), "hmlstm weak eff at 4")
    check(close(hw[4]["dualcast_throughput"], 256 * 100 / 0.052), "hmlstm tokens/s at 4")
    check(hw[4]["torch_ms"] is None and hw[4]["torch_eff"] is None and hw[4]["torch_status"].startswith("skipped"),
          "skipped torch run: no numbers")
    check(hw[2]["comm_of"] == "captured", "hmlstm's communication is the captured step's")
    rs = {r["gpus"]: r for r in d["models"]["resnet"]["strong"]}
    check(close(rs[1]["dualcast_speedup"], 1.0) and rs[1]["global_batch"] == 256, "strong N=1 is the weak N=1 run")
    check(close(rs[2]["dualcast_speedup"], 98 / 55) and close(rs[2]["dualcast_eff"], 98 / 55 / 2), "resnet strong at 2")
    check(rs[4]["dualcast_speedup"] is None and close(rs[4]["dualcast_eager_speedup"], 110 / 40),
          "resnet strong at 4 without a captured step")
    check(close(rs[4]["torch_speedup"], 3.0) and close(rs[4]["torch_eff"], 0.75), "torch resnet strong at 4")
    check(rs[4]["batch_per_gpu"] == 64, "strong per-GPU batch")
    hs = {r["gpus"]: r for r in d["models"]["hmlstm"]["strong"]}
    check(close(hs[4]["dualcast_eff"], 2.5 / 4) and close(hs[2]["torch_over_dualcast"], 1.0), "hmlstm strong")
    want = {"resnet weak-scaling efficiency at 2": "PASS", "resnet weak-scaling efficiency at 4": "MISS",
            "hmlstm weak-scaling efficiency at 4": "PASS", "resnet weak, 2 GPUs": "PASS",
            "resnet weak, 4 GPUs": "PASS", "resnet strong, 2 GPUs": "PASS", "resnet strong, 4 GPUs": "NO DATA",
            "hmlstm weak, 2 GPUs": "PASS", "hmlstm weak, 4 GPUs": "NO DATA", "hmlstm strong, 2 GPUs": "MISS",
            "hmlstm strong, 4 GPUs": "NO DATA"}
    check(len(d["targets"]) == len(want), "%d targets, got %d" % (len(want), len(d["targets"])))
    for t in d["targets"]:
        key = next((k for k in want if t["name"].startswith(k)), None)
        check(key is not None and t["verdict"] == want[key], "target %r: %s" % (t["name"], t["verdict"]))
    tr = d["training"]
    check(tr["target_valid_bpc"] == 2.5 and close(tr["wall_1_s"], 9.0), "1-GPU target and wall time")
    check(tr["reached_step"] == 100 and close(tr["wall_n_s"], 4.0) and tr["faster"] is True,
          "time to target on 4 GPUs: %s" % tr)
    one = {"training": RECORDS["train_g1"]["training"], "gpus": 1}
    slow = derive.derive_training(one, {"gpus": 4,
                                        "training": dict(RECORDS["train_g4"]["training"], ms_per_step=100.0)})
    check(slow["reached_step"] == 100 and close(slow["wall_n_s"], 10.0) and slow["faster"] is False, "slower run")
    never = derive.derive_training(one, {"gpus": 4, "training": dict(RECORDS["train_g4"]["training"],
                                                                    valid_bpc=[3.0] * 13)})
    check(never["reached_step"] is None and never["faster"] is False, "a run that never reaches the target")

    study = {"device_name": DEVICE, "comm_backend": "nccl", "torch_version": "2.11.0", "nccl_version": "2.27.3",
             "reps": 30, "runs": runs, "derived": d}
    md = derive.render_markdown(study)
    check("float32, TF32 off, same machine, same run" in md and DEVICE in md, "markdown: the statement and the GPU")
    rows = md_table(md, "## ResNet-18")
    check(len(rows) == 3, "resnet weak table: 3 rows")
    check(rows[1] == ["2", "100.000", "112.000", "125.000", "0.980", "0.960", "1.25", "1.000", "80%", "5120", "4096"],
          "resnet weak row N=2: %s" % rows[1])
    check(rows[2][4] == "0.942" and rows[2][8] == "50%", "resnet weak row N=4: %s" % rows[2])
    hrows = md_table(md, "## HM-LSTM")
    check(hrows[2][3] == "-" and hrows[2][5] == "-" and hrows[2][4] == "0.962", "hmlstm weak row N=4: %s" % hrows[2])
    srows = md_table(md, "## Strong scaling")
    check(srows[2] == ["resnet", "4", "64", "-", "-", "-", "40.000", "3.00", "0.750", "-"],
          "strong resnet 4: %s" % srows[2])
    check(srows[4][:6] == ["hmlstm", "2", "32", "30.000", "1.67", "0.833"], "strong hmlstm 2: %s" % srows[4])
    check("- PASS: resnet weak-scaling efficiency at 2 GPUs" in md and
          "- MISS: resnet weak-scaling efficiency at 4 GPUs" in md and "- MISS: hmlstm strong, 2 GPUs" in md,
          "markdown: target lines")
    check("reached 2.5000 bits/char at step 100, 4.0 s" in md and "less wall time (faster)" in md and
          derive.TRAIN_LR_RULE in md and "the same windows" in md, "markdown: training lines")
    check("- torch_hmlstm_strong_g4: failed: exit status 1" in md and "- torch_hmlstm_weak_g4: skipped: no CUDA device"
          in md, "markdown: failed and skipped runs")

    d2 = derive.derive(fabricate(tmp, [1, 2]), [1, 2], list(derive.MODELS))
    v2 = {t["name"].split(" (")[0]: t["verdict"] for t in d2["targets"]}
    check(v2["resnet weak-scaling efficiency at 4 GPUs"] == "NOT RUN" and
          v2["resnet weak-scaling efficiency at 2 GPUs"] == "PASS", "2-GPU machine: 4-GPU targets not run: %s" % v2)
    check(d2["training"]["status"] == "1 GPU: ok; 2 GPUs: skipped: time budget (1 s) spent",
          "training not compared when the N-GPU run was skipped: %s" % d2["training"])

    bad = {"name": "x", "framework": "dualcast", "model": "hmlstm", "scaling": "weak", "gpus": 2,
           "json": os.path.join(tmp, "bad.json")}
    with open(bad["json"], "w") as fh:
        fh.write("{not json")
    check(derive.load_record(dict(bad))["status"].startswith("failed: bad record"), "corrupt record")
    with open(bad["json"], "w") as fh:
        json.dump(RECORDS["hmlstm_weak_g1"], fh)
    check("for 1 GPU(s)" in derive.load_record(dict(bad))["status"], "a record for another GPU count is refused")


FAKE = r'''#!%s
# A fake %s: writes the record study.py expects, with its argv and environment for the test.
import json, os, sys
a = sys.argv[1:]
opt = lambda k, d=None: a[a.index(k) + 1] if k in a else d
n = int(opt("--gpus", "1"))
env = {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS",
                                      "WORLD_SIZE", "MASTER_PORT")}
summ = lambda m: {"median": m, "p10": m, "p90": m, "min": m, "max": m, "n": 3}
dp = {"compute_only_ms": summ(9.0), "allreduce_alone_ms": summ(2.0), "exposed_comm_ms": 0.5, "hidden_comm_share": 0.75}
rec = {"gpus": n, "comm_backend": "nccl", "device_name": "fake GPU", "argv": a, "env": env}
if "resnet" in sys.argv[0]:
    b = int(opt("--bench"))
    rec["results"] = [{"batch": b, "batch_per_gpu": b // n, "step_ms": summ(12.0 + n),
                       "captured": {"step_ms": summ(10.0 + 0.1 * (n - 1))}, "data_parallel": dp if n > 1 else None}]
    path = os.path.join(opt("--out"), opt("--name") + "_bench.json")
elif "--train-steps" in a:
    if os.environ.get("FAKE_HANG"):  # a run that never ends, for stopping the study
        open(os.environ["FAKE_HANG"], "w").write(str(os.getpid()))
        import time; time.sleep(120)
    rec["training"] = {"step": [0, 150, 300], "train_bpc": [4, 3, 2], "valid_bpc": [4.0, 3.0, 2.0 if n == 1 else 1.9],
                       "ms_per_step": 10.0, "train_seconds": 3.0, "lr": float(opt("--lr", "0.002"))}
    path = os.path.join(opt("--out"), opt("--name") + ".json")
else:
    if n == 2 and opt("--batch") == "64":
        sys.stderr.write("fake hmlstm_dp: boom\n")
        sys.exit(3)
    rec.update(batch=int(opt("--batch")), seq=100, bench={"eager_ms": summ(30.0), "captured_ms": summ(20.0 + n),
                                                          "data_parallel": dp if n > 1 else None})
    path = os.path.join(opt("--out"), opt("--name") + ".json")
os.makedirs(opt("--out"), exist_ok=True)
json.dump(rec, open(path, "w"))
'''


def test_end_to_end(tmp):
    build = os.path.join(tmp, "build")
    for rel in ("experiments/resnet/resnet_train", "experiments/hmlstm/hmlstm_dp"):
        path = os.path.join(build, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(FAKE % (sys.executable, os.path.basename(rel)))
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    out = os.path.join(tmp, "out")
    env = dict(os.environ, WORLD_SIZE="7", MASTER_PORT="1")  # must not reach the children
    base = [sys.executable, os.path.join(HERE, "study.py"), "--build", build, "--out", out, "--skip-torch",
            "--gpus-list", "1,2", "--reps", "3", "--warmup", "1", "--run-timeout", "60"]
    p = subprocess.run(base, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    check(p.returncode == 1, "a failed run gives exit status 1 (got %d):\n%s" % (p.returncode, p.stdout[-3000:]))
    with open(os.path.join(out, "scaling.json")) as fh:
        study = json.load(fh)
    runs = {r["name"]: r for r in study["runs"]}
    check(set(runs) == {"resnet_weak_g1", "resnet_weak_g2", "resnet_strong_g2", "hmlstm_weak_g1", "hmlstm_weak_g2",
                        "hmlstm_strong_g2", "train_g1", "train_g2"}, "runs with --skip-torch: %s" % sorted(runs))
    bad = runs["hmlstm_strong_g2"]
    check(bad["status"] == "failed: exit status 3" and "boom" in bad.get("stderr_tail", ""), "failed run: %s" % bad)
    check(all(r["status"] == "ok" for n, r in runs.items() if n != "hmlstm_strong_g2"), "the other runs are ok")
    with open(os.path.join(out, "runs", "resnet_weak_g2_bench.json")) as fh:
        rec = json.load(fh)
    check(" ".join(rec["argv"]) == "--bench 512 --gpus 2 --device cuda --capture --bench-reps 3 --bench-warmup 1 "
          "--out %s --name resnet_weak_g2" % os.path.join(out, "runs"), "resnet command: %s" % rec["argv"])
    check(rec["env"] == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
                         "WORLD_SIZE": None, "MASTER_PORT": None}, "child environment: %s" % rec["env"])
    with open(os.path.join(out, "runs", "hmlstm_weak_g2.json")) as fh:
        argv = " ".join(json.load(fh)["argv"])
    check(argv.startswith("--bench --gpus 2 --device cuda --batch 128 --hidden 512 --seq 100 --reps 3 --warmup 1"),
          "hmlstm command: %s" % argv)
    with open(os.path.join(out, "runs", "train_g2.json")) as fh:
        argv = json.load(fh)["argv"]
    check(argv[:6] == ["--train-steps", "300", "--gpus", "2", "--batch", "128"] and argv[argv.index("--lr") + 1]
          == "0.002", "training command: %s" % argv)
    d = study["derived"]
    w2 = [r for r in d["models"]["resnet"]["weak"] if r["gpus"] == 2][0]
    check(close(w2["dualcast_eff"], 10.0 / 10.1) and w2["torch_ms"] is None, "end to end: resnet weak eff at 2")
    check(d["training"]["reached_step"] == 300 and d["training"]["faster"] is False, "end to end: training")
    with open(os.path.join(out, "scaling.md")) as fh:
        md = fh.read()
    check("hmlstm_strong_g2: failed: exit status 3" in md and "fake GPU" in md, "end to end: markdown")
    check(study["comm_backend"] == "nccl" and study["device_name"] == "fake GPU", "end to end: header fields")

    p = subprocess.run(base + ["--time-budget", "1e-9", "--out", os.path.join(tmp, "out2")], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    with open(os.path.join(tmp, "out2", "scaling.json")) as fh:
        runs = json.load(fh)["runs"]
    check(p.returncode == 0 and all(r["status"].startswith("skipped: time budget") for r in runs),
          "--time-budget: later runs skipped (exit %d)" % p.returncode)
    # --from-records derives the same study from the records left in OUT/runs, running nothing.
    p = subprocess.run(base + ["--from-records"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True)
    with open(os.path.join(out, "scaling.json")) as fh:
        again = json.load(fh)
    runs = {r["name"]: r for r in again["runs"]}
    w2 = [r for r in again["derived"]["models"]["resnet"]["weak"] if r["gpus"] == 2][0]
    check(p.returncode == 1 and runs["hmlstm_strong_g2"]["status"].startswith("not run: no record in OUT/runs")
          and runs["train_g2"]["status"] == "ok" and close(w2["dualcast_eff"], 10.0 / 10.1),
          "--from-records: %s" % p.stdout[-2000:])

    # A study stopped by SIGTERM stops the run in progress and still writes up what ran.
    hang = os.path.join(tmp, "hang.pid")
    p = subprocess.Popen(base + ["--out", os.path.join(tmp, "out3")], env=dict(env, FAKE_HANG=hang),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    for _ in range(300):
        if os.path.exists(hang) and open(hang).read():
            break
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    text = p.communicate(timeout=60)[0]
    with open(os.path.join(tmp, "out3", "scaling.json")) as fh:
        runs = {r["name"]: r for r in json.load(fh)["runs"]}
    check(p.returncode == 1 and runs["resnet_weak_g2"]["status"] == "ok"
          and runs["train_g1"]["status"] == "not run: the study was stopped", "stopped study:\n%s" % text[-2000:])
    alive = True
    for _ in range(50):
        try:
            os.kill(int(open(hang).read()), 0)
        except ProcessLookupError:
            alive = False
            break
        time.sleep(0.1)
    check(not alive, "the run in progress is stopped with the study")

    p = subprocess.run([sys.executable, os.path.join(HERE, "study.py"), "--gpus-list", "2,4"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True)
    check(p.returncode == 2, "--gpus-list must start at 1")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        test_derivation(tmp)
        test_end_to_end(tmp)
    print("test_study: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
