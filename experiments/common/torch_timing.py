"""torch_timing.py: the PyTorch peers' timing loop, in one place (the peers of experiments/scaling
and experiments/resnet; dualcast's own drivers time the same way in common/gpu_timing.hpp).

time_cuda(torch, fn, reps, warmup): fn runs `warmup` times untimed; then `reps` times from an idle
GPU (a synchronize before each, CUDA events around the one call: the step's own time); then `reps`
times back to back between two events (pipelined: launches overlap the previous step's work).
summary(ms): median, p10, p90, min, max, n of a list of milliseconds (numpy.percentile's linear
interpolation, without numpy).
"""

import math


def summary(ms):
    v = sorted(ms)

    def pct(q):
        x = (len(v) - 1) * q / 100.0
        lo = int(math.floor(x))
        hi = min(lo + 1, len(v) - 1)
        return v[lo] + (v[hi] - v[lo]) * (x - lo)
    return {"median": pct(50), "p10": pct(10), "p90": pct(90), "min": v[0], "max": v[-1], "n": len(v)}


def time_cuda(torch, fn, reps, warmup=0):
    """(per-repetition ms, pipelined mean ms, fn's last result)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        ms.append(start.elapsed_time(end))
    torch.cuda.synchronize()
    start.record()
    last = None
    for _ in range(reps):
        last = fn()
    end.record()
    end.synchronize()
    return ms, start.elapsed_time(end) / reps, last
