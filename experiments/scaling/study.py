#!/usr/bin/env python3
"""The data-parallel scaling study in one call: dualcast (resnet_train, hmlstm_dp) and PyTorch DDP
(peer_torch_ddp.py) on 1, 2, 4 GPUs of one machine, weak and strong scaling, then the char-LM
trained on 1 and on the most GPUs; writes OUT/scaling.json and OUT/scaling.md (README.md says what
each number means).

    python3 experiments/scaling/study.py --build build/release --out results/scaling
        [--gpus-list 1,2,4] [--models resnet,hmlstm] [--reps 30] [--warmup 10] [--skip-torch]
        [--skip-train] [--time-budget SECONDS] [--run-timeout SECONDS]

Runs (N over --gpus-list): weak scaling at a fixed batch per GPU (ResNet-18 256 images, HM-LSTM 64
sequences), strong scaling at a fixed global batch (256, 64) for N > 1 (N = 1 is the weak run), each
by dualcast and by the PyTorch DDP peer; unless --skip-train, hmlstm_dp --train-steps 300 on 1 GPU
and on the largest N (batch 64 N, Adam lr 2e-3, the 1-GPU rate). Raw records go to OUT/runs, each run's
stdout and stderr to OUT/logs. A failed run is recorded with its stderr tail and the study goes on.
Exit status: 0 when every run it started succeeded, 1 otherwise (the files are written either way).
The reading of the records, the derived numbers and the markdown are in derive.py.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# The GPU machines require NVLink multicast off: NCCL, PyTorch's symmetric memory and NVSHMEM.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# A launcher's variables in our own environment would make a child believe it is one of its ranks.
LAUNCH_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
               "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")

sys.path.insert(0, HERE)
from derive import MODELS, SEQ, TRAIN_STEPS, derive, load_record, plan_runs, render_markdown  # noqa: E402


# ---- commands and processes ---------------------------------------------------------------------

def json_path(out, run):
    suffix = "_bench.json" if run["framework"] == "dualcast" and run["model"] == "resnet" else ".json"
    return os.path.join(out, "runs", run["name"] + suffix)


def command(run, out, build, reps, warmup, torch_launch):
    """The argv of one run; torch_launch(n) gives the launcher prefix of the PyTorch peer."""
    n, b, rdir = run["gpus"], run["global_batch"], os.path.join(out, "runs")
    if run["framework"] == "torch":
        return torch_launch(n) + [os.path.join(HERE, "peer_torch_ddp.py"), "--model", run["model"],
                                  "--batch-per-gpu", str(run["batch_per_gpu"]), "--reps", str(reps),
                                  "--warmup", str(warmup), "--out", json_path(out, run)]
    if run["model"] == "resnet":
        return [os.path.join(build, "experiments", "resnet", "resnet_train"), "--bench", str(b), "--gpus", str(n),
                "--device", "cuda", "--capture", "--bench-reps", str(reps), "--bench-warmup", str(warmup),
                "--out", rdir, "--name", run["name"]]
    exe = [os.path.join(build, "experiments", "hmlstm", "hmlstm_dp")]
    if run["scaling"] == "train":
        lr = [] if n == 1 else ["--lr", "%.6g" % run["lr"]]
        return exe + ["--train-steps", str(TRAIN_STEPS), "--gpus", str(n), "--batch", str(b)] + lr + [
            "--out", rdir, "--name", run["name"]]
    return exe + ["--bench", "--gpus", str(n), "--device", "cuda", "--batch", str(b), "--hidden", "512",
                  "--seq", str(SEQ), "--reps", str(reps), "--warmup", str(warmup), "--out", rdir, "--name", run["name"]]


def child_env():
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(NO_MULTICAST)
    return env


def stop_group(p):
    """SIGTERM to the child's process group, then SIGKILL if it is still there."""
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 30)):
        try:
            os.killpg(p.pid, sig)
            p.wait(timeout=grace)
            break
        except (ProcessLookupError, subprocess.TimeoutExpired):
            continue
    if p.poll() is None:
        p.kill()
        p.wait()


def execute(argv, log_stem, timeout):
    """(exit status or None on timeout, seconds, tail of stderr, else of stdout). The child gets its own
    process group, so a timeout stops torchrun's or scripts/launch's ranks too."""
    t0 = time.time()
    with open(log_stem + ".stdout", "w") as so, open(log_stem + ".stderr", "w") as se:
        try:
            p = subprocess.Popen(argv, stdout=so, stderr=se, env=child_env(), cwd=ROOT, start_new_session=True)
        except OSError as exc:
            return 127, 0.0, "cannot start %s: %s" % (argv[0], exc)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
            stop_group(p)
        except BaseException:
            # The study itself is stopped (SIGTERM, Ctrl-C): the child's own session would outlive it
            # and keep its GPUs busy, so it is stopped first.
            stop_group(p)
            raise
    tails = []
    for ext in (".stderr", ".stdout"):
        with open(log_stem + ext, errors="replace") as fh:
            tails.append(fh.read()[-2000:].strip())
    return rc, time.time() - t0, tails[0] or tails[1]


def gpu_count():
    try:
        r = subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=30,
                           universal_newlines=True)
        return sum(1 for line in r.stdout.splitlines() if line.startswith("GPU ")), r.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return 0, ""


def git_commit():
    try:
        r = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, universal_newlines=True, timeout=30)
        return r.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def torch_launcher(py):
    torchrun = shutil.which("torchrun")
    return lambda n: [py] if n == 1 else (([torchrun] if torchrun else [py, "-m", "torch.distributed.run"])
                                          + ["--standalone", "--nproc_per_node", str(n)])


def run_all(runs, args, out, build, launch, py, t_start):
    """Runs the study's runs in order; a run stopped with the study is marked so."""
    for i, run in enumerate(runs):
        run["json"] = json_path(out, run)
        argv = command(run, out, build, args.reps, args.warmup, launch)
        run["cmd"] = " ".join(argv)
        if args.time_budget and time.time() - t_start > args.time_budget:
            run["status"] = "skipped: time budget (%.0f s) spent" % args.time_budget
        elif run["batch_per_gpu"] is None:
            run["status"] = "skipped: batch %d does not split over %d GPUs" % (run["global_batch"], run["gpus"])
        elif run["framework"] == "torch" and py is None:
            run["status"] = "skipped: no Python with torch"
        elif run["framework"] == "dualcast" and not os.path.isfile(argv[0]):
            run["status"] = "failed: %s not built" % argv[0]
        else:
            if os.path.exists(run["json"]):
                os.remove(run["json"])  # a stale record must not pass for this run's
            rc, secs, tail = execute(argv, os.path.join(out, "logs", run["name"]), args.run_timeout)
            run["seconds"], run["returncode"] = round(secs, 1), rc
            if rc == 0:
                load_record(run)
            else:
                run["status"] = "failed: %s" % ("timed out after %.0f s" % args.run_timeout if rc is None
                                                 else "exit status %d" % rc)
                if os.path.exists(run["json"]):  # the peer's own account of why
                    own = load_record(dict(run, status="ok"))["status"]
                    if own != "ok":
                        run["status"] += "; " + own
            if run.get("status") != "ok":
                run["stderr_tail"] = tail
        run.setdefault("status", "ok")
        print("study: [%d/%d] %-24s %s%s" % (i + 1, len(runs), run["name"], run["status"],
                                             " (%.0f s)" % run["seconds"] if "seconds" in run else ""), flush=True)


def main():
    # SIGTERM (a timeout around the study) becomes SystemExit, so that execute() stops the run in
    # progress instead of leaving its ranks behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commit", default="", help="the commit the build holds (the device's copy of the tree has "
                    "no .git of its own, or a stale one: pass $(git rev-parse HEAD) from the checkout)")
    ap.add_argument("--build", default="build/release", help="build folder with experiments/resnet/resnet_train "
                    "and experiments/hmlstm/hmlstm_dp")
    ap.add_argument("--out", default="results/scaling")
    ap.add_argument("--gpus-list", default="", help="e.g. 1,2,4 (default: 1,2,4 up to the GPUs nvidia-smi -L lists)")
    ap.add_argument("--models", default="resnet,hmlstm")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--time-budget", type=float, default=0, help="seconds; runs not started by then are skipped")
    ap.add_argument("--run-timeout", type=float, default=900, help="seconds one run may take")
    ap.add_argument("--from-records", action="store_true",
                    help="run nothing: derive scaling.json and scaling.md from the records already in OUT/runs "
                         "(a study that was stopped); a run without a record counts as not run")
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if m]
    if not models or any(m not in MODELS for m in models):
        ap.error("--models: expected a list of %s" % ", ".join(MODELS))
    ngpu, smi = gpu_count()
    try:
        gpus_list = [int(s) for s in args.gpus_list.split(",") if s] or [n for n in (1, 2, 4) if n <= max(ngpu, 1)]
    except ValueError:
        ap.error("--gpus-list: expected numbers such as 1,2,4")
    if sorted(set(gpus_list)) != gpus_list or gpus_list[0] != 1:
        ap.error("--gpus-list: increasing, without repeats, starting at 1 (the baseline)")
    out = os.path.abspath(args.out)
    build = os.path.abspath(args.build)
    for sub in ("runs", "logs"):
        os.makedirs(os.path.join(out, sub), exist_ok=True)
    py = None
    if not args.skip_torch:
        sys.path.insert(0, os.path.join(ROOT, "experiments", "common"))
        from runner import python_with
        py = python_with("torch")
    launch = torch_launcher(py or sys.executable)
    runs = plan_runs(gpus_list, models, args.skip_torch, args.skip_train)
    t_start = time.time()
    print("study: %d runs on GPUs %s (%d listed by nvidia-smi)" % (len(runs), gpus_list, ngpu), flush=True)
    try:
        if args.from_records:
            for run in runs:
                run["json"] = json_path(out, run)
                if os.path.exists(run["json"]):
                    load_record(run)
                else:
                    run["status"] = "not run: no record in OUT/runs"
        else:
            run_all(runs, args, out, build, launch, py, t_start)
    except (KeyboardInterrupt, SystemExit):
        # Stopped from outside: what ran is still written up (the run in progress was stopped).
        for run in runs:
            run.setdefault("status", "not run: the study was stopped")
        print("study: stopped; writing what ran", flush=True)
    # Multi-GPU runs first: their records name the communicator that did the work.
    ok = sorted((r for r in runs if r["status"] == "ok"), key=lambda r: -r["gpus"])
    first = lambda key: next((r["parsed"][key] for r in ok if r["parsed"].get(key)), None)  # noqa: E731
    study = {"what": "data-parallel scaling, dualcast vs PyTorch DDP", "gpus_list": gpus_list, "models": models,
             "reps": args.reps, "warmup": args.warmup, "nvidia_smi": smi, "device_name": first("device_name"),
             "comm_backend": first("comm_backend"), "torch_version": first("torch_version"),
             "nccl_version": first("nccl_version"), "precision": "float32, TF32 off", "commit": args.commit or git_commit(),
             "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
             "seconds": round(time.time() - t_start, 1), "runs": runs,
             "derived": derive(runs, gpus_list, models)}
    with open(os.path.join(out, "scaling.json"), "w") as fh:
        json.dump(study, fh, indent=1)
    md = render_markdown(study)
    with open(os.path.join(out, "scaling.md"), "w") as fh:
        fh.write(md)
    print(md)
    print("study: wrote %s and %s" % (os.path.join(out, "scaling.json"), os.path.join(out, "scaling.md")))
    return 0 if all(r["status"] == "ok" or r["status"].startswith("skipped") for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
