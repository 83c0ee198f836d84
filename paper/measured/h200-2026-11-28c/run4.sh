#!/bin/bash
# Final device call: the Python suite on the GPU, then the benchmarks of the NVRTC kernels.
set -u
R=$OUT/r; mkdir -p $R
nvidia-smi -L > $R/gpus.txt
echo "== python tests"; timeout 150 python3 python/tests/run.py > $R/python_tests.log 2>&1; echo "rc=$?"; grep -E "^FAIL|python tests" $R/python_tests.log
echo "== peers"; timeout 150 python3 experiments/peers/peers.py --workloads a,b --dims 4096,8192 --methods torch_dualcast,compile --reps 50 --out $R/peers.json > $R/peers.log 2>&1; echo "rc=$?"; grep -E "median" $R/peers.log
echo "== overhead"; timeout 90 python3 experiments/torch_elementwise/overhead.py > $R/overhead.json 2> $R/overhead.err; echo "rc=$?"; tr -d '\n ' < $R/overhead.json; echo
echo "== ncu"; timeout 90 ncu -k regex:dualcast_jit --launch-skip 4 --launch-count 2 --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size,smsp__inst_executed.sum python3 devprobe/ncu_a.py > $R/ncu.txt 2>&1; echo "rc=$?"; grep -E "dualcast_jit|duration|dram__|warps_active|registers|grid_size|inst_executed" $R/ncu.txt | head -20
