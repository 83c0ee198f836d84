#!/usr/bin/env python3
"""PyTorch peer of dualcast's ResNet-18 benchmark: validation first, then timing.

    python3 experiments/resnet/peer_torch.py --export DIR --out results/resnet/torch_bench.json \
        [--batches 128,256] [--methods eager,compile] [--reps 30] [--warmup 10] [--profile METHOD:BATCH]
        [--precision fp32|tf32|bf16|fp16]

1. Validation (--export DIR, written by `resnet_train --export DIR`): the same ResNet-18 (CIFAR form,
   one input channel, PyTorch names) is loaded with dualcast's initial weights and running statistics
   and run on dualcast's batch in training mode; the loss, every parameter's gradient, the running
   statistics after the forward pass and the parameters after one SGD step (same lr, momentum, weight
   decay) are compared with dualcast's. Errors are relative, per tensor: ||torch - dualcast|| /
   ||dualcast||. Tolerances: loss 1e-4, gradients 2e-3, statistics and parameters 1e-4 (float32
   through 20 batch norms; a wrong gradient is off by O(1)). A tensor outside them still passes when
   PyTorch's float64 run of the same step shows dualcast's float32 error no larger than 4x the
   largest float32 error PyTorch makes on a tensor of the same kind (ReLU inputs within rounding of
   zero switch differently in each float32 run; `validate` says why).
2. Timing: one training step (zero_grad, forward, cross-entropy, backward, SGD with momentum 0.9 and
   weight decay 5e-4, foreach) at each batch size, for each method: `eager` (cuDNN, cudnn.benchmark
   on: algorithms found per shape as dualcast does) and `compile` (torch.compile of the model, default
   mode; AOTAutograd compiles the backward), at --precision (what resnet_train --precision means):
   fp32 (default): TF32 off (torch.backends.cuda.matmul.allow_tf32 = False, cudnn.allow_tf32 = False,
   matmul precision "highest"); tf32: both on, matmul precision "high"; bf16, fp16: TF32 off, the
   forward and loss under torch.autocast("cuda", dtype=torch.bfloat16 / torch.float16), model and
   batch in channels_last (cuDNN's 16-bit tensor-core convolutions are NHWC kernels: in NCHW each
   convolution adds layout transposes), and for fp16 torch.amp.GradScaler (loss scaling; bf16 needs
   none). The validation (step 1) is always the fp32 step. Each repetition starts from an idle
   GPU and is timed by CUDA events; `pipelined_ms` is reps back to back over one pair of events.
   --profile METHOD:BATCH brackets one extra step with cudaProfilerStart/Stop for
   `ncu --profile-from-start off` (breakdown.py sorts the kernels).
Writes one JSON record; a method that cannot run (no GPU, no torch) is recorded as skipped.
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "common"))
import torch_timing  # noqa: E402


def build_model(width, in_channels=1, classes=10):
    import torch.nn as nn
    import torch.nn.functional as F

    class BasicBlock(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.shortcut = nn.Sequential()
            if stride != 1 or cin != cout:
                self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            out = F.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return F.relu(out + self.shortcut(x))

    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            w = width
            self.conv1 = nn.Conv2d(in_channels, w, 3, 1, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(w)
            layers, cin = [], w
            for stage in range(4):
                cout = w << stage
                blocks = [BasicBlock(cin, cout, 2 if stage > 0 else 1), BasicBlock(cout, cout, 1)]
                layers.append(nn.Sequential(*blocks))
                cin = cout
            self.layer1, self.layer2, self.layer3, self.layer4 = layers
            self.fc = nn.Linear(cin, classes)

        def forward(self, x):
            out = F.relu(self.bn1(self.conv1(x)))
            out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
            out = F.adaptive_avg_pool2d(out, 1).flatten(1)
            return self.fc(out)

    return ResNet18()


PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


def set_precision(torch, benchmark, precision="fp32"):
    """The process-wide settings of `precision` (autocast and channels_last are per step: time_method);
    returns them in words."""
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.backends.cudnn.benchmark = benchmark
    words = "tf32 %s; cudnn.benchmark %s" % ("on" if tf32 else "off", "on" if benchmark else "off")
    if precision in ("bf16", "fp16"):
        words += "; torch.autocast %s, channels_last%s" % (
            "bfloat16" if precision == "bf16" else "float16", ", GradScaler" if precision == "fp16" else "")
    return words


def rel_err(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


# Tolerances of the direct comparison, per tensor (float32 through 20 batch norms; a wrong gradient
# is off by O(1)), and the slack of the float64 judgement below.
TOL = {"loss": 1e-4, "grads": 2e-3, "running_stats": 1e-4, "params_after_step": 1e-4}
FLOAT64_SLACK = 4.0


def training_step(torch, man, load, device, dtype):
    """One training step of the exported model and batch in `dtype`: the loss, every parameter's
    gradient, the running statistics after the forward pass and the parameters after one SGD step,
    as float64 numpy arrays by name."""
    import torch.nn.functional as F

    model = build_model(man["width"]).to(device=device, dtype=dtype)
    state = model.state_dict()
    for sub, p in [("params", p) for p in man["params"]] + [("buffers", b) for b in man["buffers"]]:
        arr = load(sub, p["name"])
        if tuple(state[p["name"]].shape) != arr.shape:
            raise SystemExit("peer_torch: %s has shape %s in PyTorch but %s in the export"
                             % (p["name"], tuple(state[p["name"]].shape), arr.shape))
        state[p["name"]].copy_(torch.from_numpy(arr))
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum, m.eps = man["bn_momentum"], man["bn_eps"]
    x = torch.from_numpy(load(".", "x")).to(device=device, dtype=dtype)
    y = torch.from_numpy(load(".", "y")).to(device).long()
    opt = torch.optim.SGD(model.parameters(), lr=man["lr"], momentum=man["momentum"],
                          weight_decay=man["weight_decay"])
    model.train()
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y, label_smoothing=man["label_smoothing"])
    loss.backward()
    named, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    as_np = lambda t: t.detach().cpu().double().numpy()
    out = {"loss": float(loss.item()),
           "grads": {p["name"]: as_np(named[p["name"]].grad) for p in man["params"]},
           "running_stats": {b["name"]: as_np(buffers[b["name"]]) for b in man["buffers"]}}
    opt.step()
    out["params_after_step"] = {p["name"]: as_np(named[p["name"]]) for p in man["params"]}
    return out


def judge(t32, t64, dc):
    """The verdict of `validate` from PyTorch's float32 and float64 steps and dualcast's export, each
    {"loss": x, "grads" | "running_stats" | "params_after_step": {name: array}}."""
    rec = {"loss_torch": t32["loss"], "loss_dualcast": dc["loss"], "loss_torch_float64": t64["loss"],
           "loss_rel_err": abs(t32["loss"] - dc["loss"]) / abs(dc["loss"]),
           "tolerances": TOL, "float64_slack": FLOAT64_SLACK}
    ok = rec["loss_rel_err"] <= TOL["loss"]
    for key in ("grads", "running_stats", "params_after_step"):
        rows = []
        for name, ref in t64[key].items():
            direct = rel_err(t32[key][name], dc[key][name])
            e_dc, e_pt = rel_err(dc[key][name], ref), rel_err(t32[key][name], ref)
            rows.append([name, direct, e_dc, e_pt])
        torch_worst = max(r[3] for r in rows)
        for r in rows:
            r.append(r[1] <= TOL[key] or r[2] <= max(TOL[key], FLOAT64_SLACK * torch_worst))
        worst = max(rows, key=lambda r: r[1])
        rec[key] = {"max_rel_err": worst[1], "at": worst[0], "n": len(rows),
                    "at_vs_float64": {"dualcast": worst[2], "torch": worst[3]},
                    "max_rel_err_vs_float64": {"dualcast": max(r[2] for r in rows), "torch": torch_worst},
                    "failed": [r[0] for r in rows if not r[4]]}
        ok = ok and not rec[key]["failed"]
    rec["ok"] = bool(ok)
    return rec


def validate(torch, export_dir, device):
    """dualcast's exported step against PyTorch's. Two judgements per tensor:
    - direct: ||torch32 - dualcast|| / ||dualcast|| within TOL (what a user compares first);
    - against float64: the same step run by PyTorch in float64 is the truth, and dualcast's float32
      error against it may be at most FLOAT64_SLACK times the largest float32 error PyTorch itself
      makes on any tensor of the same kind (or within TOL).
    A tensor passes when either holds. Why the second compares with PyTorch's largest error and not
    with its error on the same tensor: in float32 a ReLU whose input lies within rounding of zero
    switches the other way than in float64, and a ResNet-18 step at batch 32 has millions of ReLU
    inputs, so a few such switches happen in every float32 run. Each moves the gradient of one
    element by O(1) and, through the layers before it, the gradients of whole tensors by up to about
    1e-3; which elements switch depends on each implementation's rounding, so two correct float32
    implementations differ on different tensors (seen: PyTorch float32 1.1e-3 off float64 on one
    tensor, dualcast 3.2e-3 on another; on the CPU, dualcast's float32 step against its own float64
    step differs at one sample, one position and one channel of one block's ReLU). The exact check
    is float64 against float64, where no input lies that close to zero."""
    with open(os.path.join(export_dir, "manifest.json")) as fh:
        man = json.load(fh)
    load = lambda sub, name: np.load(os.path.join(export_dir, sub, name + ".npy"))
    t32 = training_step(torch, man, load, device, torch.float32)
    t64 = training_step(torch, man, load, device, torch.float64)
    # null: a non-finite loss (the C++ writer writes strict JSON), which fails the comparison
    dc = {"loss": float("nan") if man["loss"] is None else float(man["loss"]),
          "grads": {p["name"]: load("grads", p["name"]) for p in man["params"]},
          "running_stats": {b["name"]: load("buffers_after", b["name"]) for b in man["buffers"]},
          "params_after_step": {p["name"]: load("params_after", p["name"]) for p in man["params"]}}
    rec = judge(t32, t64, dc)
    rec["batch"], rec["width"] = man["batch"], man["width"]
    rec["dualcast_device"], rec["dualcast_conv_backend"] = man.get("device_name"), man.get("conv_backend")
    return rec


def percentile(v, q):
    return float(np.percentile(np.asarray(v), q))


def time_method(torch, method, batch, width, reps, warmup, profile, precision="fp32"):
    import contextlib

    import torch.nn.functional as F

    torch.manual_seed(0)
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    model = build_model(width).cuda()
    x = torch.randn(batch, 1, 28, 28, device="cuda")
    if half is not None:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4, foreach=True)
    y = torch.randint(0, 10, (batch,), device="cuda")
    fwd = torch.compile(model) if method == "compile" else model
    model.train()
    autocast = (lambda: torch.autocast("cuda", dtype=half)) if half is not None else contextlib.nullcontext
    scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = F.cross_entropy(fwd(x), y)  # autocast runs cross_entropy in float32
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return loss

    t0 = time.perf_counter()
    for _ in range(max(warmup, 3 if method == "compile" else 1)):
        step()
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    ms, pipelined, loss = torch_timing.time_cuda(torch, step, reps)
    if profile:
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        step()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    med = percentile(ms, 50)
    rec = {"method": method, "batch": batch, "status": "ok",
           "step_ms": {"median": med, "p10": percentile(ms, 10), "p90": percentile(ms, 90),
                       "min": min(ms), "max": max(ms), "n": len(ms)},
           "pipelined_ms": pipelined, "images_per_s": batch / (med * 1e-3),
           "images_per_s_pipelined": batch / (pipelined * 1e-3), "warmup": warmup, "reps": reps,
           "warmup_seconds": warm_s, "loss_after": float(loss.item()), "profiled_step": bool(profile),
           "precision": precision,
           "peak_memory_bytes": int(torch.cuda.max_memory_allocated())}
    del fwd, model, opt
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--export", help="directory written by resnet_train --export (validation)")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--batches", default="128,256")
    ap.add_argument("--methods", default="eager,compile")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--no-cudnn-benchmark", action="store_true", help="heuristic cuDNN algorithms")
    ap.add_argument("--profile", default="", help="METHOD:BATCH: bracket one step for ncu")
    ap.add_argument("--time-budget", type=float, default=0, help="seconds; later measurements are skipped")
    ap.add_argument("--precision", default="fp32", choices=PRECISIONS,
                    help="of the timed steps (as resnet_train --precision); validation is always fp32")
    args = ap.parse_args()
    t_start = time.perf_counter()
    rec = {"framework": "pytorch", "what": "one ResNet-18 training step (forward, cross-entropy, backward, "
           "SGD momentum 0.9, weight decay 5e-4), " + args.precision, "input": "[B, 1, 28, 28]",
           "width": args.width, "precision": args.precision, "results": []}
    try:
        import torch
    except ImportError:
        rec["status"] = "skipped: torch not installed"
        json.dump(rec, open(args.out, "w"), indent=1)
        print("peer_torch: torch not installed; nothing measured")
        return 0
    rec["torch_version"] = torch.__version__
    if not torch.cuda.is_available():
        rec["status"] = "skipped: no CUDA device"
        json.dump(rec, open(args.out, "w"), indent=1)
        print("peer_torch: no CUDA device; nothing measured")
        return 0
    # Earlier records held these words under "precision" (always fp32 then); now it is the name.
    rec["precision_settings"] = set_precision(torch, not args.no_cudnn_benchmark)
    rec["cudnn_version"] = torch.backends.cudnn.version()
    rec["device_name"] = torch.cuda.get_device_name(0)
    rc = 0
    if args.export:
        v = validate(torch, args.export, "cuda")
        rec["validation"] = v
        g = v["grads"]
        print("peer_torch: validation %s: loss %.8g (dualcast %.8g, rel %.2e); gradients max rel %.2e (%s: "
              "against float64 dualcast %.2e, torch %.2e); running stats %.2e; params after SGD %.2e; "
              "failed: %s"
              % ("PASSED" if v["ok"] else "FAILED", v["loss_torch"], v["loss_dualcast"], v["loss_rel_err"],
                 g["max_rel_err"], g["at"], g["at_vs_float64"]["dualcast"], g["at_vs_float64"]["torch"],
                 v["running_stats"]["max_rel_err"], v["params_after_step"]["max_rel_err"],
                 ", ".join(g["failed"] + v["running_stats"]["failed"] + v["params_after_step"]["failed"])
                 or "none"), flush=True)
        if not v["ok"]:
            rc = 1
    rec["precision_settings"] = set_precision(torch, not args.no_cudnn_benchmark, args.precision)
    profile = args.profile.split(":") if args.profile else None
    for method in [m for m in args.methods.split(",") if m]:
        for b in [int(s) for s in args.batches.split(",") if s]:
            if args.time_budget and time.perf_counter() - t_start > args.time_budget:
                rec["results"].append({"method": method, "batch": b, "status": "skipped: time budget"})
                continue
            try:
                r = time_method(torch, method, b, args.width, args.reps, args.warmup,
                                bool(profile and profile[0] == method and int(profile[1]) == b), args.precision)
            except Exception as exc:  # a failing method is recorded, the others still run
                r = {"method": method, "batch": b, "status": "failed: %s" % exc}
                rc = 1
            rec["results"].append(r)
            if r.get("status") == "ok":
                print("peer_torch: %-8s batch %4d: %8.3f ms (p10 %.3f, p90 %.3f), %8.0f images/s, warm-up %.1f s"
                      % (method, b, r["step_ms"]["median"], r["step_ms"]["p10"], r["step_ms"]["p90"],
                         r["images_per_s"], r["warmup_seconds"]), flush=True)
            else:
                print("peer_torch: %s batch %d: %s" % (method, b, r["status"]), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(rec, fh, indent=1)
    print("peer_torch: wrote %s" % args.out)
    return rc


if __name__ == "__main__":
    sys.exit(main())
