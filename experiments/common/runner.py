"""runner.py: what the experiments' run.py scripts share (hmlstm, resnet, transformer): whether a GPU
is present, whether a build folder is a CUDA build, where a driver binary is, and which Python
interpreter has a module."""

import os
import shutil
import subprocess
import sys


def gpu_present():
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        r = subprocess.run([smi, "-L"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0 and b"GPU" in r.stdout


def is_cuda_build(build_dir):
    """A build configured with the CUDA backend (nvcc found and DUALCAST_ENABLE_CUDA not OFF)."""
    try:
        with open(os.path.join(build_dir, "CMakeCache.txt")) as fh:
            text = fh.read()
    except OSError:
        return False
    if "DUALCAST_ENABLE_CUDA:BOOL=OFF" in text:
        return False
    for line in text.splitlines():
        if line.startswith("CMAKE_CUDA_COMPILER:"):
            value = line.split("=", 1)[1].strip()
            return bool(value) and not value.endswith("NOTFOUND")
    return False


# Build folders searched for a driver when no --build is given: the CMake presets' folders first,
# then the names the READMEs' older recipes used.
BUILD_FOLDERS = ("build/release", "build/ci", "build/cpu-only", "build-exp-cuda", "build-cuda", "build", "build-exp",
                 "build-cpu")


def find_binary(root, rel, build, candidates, prefer_cuda):
    """The binary `rel` (relative to a build folder): under `build` when one is given (None if it is
    not there); else under the first of `candidates` (folders relative to `root`) that holds it,
    CUDA-enabled builds first when `prefer_cuda`."""
    if build:
        p = os.path.join(build, rel)
        return p if os.path.isfile(p) else None
    found = [os.path.join(root, b) for b in candidates if os.path.isfile(os.path.join(root, b, rel))]
    if prefer_cuda:
        found = [f for f in found if is_cuda_build(f)] + [f for f in found if not is_cuda_build(f)]
    return os.path.join(found[0], rel) if found else None


def python_with(module):
    """The first of this interpreter, python3 and /usr/bin/python3 that can import `module`, or None."""
    cands = [sys.executable, "python3", "/usr/bin/python3"]
    seen = set()
    for c in cands:
        if not c or c in seen:
            continue
        seen.add(c)
        exe = shutil.which(c) if not os.path.isabs(c) else c
        if not exe or not os.path.exists(exe):
            continue
        r = subprocess.run([exe, "-c", "import %s" % module], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if r.returncode == 0:
            return exe
    return None
