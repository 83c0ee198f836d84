#!/bin/bash
# Run h200-2026-11-29k: the compiled launcher for PyTorch (python/dualcast/native.py, csrc/launcher.cpp;
# Python and a C++ extension built by torch.utils.cpp_extension, so nothing of the library is built).
# On the device machine, from the repository root:
#   bash paper/measured/h200-2026-11-29k/run.sh py
#     builds the compiled launcher (timed), runs the Python suite on the GPU (one process per file,
#     three at a time), overhead.py (host time per call through the compiled and the Python
#     launcher, one process), and 40 steps of the PyTorch HM-LSTM with the dualcast cell through
#     each launcher and with the torch.compile'd cell
set -u
source scripts/device-run.sh "${1:?py}"
export DUALCAST_NATIVE=wait DUALCAST_NATIVE_DIR=/tmp/dualcast-native
ts=$SECONDS
python3 -c "import sys, time; sys.path.insert(0, 'python'); from dualcast import native; native.start(); print(native.status())" \
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
DUALCAST_NATIVE=off timeout 120 python3 experiments/torch_elementwise/train_hmlstm.py --cells dualcast --steps 40 \
  --out "$R/train_python_launcher.json" > "$R/train_python_launcher.log" 2>&1
echo "train, Python launcher rc=$? at $((SECONDS - t0)) s"; grep "^train_hmlstm" "$R/train_python_launcher.log"
timeout 200 python3 experiments/torch_elementwise/train_hmlstm.py --cells dualcast,compile --steps 40 \
  --out "$R/train.json" > "$R/train.log" 2>&1
echo "train rc=$? at $((SECONDS - t0)) s"; grep "^train_hmlstm" "$R/train.log"
dr_pack
