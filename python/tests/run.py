#!/usr/bin/env python3
"""Runs the Python package's tests (python/tests/test_*.py), each test_* function in turn, without
pytest (the CI machines have none; `pytest python/tests` runs the same files where it is installed).
A module that needs PyTorch skips itself, with a message, where PyTorch is missing. Kernels compile into a fresh cache folder unless
DUALCAST_CACHE_DIR is set.

    python3 python/tests/run.py [-k SUBSTRING] [--module test_NAME]

--module runs one file's tests only: ctest registers each file as a test of its own
(python.package.test_NAME), so that they run side by side (the GPU machine's whole suite spent
245 of its 249 s of ctest in the one python.package test that ran them all in turn).

Prints "python tests: all N passed (S skipped)" on success; exit status 1 on a failure.
"""
import argparse
import faulthandler
import importlib
import os
import shutil
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    # A crash in compiled code (dualcast._core, a CUDA library) then prints the Python stack of the
    # test it happened in, and every line before it is out (ctest's log is a file: stdout is
    # block-buffered there).
    faulthandler.enable()
    sys.stdout.reconfigure(line_buffering=True)
    ap = argparse.ArgumentParser()
    ap.add_argument("-k", default="", help="run only the tests whose name contains this")
    ap.add_argument("--module", default="", help="run only the tests of this file (test_NAME, without .py)")
    args = ap.parse_args()
    # The compiled launcher (dualcast.native) built before the first call, so that every call after a
    # signature's first takes it where it builds: the tests see one path, not a race with the build.
    os.environ.setdefault("DUALCAST_NATIVE", "wait")
    own_cache = None
    if not os.environ.get("DUALCAST_CACHE_DIR"):
        own_cache = tempfile.mkdtemp(prefix="dualcast-jit-")
        os.environ["DUALCAST_CACHE_DIR"] = own_cache
    try:
        return run_all(args)
    finally:
        if own_cache:
            shutil.rmtree(own_cache, ignore_errors=True)


def run_all(args):
    sys.path.insert(0, HERE)
    from skip import Skip
    passed, skipped, failed = 0, 0, []
    names = sorted(f[:-3] for f in os.listdir(HERE) if f.startswith("test_") and f.endswith(".py"))
    if args.module:
        if args.module not in names:
            print("python tests: no file %s.py in %s (there are: %s)" % (args.module, HERE, ", ".join(names)))
            return 1
        names = [args.module]
    for name in names:
        try:
            mod = importlib.import_module(name)
        except Skip as e:
            print("SKIP %s: %s" % (name, e))
            skipped += 1
            continue
        for test in sorted(t for t in dir(mod) if t.startswith("test_") and args.k in t):
            try:
                getattr(mod, test)()
            except Skip as e:
                print("SKIP %s.%s: %s" % (name, test, e))
                skipped += 1
            except Exception:  # noqa: BLE001 - a test's failure of any kind is reported, not raised
                failed.append("%s.%s" % (name, test))
                print("FAIL %s.%s\n%s" % (name, test, traceback.format_exc()))
            else:
                print("ok   %s.%s" % (name, test))
                passed += 1
    if failed:
        print("python tests: %d failed: %s" % (len(failed), ", ".join(failed)))
        return 1
    print("python tests: all %d passed (%d skipped)" % (passed, skipped))
    return 0


if __name__ == "__main__":
    sys.exit(main())
