"""numpy-only reference implementations of the peer workloads a, b and e (forward and backward).

Backward passes here are derived by hand (closed forms for the cells, a manual BPTT for the model);
they do not share code with hmlstm.py, so comparing the two checks both.  All arithmetic is float64.

Also: the deterministic input generators every peer uses, so that all methods see identical data.
"""

import numpy as np

from hmlstm import PARAM_NAMES, param_shapes

# names of the arrays of workloads a and b: inputs, adjoints, gradients (validate-dir names are
# "<w>_<name>", gradients "<w>_grad_<name>")
CELL_SPEC = {
    "a": {"flags": ("z", "zb"), "diff": ("c", "f", "i", "g"), "adj": ("adj",)},
    "b": {"flags": ("z", "zb"), "diff": ("c", "h", "f", "i", "o", "g"), "adj": ("adj_c", "adj_h")},
}


def sigm(x):
    return 1.0 / (1.0 + np.exp(-x))


# --------------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------------
def gen_flags(rng, dims):
    """[dims, 1] float32 flags: row 0 FLUSH, row 1 COPY, row 2 UPDATE, others Bernoulli(0.5)."""
    z = (rng.random((dims, 1)) < 0.5).astype(np.float32)
    zb = (rng.random((dims, 1)) < 0.5).astype(np.float32)
    forced = [(1.0, 1.0), (0.0, 0.0), (0.0, 1.0)]
    for r, (zv, zbv) in enumerate(forced[:dims]):
        z[r, 0], zb[r, 0] = zv, zbv
    return z, zb


def gen_cell_inputs(workload, dims, seed=0):
    """dict name -> float32 array for workload 'a' or 'b' (flags, differentiated inputs, adjoints)."""
    spec = CELL_SPEC[workload]
    rng = np.random.default_rng([seed, dims, ord(workload)])
    z, zb = gen_flags(rng, dims)
    out = {"z": z, "zb": zb}
    for n in spec["diff"] + spec["adj"]:
        out[n] = rng.standard_normal((dims, dims), dtype=np.float32)
    return out


def init_e_params(H, V=64, seed=0, scale=None):
    """A reproducible initialisation (see MODEL.md): matrices U(-k, k), k = 1/sqrt(H) (or `scale`),
    E ~ N(0, 1), biases 0.  Validation never depends on it (the driver's parameters are used)."""
    rng = np.random.default_rng([seed, H, V, 101])
    k = 1.0 / np.sqrt(H) if scale is None else scale
    P = {}
    for name, shp in param_shapes(H, V).items():
        if name == "E":
            P[name] = rng.standard_normal(shp).astype(np.float32)
        elif name.startswith("b"):
            P[name] = np.zeros(shp, np.float32)
        else:
            P[name] = rng.uniform(-k, k, shp).astype(np.float32)
    return P


def gen_tokens(T, B, V=64, seed=0):
    rng = np.random.default_rng([seed, T, B, V, 202])
    return rng.integers(0, V, size=(T + 1, B)).astype(np.int32)


# --------------------------------------------------------------------------------------------
# workload a
# --------------------------------------------------------------------------------------------
def ref_cell_a(z, zb, c, f, i, g, adj):
    """Returns (new_c, {c, f, i, g: gradient}) in float64."""
    z, zb, c, f, i, g, adj = (np.asarray(x, np.float64) for x in (z, zb, c, f, i, g, adj))
    flush = np.broadcast_to(z == 1, c.shape)
    copy = np.broadcast_to((z != 1) & (zb == 0), c.shape)
    upd = ~flush & ~copy
    sf, si, tg = sigm(f), sigm(i), np.tanh(g)
    new_c = np.where(flush, si * tg, np.where(copy, c, sf * c + si * tg))
    d_ig = np.where(copy, 0.0, adj)              # FLUSH and UPDATE rows use sig(i) tanh(g)
    grads = {
        "c": np.where(copy, adj, np.where(upd, adj * sf, 0.0)),
        "f": np.where(upd, adj * c * sf * (1 - sf), 0.0),
        "i": d_ig * tg * si * (1 - si),
        "g": d_ig * si * (1 - tg * tg),
    }
    return new_c, grads


# --------------------------------------------------------------------------------------------
# workload b
# --------------------------------------------------------------------------------------------
def ref_cell_b(z, zb, c, h, f, i, o, g, adj_c, adj_h):
    """Returns (new_c, new_h, {c, h, f, i, o, g: gradient}) in float64."""
    z, zb, c, h, f, i, o, g, adj_c, adj_h = (np.asarray(x, np.float64)
                                             for x in (z, zb, c, h, f, i, o, g, adj_c, adj_h))
    flush = np.broadcast_to(z == 1, c.shape)
    copy = np.broadcast_to((z != 1) & (zb == 0), c.shape)
    upd = ~flush & ~copy
    sf, si, so, tg = sigm(f), sigm(i), sigm(o), np.tanh(g)
    new_c = np.where(flush, si * tg, np.where(copy, c, sf * c + si * tg))
    tc = np.tanh(new_c)
    new_h = np.where(copy, h, so * tc)
    # non-COPY rows: h' = so tanh(c'), so the adjoint of c' gains adj_h so (1 - tanh^2 c')
    dcn = np.where(copy, adj_c, adj_c + adj_h * so * (1 - tc * tc))
    d_ig = np.where(copy, 0.0, dcn)
    grads = {
        "c": np.where(copy, adj_c, np.where(upd, dcn * sf, 0.0)),
        "h": np.where(copy, adj_h, 0.0),
        "f": np.where(upd, dcn * c * sf * (1 - sf), 0.0),
        "i": d_ig * tg * si * (1 - si),
        "o": np.where(copy, 0.0, adj_h * tc * so * (1 - so)),
        "g": d_ig * si * (1 - tg * tg),
    }
    return new_c, new_h, grads


def ref_cell(workload, inputs, rows=None):
    """Gradients (float64 dict) of workload 'a'/'b' from an inputs dict (gen_cell_inputs names).
    rows: optional slice/index of rows to evaluate (the cells are row-local)."""
    sel = (lambda x: x) if rows is None else (lambda x: x[rows])
    x = {k: sel(v) for k, v in inputs.items()}
    if workload == "a":
        return ref_cell_a(x["z"], x["zb"], x["c"], x["f"], x["i"], x["g"], x["adj"])[1]
    return ref_cell_b(x["z"], x["zb"], x["c"], x["h"], x["f"], x["i"], x["o"], x["g"],
                      x["adj_c"], x["adj_h"])[2]


# --------------------------------------------------------------------------------------------
# workload e: forward and manual backprop through time
# --------------------------------------------------------------------------------------------
def ref_e(P, tokens, a, soft=False, return_stats=False):
    """Loss (nats) and gradients of the 3-layer HM-LSTM model of MODEL.md, float64.

    soft=False: z^l_t = step(z~) with the straight-through gradient (the model as specified).
    soft=True : z^l_t = z~ as a multiplier (flags still step(z~)); a differentiable variant used to
                check this backward code against finite differences.
    Returns (loss, grads dict) or (loss, grads, stats) with branch counts per layer.
    """
    P = {k: np.asarray(v, np.float64) for k, v in P.items()}
    tokens = np.asarray(tokens)
    T, B = tokens.shape[0] - 1, tokens.shape[1]
    H = P["E"].shape[1]
    nl = 3
    c = [np.zeros((B, H)) for _ in range(nl)]
    h = [np.zeros((B, H)) for _ in range(nl)]
    zm = [np.zeros((B, 1)) for _ in range(nl)]     # boundary value used as a multiplier
    zf = [np.zeros((B, 1)) for _ in range(nl)]     # boundary flag (0/1)
    tape, hcats = [], []
    stats = {"flush": [0] * nl, "copy": [0] * nl, "update": [0] * nl, "z1": [0] * nl}
    for t in range(T):
        hb = P["E"][tokens[t]]
        zb_m, zb_f = None, np.ones((B, 1))
        recs = []
        nc, nh, nzm, nzf = [], [], [], []
        for l in range(nl):
            n = str(l + 1)
            a1 = hb @ P["W" + n]
            s = a1 if zb_m is None else zb_m * a1
            s = s + h[l] @ P["U" + n]
            td = None
            if l < nl - 1:
                td = h[l + 1] @ P["Td" + n]
                s = s + zm[l] * td
            s = s + P["b" + n]
            sf, si = sigm(s[:, 0:H]), sigm(s[:, H:2 * H])
            so, tg = sigm(s[:, 2 * H:3 * H]), np.tanh(s[:, 3 * H:4 * H])
            sz = s[:, 4 * H:4 * H + 1]
            flush = np.broadcast_to(zf[l] == 1, (B, H))
            copy = np.broadcast_to((zf[l] != 1) & (zb_f == 0), (B, H))
            upd = ~flush & ~copy
            cn = np.where(flush, si * tg, np.where(copy, c[l], sf * c[l] + si * tg))
            tcn = np.tanh(cn)
            hn = np.where(copy, h[l], so * tcn)
            u = (a * sz + 1.0) * 0.5
            inter = (u > 0) & (u < 1)
            zt = np.where(inter, u, np.where(u >= 1, 1.0, 0.0))
            st = (zt > 0.5).astype(np.float64)
            m = zt if soft else st
            stats["flush"][l] += int(flush[:, 0].sum())
            stats["copy"][l] += int(copy[:, 0].sum())
            stats["update"][l] += int(upd[:, 0].sum())
            stats["z1"][l] += int(st.sum())
            recs.append(dict(hb=hb, zb_m=zb_m, a1=a1, hp=h[l], cp=c[l], zpm=zm[l], td=td,
                             ht=h[l + 1] if l < nl - 1 else None, sf=sf, si=si, so=so, tg=tg,
                             tcn=tcn, flush=flush, copy=copy, upd=upd, inter=inter))
            nc.append(cn)
            nh.append(hn)
            nzm.append(m)
            nzf.append(st)
            hb, zb_m, zb_f = hn, m, st
        tape.append(recs)
        c, h, zm, zf = nc, nh, nzm, nzf
        hcats.append(np.concatenate(h, axis=1))

    HC = np.stack(hcats).reshape(T * B, 3 * H)
    logits = HC @ P["Wout"] + P["bout"]
    tgt = tokens[1:T + 1].reshape(T * B)
    mx = logits.max(axis=1, keepdims=True)
    lse = mx[:, 0] + np.log(np.exp(logits - mx).sum(axis=1))
    N = T * B
    loss = float(np.mean(lse - logits[np.arange(N), tgt]))

    G = {k: np.zeros_like(v) for k, v in P.items()}
    dlog = np.exp(logits - lse[:, None])
    dlog[np.arange(N), tgt] -= 1.0
    dlog /= N
    G["Wout"] = HC.T @ dlog
    G["bout"] = dlog.sum(axis=0)
    dHC = (dlog @ P["Wout"].T).reshape(T, B, 3 * H)

    dh_next = [np.zeros((B, H)) for _ in range(nl)]
    dc_next = [np.zeros((B, H)) for _ in range(nl)]
    dz_next = [np.zeros((B, 1)) for _ in range(nl)]
    for t in range(T - 1, -1, -1):
        dh = [dHC[t][:, l * H:(l + 1) * H] + dh_next[l] for l in range(nl)]
        dc = list(dc_next)
        dz = list(dz_next)
        dh_prev = [np.zeros((B, H)) for _ in range(nl)]
        dc_prev = [np.zeros((B, H)) for _ in range(nl)]
        dz_prev = [np.zeros((B, 1)) for _ in range(nl)]
        for l in range(nl - 1, -1, -1):
            r = tape[t][l]
            n = str(l + 1)
            copy, flush, upd = r["copy"], r["flush"], r["upd"]
            sf, si, so, tg, tcn = r["sf"], r["si"], r["so"], r["tg"], r["tcn"]
            # h' = where(copy, h, so * tanh(c'))
            dh_copy = np.where(copy, dh[l], 0.0)
            dh_cand = np.where(copy, 0.0, dh[l])
            dso = dh_cand * tcn
            dcn = dc[l] + dh_cand * so * (1 - tcn * tcn)
            # c' = where(flush, si tg, where(copy, c, sf c + si tg))
            dig = np.where(copy, 0.0, dcn)
            dcp = np.where(copy, dcn, np.where(upd, dcn * sf, 0.0))
            dsf = np.where(upd, dcn * r["cp"], 0.0)
            ds = np.concatenate([
                dsf * sf * (1 - sf),
                dig * tg * si * (1 - si),
                dso * so * (1 - so),
                dig * si * (1 - tg * tg),
                dz[l] * r["inter"] * (a * 0.5),
            ], axis=1)
            G["b" + n] += ds.sum(axis=0)
            # s = [zb *] (hb @ W) + hp @ U + [zp * (ht @ Td)] + b
            if r["zb_m"] is None:
                da1 = ds
            else:
                da1 = r["zb_m"] * ds
                dz[l - 1] = dz[l - 1] + (ds * r["a1"]).sum(axis=1, keepdims=True)
            G["W" + n] += r["hb"].T @ da1
            dhb = da1 @ P["W" + n].T
            if l == 0:
                np.add.at(G["E"], tokens[t], dhb)
            else:
                dh[l - 1] = dh[l - 1] + dhb
            G["U" + n] += r["hp"].T @ ds
            dh_prev[l] += ds @ P["U" + n].T + dh_copy
            if l < nl - 1:
                dz_prev[l] += (ds * r["td"]).sum(axis=1, keepdims=True)
                dtd = r["zpm"] * ds
                G["Td" + n] += r["ht"].T @ dtd
                dh_prev[l + 1] += dtd @ P["Td" + n].T
            dc_prev[l] += dcp
        dh_next, dc_next, dz_next = dh_prev, dc_prev, dz_prev
    if return_stats:
        return loss, G, stats
    return loss, G


def grad_norms(G):
    return {k: float(np.sqrt(np.sum(np.asarray(v, np.float64) ** 2))) for k, v in G.items()}


__all__ = ["CELL_SPEC", "PARAM_NAMES", "gen_flags", "gen_cell_inputs", "init_e_params", "gen_tokens",
           "ref_cell_a", "ref_cell_b", "ref_cell", "ref_e", "grad_norms", "sigm"]
