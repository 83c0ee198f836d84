#!/bin/bash
# Run h200-2026-11-29m: the float32 products' search (src/blas_lt.cpp, on by default since commit
# 975be7f) measured in the HM-LSTM step, and dualcast._core's DLPack test after its pybind11 mend.
# Before it, on another fresh H200: `scripts/gpu-check --build-only` then `--only-tests --no-build`
# at 975be7f (929 of 930; python.package.test_dlpack crashed: `import torch` after dualcast._core,
# fixed by the next commit). On the device machine, from the repository root:
#   bash paper/measured/h200-2026-11-29m/run.sh step
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
esac
