#!/bin/bash
# h200x2-2026-11-29: the two issue-33 calls made on GPU 0 of a 2 x H200 machine, right after
# experiments/scaling/measured/h200x2-2026-11-29/run.sh study on the same warm machine (its build
# folder was kept). Sent as these one-line commands; kept here as what ran.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
case ${1:?usage: run.sh ab|py} in
ab)  # workloads a and b: dualcast native, dualcast from PyTorch (compiled launcher), torch.compile
  source scripts/device-run.sh ab; dr_build hmlstm_experiment
  timeout $((570 - SECONDS + t0)) $E --workloads a,b --dims 4096,8192 --peers --peer-methods compile,torch_dualcast \
    --out $R/ab > $R/ab.log 2>&1
  echo "rc=$? at $((SECONDS - t0)) s"; grep -E "^(a|b) |torch|compile|dualcast" $R/ab.log | tail -40; dr_pack ;;
py)  # the Python suite on the GPU, then the host time per call
  source scripts/device-run.sh py
  timeout 400 python3 python/tests/run.py > $R/pytest.log 2>&1; echo "rc=$? at $((SECONDS - t0)) s"; tail -5 $R/pytest.log
  timeout 150 python3 experiments/torch_elementwise/overhead.py > $R/overhead.log 2>&1; echo "overhead rc=$?"; tail -25 $R/overhead.log ;;
esac
