#!/bin/bash
# The measurements branch next-verify (main + review-mends + dlpack) waits for, after
#   scripts/gpu-check --only-tests --commit SHA
# on the same machine (its build/release).
#   bash paper/measured/h200-2026-11-29h/run.sh profile   # where the ResNet-18 step's time goes at
#        # bf16 and at tf32 against torch.compile at the same precision (issue 30's two missed ResNet
#        # targets: 0.97x and 0.99x in h200-2026-11-29f): Nsight Compute per-kernel durations,
#        # experiments/resnet/breakdown.py
#   bash paper/measured/h200-2026-11-29h/run.sh resnet    # the ResNet-18 step at tf32 and bf16 with
#        # torch.compile at the same precision (scripts/precision-study resnet), after the model's
#        # single float32 copy per convolution under Autocast
set -u
source scripts/device-run.sh "${1:?profile|resnet}"
if [ "$part" = resnet ]; then
  dr_build resnet_train
  timeout 500 scripts/precision-study $B "$R/study" resnet > "$R/study.log" 2>&1
  echo "precision-study resnet rc=$? at $((SECONDS - t0)) s"
  grep -E "median|^ +256|captured|compile  batch|validation" "$R/study.log"
  rm -rf "$R/study.tgz" "$R/study/resnet/export"  # 45 MB of weights: the device would not return them
fi
if [ "$part" = profile ]; then
  dr_build resnet_train
  for prec in bf16 tf32; do
    OUT="$R/$prec" timeout 260 scripts/resnet-study profile --no-build --precision $prec > "$R/profile_$prec.log" 2>&1
    echo "profile $prec rc=$? at $((SECONDS - t0)) s"
    cp results/resnet/breakdown.txt "$R/breakdown_$prec.txt" 2>/dev/null && grep -E "kernel time|^  [a-z]" "$R/breakdown_$prec.txt"
    rm -f "$R/$prec/resnet.tar.gz"
  done
fi
dr_pack
