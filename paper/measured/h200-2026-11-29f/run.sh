#!/bin/bash
# Run h200-2026-11-29f: the measurements branch next-session (l2-prefetch + py-parallel-compile on
# main) waits for. On the device machine, from the repository root, each part
# right after `scripts/gpu-check --only-tests --commit SHA` (its build):
#   bash paper/measured/h200-2026-11-29f/run.sh prefetch   # a and b, bf16 and float32, with the
#        # L2 prefetch off and on (one binary: DUALCAST_L2_PREFETCH), the bf16 kernels' counters both
#        # ways, workload a at 512^2 eager (issue 31), dualcast.torch's first compile (issue 33)
#   bash paper/measured/h200-2026-11-29f/run.sh resnet     # the ResNet-18 step at "high" and bf16
#        # with torch.compile at the same precision (scripts/precision-study resnet; issue 30)
set -u
source scripts/device-run.sh "${1:?prefetch|resnet}"
if [ "$part" = prefetch ]; then
  dr_build hmlstm_experiment profile_broadcast
  for prec in bf16 fp32; do
    for pf in 0 $([ $prec = bf16 ] && echo 16 || echo all); do
      DUALCAST_L2_PREFETCH=$pf timeout 120 $E --workloads a,b --dims 4096,8192 --precision $prec --no-graphs \
        --reps 30 --warmup 5 --out "$R/ab_${prec}_pf$pf" > "$R/ab_${prec}_pf$pf.log" 2>&1
      echo "a, b $prec prefetch=$pf rc=$? at $((SECONDS - t0)) s"; grep -E "^[ab] [0-9]" "$R/ab_${prec}_pf$pf.log"
    done
  done
  for pf in 0 16; do
    DUALCAST_L2_PREFETCH=$pf timeout 100 python3 scripts/ncu-broadcast --build $B --out "$R/ncu_pf$pf" \
      --label bf16-pf$pf --dtype bfloat16 --configs a:4096,b:4096,a:8192 > "$R/ncu_pf$pf.log" 2>&1
    echo "ncu prefetch=$pf rc=$?"; tail -7 "$R/ncu_pf$pf.log"
  done
  timeout 60 $E --workloads a --dims 512 --reps 200 --out "$R/a512" > "$R/a512.log" 2>&1
  echo "a 512 eager rc=$?"; grep -E "^a 512" "$R/a512.log"
  timeout 150 python3 experiments/torch_elementwise/overhead.py > "$R/overhead.json" 2> "$R/overhead.err"
  echo "overhead rc=$?"; head -c 600 "$R/overhead.json"; echo
fi
if [ "$part" = resnet ]; then
  dr_build resnet_train
  timeout 500 scripts/precision-study $B "$R/study" resnet > "$R/study.log" 2>&1
  echo "precision-study resnet rc=$? at $((SECONDS - t0)) s"; tail -30 "$R/study.log"
  rm -f "$R/study.tgz"
fi
dr_pack
