"""Self-test of the peer harness: `python3 experiments/peers/selftest.py`.

It drives peers.py from outside (imports of the shared modules, and peers.py's command line as a
subprocess); peers.py does not import it.

numpy only.  Checks
  * the hand-written reference (reference.py) against the backend-generic code (hmlstm.py run on
    npad) and against finite differences, for workloads a, b and e;
  * the validation-directory writer/loader and the comparison logic (a tiny directory written
    with the reference, accepted; corrupted copies, rejected);
  * the command line (bad options exit 2, a full run with the numpy test double, skip records);
  * every installed framework (torch eager / compile, jax, jax_remat; on the CPU if no GPU) on the
    tiny directory.  Frameworks that are not installed are reported as skipped.
Ends with the line 'N passed, N failed, N skipped'; exit status 1 if anything failed.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import hmlstm  # noqa: E402
import npad  # noqa: E402
import reference as R  # noqa: E402
import valdir as VD  # noqa: E402
from hmlstm import PARAM_NAMES  # noqa: E402

O = npad.NPOps
RESULTS = {"passed": 0, "failed": 0, "skipped": 0}


class Skip(Exception):
    pass


def test(fn):
    name = fn.__name__
    try:
        info = fn()
        RESULTS["passed"] += 1
        print("PASS %s%s" % (name, (": " + info) if info else ""), flush=True)
    except Skip as s:
        RESULTS["skipped"] += 1
        print("SKIP %s: %s" % (name, s), flush=True)
    except Exception as exc:
        RESULTS["failed"] += 1
        print("FAIL %s: %s: %s" % (name, type(exc).__name__, exc), flush=True)
        traceback.print_exc()
    return fn


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def relmax(got, want):
    return VD.array_rel_err(got, want)


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
def cell_generic(workload, x64):
    """Gradients of sum(adj * out) by the generic code on npad (float64)."""
    spec = R.CELL_SPEC[workload]
    vs = {k: npad.Var(x64[k]) for k in spec["diff"]}
    if workload == "a":
        out = hmlstm.cell_a(O, x64["z"], x64["zb"], *[vs[k] for k in spec["diff"]])
        seed = out * x64["adj"]
    else:
        c, h = hmlstm.cell_b(O, x64["z"], x64["zb"], *[vs[k] for k in spec["diff"]])
        seed = c * x64["adj_c"] + h * x64["adj_h"]
    total = npad.reshape(seed, (1, -1)) @ np.ones((seed.shape[0] * seed.shape[1], 1))
    npad.backward(total)
    return {k: vs[k].grad for k in spec["diff"]}


def cell_objective(workload, x):
    if workload == "a":
        out = R.ref_cell_a(x["z"], x["zb"], x["c"], x["f"], x["i"], x["g"], x["adj"])[0]
        return float(np.sum(out * x["adj"]))
    c, h, _ = R.ref_cell_b(x["z"], x["zb"], x["c"], x["h"], x["f"], x["i"], x["o"], x["g"],
                           x["adj_c"], x["adj_h"])
    return float(np.sum(c * x["adj_c"] + h * x["adj_h"]))


def e_problem(H=5, B=3, T=6, V=7, seed=3, scale=1.0):
    P = {k: v.astype(np.float64) for k, v in R.init_e_params(H, V, seed, scale=scale).items()}
    return P, R.gen_tokens(T, B, V, seed + 1)


def write_tiny_valdir(path, seed=5, dims=24, H=8, B=4, T=10, V=64, a=1.0, only=("a", "b", "e")):
    """A validation directory in the driver's format, filled by the numpy reference."""
    arrays, scalars = {}, {}
    for w in ("a", "b"):
        if w not in only:
            continue
        x = R.gen_cell_inputs(w, dims, seed)
        g = R.ref_cell(w, x)
        for k, v in x.items():
            arrays["%s_%s" % (w, k)] = v
        for k, v in g.items():
            arrays["%s_grad_%s" % (w, k)] = v.astype(np.float32)
    if "e" in only:
        P = R.init_e_params(H, V, seed, scale=0.5)
        tokens = R.gen_tokens(T, B, V, seed)
        loss, G = R.ref_e(P, tokens, a)
        for k in PARAM_NAMES:
            arrays["e_" + k] = P[k]
        arrays["e_tokens"] = tokens
        scalars.update({"e_loss": loss, "e_slope": a, "e_H": H, "e_B": B, "e_T": T})
        for k, v in R.grad_norms(G).items():
            scalars["e_gradnorm_" + k] = v
    VD.write_valdir(path, arrays, scalars)
    return path


# --------------------------------------------------------------------------------------------
# reference tests
# --------------------------------------------------------------------------------------------
@test
def cell_reference_vs_generic_code():
    worst = 0.0
    for w in ("a", "b"):
        x = R.gen_cell_inputs(w, 16, 1)
        x64 = {k: v.astype(np.float64) for k, v in x.items()}
        want = R.ref_cell(w, x)
        got = cell_generic(w, x64)
        for k in want:
            check(np.abs(want[k]).max() > 0 or k == "h", "%s: gradient %s is all zero" % (w, k))
            worst = max(worst, relmax(got[k], want[k]))
    check(worst < 1e-13, "max rel err %.2e" % worst)
    return "max rel err %.1e" % worst


@test
def cell_reference_vs_finite_differences():
    rng = np.random.default_rng(0)
    worst = 0.0
    for w in ("a", "b"):
        x = {k: v.astype(np.float64) for k, v in R.gen_cell_inputs(w, 12, 2).items()}
        G = R.ref_cell(w, x)
        for k in R.CELL_SPEC[w]["diff"]:
            for r in (0, 1, 2, 3, 7, 11):
                col = int(rng.integers(0, 12))
                eps = 1e-6
                xp = {q: v.copy() for q, v in x.items()}
                xm = {q: v.copy() for q, v in x.items()}
                xp[k][r, col] += eps
                xm[k][r, col] -= eps
                fd = (cell_objective(w, xp) - cell_objective(w, xm)) / (2 * eps)
                worst = max(worst, abs(fd - G[k][r, col]) / max(1.0, np.abs(G[k]).max()))
    check(worst < 1e-7, "max err %.2e" % worst)
    return "max err %.1e" % worst


@test
def cell_forced_rows():
    x = {k: v.astype(np.float64) for k, v in R.gen_cell_inputs("b", 8, 3).items()}
    check(x["z"][0, 0] == 1 and x["z"][1, 0] == 0 and x["zb"][1, 0] == 0
          and x["z"][2, 0] == 0 and x["zb"][2, 0] == 1, "rows 0-2 not FLUSH/COPY/UPDATE")
    g = R.ref_cell("b", x)
    check(np.all(g["c"][0] == 0) and np.all(g["f"][0] == 0) and np.all(g["h"][0] == 0), "FLUSH row")
    check(np.all(g["c"][1] == x["adj_c"][1]) and np.all(g["h"][1] == x["adj_h"][1])
          and np.all(g["i"][1] == 0) and np.all(g["o"][1] == 0), "COPY row")
    check(np.all(g["f"][2] != 0) and np.all(g["h"][2] == 0), "UPDATE row")
    xa = R.gen_cell_inputs("a", 8, 3)
    check(xa["z"][0, 0] == 1 and xa["zb"][1, 0] == 0 and xa["zb"][2, 0] == 1, "workload a rows")


@test
def model_manual_bptt_vs_generic_code():
    P, tok = e_problem()
    worst = 0.0
    for soft in (False, True):
        l1, G1 = R.ref_e(P, tok, 1.0, soft)
        l2, G2 = npad.value_and_grad(lambda Pv: hmlstm.hm_loss(O, Pv, tok, 1.0, soft=soft), P)
        worst = max(worst, abs(l1 - l2) / abs(l1), max(relmax(G2[k], G1[k]) for k in PARAM_NAMES))
    # a second shape and slope
    P, tok = e_problem(H=4, B=5, T=9, V=11, seed=8, scale=0.7)
    l1, G1 = R.ref_e(P, tok, 2.5)
    l2, G2 = npad.value_and_grad(lambda Pv: hmlstm.hm_loss(O, Pv, tok, 2.5), P)
    worst = max(worst, abs(l1 - l2) / abs(l1), max(relmax(G2[k], G1[k]) for k in PARAM_NAMES))
    check(worst < 1e-12, "max rel err %.2e" % worst)
    return "STE and soft modes, max rel err %.1e" % worst


@test
def model_soft_mode_vs_finite_differences():
    P, tok = e_problem()
    _, G = R.ref_e(P, tok, 1.0, soft=True)
    rng = np.random.default_rng(1)
    worst = 0.0
    for k in PARAM_NAMES:
        for _ in range(5):
            idx = tuple(int(rng.integers(0, n)) for n in P[k].shape)
            eps = 1e-6
            Pp = {q: v.copy() for q, v in P.items()}
            Pm = {q: v.copy() for q, v in P.items()}
            Pp[k][idx] += eps
            Pm[k][idx] -= eps
            fd = (R.ref_e(Pp, tok, 1.0, True)[0] - R.ref_e(Pm, tok, 1.0, True)[0]) / (2 * eps)
            worst = max(worst, abs(fd - G[k][idx]) / max(1e-3, np.abs(G[k]).max()))
    check(worst < 1e-5, "max err %.2e" % worst)
    return "70 entries, max err %.1e" % worst


@test
def model_branch_coverage():
    out = []
    for (H, B, T, V, seed, scale) in ((5, 3, 6, 7, 3, 1.0), (16, 4, 12, 64, 7, 0.5)):
        P, tok = e_problem(H, B, T, V, seed, scale)
        _, _, st = R.ref_e(P, tok, 1.0, return_stats=True)
        for l in (1, 2):
            for br in ("flush", "copy", "update"):
                check(st[br][l] > 0, "layer %d never took %s in problem H=%d: %s" % (l + 1, br, H, st))
        out.append(str(st))
    # the problem peers.py checks every method against must cover every branch too
    import checks
    Pc, tokc, _, _ = checks.e_check_problem(64, 1.0, 0)
    _, _, st = R.ref_e(Pc, tokc, 1.0, return_stats=True)
    for l in (1, 2):
        for br in ("flush", "copy", "update"):
            check(st[br][l] > 0, "checks.e_check_problem: layer %d never took %s: %s" % (l + 1, br, st))
    return "; ".join(out)


@test
def model_ste_structure():
    P, tok = e_problem()
    _, G = R.ref_e(P, tok, 1.0)
    H = P["E"].shape[1]
    for k in ("W3", "U3"):
        check(np.all(G[k][:, 4 * H] == 0), "%s boundary column should get no gradient" % k)
    check(G["b3"][4 * H] == 0, "b3 boundary entry should get no gradient")
    check(np.abs(G["W1"][:, 4 * H]).max() > 0 and np.abs(G["W2"][:, 4 * H]).max() > 0,
          "layers 1 and 2 boundary columns should get the straight-through gradient")
    # STE forward values are exactly 0/1 in float32 too
    Pf = {k: v.astype(np.float32) for k, v in P.items()}
    zs = []

    def pw(zf, zbf, c, h, s):
        r = hmlstm.hm_pointwise(O, zf, zbf, c, h, s, 1.0)
        zs.append(np.asarray(r[2].value))
        return r
    hmlstm.hm_loss(O, {k: npad.Var(v) for k, v in Pf.items()}, tok, 1.0, pointwise=pw)
    allz = np.concatenate([z.ravel() for z in zs])
    check(np.all((allz == 0) | (allz == 1)), "STE forward values not exactly 0/1")
    check(0 < allz.mean() < 1, "boundaries all equal")


# --------------------------------------------------------------------------------------------
# validation directory
# --------------------------------------------------------------------------------------------
TMP = tempfile.mkdtemp(prefix="peers_selftest_")
TINY = write_tiny_valdir(os.path.join(TMP, "tiny"))


@test
def valdir_roundtrip():
    d = os.path.join(TMP, "rt")
    a = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    t = np.arange(6, dtype=np.int32).reshape(2, 3) - 2
    VD.write_valdir(d, {"x": a, "t": t}, {"s": 1.5, "n": 3})
    v = VD.ValDir(d)
    check(np.array_equal(v.array("x"), a) and v.array("x").dtype == np.float32, "float32 array")
    check(np.array_equal(v.array("t"), t) and v.array("t").dtype == np.int32, "int32 array")
    check(v.scalar("s") == 1.5 and v.scalar("n") == 3, "scalars")
    m = json.load(open(os.path.join(d, "manifest.json")))
    check(m["arrays"]["x"] == {"file": "x.bin", "shape": [3, 4], "dtype": "float32"}, "manifest entry")
    check(os.path.getsize(os.path.join(d, "x.bin")) == 48, "raw size")
    # a file whose size disagrees with its shape is refused
    m["arrays"]["x"]["shape"] = [4, 4]
    json.dump(m, open(os.path.join(d, "manifest.json"), "w"))
    try:
        VD.ValDir(d).array("x")
        raise AssertionError("size mismatch not detected")
    except ValueError:
        pass
    try:
        VD.ValDir(os.path.join(TMP, "nope"))
        raise AssertionError("missing manifest not detected")
    except ValueError:
        pass


@test
def valdir_tiny_contents():
    v = VD.ValDir(TINY)
    check(v.has_cell("a") and v.has_cell("b") and v.has_model(), "tiny dir incomplete")
    ins, g = v.cell("b")
    check(ins["c"].shape == (24, 24) and set(g) == {"c", "h", "f", "i", "o", "g"}, "b arrays")
    P, tok, a, loss, norms = v.model()
    check(tok.shape == (11, 4) and P["W1"].shape == (8, 33) and len(norms) == 14, "e arrays")


@test
def comparison_logic():
    w = np.array([[1.0, -2.0], [0.5, 0.0]])
    check(VD.array_rel_err(w, w) == 0.0, "equal")
    check(abs(VD.array_rel_err(w + [[0, 0], [0, 2e-4]], w) - 1e-4) < 1e-12, "normwise")
    check(VD.array_rel_err(w[:1], w) == float("inf"), "shape mismatch")
    check(VD.array_rel_err(w * np.nan, w) == float("inf"), "nan")
    check(VD.scalar_rel_err(1.01, 1.0) > 9e-3, "scalar")
    ok, err, _ = VD.summarize({"x": 1e-6, "y": 2e-5}, 1e-4, "t")
    check(ok is True and err == 2e-5, "summarize ok")
    ok, err, txt = VD.summarize({"x": 1e-6, "y": 2e-3}, 1e-4, "t")
    check(ok is False and "y" in txt, "summarize fail")


def numpy_backend():
    import peer_numpy
    return peer_numpy.Backend("numpy", {"allow_cpu": True})


@test
def validation_accepts_correct_results():
    import checks
    be = numpy_backend()
    vd = VD.ValDir(TINY)
    out = []
    for w in ("a", "b"):
        ok, err, txt = checks.check_cell_dir(be, w, vd, 1e-4)
        check(ok is True, txt)
        out.append("%s %.1e" % (w, err))
    ok, err, txt = checks.check_model_dir(be, vd, 0.1, 1e-3)
    check(ok is True, txt)
    out.append("e(dir) %.1e" % err)
    ok, err, txt = checks.check_model_ref(be, 64, 1.0, 0.1, 0, 1e-3)
    check(ok is True, txt)
    out.append("e(ref) %.1e" % err)
    return ", ".join(out)


@test
def validation_rejects_wrong_results():
    import checks
    be = numpy_backend()
    # a: one corrupted gradient entry
    bad = os.path.join(TMP, "bad")
    shutil.copytree(TINY, bad)
    g = np.fromfile(os.path.join(bad, "a_grad_f.bin"), "<f4")
    g[37] += 0.05 * np.abs(g).max()
    g.tofile(os.path.join(bad, "a_grad_f.bin"))
    ok, err, txt = checks.check_cell_dir(be, "a", VD.ValDir(bad), 1e-4)
    check(ok is False and "(f)" in txt, "corrupted a_grad_f accepted: " + txt)
    # e: a wrong loss, then a wrong gradient norm
    m = json.load(open(os.path.join(bad, "manifest.json")))
    m["scalars"]["e_loss"] *= 1.01
    json.dump(m, open(os.path.join(bad, "manifest.json"), "w"))
    ok, err, txt = checks.check_model_dir(be, VD.ValDir(bad), 0.1, 1e-3)
    check(ok is False and "loss" in txt, "wrong e_loss accepted: " + txt)
    m["scalars"]["e_loss"] /= 1.01
    m["scalars"]["e_gradnorm_Td2"] *= 1.01
    json.dump(m, open(os.path.join(bad, "manifest.json"), "w"))
    ok, err, txt = checks.check_model_dir(be, VD.ValDir(bad), 0.1, 1e-3)
    check(ok is False and "Td2" in txt, "wrong gradnorm accepted: " + txt)
    # a different slope in the manifest changes the answer (the slope is read, not assumed)
    m["scalars"]["e_gradnorm_Td2"] /= 1.01
    a_slope = m["scalars"]["e_slope"]
    m["scalars"]["e_slope"] = 3.0
    json.dump(m, open(os.path.join(bad, "manifest.json"), "w"))
    ok, err, txt = checks.check_model_dir(be, VD.ValDir(bad), 0.1, 1e-3)
    check(ok is False, "e_slope ignored: " + txt)
    # a non-finite loss, as the C++ writer writes it (null): read as NaN, a failure (not a crash)
    m["scalars"]["e_slope"] = a_slope
    m["scalars"]["e_loss"] = None
    json.dump(m, open(os.path.join(bad, "manifest.json"), "w"))
    check(np.isnan(VD.ValDir(bad).scalar("e_loss")), "null scalar not read as NaN")
    ok, err, txt = checks.check_model_dir(be, VD.ValDir(bad), 0.1, 1e-3)
    check(ok is False and "loss" in txt, "null e_loss accepted: " + txt)


@test
def validation_missing_workload():
    import checks
    d = write_tiny_valdir(os.path.join(TMP, "only_a"), only=("a",))
    be = numpy_backend()
    vd = VD.ValDir(d)
    ok, err, txt = checks.check_cell_dir(be, "b", vd, 1e-4)
    check(ok is None and "no arrays" in txt, txt)
    ok, err, txt = checks.check_model_dir(be, vd, 0.1, 1e-3)
    check(ok is None and "no arrays" in txt, txt)


# --------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------
PEERS = os.path.join(HERE, "peers.py")


def cli(*argv):
    p = subprocess.run([sys.executable, PEERS] + list(argv), capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout, p.stderr


@test
def cli_help_documents_every_option():
    rc, out, _ = cli("--help")
    check(rc == 0, "rc %d" % rc)
    for opt in ("--workloads", "--dims", "--methods", "--reps", "--warmup", "--validate", "--out",
                "--quick", "--e-hidden", "--e-batch", "--e-seq", "--e-vocab", "--e-slope", "--e-lr",
                "--sets", "--seed", "--rtol-cell", "--rtol-model", "--no-refcheck", "--compile-mode",
                "--allow-cpu", "--strict", "--append"):
        check(opt in out, "--help does not mention " + opt)


@test
def cli_bad_options_exit_2():
    cases = [("--workloads", "a,x"), ("--dims", "512,0"), ("--dims", "abc"), ("--methods", "tf"),
             ("--reps", "0"), ("--warmup", "-1"), ("--e-slope", "nan"), ("--bogus",),
             ("--validate", os.path.join(TMP, "does-not-exist")),
             ("--append", "--out", os.path.join(TMP, "tiny", "manifest.json"))]
    for argv in cases:
        rc, out, err = cli(*argv)
        check(rc == 2, "%s: rc %d" % (" ".join(argv), rc))
        check("error" in err, "%s: no error message: %r" % (" ".join(argv), err[-200:]))
    return "%d cases" % len(cases)


@test
def cli_end_to_end_numpy_double():
    out_json = os.path.join(TMP, "e2e.json")
    rc, out, err = cli("--methods", "numpy", "--allow-cpu", "--dims", "32,40", "--e-hidden", "8",
                       "--e-batch", "4", "--e-seq", "6", "--reps", "3", "--warmup", "1",
                       "--validate", TINY, "--out", out_json, "--strict")
    check(rc == 0, "rc %d\n%s\n%s" % (rc, out[-2000:], err[-2000:]))
    recs = json.load(open(out_json))
    check(len(recs) == 5, "expected 5 records, got %d" % len(recs))
    keys = {"workload", "method", "phase", "median_ms", "p10_ms", "p90_ms", "reps", "validated",
            "max_rel_err", "note"}
    for r in recs:
        check(keys <= set(r), "record lacks %s" % (keys - set(r)))
        check(r["validated"] is True, "not validated: %s" % r["note"])
        check(r["median_ms"] > 0 and r["p10_ms"] <= r["median_ms"] <= r["p90_ms"] and r["reps"] == 3,
              "timing fields")
        check(("config" in r) if r["workload"] == "e" else ("dims" in r), "dims/config")
        check(r["phase"] == ("step" if r["workload"] == "e" else "fwd+bwd"), "phase")
        check("vs dualcast" in r["note"] and "vs numpy ref" in r["note"], "note: " + r["note"])
    check(out.count("[numpy] a dims=") == 2 and "[numpy] e H=8" in out, "progress lines")


@test
def cli_missing_frameworks_are_skipped():
    out_json = os.path.join(TMP, "skip.json")
    rc, out, err = cli("--methods", "eager,compile,jax", "--workloads", "a,e", "--dims", "64",
                       "--e-hidden", "8", "--e-batch", "2", "--e-seq", "3", "--reps", "2",
                       "--warmup", "1", "--out", out_json)
    check(rc == 0, "rc %d: %s" % (rc, err[-1500:]))
    recs = json.load(open(out_json))
    check(len(recs) == 6, "expected 6 records, got %d" % len(recs))
    lines = [ln for ln in out.splitlines() if "skipped" in ln]
    return "; ".join(lines) if lines else "all frameworks present"


# --------------------------------------------------------------------------------------------
# the real peers, where installed
# --------------------------------------------------------------------------------------------
def framework_test(method):
    def fn():
        import checks
        be, skip = checks.load_backend(method, {"allow_cpu": True, "compile_mode": "default"})
        if be is None:
            raise Skip(skip)
        vd = VD.ValDir(TINY)
        out = [be.describe()]
        for w in ("a", "b"):
            ok, err, txt = checks.check_cell_dir(be, w, vd, 1e-4)
            check(ok is True, txt)
            out.append("%s %.1e" % (w, err))
            sess = be.cell_session(w, [R.gen_cell_inputs(w, 40, 9)])
            ok, err, txt = checks.check_cell_ref(sess, w, R.gen_cell_inputs(w, 40, 9), 1e-4)
            check(ok is True, txt)
            tm = sess.time(2, 1)
            check(len(tm["times_ms"]) == 2, "timing")
            del sess
            be.end_config()
        ok, err, txt = checks.check_model_dir(be, vd, 0.1, 1e-3)
        check(ok is True, txt)
        out.append("e(dir) %.1e" % err)
        ok, err, txt = checks.check_model_ref(be, 64, 1.0, 0.1, 0, 1e-3)
        check(ok is True, txt)
        out.append("e(ref) %.1e" % err)
        P, tok, _, _ = checks.e_check_problem(64, 1.0, 0)
        sess = be.model_session(P, [tok], 1.0, 0.1)
        l0, _ = sess.loss_and_grads()
        tm = sess.time(2, 1)
        l1, _ = sess.loss_and_grads()
        check(l1 < l0, "SGD steps did not lower the loss on a fixed batch (%.6f -> %.6f)" % (l0, l1))
        be.end_config()
        return ", ".join(out)
    fn.__name__ = "framework_" + method
    return fn


for _m in ("numpy", "eager", "compile", "torch_dualcast", "jax", "jax_remat"):
    test(framework_test(_m))


def main():
    shutil.rmtree(TMP, ignore_errors=True)
    line = "%d passed, %d failed" % (RESULTS["passed"], RESULTS["failed"])
    if RESULTS["skipped"]:
        line += ", %d skipped" % RESULTS["skipped"]
    print(line, flush=True)
    return 1 if RESULTS["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
