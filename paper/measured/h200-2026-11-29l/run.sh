#!/bin/bash
# Run h200-2026-11-29l: the compiled launcher after its review mends (python/dualcast/native.py,
# csrc/launcher.cpp; Python and a C++ extension, so nothing of the library is built). On the device
# machine, from the repository root:
#   bash paper/measured/h200-2026-11-29l/run.sh py
#     builds the compiled launcher, runs the Python suite on the GPU (one process per file, three at a
#     time), overhead.py (host time per call through the compiled and the Python launcher), and the
#     300-step run of the PyTorch HM-LSTM with the dualcast cell (compiled launcher) against the
#     torch.compile'd cell, from the same parameters and minibatches
set -u
source scripts/device-run.sh "${1:?py}"
export DUALCAST_NATIVE=wait DUALCAST_NATIVE_DIR=/tmp/dualcast-native
ts=$SECONDS
python3 -c "import sys; sys.path.insert(0, 'python'); from dualcast import native; native.start(); print(native.status())" \
  > "$R/native_build.log" 2>&1
echo "compiled launcher built rc=$? in $((SECONDS - ts)) s: $(tail -1 "$R/native_build.log")"
for m in test_torch test_native test_cuda_compile test_jit test_torch_16_bit_gpu test_cuda_plan test_package; do
  echo $m
done | xargs -P 3 -I{} sh -c "timeout 300 python3 python/tests/run.py --module {} > $R/{}.log 2>&1; echo \"{} rc=\$?: \$(tail -1 $R/{}.log)\""
grep -h "^FAIL\|^SKIP" "$R"/test_*.log | head -20
echo "tests done at $((SECONDS - t0)) s"
export DUALCAST_CACHE_DIR=/tmp/dualcast-cache  # (the tests make their own)
timeout 150 python3 experiments/torch_elementwise/overhead.py > "$R/overhead.json" 2> "$R/overhead.err"
echo "overhead rc=$? at $((SECONDS - t0)) s: $(tr -d '\n ' < "$R/overhead.json" | head -c 900)"
timeout 330 python3 experiments/torch_elementwise/train_hmlstm.py --cells dualcast,compile --steps 300 \
  --out "$R/train.json" > "$R/train.log" 2>&1
echo "train 300 steps rc=$? at $((SECONDS - t0)) s"; grep "^train_hmlstm\|step  300\|step  150" "$R/train.log"
dr_pack
