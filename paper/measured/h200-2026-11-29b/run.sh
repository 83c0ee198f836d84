#!/bin/bash
# The device calls of 2026-11-29 (second session): the skinny kernel rebuilt around a cp.async ring,
# ldmatrix and one warp per 16 rows. On the device machine, after `scripts/gpu-check --build-only`
# built build/release there:
#   bash paper/measured/h200-2026-11-29b/run.sh quick  # its tests, racecheck at every copy width, the bf16
#                                                       # step with each shape's choice logged
#   bash paper/measured/h200-2026-11-29b/run.sh full   # (after gpu-check --no-build --only-tests) workload e
#                                                       # under bf16 Autocast with JAX at "bfloat16" and 300
#                                                       # training steps; the kernel's counters; the breakdown
# Each part writes one tarball into $OUT.
set -u
part=${1:?quick or full}
R=${OUT:-build/run}/$part
mkdir -p "$R"
nvidia-smi -L > "$R/gpus.txt"
B=build/release
E=$B/experiments/hmlstm/hmlstm_experiment
P=$B/experiments/hmlstm/hmlstm_step_profile
if [ "$part" = quick ]; then
  echo "== test_matmul_rounded"
  timeout 90 $B/tests/test_matmul_rounded > "$R/test_matmul_rounded.log" 2>&1; echo "rc=$?"
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]" "$R/test_matmul_rounded.log" | tail -4
  echo "== compute-sanitizer racecheck on the kernel at every copy width"
  timeout 70 compute-sanitizer --tool racecheck --racecheck-report all $B/tests/test_matmul_rounded \
    --gtest_filter='*CopyWidth*/cuda' > "$R/racecheck.log" 2>&1
  echo "rc=$?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED" "$R/racecheck.log" | tail -3
  echo "== e, bf16 Autocast, the step only (each shape's choice logged)"
  DUALCAST_MATMUL_LOG=1 timeout 80 "$E" --workloads e --precision bf16 --e-reps 20 --train-steps 0 \
    --out "$R/e16" > "$R/e16.log" 2>&1
  echo "rc=$?"; grep -E "^e |matmul_rounded" "$R/e16.log" | tail -12
else
  echo "== e, bf16 Autocast, JAX (bfloat16 matmul precision), 300 training steps"
  DUALCAST_MATMUL_LOG=1 timeout 200 "$E" --workloads e --precision bf16 --e-reps 20 --train-steps 300 --peers \
    --peer-methods jax --out "$R/e" > "$R/e.log" 2>&1
  echo "rc=$?"; grep -E "^e |final valid|matmul_rounded" "$R/e.log" | tail -14
  echo "== skinny kernel counters (ncu, the first six launches of an eager step)"
  DUALCAST_SKINNY_GEMM=1 timeout 60 ncu --clock-control none --kernel-name regex:skinny_gemm --launch-count 6 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section InstructionStats "$P" --mode mixed --autocast bf16 --reps 1 \
    > "$R/ncu-skinny.txt" 2>&1
  echo "rc=$?"; grep -E "Duration|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Grid Size|Warp Cycles Per Issued|Executed Instructions  " \
    "$R/ncu-skinny.txt" | head -36
  echo "== breakdown of the bf16 Autocast step"
  timeout 90 python3 experiments/hmlstm/step_breakdown.py --binary "$P" --mode mixed --autocast bf16 \
    --csv "$R/breakdown.csv" > "$R/breakdown.txt" 2>&1
  echo "rc=$?"; grep -E "step time|matmul|sum of|gaps|skinny" "$R/breakdown.txt"
  gzip -f "$R/breakdown.csv" 2>/dev/null
fi
find "$R" -name validate -type d -prune -exec rm -rf {} +
tar czf "${OUT:-build/run}/$part.tgz" -C "$(dirname "$R")" "$part" && rm -rf "$R"
