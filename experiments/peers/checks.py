"""What peers.py and selftest.py share: loading a framework's backend, and the checks that validate
a peer before it is timed (against the driver's validation directory and against the numpy float64
reference). A module of its own so that neither imports the other."""

import reference as R
import valdir as VD
from hmlstm import PARAM_NAMES

FRAMEWORK = {"eager": "torch", "compile": "torch", "torch_dualcast": "torch", "jax": "jax", "jax_remat": "jax", "numpy": "numpy",
             "numpy_hand": "numpy"}
REF_ROWS = 64                    # rows of each timing input checked against the numpy reference
E_CHECK = {"H": 16, "B": 4, "T": 12}   # small model checked against the numpy reference


def load_backend(method, opts):
    """(backend, None) or (None, 'skipped: ...')."""
    fw = FRAMEWORK[method]
    try:
        if fw == "torch":
            import peer_torch as mod
        elif fw == "jax":
            import peer_jax as mod
        else:
            import peer_numpy as mod
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top in ("torch", "jax", "jaxlib"):
            return None, "skipped: %s not installed" % top
        return None, "skipped: importing %s failed: %s" % (fw, exc)
    except Exception as exc:
        return None, "skipped: importing %s failed: %s: %s" % (fw, type(exc).__name__, exc)
    try:
        be = mod.Backend(method, opts)
    except Exception as exc:
        return None, "skipped: %s backend failed to start: %s: %s" % (fw, type(exc).__name__, exc)
    if be.skip_reason:
        return None, be.skip_reason
    return be, None


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------
def check_cell_dir(be, workload, vd, rtol):
    """Peer gradients on the driver's inputs vs the driver's gradients."""
    if vd is None:
        return None
    if not vd.has_cell(workload):
        return (None, None, "validate dir: no arrays for workload %s" % workload)
    inputs, want = vd.cell(workload)
    sess = be.cell_session(workload, [inputs])
    got = sess.grads()
    del sess
    be.end_config()
    n = inputs["c"].shape[0]
    return VD.summarize(VD.compare_dicts(got, want), rtol,
                        "vs dualcast %s(%dx%d)" % (vd.path, n, inputs["c"].shape[1]))


def check_cell_ref(sess, workload, host0, rtol):
    rows = slice(0, min(REF_ROWS, host0["c"].shape[0]))
    want = R.ref_cell(workload, host0, rows)
    got = sess.grads(rows)
    return VD.summarize(VD.compare_dicts(got, want), rtol, "vs numpy ref (rows 0-%d)" % (rows.stop - 1))


def check_model_dir(be, vd, lr, rtol):
    if vd is None:
        return None
    if not vd.has_model():
        return (None, None, "validate dir: no arrays for workload e")
    P, tokens, a, loss_want, norms_want = vd.model()
    sess = be.model_session(P, [tokens], a, lr)
    loss, g = sess.loss_and_grads()
    del sess
    be.end_config()
    norms = R.grad_norms(g)
    errs = {"loss": VD.scalar_rel_err(loss, loss_want)}
    errs.update({"|d%s|" % k: VD.scalar_rel_err(norms[k], v) for k, v in norms_want.items()})
    H, T, B = P["E"].shape[1], tokens.shape[0] - 1, tokens.shape[1]
    return VD.summarize(errs, rtol, "vs dualcast %s(H=%d,B=%d,T=%d; loss%s)"
                        % (vd.path, H, B, T, " + %d grad norms" % len(norms_want) if norms_want else ""))


_E_REF_CACHE = {}


def e_check_problem(V, a, seed):
    key = (V, a, seed)
    if key not in _E_REF_CACHE:
        H, B, T = E_CHECK["H"], E_CHECK["B"], E_CHECK["T"]
        P = R.init_e_params(H, V, seed + 7, scale=0.5)
        tokens = R.gen_tokens(T, B, V, seed + 7)
        loss, G = R.ref_e(P, tokens, a)
        _E_REF_CACHE[key] = (P, tokens, loss, G)
    return _E_REF_CACHE[key]


def check_model_ref(be, V, a, lr, seed, rtol):
    P, tokens, loss_want, G_want = e_check_problem(V, a, seed)
    sess = be.model_session(P, [tokens], a, lr)
    loss, g = sess.loss_and_grads()
    del sess
    be.end_config()
    errs = {"loss": VD.scalar_rel_err(loss, loss_want)}
    errs.update({"d" + k: VD.array_rel_err(g[k], G_want[k]) for k in PARAM_NAMES})
    return VD.summarize(errs, rtol, "vs numpy ref (H=%d,B=%d,T=%d; loss + all gradients)"
                        % (E_CHECK["H"], E_CHECK["B"], E_CHECK["T"]))
