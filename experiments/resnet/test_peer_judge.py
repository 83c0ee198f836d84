#!/usr/bin/env python3
"""Tests of peer_torch.judge (the ResNet validation's verdict) on made-up steps, no torch needed:
float32 runs whose ReLU switches land on different tensors pass, a wrong gradient fails, a loss off
by more than its tolerance fails. ctest runs it (resnet_peer.judge)."""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_torch  # noqa: E402

rng = np.random.default_rng(7)
TRUTH = {n: rng.standard_normal(200) for n in ("conv", "bn.weight", "bn.bias")}


def step(noise=1e-7, switch=None, scale=None, loss=1.0):
    """A float32-like step: the float64 truth with relative noise; `switch` moves one element of
    that tensor by 5% of its largest entry (a ReLU input on the other side of zero); `scale`
    multiplies one tensor (a wrong gradient)."""
    grads = {}
    for n, g in TRUTH.items():
        g = g * (1 + noise * rng.standard_normal(g.shape))
        if n == switch:
            g[3] += 0.05 * np.abs(TRUTH[n]).max()
        if n == scale:
            g = g * 1.5
        grads[n] = g
    return {"loss": loss, "grads": grads, "running_stats": {"bn.running_mean": np.ones(8)},
            "params_after_step": dict(grads)}


def main():
    t64 = step(noise=0.0)
    r = peer_torch.judge(step(switch="conv"), t64, step(switch="bn.bias"))
    assert r["ok"], r
    assert r["grads"]["max_rel_err"] > peer_torch.TOL["grads"], "the case must fail the direct comparison"
    r = peer_torch.judge(step(switch="conv"), t64, step(switch="bn.bias", scale="bn.weight"))
    assert not r["ok"] and r["grads"]["failed"] == ["bn.weight"], r["grads"]
    r = peer_torch.judge(step(), t64, step())
    assert r["ok"] and not r["grads"]["failed"], r
    r = peer_torch.judge(step(), t64, step(loss=1.001))
    assert not r["ok"], "a loss 1e-3 off passed"
    print("PASSED: resnet_peer.judge")


if __name__ == "__main__":
    main()
