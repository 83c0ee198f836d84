#!/bin/bash
# h200-2026-11-29i: after scripts/gpu-check (--build-only, then --only-tests --no-build) of this commit on
# the same machine:
#   bash paper/measured/h200-2026-11-29i/run.sh probe   # cuDNN alone on ResNet-18's convolutions, NCHW
#        # against NHWC, bf16 and TF32, each direction's direct-sum choice timed with CUDA events
#        # (experiments/resnet/conv_layout_probe.cpp); then 40 steps of the PyTorch HM-LSTM with the
#        # dualcast cell (the pre-activation split once) and with torch.compile's (train_hmlstm.py)
set -u
source scripts/device-run.sh "${1:?probe}"
if [ "$part" = probe ]; then
  nvcc -O2 -std=c++17 experiments/resnet/conv_layout_probe.cpp -lcudnn -o /tmp/conv_layout_probe &&
    timeout 100 /tmp/conv_layout_probe > "$R/conv_layout_probe.txt" 2>&1
  echo "conv_layout_probe rc=$? at $((SECONDS - t0)) s"; grep SUM "$R/conv_layout_probe.txt"
  export DUALCAST_CACHE_DIR=/tmp/dualcast-cache
  timeout 200 python3 experiments/torch_elementwise/train_hmlstm.py --cells dualcast,compile --steps 40 \
    --out "$R/train.json" > "$R/train.log" 2>&1
  echo "train_hmlstm rc=$? at $((SECONDS - t0)) s"; grep "^train_hmlstm" "$R/train.log"
fi
dr_pack
