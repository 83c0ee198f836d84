#!/bin/bash
# Run h200-2026-11-29m: the float32 products' search (src/blas_lt.cpp, on by default since commit
# 975be7f) measured in the HM-LSTM step, and dualcast._core's DLPack test after its pybind11 mend.
# Before it, on another fresh H200: `scripts/gpu-check --build-only` then `--only-tests --no-build`
# at 975be7f (929 of 930; python.package.test_dlpack crashed: `import torch` after dualcast._core,
# fixed by the next commit). On the device machine, from the repository root:
#   bash paper/measured/h200-2026-11-29m/run.sh step | dlpack | dlpack2
#     builds dualcast._core and the step's drivers; python.package.test_dlpack (ctest); the captured
#     float32 step (hmlstm_step_profile) with the search off and on, twice each in turn; workload e
#     with JAX at "highest" in the same call (search on, the default)
set -u
source scripts/device-run.sh "${1:?step}"
case $1 in
step)
  dr_build dualcast_core hmlstm_step_profile hmlstm_experiment
  (cd $B && timeout 120 ctest -R "python.package.test_dlpack" --output-on-failure > "$R/test_dlpack.log" 2>&1)
  echo "test_dlpack rc=$? at $((SECONDS - t0)) s: $(grep -E 'tests passed|python tests' "$R/test_dlpack.log" | tr '\n' ' ')"
  for i in 1 2; do
    for on in 0 1; do DUALCAST_MATMUL_AUTOTUNE=$on dr_step fp32 "step_autotune${on}_$i"; done
  done
  dr_e fp32
  dr_pack ;;
dlpack)  # after `step` found test_dlpack still crashing: the loader's torch-first order, then which
         # import order crashes, with dualcast's loader not reordering (DUALCAST_CORE_TORCH_FIRST=0)
  dr_build dualcast_core
  (cd $B && timeout 120 ctest -R "python.package.test_dlpack" --output-on-failure > "$R/test_dlpack.log" 2>&1)
  echo "test_dlpack rc=$? at $((SECONDS - t0)) s: $(grep -E 'tests passed|python tests' "$R/test_dlpack.log" | tr '\n' ' ')"
  export DUALCAST_CORE_DIR=$PWD/$B/python/dualcast DUALCAST_CORE_TORCH_FIRST=0 PYTHONPATH=$PWD/python
  so=$(ls $DUALCAST_CORE_DIR/_core*.so)
  for order in "import torch; from dualcast import core; print(core.available())" \
               "from dualcast import core; import torch; print(torch.ops.aten.add)" \
               "from dualcast import core; import numpy; import torch; print(torch.ops.aten.add)" \
               "import ctypes; ctypes.CDLL('$so'); import torch; print(torch.ops.aten.add)" \
               "import ctypes; ctypes.CDLL('libcudnn.so.9'); import torch; print(torch.ops.aten.add)" \
               "import ctypes; ctypes.CDLL('libnccl.so.2'); import torch; print(torch.ops.aten.add)"; do
    timeout 60 python3 -X faulthandler -c "$order" > "$R/o.txt" 2>&1
    echo "rc=$? [$order] $(grep -m1 -E 'Fatal|Error' "$R/o.txt") $(tail -c 120 "$R/o.txt" | tr '\n' ' ')"
  done
  ldd "$so" > "$R/ldd.txt" 2>&1; grep -E "cudnn|nccl|stdc|blas|cudart" "$R/ldd.txt"
  python3 -c "import torch, os; print(torch.__file__)"; ls /opt/torch/.venv/lib/python3.12/site-packages/nvidia/*/lib 2>/dev/null | head -20
  dr_pack ;;
dlpack2)  # test_dlpack run directly (faulthandler names the test that crashes), after its stream fix
  dr_build dualcast_core
  DUALCAST_CORE_DIR=$PWD/$B/python/dualcast DUALCAST_CORE_REQUIRED=1 timeout 120 python3 -X faulthandler \
    python/tests/run.py --module test_dlpack > "$R/test_dlpack.log" 2>&1
  echo "test_dlpack rc=$? at $((SECONDS - t0)) s"; grep -v "^ok" "$R/test_dlpack.log" | head -40 ;;
esac
