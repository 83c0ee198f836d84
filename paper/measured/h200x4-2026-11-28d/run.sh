#!/bin/bash
# The measurement call of the session of 2026-11-28 (fifth), run on the device machine after
# `scripts/gpu-check --build-only` and `--only-tests` built and tested build/release there:
# workload e (the HM-LSTM step with the gates off the critical path, issue 31) with JAX in the same run
# and the 300-step training run; workloads a and b three ways (native, from PyTorch through the NVRTC
# fast walk, torch.compile; issue 33); the costs outside the kernels. Everything in one tarball.
#   bash paper/measured/h200x4-2026-11-28d/run.sh (as run: from paper/measured/h200-2026-11-28d/ on branch crit-path)
set -u
R=${OUT:-build/run}/m
mkdir -p "$R"
nvidia-smi -L > "$R/gpus.txt"
E=build/release/experiments/hmlstm/hmlstm_experiment
echo "== e with JAX, 300 training steps"
timeout 260 "$E" --workloads e --e-reps 20 --train-steps 300 --peers --peer-methods jax --out "$R/e" > "$R/e.log" 2>&1
echo "rc=$?"; grep -E "^e |bits|agree" "$R/e.log" | tail -6
echo "== a, b: native, from PyTorch, torch.compile"
timeout 200 "$E" --workloads a,b --dims 4096,8192 --peers --peer-methods compile,torch_dualcast --out "$R/ab" > "$R/ab.log" 2>&1
echo "rc=$?"; grep -E "^[ab] (4096|8192)" "$R/ab.log"
echo "== overhead"
timeout 90 python3 experiments/torch_elementwise/overhead.py > "$R/overhead.json" 2> "$R/overhead.err"
echo "rc=$?"; tr -d '\n ' < "$R/overhead.json"; echo
tar czf "${OUT:-build/run}/m.tgz" -C "$(dirname "$R")" m && rm -rf "$R"
