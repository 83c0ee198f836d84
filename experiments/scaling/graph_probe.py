"""Does a captured CUDA graph replay slower in a rank once NCCL exists? Issue 32's probe without dualcast.

    torchrun --nproc-per-node 2 experiments/scaling/graph_probe.py [--small 3800] [--products 300]
    python3 experiments/scaling/graph_probe.py           # one process, no communicator: the control

The HM-LSTM's data-parallel rank replays the very same compute graph 1.24 ms (5.8%) slower once
NCCL has connected its channels (experiments/scaling/README.md). That graph has 3790 nodes, so the
loss is about 0.33 us a node. This probe asks whether PyTorch's own graphs slow the same way in a
torchrun rank, with two graphs of the step's kind: `small`, many tiny kernels (the per-node cost), and
`products`, the HM-LSTM's 64 x 1540 x 2049 float32 products (the per-FLOP cost). Each is timed by
CUDA events from an idle GPU (median of --reps replays), with the host time of the replay call
beside it, at each stage: before the process group exists, after init_process_group (the
communicator made eagerly, device_id given), after the first all-reduce (channels connected), and
after 20 more. Only rank 0 prints; every rank runs the same replays at the same time, as the
data-parallel ranks do. (The run of 2026-11-29 used 87df314's copy, whose own loop timed the same
way; it now uses the peers' common/torch_timing.py.)
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "common"))
import torch_timing  # noqa: E402


def capture(body):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            body()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    torch.cuda.synchronize()
    return g


def graphs(small, products):
    x = torch.zeros(1 << 14, device="cuda")
    a = torch.randn(64, 1540, device="cuda")
    b = torch.randn(1540, 2049, device="cuda")
    c = torch.empty(64, 2049, device="cuda")

    def tiny():
        for _ in range(small):
            x.add_(1.0)

    def mm():
        for _ in range(products):
            torch.mm(a, b, out=c)

    return {"small": capture(tiny), "products": capture(mm)}


def time_graph(g, reps):
    """(median GPU ms, median host us of the replay call), from an idle GPU each time."""
    host = []

    def replay():
        t0 = time.perf_counter()
        g.replay()
        host.append((time.perf_counter() - t0) * 1e6)

    warmup = 3
    ms, _, _ = torch_timing.time_cuda(torch, replay, reps, warmup)
    return statistics.median(ms), statistics.median(host[warmup:warmup + reps])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--small", type=int, default=3800, help="tiny kernels in the first graph")
    p.add_argument("--products", type=int, default=300, help="64x1540x2049 products in the second")
    p.add_argument("--reps", type=int, default=20)
    o = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    gs = graphs(o.small, o.products)
    env = " ".join("%s=%s" % (k, v) for k, v in sorted(os.environ.items()) if k.startswith("NCCL_"))
    if rank == 0:
        print("graph_probe: %d rank(s), torch %s, nccl %s, %s; %s" % (
            world, torch.__version__, ".".join(map(str, torch.cuda.nccl.version())),
            torch.cuda.get_device_name(), env or "no NCCL_ variables"))
        print("%-34s %24s %24s" % ("stage", "small: GPU ms / host us", "products: GPU ms / host us"))

    def report(stage):
        if dist.is_initialized():
            dist.barrier()
        t = {k: time_graph(g, o.reps) for k, g in gs.items()}
        if rank == 0:
            print("%-34s %14.3f / %7.1f %14.3f / %7.1f" % (stage, *t["small"], *t["products"]), flush=True)

    report("before the process group")
    if world > 1:
        dev = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group("nccl", device_id=dev)
        report("after init_process_group")
        y = torch.ones(1 << 20, device="cuda")
        dist.all_reduce(y)
        torch.cuda.synchronize()
        report("after the first all-reduce")
        for _ in range(20):
            dist.all_reduce(y)
        torch.cuda.synchronize()
        report("after 20 more")
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
