"""Backend-generic definitions of the three peer workloads (see MODEL.md).

Every function takes an ops namespace ``O`` first.  The same code runs on
  * PyTorch tensors   (peer_torch.TorchOps),
  * JAX arrays        (peer_jax.JaxOps),
  * npad Vars         (npad.NPOps: the numpy test double used by selftest.py),
so the arithmetic the peers time is the arithmetic the numpy self-test checks.

``O`` provides: sigmoid, tanh, where(cond, x, y), sg (stop_gradient / detach), fmask(cond, like)
(bool -> float of like's dtype), zeros(shape, like), ones_like(x), cat(list, axis), reshape(x, shape),
take_rows(E, idx), xent_mean(logits, targets), scan(f, carry, xs) -> (carry, stacked ys).
Operators used directly on arrays: + - * @, comparisons, basic slicing, .shape.
"""

PARAM_NAMES = ("E", "W1", "U1", "b1", "Td1", "W2", "U2", "b2", "Td2", "W3", "U3", "b3", "Wout", "bout")
L = 3


def param_shapes(H, V):
    G = 4 * H + 1
    shp = {"E": (V, H), "Wout": (3 * H, V), "bout": (V,)}
    for n in (1, 2, 3):
        shp["W%d" % n] = (H, G)
        shp["U%d" % n] = (H, G)
        shp["b%d" % n] = (G,)
        if n < 3:
            shp["Td%d" % n] = (H, G)
    return {k: shp[k] for k in PARAM_NAMES}


# --------------------------------------------------------------------------------------------
# Workload a: the 2018 paper's cell update (K = 4).  z, zb: [N, 1] 0/1 flags (no gradient).
# --------------------------------------------------------------------------------------------
def cell_a(O, z, zb, c, f, i, g):
    ig = O.sigmoid(i) * O.tanh(g)
    return O.where(z == 1, ig, O.where(zb == 0, c, O.sigmoid(f) * c + ig))


# --------------------------------------------------------------------------------------------
# Workload b: the full cell, two outputs (K = 6).
#   FLUSH (z == 1):            c' = sig(i) tanh(g),            h' = sig(o) tanh(c')
#   COPY  (z == 0, zb == 0):   c' = c,                         h' = h
#   UPDATE (otherwise):        c' = sig(f) c + sig(i) tanh(g), h' = sig(o) tanh(c')
# --------------------------------------------------------------------------------------------
def cell_b(O, z, zb, c, h, f, i, o, g):
    ig = O.sigmoid(i) * O.tanh(g)
    flush = z == 1
    keep = zb == 0
    c_new = O.where(flush, ig, O.where(keep, c, O.sigmoid(f) * c + ig))
    h_cand = O.sigmoid(o) * O.tanh(c_new)
    h_new = O.where(flush, h_cand, O.where(keep, h, h_cand))
    return c_new, h_new


# --------------------------------------------------------------------------------------------
# Workload e: 3-layer HM-LSTM character model.
# --------------------------------------------------------------------------------------------
def hm_pointwise(O, zflag, zbflag, c, h, s, a, soft=False, cell=None):
    """Everything elementwise in one layer/time step.

    zflag = z^l_{t-1}, zbflag = zb_l (plain 0/1 values, no gradient); c, h = c^l_{t-1}, h^l_{t-1};
    s = the [B, 4H+1] pre-activation.  Returns (c^l_t, h^l_t, z^l_t) where z carries the
    straight-through gradient  dz/ds_z = a/2 on 0 < (a s_z + 1)/2 < 1, else 0.
    soft=True (tests only): z = z~ (the hard sigmoid itself) instead of the step; the flags the
    caller derives from z are unchanged in value (step(z~)); it makes the loss differentiable so
    that finite differences can check the backward code path.
    cell: the cell update (zflag, zbflag, c, h, f, i, o, g) -> (c', h'); default cell_b on O (the
    torch_dualcast peer passes dualcast's fused kernel).
    """
    H = c.shape[1]
    f = s[:, 0:H]
    i = s[:, H:2 * H]
    o = s[:, 2 * H:3 * H]
    g = s[:, 3 * H:4 * H]
    sz = s[:, 4 * H:4 * H + 1]
    if cell is None:
        c_new, h_new = cell_b(O, zflag, zbflag, c, h, f, i, o, g)
    else:
        c_new, h_new = cell(zflag, zbflag, c, h, f, i, o, g)
    u = (a * sz + 1.0) * 0.5
    zt = O.fmask((u > 0) & (u < 1), u) * u + O.fmask(u >= 1, u)   # clamp(u, 0, 1), grad on interior
    if soft:
        return c_new, h_new, zt
    step = O.fmask(zt > 0.5, zt)
    z = zt + O.sg(step - zt)      # forward value: exactly step (0 or 1); gradient: that of zt
    return c_new, h_new, z


def _flag(O, zval, soft=False):
    """The 0/1 flag value of a boundary, without gradient.  In STE mode z already is exactly 0 or 1;
    in soft mode (tests) z = z~ and the flag is step(z~)."""
    if soft:
        return O.fmask(O.sg(zval) > 0.5, O.sg(zval))
    return O.sg(zval)


def hm_step(O, P, a, pointwise, carry, x_emb, soft=False):
    """One time step of all three layers.  carry = ((c1,c2,c3), (h1,h2,h3), (z1,z2,z3)).

    pointwise(zflag, zbflag, c, h, s) -> (c, h, z)   (hm_pointwise with O and a bound).
    Returns (new carry, concat(h1, h2, h3) [B, 3H]).
    """
    cs, hs, zs = carry
    new_c, new_h, new_z = [], [], []
    h_below, z_below = x_emb, None
    for l in range(L):
        n = str(l + 1)
        s = h_below @ P["W" + n]
        if z_below is not None:            # layer 1: zb = 1, so the product is skipped
            s = z_below * s
        s = s + hs[l] @ P["U" + n]
        if l < L - 1:
            s = s + zs[l] * (hs[l + 1] @ P["Td" + n])
        s = s + P["b" + n]
        zflag = _flag(O, zs[l], soft)
        zbflag = O.ones_like(zflag) if z_below is None else _flag(O, z_below, soft)
        c, h, z = pointwise(zflag, zbflag, cs[l], hs[l], s)
        new_c.append(c)
        new_h.append(h)
        new_z.append(z)
        h_below, z_below = h, z
    return (tuple(new_c), tuple(new_h), tuple(new_z)), O.cat(new_h, 1)


def hm_loss(O, P, tokens, a, pointwise=None, soft=False):
    """Mean cross-entropy (nats) of the model over tokens [T+1, B] (targets = next token).

    P: dict name -> array (see PARAM_NAMES).  pointwise: optional replacement for the elementwise
    step function with signature (zflag, zbflag, c, h, s) -> (c, h, z), e.g. a torch.compile'd one.
    """
    if pointwise is None:
        def pointwise(zf, zbf, c, h, s):
            return hm_pointwise(O, zf, zbf, c, h, s, a, soft)
    T = tokens.shape[0] - 1
    B = tokens.shape[1]
    H = P["E"].shape[1]
    emb = O.take_rows(P["E"], tokens[0:T])                 # [T, B, H]
    zh = O.zeros((B, H), P["E"])
    zz = O.zeros((B, 1), P["E"])
    carry0 = ((zh, zh, zh), (zh, zh, zh), (zz, zz, zz))

    def body(carry, x):
        return hm_step(O, P, a, pointwise, carry, x, soft)
    _, hcat = O.scan(body, carry0, emb)                    # [T, B, 3H]
    logits = O.reshape(hcat, (T * B, 3 * H)) @ P["Wout"] + P["bout"]
    return O.xent_mean(logits, O.reshape(tokens[1:T + 1], (T * B,)))
