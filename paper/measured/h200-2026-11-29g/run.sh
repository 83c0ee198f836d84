#!/bin/bash
# Run h200-2026-11-29g: dualcast.torch's call path made ready per layout (branch py-launcher on main
# with py-parallel-compile; Python only, so nothing is built). On the device machine, from the
# repository root, with main's Python package carried in build/py-main (git archive main python
# experiments/torch_elementwise experiments/common | tar x -C build/py-main) for the same-run before:
#   bash paper/measured/h200-2026-11-29g/run.sh py
#     the Python suite on the GPU (one process per file, three at a time), overhead.py before (main)
#     and after, and 40 steps of the PyTorch HM-LSTM with the dualcast and the torch.compile cell
#   bash paper/measured/h200-2026-11-29g/run.sh py2      (a later call, fresh machine; build/py-main
#        then also holds include/, which main's package needs to find its headers)
#     overhead.py before (main) and after; 40 steps of the PyTorch HM-LSTM with main's dualcast cell
#     (before), then with the cell and the boundary detector as dualcast functions against the
#     torch.compile'd step (after)
set -u
source scripts/device-run.sh "${1:?py|py2}"
if [ "$part" = py2 ]; then
  export DUALCAST_CACHE_DIR=/tmp/dualcast-cache
  for v in main new; do
    root=.; [ $v = main ] && root=build/py-main
    timeout 150 python3 $root/experiments/torch_elementwise/overhead.py > "$R/overhead_$v.json" 2> "$R/overhead_$v.err"
    echo "overhead $v rc=$? at $((SECONDS - t0)) s: $(tr -d '\n ' < "$R/overhead_$v.json" | head -c 400)"
  done
  timeout 120 python3 build/py-main/experiments/torch_elementwise/train_hmlstm.py --cells dualcast --steps 40 \
    > "$R/train_main.log" 2>&1
  echo "train main rc=$? at $((SECONDS - t0)) s"; grep "^train_hmlstm" "$R/train_main.log"
  timeout 200 python3 experiments/torch_elementwise/train_hmlstm.py --cells dualcast,compile --steps 40 \
    --out "$R/train" > "$R/train.log" 2>&1
  echo "train new rc=$? at $((SECONDS - t0)) s"; grep "^train_hmlstm" "$R/train.log"
  dr_pack
  exit 0
fi
for m in test_torch test_cuda_compile test_jit test_torch_16_bit_gpu test_cuda_plan test_package; do
  echo $m
done | xargs -P 3 -I{} sh -c "timeout 300 python3 python/tests/run.py --module {} > $R/{}.log 2>&1; echo \"{} rc=\$?: \$(tail -1 $R/{}.log)\""
echo "tests done at $((SECONDS - t0)) s"
export DUALCAST_CACHE_DIR=/tmp/dualcast-cache  # (the tests make their own)
for v in main new; do
  root=.; [ $v = main ] && root=build/py-main
  timeout 150 python3 $root/experiments/torch_elementwise/overhead.py > "$R/overhead_$v.json" 2> "$R/overhead_$v.err"
  echo "overhead $v rc=$? at $((SECONDS - t0)) s: $(tr -d '\n ' < "$R/overhead_$v.json" | head -c 400)"
done
timeout 200 python3 experiments/torch_elementwise/train_hmlstm.py --cells dualcast,compile --steps 40 \
  --out "$R/train" > "$R/train.log" 2>&1
echo "train rc=$? at $((SECONDS - t0)) s"; tail -12 "$R/train.log"
dr_pack
