#!/bin/bash
# The measurement call of 2026-11-28 (evening, second run), on the device machine after
# `scripts/gpu-check --build-only` built build/release there; run with the tests in one call:
#   scripts/gpu-check --no-build --only-tests --commit SHA; bash paper/measured/h200-2026-11-28f/run.sh
# Workload e with dualcast's split-K products chosen per shape by measurement (DUALCAST_MATMUL_LOG=1
# prints each shape's two times), JAX, the 300-step training and the accuracy study (--e-accuracy)
# in the same run; the same step with cuBLAS everywhere (DUALCAST_SPLITK_GEMM=0) right after; the
# captured step's Nsight Compute breakdown; the split-K kernel's own counters. One tarball.
set -u
R=${OUT:-build/run}/m
mkdir -p "$R"
nvidia-smi -L > "$R/gpus.txt"
E=build/release/experiments/hmlstm/hmlstm_experiment
P=build/release/experiments/hmlstm/hmlstm_step_profile
echo "== e, split-K measured, JAX, 300 training steps"
DUALCAST_MATMUL_LOG=1 timeout 150 "$E" --workloads e --e-reps 20 --train-steps 300 --e-accuracy --peers --peer-methods jax \
  --out "$R/e" > "$R/e.log" 2>&1
echo "rc=$?"; grep -E "^e |final valid|split-K kernel|e accuracy" "$R/e.log" | tail -16
echo "== e, cuBLAS everywhere"
DUALCAST_SPLITK_GEMM=0 timeout 60 "$E" --workloads e --e-reps 20 --train-steps 0 --out "$R/e-cublas" > "$R/e-cublas.log" 2>&1
echo "rc=$?"; grep -E "^e " "$R/e-cublas.log"
echo "== breakdown"
timeout 60 python3 experiments/hmlstm/step_breakdown.py --binary "$P" --mode mixed --csv "$R/breakdown.csv" \
  > "$R/breakdown.txt" 2>&1
echo "rc=$?"; grep -E "step time|matmul|sum of" "$R/breakdown.txt"
echo "== split-K kernel counters (ncu, the first four launches of an eager step)"
DUALCAST_SPLITK_GEMM=1 timeout 60 ncu --kernel-name regex:splitk_kernel --launch-count 4 --section SpeedOfLight \
  --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis --section WarpStateStats \
  "$P" --mode mixed --hidden 512 --batch 64 --seq 100 --reps 1 > "$R/ncu-splitk.txt" 2>&1
echo "rc=$?"; grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Grid Size" \
  "$R/ncu-splitk.txt" | head -24
gzip -f "$R/breakdown.csv" 2>/dev/null
find "$R" -name validate -type d -prune -exec rm -rf {} +
tar czf "${OUT:-build/run}/m.tgz" -C "$(dirname "$R")" m && rm -rf "$R"
