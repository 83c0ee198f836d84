#!/usr/bin/env python3
"""PyTorch DistributedDataParallel peer of dualcast's data-parallel step (study.py runs it).

    torchrun --standalone --nproc_per_node N experiments/scaling/peer_torch_ddp.py \
        --model resnet|hmlstm --batch-per-gpu B [--reps 30] [--warmup 10] [--out FILE.json]
        [--precision fp32|tf32|bf16]
    python3 experiments/scaling/peer_torch_ddp.py ...      (one process, no DDP: WORLD_SIZE unset)

Models (the same step as the single-GPU peers, wrapped in DDP when WORLD_SIZE > 1):
  resnet  ResNet-18, CIFAR form, one input channel, 28x28, 10 classes, width 64
          (experiments/resnet/peer_torch.py: build_model); zero_grad(set_to_none), forward in train
          mode, cross-entropy, backward, SGD lr 0.01 momentum 0.9 weight decay 5e-4 (foreach).
  hmlstm  the 3-layer HM-LSTM character model of experiments/peers/MODEL.md (H 512, vocab 64,
          T 100), written by experiments/peers/hmlstm.py: hm_loss with peer_torch.TorchOps (eager);
          Adam lr 2e-3, clip_grad_norm_ 1.0, as hmlstm_dp --bench.
DDP: device_ids=[local_rank], bucket_cap_mb 25, gradient_as_bucket_view=True.
Precision: fp32 = TF32 off (matmul and cuDNN), matmul precision "highest"; cudnn.benchmark on.

Timing (as experiments/resnet/peer_torch.py): warm-up, dist.barrier, then per repetition
torch.cuda.synchronize() and CUDA events around one step (median/p10/p90/min/max/n), then
pipelined_ms (reps back to back / reps). With N > 1 also: the step under ddp.no_sync() (no gradient
all-reduce: compute only, so exposed = step - compute only), and an all-reduce of one flat float32
tensor as large as all gradients, alone (allreduce_alone_ms, bus bandwidth 2(n-1)/n * bytes / time).
Rank 0 writes the JSON. Without torch or CUDA the record says "status": "skipped: ..." (exit 0).
"""

import os

# The GPU machines require NVLink multicast off; NCCL reads these when the communicator starts.
for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_k, _v)

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
EXPERIMENTS = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(EXPERIMENTS, "common"))
import torch_timing  # noqa: E402
MODELS = ("resnet", "hmlstm")
PRECISIONS = ("fp32", "tf32", "bf16")


def load_module(name, path):
    """Both peer folders hold a peer_torch.py; loading each under its own name keeps them apart."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_record(path, rec):
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(rec, fh, indent=1)


def time_fn(torch, fn, reps, warmup):
    """(summary of the per-repetition ms from an idle GPU, pipelined ms): common/torch_timing.py."""
    ms, pipelined, _ = torch_timing.time_cuda(torch, fn, reps, warmup)
    return torch_timing.summary(ms), pipelined


def hmlstm_module(torch, peers, H, V, a, seed):
    """MODEL.md's parameters (initialised as it says) in an nn.Module, so DDP can wrap the loss."""
    import torch.nn as nn

    hm, ops = peers
    g = torch.Generator().manual_seed(seed)
    bound = 1.0 / math.sqrt(H)

    class HmLstm(nn.Module):
        def __init__(self):
            super().__init__()
            self.P = nn.ParameterDict()
            for name, shape in hm.param_shapes(H, V).items():
                if name == "E":
                    t = torch.randn(shape, generator=g)
                elif name.startswith("b"):
                    t = torch.zeros(shape)
                else:
                    t = (torch.rand(shape, generator=g) * 2 - 1) * bound
                self.P[name] = nn.Parameter(t)

        def forward(self, tokens):
            return hm.hm_loss(ops, {k: self.P[k] for k in hm.PARAM_NAMES}, tokens, a)

    return HmLstm()


def build_step(torch, args, rank, local_rank, world):
    """(step, no_sync_step or None, parameters, items per step) for --model."""
    import contextlib

    import torch.nn.functional as F

    dev = torch.device("cuda", local_rank)
    half = torch.bfloat16 if args.precision == "bf16" else None
    autocast = (lambda: torch.autocast("cuda", dtype=half)) if half is not None else contextlib.nullcontext
    torch.manual_seed(0)
    if args.model == "resnet":
        model = RESNET_PEER.build_model(args.width, in_channels=1, classes=10).to(dev)
        x = torch.randn(args.batch_per_gpu, 1, 28, 28, device=dev)
        y = torch.randint(0, 10, (args.batch_per_gpu,), device=dev)
        if half is not None:  # cuDNN's 16-bit tensor-core convolutions are NHWC kernels
            model = model.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4, foreach=True)
        inputs, clip = (x,), None

        def loss_of(fwd):
            return F.cross_entropy(fwd(*inputs), y)
        items = args.batch_per_gpu * world
    else:
        sys.path.insert(0, os.path.join(EXPERIMENTS, "peers"))
        import hmlstm as hm
        ops = load_module("peers_peer_torch", os.path.join(EXPERIMENTS, "peers", "peer_torch.py")).TorchOps
        model = hmlstm_module(torch, (hm, ops), args.hidden, 64, 1.0, seed=1).to(dev)
        gen = torch.Generator().manual_seed(11 + rank)  # each rank its own sequences, as hmlstm_dp
        tokens = torch.randint(0, 64, (args.seq + 1, args.batch_per_gpu), generator=gen).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=2e-3, foreach=True)
        inputs, clip = (tokens,), 1.0

        def loss_of(fwd):
            return fwd(*inputs)
        items = args.batch_per_gpu * world * args.seq
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    fwd = model
    if world > 1:
        fwd = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank],
                                                        bucket_cap_mb=args.bucket_cap_mb,
                                                        gradient_as_bucket_view=True)

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = loss_of(fwd)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()

    def no_sync_step():
        with fwd.no_sync():
            step()
    return step, (no_sync_step if world > 1 else None), params, items


def run(torch, args, rec):
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    if world > 1:
        dist.init_process_group("nccl")
    RESNET_PEER.set_precision(torch, True, args.precision)
    rec.update({"world_size": world, "global_batch": args.batch_per_gpu * world,
                "device_name": torch.cuda.get_device_name(local_rank),
                "cudnn_version": torch.backends.cudnn.version(),
                "ddp": world > 1})
    try:  # the legacy flags set_precision wrote; a torch without them says so in the record
        rec["tf32"] = bool(torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32)
    except Exception as exc:
        rec["tf32"] = "unknown: %s" % exc
    try:
        v = torch.cuda.nccl.version()
        rec["nccl_version"] = ".".join(str(p) for p in v) if isinstance(v, tuple) else str(v)
    except Exception as exc:  # a build without NCCL still times the one-GPU step
        rec["nccl_version"] = "unavailable: %s" % exc
    if world > 1:
        # broadcast_buffers stays DDP's default (on): ResNet's BatchNorm statistics go from rank 0
        # to the others at every forward, part of what a DDP user's step costs.
        rec.update({"bucket_cap_mb": args.bucket_cap_mb, "gradient_as_bucket_view": True,
                    "broadcast_buffers": True})

    def barrier():
        if world > 1:
            dist.barrier(device_ids=[local_rank])
        torch.cuda.synchronize()

    step, no_sync_step, params, items = build_step(torch, args, rank, local_rank, world)
    t0 = time.perf_counter()
    for _ in range(max(args.warmup, 1)):  # cudnn.benchmark's search happens here
        step()
    torch.cuda.synchronize()
    rec["warmup_seconds"] = time.perf_counter() - t0
    barrier()  # every rank starts its timed steps together: none waits for a straggler's warm-up
    s, pipelined = time_fn(torch, step, args.reps, 0)
    med = s["median"]
    unit = "images_per_s" if args.model == "resnet" else "tokens_per_s"
    rec.update({"step_ms": s, "pipelined_ms": pipelined, unit: items / (med * 1e-3),
                unit + "_pipelined": items / (pipelined * 1e-3)})
    if world > 1:
        meds = [None] * world
        dist.all_gather_object(meds, med)
        rec["step_ms_median_per_rank"] = meds
        barrier()
        local, _ = time_fn(torch, no_sync_step, args.reps, args.warmup)
        rec["compute_only_ms"] = local
        nbytes = sum(p.numel() * p.element_size() for p in params)
        flat = torch.zeros(sum(p.numel() for p in params), dtype=torch.float32, device="cuda")
        barrier()
        alone, _ = time_fn(torch, lambda: dist.all_reduce(flat), args.reps, args.warmup)
        ar = alone["median"]
        exposed = med - local["median"]
        rec.update({"allreduce_alone_ms": alone, "gradient_bytes": nbytes,
                    "allreduce_bus_gb_per_s": 2.0 * (world - 1) / world * nbytes / (ar * 1e6),
                    "exposed_comm_ms": exposed,
                    "hidden_comm_share": min(1.0, max(0.0, 1.0 - exposed / ar)) if ar > 0 else 1.0})
    rec["peak_memory_bytes"] = int(torch.cuda.max_memory_allocated())
    rec["status"] = "ok"
    if rank == 0:
        line = "peer_torch_ddp: %s, %d GPU(s), %d per GPU: %.3f ms (p10 %.3f, p90 %.3f), %.0f %s" % (
            args.model, world, args.batch_per_gpu, med, s["p10"], s["p90"], rec[unit], unit.replace("_", " "))
        if world > 1:
            line += ("; compute only %.3f ms, all-reduce alone %.3f ms (%.0f GB/s bus), exposed %.3f ms, "
                     "%.0f%% hidden") % (
                rec["compute_only_ms"]["median"], ar, rec["allreduce_bus_gb_per_s"], rec["exposed_comm_ms"],
                100 * rec["hidden_comm_share"])
        print(line, flush=True)
    if world > 1:
        dist.barrier(device_ids=[local_rank])
        dist.destroy_process_group()
    return rank


RESNET_PEER = None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=MODELS, required=True)
    ap.add_argument("--batch-per-gpu", type=int, required=True, help="images (resnet) or sequences (hmlstm) per GPU")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--out", default="", help="JSON file rank 0 writes")
    ap.add_argument("--precision", choices=PRECISIONS, default="fp32")
    ap.add_argument("--width", type=int, default=64, help="resnet width")
    ap.add_argument("--hidden", type=int, default=512, help="hmlstm hidden size")
    ap.add_argument("--seq", type=int, default=100, help="hmlstm sequence length T")
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP's bucket size (its default 25)")
    args = ap.parse_args()
    if args.batch_per_gpu < 1 or args.reps < 1 or args.warmup < 0:
        ap.error("--batch-per-gpu and --reps must be >= 1, --warmup >= 0")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    what = {"resnet": "ResNet-18 training step (SGD momentum 0.9, weight decay 5e-4), [B, 1, 28, 28], width %d"
                      % args.width,
            "hmlstm": "HM-LSTM character model training step (Adam 2e-3, clip 1.0), H %d, T %d, vocab 64"
                      % (args.hidden, args.seq)}[args.model]
    rec = {"framework": "pytorch-ddp", "model": args.model, "what": what, "precision": args.precision,
           "world_size": world, "batch_per_gpu": args.batch_per_gpu, "global_batch": args.batch_per_gpu * world,
           "reps": args.reps, "warmup": args.warmup, "eager": True,
           "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if args.model == "hmlstm":
        rec.update({"hidden": args.hidden, "seq": args.seq, "vocab": 64})
    try:
        import torch
    except ImportError:
        rec["status"] = "skipped: torch not installed"
        write_record(args.out if rank == 0 else "", rec)
        print("peer_torch_ddp: torch not installed; nothing measured")
        return 0
    rec["torch_version"] = torch.__version__
    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        rec["status"] = "skipped: no CUDA device"
        write_record(args.out if rank == 0 else "", rec)
        print("peer_torch_ddp: no CUDA device; nothing measured")
        return 0
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if local_rank >= torch.cuda.device_count():
        rec["status"] = "failed: rank needs cuda:%d, this machine has %d GPU(s)" % (
            local_rank, torch.cuda.device_count())
        write_record(args.out if rank == 0 else "", rec)
        print("peer_torch_ddp: " + rec["status"], file=sys.stderr)
        return 1
    global RESNET_PEER
    RESNET_PEER = load_module("resnet_peer_torch", os.path.join(EXPERIMENTS, "resnet", "peer_torch.py"))
    try:
        rank = run(torch, args, rec)
    except Exception as exc:  # recorded for study.py; torchrun stops the other ranks on this exit status
        rec["status"] = "failed: %s: %s" % (type(exc).__name__, exc)
        write_record(args.out if rank == 0 else "", rec)
        raise
    if rank == 0:
        write_record(args.out, rec)
        if args.out:
            print("peer_torch_ddp: wrote %s" % args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
