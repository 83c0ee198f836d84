#!/bin/bash
# The device calls of 2026-11-29 (fourth session). On the device machine, from the repository root:
#   bash paper/measured/h200-2026-11-29d/run.sh chain   # builds what it runs, then: test_launch (chained
#        # launches), test_matmul_rounded, the network tests; the captured workload-e step
#        # (hmlstm_step_profile, mixed) in bf16 Autocast and float32 with chained launches off and on
#   bash paper/measured/h200-2026-11-29d/run.sh next   # builds what it runs, then: test_launch, the network
#        # tests; the captured workload-e step (mixed) in bf16 Autocast and float32: chained launches off,
#        # on, and on with each cell kernel writing the next layer-step's gate inputs (twice each)
#   bash paper/measured/h200-2026-11-29d/run.sh final   # right after scripts/gpu-check (its build/release):
#        # the captured step (hmlstm_step_profile, as in `next`), workload e in float32 and under bf16
#        # Autocast with JAX at the same precision; the 300-step
#        # training run under bf16 for seeds 1-2 and in float32 for seed 2 (seed 1: run 2026-11-29a);
#        # the captured bf16 step's kernels as they ran (step_breakdown.py --tool nsys, if nsys is here)
#   bash paper/measured/h200-2026-11-29d/run.sh inputs   # (branch bf16-inputs: the gate-input stack in bf16
#        # with 16-byte rows) the network tests, the captured step twice (bf16, float32), e bf16 with JAX
#   bash paper/measured/h200-2026-11-29d/run.sh attention   # (the build of `chain`, rebuilt if the machine
#        # is fresh) test_attention_tensor_core, attention_bench --precision bf16 with PyTorch's SDPA
# Each part's files go straight into $OUT (packed into a tarball at the end: the device returns few files).
set -u
part=${1:?chain}
R=${OUT:-build/run}/$part
mkdir -p "$R"
nvidia-smi -L > "$R/gpus.txt"
B=build/release
P=$B/experiments/hmlstm/hmlstm_step_profile
t0=$SECONDS
build() {
  echo "== build $*"
  { cmake --preset release > "$R/configure.log" 2>&1 &&
    cmake --build --preset release -j16 --target "$@" > "$R/build.log" 2>&1; } ||
    { echo "build FAILED"; tail -30 "$R/build.log"; exit 1; }
  echo "built in $((SECONDS - t0)) s"
}
gtest() {  # gtest BINARY TIMEOUT [FILTER]
  local name; name=$(basename "$1")
  timeout "$2" "$1" ${3:+--gtest_filter=$3} > "$R/$name.log" 2>&1
  echo "$name rc=$? at $((SECONDS - t0)) s"
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \] [0-9]" "$R/$name.log" | head -12
}
if [ "$part" = chain ]; then
  build test_launch test_matmul_rounded test_network hmlstm_step_profile
  gtest $B/tests/test_launch 60
  echo "== the captured step, chained launches off then on, twice (at $((SECONDS - t0)) s)"
  for round in 1 2; do
    for prec in bf16 fp32; do
      for chain in 0 1; do
        DUALCAST_CHAINED_LAUNCH=$chain timeout 60 $P --mode mixed --reps 30 \
          $( [ $prec = bf16 ] && echo --autocast bf16 ) > "$R/step_${prec}_chain${chain}_$round.log" 2>&1
        echo "$prec chained=$chain round $round rc=$?: $(grep -E 'step_ms' "$R/step_${prec}_chain${chain}_$round.log")"
      done
    done
  done
  gtest $B/tests/test_matmul_rounded 120
  gtest $B/experiments/hmlstm/test_network 200
fi
if [ "$part" = next ]; then
  build test_launch test_network hmlstm_step_profile
  gtest $B/tests/test_launch 60
  grep -E "^chained launches" "$R/test_launch.log"
  gtest $B/experiments/hmlstm/test_network 200
  echo "== the captured step (at $((SECONDS - t0)) s)"
  for round in 1 2; do
    for prec in bf16 fp32; do
      for v in "0 --own-inputs" "1 --own-inputs" "1"; do
        set -- $v
        name=step_${prec}_chain$1${2:+_own}_$round
        DUALCAST_CHAINED_LAUNCH=$1 timeout 60 $P --mode mixed --reps 30 ${2:-} \
          $( [ $prec = bf16 ] && echo --autocast bf16 ) > "$R/$name.log" 2>&1
        echo "$prec chained=$1 ${2:-next-inputs} round $round rc=$?: $(grep -E 'step_ms' "$R/$name.log" | cut -d' ' -f1-5)"
      done
    done
  done
fi
if [ "$part" = final ]; then
  E=$B/experiments/hmlstm/hmlstm_experiment
  build hmlstm_experiment hmlstm_step_profile
  for round in 1 2; do
    for prec in bf16 fp32; do
      DUALCAST_CHAINED_LAUNCH=1 timeout 60 $P --mode mixed --reps 30 $( [ $prec = bf16 ] && echo --autocast bf16 ) \
        > "$R/step_${prec}_$round.log" 2>&1
      echo "captured step $prec round $round rc=$?: $(grep -E 'step_ms' "$R/step_${prec}_$round.log" | cut -d' ' -f1-5)"
    done
  done
  for prec in bf16 fp32; do
    echo "== e $prec with JAX at the same precision (at $((SECONDS - t0)) s)"
    timeout 150 $E --workloads e --precision $prec --e-reps 20 --train-steps 0 --peers --peer-methods jax \
      --out "$R/e_$prec" > "$R/e_$prec.log" 2>&1
    echo "rc=$?"; grep -E "^e |jax" "$R/e_$prec.log" | tail -8
  done
  for run in "bf16 1" "bf16 2" "fp32 2"; do
    set -- $run
    echo "== 300 training steps, $1, seed $2 (at $((SECONDS - t0)) s)"
    timeout 100 $E --workloads e --precision $1 --e-reps 1 --train-steps 300 --train-seed $2 --no-graphs \
      --out "$R/train_$1_s$2" > "$R/train_$1_s$2.log" 2>&1
    echo "rc=$?"; grep -E "final valid" "$R/train_$1_s$2.log" | sed 's/.*charlm/charlm/' | cut -c1-400
  done
  if command -v nsys > /dev/null; then
    echo "== the captured bf16 step's kernels (nsys, at $((SECONDS - t0)) s)"
    timeout 120 python3 experiments/hmlstm/step_breakdown.py --binary $P --mode mixed --autocast bf16 --tool nsys \
      --csv "$R/breakdown_bf16.csv" > "$R/breakdown_bf16.txt" 2>&1
    echo "rc=$?"; tail -16 "$R/breakdown_bf16.txt"
  else
    echo "no nsys on this machine"
  fi
  find "$R" -name validate -type d -prune -exec rm -rf {} +
fi
if [ "$part" = inputs ]; then
  build test_network hmlstm_step_profile hmlstm_experiment
  gtest $B/experiments/hmlstm/test_network 200
  for round in 1 2; do
    for prec in bf16 fp32; do
      timeout 60 $P --mode mixed --reps 30 $( [ $prec = bf16 ] && echo --autocast bf16 ) > "$R/step_${prec}_$round.log" 2>&1
      echo "captured step $prec round $round rc=$?: $(grep -E 'step_ms' "$R/step_${prec}_$round.log" | cut -d' ' -f1-5)"
    done
  done
  DUALCAST_MATMUL_LOG=1 timeout 150 $B/experiments/hmlstm/hmlstm_experiment --workloads e --precision bf16 --e-reps 20 \
    --train-steps 0 --peers --peer-methods jax --out "$R/e_bf16" > "$R/e_bf16.log" 2>&1
  echo "e bf16 rc=$?"; grep -E "^e |\[jax\] e H|skinny|cuBLAS" "$R/e_bf16.log" | tail -12
  find "$R" -name validate -type d -prune -exec rm -rf {} +
fi
if [ "$part" = attention ]; then
  build test_attention_tensor_core attention_bench
  gtest $B/tests/test_attention_tensor_core 100
  echo "== attention_bench bf16 with PyTorch SDPA (at $((SECONDS - t0)) s)"
  timeout 170 $B/experiments/transformer/attention_bench --precision bf16 --peers --reps 20 --warmup 3 \
    --out "$R/bench_bf16" > "$R/bench_bf16.log" 2>&1
  echo "rc=$? at $((SECONDS - t0)) s"; grep -E "validate\]|^ +[0-9]+ +[01] " "$R/bench_bf16.log" | tail -20
  find "$R" -name validate -type d -prune -exec rm -rf {} +
fi
tar czf "${OUT:-build/run}/$part.tgz" -C "${OUT:-build/run}" "$part" && echo "packed $part.tgz"
