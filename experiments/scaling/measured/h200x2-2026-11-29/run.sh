#!/bin/bash
# experiments/scaling/measured/h200x2-2026-11-29: issue 32's probe on 2 x H200. Why does the HM-LSTM rank's compute graph replay
# 1.24 ms slower once NCCL has connected (experiments/scaling/README.md)?
#   probe  experiments/scaling/graph_probe.py: PyTorch graphs of tiny kernels and of the step's
#          products, before and after NCCL, one process and 2 torchrun ranks (default, no cuMem):
#          is it NCCL in a rank or dualcast?
#   dp     hmlstm_dp --compute-first at 2 GPUs (does 2 ranks show the 4-rank slowdown?), then the
#          same under ncu (--clock-control none) with --profile-first, compared kernel by kernel by
#          experiments/scaling/compare_ncu.py: do the kernels slow, or the gaps between them?
#   study  (run.sh study, the second call) experiments/scaling/study.py on 1 and 2 GPUs with
#          PyTorch DDP in the same call: the 2 x H200 kind's scaling table.
#   buckets (run.sh buckets, the last call, fresh machine): ResNet-18 missed 0.98 weak scaling at 2
#          GPUs in the study (0.974): does one bucket at the backward's end beat buckets during it?
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ "${1:-probe}" = study ]; then
  source scripts/device-run.sh study
  dr_build resnet_train hmlstm_dp
  timeout $((585 - SECONDS + t0)) python3 experiments/scaling/study.py --build build/release --out "$R" \
    --commit "$(git rev-parse HEAD)" --gpus-list 1,2 --reps 20 --warmup 5 \
    --time-budget $((560 - SECONDS + t0)) --run-timeout 150 > "$R/study.log" 2>&1
  echo "study rc=$? at $((SECONDS - t0)) s"; grep -E "^study:" "$R/study.log" | tail -20
  cat "$R/scaling.md" 2>/dev/null | head -40
  dr_pack
  exit 0
fi
if [ "${1:-probe}" = buckets ]; then
  source scripts/device-run.sh buckets
  dr_build resnet_train
  X=$B/experiments/resnet/resnet_train
  for run in "1 25" "2 25" "2 1000" "2 6" "2 25"; do set -- $run
    timeout 40 $X --bench $((256 * $1)) --gpus $1 --device cuda --capture --bench-reps 20 --bench-warmup 5 \
      --bucket-mib $2 --out "$R" --name "g$1_bk$2_$SECONDS" > "$R/g$1_bk$2_$SECONDS.log" 2>&1
    echo "g$1 bucket $2 MiB rc=$?: $(grep -E 'captured|compute only' "$R"/g$1_bk$2_*.log | tail -2 | tr '\n' ' ')"
  done
  dr_pack
  exit 0
fi
source scripts/device-run.sh x2
nvidia-smi topo -m >> "$R/gpus.txt" 2>&1
G=experiments/scaling/graph_probe.py
TR="python3 -m torch.distributed.run --standalone --nproc-per-node 2"
{
  timeout 60 python3 $G
  timeout 90 $TR $G
  NCCL_CUMEM_ENABLE=0 timeout 90 $TR $G
} > "$R/graph_probe.txt" 2>&1
grep -E "graph_probe|stage|before|after|Error" "$R/graph_probe.txt"
echo "probe done at $((SECONDS - t0)) s"
dr_build hmlstm_dp
D=$B/experiments/hmlstm/hmlstm_dp
A="--bench --hidden 512 --seq 100 --reps 20 --warmup 5 --out $R/dp"
timeout 60 $D $A --gpus 1 --device cuda --batch 64 --name g1 > "$R/dp_g1.log" 2>&1; echo "g1 rc=$?"
timeout 90 $D $A --gpus 2 --device cuda --batch 128 --compute-first --name cf > "$R/dp_cf.log" 2>&1; echo "cf rc=$?"
grep -E "local|eager|captured|compute" "$R/dp_g1.log" "$R/dp_cf.log"
echo "ncu at $((SECONDS - t0)) s"
DUALCAST_DIST_TIMEOUT=900 timeout $((560 - SECONDS + t0)) ncu --profile-from-start off --clock-control none --csv --page raw \
  --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct \
  --target-processes all \
  python3 scripts/launch --gpus 2 -- $D --bench --hidden 512 --seq 100 --gpus 2 --device cuda --batch 128 \
  --compute-first --profile-first --reps 3 --warmup 1 --out $R/dp --name ncu > "$R/ncu.csv" 2> "$R/ncu.err"
echo "ncu rc=$? at $((SECONDS - t0)) s"
python3 experiments/scaling/compare_ncu.py "$R/ncu.csv" > "$R/compare.txt" 2>&1; head -40 "$R/compare.txt"
gzip -f "$R/ncu.csv"
dr_pack