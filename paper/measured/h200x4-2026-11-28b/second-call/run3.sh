#!/bin/bash
# Device call 3 (after gpu-check's build and tests on the same warm machine).
set -u
export NCCL_NVLS_ENABLE=0
R=$OUT/r; mkdir -p $R
B=build/release/experiments/hmlstm/hmlstm_dp
E=build/release/experiments/hmlstm/hmlstm_experiment
nvidia-smi -L > $R/gpus.txt
A="--bench --hidden 512 --seq 100 --reps 20 --warmup 5 --out $R/dp"
run() { local name=$1; shift; echo "== $name: $*"; local t0=$(date +%s); timeout ${T:-200} "$@" > $R/$name.log 2>&1; echo "rc=$? $(( $(date +%s)-t0 )) s"; grep -E "${PAT:-captured|compute|eager|ms}" $R/$name.log | tail -${LINES_:-12}; }
if [ "$(nvidia-smi -L | wc -l)" -ge 4 ]; then
  T=60 run dp_cf $B $A --gpus 4 --device cuda --batch 256 --compute-first --name cf
  NCCL_CUMEM_ENABLE=0 T=60 run dp_cf_nocumem $B $A --gpus 4 --device cuda --batch 256 --compute-first --name cf_nocumem
  NCCL_P2P_DISABLE=1 T=60 run dp_cf_nop2p $B $A --gpus 4 --device cuda --batch 256 --compute-first --name cf_nop2p
fi
PAT='"|dualcast|torch|compile|disk' LINES_=40 T=240 run overhead python3 experiments/torch_elementwise/overhead.py
PAT='a 4096|a 8192|torch|compile|dualcast' LINES_=30 T=240 run a_peers $E --workloads a --dims 4096,8192 --peers --peer-methods compile,torch_dualcast --out $R/a_peers
PAT='e H|torch' LINES_=20 T=150 run e_peers $E --workloads e --train-steps 0 --e-reps 10 --peers --peer-methods torch_dualcast --out $R/e_peers
