"""Self-test of torch_timing.py without torch or a GPU: a fake torch whose CUDA events read a clock
that each call of the timed function advances. `python3 experiments/common/test_torch_timing.py`."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_timing  # noqa: E402


class FakeTorch:
    def __init__(self):
        self.clock = 0.0
        self.syncs = 0
        outer = self

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self):
                self.t = outer.clock

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return other.t - self.t

        class Cuda:
            @staticmethod
            def synchronize():
                outer.syncs += 1

        Cuda.Event = Event
        self.cuda = Cuda


def main():
    fails = []
    torch = FakeTorch()
    calls = []

    def step():
        calls.append(1)
        torch.clock += 2.0 + 0.5 * (len(calls) % 2)  # alternately 2.5 and 2.0 ms
        return len(calls)

    ms, pipelined, last = torch_timing.time_cuda(torch, step, reps=4, warmup=3)
    if len(calls) != 3 + 4 + 4:
        fails.append("calls: %d, want warmup + 2 x reps = 11" % len(calls))
    if sorted(ms) != [2.0, 2.0, 2.5, 2.5]:
        fails.append("per-repetition ms %s" % ms)
    if abs(pipelined - 2.25) > 1e-12:
        fails.append("pipelined %s, want 2.25" % pipelined)
    if last != 11:
        fails.append("last result %s, want 11" % last)
    if torch.syncs < 1 + 4:
        fails.append("a synchronize before the loop and before each repetition: %d" % torch.syncs)
    s = torch_timing.summary([4.0, 1.0, 3.0, 2.0, 5.0])
    want = {"median": 3.0, "p10": 1.4, "p90": 4.6, "min": 1.0, "max": 5.0, "n": 5}
    if any(abs(s[k] - want[k]) > 1e-12 for k in want):
        fails.append("summary %s, want %s" % (s, want))
    for f in fails:
        print("FAILED:", f)
    print("test_torch_timing: %s" % ("all checks passed" if not fails else "%d failed" % len(fails)))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
