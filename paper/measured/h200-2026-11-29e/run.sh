#!/bin/bash
# The device calls of 2026-11-29 (fifth session). On the device machine, from the repository root:
#   scripts/gpu-check --only-tests --commit SHA   # first: the whole GPU suite, which leaves build/release
#   bash paper/measured/h200-2026-11-29e/run.sh final   # right after it, on its build: the captured
#        # workload-e step (hmlstm_step_profile, mixed) in bf16 Autocast and float32, twice; workload e in
#        # both with JAX at the same precision; 300 training steps for seeds 1 and 2 in bf16 and float32
#   bash paper/measured/h200-2026-11-29e/run.sh more   # builds what it runs, then: 300 training steps for
#        # seeds 3 and 4 in bf16 and float32, then (in the time left of the call) part ab's a and b in bf16
#   bash paper/measured/h200-2026-11-29e/run.sh packets   # (branch half-packets: 16-bit calls move 16-byte
#        # packets) builds what it runs, then: a and b in bf16 at 4096^2 and 8192^2 (dualcast only:
#        # torch.compile ran in part `more`, on main's kernels), the 16-bit broadcast tests, and the
#        # bf16 kernels' Nsight Compute counters
# Each part's files go into $OUT/<part> and are packed into <part>.tgz (the device returns few files).
set -u
part=${1:?final}
R=${OUT:-build/run}/$part
mkdir -p "$R"
nvidia-smi -L > "$R/gpus.txt"
B=build/release
P=$B/experiments/hmlstm/hmlstm_step_profile
E=$B/experiments/hmlstm/hmlstm_experiment
t0=$SECONDS
build() {
  echo "== build $*"
  { cmake --preset release > "$R/configure.log" 2>&1 &&
    cmake --build --preset release -j16 --target "$@" > "$R/build.log" 2>&1; } ||
    { echo "build FAILED"; tail -30 "$R/build.log"; exit 1; }
  echo "built in $((SECONDS - t0)) s"
}
if [ "$part" = final ]; then
  build hmlstm_experiment hmlstm_step_profile
  for round in 1 2; do
    for prec in bf16 fp32; do
      timeout 60 $P --mode mixed --reps 30 $( [ $prec = bf16 ] && echo --autocast bf16 ) > "$R/step_${prec}_$round.log" 2>&1
      echo "captured step $prec round $round rc=$?: $(grep -E 'step_ms' "$R/step_${prec}_$round.log" | cut -d' ' -f1-5)"
    done
  done
  for prec in bf16 fp32; do
    echo "== e $prec with JAX at the same precision (at $((SECONDS - t0)) s)"
    timeout 150 $E --workloads e --precision $prec --e-reps 20 --train-steps 0 --peers --peer-methods jax \
      --out "$R/e_$prec" > "$R/e_$prec.log" 2>&1
    echo "rc=$?"; grep -E "^e |jax" "$R/e_$prec.log" | tail -8
  done
  for run in "bf16 1" "fp32 1" "bf16 2" "fp32 2"; do
    set -- $run
    echo "== 300 training steps, $1, seed $2 (at $((SECONDS - t0)) s)"
    timeout 100 $E --workloads e --precision $1 --e-reps 1 --train-steps 300 --train-seed $2 --no-graphs \
      --out "$R/train_$1_s$2" > "$R/train_$1_s$2.log" 2>&1
    echo "rc=$?"; grep -E "final valid|^training" "$R/train_$1_s$2.log" | sed 's/.*charlm/charlm/' | cut -c1-300
  done
  echo "done at $((SECONDS - t0)) s"
  find "$R" -name validate -type d -prune -exec rm -rf {} +
fi
train() {  # train PRECISION SEED
  echo "== 300 training steps, $1, seed $2 (at $((SECONDS - t0)) s)"
  timeout 100 $E --workloads e --precision $1 --e-reps 1 --train-steps 300 --train-seed $2 --no-graphs \
    --out "$R/train_$1_s$2" > "$R/train_$1_s$2.log" 2>&1
  echo "rc=$?"; grep -E "final valid|^training" "$R/train_$1_s$2.log" | sed 's/.*charlm/charlm/' | cut -c1-300
}
if [ "$part" = more ]; then
  build hmlstm_experiment
  for run in "bf16 3" "fp32 3" "bf16 4" "fp32 4"; do train $run; done
  left=$((560 - SECONDS + t0))
  echo "== a, b bf16 with torch.compile, $left s left (at $((SECONDS - t0)) s)"
  [ $left -gt 60 ] && timeout $left python3 experiments/hmlstm/run.py --build $B --no-plots --out "$R/hmlstm_bf16" \
    --workloads a,b --dims 4096,8192 --precision bf16 --no-graphs --reps 30 --warmup 5 --peers --peer-methods compile \
    > "$R/hmlstm_bf16.log" 2>&1
  echo "rc=$? at $((SECONDS - t0)) s"; tail -12 "$R/hmlstm_bf16.log"
  find "$R" -name validate -type d -prune -exec rm -rf {} +
fi
if [ "$part" = packets ]; then
  build test_broadcast test_half_ops hmlstm_experiment profile_broadcast
  timeout 100 $E --workloads a,b --dims 4096,8192 --precision bf16 --no-graphs --reps 30 --warmup 5 \
    --out "$R/hmlstm_bf16" > "$R/hmlstm_bf16.log" 2>&1
  echo "a, b bf16 rc=$? at $((SECONDS - t0)) s"; grep -E "^[ab] [0-9]|^workload" "$R/hmlstm_bf16.log"
  for t in test_broadcast test_half_ops; do
    timeout 60 $B/tests/$t > "$R/$t.log" 2>&1
    echo "$t rc=$? at $((SECONDS - t0)) s"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" "$R/$t.log" | head -8
  done
  timeout 100 python3 scripts/ncu-broadcast --build $B --out "$R/ncu" --label bf16-16B --dtype bfloat16 \
    --configs a:4096,b:4096,a:8192 > "$R/ncu.log" 2>&1
  echo "ncu rc=$? at $((SECONDS - t0)) s"; tail -9 "$R/ncu.log"
  find "$R" -name validate -type d -prune -exec rm -rf {} +
fi
tar czf "${OUT:-build/run}/$part.tgz" -C "${OUT:-build/run}" "$part" && echo "packed $part.tgz"
