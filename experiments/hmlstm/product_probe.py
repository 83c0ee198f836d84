#!/usr/bin/env python3
"""product_probe.py: what the HM-LSTM step's matrix products cost by themselves, at each precision
(issues 30 and 31: is a bf16 step of <= 10 ms, or a float32 one of <= 12 ms, in the products' reach?).

The captured training step (H 512, B 64, T 100, 3 layers) runs per time step and layer one gate
product [B, K] x [K, 4H+1] forward and one input-adjoint product [B, 4H+1] x [K, 4H+1]^T backward
(K = 3H+4 for layers 1-2, 2H+4 for the top layer), and per layer one weight-gradient product
[T*B, K]^T x [T*B, 4H+1]. This script replays exactly that sequence of products, in order, on one
stream inside a CUDA graph (PyTorch's cuBLAS, the library dualcast calls), and prints the median
replay time per step at fp32 (TF32 off: "highest"), tf32 ("high"), bf16 and fp16 (16-bit operands
and results), and each single product's time (100 back-to-back launches in one graph). It needs no
build: PyTorch on a CUDA machine.

With --schedules it also times the forward's gate products (float32, "highest") in three orders,
for issue 31 item 3: "chain" (layer by layer, step by step, as the step runs them now); "wavefront"
(layer l+2 of step t-1 beside layer l of step t on a second stream: they share no input, so a step
is two stages deep instead of three); "split" (each product cut at the bottom-up input: the
recurrent and top-down part [h, z*h_above, 1] of all three layers on three streams once the step
before ends, then only the K = H bottom-up parts chained, accumulating into them).

Usage: python3 experiments/hmlstm/product_probe.py [--hidden 512 --batch 64 --seq 100] [--schedules]
                                                   [--json out]
Exit status: 0 done; 2 no CUDA device.
"""
import argparse
import json
import statistics
import sys

import torch


def shapes(H, B, T):
    g = 4 * H + 1
    ks = [3 * H + 4, 3 * H + 4, 2 * H + 4]
    return g, ks


def timed_graph(fn, reps=20):
    """Median ms of one replay of a CUDA graph that runs fn() (after warm-up and validation)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def probe(precision, H, B, T):
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    dt = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    g, ks = shapes(H, B, T)
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(1)
    w = [torch.randn(k, g, device=dev, generator=gen).to(dt) * 0.05 for k in ks]
    x = [torch.randn(T * B, k, device=dev, generator=gen).to(dt) for k in ks]
    ds = [torch.randn(T * B, g, device=dev, generator=gen).to(dt) for _ in ks]
    s = [torch.empty(T * B, g, device=dev, dtype=dt) for _ in ks]
    dx = [torch.empty(T * B, k, device=dev, dtype=dt) for k in ks]
    dw = [torch.empty(k, g, device=dev, dtype=dt) for k in ks]

    def step():
        for t in range(T):  # forward: layer by layer, step by step
            r = slice(t * B, (t + 1) * B)
            for l in range(3):
                torch.mm(x[l][r], w[l], out=s[l][r])
        for t in reversed(range(T)):  # backward: the input adjoints
            r = slice(t * B, (t + 1) * B)
            for l in reversed(range(3)):
                torch.mm(ds[l][r], w[l].t(), out=dx[l][r])
        for l in range(3):  # the weight gradients, one product per layer
            torch.mm(x[l].t(), ds[l], out=dw[l])

    # Validate one product of each kind against float64 before timing anything.
    step()
    torch.cuda.synchronize()
    tol = {"fp32": 1e-4, "tf32": 2e-2, "bf16": 5e-2, "fp16": 2e-2}[precision]
    for l in range(3):
        ref = x[l][:B].double() @ w[l].double()
        err = (s[l][:B].double() - ref).abs().max().item() / ref.abs().max().item()
        if err > tol:
            raise SystemExit(f"{precision}: layer {l} product error {err:.2e} > {tol}")

    out = {"precision": precision, "step_products_ms": timed_graph(step)}
    single = {}
    for name, fn in {
        "fwd K=%d" % ks[0]: lambda: torch.mm(x[0][:B], w[0], out=s[0][:B]),
        "fwd K=%d" % ks[2]: lambda: torch.mm(x[2][:B], w[2], out=s[2][:B]),
        "bwd dX K=%d" % ks[0]: lambda: torch.mm(ds[0][:B], w[0].t(), out=dx[0][:B]),
        "bwd dX K=%d" % ks[2]: lambda: torch.mm(ds[2][:B], w[2].t(), out=dx[2][:B]),
        "dW K=%d" % ks[0]: lambda: torch.mm(x[0].t(), ds[0], out=dw[0]),
    }.items():
        single[name] = timed_graph(lambda: [fn() for _ in range(100)]) * 10.0  # µs per product
    out["single_us"] = single
    return out


def schedules(H, B, T):
    """ms per step of the forward's gate products (float32, TF32 off) in the three orders above."""
    torch.backends.cuda.matmul.allow_tf32 = False
    g, ks = shapes(H, B, T)
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(2)
    w = [torch.randn(k, g, device=dev, generator=gen) * 0.05 for k in ks]
    x = [torch.randn(T * B, k, device=dev, generator=gen) for k in ks]
    s = [torch.empty(T * B, g, device=dev) for _ in ks]
    side = [torch.cuda.Stream() for _ in range(2)]

    def mm(l, t):
        r = slice(t * B, (t + 1) * B)
        torch.mm(x[l][r], w[l], out=s[l][r])

    def fork(streams):
        main = torch.cuda.current_stream()
        for st in streams:
            st.wait_stream(main)
        return main

    def join(main, streams):
        for st in streams:
            main.wait_stream(st)

    def chain():
        for t in range(T):
            for l in range(3):
                mm(l, t)

    def wavefront():  # stages: (0,0) (1,0) | (0,1)+(2,0) | (1,1) | (0,2)+(2,1) | ...
        mm(0, 0)
        for t in range(T):
            mm(1, t)
            main = fork(side[:1])
            with torch.cuda.stream(side[0]):
                mm(2, t)
            if t + 1 < T:
                mm(0, t + 1)
            join(main, side[:1])

    def split():
        for t in range(T):
            r = slice(t * B, (t + 1) * B)
            main = fork(side)
            for l, st in zip(range(3), [None] + side):
                ctx = torch.cuda.stream(st) if st is not None else torch.cuda.stream(main)
                with ctx:  # the part that waits only for step t-1
                    torch.mm(x[l][r, H:], w[l][H:], out=s[l][r])
            join(main, side)
            for l in range(3):  # the bottom-up chain, K = H
                torch.addmm(s[l][r], x[l][r, :H], w[l][:H], out=s[l][r])

    chain()
    ref = [t.clone() for t in s]
    out = {}
    for name, fn in (("chain", chain), ("wavefront", wavefront), ("split", split)):
        for t in s:
            t.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        err = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(s, ref))
        if not err < 1e-5:
            raise SystemExit(f"schedule {name}: products differ from the chain's by {err:.2e}")
        out[name] = timed_graph(fn)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=100)
    ap.add_argument("--schedules", action="store_true", help="also the forward products in three orders")
    ap.add_argument("--json")
    o = ap.parse_args()
    if not torch.cuda.is_available():
        print("product_probe: no CUDA device", file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name()}, PyTorch {torch.__version__}, H {o.hidden} B {o.batch} T {o.seq}")
    rows = [probe(p, o.hidden, o.batch, o.seq) for p in ("fp32", "tf32", "bf16", "fp16")]
    for r in rows:
        singles = ", ".join(f"{k} {v:.1f}" for k, v in r["single_us"].items())
        print(f"{r['precision']:5s} step's products {r['step_products_ms']:7.3f} ms | µs each: {singles}")
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    if o.schedules:
        result["forward_schedules_ms"] = schedules(o.hidden, o.batch, o.seq)
        print("float32 forward products per step, ms: " +
              ", ".join(f"{k} {v:.3f}" for k, v in result["forward_schedules_ms"].items()))
    if o.json:
        with open(o.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
