#!/bin/bash
# The probe as it ran on 4 x H200 (2026-11-28, tree at ee07624 + the GPU record): is the HM-LSTM
# rank's slower compute in a 4-rank job (22.98 ms against 21.70 alone) the four GPUs working at
# once (power, clocks, host), or the data-parallel process itself?
#   A: one single-GPU run on GPU 0          B0-B3: four single-GPU runs at once, one per GPU
#   C0: as B with --device cuda:K (C1-C3 printed nothing: --gpus 1 on cuda:K, K > 0, did not run)
#   D: the 4-rank run (batch 64 per rank)   smi_*.csv: nvidia-smi every 0.5 s during A, B, D
set -u
export NCCL_NVLS_ENABLE=0
cmake --preset release && cmake --build build/release --target hmlstm_dp -j64
B=build/release/experiments/hmlstm/hmlstm_dp
A="--bench --hidden 512 --seq 100 --reps 20 --warmup 5 --out /tmp/p"
smi() { nvidia-smi --query-gpu=index,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu --format=csv,noheader -lms 500 > $OUT/smi_$1.csv & echo $!; }
cap() { grep -E "captured|compute" | sed "s/^/$1 /"; }
p=$(smi A); $B $A --gpus 1 --device cuda --batch 64 --name A 2>&1 | cap A; kill $p
p=$(smi B); ws=""; for g in 0 1 2 3; do (CUDA_VISIBLE_DEVICES=$g $B $A --gpus 1 --device cuda --batch 64 --name B$g 2>&1 | cap B$g) & ws="$ws $!"; done; wait $ws; kill $p
ws=""; for g in 0 1 2 3; do ($B $A --gpus 1 --device cuda:$g --batch 64 --name C$g 2>&1 | cap C$g) & ws="$ws $!"; done; wait $ws
p=$(smi D); ($B $A --gpus 4 --device cuda --batch 256 --name D 2>&1 | cap D) & d=$!; wait $d; kill $p
