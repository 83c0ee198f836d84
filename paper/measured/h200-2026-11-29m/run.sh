#!/bin/bash
# Run h200-2026-11-29m: the float32 products' search (src/blas_lt.cpp, on by default since this run's
# commit) measured in the HM-LSTM step. On the device machine, from the repository root, after
# `scripts/gpu-check --build-only` on the same warm machine (its build/release is used as it is):
#   bash paper/measured/h200-2026-11-29m/run.sh step
#     the captured float32 step (hmlstm_step_profile) with the search off and on, twice each in turn;
#     workload e with JAX at "highest" in the same call (search on, the default) and again with it
#     off; then 300 training steps with the search on (the bits/char curve, issue 31)
set -u
source scripts/device-run.sh "${1:?step}"
case $1 in
step)
  for i in 1 2; do
    for on in 0 1; do DUALCAST_MATMUL_AUTOTUNE=$on dr_step fp32 "step_autotune${on}_$i"; done
  done
  dr_e fp32
  DUALCAST_MATMUL_AUTOTUNE=0 timeout 120 $E --workloads e --e-reps 20 --train-steps 0 --out "$R/e_fp32_off" \
    > "$R/e_fp32_off.log" 2>&1
  echo "e, search off: rc=$?"; grep -E "^e " "$R/e_fp32_off.log" | tail -3
  dr_train fp32 1
  dr_pack ;;
esac
