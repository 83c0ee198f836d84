"""Reading and writing validation directories, and the error measures used to compare results.

Format (written by dualcast's C++ driver; selftest.py writes one with the numpy reference):
  DIR/manifest.json = {"arrays":  {"name": {"file": "name.bin", "shape": [..],
                                            "dtype": "float32" | "int32"}},
                       "scalars": {"name": value}}
  each .bin: raw little-endian C-order data. A scalar null is NaN (the C++ writer writes strict
  JSON, where a non-finite number is null); NaN as Python's json writes it is read as well.
"""

import json
import os

import numpy as np

from hmlstm import PARAM_NAMES
from reference import CELL_SPEC

_DTYPES = {"float32": "<f4", "int32": "<i4", "float64": "<f8", "int64": "<i8"}
_NATIVE = {"float32": np.float32, "int32": np.int32, "float64": np.float64, "int64": np.int64}


class ValDir:
    """A loaded validation directory (arrays are read lazily)."""

    def __init__(self, path):
        self.path = path
        mpath = os.path.join(path, "manifest.json")
        if not os.path.isfile(mpath):
            raise ValueError("validate dir %r has no manifest.json" % path)
        with open(mpath) as fh:
            m = json.load(fh)
        if not isinstance(m, dict):
            raise ValueError("%s: top level must be an object" % mpath)
        self.arrays_meta = m.get("arrays", {}) or {}
        self.scalars = {k: (float("nan") if v is None else v)
                        for k, v in (m.get("scalars", {}) or {}).items()}
        self._cache = {}

    def has(self, *names):
        return all(n in self.arrays_meta for n in names)

    def array(self, name):
        if name in self._cache:
            return self._cache[name]
        if name not in self.arrays_meta:
            raise KeyError("validate dir %s: no array %r" % (self.path, name))
        meta = self.arrays_meta[name]
        dt = meta.get("dtype", "float32")
        if dt not in _DTYPES:
            raise ValueError("array %r: unsupported dtype %r" % (name, dt))
        shape = tuple(int(s) for s in meta["shape"])
        fpath = os.path.join(self.path, meta.get("file", name + ".bin"))
        data = np.fromfile(fpath, dtype=np.dtype(_DTYPES[dt]))
        n = int(np.prod(shape)) if shape else 1
        if data.size != n:
            raise ValueError("array %r: %s holds %d values, shape %s needs %d"
                             % (name, fpath, data.size, list(shape), n))
        arr = data.reshape(shape).astype(_NATIVE[dt])
        self._cache[name] = arr
        return arr

    def scalar(self, name, default=None):
        return self.scalars.get(name, default)

    # ---- workload-level accessors ------------------------------------------------------------
    def cell_names(self, workload):
        spec = CELL_SPEC[workload]
        ins = [workload + "_" + n for n in spec["flags"] + spec["diff"] + spec["adj"]]
        grads = [workload + "_grad_" + n for n in spec["diff"]]
        return ins, grads

    def has_cell(self, workload):
        ins, grads = self.cell_names(workload)
        return self.has(*ins, *grads)

    def cell(self, workload):
        """(inputs dict in gen_cell_inputs naming, expected gradients dict) for 'a' or 'b'."""
        spec = CELL_SPEC[workload]
        inputs = {n: self.array(workload + "_" + n).astype(np.float32)
                  for n in spec["flags"] + spec["diff"] + spec["adj"]}
        for n in spec["flags"]:            # per-row flags: accept [dims] as well as [dims, 1]
            if inputs[n].ndim == 1:
                inputs[n] = inputs[n].reshape(-1, 1)
        grads = {n: self.array(workload + "_grad_" + n) for n in spec["diff"]}
        return inputs, grads

    def has_model(self):
        return self.has("e_tokens", *["e_" + p for p in PARAM_NAMES]) and "e_loss" in self.scalars

    def model(self):
        """(params dict, tokens int32 [T+1, B], slope a, expected loss, expected grad norms dict)."""
        P = {p: self.array("e_" + p).astype(np.float32) for p in PARAM_NAMES}
        tokens = self.array("e_tokens").astype(np.int32)
        a = float(self.scalars.get("e_slope", 1.0))
        norms = {}
        for p in PARAM_NAMES:
            for key in ("e_gradnorm_" + p, "e_gradnorm_e_" + p):
                if key in self.scalars:
                    norms[p] = float(self.scalars[key])
                    break
        for k, want in (("e_H", P["E"].shape[1]), ("e_T", tokens.shape[0] - 1), ("e_B", tokens.shape[1])):
            if k in self.scalars and int(self.scalars[k]) != want:
                raise ValueError("validate dir: scalar %s = %s disagrees with array shapes (%d)"
                                 % (k, self.scalars[k], want))
        return P, tokens, a, float(self.scalars["e_loss"]), norms


def write_valdir(path, arrays, scalars):
    """Write arrays (name -> ndarray of float32/int32) and scalars into a validation directory."""
    os.makedirs(path, exist_ok=True)
    meta = {}
    for name, arr in arrays.items():
        arr = np.asarray(arr)
        if arr.dtype.kind == "f":
            arr, dt = arr.astype("<f4"), "float32"
        elif arr.dtype.kind in "iu":
            arr, dt = arr.astype("<i4"), "int32"
        else:
            raise ValueError("array %r: dtype %s not supported" % (name, arr.dtype))
        fname = name + ".bin"
        np.ascontiguousarray(arr).tofile(os.path.join(path, fname))
        meta[name] = {"file": fname, "shape": list(arr.shape), "dtype": dt}
    with open(os.path.join(path, "manifest.json"), "w") as fh:
        json.dump({"arrays": meta, "scalars": {k: (float(v) if not isinstance(v, (int, bool)) else v)
                                               for k, v in scalars.items()}}, fh, indent=1)


# --------------------------------------------------------------------------------------------
# error measures
# --------------------------------------------------------------------------------------------
def array_rel_err(got, want):
    """max |got - want| / max |want|  (normwise in the max norm; robust to near-zero entries).
    Returns inf on a shape mismatch or on non-finite values in got."""
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf")
    if not np.all(np.isfinite(got)):
        return float("inf")
    den = float(np.max(np.abs(want))) if want.size else 0.0
    num = float(np.max(np.abs(got - want))) if want.size else 0.0
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def scalar_rel_err(got, want):
    got, want = float(got), float(want)
    if not (np.isfinite(got) and np.isfinite(want)):   # a NaN reference matches nothing
        return float("inf")
    if want == 0.0:
        return abs(got)
    return abs(got - want) / abs(want)


def compare_dicts(got, want, kind="array"):
    """Per-key relative errors of dict got vs dict want (keys of want).  Missing key -> inf."""
    f = array_rel_err if kind == "array" else scalar_rel_err
    return {k: (f(got[k], want[k]) if k in got else float("inf")) for k in want}


def summarize(errs, rtol, label):
    """(ok, max_err, text) for a dict of errors."""
    if not errs:
        return None, None, "%s: nothing to compare" % label
    worst_k = max(errs, key=lambda k: errs[k])
    worst = errs[worst_k]
    ok = bool(worst <= rtol)
    return ok, worst, "%s: max rel err %.2e (%s) %s rtol %.0e" % (
        label, worst, worst_k, "<=" if ok else ">", rtol)
