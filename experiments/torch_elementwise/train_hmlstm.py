"""The HM-LSTM character model written in PyTorch (experiments/peers/hmlstm.py, the peers' model)
trained on the license corpus with its cell update as a dualcast.torch.elementwise kernel, against
the same model with the cell in PyTorch eager ops and with the cell step under torch.compile
(issue 33, item 5). The dualcast variant runs the layer-step's boundary detector as a second
dualcast function, as the native model does, so that it fuses what torch.compile fuses. Every
variant starts from the same parameters and reads the same minibatches, so their bits/char curves
must agree to float32 rounding; what differs is the time per step.

The recipe is dualcast's native character LM's (experiments/hmlstm/charlm.hpp): the corpus mapped to
64 symbols, its last 10% held out, Adam at lr 2e-3, the gradient norm clipped at 1, the boundary
slope annealed linearly from 1 to 5, the validation bits/char on the first 4 x 64 windows (stride T)
of the held-out text every 25 steps. Its initial parameters and minibatches come from numpy's
generator, not from dualcast's counter-based one, so its curve is compared with the native run's
by value, not bit for bit.

    python3 experiments/torch_elementwise/train_hmlstm.py [--cells dualcast,eager,compile]
        [--steps 300] [--hidden 512] [--batch 64] [--seq 100] [--device cuda|cpu] [--out FILE.json]

Prints one line per logged step and variant, then the per-step times and the largest difference
between the variants' curves; writes everything to --out.
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "experiments", "peers"))
sys.path.insert(0, os.path.join(ROOT, "python"))
# The compiled launcher (dualcast.native) loaded before the first step, so that every timed step takes it.
os.environ.setdefault("DUALCAST_NATIVE", "wait")

import hmlstm  # noqa: E402  (the peers' backend-generic model)
from peer_torch import DUALCAST_CELL_B, TorchOps  # noqa: E402

PUNCT = ".,;:'\"()-!?/&*%$#@[]_<>=+"  # ids 39..63, as charlm.cu's kPunct
VALID_BATCH, VALID_BATCHES, LOG_EVERY = 64, 4, 25


def char_to_id(c):
    if c == "\n":
        return 1
    if c in " \t":
        return 2
    if "a" <= c.lower() <= "z" and c.isascii():
        return 3 + ord(c.lower()) - ord("a")
    if "0" <= c <= "9":
        return 29 + ord(c) - ord("0")
    c = "'" if c == "`" else c
    return 39 + PUNCT.index(c) if c in PUNCT else 0


def load_corpus(folder, valid_fraction=0.1):
    """charlm's corpus: the folder's regular files (links skipped) in sorted name order, bytes mapped
    to ids ('\\r' dropped), split into training and validation text."""
    names = sorted(n for n in os.listdir(folder)
                   if os.path.isfile(os.path.join(folder, n)) and not os.path.islink(os.path.join(folder, n)))
    text = b"".join(open(os.path.join(folder, n), "rb").read() for n in names)
    ids = np.array([char_to_id(chr(b)) for b in text if b != 13], dtype=np.int64)
    n_train = int(round(len(ids) * (1.0 - valid_fraction)))
    return ids[:n_train], ids[n_train:]


def windows(text, offsets, T):
    """Tokens [T+1, B]: column b is text[offsets[b] .. offsets[b] + T]."""
    return np.stack([text[o:o + T + 1] for o in offsets], axis=1)


def initial_params(H, V, seed):
    """The native model's distributions: E ~ N(0, 1), the weights U(-1/sqrt(H), 1/sqrt(H)), biases 0."""
    rng = np.random.default_rng(seed)
    r = 1.0 / math.sqrt(H)
    P = {}
    for name, shape in hmlstm.param_shapes(H, V).items():
        if name == "E":
            P[name] = rng.standard_normal(shape)
        elif name.startswith("b"):
            P[name] = np.zeros(shape)
        else:
            P[name] = rng.uniform(-r, r, shape)
    return {k: v.astype(np.float32) for k, v in P.items()}


# The boundary detector of hmlstm.hm_pointwise with the straight-through estimator, as the native
# model's BoundarySte (experiments/hmlstm/network.hpp): value step(z~) with z~ = clamp((a s + 1) / 2,
# 0, 1), derivative that of z~ (a / 2 on the open interior, 0 elsewhere). u + (step - u's value) is
# exactly step (Sterbenz) and carries u's partial.
DUALCAST_BOUNDARY = """
    const D u = (a * s + 1) * 0.5;
    if (u <= 0) return 0;
    if (u >= 1) return 1;
    return u + ((u > 0.5 ? 1 : 0) - value(u));
"""


def make_pointwise(kind):
    """(zflag, zbflag, c, h, s, a) -> (c, h, z): the layer-step's elementwise work (the cell and the
    boundary detector) as dualcast.torch functions (kind "dualcast": two fused kernels forward, two
    backward, as the native model's), as PyTorch eager ops ("eager"), or those ops under
    torch.compile ("compile"), which fuses them the same way."""
    if kind == "dualcast":
        from dualcast.torch import elementwise
        cell = elementwise(DUALCAST_CELL_B, inputs="z zb c h f i o g", differentiable="c h f i o g", outputs=2)
        boundary = elementwise(DUALCAST_BOUNDARY, inputs="s a", differentiable="s")

        def pointwise(zflag, zbflag, c, h, s, a):
            # One split, not five slices: autograd then joins the five gradients with one cat, where
            # each slice's backward would fill a zero tensor of s's shape and add it to the others
            # (about 40 us of a 295 us layer-step on the CPU at H 16, B 4). The compiled variant's
            # slices are inside its graph, so its backward makes s's gradient at once.
            H = c.shape[1]
            f, i, o, g, sz = s.split((H, H, H, H, 1), dim=1)
            c_new, h_new = cell(zflag, zbflag, c, h, f, i, o, g)
            return c_new, h_new, boundary(sz, a)
        return pointwise

    def pointwise(zflag, zbflag, c, h, s, a):
        return hmlstm.hm_pointwise(TorchOps, zflag, zbflag, c, h, s, a)
    if kind == "compile":
        return torch.compile(pointwise, dynamic=False)
    assert kind in ("dualcast", "eager"), kind
    return pointwise


def train(kind, o, P0, train_text, valid_sets, device):
    P = {k: torch.tensor(v, device=device, requires_grad=True) for k, v in P0.items()}
    params = [P[k] for k in hmlstm.PARAM_NAMES]
    opt = torch.optim.Adam(params, lr=o.lr)
    pointwise = make_pointwise(kind)
    slope = torch.tensor(1.0, device=device)

    def loss_of(tokens):
        return hmlstm.hm_loss(TorchOps, P, tokens, slope,
                              pointwise=lambda zf, zbf, c, h, s: pointwise(zf, zbf, c, h, s, slope))

    def validate():
        with torch.no_grad():
            return sum(float(loss_of(v)) for v in valid_sets) / len(valid_sets) / math.log(2)

    rng = np.random.default_rng(o.data_seed)
    span = len(train_text) - o.seq
    curve, seconds, acc, since = [], 0.0, 0.0, 0
    for step in range(o.steps + 1):
        if step % LOG_EVERY == 0 or step == o.steps:
            train_bpc = acc / since / math.log(2) if since else None  # (none before the first step)
            curve.append({"step": step, "train_bpc": train_bpc, "valid_bpc": validate()})
            print("  %-8s step %4d  train %6s  valid %.4f bits/char" % (
                kind, step, "-" if train_bpc is None else "%.4f" % train_bpc, curve[-1]["valid_bpc"]), flush=True)
            acc, since = 0.0, 0
        if step == o.steps:
            break
        tokens = torch.tensor(windows(train_text, rng.integers(0, span, o.batch), o.seq), device=device)
        slope.fill_(1.0 + (o.slope_final - 1.0) * step / o.steps)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_of(tokens)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step >= 3:  # the first steps compile
            seconds += time.perf_counter() - t0
        acc += float(loss)
        since += 1
    return {"cell": kind, "curve": curve, "ms_per_step": 1e3 * seconds / max(1, o.steps - 3)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", default="dualcast,eager,compile")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=100)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--slope-final", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data-seed", type=int, default=7)
    ap.add_argument("--corpus", default="/usr/share/common-licenses")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=None)
    o = ap.parse_args()
    device = torch.device(o.device)
    train_text, valid_text = load_corpus(o.corpus)
    nv = min(VALID_BATCH, (len(valid_text) - 1) // o.seq)
    valid_sets = [torch.tensor(windows(valid_text, [(j * nv + b) * o.seq for b in range(nv)], o.seq), device=device)
                  for j in range(VALID_BATCHES) if (j * nv + nv) * o.seq + 1 <= len(valid_text)]
    P0 = initial_params(o.hidden, 64, o.seed)
    print("train_hmlstm: H=%d B=%d T=%d, %d steps on %s (%s), corpus %d + %d chars" % (
        o.hidden, o.batch, o.seq, o.steps, device, torch.cuda.get_device_name(device) if device.type == "cuda"
        else "cpu", len(train_text), len(valid_text)), flush=True)
    runs = [train(kind, o, P0, train_text, valid_sets, device) for kind in o.cells.split(",")]
    worst = 0.0
    for r in runs[1:]:
        for a, b in zip(runs[0]["curve"], r["curve"]):
            worst = max(worst, abs(a["valid_bpc"] - b["valid_bpc"]))
    for r in runs:
        if r["cell"] == "dualcast":  # which launcher its calls took (dualcast.native)
            from dualcast.torch import launcher
            r["launcher"] = launcher()
            print("train_hmlstm: dualcast launcher: %s" % r["launcher"])
        print("train_hmlstm: %-8s %.2f ms/step, final validation %.4f bits/char" % (
            r["cell"], r["ms_per_step"], r["curve"][-1]["valid_bpc"]))
    print("train_hmlstm: largest difference between the cells' validation curves: %.2e bits/char" % worst)
    if o.out:
        with open(o.out, "w") as f:
            json.dump({"config": vars(o), "torch": torch.__version__, "runs": runs, "max_curve_diff": worst}, f,
                      indent=1)


if __name__ == "__main__":
    main()
