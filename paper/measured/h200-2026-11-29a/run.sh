#!/bin/bash
# The measurement calls of 2026-11-29, on the device machine after `scripts/gpu-check --build-only`
# built build/release there (and `--no-build --only-tests` passed):
#   bash paper/measured/h200-2026-11-29a/run.sh e16    # workload e under bf16 Autocast, JAX at "bfloat16",
#                                                       # 300 training steps (DUALCAST_MATMUL_LOG=1: each shape's
#                                                       # skinny-kernel and cuBLAS times)
#   bash paper/measured/h200-2026-11-29a/run.sh rest   # e in float32 with JAX and 300 steps (the curve to
#                                                       # compare with); e under Autocast with cuBLAS only
#                                                       # (DUALCAST_SKINNY_GEMM=0); the Nsight Compute breakdown of
#                                                       # the Autocast step; the skinny kernel's own counters
# Each part writes one tarball into $OUT.
set -u
part=${1:?e16 or rest}
R=${OUT:-build/run}/$part
mkdir -p "$R"
nvidia-smi -L > "$R/gpus.txt"
E=build/release/experiments/hmlstm/hmlstm_experiment
P=build/release/experiments/hmlstm/hmlstm_step_profile
if [ "$part" = e16 ]; then
  echo "== e, bf16 Autocast, JAX (bfloat16 matmul precision), 300 training steps"
  DUALCAST_MATMUL_LOG=1 timeout 200 "$E" --workloads e --precision bf16 --e-reps 20 --train-steps 300 --peers \
    --peer-methods jax --out "$R/e" > "$R/e.log" 2>&1
  echo "rc=$?"; grep -E "^e |final valid|matmul_rounded|charlm" "$R/e.log" | tail -20
else
  echo "== e, float32, JAX (highest), 300 training steps"
  timeout 200 "$E" --workloads e --e-reps 20 --train-steps 300 --peers --peer-methods jax --out "$R/e32" \
    > "$R/e32.log" 2>&1
  echo "rc=$?"; grep -E "^e |final valid" "$R/e32.log" | tail -6
  echo "== e, bf16 Autocast, cuBLAS products only"
  DUALCAST_SKINNY_GEMM=0 timeout 60 "$E" --workloads e --precision bf16 --e-reps 20 --train-steps 0 \
    --out "$R/e16-cublas" > "$R/e16-cublas.log" 2>&1
  echo "rc=$?"; grep -E "^e " "$R/e16-cublas.log"
  echo "== breakdown of the bf16 Autocast step"
  timeout 90 python3 experiments/hmlstm/step_breakdown.py --binary "$P" --mode mixed --autocast bf16 \
    --csv "$R/breakdown.csv" > "$R/breakdown.txt" 2>&1
  echo "rc=$?"; grep -E "step time|matmul|sum of|gaps" "$R/breakdown.txt"
  echo "== skinny kernel counters (ncu, the first six launches of an eager step)"
  DUALCAST_SKINNY_GEMM=1 timeout 60 ncu --clock-control none --kernel-name regex:skinny_gemm --launch-count 6 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
    --section WarpStateStats "$P" --mode mixed --autocast bf16 --reps 1 > "$R/ncu-skinny.txt" 2>&1
  echo "rc=$?"; grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Grid Size|Cluster" \
    "$R/ncu-skinny.txt" | head -40
  gzip -f "$R/breakdown.csv" 2>/dev/null
fi
find "$R" -name validate -type d -prune -exec rm -rf {} +
tar czf "${OUT:-build/run}/$part.tgz" -C "$(dirname "$R")" "$part" && rm -rf "$R"
