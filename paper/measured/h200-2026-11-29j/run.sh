#!/bin/bash
# h200-2026-11-29j: branch nhwc at 0370d74 (channels-last convolutions, batch norm over channels-last
# rows, 16-bit activations through batch norm, the ResNet-18 model's --channels-last), after
#   scripts/gpu-check --build-only --commit 0370d74..., then --only-tests --no-build --commit 0370d74...
# on the same machine (its build/release). Part resnet ran; profile and py did not (README.md).
#   bash paper/measured/h200-2026-11-29j/run.sh resnet    # the ResNet-18 step at batch 256, bf16 and tf32:
#        # dualcast NCHW and channels last, torch.compile at the same precision (channels_last and
#        # autocast: scripts/precision-study resnet), one machine, one call. NCHW bf16 against
#        # h200-2026-11-29h's 7.84 ms shows the 16-bit activations alone; the bench JSONs list the
#        # cuDNN algorithms each step ran (cudnn_algorithms)
#   bash paper/measured/h200-2026-11-29j/run.sh profile   # where the channels-last bf16 step's time goes
#        # (ncu kernel durations, experiments/resnet/breakdown.py; cuDNN's algorithms chosen by the
#        # v7 heuristics, since a Find search under ncu times its candidates wrongly: the bf16 profile
#        # of h200-2026-11-29h shows 14.3 ms of kernels in a step that takes 7.8 ms unprofiled)
#   bash paper/measured/h200-2026-11-29j/run.sh py        # issue 33's PyTorch HM-LSTM over the whole 300-step
#        # run (dualcast cell against the torch.compile'd step, same parameters and minibatches;
#        # 40 steps in h200-2026-11-29i: 234 against 283 ms), and overhead.py (host time per call)
set -u
source scripts/device-run.sh "${1:?resnet|profile|py}"
if [ "$part" = resnet ]; then
  dr_build resnet_train
  timeout 300 scripts/precision-study $B "$R/study" resnet > "$R/study.log" 2>&1
  echo "precision-study resnet rc=$? at $((SECONDS - t0)) s"
  grep -E "median|^ +256|captured|compile  batch|validation" "$R/study.log"
  rm -rf "$R/study.tgz" "$R/study/resnet/export"  # 45 MB of weights: the device would not return them
  for p in bf16 tf32 fp32; do
    timeout 90 $B/experiments/resnet/resnet_train --device cuda --bench 256 --capture --precision $p \
      --channels-last --out "$R/nhwc" > "$R/nhwc_$p.log" 2>&1
    echo "channels last $p rc=$? at $((SECONDS - t0)) s"; grep -E "^ +256|captured" "$R/nhwc_$p.log"
  done
fi
if [ "$part" = profile ]; then
  dr_build resnet_train
  OUT="$R/bf16" DUALCAST_CUDNN_ALGO=heuristic timeout 300 scripts/resnet-study profile --no-build --precision bf16 \
    --channels-last > "$R/profile_bf16.log" 2>&1
  echo "profile bf16 channels last rc=$? at $((SECONDS - t0)) s"
  cp results/resnet/breakdown.txt "$R/breakdown_bf16_nhwc.txt" 2>/dev/null && grep -E "kernel time|^  [a-z]|ms " "$R/breakdown_bf16_nhwc.txt" | head -40
  rm -f "$R/bf16/resnet.tar.gz"
fi
if [ "$part" = py ]; then
  export DUALCAST_CACHE_DIR=/tmp/dualcast-cache
  timeout 420 python3 experiments/torch_elementwise/train_hmlstm.py --cells dualcast,compile --steps 300 \
    --out "$R/train.json" > "$R/train.log" 2>&1
  echo "train_hmlstm 300 steps rc=$? at $((SECONDS - t0)) s"; grep "^train_hmlstm" "$R/train.log"
  timeout 150 python3 experiments/torch_elementwise/overhead.py > "$R/overhead.json" 2> "$R/overhead.err"
  echo "overhead rc=$? at $((SECONDS - t0)) s: $(tr -d '\n ' < "$R/overhead.json" | head -c 400)"
fi
dr_pack
