#!/bin/bash
# The device calls of 2026-11-29 (third session). On the device machine, from the repository root:
#   bash paper/measured/h200-2026-11-29c/run.sh model   # builds the drivers it needs, then: workload e under
#        # bf16 Autocast with JAX at "bfloat16" and 300 training steps (the curve after the skinny kernel's
#        # rebuild); the skinny kernel's Nsight Compute counters; the ResNet-18 step at batch 256 at bf16
#        # with PyTorch's torch.compile at bf16 (autocast + channels_last) in the same call
#   bash paper/measured/h200-2026-11-29c/run.sh attention   # builds the attention targets, then: the
#        # tensor-core attention tests, racecheck on them, attention_bench --precision bf16 with PyTorch's
#        # SDPA on bfloat16 in the same call, the kernels' Nsight Compute counters at seq 4096
#   bash paper/measured/h200-2026-11-29c/run.sh bench   # (the commit gpu-check verified) builds attention_bench,
#        # then attention_bench --precision bf16 and fp16 with PyTorch's SDPA at the same dtype, and the
#        # tensor-core kernels' counters at seq 4096
#   bash paper/measured/h200-2026-11-29c/run.sh train   # (carry .data/fashion-mnist) ResNet-18, 10 epochs on
#        # Fashion-MNIST under bf16 Autocast (batch 128, the float32 recipe): the accuracy target
# Each part's files go straight into $OUT (a part cut short by the call's limit still returns what it wrote;
# the device returns a limited number of files, so the attention part packs its folders into tarballs).
set -u
part=${1:?model}
R=${OUT:-build/run}/$part
mkdir -p "$R"
nvidia-smi -L > "$R/gpus.txt"
B=build/release
E=$B/experiments/hmlstm/hmlstm_experiment
P=$B/experiments/hmlstm/hmlstm_step_profile
T=$B/experiments/resnet/resnet_train
t0=$SECONDS
if [ "$part" = model ]; then
  echo "== build"
  { cmake --preset release > "$R/configure.log" 2>&1 &&
    cmake --build --preset release -j16 --target hmlstm_experiment hmlstm_step_profile resnet_train \
      > "$R/build.log" 2>&1; } || { echo "build FAILED"; tail -30 "$R/build.log"; exit 1; }
  echo "built in $((SECONDS - t0)) s"
  echo "== e, bf16 Autocast, JAX (bfloat16 matmul precision), 300 training steps"
  DUALCAST_MATMUL_LOG=1 timeout 170 "$E" --workloads e --precision bf16 --e-reps 20 --train-steps 300 --peers \
    --peer-methods jax --out "$R/e" > "$R/e.log" 2>&1
  echo "rc=$? at $((SECONDS - t0)) s"; grep -E "^e |final valid|charlm" "$R/e.log" | tail -14
  echo "== ResNet-18 at batch 256, bf16: dualcast captured, then torch.compile (autocast + channels_last)"
  timeout 30 "$T" --device cuda --export "$R/resnet/export" --batch 32 > "$R/resnet_export.log" 2>&1
  echo "rc=$?"
  timeout 40 "$T" --device cuda --bench 256 --capture --precision bf16 --out "$R/resnet" > "$R/resnet_bf16.log" 2>&1
  echo "rc=$? at $((SECONDS - t0)) s"; tail -4 "$R/resnet_bf16.log"
  timeout 90 python3 experiments/resnet/peer_torch.py --export "$R/resnet/export" --precision bf16 \
    --batches 256 --methods compile --out "$R/resnet/torch_bf16.json" > "$R/resnet_torch_bf16.log" 2>&1
  echo "rc=$? at $((SECONDS - t0)) s"; grep -E "compile  batch|validation" "$R/resnet_torch_bf16.log"
  rm -rf "$R/resnet/export"
  echo "== skinny kernel counters (ncu, the first six launches of an eager step)"
  DUALCAST_SKINNY_GEMM=1 timeout 45 ncu --clock-control none --kernel-name regex:skinny_gemm --launch-count 6 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section InstructionStats "$P" --mode mixed --autocast bf16 --reps 1 \
    > "$R/ncu-skinny.txt" 2>&1
  echo "rc=$? at $((SECONDS - t0)) s"; grep -E "Duration|Registers Per|Achieved Occupancy|Grid Size|Warp Cycles Per Issued|Executed Instructions  " \
    "$R/ncu-skinny.txt" | head -36
fi
if [ "$part" = train ]; then
  echo "== build"
  { cmake --preset release > "$R/configure.log" 2>&1 &&
    cmake --build --preset release -j16 --target resnet_train > "$R/build.log" 2>&1; } ||
    { echo "build FAILED"; tail -30 "$R/build.log"; exit 1; }
  echo "built in $((SECONDS - t0)) s"
  timeout 150 "$T" --device cuda --precision bf16 --epochs 10 --data .data/fashion-mnist --out "$R" \
    --name resnet18_bf16 > "$R/train_bf16.log" 2>&1
  echo "rc=$? at $((SECONDS - t0)) s"; grep -iE "epoch|accuracy|wrote" "$R/train_bf16.log" | tail -14
fi
if [ "$part" = bench ]; then
  echo "== build"
  { cmake --preset release > "$R/configure.log" 2>&1 &&
    cmake --build --preset release -j16 --target attention_bench > "$R/build.log" 2>&1; } ||
    { echo "build FAILED"; tail -30 "$R/build.log"; exit 1; }
  echo "built in $((SECONDS - t0)) s"
  for prec in bf16 fp16; do
    echo "== attention_bench $prec with PyTorch SDPA (at $((SECONDS - t0)) s)"
    timeout 120 $B/experiments/transformer/attention_bench --precision $prec --peers --reps 20 --warmup 3 \
      --out "$R/bench_$prec" > "$R/bench_$prec.log" 2>&1
    echo "rc=$? at $((SECONDS - t0)) s"; grep -E "validate\]|max rel err|^ +[0-9]+ +[01] " "$R/bench_$prec.log" | tail -20
  done
  echo "== counters of the tensor-core kernels at seq 4096 (at $((SECONDS - t0)) s)"
  timeout 60 ncu --kernel-name regex:mma_kernel --launch-count 2 --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section InstructionStats \
    $B/experiments/transformer/attention_bench --precision bf16 --seqs 4096 --causal 0 --reps 1 --warmup 0 \
    --out "$R/ncu_run" > "$R/ncu-attention.txt" 2>&1
  echo "rc=$?"; grep -E "attention_.*mma_kernel|Duration|SM Frequency|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Executed Instructions  " \
    "$R/ncu-attention.txt" | head -20
  rm -rf "$R/ncu_run"
  find "$R" -name validate -type d -prune -exec rm -rf {} +
  for prec in bf16 fp16; do tar czf "$R/bench_$prec.tgz" -C "$R" "bench_$prec" && rm -rf "$R/bench_$prec"; done
fi
if [ "$part" = attention ]; then
  echo "== build"
  { cmake --preset release > "$R/configure.log" 2>&1 &&
    cmake --build --preset release -j16 --target test_attention_tensor_core test_precision attention_bench \
      > "$R/build.log" 2>&1; } || { echo "build FAILED"; tail -30 "$R/build.log"; exit 1; }
  echo "built in $((SECONDS - t0)) s"
  echo "== tests"
  timeout 100 $B/tests/test_attention_tensor_core > "$R/test_attention_tensor_core.log" 2>&1; echo "rc=$?"
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]|Failure|error|Which is|out |dq |dk |dv " "$R/test_attention_tensor_core.log" | head -30
  timeout 60 $B/tests/test_precision --gtest_filter='*/cuda' > "$R/test_precision.log" 2>&1; echo "rc=$?"
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]" "$R/test_precision.log" | head -8
  echo "== racecheck (at $((SECONDS - t0)) s)"
  timeout 50 compute-sanitizer --tool racecheck --racecheck-report all $B/tests/test_attention_tensor_core \
    --gtest_filter='*FullyMasked*/cuda:*Autocast*/cuda' > "$R/racecheck.log" 2>&1
  echo "rc=$?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED" "$R/racecheck.log" | tail -3
  echo "== attention_bench bf16 with PyTorch SDPA (at $((SECONDS - t0)) s)"
  timeout 170 $B/experiments/transformer/attention_bench --precision bf16 --peers --reps 20 --warmup 3 \
    --out "$R/bench_bf16" > "$R/bench_bf16.log" 2>&1
  echo "rc=$? at $((SECONDS - t0)) s"; grep -E "validate\]|peer: torch sdpa .*fwd\+bwd|^ +[0-9]+ +[01] " "$R/bench_bf16.log" | tail -30
  echo "== counters of the tensor-core kernels at seq 4096 (at $((SECONDS - t0)) s)"
  timeout 60 ncu --kernel-name regex:mma_kernel --launch-count 2 --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section InstructionStats \
    $B/experiments/transformer/attention_bench --precision bf16 --seqs 4096 --causal 0 --reps 1 --warmup 0 \
    --out "$R/ncu_run" > "$R/ncu-attention.txt" 2>&1
  echo "rc=$?"; grep -E "attention_.*mma_kernel|Duration|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued" \
    "$R/ncu-attention.txt" | head -20
  rm -rf "$R/ncu_run"
  find "$R" -name validate -type d -prune -exec rm -rf {} +
  tar czf "$R/bench_bf16.tgz" -C "$R" bench_bf16 && rm -rf "$R/bench_bf16"
fi
find "$R" -name validate -type d -prune -exec rm -rf {} +
