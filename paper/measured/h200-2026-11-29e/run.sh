#!/bin/bash
# The device calls of 2026-11-29 (fifth session). On the device machine, from the repository root:
#   scripts/gpu-check --only-tests --commit SHA   # first: the whole GPU suite, which leaves build/release
#   bash paper/measured/h200-2026-11-29e/run.sh final   # right after it, on its build: the captured
#        # workload-e step (hmlstm_step_profile, mixed) in bf16 Autocast and float32, twice; workload e in
#        # both with JAX at the same precision; 300 training steps for seeds 1 and 2 in bf16 and float32
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
tar czf "${OUT:-build/run}/$part.tgz" -C "${OUT:-build/run}" "$part" && echo "packed $part.tgz"
