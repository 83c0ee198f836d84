#!/bin/bash
# Run h200-2026-11-29n: whether dualcast._core exporting its entry point only (commit d39eeac) ends
# the crash of `import torch` after it that h200-2026-11-29m found, then test_dlpack with and without
# the loader's torch-first order. On the device machine, from the repository root:
#   bash paper/measured/h200-2026-11-29n/run.sh dlpack
set -u
source scripts/device-run.sh "${1:?dlpack}"
case $1 in
dlpack)
  dr_build dualcast_core
  export DUALCAST_CORE_DIR=$PWD/$B/python/dualcast PYTHONPATH=$PWD/python
  so=$(ls $DUALCAST_CORE_DIR/_core*.so)
  nm -D --defined-only "$so" > "$R/exports.txt" 2>&1; echo "exports: $(wc -l < "$R/exports.txt") ($(head -3 "$R/exports.txt" | tr '\n' ' '))"
  for order in "import ctypes; ctypes.CDLL('$so'); import torch; print(torch.ops.aten.add)" \
               "from dualcast import core; import torch; print(torch.ops.aten.add, core.available())"; do
    DUALCAST_CORE_TORCH_FIRST=0 timeout 60 python3 -X faulthandler -c "$order" > "$R/o.txt" 2>&1
    echo "rc=$? [$order] $(grep -m1 -E 'Fatal|Error' "$R/o.txt") $(tail -c 120 "$R/o.txt" | tr '\n' ' ')"
  done
  for first in 1 0; do
    DUALCAST_CORE_TORCH_FIRST=$first DUALCAST_CORE_REQUIRED=1 timeout 120 python3 -X faulthandler \
      python/tests/run.py --module test_dlpack > "$R/test_dlpack_first$first.log" 2>&1
    echo "test_dlpack torch-first=$first rc=$? at $((SECONDS - t0)) s"; grep -v "^ok" "$R/test_dlpack_first$first.log" | tail -15
  done
  dr_pack ;;
esac
