"""dualcast.torch.elementwise's costs outside the kernels (issue 33's targets): the first compile of
a new function, loading it from the disk cache in a fresh process, and the host time of a call on an
already compiled function (forward alone, forward + backward) at a size where the kernels take a few
microseconds, against the same cell in PyTorch eager and torch.compile; dualcast through the compiled
launcher (dualcast.native) and through the Python one; and a DLPack round trip of a torch tensor
through a dualcast tensor (dualcast.core). Prints one JSON object.

    python3 experiments/torch_elementwise/overhead.py [--device cuda|cpu] [--reps N]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "experiments", "common"))

os.environ.setdefault("DUALCAST_NATIVE", "wait")  # the compiled launcher loaded before anything is timed

import torch  # noqa: E402

from dualcast import jit, native  # noqa: E402
from dualcast.torch import elementwise, launcher, set_native  # noqa: E402
from torch_timing import summary  # noqa: E402

CELL = """
    if (z == 1) return sigmoid(i) * tanh(g);
    if (zb == 0) return c;
    return sigmoid(f) * c + sigmoid(i) * tanh(g);
"""


def cell_torch(z, zb, c, f, i, g):
    ig = torch.sigmoid(i) * torch.tanh(g)
    return torch.where(z == 1, ig, torch.where(zb == 0, c, torch.sigmoid(f) * c + ig))


def host_us(fn, reps, sync):
    """Median host microseconds per call over batches (the GPU is synchronised once per batch, so
    the calls are queued as a model would queue them)."""
    for _ in range(20):
        fn()
    sync()
    per = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        per.append((time.perf_counter() - t0) / reps * 1e6)
        sync()
    return summary(per)["median"]


def first_compile_and_disk(device):
    """Seconds to compile a new function, then to get it again in a fresh process (disk cache)."""
    salt = "%d_%d" % (os.getpid(), time.time_ns())
    body = "return x * y + %s.0 * 0;  // %s" % (len(salt), salt)  # a body no cache has seen
    code = ("import sys, time, torch; sys.path.insert(0, %r)\n"
            "from dualcast.torch import elementwise\n"
            "x = torch.ones(4, device=%r, requires_grad=True)\n"
            "f = elementwise(%r, inputs='x y', differentiable='x')\n"
            "t0 = time.perf_counter(); f(x, x).sum().backward(); torch.%s\n"
            "print(time.perf_counter() - t0)\n") % (os.path.join(ROOT, "python"), device, body,
                                                   "cuda.synchronize()" if device == "cuda" else "ones(1)")
    times = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        times.append(float(r.stdout.strip().splitlines()[-1]))
    return times  # [first compile (value and gradient kernels), from the disk cache]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--n", type=int, default=64, help="the cell's rows and columns (small: host-bound)")
    o = ap.parse_args()
    dev = torch.device(o.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    n = o.n
    z = (torch.rand(n, 1, device=dev) < 0.5).float()
    zb = (torch.rand(n, 1, device=dev) < 0.5).float()
    xs = [torch.randn(n, n, device=dev, requires_grad=True) for _ in range(4)]
    adj = torch.randn(n, n, device=dev)
    cell = elementwise(CELL, inputs="z zb c f i g", differentiable="c f i g")
    compiled = torch.compile(cell_torch)
    out = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "n": n,
           "torch": torch.__version__}
    out["launcher"] = launcher()
    for name, fn in (("dualcast", cell), ("dualcast_python_launcher", cell), ("torch_eager", cell_torch),
                     ("torch_compile", compiled)):
        set_native(name != "dualcast_python_launcher")
        with torch.no_grad():
            fwd = host_us(lambda: fn(z, zb, *xs), o.reps, sync)
        both = host_us(lambda: torch.autograd.grad(fn(z, zb, *xs), xs, adj), o.reps, sync)
        out[name] = {"forward_us": round(fwd, 2), "forward_backward_us": round(both, 2)}
        if name == "dualcast":  # how many of its calls the compiled launcher took (all but the first two)
            out["compiled_launcher_calls"] = cell._native.calls if cell._native is not None else 0
    set_native(True)
    # The kernels alone, for the overhead: CUDA events around many calls would include the gaps, so
    # the launch cost is read from a torch op of the same size as the floor.
    out["torch_add_us"] = round(host_us(lambda: xs[0] + xs[1], o.reps, sync), 2)
    # A torch tensor into a dualcast tensor and back through DLPack (dualcast.core, where it is built).
    from dualcast import core
    if core.available():
        t = xs[0].detach()
        round_trip = host_us(lambda: torch.from_dlpack(core.from_dlpack(t)), o.reps, sync)
        out["dlpack_round_trip_us"] = round(round_trip, 2)
    else:
        out["dlpack_round_trip_us"] = "dualcast._core not built: %s" % core.reason()
    # Loading the compiled launcher (built and cached before), once per process.
    r = subprocess.run([sys.executable, "-c", "import sys, time; sys.path.insert(0, %r); import torch\n"
                        "t0 = time.perf_counter(); from dualcast import native; native.start()\n"
                        "print(time.perf_counter() - t0, native.status())" % os.path.join(ROOT, "python")],
                       capture_output=True, text=True, check=True)
    out["compiled_launcher_load_s"] = round(float(r.stdout.split()[0]), 4)
    with tempfile.TemporaryDirectory() as cache:
        os.environ["DUALCAST_CACHE_DIR"] = cache
        first, disk = first_compile_and_disk(o.device)
    out["first_compile_s"], out["disk_cache_s"] = round(first, 4), round(disk, 4)
    out["jit_stats"] = dict(jit.stats)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
