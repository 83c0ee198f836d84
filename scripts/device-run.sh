# scripts/device-run.sh: the helpers a session's paper/measured/<run>/run.sh sources on the device
# machine, so that each run's script holds only its commands (the build, test, step, training and
# packing steps were copied from run to run before).
#
#   source scripts/device-run.sh PART   # sets R (this part's folder under $OUT), B, P, E, t0
#   dr_build TARGET...                  # configure the release preset, build the targets (nproc jobs)
#   dr_gtest BINARY TIMEOUT [FILTER]    # run a GoogleTest binary, print its verdict lines
#   dr_step PRECISION NAME [ARGS...]    # the captured workload-e step (hmlstm_step_profile, mixed)
#   dr_e PRECISION [ARGS...]            # workload e with JAX at the same precision
#   dr_train PRECISION SEED             # 300 training steps, both modes, final bits/char
#   dr_pack                             # drop validation arrays, pack $OUT/PART.tgz (the device
#                                       # returns few loose files)
# PRECISION is fp32, tf32, bf16 or fp16, as the drivers' --precision.
part=${1:?usage: source scripts/device-run.sh PART}
R=${OUT:-build/run}/$part
B=build/release
P=$B/experiments/hmlstm/hmlstm_step_profile
E=$B/experiments/hmlstm/hmlstm_experiment
t0=$SECONDS
mkdir -p "$R"
nvidia-smi -L > "$R/gpus.txt" 2>&1

dr_build() {
  echo "== build $*"
  { cmake --preset release > "$R/configure.log" 2>&1 &&
    cmake --build --preset release -j"$(nproc)" --target "$@" > "$R/build.log" 2>&1; } ||
    { echo "build FAILED"; tail -30 "$R/build.log"; exit 1; }
  echo "built in $((SECONDS - t0)) s"
}

dr_gtest() {
  local name; name=$(basename "$1")
  timeout "$2" "$1" ${3:+--gtest_filter=$3} > "$R/$name.log" 2>&1
  echo "$name rc=$? at $((SECONDS - t0)) s"
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]|SKIPPED \] [0-9]" "$R/$name.log" | head -12
}

dr_autocast() { case $1 in bf16) echo --autocast bf16 ;; fp16) echo --autocast fp16 ;; esac; }

dr_step() {
  local prec=$1 name=$2; shift 2
  timeout 60 $P --mode mixed --reps 30 $(dr_autocast "$prec") "$@" > "$R/$name.log" 2>&1
  echo "captured step $name rc=$?: $(grep -E 'step_ms' "$R/$name.log" | cut -d' ' -f1-5)"
}

dr_e() {
  local prec=$1; shift
  echo "== e $prec with JAX at the same precision (at $((SECONDS - t0)) s)"
  timeout 150 $E --workloads e --precision "$prec" --e-reps 20 --train-steps 0 --peers --peer-methods jax \
    --out "$R/e_$prec" "$@" > "$R/e_$prec.log" 2>&1
  echo "rc=$?"; grep -E "^e |jax" "$R/e_$prec.log" | tail -8
}

dr_train() {
  echo "== 300 training steps, $1, seed $2 (at $((SECONDS - t0)) s)"
  timeout 100 $E --workloads e --precision "$1" --e-reps 1 --train-steps 300 --train-seed "$2" --no-graphs \
    --out "$R/train_$1_s$2" > "$R/train_$1_s$2.log" 2>&1
  echo "rc=$?"; grep -o 'final valid bpc [0-9.]* (mixed) vs [0-9.]* (reverse)' "$R/train_$1_s$2.log"
}

dr_pack() {
  find "$R" -name validate -type d -prune -exec rm -rf {} +
  tar czf "${OUT:-build/run}/$part.tgz" -C "${OUT:-build/run}" "$part" && echo "packed $part.tgz at $((SECONDS - t0)) s"
}
